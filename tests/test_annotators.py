"""Annotators: flips at the configured rate, order randomisation cancels position bias, pools are
scored the AlpacaFarm way, and the agreement and probe tables are computed as specified."""

import numpy as np
import pytest

from conftest import load_config
from rlhfjax.data import pipeline
from rlhfjax.data import records
from rlhfjax.evaluation import agreement
from rlhfjax.evaluation import rm_probes
from rlhfjax.feedback import annotators
from rlhfjax.simulated import world

EXAMPLES = world.generate(seed=5, start=0, count=400)
REFS = [e.reference for e in EXAMPLES]
# Pairs with a clear gold winner in both positions: the reference and a corrupted copy.
RNG = np.random.default_rng(0)
CORRUPT = [world.shuffle_facts(e, RNG) for e in EXAMPLES]


def _deterministic_pool(flip_rate):
  members = tuple(annotators.SimulatedAnnotator(f"m{i}", (1.0, 1.0 + i, 1.0, 1.0), 0.01 * i)
                  for i in range(3))
  return annotators.Pool("p", members, flip_rate)


def test_flip_rate_of_training_pool():
  n = 4000
  ta = annotators.gold_table(EXAMPLES, REFS)
  tb = annotators.gold_table(EXAMPLES, CORRUPT)
  ta, tb = np.tile(ta, (n // len(ta), 1)), np.tile(tb, (n // len(tb), 1))
  clean = _deterministic_pool(0.0).annotate_tables(ta, tb, np.random.default_rng(1))
  noisy = _deterministic_pool(0.25).annotate_tables(ta, tb, np.random.default_rng(1))
  assert np.all(clean == 0)  # Temperature 0, a clear winner: every clean label picks the reference.
  rate = np.mean(noisy != clean)
  assert abs(rate - 0.25) < 3 * np.sqrt(0.25 * 0.75 / n), rate


def test_config_pools_flip_only_for_training():
  pools = annotators.pools(load_config().annotators)
  assert pools["train_pool"].flip_rate == 0.25 and pools["eval_pool"].flip_rate == 0.0
  assert pools["eval_pool"].members == pools["train_pool"].members
  assert len(pools["single"].members) == 1 and pools["single"].members[0].temperature == 0


def test_order_randomisation_removes_position_bias():
  biased = annotators.SimulatedAnnotator("b", position_bias=2.0, temperature=0.1)
  same = REFS * 10  # Identical responses: only the position bias decides.
  ex = EXAMPLES * 10
  fixed = annotators.Pool("fixed", (biased,), randomize_order=False)
  shuffled = annotators.Pool("shuffled", (biased,), randomize_order=True)
  p_first = 1 / (1 + np.exp(-2.0))
  n = len(same)
  fixed_a = np.mean(fixed.annotate(ex, same, same, np.random.default_rng(0)) == 0)
  shuffled_a = np.mean(shuffled.annotate(ex, same, same, np.random.default_rng(0)) == 0)
  assert abs(fixed_a - p_first) < 4 * np.sqrt(p_first * (1 - p_first) / n)
  assert abs(shuffled_a - 0.5) < 4 * np.sqrt(0.25 / n)


def test_bradley_terry_choice_probability():
  a = annotators.SimulatedAnnotator("a", temperature=0.5, position_bias=0.3)
  np.testing.assert_allclose(a.prob_first(np.array([1.0]), np.array([0.5])),
                             1 / (1 + np.exp(-(0.5 / 0.5 + 0.3))))
  greedy = annotators.SimulatedAnnotator("g")
  np.testing.assert_array_equal(greedy.prob_first(np.array([1.0, 0.0, 2.0]), np.array([0.0, 1.0, 2.0])),
                                [1.0, 0.0, 0.5])


def test_annotator_report():
  rng = np.random.default_rng(0)
  gold = agreement.annotator_report(annotators.GOLD, EXAMPLES, REFS, CORRUPT, rng)
  assert gold["gold_agreement"] == 1.0 and gold["variance"] == 0.0
  noisy = agreement.annotator_report(_deterministic_pool(0.25), EXAMPLES, REFS, CORRUPT, rng)
  assert 0.65 < noisy["gold_agreement"] < 0.85
  # A held-out draw disagrees with the majority of three others with probability
  # p(1 - q) + (1 - p) q where q = P(majority flipped) = 3 p^2 (1 - p) + p^3 (p = 0.25): 0.328125.
  assert abs(noisy["variance"] - 0.328125) < 4 * np.sqrt(0.328 * 0.672 / len(REFS))
  longer = [r + " " + r for r in REFS]
  report = agreement.annotator_report(
      annotators.Pool("len", (annotators.SimulatedAnnotator("len", (0, 0, 0, 0), 1.0),)),
      EXAMPLES, REFS, longer, rng)
  assert report["prefers_longer"] == 1.0


def test_file_annotator_reads_labels_back(tmp_path):
  choices = np.arange(20) % 2
  comps = [records.Comparison(prompt=e.post, response_a=r, response_b=c, choice=int(ch), id=e.id)
           for e, r, c, ch in zip(EXAMPLES, REFS, CORRUPT, choices)]
  path = str(tmp_path / "c.jsonl")
  records.write(path, comps, "openai")
  ann = annotators.build(f"file:{path}", load_config().annotators)
  ex = EXAMPLES[:20]
  np.testing.assert_array_equal(ann.annotate(ex, REFS[:20], CORRUPT[:20], None), choices)
  np.testing.assert_array_equal(ann.annotate(ex, CORRUPT[:20], REFS[:20], None), 1 - choices)
  with pytest.raises(ValueError, match="no label"):
    ann.annotate(ex[:1], ["x"], ["y"], None)


def test_reward_model_annotator_prefers_higher_score():
  ann = annotators.RewardModelAnnotator("rm", lambda ex, texts: np.array([len(t) for t in texts]))
  out = ann.annotate(EXAMPLES[:3], ["aa", "a", "b"], ["a", "aa", "c"], np.random.default_rng(0))
  assert list(out[:2]) == [0, 1] and out[2] in (0, 1)


def test_copying_hand_worked():
  post = "my cat ate my food and my dog ate my shoes"
  # Summary bigrams: (my cat) (cat ate) (ate my) (my shoes); LCS with the post's bigrams is
  # (my cat) (cat ate) (ate my) (my shoes) = 4 of 4; a reordered summary copies less.
  assert agreement.copying("My cat ate my shoes.", post) == 1.0
  assert agreement.copying("shoes my cat ate", post) == pytest.approx(2 / 3)
  assert agreement.copying("hello", post) == 0.0


def test_a_policy_against_itself_wins_half_with_no_spread():
  """Each pair of identical texts is a draw (AlpacaEval's rule), not the gold annotator's coin
  flip between equal utilities: 50% exactly."""
  wins = annotators.wins_against(annotators.GOLD, EXAMPLES[:50], REFS[:50], REFS[:50],
                                 np.random.default_rng(0))
  np.testing.assert_array_equal(wins, 0.5)


def test_agreement_matrix_hand_worked():
  prefs = {"x": np.array([0, 1, 1, 0.5]), "y": np.array([0, 0, 1, 1])}
  mean, se = agreement.agreement_matrix(prefs, np.random.default_rng(0), n_boot=50)
  # x, y: (1 + 0 + 1 + 0.5) / 4. x with itself: its tie agrees with another tie half the time.
  np.testing.assert_allclose(mean, [[0.875, 0.625], [0.625, 1]])
  assert se[1, 1] == 0 and se[0, 1] > 0
  assert agreement.agreement(np.array([0.5, 0.5, 1.0]), np.array([0.5, 0.0, 1.0])) == 2 / 3


def test_probes_are_clear_to_gold():
  rows = {r["probe"]: r for r in rm_probes.probe_table(
      lambda ex, texts: np.array([len(t) for t in texts], float), EXAMPLES[:100],
      np.random.default_rng(0))}
  assert set(rows) == set(rm_probes.PROBES)
  for name in ("original vs roles reversed", "reference vs lead-2", "reference vs lead-3",
               "reference vs random-3", "summary vs shuffled summary"):
    assert rows[name]["gold"] >= 0.9, (name, rows[name])
  # The length "reward model" prefers the longer one: never the title over the title twice.
  assert rows["title vs title repeated twice"]["rm"] == 0.0


def test_deciding_component_and_split_hand_worked():
  s = world.Situation(24, "F", "boyfriend", 26, "M", "2 years", ("forgot_birthday",), "hurt",
                      "end", (("pet", "milo"),))
  e = pipeline.Tldr("x", "relationships", "t", "p", "r", s)
  full = "My (24F) boyfriend (26M) of 2 years forgot my birthday and I feel hurt. Should I break up?"
  pairs = [
      (full, full.replace(" and I feel hurt", "")),  # An omission: coverage decides.
      (full, full.replace("(26M)", "(27M)")),  # A wrong age: a wrong fact (0.25 + the lost age).
      (full, full + " I have a pet milo."),  # A distractor: an irrelevant detail.
      (full, full.replace("?", "")),  # No final punctuation: fluency.
      (full, full),  # Equal totals: a tie.
  ]
  a, b = [x for x, _ in pairs], [y for _, y in pairs]
  components = agreement.deciding_component([e] * len(pairs), a, b)
  assert components.tolist() == ["coverage", "wrong fact", "irrelevant detail", "fluency", "tie"]
  gold_pref = agreement.gold_preference([e] * len(pairs), a, b)
  assert gold_pref.tolist() == [0.0, 0.0, 0.0, 0.0, 0.5]
  longer = agreement.length_preference(a, b)  # Right on the omission only (and the fluency pair
  table = agreement.by_component({"length": longer}, gold_pref, components)  # is a length tie).
  assert list(table) == ["coverage", "wrong fact", "irrelevant detail", "fluency"]
  assert [table[k]["length"] for k in table] == [1.0, 0.5, 0.0, 0.5]
  assert all(row["pairs"] == 1 for row in table.values())
  md = agreement.format_by_component(table)
  assert md.splitlines()[0] == "| deciding component | pairs | length |"
  assert "| wrong fact | 1 | 50.0% |" in md
