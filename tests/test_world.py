"""The simulated world is deterministic, and its gold reward ranks summaries sensibly."""

import re

import numpy as np
import pytest

from rlhfjax.simulated import gold
from rlhfjax.simulated import world

EXAMPLES = world.generate(seed=7, start=0, count=300, reference_noise=0.0)  # Ideal references.


def _gold(texts):
  return gold.gold_rewards(EXAMPLES, texts)


REFERENCE = _gold([e.reference for e in EXAMPLES])
HUMAN = world.generate(seed=7, start=0, count=300)  # References as people write them.


def test_determinism_and_slices():
  assert world.generate(7, 0, 20, reference_noise=0.0) == EXAMPLES[:20]
  assert world.generate(7, 3, 5) == HUMAN[3:8]
  assert world.generate(7, 5, 3) == world.generate(7, 0, 8)[5:8]
  assert [e.post for e in world.generate(8, 0, 20)] != [e.post for e in EXAMPLES[:20]]


def test_splits_are_disjoint_ranges():
  splits = world.make_splits(3, {"sft": 10, "pref": 5, "test": 4})
  assert [len(v) for v in splits.values()] == [10, 5, 4]
  ids = [e.id for v in splits.values() for e in v]
  assert len(set(ids)) == 19
  assert splits["pref"] == world.generate(3, 10, 5)
  # Made once per process; each call gets lists of its own.
  splits["sft"].clear()
  again = world.make_splits(3, {"sft": 10, "pref": 5, "test": 4})
  assert len(again["sft"]) == 10 and again["sft"] == world.generate(3, 0, 10)
  assert world.make_splits(3, {"sft": 2, "pref": 5})["pref"] == world.generate(3, 2, 5)


def test_lengths_and_vocabulary():
  post_words = [len(e.post.split()) for e in EXAMPLES]
  ref_words = [len(e.reference.split()) for e in EXAMPLES]
  assert 25 <= min(post_words) and max(post_words) <= 90
  assert 12 <= min(ref_words) and max(ref_words) <= 35
  vocab = world.vocabulary()
  assert len(vocab) < 1500
  for e in EXAMPLES:
    words = set(re.findall(r"[a-z0-9']+", f"{e.title} {e.post} {e.reference}".lower()))
    assert words <= vocab, words - vocab


def test_reference_is_near_perfect():
  assert REFERENCE.mean() >= 0.95
  assert _gold([world.ideal_reference(e) for e in HUMAN]).mean() >= 0.95


def test_human_references_vary_in_quality():
  """The same posts; people's references miss details, add some or pick a side complaint, so they
  score lower and vary."""
  assert [e.post for e in HUMAN] == [e.post for e in EXAMPLES]
  human = _gold([e.reference for e in HUMAN])
  assert 0.6 < human.mean() < 0.8 and 0.03 < np.mean(human >= 0.999) < 0.2
  lead2 = _gold([world.extractive_baselines(e)["lead2"] for e in EXAMPLES])
  assert human.mean() - lead2.mean() >= 0.3
  omitted = sum(e.situation.feeling not in e.reference for e in HUMAN) / len(HUMAN)
  assert abs(omitted - world.HUMAN_NOISE["feeling"]) < 0.08


@pytest.mark.parametrize("corrupt", [
    lambda e, r: world.shuffle_facts(e, r),
    lambda e, r: world.wrong_relation(e, r),
    lambda e, r: world.repeat_text(e),
])
def test_gold_ranks_reference_above_corruptions(corrupt):
  rng = np.random.default_rng(0)
  corrupted = _gold([corrupt(e, rng) for e in EXAMPLES])
  assert np.mean(REFERENCE > corrupted) >= 0.95


def test_gold_ranks_reference_above_extractive_baselines():
  for name in ("title", "lead1", "lead2"):
    baseline = _gold([world.extractive_baselines(e)[name] for e in EXAMPLES])
    assert baseline.mean() <= 0.5 and REFERENCE.mean() - baseline.mean() >= 0.4, name


def test_partial_credit():
  partial = _gold([" ".join(world.sentences(e.reference)[:-1]) for e in EXAMPLES])
  lead2 = _gold([world.extractive_baselines(e)["lead2"] for e in EXAMPLES])
  assert lead2.mean() < partial.mean() < REFERENCE.mean()


