"""Scoring summaries: gold reward (simulated world), ROUGE-L against the reference, length.

`summary_table` compares any number of summarisers on the same examples — the SFT report's
"reference > SFT samples > extractive baselines" table. On real data (`pipeline.has_gold` false) the
table has no gold columns and ranks by ROUGE-L; instructions (Alpaca) get no extractive baselines.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from rlhfjax import imports
from rlhfjax.data import pipeline
from rlhfjax.simulated import gold
from rlhfjax.simulated import world

if TYPE_CHECKING:
  from rouge_score import rouge_scorer


@functools.lru_cache(maxsize=1)
def _scorer() -> rouge_scorer.RougeScorer:
  # Imported when first used, without what NLTK would load for nothing (rlhfjax/imports.py).
  with imports.without(*imports.NLTK_UNUSED):
    from rouge_score import rouge_scorer  # pylint: disable=import-outside-toplevel,redefined-outer-name
  return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l(predictions: Sequence[str], references: Sequence[str]) -> np.ndarray:
  """Per-example ROUGE-L F1 (with stemming, as in the summarisation literature)."""
  scorer = _scorer()
  return np.array([scorer.score(r, p)["rougeL"].fmeasure for p, r in zip(predictions, references)])


def baseline_summaries(examples: Sequence[pipeline.Example]) -> dict[str, list[str]]:
  """The reference and, for posts, the extractive baselines (title, lead-1, lead-2) of each
  example (instructions and TRL records have none)."""
  out = {"reference": [e.reference for e in examples]}
  if any(isinstance(e, (pipeline.Instruction, pipeline.Prompted)) for e in examples):
    return out
  rows = [world.extractive_baselines(e) for e in examples]
  for name in rows[0]:
    out[name] = [r[name] for r in rows]
  return out


def summary_table(examples: Sequence[pipeline.Example],
                  summaries: Mapping[str, Sequence[str]]) -> list[dict[str, float | str]]:
  """One row per summariser: gold mean and standard error (where the examples have gold), ROUGE-L,
  mean words; best gold (else best ROUGE-L) first."""
  refs = [e.reference for e in examples]
  with_gold = pipeline.has_gold(examples)
  rows = []
  for name, texts in summaries.items():
    row: dict[str, float | str] = {"name": name}
    if with_gold:
      g = gold.gold_rewards(examples, texts)
      row.update(gold=float(g.mean()), gold_se=float(g.std(ddof=1) / np.sqrt(len(g))))
    row.update(rougeL=float(rouge_l(texts, refs).mean()),
               words=float(np.mean([len(t.split()) for t in texts])))
    rows.append(row)
  return sorted(rows, key=lambda r: -r["gold" if with_gold else "rougeL"])


def format_table(rows: Sequence[Mapping[str, float | str]]) -> str:
  """A Markdown table of `summary_table` rows (with a gold column when they have gold)."""
  with_gold = all("gold" in r for r in rows)
  gold_head, gold_rule = ("gold reward | ", "---|") if with_gold else ("", "")
  lines = [f"| summariser | {gold_head}ROUGE-L | words |", f"|---|{gold_rule}---|---|"]
  for r in rows:
    g = f"{r['gold']:.3f} ± {r['gold_se']:.3f} | " if with_gold else ""
    lines.append(f"| {r['name']} | {g}{r['rougeL']:.3f} | {r['words']:.1f} |")
  return "\n".join(lines)
