"""RedditAdvice: situations (Reddit advice posts) with their best advice (top-level comments).

Two sets of criteria, both from Zellers et al. (2021), "TuringAdvice: A Generative and Dynamic
Evaluation of Language Use" (NAACL), its dataset section and the released scripts
(`data/prepare_eval.py` for the dynamic set, `data/create_redditadvice_2019.py` for the static one):

- `dynamic_situations`, the strict criteria of the dynamic RedditAdvice evaluation set. A post is kept
  when it is in one of `DYNAMIC_SUBREDDITS`, not deleted, not stickied, (with `now` given) between 36
  hours and 14 days old, has an upvote ratio of at least 0.5, is not an update or meta post (a title
  word starting with "update", or "META"), has no links (`is_self` false, or a URL or markdown link in
  the text), has a score of at least 20, asks a question in its title when it is in one of the dating /
  marriage subreddits, names no `SENSITIVE_WORDS` topic, and has 128–1280 tokens of title plus text.
  Its advice are its top-level comments that are not deleted, not by the poster, not by a moderator
  (`distinguished == "moderator"`, AutoModerator, or stickied), not edited, score at least 20, have at
  least 32 tokens, and do not refer to other commenters (`REFERS_TO_OTHERS`). A post with no advice
  left is dropped.
- `static_situations`, the looser criteria of the RedditAdvice2019 training set: posts in
  `STATIC_SUBREDDITS` with score > 10, more than 64 characters of text, not stickied, no "META" in the
  title and no links; advice are top-level comments with score > 10 and more than 32 characters; a post
  is kept when its best such comment scores at least 20, with every comment scoring more than a tenth
  of the best one (or gilded). These are the release script's strict inequalities. `split_by_date`
  then makes the date-based train / validation split.

Every criterion counts what it drops (each record is counted under the first criterion it fails), so
the counts of a `Report` add up to what went in. Token counts use `count_tokens`, a stand-in for the
paper's spaCy tokens (words and punctuation marks); pass your own counter to match another tokenizer.

The filters take iterables of Pushshift dicts (submissions: `id`, `subreddit`, `author`, `title`,
`selftext`, `score`, `created_utc`, ...; comments: `id`, `link_id`, `parent_id`, `author`, `body`,
`score`, `edited`, `distinguished`, ...); `from_dumps` streams them from dump files with
`reddit.iter_records`. Situations are written and read as JSONL, one situation a line.
"""

from __future__ import annotations

import calendar
import dataclasses
import datetime
import json
import re
from typing import Callable, Iterable, Mapping

from rlhfjax.errors import ConfigError, DataError
from rlhfjax import files
from rlhfjax.sources import reddit

# The advice subreddits of the dynamic evaluation (the release's `prepare_eval.py`); RedditAdvice2019
# also has r/NoStupidQuestions.
DYNAMIC_SUBREDDITS = ("relationships", "relationship_advice", "dating_advice", "legaladvice", "Advice",
                      "internetparents", "dating", "needadvice", "techsupport", "Marriage", "love")
STATIC_SUBREDDITS = DYNAMIC_SUBREDDITS + ("NoStupidQuestions",)
# Subreddits whose posts must ask a question in the title (the dynamic set's "remove non-questions").
QUESTION_SUBREDDITS = ("dating", "Marriage", "love", "dating_advice")

# Sensitive topics the dynamic set skips (the release's list), matched as whole words in the lowercased
# letters-only text, so "self-harm" matches "self harm" but "abused" does not match "abuse".
SENSITIVE_WORDS = ("assault", "assaulted", "suicide", "suicidal", "prostitution", "self harm", "abuse")

# Advice that refers to other comments only makes sense next to them. The first three are the
# release's list; the rest are ours, for the singular and the "as others said" forms.
REFERS_TO_OTHERS = (
    r"other commenters", r"top comment", r"the other comments",
    r"other (?:commenter|comment|poster|posters|redditors?|replies|answers)",
    r"(?:as|like|what) (?:others|everyone else|everyone|other people) (?:here )?(?:has |have )?"
    r"(?:said|say|mentioned|suggested|pointed out)",
    r"comments? (?:above|below)", r"(?:above|previous) comments?",
)

_LINK = re.compile(r"https?://|www\.|\]\(", re.IGNORECASE)
_UPDATE = re.compile(r"\bupdate", re.IGNORECASE)
_META = re.compile(r"\bMETA\b|\[meta\]")
_TOKEN = re.compile(r"'\w+|\w+|[^\w\s]")
_MODERATORS = ("AutoModerator",)


