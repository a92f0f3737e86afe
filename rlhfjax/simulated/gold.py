"""The gold reward: how good a summary of a simulated post truly is, given its latent situation.

  total = coverage - accuracy_penalty - conciseness_penalty - fluency_penalty

- coverage (0..1): weighted share of the key facts mentioned — the relation (1.0), the poster's and
  the other party's age+gender (0.5 each, the other's being the token right after the relation word),
  the duration (0.5, when there is one), the main problem (2.0: the post's most severe event,
  `Situation.main_event`; a side complaint earns nothing but costs its words), the feeling (0.5) and
  the question the post asks (0.75; a generic "What should I do?" is not it).
  Matching is on lowercased words with inflections, so word order and paraphrase are tolerated.
- accuracy: WRONG_FACT for each wrong fact (a relation, event or feeling not in the situation, an age
  or number not in it, a swapped age) and DISTRACTOR for each irrelevant detail (job, pet, city, hobby).
- conciseness: PER_EXTRA_WORD for each word beyond WORD_BUDGET.
- fluency: REPEAT per repeated word trigram (at most MAX_REPEAT), OOV times the share of words the
  world never writes, NO_END when the summary does not end with . ! or ?.

The ideal reference (`world.ideal_reference`) scores 1.0, people's references about 0.7. Length,
repetition and keyword stuffing never raise the total once the facts are covered, so a learned
reward model that likes them can be over-optimised against this one.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from rlhfjax.data import pipeline
from rlhfjax.errors import ConfigError
from rlhfjax.simulated import world

WEIGHTS = {"relation": 1.0, "poster": 0.5, "other": 0.5, "duration": 0.5, "main_event": 2.0,
           "feeling": 0.5, "question": 0.75}
WRONG_FACT = 0.25
DISTRACTOR = 0.2
WORD_BUDGET = 30
PER_EXTRA_WORD = 0.02
REPEAT = 0.1
MAX_REPEAT = 1.0
OOV = 1.0
NO_END = 0.1

_WORD = re.compile(r"[a-z0-9']+")
_AGE = re.compile(r"^(\d+)([mf])$")
_RELATION_WORDS = {r.split()[-1]: r for r in world.RELATIONS}  # "best friend" is found by "friend".


def _has_any(words: set[str], options: Sequence[str]) -> bool:
  return any(o in words for o in options)


def _event_mentioned(words: set[str], event: str) -> bool:
  return all(_has_any(words, group) for group in world.EVENTS[event][3])


def _ages(s: world.Situation, tokens: Sequence[str]) -> tuple[bool, bool, list[str]]:
  """Whether the poster's and the other party's age+gender are given right, and each wrong one,
  named by whose and how: the other person's number ("swapped"), the right number with the wrong
  gender, or another number. The age token right after the relation word is the other party's,
  the rest the poster's."""
  rel_word = s.relation.split()[-1]
  other_at = {i + 1 for i, t in enumerate(tokens[:-1]) if t == rel_word}
  poster_ok = other_ok = False
  wrong = []
  for i, t in enumerate(tokens):
    m = _AGE.match(t)
    if not m:
      continue
    whose = "other party" if i in other_at else "poster"
    want = (s.other_age, s.other_gender) if i in other_at else (s.poster_age, s.poster_gender)
    age = int(m.group(1))
    ok = (age, m.group(2).upper()) == want
    if i in other_at:
      other_ok |= ok
    else:
      poster_ok |= ok
    if not ok:
      how = ("gender" if age == want[0] else
             "swapped" if age in (s.poster_age, s.other_age) else "another number")
      wrong.append(f"{whose}'s age: {how}")
  return poster_ok, other_ok, wrong


def _wrong_non_ages(s: world.Situation, words: set[str]) -> list[str]:
  """The wrong facts other than ages: a relation, an event or a feeling not in the situation, a
  number not in it."""
  allowed_numbers = {str(s.poster_age), str(s.other_age)}
  if s.duration:
    allowed_numbers.add(s.duration.split()[0])
  return (["relation" for w, r in _RELATION_WORDS.items() if w in words and r != s.relation]
          + ["event" for e in world.EVENTS if e not in s.events and _event_mentioned(words, e)]
          + ["feeling" for f in world.FEELINGS if f != s.feeling and f in words]
          + ["number" for t in words if t.isdigit() and t not in allowed_numbers])


def wrong_facts(situation: world.Situation, summary: str) -> list[str]:
  """Each fact the summary gets wrong, by kind: what gold's accuracy penalty counts."""
  tokens = _WORD.findall(summary.lower())
  return _ages(situation, tokens)[2] + _wrong_non_ages(situation, set(tokens))


def gold_components(situation: world.Situation | None, summary: str) -> dict[str, float]:
  """Coverage, the three penalties (as negative numbers) and their total; with the accuracy
  penalty's two counts, `wrong_facts` and `irrelevant_details`."""
  if situation is None:
    raise ConfigError("gold reward of an example with no latent situation: the gold reward and the "
                      "simulated annotators exist only for the simulated world (data.source "
                      "'sim_tldr', or 'tfds' with data.tfds_name 'sim_tldr'); on real data label "
                      "with label.annotator=rm or file:PATH")
  s = situation
  tokens = _WORD.findall(summary.lower())
  words = set(tokens)
  rel_word = s.relation.split()[-1]
  poster_ok, other_ok, wrong_ages = _ages(s, tokens)

  facts = {"relation": rel_word in words, "poster": poster_ok, "other": other_ok,
           "feeling": s.feeling in words,
           "question": _has_any(words, world.QUESTIONS[s.question][1])}
  weights = {k: WEIGHTS[k] for k in facts}
  if s.duration:
    n, unit = s.duration.split()
    facts["duration"] = n in words and _has_any(words, (unit, unit.rstrip("s")))
    weights["duration"] = WEIGHTS["duration"]
  facts["main_event"] = _event_mentioned(words, s.main_event)
  weights["main_event"] = WEIGHTS["main_event"]
  coverage = sum(weights[k] for k, v in facts.items() if v) / sum(weights.values())

  wrong = len(wrong_ages) + len(_wrong_non_ages(s, words))
  irrelevant = sum(1 for _, v in s.distractors if v in words)
  accuracy = -(WRONG_FACT * wrong + DISTRACTOR * irrelevant)

  conciseness = -PER_EXTRA_WORD * max(0, len(summary.split()) - WORD_BUDGET)

  trigrams = list(zip(tokens, tokens[1:], tokens[2:]))
  repeats = len(trigrams) - len(set(trigrams))
  vocab = world.vocabulary()
  oov = sum(t not in vocab for t in tokens) / max(len(tokens), 1)
  ends = summary.rstrip().endswith((".", "!", "?"))
  fluency = -(min(REPEAT * repeats, MAX_REPEAT) + OOV * oov + (0.0 if ends else NO_END))

  total = coverage + accuracy + conciseness + fluency
  return {"coverage": coverage, "accuracy": accuracy, "conciseness": conciseness,
          "fluency": fluency, "total": total, "wrong_facts": float(wrong),
          "irrelevant_details": float(irrelevant)}


def gold_reward(situation: world.Situation, summary: str) -> float:
  return gold_components(situation, summary)["total"]


def gold_rewards(examples: Sequence[pipeline.Tldr], summaries: Sequence[str]) -> np.ndarray:
  if len(examples) != len(summaries):
    raise ValueError(f"{len(examples)} examples but {len(summaries)} summaries")
  return np.array([gold_reward(e.situation, t) for e, t in zip(examples, summaries)], np.float32)
