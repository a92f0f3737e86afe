"""A verifiable task shipped offline: one-step arithmetic word problems with exact answers.

Each problem is a sentence about a person and some objects that adds or takes away a number
("Maya has 7 shells and finds 5 more. How many shells does Maya have now?"), both numbers below
`MAX_OPERAND`, written from templates, so the answer is known exactly. It mimics, at the size a
2-core CPU trains in minutes, the verifiable tasks GRPO and DAPO are run on: GSM8K's word problems
(Cobbe et al. 2021: find the numbers and the operation, then compute) and TinyZero's Countdown
(a rule checks the final number).

The SFT set is worked solutions ("7 + 5 = 12. The answer is 12.") of which a fraction `slip` carry
one slip, as demonstrations from people or a weaker model do: a result one or two off, or the
other operation, the solution consistent with its wrong answer. Supervised learning imitates the
slips at their rate, so SFT's pass@1 (sampled) stays near 1 - slip whatever its steps; a reward that
checks the answer (`correct`) is what moves probability onto the right one, which RL does.

`splits(seed, sizes, slip)` gives the pipeline's splits as TRL-style prompt records
(`pipeline.Prompted`): the question then "\\nAnswer:" as the prompt, the worked solution as the
reference, the exact answer in the `answer` column, which reward functions receive. The test
split's questions are held out from the others.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import numpy as np

from rlhfjax.data import pipeline

MAX_OPERAND = 10  # Operands 0-9: sums up to 18.
NAMES = ("Maya", "Tom", "Ana", "Leo", "Sara", "Omar", "Iris", "Ben", "Nora", "Ravi", "Lena",
         "Kai", "Zoe", "Sam", "Mia", "Eli")
OBJECTS = ("apples", "shells", "coins", "books", "stamps", "marbles", "pens", "cards", "eggs",
           "stones", "cups", "keys")
# (template, operation): gaining adds, losing takes away.
TEMPLATES = (
    ("{name} has {a} {obj} and finds {b} more.", "+"),
    ("{name} has {a} {obj} and buys {b} more.", "+"),
    ("{name} has {a} {obj} and is given {b} more.", "+"),
    ("{name} has {a} {obj} and gives {b} away.", "-"),
    ("{name} has {a} {obj} and loses {b} of them.", "-"),
    ("{name} has {a} {obj} and sells {b} of them.", "-"),
)
ANSWER_CUE = "\nAnswer:"
QUESTION = " How many {obj} does {name} have now?" + ANSWER_CUE
# What a chat model is asked beside the question, so that its answer reads as the rule expects.
INSTRUCTION = "Show the calculation, then end with: The answer is <number>."
_ANSWER = re.compile(r"answer is (-?\d+)")


def solution(a: int, op: str, b: int, result: int) -> str:
  """A worked solution reaching `result` (the right one or a slip)."""
  return f" {a} {op} {b} = {result}. The answer is {result}."


def problem(rng: np.random.Generator) -> tuple[str, int, tuple[int, str, int]]:
  """(question, exact answer, (a, op, b)) of one random problem."""
  template, op = TEMPLATES[rng.integers(len(TEMPLATES))]
  a, b = (int(x) for x in rng.integers(MAX_OPERAND, size=2))
  if op == "-" and b > a:
    a, b = b, a  # Nobody gives away more than they have.
  name, obj = NAMES[rng.integers(len(NAMES))], OBJECTS[rng.integers(len(OBJECTS))]
  text = template.format(name=name, a=a, b=b, obj=obj) + QUESTION.format(name=name, obj=obj)
  return text, a + b if op == "+" else a - b, (a, op, b)


def slipped(rng: np.random.Generator, a: int, op: str, b: int, answer: int) -> tuple[str, int]:
  """A slip: the other operation, or a result one or two off (never negative, never right)."""
  if rng.random() < 0.3 and b:
    other = "-" if op == "+" else "+"
    wrong = a - b if op == "+" else a + b
    if wrong >= 0 and wrong != answer:
      return other, wrong
  wrong = answer + int(rng.choice([-2, -1, 1, 2]))
  return op, wrong if wrong >= 0 else answer + 1


def splits(seed: int, sizes: Mapping[str, int], slip: float, chat: bool = False
           ) -> dict[str, list[pipeline.Example]]:
  """The pipeline's splits (`sft`, `pref`, `unlabeled`, `validation`, `test`) from `seed`. The
  SFT split's references slip at rate `slip`; every other reference is the right solution. `chat`:
  conversational records, the question and `INSTRUCTION` one user turn (for an instruct model's
  chat template), the solution the assistant's."""
  if not 0.0 <= slip < 1.0:
    raise ValueError(f"data.slip must be in [0, 1), got {slip}")
  rng = np.random.default_rng([seed, 41])
  test_n = int(sizes["test"])
  seen, test = set(), []
  while len(test) < test_n:  # Held-out questions first: the others avoid them.
    text, answer, parts = problem(rng)
    if text not in seen:
      seen.add(text)
      test.append((text, answer, parts))
  out: dict[str, list[pipeline.Example]] = {"test": [
      _example(f"test-{i}", t, ans, solution(parts[0], parts[1], parts[2], ans), chat)
      for i, (t, ans, parts) in enumerate(test)]}
  for split in ("sft", "unlabeled", "validation"):
    examples = []
    while len(examples) < int(sizes[split]):
      text, answer, (a, op, b) = problem(rng)
      if text in seen:
        continue
      shown_op, result = (op, answer)
      if split == "sft" and rng.random() < slip:
        shown_op, result = slipped(rng, a, op, b, answer)
      examples.append(_example(f"{split}-{len(examples)}", text, answer,
                               solution(a, shown_op, b, result), chat))
    out[split] = examples
  out["pref"] = out["sft"]
  return out


def _example(id_: str, text: str, answer: int, reference: str, chat: bool) -> pipeline.Prompted:
  if chat:
    question = text.removesuffix(ANSWER_CUE) + " " + INSTRUCTION
    return pipeline.Prompted(id=id_, prompt=question, messages=(("user", question),),
                             reference=reference.strip(), extra={"answer": str(answer)})
  return pipeline.Prompted(id=id_, prompt=text, messages=None, reference=reference,
                           extra={"answer": str(answer)})


def final_answer(completion: str) -> int | None:
  """The number after the last "answer is" of a completion, or None."""
  found = _ANSWER.findall(completion)
  return int(found[-1]) if found else None


def correct(prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Sequence[Any],
            answer: Sequence[str], **columns: Any) -> list[float]:
  """The rule-based reward: 1.0 when the completion's final answer equals the exact answer, else
  0.0 (a missing answer included)."""
  del prompts, completion_ids, columns
  return [float(final_answer(_text(c)) == int(a)) for c, a in zip(completions, answer)]


def formatted(prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Sequence[Any],
              **columns: Any) -> list[float]:
  """The optional format reward: 1.0 for "<a> <op> <b> = <c>. The answer is <c>." with the same
  c twice, else 0.0."""
  del prompts, completion_ids, columns
  pattern = re.compile(r"^\s*(\d+) ([+-]) (\d+) = (-?\d+)\. The answer is (-?\d+)\.\s*$")
  out = []
  for c in completions:
    m = pattern.match(_text(c))
    out.append(float(bool(m) and m.group(4) == m.group(5)))
  return out


def _text(completion: Any) -> str:
  """A completion's text: the string, or a conversational completion's assistant content."""
  return completion[-1]["content"] if isinstance(completion, list) else str(completion)
