"""Pairwise annotators behind one interface: `annotate(examples, a, b, rng) -> choices`.

`choices[i]` is 0 when `a[i]` is preferred and 1 when `b[i]` is. Annotators:

- `SimulatedAnnotator`: one simulated person for the simulated world. Its utility for a summary is a
  weighted sum of the gold components (coverage, accuracy, conciseness, fluency) plus a length bias per
  word; it prefers the first-shown summary with probability
  `sigmoid((u_first - u_second) / temperature + position_bias)` (Bradley–Terry), or, at temperature
  0, the higher utility (ties by the position bias).
- `Pool`: AlpacaFarm's annotator pool. Each comparison goes to a member drawn at random, shown in a
  random order (which cancels position biases on average), and its label is flipped with probability
  `flip_rate` (0.25 for training labels, 0 for evaluation).
- `RewardModelAnnotator`: a trained reward model prefers the higher score.
- `FileAnnotator`: labels read from a comparisons file (people, or any earlier run).

`build(name, ...)` makes the named ones: `train_pool`, `eval_pool`, `single` (one low-variance
annotator at temperature 0, the analogue of AlpacaFarm's greedy GPT-4 judge), `gold` (the argmax of
the gold reward), `rm` (the workdir's reward model) and `file:PATH`.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np

from rlhfjax.data import pipeline
from rlhfjax.data import records
from rlhfjax.errors import ConfigError
from rlhfjax.simulated import gold

COMPONENTS = ("coverage", "accuracy", "conciseness", "fluency")


class Annotator(Protocol):
  name: str

  def annotate(self, examples: Sequence[pipeline.Tldr], a: Sequence[str], b: Sequence[str],
               rng: np.random.Generator) -> np.ndarray:
    """0 where `a` is preferred, 1 where `b` is (int32, one per example)."""


def _check(examples, a, b) -> None:
  if not len(examples) == len(a) == len(b):
    raise ValueError(f"{len(examples)} examples, {len(a)} and {len(b)} responses")


def gold_table(examples: Sequence[pipeline.Tldr], texts: Sequence[str]) -> np.ndarray:
  """[N, 5]: the gold components (in COMPONENTS order) and the word count of each summary."""
  rows = []
  for e, t in zip(examples, texts):
    c = gold.gold_components(e.situation, t)
    rows.append([c[k] for k in COMPONENTS] + [len(t.split())])
  return np.array(rows, np.float64).reshape(-1, len(COMPONENTS) + 1)


@dataclasses.dataclass(frozen=True)
class SimulatedAnnotator:
  """One simulated person: gold weights, a length bias (utility per word), a position bias (logit
  for the first-shown summary) and a Bradley–Terry temperature (0 = always the higher utility)."""

  name: str
  weights: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0)
  length_bias: float = 0.0
  position_bias: float = 0.0
  temperature: float = 0.0

  def utility(self, table: np.ndarray) -> np.ndarray:
    """Utilities of the summaries whose `gold_table` rows are `table`."""
    return table[:, :4] @ np.asarray(self.weights) + self.length_bias * table[:, 4]

  def prob_first(self, u_first: np.ndarray, u_second: np.ndarray) -> np.ndarray:
    """Probability of preferring the first-shown summary."""
    diff = u_first - u_second
    tie = 1.0 / (1.0 + np.exp(-self.position_bias))
    if self.temperature == 0:
      return np.where(diff > 0, 1.0, np.where(diff < 0, 0.0, tie))
    return 1.0 / (1.0 + np.exp(-(diff / self.temperature + self.position_bias)))


@dataclasses.dataclass(frozen=True)
class Pool:
  """Simulated annotators; each comparison goes to one member, in a random presentation order."""

  name: str
  members: tuple[SimulatedAnnotator, ...]
  flip_rate: float = 0.0
  randomize_order: bool = True

  def annotate(self, examples, a, b, rng: np.random.Generator) -> np.ndarray:
    _check(examples, a, b)
    ua, ub = gold_table(examples, a), gold_table(examples, b)
    return self.annotate_tables(ua, ub, rng)

  def annotate_tables(self, ta: np.ndarray, tb: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """`annotate` on precomputed `gold_table`s (for repeated draws over the same pairs)."""
    n = len(ta)
    who = rng.integers(len(self.members), size=n)
    swap = rng.random(n) < 0.5 if self.randomize_order else np.zeros(n, bool)
    p_first = np.empty(n)
    for m, member in enumerate(self.members):
      rows = who == m
      first = np.where(swap[rows, None], tb[rows], ta[rows])
      second = np.where(swap[rows, None], ta[rows], tb[rows])
      p_first[rows] = member.prob_first(member.utility(first), member.utility(second))
    chose_second_shown = rng.random(n) >= p_first
    choice = chose_second_shown ^ swap  # Back from presentation order to (a, b) order.
    flip = rng.random(n) < self.flip_rate
    return (choice ^ flip).astype(np.int32)


def simulated_pool(name: str, size: int, seed: int, flip_rate: float,
                   spec: Mapping[str, tuple[float, float]]) -> Pool:
  """A pool of `size` members with traits drawn uniformly from the `(low, high)` ranges in `spec`:
  `weight_<component>`, `length_bias`, `position_bias`, `temperature`."""
  rng = np.random.default_rng([seed, 17])

  def draw(key: str) -> float:
    lo, hi = spec[key]
    return float(rng.uniform(lo, hi))

  members = []
  for i in range(size):
    weights = tuple(draw(f"weight_{c}") for c in COMPONENTS)
    members.append(SimulatedAnnotator(f"{name}/{i}", weights, draw("length_bias"),
                                      draw("position_bias"), draw("temperature")))
  return Pool(name, tuple(members), flip_rate)


def single_annotator(pool: Pool) -> Pool:
  """The pool's average member at temperature 0, no position bias: low variance, same taste."""
  weights = tuple(float(np.mean([m.weights[i] for m in pool.members])) for i in range(4))
  length = float(np.mean([m.length_bias for m in pool.members]))
  return Pool("single", (SimulatedAnnotator("single", weights, length),), 0.0)


