"""Win-rates with error bars, the way AlpacaFarm reports them, and a paired test between methods.

A method's outputs and the reference outputs on the same prompts go to an annotator (the evaluation
pool by default), which sees them in a random order; a win counts 1, and an output identical to its
reference 1/2, as AlpacaEval counts it (`feedback.annotators.wins_against`; the annotator's own ties
are coin flips). Reported: the mean, its standard error, a
percentile-bootstrap 95% interval, and for two methods judged on the same prompts a paired
sign-flip permutation test of the difference.
"""

from __future__ import annotations

import numpy as np


def summarize(wins: np.ndarray, rng: np.random.Generator, n_boot: int = 1000) -> dict[str, float]:
  """Win-rate (%), standard error (%), and the bootstrap 95% interval (%)."""
  wins = np.asarray(wins, np.float64)
  n = len(wins)
  boot = wins[rng.integers(n, size=(n_boot, n))].mean(-1)
  lo, hi = np.percentile(boot, [2.5, 97.5])
  return {"win_rate": 100 * float(wins.mean()), "se": 100 * float(wins.std(ddof=1) / np.sqrt(n)),
          "ci_low": 100 * float(lo), "ci_high": 100 * float(hi), "n": float(n)}


def paired_p_value(wins_a: np.ndarray, wins_b: np.ndarray, rng: np.random.Generator,
                   n_perm: int = 2000) -> float:
  """Two-sided p-value that methods a and b, judged on the same prompts, have equal win-rates
  (sign-flip permutation test on the per-prompt differences)."""
  d = np.asarray(wins_a, np.float64) - np.asarray(wins_b, np.float64)
  if not np.any(d):
    return 1.0
  signs = rng.choice([-1.0, 1.0], size=(n_perm, len(d)))
  null = np.abs((signs * d).mean(-1))
  return float((1 + np.sum(null >= abs(d.mean()) - 1e-12)) / (n_perm + 1))
