"""Held-out rollouts: the numbers of one point on an over-optimisation curve (RM score, gold reward,
win-rate against the references, KL to the reference, length), which online trainers log as they
go and best-of-N reports per N. Gold reward and win-rate (judged by the simulated evaluation pool)
exist on the simulated world only (`pipeline.has_gold`); on real data a point has no such keys.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import numpy as np

from rlhfjax.data import pipeline
from rlhfjax.feedback import annotators
from rlhfjax.rollout import engine
from rlhfjax.simulated import gold
from rlhfjax.training import experiment


def judge(exp: experiment.Experiment, examples: Sequence[pipeline.Tldr], texts: Sequence[str],
          rng: np.random.Generator, reward_fn=None) -> dict[str, float]:
  """Gold reward and win-rate against the references (evaluation pool) where the examples have
  gold, length, and the mean RM score (with `reward_fn(examples, texts)`)."""
  out = {}
  if pipeline.has_gold(examples):
    pool = annotators.pools(exp.config.annotators)["eval_pool"]
    wins = annotators.wins_against(pool, examples, texts, [e.reference for e in examples], rng)
    out.update(gold=float(gold.gold_rewards(examples, texts).mean()),
               win_rate=100 * float(wins.mean()))
  out["length_words"] = float(np.mean([len(t.split()) for t in texts]))
  if reward_fn is not None:
    out["rm_score"] = float(np.mean(reward_fn(examples, texts)))
  return out


_SHOWN = (("rm_score", "RM {:.3f}"), ("gold", "gold {:.3f}"), ("win_rate", "win-rate {:.1f}%"),
          ("kl", "KL {:.2f}"))


def describe(point: Mapping[str, float]) -> str:
  """The RM score, gold reward, win-rate and KL of a point (those it has) as one log line."""
  return "  ".join(fmt.format(point[k]) for k, fmt in _SHOWN if k in point)


def curve_point(exp: experiment.Experiment, params: Any, ref_params: Any,
                examples: Sequence[pipeline.Tldr], rng: jax.Array, temperature: float,
                batch_size: int, reward_fn=None) -> dict[str, float]:
  """One point of the over-optimisation picture: KL to the reference and `judge`'s numbers."""
  texts, kl = engine.sample_texts(exp, params, examples, rng, temperature, batch_size, ref_params)
  seed = np.random.default_rng([exp.config.seed, 11])
  return {"kl": float(kl.mean()), **judge(exp, examples, texts, seed, reward_fn)}