GOLD = Pool("gold", (SimulatedAnnotator("gold"),), 0.0)  # Argmax of the gold total; ties 50/50.


@dataclasses.dataclass(frozen=True)
class RewardModelAnnotator:
  """Prefers the response a reward model scores higher (`score(examples, texts) -> [N]`)."""

  name: str
  score: Callable[[Sequence[pipeline.Tldr], Sequence[str]], np.ndarray]

  def annotate(self, examples, a, b, rng: np.random.Generator) -> np.ndarray:
    _check(examples, a, b)
    sa, sb = self.score(examples, a), self.score(examples, b)
    tie = rng.random(len(a)) < 0.5
    return np.where(sa == sb, tie, sb > sa).astype(np.int32)


class FileAnnotator:
  """Labels read from a comparisons file, looked up by (example id or post, response, response).
  A pair labelled several times (k people) takes the majority; a tie in the file, or an even
  split, is a coin flip."""

  def __init__(self, path: str, layout: str = "openai"):
    self.name = f"file:{path}"
    self.path = path
    votes: dict[tuple[str, str, str], list[float]] = collections.defaultdict(list)
    for c in records.read_strict(path, layout):
      key, label = c.id or c.prompt, 0.5 if c.tie else c.choice
      votes[(key, c.response_a, c.response_b)].append(label)
      votes[(key, c.response_b, c.response_a)].append(1 - label)
    self._labels = {k: float(np.sign(np.mean(v) - 0.5) / 2 + 0.5) for k, v in votes.items()}

  def annotate(self, examples, a, b, rng: np.random.Generator) -> np.ndarray:
    _check(examples, a, b)
    out = []
    for e, x, y in zip(examples, a, b):
      label = self._labels.get((e.id, x, y), self._labels.get((e.post, x, y)))
      if label is None:
        raise ConfigError(f"{self.path} has no label for example {e.id!r} with these two responses")
      out.append(label if label != 0.5 else rng.random() < 0.5)  # A tie: a coin flip.
    return np.array(out, np.int32)


POOL_NAMES = ("train_pool", "eval_pool", "single", "gold")


def pools(cfg: Mapping) -> dict[str, Pool]:
  """The simulated pools of the `annotators` config block: training (flipped), evaluation, single,
  gold."""
  spec = {k: tuple(v) for k, v in cfg["traits"].items()}
  train = simulated_pool("train_pool", int(cfg["pool_size"]), int(cfg["seed"]),
                         float(cfg["flip_rate"]), spec)
  evaluation = dataclasses.replace(train, name="eval_pool", flip_rate=0.0)
  return {"train_pool": train, "eval_pool": evaluation, "single": single_annotator(train),
          "gold": GOLD}


def build(name: str, cfg: Mapping, reward_model: Callable[[], Annotator] | None = None) -> Annotator:
  """The annotator called `name` (one of POOL_NAMES, `rm`, or `file:PATH`)."""
  if name in POOL_NAMES:
    return pools(cfg)[name]
  if name == "rm":
    if reward_model is None:
      raise ConfigError("annotator 'rm' needs a trained reward model (run task=rm first)")
    return reward_model()
  if name.startswith("file:"):
    return FileAnnotator(name[len("file:"):], str(cfg["file_layout"]))
  raise ConfigError(f"unknown annotator {name!r} (available: {', '.join(POOL_NAMES)}, rm, file:PATH)")


def wins_against(annotator: Annotator, examples: Sequence[pipeline.Tldr], outputs: Sequence[str],
                 references: Sequence[str], rng: np.random.Generator) -> np.ndarray:
  """1.0 where `annotator` prefers the output over the reference, else 0.0 (AlpacaFarm's win), and
  0.5 where the two texts are the same: a draw, as AlpacaEval scores identical outputs, not the
  coin flip an annotator's own tie is (the annotator still sees every pair, so its random draws
  do not depend on which pairs tie)."""
  wins = (np.asarray(annotator.annotate(examples, outputs, references, rng)) == 0).astype(
      np.float64)
  wins[np.array([o == r for o, r in zip(outputs, references)], bool)] = 0.5
  return wins
