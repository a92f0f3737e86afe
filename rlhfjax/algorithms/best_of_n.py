"""Best-of-N (task=best_of_n): draw N responses from the SFT policy, answer with the one the reward
model scores highest.

No training; the policy it defines is at KL `log N − (N − 1)/N` from SFT (the analytic value for
best-of-N sampling, Stiennon et al. / Hilton & Gao). The same N samples give the whole curve for
N = 1, 2, 4, ... (best among the first n), so the over-optimisation picture costs one sampling pass:
`<workdir>/best_of_n/curve.json` holds RM score, gold reward, win-rate and KL for each n (gold
reward and win-rate on the simulated world only), and `outputs.json` the best-of-N answers for
task=eval.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import numpy as np

from rlhfjax import rng_streams
from rlhfjax.data import pipeline
from rlhfjax.errors import ConfigError
from rlhfjax.rollout import engine
from rlhfjax.rollout import heldout
from rlhfjax.rollout import outputs
from rlhfjax.rollout import rewards
from rlhfjax.training import experiment
from rlhfjax.training import loaders
from rlhfjax.training import metrics as metrics_lib


def analytic_kl(n: int) -> float:
  """KL(best-of-n ‖ base) = log n − (n − 1)/n nats (for a continuous reward, no ties)."""
  return math.log(n) - (n - 1) / n


def candidates(exp: experiment.Experiment, params: Any, examples: Sequence[pipeline.Tldr], n: int,
               temperature: float, rng: jax.Array, batch_size: int) -> list[list[str]]:
  """`n` independent samples per example: [len(examples)][n]."""
  repeated = [e for e in examples for _ in range(n)]
  texts, _ = engine.sample_texts(exp, params, repeated, rng, temperature, batch_size)
  return [texts[i * n:(i + 1) * n] for i in range(len(examples))]


def score_candidates(reward_fn, examples: Sequence[pipeline.Tldr],
                     cands: Sequence[Sequence[str]]) -> np.ndarray:
  """Reward of every candidate: [len(examples), n]."""
  n = len(cands[0])
  flat = reward_fn([e for e in examples for _ in range(n)], [t for c in cands for t in c])
  return np.asarray(flat).reshape(len(examples), n)


def best_of(cands: Sequence[Sequence[str]], scores: np.ndarray, n: int) -> list[str]:
  """The highest-scoring of the first `n` candidates of each example (the first on ties)."""
  pick = np.argmax(scores[:, :n], axis=1)
  return [c[i] for c, i in zip(cands, pick)]


def powers_of_two(n: int) -> list[int]:
  return [2 ** i for i in range(int(math.log2(n)) + 1)]


def check_temperature(task: str, temperature: float) -> None:
  """Best of n needs n different samples: greedy decoding (temperature 0) gives n copies of one."""
  if not temperature > 0:
    raise ConfigError(f"{task}.temperature must be > 0, got {temperature!r}: at 0 (greedy) the n "
                      f"samples are one answer n times (the config file ties {task}.temperature "
                      "to eval.temperature; set it on its own)")


def run(config, workdir: str) -> dict[str, Any]:
  c = config.best_of_n
  if c.n < 1 or c.n & (c.n - 1):
    raise ConfigError(f"best_of_n.n must be a power of two >= 1, got {c.n}")
  check_temperature("best_of_n", c.temperature)
  exp = experiment.prepare(config, workdir)
  sft_params = loaders.load_policy(exp)
  reward_fn = rewards.training_reward(exp)
  examples = outputs.test_examples(exp)
  cands = candidates(exp, sft_params, examples, c.n, c.temperature,
                     jax.random.key(config.seed + rng_streams.BEST_OF_N), c.batch_size)
  scores = score_candidates(reward_fn, examples, cands)
  rng = np.random.default_rng([config.seed, 11])
  curve = []
  for n in powers_of_two(c.n):
    texts = best_of(cands, scores, n)
    point = {"n": n, "kl": analytic_kl(n), "rm_score": float(scores[:, :n].max(1).mean()),
             **heldout.judge(exp, examples, texts, rng)}
    curve.append(point)
    metrics_lib.info(f"best-of-{n}: {heldout.describe(point)}")
  experiment.write_json(f"{exp.task_dir('best_of_n')}/curve.json", curve)
  outputs.save(exp, "best_of_n", examples, best_of(cands, scores, c.n), analytic_kl(c.n), n=c.n,
               temperature=c.temperature)
  return {"curve": curve}
