"""Feedback records: pairwise comparisons in two file layouts, binary feedback in a third.

One schema for a judgement between two responses to the same prompt, whoever made it (a person, a
simulated annotator, a reward model). Its two layouts:
- OpenAI's summarize-from-feedback layout: `info{id, post, title, subreddit}`,
  `summaries[{text, policy, note}]` (two), `choice` (0 or 1), `worker`, `batch`, `split`
  (train / valid1 / valid2), `extra{confidence}`;
- AlpacaFarm's pairwise layout: `instruction`, `input`, `output_1`, `output_2`, `preference`
  (1 or 2).

Human labels (`rlhfjax.labeling`) add what their protocol asked: a tie (`choice: null`; AlpacaEval's
`preference: 1.5`), Likert ratings of each response (Stiennon et al.'s
1-7 `overall`, `accuracy`, `coverage`, `coherence`: `summaries[i].axes`; AlpacaFarm's `axes_1`,
`axes_2`) and the protocol's other answers (`extra`). The 9-point rating of Stiennon et al. is
`extra.confidence` (AlpacaFarm's layout: `confidence`), in rlhfjax's convention: 1 = the first
response is definitely better ... 9 = the second is.
Bradley–Terry training needs a preferred side: `preferred` refuses ties, so callers drop them.

Binary feedback (`Feedback`, what KTO learns from) judges one response alone: desirable or not (a
thumbs up or down). Its layout, `binary`, is TRL's unpaired preference format: `prompt` (the post or
the instruction, as a comparison's `prompt`), `completion`, `label` (true: desirable), all three
required and of exactly these types (a `label` of 0/1 or "true" is refused); TRL's conversational
rows (lists of messages) are read as TRL reads them. Optional `id`, `title`, `subreddit`,
`input`, `annotator`, `policy`, `split`, `batch` and `extra` carry what a comparison record carries.
`unpaired` turns comparisons into binary feedback as KTO's paper and TRL do: each pair's chosen
response desirable, its rejected one undesirable.

A third comparison layout, `trl`, is TRL's preference format (`data/trl.py`): `prompt`, `chosen`,
`rejected` or an implicit prompt, standard or conversational; its records carry `style` and the
prompt conversation (`messages`), and `data.columns` maps a file's column names to TRL's.

Every layout is read from JSON Lines (OpenAI's files), one JSON array (AlpacaFarm's `.json` files;
told apart by the file's first non-whitespace byte, `[`), Parquet (a file, a directory of shards,
a glob) or a `datasets` save_to_disk directory of Arrow files (`data/tables.py`). A malformed
record is reported as `file:line: reason` (JSON Lines), `file: record N (index N-1): reason` (an
array) or `file: row N (index N-1): reason` (Parquet, Arrow) and skipped; every good record is
kept. An array that does not parse as a whole (truncated) is a
`DataError` naming the file, line and column. Files are written atomically, as JSON Lines or as one
indented JSON array (by default: an array when the path ends in `.json`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Iterable, Mapping, Sequence

from rlhfjax.data import jsonl
from rlhfjax.data import tables
from rlhfjax.data import trl


# Slots: a large file's records hold no dict each (docs/data.md, memory).
@dataclasses.dataclass(frozen=True, slots=True)
class Comparison:
  """`choice` is 0 when `response_a` is preferred, 1 when `response_b` is."""

  prompt: str  # The post (TL;DR) or the instruction (AlpacaFarm).
  response_a: str
  response_b: str
  choice: int
  annotator: str = ""
  confidence: float | None = None
  split: str = "train"
  policy_a: str = ""
  policy_b: str = ""
  id: str = ""
  title: str = ""  # TL;DR only.
  subreddit: str = ""  # TL;DR only.
  input: str = ""  # AlpacaFarm's optional instruction input.
  batch: str = ""
  note_a: str = ""
  note_b: str = ""
  tie: bool = False  # Neither response preferred (`choice` is then 0 and means nothing).
  axes_a: Mapping[str, int] | None = None  # Likert ratings of each response.
  axes_b: Mapping[str, int] | None = None
  extra: Mapping[str, Any] | None = None  # The labeling protocol's other answers.
  # A TRL record (layout `trl`): "standard" (the prompt and responses are read as they are) or
  # "conversational" (`messages`, the turns before the trained one, go through the chat template;
  # the responses are final assistant turns; `prompt` is the last user message); "" otherwise.
  style: str = ""
  messages: tuple[tuple[str, str], ...] | None = None


def _require(row: dict, key: str, kind: type | tuple[type, ...]) -> Any:
  if key not in row:
    raise ValueError(f"missing field {key!r}")
  if not isinstance(row[key], kind) or isinstance(row[key], bool):
    raise ValueError(f"field {key!r} has type {type(row[key]).__name__}")
  return row[key]


def from_openai(row: dict) -> Comparison:
  info = _require(row, "info", dict)
  summaries = _require(row, "summaries", list)
  if len(summaries) != 2 or not all(isinstance(s, dict) for s in summaries):
    raise ValueError("'summaries' must hold exactly two objects")
  tie = "choice" in row and row["choice"] is None
  choice = 0 if tie else _require(row, "choice", int)
  if choice not in (0, 1):
    raise ValueError(f"'choice' must be 0 or 1 (null: a tie), got {choice}")
  texts = [_require(s, "text", str) for s in summaries]
  extra = row.get("extra") or {}
  extra = extra if isinstance(extra, dict) else {}
  confidence = extra.get("confidence")
  others = {k: v for k, v in extra.items() if k != "confidence"} or None
  return Comparison(
      prompt=_require(info, "post", str), response_a=texts[0], response_b=texts[1], choice=choice,
      annotator=str(row.get("worker") or ""), confidence=confidence,
      split=str(row.get("split") or "train"), policy_a=str(summaries[0].get("policy") or ""),
      policy_b=str(summaries[1].get("policy") or ""), id=str(info.get("id") or ""),
      title=str(info.get("title") or ""), subreddit=str(info.get("subreddit") or ""),
      batch=str(row.get("batch") or ""), note_a=str(summaries[0].get("note") or ""),
      note_b=str(summaries[1].get("note") or ""), tie=tie, axes_a=_axes(summaries[0].get("axes")),
      axes_b=_axes(summaries[1].get("axes")), extra=others)


def _axes(value: Any) -> Mapping[str, int] | None:
  if value is None:
    return None
  if not isinstance(value, dict) or not all(
      isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
    raise ValueError("'axes' must map names to integer ratings")
  return value


def _with_axes(summary: dict, axes: Mapping[str, int] | None) -> dict:
  return {**summary, "axes": dict(axes)} if axes is not None else summary


def to_openai(c: Comparison) -> dict:
  return {"info": {"id": c.id, "post": c.prompt, "title": c.title, "subreddit": c.subreddit},
          "summaries": [
              _with_axes({"text": c.response_a, "policy": c.policy_a, "note": c.note_a}, c.axes_a),
              _with_axes({"text": c.response_b, "policy": c.policy_b, "note": c.note_b}, c.axes_b)],
          "choice": None if c.tie else c.choice, "worker": c.annotator, "batch": c.batch,
          "split": c.split, "extra": {"confidence": c.confidence, **(c.extra or {})}}


ALPACA_TIE = 1.5  # AlpacaEval's preference for a tie.
# The `batch` of labels exported by the labeling site: "labeling round: <protocol>".
LABELING_ROUND = "labeling round"


def from_alpaca(row: dict) -> Comparison:
  preference = _require(row, "preference", (int, float))
  if preference not in (1, 2, ALPACA_TIE):
    raise ValueError(f"'preference' must be 1 or 2 (1.5: a tie), got {preference}")
  tie = preference == ALPACA_TIE
  extra = row.get("extra")
  return Comparison(prompt=_require(row, "instruction", str), input=str(row.get("input") or ""),
                    response_a=_require(row, "output_1", str),
                    response_b=_require(row, "output_2", str),
                    choice=0 if tie else int(preference) - 1, tie=tie,
                    annotator=str(row.get("annotator") or ""), id=str(row.get("id") or ""),
                    split=str(row.get("split") or "train"), confidence=row.get("confidence"),
                    axes_a=_axes(row.get("axes_1")),
                    axes_b=_axes(row.get("axes_2")),
                    extra=extra if isinstance(extra, dict) else None)


def to_alpaca(c: Comparison) -> dict:
  row = {"instruction": c.prompt, "input": c.input, "output_1": c.response_a,
         "output_2": c.response_b, "preference": ALPACA_TIE if c.tie else c.choice + 1}
  optional = {"annotator": c.annotator, "id": c.id,
              "split": c.split if c.split != "train" else "", "confidence": c.confidence,
              "axes_1": c.axes_a, "axes_2": c.axes_b, "extra": c.extra}
  return {**row, **{k: (dict(v) if isinstance(v, Mapping) else v)
                    for k, v in optional.items() if v}}


STANDARD, CONVERSATIONAL = "standard", "conversational"  # `style` of TRL records.
TRL = "trl"  # The layout of TRL's preference format (`data/trl.py`).


def _messages_out(messages, *turn: tuple[str, str]) -> list[dict[str, str]]:
  return [{"role": r, "content": c} for r, c in (*messages, *turn)]


def _trl_id(extra: Mapping[str, Any] | None) -> str:
  for key in ("id", "prompt_id"):
    if extra and isinstance(extra.get(key), (str, int)) and not isinstance(extra.get(key), bool):
      return str(extra[key])
  return ""


def from_trl(row: dict, columns: Mapping[str, str] | None = None) -> Comparison:
  """A TRL preference row (standard or conversational, explicit or implicit prompt; `columns`
  maps TRL's names to the file's): the chosen response is `response_a`."""
  r = trl.parse(row, columns)
  if r.type != trl.PREFERENCE:
    raise ValueError(f"a {r.type.replace('_', '-')} record, not a preference one (chosen and "
                     "rejected)")
  return Comparison(prompt=r.prompt, response_a=r.chosen, response_b=r.rejected, choice=0,
                    id=_trl_id(r.extra), extra=r.extra,
                    style=CONVERSATIONAL if r.conversational else STANDARD, messages=r.messages)


def to_trl(c: Comparison) -> dict:
  """TRL's preference row of `c` (explicit prompt), with its extra columns."""
  chosen, rejected = (c.response_a, c.response_b) if c.choice == 0 else (c.response_b,
                                                                        c.response_a)
  if c.messages is not None:
    row = {"prompt": _messages_out(c.messages),
           "chosen": _messages_out((), (trl.ASSISTANT, chosen)),
           "rejected": _messages_out((), (trl.ASSISTANT, rejected))}
  else:
    row = {"prompt": c.prompt, "chosen": chosen, "rejected": rejected}
  return {**dict(c.extra or {}), **row}


