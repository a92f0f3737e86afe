"""Best-of-N's analytic KL and selection, win-rates with intervals, the paired test, the
length-controlled win-rates, the leaderboard formats."""

import math
import warnings

import numpy as np
import pytest

from rlhfjax.algorithms import best_of_n
from rlhfjax.evaluation import leaderboard
from rlhfjax.evaluation import length_control
from rlhfjax.evaluation import winrate
from rlhfjax.feedback import annotators


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
  wins = annotators.wins_against(_Fixed([0, 1, 0]), [None] * 3, ["x"] * 3, ["r"] * 3, None)
  np.testing.assert_array_equal(wins, [1.0, 0.0, 1.0])
  # The same text as the reference is a draw (AlpacaEval), whatever the annotator's coin said.
  wins = annotators.wins_against(_Fixed([0, 1, 1]), [None] * 3, ["r", "r", "x"], ["r"] * 3, None)
  np.testing.assert_array_equal(wins, [0.5, 0.5, 0.0])


def test_paired_test():
  rng = np.random.default_rng(0)
  a = np.array([1.0] * 70 + [0.0] * 30)
  b = np.array([1.0] * 45 + [0.0] * 55)
  assert winrate.paired_p_value(a, b, rng) < 0.01
  assert winrate.paired_p_value(a, a, rng) == 1.0
  c = a.copy()
  c[:3] = 0.0  # 3 of 100 prompts differ: no evidence of a difference.
  assert winrate.paired_p_value(a, c, rng) > 0.2


def _logistic(x):
  return 1 / (1 + np.exp(-x))


def test_lc_win_rate_recovers_a_known_glm():
  rng = np.random.default_rng(0)
  n = 5000
  ref = rng.integers(10, 40, n)
  lengths = ref + rng.integers(-12, 20, n)  # Mostly longer than the reference: raw > LC.
  d = lengths - ref
  z = np.tanh(d / np.std(d, ddof=1))
  wins = (rng.random(n) < _logistic(0.5 + 1.5 * z)).astype(np.float64)
  theta, phi = length_control.fit(z, wins)
  assert theta == pytest.approx(0.5, abs=0.12) and phi == pytest.approx(1.5, abs=0.2)
  lc = length_control.lc_win_rate(wins, lengths, ref)
  assert lc == pytest.approx(100 * _logistic(0.5), abs=2.5)  # 62.2
  assert 100 * wins.mean() - lc > 3  # The raw win-rate (65.6) is inflated by length.


def test_lc_win_rate_removes_a_pure_length_preference():
  # Longer always wins, equal lengths tie, shorter always loses; 80% longer, 10% equal, 10% shorter.
  rng = np.random.default_rng(1)
  ref = np.full(1000, 20)
  lengths = ref + np.concatenate([rng.integers(1, 10, 800), np.zeros(100, int),
                                  -rng.integers(1, 10, 100)])
  wins = np.sign(lengths - ref) / 2 + 0.5
  assert 100 * wins.mean() == pytest.approx(85.0)
  assert length_control.lc_win_rate(wins, lengths, ref) == pytest.approx(50.0, abs=2.0)


def test_length_control_is_the_raw_win_rate_without_length_variation():
  wins = np.array([1.0, 0.0, 0.5, 1.0, 1.0, 0.0, 1.0])
  ref = np.array([3, 10, 7, 12, 5, 9, 20])
  for lengths in (ref, ref + 4):  # Equal lengths, or the same difference everywhere (s = 0).
    assert length_control.lc_win_rate(wins, lengths, ref) == 100 * wins.mean()
  assert length_control.stiennon_lc(wins, ref, ref) == 100 * wins.mean()
  assert length_control.stiennon_lc(wins, 2 * ref, ref) == 100 * wins.mean()  # Same ratio.


def test_length_control_of_all_wins_or_losses_is_finite():
  rng = np.random.default_rng(2)
  ref = rng.integers(5, 30, 100)
  lengths = ref + rng.integers(-5, 10, 100)
  with warnings.catch_warnings(), np.errstate(divide="raise", over="raise", invalid="raise"):
    warnings.simplefilter("error")
    for statistic in (length_control.lc_win_rate, length_control.stiennon_lc):
      assert 99.0 < statistic(np.ones(100), lengths, ref) < 100.0
      assert 0.0 < statistic(np.zeros(100), lengths, ref) < 1.0
      s = length_control.bootstrap(statistic, np.ones(100), lengths, ref, rng, n_boot=50)
      assert all(np.isfinite(v) for v in s.values())


