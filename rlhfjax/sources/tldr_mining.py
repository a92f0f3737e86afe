"""TLDR9+ / TLDRHQ: mining (post, TL;DR) pairs from Pushshift dumps, the HQ filter, and statistics.

Sotudeh et al. (2021), "TLDR9+: A Large-Scale Resource for Extreme Summarization of Social Media
Posts" (NewSum workshop at EMNLP), dataset construction, with the details the paper leaves open
taken from the authors' miner (github.com/sajastu/reddit_collector):

- A TL;DR keyword is a word that starts with "TL" and ends with "DR" with up to three characters
  between, in any case ("tl;dr", "TL;DR:", "tl dr", "TLDR", "Tl,dr", "tl/dr", ...), as a whole word:
  not inside another word ("untldr", "bottle;dr"), a subreddit or user link ("r/tldr"), a hashtag
  or a domain ("tldr.tech"); "tldr;dr" is one keyword. The text before the last keyword is the
  post, the text after it the TL;DR (the authors' miner splits at the first, so that "sorry, tl;dr
  at the bottom ... TL;DR: ..." gave a TL;DR holding half the post). Both submissions
  (`selftext`) and comments (`body`) are mined; deleted, removed and empty texts are skipped.
- Both parts are cleaned (`clean_text`): HTML entities decoded (Pushshift escapes `&`, `<`, `>`,
  the `&` of an entity such as `&nbsp;` included), Reddit's backslash escapes kept as the
  characters, markdown links reduced to their text, URLs removed, markdown markup (headings, quotes, list
  markers, rules, emphasis, code, superscript) removed, zero-width characters removed, whitespace
  collapsed to single spaces; separators between the keyword and the text (": ", " - ", ...) are
  stripped. A pair is dropped when its post has fewer than `min_post_words` words, its TL;DR fewer
  than `min_tldr_words` (the authors' miner keeps TL;DRs of more than four words), or, with
  `tldr_shorter_than_post`, when the TL;DR is not shorter than the post (the miner's other rule).
  Words are `\\w+` runs (apostrophes inside kept), lower-cased.
- TLDRHQ keeps a pair when its oracle sentence, the post sentence with the highest mean of ROUGE-2
  and ROUGE-L F1 (rouge-score, Porter stemming) against the TL;DR, scores at least 0.22 (the
  paper's threshold, set with the help of human annotations). Posts are split into sentences with
  `world.sentences` (after . ! or ?), a stand-in for the authors' spaCy sentences.
- `statistics` gives the paper's dataset tables (Tables 3-4: sizes, words and sentences per post
  and TL;DR, compression ratio, vocabulary, novel n-grams, oracle position) and the ORACLE-EXT and
  LEAD-k baselines (ROUGE-1/2/L F1 against the TL;DR; the paper reports ORACLE-EXT at
  30.26 / 9.74 / 20.60 on TLDR9+); `markdown` writes them as tables.

`mine` streams dump files into one JSONL of pairs (`id` as a Reddit fullname, `kind`, `subreddit`,
`title`, `post`, `tldr`, `created_utc`, `source`). Each input is mined into its own part file in
`out_path + ".parts/"`, committed (renamed into place) only when the input was read to its end,
with a `.json` note of its counts and the settings used. A later input that fails (a truncated
`.zst`) raises `DataError` naming it; the finished parts stay, and a rerun reuses every part whose
input size and settings are unchanged, so it resumes where it stopped. The parts are kept after a
run as the cache of the next (e.g. one more month of dumps); delete the folder to start afresh.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import html
import json
import os
import re
import shutil
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping, Sequence

from rlhfjax.errors import DataError
from rlhfjax import files as files_lib
from rlhfjax import imports
from rlhfjax.simulated import world
from rlhfjax.sources import reddit

if TYPE_CHECKING:
  from rouge_score import rouge_scorer

HQ_THRESHOLD = 0.22  # TLDRHQ: mean of ROUGE-2 and ROUGE-L F1 of the oracle sentence.
REASONS = ("deleted", "no_keyword", "short_post", "short_tldr", "tldr_not_shorter", "kept")

# Not inside a word, a subreddit or user link ("r/tldr"), a hashtag or a domain ("tldr.tech"); a
# doubled "tldr;dr" is one keyword.
TLDR_KEYWORD = re.compile(r"(?<![\w/#])tl.{0,3}?dr(?:[;:]dr)?(?!\w|\.\w)",
                          re.IGNORECASE | re.DOTALL)
# The version of the mining rules, in every part's note: parts mined under other rules are mined
# again.
RULES = 2
# A quick test that `extract` runs before cleaning: a text with a keyword after cleaning already
# has "tl" with no letter or digit before it (cleaning never deletes a letter in front of a word it
# keeps; it may delete an underscore, so one is allowed there).
_MAYBE_KEYWORD = re.compile(r"(?<![^\W_])tl", re.IGNORECASE)
_WORD = re.compile(r"\w+(?:['’]\w+)*")
_MD_LINK = re.compile(r"\[([^\]\n]*)\]\([^)\n]*\)")
_URL = re.compile(r"(?:https?://|www\.)\S+", re.IGNORECASE)
_RULE = re.compile(r"^[ \t]*(?:[-*_][ \t]*){3,}$", re.MULTILINE)
_LINE_MARK = re.compile(r"^[ \t]*(?:>[> \t]*|(?:#{1,6}|[*+-]|\d{1,3}[.)])[ \t]+)", re.MULTILINE)
_MARKUP = re.compile(r"\*+(?=\S)|(?<=\S)\*+|~~|`+|\^|(?<!\w)_+|_+(?!\w)")
# Reddit's backslash escapes of markdown characters: the character stays, as text.
_ESCAPED = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|~^>])")
_HIDE = {c: chr(0xE000 + i) for i, c in enumerate("\\`*_{}[]()#+-.!|~^>")}  # Private use.
_SHOW = str.maketrans({v: k for k, v in _HIDE.items()})
_INVISIBLE = re.compile("[\u200b\u200c\u200d\u2060\ufeff]|&#x200[bB];")
_SURROGATE = re.compile("[\ud800-\udfff]")  # From unpaired JSON escapes; UTF-8 cannot hold them.
_SPACE = re.compile(r"\s+")
_POST_TAIL = " -–—=|:;,([*"  # Stripped from the end of the post (before the keyword).
_TLDR_HEAD = " -–—=|:;,.)]>/\\!?*"  # Stripped from the start of the TL;DR (after the keyword).


@dataclasses.dataclass(frozen=True)
class MiningConfig:
  """When a (post, TL;DR) split is kept; the module docstring says where each default comes from."""

  min_post_words: int = 1
  min_tldr_words: int = 5
  tldr_shorter_than_post: bool = True


def words(text: str) -> list[str]:
  """Lower-cased words: runs of letters and digits, apostrophes inside a word kept."""
  return _WORD.findall(text.lower())


def clean_text(text: str) -> str:
  """Reddit markdown as plain text on one line: no URLs, markup, entities, zero-width characters."""
  text = html.unescape(html.unescape(text))  # Pushshift escapes "&" in "&nbsp;" too.
  text = _ESCAPED.sub(lambda m: _HIDE[m.group(1)], text)
  text = _MD_LINK.sub(r"\1", text)
  text = _URL.sub(" ", text)
  text = _RULE.sub(" ", text)
  text = _LINE_MARK.sub("", text)
  text = _MARKUP.sub("", text)
  text = _INVISIBLE.sub("", text)
  text = _SURROGATE.sub("\ufffd", text).translate(_SHOW)
  return _SPACE.sub(" ", text).strip()


def split_tldr(text: str) -> tuple[str, str] | None:
  """(post, TL;DR) of a cleaned text around its last TL;DR keyword; None when it has none. The
  last, not the first: an earlier one often points to it ("tl;dr at the bottom")."""
  m = None
  for m in TLDR_KEYWORD.finditer(text):
    pass
  if m is None:
    return None
  return text[:m.start()].rstrip(_POST_TAIL), text[m.end():].lstrip(_TLDR_HEAD)


def extract(record: dict, config: MiningConfig = MiningConfig()) -> tuple[dict | None, str]:
  """The pair of a Pushshift submission or comment (or None) and the reason, one of `REASONS`."""
  text = reddit.text_of(record)
  if reddit.is_deleted(text):
    return None, "deleted"
  parts = split_tldr(clean_text(text)) if _MAYBE_KEYWORD.search(text) else None
  if parts is None:
    return None, "no_keyword"
  post, tldr = parts
  post_words, tldr_words = len(words(post)), len(words(tldr))
  if post_words < config.min_post_words:
    return None, "short_post"
  if tldr_words < config.min_tldr_words:
    return None, "short_tldr"
  if config.tldr_shorter_than_post and tldr_words >= post_words:
    return None, "tldr_not_shorter"
  comment = reddit.is_comment(record)
  return {"id": f"{'t1' if comment else 't3'}_{record.get('id', '')}",
          "kind": "comment" if comment else "submission",
          "subreddit": str(record.get("subreddit") or ""),
          "title": "" if comment else clean_text(str(record.get("title") or "")),
          "post": post, "tldr": tldr, "created_utc": record.get("created_utc")}, "kept"


def _write_json(path: str, obj: dict) -> None:
  with files_lib.atomic_open(path) as f:
    json.dump(obj, f, ensure_ascii=False, indent=1)


def _finished(part: str, note: str, size: int, config: MiningConfig) -> dict | None:
  """The note of a part mined from an input of this size with these settings, if there is one."""
  if not (os.path.exists(part) and os.path.exists(note)):
    return None
  with open(note, encoding="utf-8") as f:
    summary = json.load(f)
  if summary.get("size") != size or summary.get("config") != dataclasses.asdict(config) or \
     summary.get("rules") != RULES:
    return None
  return summary


def _mine_file(path: str, part: str, note: str, config: MiningConfig) -> dict:
  """Mines one dump into `part` (renamed into place once the input was read to its end)."""
  counts = dict.fromkeys(REASONS, 0)
  report = reddit.ReadReport(path)
  source = os.path.basename(path)
  try:
    with open(f"{part}.tmp", "w", encoding="utf-8") as f:
      for record in reddit.iter_records(path, report):
        pair, reason = extract(record, config)
        counts[reason] += 1
        if pair is not None:
          pair["source"] = source
          f.write(json.dumps(pair, ensure_ascii=False) + "\n")
  except DataError as e:
    os.replace(f"{part}.tmp", f"{part}.partial")
    raise DataError(
        f"{e}. The {counts['kept']} pairs mined from it before the error are in {part}.partial; "
        f"the pairs of the inputs finished before it are in {os.path.dirname(part)}/. Replace or "
        f"leave out this input and rerun: finished inputs are not mined again.") from e
  summary = {"input": source, "size": os.path.getsize(path), "rules": RULES,
             "config": dataclasses.asdict(config),
             "counts": counts, "lines": report.lines, "bad_count": report.bad_count,
             "bad_lines": report.bad_lines, "replaced_bytes": report.replaced_bytes,
             "replaced_lines": report.replaced_lines}
  # The part first, then its note: a run stopped between the two finds an old note that does not
  # match, and mines the input again, never an old part under a new note.
  os.replace(f"{part}.tmp", part)
  _write_json(note, summary)
  if os.path.exists(f"{part}.partial"):  # Left by an earlier, failed attempt at this input.
    os.remove(f"{part}.partial")
  return summary


def mine(paths: Sequence[str], out_path: str, config: MiningConfig = MiningConfig()) -> dict:
  """Mines dump files into `out_path` (JSONL, in input order), resuming from finished parts.

  Returns `{"files": [per input: counts by reason, bad lines, replaced bytes, resumed],
  "counts": the totals}`; every record read is counted under exactly one reason.
  """
  names = [os.path.basename(p) for p in paths]
  if len(set(names)) != len(names):
    raise ValueError(f"inputs must have distinct file names (their parts are named after them): "
                     f"{sorted(n for n in set(names) if names.count(n) > 1)}")
  reddit.check_distinct(paths)
  parts_dir = f"{out_path}.parts"
  os.makedirs(parts_dir, exist_ok=True)
  files, totals = [], collections.Counter()
  for path, name in zip(paths, names):
    part, note = os.path.join(parts_dir, f"{name}.jsonl"), os.path.join(parts_dir, f"{name}.json")
    summary = _finished(part, note, os.path.getsize(path), config)
    resumed = summary is not None
    if summary is None:
      summary = _mine_file(path, part, note, config)
    files.append({**summary, "resumed": resumed})
    totals.update(summary["counts"])
    totals.update({k: summary[k]
                   for k in ("lines", "bad_count", "replaced_bytes", "replaced_lines")})
  with files_lib.atomic_open(out_path, "wb") as out:
    for name in names:
      with open(os.path.join(parts_dir, f"{name}.jsonl"), "rb") as f:
        shutil.copyfileobj(f, out)
  return {"files": files, "counts": dict(totals)}


def read_pairs(path: str) -> Iterator[dict]:
  """The pairs of a JSONL file written by `mine` or `write_high_quality`."""
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        pair = json.loads(line)
        if not (isinstance(pair, dict) and isinstance(pair.get("post"), str)
                and isinstance(pair.get("tldr"), str)):
          raise ValueError("not an object with string 'post' and 'tldr'")
      except ValueError as e:
        raise DataError(f"{path}:{number}: {e}") from e
      yield pair


class _StemmingTokenizer:
  """rouge-score's default tokenizer with its Porter stemmer (`use_stemmer=True`), the stems
  memoised: stemming is most of the cost of scoring, and words repeat across a corpus. rouge-score
  and NLTK are imported here, not with the module (and without what NLTK would load for nothing,
  rlhfjax/imports.py): every `python -m rlhfjax.main` imports this module."""

  def __init__(self):
    with imports.without(*imports.NLTK_UNUSED):
      from nltk.stem import porter  # pylint: disable=import-outside-toplevel
      from rouge_score import tokenize  # pylint: disable=import-outside-toplevel
    self.stem = functools.lru_cache(maxsize=1 << 18)(porter.PorterStemmer().stem)
    self._tokenize = tokenize.tokenize

  def tokenize(self, text: str) -> list[str]:
    return self._tokenize(text, self)


def _rouge_scorer(types: list[str]) -> rouge_scorer.RougeScorer:
  from rouge_score import rouge_scorer  # pylint: disable=import-outside-toplevel,redefined-outer-name
  return rouge_scorer.RougeScorer(types, tokenizer=_StemmingTokenizer())


@functools.lru_cache(maxsize=1)
def _oracle_scorer() -> rouge_scorer.RougeScorer:
  return _rouge_scorer(["rouge2", "rougeL"])


@functools.lru_cache(maxsize=1)
def _scorer() -> rouge_scorer.RougeScorer:
  return _rouge_scorer(["rouge1", "rouge2", "rougeL"])


def oracle(sentences: Sequence[str], tldr: str) -> tuple[int, float]:
  """The sentence with the highest mean of ROUGE-2 and ROUGE-L F1 against `tldr` (the first on a
  tie), and that mean; (-1, 0.0) when there is no sentence."""
  best, best_score = -1, 0.0
  scorer = _oracle_scorer()
  for i, sentence in enumerate(sentences):
    s = scorer.score(tldr, sentence)
    score = (s["rouge2"].fmeasure + s["rougeL"].fmeasure) / 2
    if best < 0 or score > best_score:
      best, best_score = i, score
  return best, best_score


def high_quality(pairs: Iterable[dict], threshold: float = HQ_THRESHOLD) -> Iterator[dict]:
  """TLDRHQ: the pairs whose oracle sentence scores at least `threshold`, with `oracle_index`
  (0-based sentence of the post) and `oracle_score` added."""
  for pair in pairs:
    index, score = oracle(world.sentences(pair["post"]), pair["tldr"])
    if index >= 0 and score >= threshold:
      yield {**pair, "oracle_index": index, "oracle_score": score}


def write_high_quality(in_path: str, out_path: str, threshold: float = HQ_THRESHOLD) -> dict:
  """Streams `high_quality` from one JSONL of pairs to another (atomically); returns the counts."""
  counts = {"pairs": 0, "kept": 0}

  def counted(pairs: Iterable[dict]) -> Iterator[dict]:
    for pair in pairs:
      counts["pairs"] += 1
      yield pair

  with files_lib.atomic_open(out_path) as f:
    for pair in high_quality(counted(read_pairs(in_path)), threshold):
      counts["kept"] += 1
      f.write(json.dumps(pair, ensure_ascii=False) + "\n")
  return {**counts, "dropped": counts["pairs"] - counts["kept"]}


def _ngrams(tokens: Sequence[str], n: int) -> set[tuple[str, ...]]:
  return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


def statistics(pairs: Iterable[dict], lead_k: Sequence[int] = (1, 2, 3),
               positions: int = 5) -> dict:
  """The paper's dataset statistics and extractive baselines for pairs with `post` and `tldr`.

  Means are over pairs; the compression ratio is mean post words over mean TL;DR words; the
  vocabulary counts distinct words of posts and TL;DRs. Novel n-grams (%): per pair, the share of
  the TL;DR's distinct n-grams that are not in the post, averaged over pairs whose TL;DR has an
  n-gram of that order. Oracle position (%): the share of pairs whose oracle is sentence 1, 2, ...,
  `positions`, or later (a post with no sentence has none). Baselines: mean ROUGE-1/2/L F1 x 100
  against the TL;DR of the oracle sentence (ORACLE-EXT) and of the first k sentences (LEAD-k).
  """
  n, totals, vocabulary = 0, collections.Counter(), set()
  novel, with_ngrams = collections.Counter(), collections.Counter()
  position = collections.Counter()
  systems = ["ORACLE-EXT"] + [f"LEAD-{k}" for k in lead_k]
  rouge = {name: collections.Counter() for name in systems}
  scorer = _scorer()
  for pair in pairs:
    post, tldr = pair["post"], pair["tldr"]
    post_words, tldr_words = words(post), words(tldr)
    sentences = world.sentences(post)
    n += 1
    totals.update({"post_words": len(post_words), "tldr_words": len(tldr_words),
                   "post_sentences": len(sentences), "tldr_sentences": len(world.sentences(tldr))})
    vocabulary.update(post_words, tldr_words)
    for k in range(1, 5):
      grams = _ngrams(tldr_words, k)
      if grams:
        novel[k] += len(grams - _ngrams(post_words, k)) / len(grams)
        with_ngrams[k] += 1
    index = pair["oracle_index"] if "oracle_index" in pair else oracle(sentences, tldr)[0]
    if index >= 0:
      position[str(index + 1) if index < positions else f"{positions + 1}+"] += 1
    candidates = {"ORACLE-EXT": sentences[index] if index >= 0 else ""}
    candidates.update({f"LEAD-{k}": " ".join(sentences[:k]) for k in lead_k})
    for name, text in candidates.items():
      s = scorer.score(tldr, text)
      rouge[name].update({t: 100 * s[t].fmeasure for t in ("rouge1", "rouge2", "rougeL")})
  if n == 0:
    raise ValueError("statistics of no pairs")
  mean = {k: v / n for k, v in totals.items()}
  buckets = [str(i) for i in range(1, positions + 1)] + [f"{positions + 1}+"]
  return {
      "instances": n,
      **{k: mean[k] for k in ("post_words", "post_sentences", "tldr_words", "tldr_sentences")},
      "compression_ratio": mean["post_words"] / mean["tldr_words"],
      "vocabulary": len(vocabulary),
      "novel_ngrams": {str(k): 100 * novel[k] / with_ngrams[k] if with_ngrams[k] else 0.0
                       for k in range(1, 5)},
      "oracle_position": {b: 100 * position[b] / n for b in buckets},
      "baselines": {name: {t: rouge[name][t] / n for t in ("rouge1", "rouge2", "rougeL")}
                    for name in systems},
  }


def markdown(stats: Mapping[str, dict]) -> str:
  """Dataset and baseline tables, one column (or row group) per named dataset's `statistics`."""
  names = list(stats)
  rows = [("Instances", lambda s: f"{s['instances']:,}"),
          ("Words per post", lambda s: f"{s['post_words']:.1f}"),
          ("Sentences per post", lambda s: f"{s['post_sentences']:.1f}"),
          ("Words per TL;DR", lambda s: f"{s['tldr_words']:.1f}"),
          ("Sentences per TL;DR", lambda s: f"{s['tldr_sentences']:.1f}"),
          ("Compression ratio", lambda s: f"{s['compression_ratio']:.2f}"),
          ("Vocabulary", lambda s: f"{s['vocabulary']:,}")]
  rows += [(f"Novel {k}-grams (%)", lambda s, k=k: f"{s['novel_ngrams'][k]:.2f}") for k in "1234"]
  rows += [(f"Oracle is sentence {b} (%)", lambda s, b=b: f"{s['oracle_position'][b]:.1f}")
           for b in stats[names[0]]["oracle_position"]]
  lines = ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
  lines += [f"| {label} | " + " | ".join(cell(stats[n]) for n in names) + " |"
            for label, cell in rows]
  lines += ["", "| Dataset | Baseline | ROUGE-1 | ROUGE-2 | ROUGE-L |", "|---|---|---|---|---|"]
  for name in names:
    for system, r in stats[name]["baselines"].items():
      lines.append(f"| {name} | {system} | {r['rouge1']:.2f} | {r['rouge2']:.2f} "
                   f"| {r['rougeL']:.2f} |")
  return "\n".join(lines) + "\n"