@dataclasses.dataclass(frozen=True)
class Advice:
  id: str
  body: str
  score: int


@dataclasses.dataclass(frozen=True)
class Situation:
  """A post and its advice, best (highest score) first."""

  id: str
  subreddit: str
  title: str
  selftext: str
  created_utc: int
  advices: tuple[Advice, ...]

  @property
  def top_advice(self) -> Advice:
    return self.advices[0]


@dataclasses.dataclass
class Report:
  """What went in, what was kept, and the drop count of each criterion (in the order applied)."""

  posts_in: int = 0
  comments_in: int = 0
  posts_kept: int = 0
  advices_kept: int = 0
  dropped: dict[str, int] = dataclasses.field(default_factory=dict)

  def drop(self, reason: str) -> None:
    self.dropped[reason] += 1


def count_tokens(text: str) -> int:
  """Words, clitics ("'m", "'s") and punctuation marks: close to the spaCy token counts the paper's
  thresholds use."""
  return len(_TOKEN.findall(text))


def _simplified(text: str) -> str:
  return " ".join(re.findall(r"[a-z]+", text.lower()))


def mentions(text: str, patterns: Iterable[str]) -> bool:
  """Whether the lowercased letters-only `text` contains one of `patterns` as whole words."""
  return re.search(r"\b(?:" + "|".join(patterns) + r")\b", _simplified(text)) is not None


def has_link(post: Mapping) -> bool:
  """A link post, or a URL or markdown link in the text."""
  return post.get("is_self") is False or _LINK.search(str(post.get("selftext") or "")) is not None


def is_update_or_meta(title: str) -> bool:
  return _UPDATE.search(title) is not None or _META.search(title) is not None


def _is_edited(comment: Mapping) -> bool:
  """Pushshift's `edited` is false, or true / the edit's timestamp."""
  return bool(comment.get("edited"))


def _is_moderator(comment: Mapping) -> bool:
  return (comment.get("distinguished") == "moderator" or comment.get("author") in _MODERATORS
          or bool(comment.get("stickied")))


def _int(record: Mapping, key: str) -> int:
  try:
    return int(record.get(key) or 0)
  except (TypeError, ValueError):
    raise DataError(f"record {record.get('id')!r}: {key} is {record.get(key)!r}, not an integer")


def _situation(post: Mapping, advices: Iterable[Advice]) -> Situation:
  ranked = tuple(sorted(advices, key=lambda a: (-a.score, a.id)))
  return Situation(str(post["id"]), str(post.get("subreddit") or ""), str(post.get("title") or ""),
                   str(post.get("selftext") or ""), _int(post, "created_utc"), ranked)


DYNAMIC_POST_REASONS = ("post:duplicate", "post:subreddit", "post:link", "post:deleted",
                        "post:stickied", "post:age", "post:upvote_ratio", "post:update_or_meta",
                        "post:score",
                        "post:not_a_question", "post:sensitive", "post:tokens")
DYNAMIC_ADVICE_REASONS = ("advice:post_dropped", "advice:duplicate", "advice:not_top_level",
                          "advice:deleted", "advice:by_poster", "advice:moderator", "advice:edited",
                          "advice:score", "advice:tokens", "advice:refers_to_others")


def _dynamic_post_reason(post: Mapping, count: Callable[[str], int], now: int | None) -> str | None:
  title, text = str(post.get("title") or ""), str(post.get("selftext") or "")
  if post.get("subreddit") not in DYNAMIC_SUBREDDITS:
    return "post:subreddit"
  if has_link(post):  # Before the deleted check: a link post's text is empty.
    return "post:link"
  if reddit.is_deleted(text) or reddit.is_deleted(post.get("author")):
    return "post:deleted"
  if post.get("stickied") or post.get("pinned"):
    return "post:stickied"
  if now is not None and not 36 * 3600 <= now - _int(post, "created_utc") <= 14 * 86400:
    return "post:age"
  if post.get("upvote_ratio") is not None and float(post["upvote_ratio"]) < 0.5:
    return "post:upvote_ratio"
  if is_update_or_meta(title):
    return "post:update_or_meta"
  if _int(post, "score") < 20:
    return "post:score"
  if post.get("subreddit") in QUESTION_SUBREDDITS and "?" not in title:
    return "post:not_a_question"
  if mentions(f"{title} {text}", SENSITIVE_WORDS):
    return "post:sensitive"
  if not 128 <= count(f"{title} {text}") <= 1280:
    return "post:tokens"
  return None