LAYOUTS: dict[str, tuple[Callable[[dict], Comparison], Callable[[Comparison], dict]]] = {
    "openai": (from_openai, to_openai),
    "alpaca": (from_alpaca, to_alpaca),
    TRL: (from_trl, to_trl),
}


def _layout(name: str):
  if name not in LAYOUTS:
    raise ValueError(f"unknown comparison layout {name!r} (available: {', '.join(LAYOUTS)})")
  return LAYOUTS[name]


def read(path: str, layout: str, columns: Mapping[str, str] | None = None
         ) -> tuple[list[Comparison], list[str]]:
  """All good records of `path` (JSON Lines, a JSON array, Parquet, Arrow: a file, a directory of
  shards or a glob, `tables.files`), and one problem per malformed record. `columns` (layout
  `trl` only) maps TRL's field names to the file's columns."""
  parse = _layout(layout)[0]
  if columns and layout != TRL:
    raise ValueError(f"column mapping is for the {TRL!r} layout, not {layout!r}")
  if layout == TRL:
    return tables.read(path, lambda row: from_trl(row, columns))
  return tables.read(path, parse)


def read_strict(path: str, layout: str, columns: Mapping[str, str] | None = None
                ) -> list[Comparison]:
  """Like `read`, but a malformed record is a `DataError` naming the file and the first bad one."""
  return jsonl.strict(*read(path, layout, columns))