def test_stiennon_lc_at_log_ratio_zero():
  # Half the summaries twice the reference's length (90% preferred), half half as long (50%). Two
  # points on the regression line, log ratio ±log 2: at 0 the logit is their mean, logit 0.9 / 2.
  ref = np.full(400, 10)
  lengths = np.repeat([20, 5], 200)
  wins = np.concatenate([np.repeat([1.0, 0.0], [180, 20]), np.repeat([1.0, 0.0], [100, 100])])
  assert 100 * wins.mean() == pytest.approx(70.0)
  assert length_control.stiennon_lc(wins, lengths, ref) == pytest.approx(75.0, abs=0.05)
  # AlpacaEval's feature on the same data: d = +10 or -5, s = 7.5 sqrt(400/399) (ddof 1); the line
  # through (tanh(10/s), logit 0.9) and (tanh(-5/s), 0) meets tanh = 0 at t2 logit 0.9 / (t2 + t1).
  s = 7.5 * np.sqrt(400 / 399)
  t1, t2 = np.tanh(10 / s), np.tanh(5 / s)
  expected = 100 * _logistic(t2 * np.log(9) / (t1 + t2))
  assert length_control.lc_win_rate(wins, lengths, ref) == pytest.approx(expected, abs=0.05)
  # A zero-word answer counts as one word.
  assert length_control.stiennon_lc(wins, np.where(lengths == 5, 0, lengths), ref) == pytest.approx(
      length_control.stiennon_lc(wins, np.where(lengths == 5, 1, lengths), ref))


def test_length_control_bootstrap_is_deterministic():
  rng = np.random.default_rng(3)
  ref = rng.integers(5, 30, 200)
  lengths = ref + rng.integers(-8, 12, 200)
  wins = (rng.random(200) < _logistic(0.3 + np.tanh((lengths - ref) / 8))).astype(np.float64)
  for statistic in (length_control.lc_win_rate, length_control.stiennon_lc):
    a = length_control.bootstrap(statistic, wins, lengths, ref, np.random.default_rng(7))
    assert a == length_control.bootstrap(statistic, wins, lengths, ref, np.random.default_rng(7))
    assert a != length_control.bootstrap(statistic, wins, lengths, ref, np.random.default_rng(8))
    assert a["value"] == statistic(wins, lengths, ref)
    assert a["ci_low"] < a["value"] < a["ci_high"]
    # About the raw win-rate's standard error (3.5 points), a little more for the fitted slope.
    assert 2.5 < a["se"] < 6.0


def test_leaderboard_length_control_counts_words():
  # Same number of words as the baseline everywhere, though not the same characters: LC is raw.
  wins = np.array([1.0, 0.0, 1.0, 1.0])
  texts = ["a much longer answer", "x y", "one", "p q r"]
  base = ["w x y z", "ab cd", "two", "s t u"]
  lc = leaderboard.length_controlled(wins, texts, base, np.random.default_rng(0))
  assert lc["lc_win_rate"] == lc["stiennon_lc"] == 75.0 and lc["lc_se"] > 0


def test_leaderboard_formats():
  rows = [{"method": "PPO", "win_rate": 61.0, "se": 3.0, "ci_low": 55.0, "ci_high": 67.0,
           "lc_win_rate": 55.5, "lc_se": 3.4, "stiennon_lc": 54.0, "stiennon_lc_se": 3.3,
           "p_vs_sft": 0.01, "gold": 0.9, "length_words": 21.0, "kl": 3.2, "key": "ppo"},
          {"method": "SFT", "win_rate": 50.0, "se": 3.1, "ci_low": 44.0, "ci_high": 56.0,
           "lc_win_rate": 51.0, "lc_se": 3.2, "stiennon_lc": 50.5, "stiennon_lc_se": 3.1,
           "p_vs_sft": float("nan"), "gold": 0.85, "length_words": 19.0, "kl": 0.0, "key": "sft"}]
  md = leaderboard.format_markdown(rows).splitlines()
  assert md[0].startswith("| method | win-rate vs reference (%) | LC win-rate (%) | "
                          "Stiennon LC preference (%) | 95% interval (raw) | p vs SFT | gold")
  assert md[1].count("---") == len(md[0].split("|")) - 2
  assert md[2] == ("| PPO | 61.0 ± 3.0 | 55.5 ± 3.4 | 54.0 ± 3.3 | 55.0–67.0 | 0.010 | 0.900 | "
                   "21.0 | 3.20 |")
  csv = leaderboard.format_csv(rows).splitlines()
  assert csv[0] == ",".join(leaderboard.COLUMNS)
  assert "lc_win_rate,lc_se,stiennon_lc,stiennon_lc_se" in csv[0]
  assert csv[1].startswith("PPO,61.0,3.0,55.0,67.0,55.5,3.4,54.0,3.3,0.01")
