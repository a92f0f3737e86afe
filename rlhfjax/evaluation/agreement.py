"""How far labelers agree: the quality of an annotator pool (AlpacaFarm) and the pairwise agreement
table between annotators, gold, the reward model and simple heuristics (Stiennon et al., Table 20).

A preference over a pair (a, b) is a number in {0, 0.5, 1}: 0 prefers a, 1 prefers b, 0.5 is a tie.
Two preferences p and q, each the probability of preferring b, agree with probability
`p q + (1 - p)(1 - q)`: 1 or 0 for two decided ones, and a half where either is a tie, as a coin
flip would (two ties as well).
"""

from __future__ import annotations

import re
from typing import Mapping, Sequence

import numpy as np

from rlhfjax.data import pipeline
from rlhfjax.simulated import gold

_WORD = re.compile(r"[a-z0-9']+")


def prefer_higher(score_a: np.ndarray, score_b: np.ndarray) -> np.ndarray:
  """The preference of a labeler that picks the higher score (0.5 on ties)."""
  score_a, score_b = np.asarray(score_a), np.asarray(score_b)
  return np.where(score_b > score_a, 1.0, np.where(score_b < score_a, 0.0, 0.5))


def _lcs(x: Sequence, y: Sequence) -> int:
  row = [0] * (len(y) + 1)
  for xi in x:
    prev_diag = 0
    for j, yj in enumerate(y, start=1):
      prev_diag, row[j] = row[j], prev_diag + 1 if xi == yj else max(row[j], row[j - 1])
  return row[-1]


def copying(summary: str, post: str) -> float:
  """Longest common subsequence of word bigrams with the post, over the summary's bigram count."""
  s, p = _WORD.findall(summary.lower()), _WORD.findall(post.lower())
  sb, pb = list(zip(s, s[1:])), list(zip(p, p[1:]))
  return _lcs(sb, pb) / len(sb) if sb else 0.0


def _agree(p: np.ndarray, q: np.ndarray) -> np.ndarray:
  return p * q + (1.0 - p) * (1.0 - q)


def agreement(p: np.ndarray, q: np.ndarray) -> float:
  """The mean probability that the preferences `p` and `q` agree."""
  return float(np.mean(_agree(np.asarray(p, np.float64), np.asarray(q, np.float64))))


def agreement_matrix(prefs: Mapping[str, np.ndarray], rng: np.random.Generator,
                     n_boot: int = 200) -> tuple[np.ndarray, np.ndarray]:
  """Mean pairwise agreement [K, K] between the labelers in `prefs` and its bootstrap standard
  error (pairs resampled with replacement)."""
  p = np.stack([np.asarray(v, np.float64) for v in prefs.values()])  # [K, N]
  agree = _agree(p[:, None, :], p[None, :, :])  # [K, K, N]
  idx = rng.integers(p.shape[1], size=(n_boot, p.shape[1]))
  boot = np.stack([agree[:, :, i].mean(-1) for i in idx])  # [B, K, K]
  return agree.mean(-1), boot.std(0, ddof=1)