def write(path: str, records: Iterable[Comparison], layout: str,
          as_array: bool | None = None) -> None:
  """Writes `records` atomically in `layout`: as one JSON array when `as_array`, else JSON Lines.

  `as_array=None` picks from the name: an array for a `.json` path (AlpacaFarm's files), JSON
  Lines otherwise (`.jsonl`, OpenAI's files)."""
  _, dump = _layout(layout)
  if as_array is None:
    as_array = path.endswith(".json")
  jsonl.write(path, (dump(c) for c in records), as_array)


def preferred(records: Sequence[Comparison]) -> list[tuple[str, str]]:
  """(chosen, rejected) responses of each record; a tie has neither, so it is refused."""
  ties = sum(c.tie for c in records)
  if ties:
    raise ValueError(f"{ties} of the comparisons are ties, which have no chosen response")
  return [((c.response_a, c.response_b) if c.choice == 0 else (c.response_b, c.response_a))
          for c in records]


@dataclasses.dataclass(frozen=True, slots=True)
class Feedback:
  """One response judged alone: `label` is True when it is desirable (a thumbs up)."""

  prompt: str  # The post (TL;DR) or the instruction (AlpacaFarm), as `Comparison.prompt`.
  completion: str
  label: bool
  annotator: str = ""
  split: str = "train"
  policy: str = ""
  id: str = ""
  title: str = ""  # TL;DR only.
  subreddit: str = ""  # TL;DR only.
  input: str = ""  # AlpacaFarm's optional instruction input.
  batch: str = ""
  extra: Mapping[str, Any] | None = None
  style: str = ""  # As `Comparison.style` and `messages`.
  messages: tuple[tuple[str, str], ...] | None = None


