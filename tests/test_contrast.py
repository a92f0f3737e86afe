"""Label-free contrastive pairs: which words are facts, the two edits by hand, and the pairs."""

import types

import numpy as np

from rlhfjax.data import pipeline
from rlhfjax.feedback import contrast

POST = "I (25F) have dated my boyfriend (27M) for 3 years. He forgot my birthday. I feel hurt."
REF = "My boyfriend (27M) of 3 years forgot my birthday and I (25F) feel hurt."
# Word frequencies across posts, by hand: "my", "i", "of" and "feel" are everywhere.
DF = {"my": 1.0, "i": 1.0, "of": 0.4, "feel": 0.3, "boyfriend": 0.08, "(27m)": 0.03,
      "(25f)": 0.03, "3": 0.07, "years": 0.4, "forgot": 0.1, "birthday": 0.1, "and": 0.5,
      "hurt": 0.12, "(31m)": 0.03, "5": 0.07, "angry": 0.12}


def test_shape():
  assert contrast.shape("(25F)") == "(dA)" and contrast.shape("(31m).") == "(da)"
  assert contrast.shape("Max") == "Aa" and contrast.shape("years.") == "a"
  assert contrast.shape("11") == "d"


def test_fact_positions_are_rare_words_copied_from_the_post():
  words = REF.split()
  facts = [words[i] for i in contrast.fact_positions(words, POST, DF, 0.2)]
  # "my", "years" and "feel" are copied but common; "of" and "and" are not in the post.
  assert facts == ["boyfriend", "(27M)", "3", "forgot", "birthday", "(25F)", "hurt."]


def test_swap_exchanges_two_facts_of_one_shape():
  words = REF.split()
  facts = contrast.fact_positions(words, POST, DF, 0.2)
  out = contrast.swap(words, facts, np.random.default_rng(0))
  # The only two facts of one non-lower-case shape are the two ages: whose age is whose.
  assert " ".join(out) == "My boyfriend (25F) of 3 years forgot my birthday and I (27M) feel hurt."
  # Lower-case words never swap, and one age alone has no partner.
  assert contrast.swap(["my", "boyfriend", "forgot", "(27M)"], [1, 2, 3],
                       np.random.default_rng(0)) is None


def test_substitute_takes_the_aligned_word_of_another_reference():
  words = REF.split()
  facts = contrast.fact_positions(words, POST, DF, 0.2)
  other = "My boyfriend (31M) of 5 years forgot my birthday and I (25F) feel angry.".split()
  seen = {" ".join(contrast.substitute(words, facts, other, DF, 0.2, np.random.default_rng(s)))
          for s in range(20)}
  # Aligned differences: (27M)->(31M), 3->5, hurt.->angry. (punctuation kept); (25F) is equal.
  assert seen == {"My boyfriend (31M) of 3 years forgot my birthday and I (25F) feel hurt.",
                  "My boyfriend (27M) of 5 years forgot my birthday and I (25F) feel hurt.",
                  "My boyfriend (27M) of 3 years forgot my birthday and I (25F) feel angry."}
  # A replacement must be rare and of the same shape: nothing to take from a different template.
  assert contrast.substitute(words, facts, "I feel so bad about this whole thing".split(), DF,
                             0.2, np.random.default_rng(0)) is None


def _example(i, post, reference):
  return types.SimpleNamespace(id=f"e{i}", subreddit="relationships", title="help", post=post,
                               reference=reference)


def test_comparisons_choose_the_reference_and_are_seeded():
  examples = [_example(0, POST, REF),
              _example(1, "I (30M) and my boss (52F) worked together 5 years. She yells. I feel angry.",
                       "My boss (52F) of 5 years yells at me and I (30M) feel angry."),
              _example(2, "Nothing rare here at all.", "All fine.")]
  # Three posts: a word in one of them has frequency 1/3, a word in two 2/3.
  pairs = contrast.comparisons(examples, seed=0, max_df=0.5)
  assert [p.id for p in pairs] == ["e0", "e1"]  # e2 has no fact to edit.
  for p, e in zip(pairs, examples):
    assert p.choice == 0 and p.response_a == e.reference and p.prompt == e.post
    assert p.response_b != p.response_a and len(p.response_b.split()) == len(p.response_a.split())
    assert 1 <= sum(a != b for a, b in zip(p.response_a.split(), p.response_b.split())) <= 2
    assert pipeline.posts_of([p])[0].post == e.post
  assert [p.response_b for p in contrast.comparisons(examples, seed=0, max_df=0.5)] == \
      [p.response_b for p in pairs]
