"""OpenAI's filtered Reddit TL;DR: the filters of Stiennon et al. (2020), and its JSONL layout.

"Learning to summarize from human feedback", Appendix A, builds its TL;DR data in two stages.
Posts (for RL, which needs no reference): exact de-duplication by body, top-level posts only, a
whitelist of 29 subreddits (their Table 2), no title starting with a variant of "Edit" or "Update",
and bodies of at most 512 tokens; about 5% held out for validation. SFT targets then also drop
summaries starting with a variant of "Edit", "Update" or "P.S." and keep those of 24 to 48 tokens.
The paper's topic filter (graphic sex, suicide) and profanity filter are unspecified heuristics and
are not reproduced here.

Token counts come from a callable (`str -> int`) so the run's tokenizer decides; the paper counted
GPT-2 byte-level BPE tokens.

Files are in the layout of openai/summarize-from-feedback's
`tldr_3_filtered/{train,valid,test}.jsonl`: one JSON object a line with `id`, `subreddit`,
`title`, `post`, `summary`. A malformed line is reported as `file:line: reason` and skipped; writes
are atomic.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from typing import Any, Callable, Collection, Iterable, Mapping, Sequence

from rlhfjax.data import jsonl
from rlhfjax.errors import DataError
from rlhfjax import files

# Stiennon et al. (2020), Table 2, most frequent first.
SUBREDDITS = (
    "relationships", "AskReddit", "relationship_advice", "tifu", "dating_advice",
    "personalfinance", "Advice", "legaladvice", "offmychest", "loseit", "jobs", "self", "BreakUps",
    "askwomenadvice", "dogs", "running", "pettyrevenge", "needadvice", "travel", "Parenting",
    "weddingplanning", "Pets", "Dogtraining", "cats", "AskDocs", "college", "GetMotivated", "books",
    "Cooking")

MAX_POST_TOKENS = 512  # Appendix A: bodies longer than 512 tokens are dropped.
MIN_SUMMARY_TOKENS = 24  # Appendix A: SFT summaries of fewer than 24 or more than 48 tokens are
MAX_SUMMARY_TOKENS = 48  # dropped.
VALIDATION_FRACTION = 0.05  # Appendix A: "approximately 5%" of the filtered posts held out.

FIELDS = ("id", "subreddit", "title", "post", "summary")

# A leading "Edit(s/ed)" or "Update(s/d)" after any brackets or punctuation: "EDIT:", "[Update]",
# "**Updated**", "Update 2 -". "Editing ..." is an ordinary title.
_UPDATE = r"[\W_]*(?:edit(?:s|ed)?|updat(?:e|es|ed))\b"
_TITLE = re.compile(_UPDATE, re.IGNORECASE)
# The same, or a postscript: "P.S.", "PS:", "p.s", "P.P.S.".
_ASIDE = re.compile(rf"{_UPDATE}|[\W_]*p\.?\s?(?:p\.?\s?)?s\b", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class TldrExample:
  """A post (the fields of `pipeline.Post`) with its reference TL;DR."""

  id: str
  subreddit: str
  title: str
  post: str
  reference: str


@dataclasses.dataclass(frozen=True)
class Filtered:
  """What the filters keep, and how many records each removed."""

  total: int  # Records given.
  posts: list[TldrExample]  # Passed the post filters: prompts for RL, references unchecked.
  sft: list[TldrExample]  # Also passed the summary filters: SFT targets.
  removed: dict[str, int]  # Filter name -> records it removed, in the order the filters run.


def _get(record: Any, key: str) -> Any:
  if isinstance(record, Mapping):
    return record.get(key)
  return getattr(record, key, None)


def is_top_level(record: Any) -> bool:
  """A submission rather than a comment: not `top_level: false`, no `parent_id` (Reddit dumps give
  one to comments only), and no `t1_` id (Reddit's prefix for comments; submissions are `t3_`)."""
  if _get(record, "top_level") is False:
    return False
  if _get(record, "parent_id"):
    return False
  return not str(_get(record, "id") or "").startswith("t1_")


def title_is_update(title: str) -> bool:
  """Whether a title starts with a variant of "Edit" or "Update" (Appendix A)."""
  return _TITLE.match(title) is not None


def summary_is_aside(summary: str) -> bool:
  """Whether a TL;DR starts with a variant of "Edit", "Update" or "P.S." (Appendix A)."""
  return _ASIDE.match(summary) is not None


def _example(record: Any, index: int) -> TldrExample:
  values = {key: _get(record, key) for key in FIELDS}
  try:
    return from_row({k: v for k, v in values.items() if v is not None})
  except ValueError as e:
    raise DataError(f"record {index} (id {_get(record, 'id')!r}): {e}") from None


def filter_posts(records: Iterable[Any], count_tokens: Callable[[str], int],
                 subreddits: Collection[str] = SUBREDDITS,
                 max_post_tokens: int = MAX_POST_TOKENS,
                 min_summary_tokens: int = MIN_SUMMARY_TOKENS,
                 max_summary_tokens: int = MAX_SUMMARY_TOKENS) -> Filtered:
  """Applies the filters of Appendix A in the paper's order to records (dicts or objects) with
  `id`, `subreddit`, `title`, `post`, `summary`; subreddits match case-insensitively."""
  allowed = {s.casefold() for s in subreddits}
  post_filters: list[tuple[str, Callable[[Any, TldrExample], bool]]] = [
      ("not_top_level", lambda r, e: is_top_level(r)),
      ("subreddit", lambda r, e: e.subreddit.casefold() in allowed),
      ("title", lambda r, e: not title_is_update(e.title)),
      ("post_length", lambda r, e: count_tokens(e.post) <= max_post_tokens),
  ]
  sft_filters: list[tuple[str, Callable[[TldrExample], bool]]] = [
      ("summary_prefix", lambda e: not summary_is_aside(e.reference)),
      ("summary_length",
       lambda e: min_summary_tokens <= count_tokens(e.reference) <= max_summary_tokens),
  ]
  removed = dict.fromkeys(["duplicate_body"] + [n for n, _ in post_filters + sft_filters], 0)
  seen: set[str] = set()
  posts, total = [], 0
  for index, record in enumerate(records):
    total += 1
    example = _example(record, index)
    if example.post in seen:
      removed["duplicate_body"] += 1
      continue
    seen.add(example.post)
    failed = next((name for name, keep in post_filters if not keep(record, example)), None)
    if failed:
      removed[failed] += 1
    else:
      posts.append(example)
  sft = []
  for example in posts:
    failed = next((name for name, keep in sft_filters if not keep(example)), None)
    if failed:
      removed[failed] += 1
    else:
      sft.append(example)
  return Filtered(total=total, posts=posts, sft=sft, removed=removed)


def removed_table(filtered: Filtered) -> str:
  """A markdown table: each filter, the records it removed, and how many remain after it."""
  rows = ["| filter | removed | remaining |", "|---|---:|---:|",
          f"| (input) | | {filtered.total} |"]
  remaining = filtered.total
  for name, count in filtered.removed.items():
    remaining -= count
    rows.append(f"| {name} | {count} | {remaining} |")
  return "\n".join(rows) + "\n"


def in_validation(post_id: str, fraction: float = VALIDATION_FRACTION) -> bool:
  """Whether a post id falls in the validation split: the first 8 bytes of its SHA-256 as a
  fraction of 2**64 are below `fraction` (the same on every machine and run)."""
  digest = hashlib.sha256(post_id.encode("utf-8")).digest()
  return int.from_bytes(digest[:8], "big") < fraction * 2**64


def split_validation(examples: Sequence[TldrExample], fraction: float = VALIDATION_FRACTION
                     ) -> tuple[list[TldrExample], list[TldrExample]]:
  """(train, validation): about `fraction` of the examples, chosen by the hash of their ids, so a
  post lands in the same split whichever filters it went through."""
  if not 0.0 <= fraction <= 1.0:
    raise ValueError(f"validation fraction must be in [0, 1], got {fraction}")
  train, valid = [], []
  for e in examples:
    (valid if in_validation(e.id, fraction) else train).append(e)
  return train, valid


def from_row(row: dict) -> TldrExample:
  """One object of the `tldr` layout; `ValueError` names a missing or mistyped field."""
  for key in FIELDS:
    if key not in row:
      raise ValueError(f"missing field {key!r}")
    if not isinstance(row[key], str):
      raise ValueError(f"field {key!r} has type {type(row[key]).__name__}")
  return TldrExample(row["id"], row["subreddit"], row["title"], row["post"], row["summary"])


def to_row(e: TldrExample) -> dict:
  return {"id": e.id, "subreddit": e.subreddit, "title": e.title, "post": e.post,
          "summary": e.reference}


def read(path: str) -> tuple[list[TldrExample], list[str]]:
  """All good examples of a `tldr` JSONL file, and one `file:line: reason` per malformed line."""
  return jsonl.read(path, from_row)


def read_strict(path: str) -> list[TldrExample]:
  """Like `read`, but a malformed line is a `DataError` naming the file and the first bad line."""
  return jsonl.strict(*read(path))


def write(path: str, examples: Iterable[TldrExample]) -> None:
  """Writes the `tldr` JSONL layout atomically: a temporary file renamed into place."""
  with files.atomic_open(path) as f:
    for e in examples:
      f.write(json.dumps(to_row(e), ensure_ascii=False) + "\n")