BINARY = "binary"  # The layout of `Feedback`: TRL's unpaired preference format.
_BINARY_TEXT = ("id", "title", "subreddit", "input", "annotator", "policy", "batch")


def _text(row: dict, key: str) -> str:
  if isinstance(row.get(key), list):
    raise ValueError(f"field {key!r} is a list of messages (TRL's conversational format): give "
                     "its text")
  return _require(row, key, str)


def _feedback_of(r: trl.Row) -> Feedback:
  if r.type != trl.UNPAIRED:
    raise ValueError(f"a {r.type.replace('_', '-')} record, not unpaired preference (prompt, "
                     "completion, label)")
  return Feedback(prompt=r.prompt, completion=r.completion, label=bool(r.label),
                  id=_trl_id(r.extra), extra=r.extra,
                  style=CONVERSATIONAL if r.conversational else STANDARD, messages=r.messages)


def from_trl_binary(row: dict, columns: Mapping[str, str] | None = None) -> Feedback:
  """A TRL unpaired preference row, standard (prompt and completion read as they are) or
  conversational."""
  return _feedback_of(trl.parse(row, columns))


def from_binary(row: dict) -> Feedback:
  if trl.is_messages(row.get("prompt")):  # TRL's conversational format.
    return _feedback_of(trl.parse(row))
  prompt, completion = _text(row, "prompt"), _text(row, "completion")
  if "label" not in row:
    raise ValueError("missing field 'label'")
  if not isinstance(row["label"], bool):
    raise ValueError(f"'label' must be true or false, got {json.dumps(row['label'])}")
  extra = row.get("extra")
  return Feedback(prompt=prompt, completion=completion, label=row["label"],
                  split=str(row.get("split") or "train"),
                  extra=extra if isinstance(extra, dict) else None,
                  **{k: str(row.get(k) or "") for k in _BINARY_TEXT})


def to_binary(f: Feedback) -> dict:
  if f.messages is not None:
    return {**dict(f.extra or {}), "prompt": _messages_out(f.messages),
            "completion": _messages_out((), (trl.ASSISTANT, f.completion)), "label": f.label}
  row = {"prompt": f.prompt, "completion": f.completion, "label": f.label}
  optional = {**{k: getattr(f, k) for k in _BINARY_TEXT},
              "split": f.split if f.split != "train" else "", "extra": f.extra}
  return {**row, **{k: (dict(v) if isinstance(v, Mapping) else v)
                    for k, v in optional.items() if v}}


BINARY_LAYOUTS = (BINARY, TRL)


def read_binary(path: str, layout: str = BINARY, columns: Mapping[str, str] | None = None
                ) -> tuple[list[Feedback], list[str]]:
  """All good records of a file of binary feedback (any file `read` takes), and one problem per
  malformed record (`file:line: reason`). Layout `binary`: a standard prompt is a post or an
  instruction, framed as TL;DR or Alpaca prompts are; `trl`: TRL's unpaired rows, whose standard
  prompt is read as it is (and `columns` maps TRL's names to the file's). A conversational row is
  TRL's in either."""
  if layout not in BINARY_LAYOUTS:
    raise ValueError(f"unknown binary feedback layout {layout!r} (available: "
                     f"{', '.join(BINARY_LAYOUTS)})")
  if layout == TRL:
    return tables.read(path, lambda row: from_trl_binary(row, columns))
  if columns:
    raise ValueError(f"column mapping is for the {TRL!r} layout, not {layout!r}")
  return tables.read(path, from_binary)


def read_binary_strict(path: str, layout: str = BINARY) -> list[Feedback]:
  """Like `read_binary`, but a malformed record is a `DataError` naming the first bad one."""
  return jsonl.strict(*read_binary(path, layout))


def write_binary(path: str, records: Iterable[Feedback], as_array: bool | None = None) -> None:
  """Writes `records` atomically in the binary layout (as `write`: an array for a `.json` path)."""
  jsonl.write(path, (to_binary(f) for f in records),
              path.endswith(".json") if as_array is None else as_array)


def unpaired(records: Sequence[Comparison]) -> list[Feedback]:
  """Two `Feedback` per comparison: its chosen response desirable, its rejected one undesirable
  (ties refused, as `preferred` does)."""
  out = []
  for c, texts in zip(records, preferred(records)):
    shared = dict(prompt=c.prompt, annotator=c.annotator, split=c.split, id=c.id, title=c.title,
                  subreddit=c.subreddit, input=c.input, batch=c.batch, style=c.style,
                  messages=c.messages, extra=c.extra)
    policies = (c.policy_a, c.policy_b) if c.choice == 0 else (c.policy_b, c.policy_a)
    out += [Feedback(completion=text, label=label, policy=policy, **shared)
            for text, label, policy in zip(texts, (True, False), policies)]
  return out