def _dynamic_advice_reason(comment: Mapping, post: Mapping, count: Callable[[str], int]) -> str | None:
  body = str(comment.get("body") or "")
  if not reddit.is_top_level(comment):
    return "advice:not_top_level"
  if reddit.is_deleted(body) or reddit.is_deleted(comment.get("author")):
    return "advice:deleted"
  if comment.get("author") == post.get("author") or comment.get("is_submitter"):
    return "advice:by_poster"
  if _is_moderator(comment):
    return "advice:moderator"
  if _is_edited(comment):
    return "advice:edited"
  if _int(comment, "score") < 20:
    return "advice:score"
  if count(body) < 32:
    return "advice:tokens"
  if mentions(body, REFERS_TO_OTHERS):
    return "advice:refers_to_others"
  return None


def _gather(submissions: Iterable[Mapping], comments: Iterable[Mapping], report: Report,
            post_reason: Callable[[Mapping], str | None],
            advice_reason: Callable[[Mapping, Mapping], str | None],
            ) -> tuple[dict[str, Mapping], dict[str, list[Mapping]]]:
  """The posts that pass `post_reason` (by id, in input order) and, for each, its comments that
  pass `advice_reason(comment, post)`; every record dropped is counted in `report` under the first
  criterion it fails (a repeated id first)."""
  posts: dict[str, Mapping] = {}
  seen: set[str] = set()
  for post in submissions:
    report.posts_in += 1
    pid = str(post.get("id"))
    reason = "post:duplicate" if pid in seen else post_reason(post)
    seen.add(pid)
    if reason:
      report.drop(reason)
    else:
      posts[pid] = post
  kept: dict[str, list[Mapping]] = {pid: [] for pid in posts}
  seen = set()
  for comment in comments:
    report.comments_in += 1
    pid, cid = reddit.submission_id(comment), str(comment.get("id"))
    if pid not in posts:
      reason = "advice:post_dropped"
    elif cid in seen:
      reason = "advice:duplicate"
    else:
      reason = advice_reason(comment, posts[pid])
    seen.add(cid)
    if reason:
      report.drop(reason)
    else:
      kept[pid].append(comment)
  return posts, kept


def _advice(comment: Mapping) -> Advice:
  return Advice(str(comment.get("id")), str(comment["body"]), _int(comment, "score"))


def dynamic_situations(submissions: Iterable[Mapping], comments: Iterable[Mapping],
                       count: Callable[[str], int] = count_tokens,
                       now: int | None = None) -> tuple[list[Situation], Report]:
  """The dynamic RedditAdvice criteria (module docstring); `now` (unix seconds) turns on the age
  window of 36 hours to 14 days. Situations come in input order, advice best first."""
  report = Report(dropped=dict.fromkeys(DYNAMIC_POST_REASONS + DYNAMIC_ADVICE_REASONS
                                        + ("situation:no_advice",), 0))
  posts, kept = _gather(submissions, comments, report,
                        lambda post: _dynamic_post_reason(post, count, now),
                        lambda comment, post: _dynamic_advice_reason(comment, post, count))
  advices = {pid: [_advice(c) for c in found] for pid, found in kept.items()}
  return _assemble(posts, advices, report), report


def _assemble(posts: Mapping[str, Mapping], advices: Mapping[str, list[Advice]],
              report: Report) -> list[Situation]:
  out = []
  for pid, post in posts.items():
    if not advices[pid]:
      report.drop("situation:no_advice")
      continue
    out.append(_situation(post, advices[pid]))
    report.posts_kept += 1
    report.advices_kept += len(advices[pid])
  return out


STATIC_POST_REASONS = ("post:duplicate", "post:subreddit", "post:link", "post:deleted",
                       "post:stickied", "post:score", "post:selftext_chars", "post:meta")
STATIC_ADVICE_REASONS = ("advice:post_dropped", "advice:duplicate", "advice:not_top_level",
                         "advice:deleted", "advice:score", "advice:chars", "advice:below_tenth_of_top",
                         "advice:in_dropped_situation")


