"""Label-free contrastive comparisons: a post's reference against a copy with one fact made wrong.

Preference-model pretraining (Askell et al. 2021, §4) trains a reward model on comparisons that no
labeler made; FactCC (Kryściński et al. 2020) makes factually wrong summaries by rule-based edits of
correct ones (swapped entities, numbers, pronouns). Here the edits touch only the *facts* of a
reference: the words it copies from its post that are rare across posts (ages, relations, names,
feelings, events — not "my" or "the"). Two edits, one per pair:

- **swap**: two such words of the same shape that is not a plain lower-case word (ages like
  "(25F)", numbers, capitalised names) trade places: whose age is whose;
- **substitute**: one such word takes the word of the same shape at the same place in another
  post's reference (the two word sequences aligned by difflib): a fluent detail of the wrong post.

The edited summary is as long and as fluent as the reference, so these pairs teach what labelled
pairs of model samples teach least: checking a summary against its post rather than preferring
length (docs/reward_model.md). The reference is always the chosen response.
"""

from __future__ import annotations

import collections
import difflib
import re
from typing import Protocol, Sequence

import numpy as np

from rlhfjax.data import pipeline
from rlhfjax.data import records

_PUNCT = re.compile(r"^(.*?)([.,!?;:]*)$")


class Referenced(Protocol):
  """A post with a reference summary (a `pipeline.Tldr`, or a real TL;DR example)."""
  id: str
  subreddit: str
  title: str
  post: str
  reference: str


def _key(word: str) -> str:
  return _PUNCT.match(word.lower()).group(1)


def shape(word: str) -> str:
  """The word's character classes with runs collapsed: "(25F)" -> "(dA)", "Max" -> "Aa"."""
  core = _PUNCT.match(word).group(1)
  classes = ("d" if ch.isdigit() else "A" if ch.isupper() else "a" if ch.isalpha() else ch
             for ch in core)
  return re.sub(r"(.)\1+", r"\1", "".join(classes))


def document_frequency(posts: Sequence[str]) -> dict[str, float]:
  """The fraction of `posts` each (lower-cased, end-punctuation-stripped) word occurs in."""
  counts = collections.Counter(k for p in posts for k in {_key(w) for w in p.split()})
  return {k: n / max(len(posts), 1) for k, n in counts.items()}


def fact_positions(words: Sequence[str], post: str, df: dict[str, float], max_df: float) -> list[int]:
  """Indices of the words of a summary that are facts: copied from `post`, rare across posts."""
  in_post = {_key(w) for w in post.split()}
  return [i for i, w in enumerate(words)
          if (k := _key(w)) and k in in_post and df.get(k, 0.0) <= max_df]


def _with(words: Sequence[str], i: int, new: str) -> list[str]:
  """`words` with word `i`'s core replaced by `new`'s, its end punctuation kept."""
  out = list(words)
  out[i] = _PUNCT.match(new).group(1) + _PUNCT.match(words[i]).group(2)
  return out


def swap(words: Sequence[str], facts: Sequence[int], rng: np.random.Generator) -> list[str] | None:
  """Two fact words of one shape (not plain lower case) and different value exchanged, or None."""
  pairs = [(i, j) for a, i in enumerate(facts) for j in facts[a + 1:]
           if _key(words[i]) != _key(words[j]) and shape(words[i]) == shape(words[j]) != "a"]
  if not pairs:
    return None
  i, j = pairs[rng.integers(len(pairs))]
  return _with(_with(words, i, words[j]), j, words[i])


def substitute(words: Sequence[str], facts: Sequence[int], other: Sequence[str],
               df: dict[str, float], max_df: float,
               rng: np.random.Generator) -> list[str] | None:
  """One fact word replaced by the different, rare word of its shape aligned with it in `other`,
  or None."""
  keys, other_keys = [_key(w) for w in words], [_key(w) for w in other]
  fact_set = set(facts)
  options = [(i1, j1) for tag, i1, i2, j1, j2
             in difflib.SequenceMatcher(a=keys, b=other_keys, autojunk=False).get_opcodes()
             if tag == "replace" and i2 - i1 == 1 and j2 - j1 == 1 and i1 in fact_set
             and other_keys[j1] and df.get(other_keys[j1], 0.0) <= max_df
             and shape(words[i1]) == shape(other[j1])]
  if not options:
    return None
  i, j = options[rng.integers(len(options))]
  return _with(words, i, other[j])


def comparisons(examples: Sequence[Referenced], seed: int, max_df: float = 0.2,
                tries: int = 4) -> list[records.Comparison]:
  """One comparison (reference chosen over an edited reference) per example that admits an edit:
  a swap or a substitution, drawn with equal probability when both exist; the substitution's
  other reference is one of `tries` random other examples."""
  rng = np.random.default_rng([seed, 17])
  df = document_frequency([e.post for e in examples])
  out = []
  for n, e in enumerate(examples):
    words = e.reference.split()
    facts = fact_positions(words, e.post, df, max_df)
    edits = [swap(words, facts, rng)]
    for _ in range(tries if len(examples) > 1 else 0):
      k = int(rng.integers(len(examples) - 1))
      edited = substitute(words, facts, examples[k + (k >= n)].reference.split(), df, max_df, rng)
      if edited is not None:
        edits.append(edited)
        break
    edits = [" ".join(w) for w in edits if w is not None and w != words]
    if edits:
      wrong = edits[rng.integers(len(edits))]
      out.append(records.Comparison(response_a=e.reference, response_b=wrong, choice=0,
                                    annotator="contrast", split="contrast",
                                    **pipeline.comparison_prompt(e)))
  return out