def format_matrix(names: Sequence[str], mean: np.ndarray, se: np.ndarray) -> str:
  """Markdown: agreement in % ± standard error."""
  lines = ["| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
  for i, name in enumerate(names):
    cells = [f"{100 * mean[i, j]:.0f} ± {100 * se[i, j]:.1f}" for j in range(len(names))]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def gold_preference(examples: Sequence[pipeline.Tldr], a: Sequence[str],
                    b: Sequence[str]) -> np.ndarray:
  return prefer_higher(gold.gold_rewards(examples, a), gold.gold_rewards(examples, b))


DECIDING = ("coverage", "wrong fact", "irrelevant detail", "conciseness", "fluency")


def deciding_component(examples: Sequence[pipeline.Tldr], a: Sequence[str],
                       b: Sequence[str]) -> np.ndarray:
  """What decides each pair under gold: the component whose difference between the two summaries
  is largest (`DECIDING`; accuracy is 'wrong fact' when the two differ in wrong facts, else
  'irrelevant detail'), or 'tie' when the gold totals are equal. Splits a judge's agreement with
  gold by the kind of mistake it must see (omissions favour the longer summary; a wrong fact often
  does not)."""
  out = []
  for e, x, y in zip(examples, a, b):
    cx, cy = gold.gold_components(e.situation, x), gold.gold_components(e.situation, y)
    if cx["total"] == cy["total"]:
      out.append("tie")
      continue
    diffs = {k: abs(cx[k] - cy[k]) for k in ("coverage", "accuracy", "conciseness", "fluency")}
    top = max(diffs, key=diffs.get)
    if top == "accuracy":
      top = "wrong fact" if cx["wrong_facts"] != cy["wrong_facts"] else "irrelevant detail"
    out.append(top)
  return np.array(out)


def by_component(prefs: Mapping[str, np.ndarray], gold_pref: np.ndarray,
                 components: np.ndarray) -> dict[str, dict[str, float]]:
  """Each judge's agreement with gold (`accuracy_against`) on the pairs each component decides,
  and the number of those pairs; components no pair has are left out."""
  out = {}
  for name in DECIDING:
    rows = components == name
    if rows.any():
      out[name] = {"pairs": float(rows.sum()),
                   **{k: accuracy_against(np.asarray(p)[rows], gold_pref[rows])
                      for k, p in prefs.items()}}
  return out


def format_by_component(table: Mapping[str, Mapping[str, float]]) -> str:
  """Markdown: per deciding component, its pairs and each judge's agreement with gold in %."""
  judges = [k for k in next(iter(table.values())) if k != "pairs"] if table else []
  lines = ["| deciding component | pairs | " + " | ".join(judges) + " |",
           "|---" * (len(judges) + 2) + "|"]
  for name, row in table.items():
    lines.append(f"| {name} | {int(row['pairs'])} | " +
                 " | ".join(f"{100 * row[j]:.1f}%" for j in judges) + " |")
  return "\n".join(lines)


def length_preference(a: Sequence[str], b: Sequence[str]) -> np.ndarray:
  """Prefers the longer response (in words)."""
  return prefer_higher([len(t.split()) for t in a], [len(t.split()) for t in b])


def accuracy_against(choices: np.ndarray, target: np.ndarray) -> float:
  """Share of `choices` (0/1 or preferences) that match `target` preferences, ties in `target`
  excluded."""
  keep = target != 0.5
  return agreement(np.asarray(choices)[keep], target[keep]) if keep.any() else float("nan")


def annotator_report(annotator, examples: Sequence[pipeline.Tldr], a: Sequence[str],
                     b: Sequence[str], rng: np.random.Generator, draws: int = 4) -> dict[str, float]:
  """AlpacaFarm's view of an annotator on these pairs: agreement with the gold argmax (gold ties
  excluded; only where the examples have gold), variance (how often a held-out annotation disagrees
  with the majority of `draws - 1` others), and how often it prefers the longer response (equal
  lengths excluded)."""
  labels = [annotator.annotate(examples, a, b, rng) for _ in range(draws)]
  majority = (np.mean(labels[1:], axis=0) > 0.5).astype(np.int32)
  longer = length_preference(a, b)
  out = {}
  if pipeline.has_gold(examples):
    out["gold_agreement"] = accuracy_against(labels[0], gold_preference(examples, a, b))
  return {**out, "variance": float(np.mean(labels[0] != majority)),
          "prefers_longer": accuracy_against(labels[0], longer), "pairs": float(len(a))}


def format_reports(reports: Mapping[str, Mapping[str, float]]) -> str:
  """A Markdown table of `annotator_report`s (with the gold column when they have it)."""
  with_gold = all("gold_agreement" in r for r in reports.values())
  gold_head, gold_rule = (" agreement with gold |", "---|") if with_gold else ("", "")
  lines = [f"| annotator |{gold_head} variance | prefers longer | pairs |",
           f"|---|{gold_rule}---|---|---|"]
  for name, r in reports.items():
    g = f" {100 * r['gold_agreement']:.1f}% |" if with_gold else ""
    lines.append(f"| {name} |{g} {100 * r['variance']:.1f}% "
                 f"| {100 * r['prefers_longer']:.1f}% | {int(r['pairs'])} |")
  return "\n".join(lines)
