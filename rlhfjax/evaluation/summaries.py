"""Scoring summaries: gold reward (simulated world), ROUGE-L against the reference, length.

`summary_table` compares any number of summarisers on the same examples — the SFT report's
"reference > SFT samples > extractive baselines" table.
"""

from __future__ import annotations

import functools
from typing import Mapping, Sequence

import numpy as np
from rouge_score import rouge_scorer

from rlhfjax.data import gold
from rlhfjax.data import world


@functools.lru_cache(maxsize=1)
def _scorer() -> rouge_scorer.RougeScorer:
  return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l(predictions: Sequence[str], references: Sequence[str]) -> np.ndarray:
  """Per-example ROUGE-L F1 (with stemming, as in the summarisation literature)."""
  scorer = _scorer()
  return np.array([scorer.score(r, p)["rougeL"].fmeasure for p, r in zip(predictions, references)])


def baseline_summaries(examples: Sequence[world.Example]) -> dict[str, list[str]]:
  """The reference and the extractive baselines (title, lead-1, lead-2) for each example."""
  rows = [world.extractive_baselines(e) for e in examples]
  out = {"reference": [e.reference for e in examples]}
  for name in rows[0]:
    out[name] = [r[name] for r in rows]
  return out


def summary_table(examples: Sequence[world.Example],
                  summaries: Mapping[str, Sequence[str]]) -> list[dict[str, float | str]]:
  """One row per summariser: gold mean and standard error, ROUGE-L, mean words; best gold first."""
  refs = [e.reference for e in examples]
  rows = []
  for name, texts in summaries.items():
    g = gold.gold_rewards(examples, texts)
    rows.append({"name": name, "gold": float(g.mean()), "gold_se": float(g.std(ddof=1) / np.sqrt(len(g))),
                 "rougeL": float(rouge_l(texts, refs).mean()),
                 "words": float(np.mean([len(t.split()) for t in texts]))})
  return sorted(rows, key=lambda r: -r["gold"])


def format_table(rows: Sequence[Mapping[str, float | str]]) -> str:
  """A Markdown table of `summary_table` rows."""
  lines = ["| summariser | gold reward | ROUGE-L | words |", "|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['name']} | {r['gold']:.3f} ± {r['gold_se']:.3f} | {r['rougeL']:.3f} "
                 f"| {r['words']:.1f} |")
  return "\n".join(lines)
