"""Word-level differences between the two responses of a pair, so that a labeler sees at once where
two near-identical texts differ.

A word is a run of non-space characters, punctuation included (`mat.` differs from `mat`); words are
compared exactly. Each text comes back as segments (text, changed) that join to exactly the text as
the page shows it (the original, whitespace and newlines included, with each bidi control as its
visible marker, `safe_text.visible`: the words compared are the words the labeler reads). A changed
run covers its words and the spaces between them, never the whitespace around it.
"""

from __future__ import annotations

import difflib
import itertools
import re

from rlhfjax.labeling import safe_text

# Below this SequenceMatcher ratio (the share of words the two texts have in common) the texts are
# unrelated, and marking nearly every word would say nothing: then no word is marked.
MIN_RATIO = 0.2

_WORD = re.compile(r"(\S+)(\s*)")
_LEADING = re.compile(r"\s*")

Segments = list[tuple[str, bool]]


def _split(text: str) -> tuple[str, list[tuple[str, str]]]:
  """The leading whitespace, then each word with the whitespace that follows it."""
  lead = _LEADING.match(text).end()
  return text[:lead], [m.groups() for m in _WORD.finditer(text, lead)]


def _segments(lead: str, tokens: list[tuple[str, str]], changed: list[bool]) -> Segments:
  """Merged runs of words and whitespace; whitespace is changed only between two changed words."""
  pieces = [(lead, False)]
  for i, ((word, space), c) in enumerate(zip(tokens, changed)):
    pieces += [(word, c), (space, c and i + 1 < len(changed) and changed[i + 1])]
  return [("".join(text for text, _ in run), c)
          for c, run in itertools.groupby((p for p in pieces if p[0]), key=lambda p: p[1])]


def words(a: str, b: str) -> tuple[Segments, Segments]:
  """`a` and `b` as segments (text, changed): a word is changed when it is outside the common word
  subsequence that `difflib.SequenceMatcher` finds; nothing is changed when the texts share less
  than `MIN_RATIO` of their words."""
  a, b = safe_text.visible(a), safe_text.visible(b)
  lead_a, tokens_a = _split(a)
  lead_b, tokens_b = _split(b)
  matcher = difflib.SequenceMatcher(None, [w for w, _ in tokens_a], [w for w, _ in tokens_b],
                                    autojunk=False)
  related = matcher.ratio() >= MIN_RATIO
  changed_a, changed_b = [related] * len(tokens_a), [related] * len(tokens_b)
  for block in matcher.get_matching_blocks():
    changed_a[block.a:block.a + block.size] = [False] * block.size
    changed_b[block.b:block.b + block.size] = [False] * block.size
  return _segments(lead_a, tokens_a, changed_a), _segments(lead_b, tokens_b, changed_b)
