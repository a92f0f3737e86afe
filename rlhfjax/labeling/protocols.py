"""What a labeler is asked about a pair, or one response: the protocols of the papers this project
follows.

- `stiennon` (Stiennon et al., 2020): which summary is better on a 9-point scale (1: the left one is
  definitely better, 9: the right one is, 5: no preference), then each summary rated 1-7 on overall
  quality, accuracy, coverage and coherence.
- `alpacafarm` (Dubois et al., 2023): the better response, or a tie.
- `turing_advice` (Zellers et al., 2021; the questions of `evaluation.turing_advice`): which advice
  is more helpful (a forced choice), slightly or definitely, then how helpful the worse one is
  (slightly helpful, not helpful, dangerous) and the follow-up that answer asks for (the writing or
  the meaning; possibly or never helpful). Its answers are those of `turing_advice.Judgement`.
- `binary` (KTO's binary feedback, Ethayarajh et al., 2024): one response, no pair; thumbs up (a
  desirable response) or thumbs down. Stored as preference 1 (up) or 0 (down), exported in the
  binary layout (`data/records.py`) that task=kto reads.

Answers arrive as the page shows the pair (left, right) and are stored in the pair's own order
(A, B) with `canonical`, which undoes the per-assignment swap: a preference becomes 0 (A), 0.5 (a
tie) or 1 (B), the 9-point rating r of a swapped pair becomes 10 - r, and per-response answers move
to the response they were given for. A one-response protocol has no sides, so nothing is undone.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from rlhfjax.evaluation import turing_advice

LEFT, RIGHT = "left", "right"


@dataclasses.dataclass(frozen=True)
class Question:
  """One question: `options` are (value, label) in the order shown; key i+1 picks option i."""

  name: str
  text: str
  options: tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class Protocol:
  """The questions about the pair (the first decides the preference), those asked about each
  response, and how the preference question's value maps to left (0), tie (0.5) and right (1);
  with `single`, one response is shown and the first question's value maps to 1 (desirable) or 0."""

  name: str
  title: str
  instructions: str
  pair: tuple[Question, ...]
  per_response: tuple[Question, ...]
  preference: Mapping[str, float]  # Value of the first pair question -> preference for the right.
  rating: bool = False  # The first question is a 9-point scale, kept as `extra.confidence`.
  check: Callable[[Mapping[str, str]], str] = lambda answers: ""  # A rule across answers, or "".
  single: bool = False  # One response judged alone (binary feedback), not a pair.

  def questions(self) -> list[tuple[str, Question]]:
    """Every question as shown, with its form field name: pair questions by name, per-response
    ones as `left.NAME` and `right.NAME`."""
    out = [(q.name, q) for q in self.pair]
    for side in (LEFT, RIGHT):
      out += [(f"{side}.{q.name}", q) for q in self.per_response]
    return out


_LIKERT = tuple((str(v), str(v)) for v in range(1, 8))
NINE = tuple((str(v), label) for v, label in zip(range(1, 10), (
    "left definitely better", "left better", "left somewhat better", "left slightly better",
    "no preference", "right slightly better", "right somewhat better", "right better",
    "right definitely better")))

PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (
    Protocol(
        name="stiennon", title="Which summary is better?",
        instructions="Read the post, then both summaries. Say which summary is better on the "
                     "9-point scale, then rate each summary from 1 (poor) to 7 (excellent).",
        pair=(Question("preference", "Which summary is better?", NINE),),
        per_response=(
            Question("overall", "Overall quality", _LIKERT),
            Question("accuracy", "Accuracy: states only what the post says", _LIKERT),
            Question("coverage", "Coverage: includes what matters in the post", _LIKERT),
            Question("coherence", "Coherence: easy to read on its own", _LIKERT)),
        preference={str(v): (0.0 if v < 5 else 0.5 if v == 5 else 1.0) for v in range(1, 10)},
        rating=True),
    Protocol(
        name="alpacafarm", title="Which response is better?",
        instructions="Read the instruction and both responses. Pick the better response, or a "
                     "tie when neither is better.",
        pair=(Question("preference", "Which response is better?",
                       ((LEFT, "left is better"), (RIGHT, "right is better"), ("tie", "tie"))),),
        per_response=(), preference={LEFT: 0.0, RIGHT: 1.0, "tie": 0.5}),
    Protocol(
        name="turing_advice", title="Which advice is more helpful?",
        instructions="Read the situation and both pieces of advice. Pick the advice that would "
                     "help the writer more and say by how much, then say how helpful the other "
                     "one is and why.",
        pair=(Question("preference", "Which advice is more helpful?",
                       ((LEFT, "left advice"), (RIGHT, "right advice"))),
              Question("strength", "How much more helpful?",
                       (("slightly", "slightly"), ("definitely", "definitely"))),
              Question("helpfulness", "How helpful is the other advice?",
                       (("slightly_helpful", "slightly helpful"), ("not_helpful", "not helpful"),
                        ("dangerous", "dangerous"))),
              Question("follow_up", "If slightly helpful: is its problem the writing (a rewrite "
                       "with the same meaning would help as much) or the meaning? Otherwise: "
                       "could it help in some other situation, or never?",
                       (("writing", "the writing"), ("meaning", "the meaning"),
                        ("possibly_helpful", "helpful elsewhere"),
                        ("never_helpful", "never helpful")))),
        per_response=(), preference={LEFT: 0.0, RIGHT: 1.0},
        check=lambda a: "" if a["follow_up"] in turing_advice.FOLLOW_UPS[a["helpfulness"]] else
        f"follow_up: after {a['helpfulness']!r} answer one of "
        f"{', '.join(turing_advice.FOLLOW_UPS[a['helpfulness']])}"),
    Protocol(
        name="binary", title="Is this response good?",
        instructions="Read the prompt and the response. Thumbs up when it is a good response to "
                     "the prompt, thumbs down when it is not.",
        pair=(Question("label", "Is this a good response?",
                       (("up", "thumbs up: good"), ("down", "thumbs down: not good"))),),
        per_response=(), preference={"up": 1.0, "down": 0.0}, single=True),
)}


def get(name: str) -> Protocol:
  if name not in PROTOCOLS:
    raise ValueError(f"unknown protocol {name!r} (available: {', '.join(PROTOCOLS)})")
  return PROTOCOLS[name]


class InvalidAnswer(ValueError):
  """A submitted form that does not answer the protocol's questions with its options."""


@dataclasses.dataclass(frozen=True)
class Label:
  """Answers in the pair's own order: `preference` 0 (A), 0.5 (tie) or 1 (B); Likert ratings per
  response; the other answers (`confidence`: the 9-point rating in A/B order)."""

  preference: float
  axes_a: dict[str, int] | None
  axes_b: dict[str, int] | None
  extra: dict[str, Any]


def canonical(protocol: Protocol, answers: Mapping[str, str], swapped: bool) -> Label:
  """Checks `answers` (form field -> option value, as shown) and returns them in A/B order; A was
  shown on the right when `swapped` (ignored by a one-response protocol)."""
  for field, q in protocol.questions():
    value = answers.get(field)
    if value not in dict(q.options):
      raise InvalidAnswer(f"{field}: expected one of {', '.join(dict(q.options))}, got {value!r}")
  unknown = set(answers) - {f for f, _ in protocol.questions()}
  if unknown:
    raise InvalidAnswer(f"unknown fields: {', '.join(sorted(unknown))}")
  problem = protocol.check(answers)
  if problem:
    raise InvalidAnswer(problem)
  swapped = swapped and not protocol.single
  first = protocol.pair[0].name
  right = protocol.preference[answers[first]]
  preference = 1.0 - right if swapped else right
  extra: dict[str, Any] = {q.name: answers[q.name] for q in protocol.pair[1:]}
  if protocol.rating:
    rating = int(answers[first])
    extra["confidence"] = 10 - rating if swapped else rating
  axes = {side: {q.name: int(answers[f"{side}.{q.name}"]) for q in protocol.per_response}
          for side in (LEFT, RIGHT)}
  a, b = (axes[RIGHT], axes[LEFT]) if swapped else (axes[LEFT], axes[RIGHT])
  return Label(preference, a or None, b or None, extra)