def _static_post_reason(post: Mapping) -> str | None:
  text = str(post.get("selftext") or "")
  if post.get("subreddit") not in STATIC_SUBREDDITS:
    return "post:subreddit"
  if has_link(post):
    return "post:link"
  if reddit.is_deleted(text):
    return "post:deleted"
  if post.get("stickied"):
    return "post:stickied"
  if _int(post, "score") <= 10:
    return "post:score"
  if len(text) <= 64:
    return "post:selftext_chars"
  if "META" in str(post.get("title") or ""):
    return "post:meta"
  return None


def _static_advice_reason(comment: Mapping) -> str | None:
  body = str(comment.get("body") or "")
  if not reddit.is_top_level(comment):
    return "advice:not_top_level"
  if reddit.is_deleted(body):
    return "advice:deleted"
  if _int(comment, "score") <= 10:
    return "advice:score"
  if len(body) <= 32:
    return "advice:chars"
  return None


def static_situations(submissions: Iterable[Mapping],
                      comments: Iterable[Mapping]) -> tuple[list[Situation], Report]:
  """The RedditAdvice2019 criteria (module docstring): several advice per situation, best first."""
  report = Report(dropped=dict.fromkeys(STATIC_POST_REASONS + STATIC_ADVICE_REASONS
                                        + ("situation:no_advice", "situation:top_score"), 0))
  posts, kept = _gather(submissions, comments, report, _static_post_reason,
                        lambda comment, post: _static_advice_reason(comment))
  candidates = {pid: [(_advice(c), _int(c, "gilded") > 0) for c in found]
                for pid, found in kept.items()}
  advices: dict[str, list[Advice]] = {pid: [] for pid in posts}
  for pid, found in candidates.items():
    top = max((a.score for a, _ in found), default=0)
    if found and top < 20:
      report.drop("situation:top_score")
      report.dropped["advice:in_dropped_situation"] += len(found)
      del posts[pid]
      continue
    for advice, gilded in found:
      if advice.score > top / 10 or gilded:
        advices[pid].append(advice)
      else:
        report.drop("advice:below_tenth_of_top")
  return _assemble(posts, advices, report), report


def parse_date(cut: str | int) -> int:
  """Unix seconds of `cut`: an integer, or an ISO date / datetime in UTC ("2019-07-01")."""
  if isinstance(cut, int):
    return cut
  try:
    when = datetime.datetime.fromisoformat(str(cut))
  except ValueError:
    raise ConfigError(f"split cut {cut!r} is neither unix seconds nor an ISO date (YYYY-MM-DD)")
  return calendar.timegm(when.utctimetuple())


def split_by_date(situations: Iterable[Situation],
                  cut: str | int) -> tuple[list[Situation], list[Situation]]:
  """(train, validation): posts created before `cut`, and at or after it. Validation is newer than
  everything trained on, as in RedditAdvice2019 (the newest posts are held out)."""
  at = parse_date(cut)
  train, valid = [], []
  for s in situations:
    (train if s.created_utc < at else valid).append(s)
  return train, valid


FILTERS = {"dynamic": dynamic_situations, "static": static_situations}


def from_dumps(submissions_path: str, comments_path: str, criteria: str = "dynamic",
               **kwargs) -> tuple[list[Situation], Report]:
  """Filters Pushshift dump files (.ndjson / .zst) with the `criteria` ("dynamic" or "static");
  `kwargs` go to the filter."""
  if criteria not in FILTERS:
    raise ConfigError(f"advice criteria {criteria!r} is not one of {', '.join(FILTERS)}")
  return FILTERS[criteria](reddit.iter_records(submissions_path), reddit.iter_records(comments_path),
                           **kwargs)


def to_dict(s: Situation) -> dict:
  return dataclasses.asdict(s)


def from_dict(row: Mapping) -> Situation:
  advices = tuple(Advice(str(a["id"]), str(a["body"]), int(a["score"])) for a in row["advices"])
  if not advices:
    raise ValueError("a situation needs at least one advice")
  return Situation(str(row["id"]), str(row["subreddit"]), str(row["title"]), str(row["selftext"]),
                   int(row["created_utc"]), advices)


def write(path: str, situations: Iterable[Situation]) -> None:
  """Writes situations as JSONL, atomically."""
  with files.atomic_open(path) as f:
    for s in situations:
      f.write(json.dumps(to_dict(s), ensure_ascii=False) + "\n")


def read(path: str) -> list[Situation]:
  """Reads a `write` file; a malformed line raises DataError naming `path:line`."""
  out = []
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        out.append(from_dict(json.loads(line)))
      except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{path}:{n}: {e}") from None
  return out
