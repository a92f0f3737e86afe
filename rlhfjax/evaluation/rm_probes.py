"""Reward-model probes in the style of Stiennon et al. (2020), Table 18, built from the simulated world.

Each probe is a pair (first, second) per post where a good judge has a clear preference: the
original summary over one with the two parties' roles reversed or its words shuffled, the post's own
title over another post's, a title over the title repeated, the reference over the reference with a
needless question appended, and the reference over extractive summaries. The table reports how often
the reward model (and, for comparison, the gold reward) prefers the first; ties count one half.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from rlhfjax.data import pipeline
from rlhfjax.evaluation import agreement
from rlhfjax.simulated import gold
from rlhfjax.simulated import world

ProbeFn = Callable[[pipeline.Tldr, pipeline.Tldr, np.random.Generator], tuple[str, str]]


def _shuffled(text: str, rng: np.random.Generator) -> str:
  return " ".join(rng.permutation(text.split()))


def _random_sentences(post: str, k: int, rng: np.random.Generator) -> str:
  sents = world.sentences(post)
  keep = np.sort(rng.choice(len(sents), min(k, len(sents)), replace=False))
  return " ".join(sents[i] for i in keep)


def _lead(post: str, k: int) -> str:
  return " ".join(world.sentences(post)[:k])


# name -> fn(example, another example, rng) -> (first, second); the first should win.
PROBES: dict[str, ProbeFn] = {
    "original vs roles reversed": lambda e, o, r: (e.reference, world.reverse_roles(e)),
    "summary vs shuffled summary": lambda e, o, r: (e.reference, _shuffled(e.reference, r)),
    "post title vs random title": lambda e, o, r: (e.title, o.title),
    "title vs title repeated twice": lambda e, o, r: (e.title, f"{e.title} {e.title}"),
    "reference vs + 'What should I do?'": lambda e, o, r: (e.reference,
                                                          e.reference + " What should I do?"),
    "reference vs lead-2": lambda e, o, r: (e.reference, _lead(e.post, 2)),
    "reference vs lead-3": lambda e, o, r: (e.reference, _lead(e.post, 3)),
    "reference vs random-3": lambda e, o, r: (e.reference, _random_sentences(e.post, 3, r)),
}


def probe_pairs(examples: Sequence[pipeline.Tldr],
                rng: np.random.Generator) -> dict[str, tuple[list[str], list[str]]]:
  """For each probe, the first and second texts for every example (the second post of the random
  title is the next example, cyclically)."""
  out = {}
  for name, fn in PROBES.items():
    pairs = [fn(e, examples[(i + 1) % len(examples)], rng) for i, e in enumerate(examples)]
    out[name] = ([p[0] for p in pairs], [p[1] for p in pairs])
  return out


def probe_table(score: Callable[[Sequence[pipeline.Tldr], Sequence[str]], np.ndarray],
                examples: Sequence[pipeline.Tldr], rng: np.random.Generator) -> list[dict]:
  """One row per probe: % of posts where the reward model (`score`) and gold prefer the first."""
  rows = []
  for name, (first, second) in probe_pairs(examples, rng).items():
    prefers = [1.0 - agreement.prefer_higher(f(first), f(second)).mean()
               for f in (lambda t: score(examples, t), lambda t: gold.gold_rewards(examples, t))]
    rows.append({"probe": name, "rm": float(prefers[0]), "gold": float(prefers[1])})
  return rows


def format_table(rows: Sequence[dict]) -> str:
  lines = ["| probe (first vs second) | RM prefers first | gold prefers first |", "|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['probe']} | {100 * r['rm']:.0f}% | {100 * r['gold']:.0f}% |")
  return "\n".join(lines)
