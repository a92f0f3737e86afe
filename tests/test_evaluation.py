"""Best-of-N's analytic KL and selection, win-rates with intervals, the paired test, the leaderboard
formats."""

import math

import numpy as np
import pytest

from rlhfjax.algorithms import best_of_n
from rlhfjax.evaluation import leaderboard
from rlhfjax.evaluation import winrate


def test_best_of_n_analytic_kl():
  assert best_of_n.analytic_kl(1) == 0.0
  assert best_of_n.analytic_kl(2) == pytest.approx(math.log(2) - 0.5)
  assert best_of_n.analytic_kl(16) == pytest.approx(2.7726 - 0.9375, abs=1e-4)
  # It matches the exact KL of best-of-n over a fine uniform grid of equally likely outcomes.
  m, n = 2000, 4
  cdf = np.arange(1, m + 1) / m
  p_best = cdf ** n - (cdf - 1 / m) ** n  # P(max of n draws is outcome i).
  exact = float(np.sum(p_best * np.log(p_best * m)))
  assert exact == pytest.approx(best_of_n.analytic_kl(n), abs=2e-3)


def test_best_of_picks_the_highest_of_the_first_n():
  cands = [["a0", "a1", "a2", "a3"], ["b0", "b1", "b2", "b3"]]
  scores = np.array([[0.1, 0.5, 0.2, 0.9], [0.7, 0.3, 0.7, 0.1]])
  assert best_of_n.best_of(cands, scores, 1) == ["a0", "b0"]
  assert best_of_n.best_of(cands, scores, 2) == ["a1", "b0"]
  assert best_of_n.best_of(cands, scores, 4) == ["a3", "b0"]  # Ties go to the first.
  assert best_of_n.powers_of_two(16) == [1, 2, 4, 8, 16]


def test_win_rate_summary_and_interval():
  wins = np.array([1.0] * 60 + [0.0] * 40)
  s = winrate.summarize(wins, np.random.default_rng(0), n_boot=2000)
  assert s["win_rate"] == pytest.approx(60.0)
  assert s["se"] == pytest.approx(100 * np.std(wins, ddof=1) / 10)
  assert s["ci_low"] < 60 < s["ci_high"]
  assert s["ci_high"] - s["ci_low"] == pytest.approx(2 * 1.96 * s["se"], rel=0.15)


class _Fixed:
  """An annotator with given choices (0: the first response wins)."""

  def __init__(self, choices):
    self.choices = np.asarray(choices)

  def annotate(self, examples, a, b, rng):
    return self.choices


def test_wins_against_counts_the_first_response():
  wins = winrate.wins_against(_Fixed([0, 1, 0]), [None] * 3, ["x"] * 3, ["r"] * 3, None)
  np.testing.assert_array_equal(wins, [1.0, 0.0, 1.0])


def test_paired_test():
  rng = np.random.default_rng(0)
  a = np.array([1.0] * 70 + [0.0] * 30)
  b = np.array([1.0] * 45 + [0.0] * 55)
  assert winrate.paired_p_value(a, b, rng) < 0.01
  assert winrate.paired_p_value(a, a, rng) == 1.0
  c = a.copy()
  c[:3] = 0.0  # 3 of 100 prompts differ: no evidence of a difference.
  assert winrate.paired_p_value(a, c, rng) > 0.2


def test_leaderboard_formats():
  rows = [{"method": "PPO", "win_rate": 61.0, "se": 3.0, "ci_low": 55.0, "ci_high": 67.0,
           "p_vs_sft": 0.01, "gold": 0.9, "length_words": 21.0, "kl": 3.2, "key": "ppo"},
          {"method": "SFT", "win_rate": 50.0, "se": 3.1, "ci_low": 44.0, "ci_high": 56.0,
           "p_vs_sft": float("nan"), "gold": 0.85, "length_words": 19.0, "kl": 0.0, "key": "sft"}]
  md = leaderboard.format_markdown(rows)
  assert "| PPO | 61.0 ± 3.0 | 55.0–67.0 | 0.010 | 0.900 | 21.0 | 3.20 |" in md
  csv = leaderboard.format_csv(rows).splitlines()
  assert csv[0] == ",".join(leaderboard.COLUMNS) and csv[1].startswith("PPO,61.0,3.0,55.0,67.0,0.01")