def test_length_and_stuffing_do_not_pay():
  e = EXAMPLES[0]
  ref = gold.gold_reward(e.situation, e.reference)
  assert gold.gold_reward(e.situation, e.reference + " " + e.post) < ref
  assert gold.gold_reward(e.situation, e.reference + " " + e.reference) < ref
  other = [k for k in world.EVENTS if k not in e.situation.events][0]
  stuffed = e.reference + " " + world.EVENTS[other][1] + "."
  assert gold.gold_reward(e.situation, stuffed) < ref
  distractor = e.situation.distractors[0][1]
  assert gold.gold_reward(e.situation, e.reference + f" I like {distractor}.") < ref


def test_components_hand_worked():
  s = world.Situation(24, "F", "boyfriend", 26, "M", "2 years", ("forgot_birthday",), "hurt",
                      "end", (("pet", "milo"),))
  # Relation 1, ages 0.5 + 0.5, duration 0.5, the main (only) event 2.0 and the question 0.75; the
  # feeling (0.5 of 5.75) is missing.
  c = gold.gold_components(s, "My (24F) boyfriend (26M) of 2 years forgot my birthday. Should I break up?")
  assert c["coverage"] == pytest.approx(5.25 / 5.75)
  assert c["accuracy"] == 0 and c["fluency"] == 0 and c["conciseness"] == 0
  assert c["wrong_facts"] == 0 and c["irrelevant_details"] == 0
  # Swapped ages: both age facts wrong (two wrong facts), a wrong relation word, a distractor.
  c = gold.gold_components(s, "My (26M) boyfriend (24F) and my sister forgot my birthday. Milo")
  assert c["accuracy"] == pytest.approx(-(3 * gold.WRONG_FACT + gold.DISTRACTOR))
  assert c["wrong_facts"] == 3 and c["irrelevant_details"] == 1
  assert c["fluency"] == pytest.approx(-gold.NO_END)
  assert gold.wrong_facts(s, "My (26M) boyfriend (24F) and my sister forgot my birthday. Milo") == [
      "poster's age: swapped", "other party's age: swapped", "relation"]
  # The poster's age another number (27), the other party's the right number with the wrong gender
  # (26F), a feeling and a number (5) that the situation does not have.
  assert gold.wrong_facts(s, "I (27F) feel sad: my boyfriend (26F) forgot my birthday 5 times.") == [
      "poster's age: another number", "other party's age: gender", "feeling", "number"]


def test_the_main_problem_and_the_question_asked():
  """Cheating outranks the dishes (`world.SEVERITY`): a summary of the side complaint alone misses
  the main problem (2.0 of 5.75) and mentioning it beside the main one earns nothing; a generic
  question is not the one the post asks (0.75)."""
  s = world.Situation(30, "M", "wife", 29, "F", "4 years", ("dishes", "cheated"), "betrayed",
                      "end", (("city", "boston"),))
  assert s.main_event == "cheated"
  facts = "My (30M) wife (29F) of 4 years {}. I feel betrayed. {}"
  full = gold.gold_components(s, facts.format("cheated on me", "Should I ask for a divorce?"))
  assert full["coverage"] == 1.0 and full["total"] == 1.0
  side = gold.gold_components(s, facts.format("leaves dirty dishes everywhere",
                                              "Should I ask for a divorce?"))
  assert side["coverage"] == pytest.approx(3.75 / 5.75) and side["wrong_facts"] == 0
  both = gold.gold_components(
      s, facts.format("cheated on me and leaves dirty dishes everywhere", "Should I ask for a divorce?"))
  assert both["coverage"] == 1.0 and both["total"] == 1.0  # 24 words: within the budget.
  filler = gold.gold_components(s, "Long story short. " + facts.format(
      "cheated on me and leaves dirty dishes everywhere", "Should I ask for a divorce?"))
  assert filler["total"] == 1.0  # 27 words: filler costs nothing within the 30-word budget...
  longer = gold.gold_components(s, "Long story short. " + facts.format(
      "cheated on me and leaves dirty dishes everywhere", "Should I ask for a divorce? What should I do?"))
  assert longer["conciseness"] == pytest.approx(-gold.PER_EXTRA_WORD)  # ...and 31 words cost one.
  generic = gold.gold_components(s, facts.format("cheated on me", "What should I do?"))
  assert generic["coverage"] == pytest.approx(5.0 / 5.75)
