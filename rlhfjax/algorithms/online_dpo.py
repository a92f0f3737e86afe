"""Online DPO (task=online_dpo; Guo et al. 2024, "Direct language model alignment from online AI
feedback"), as TRL's OnlineDPOTrainer.

Each iteration the current policy answers `rollout_batch / 2` prompts twice (rows 2g and 2g + 1).
A judge picks the better answer of each pair on the fly:

- `judge='rm'` (default): the reward model's scores at eos after the truncation rule, in the
  jitted step; the first answer wins ties (TRL's `>=`).
- any annotator name (`train_pool`, `eval_pool`, `single`, `gold`, `file:...`): that annotator
  labels the decoded pair on the host before the step (AlpacaFarm's simulated pools, 25% flips in
  `train_pool`).

The pair then takes one AdamW step of the DPO loss (`algorithms/dpo.dpo_loss`: sigmoid or IPO, β)
against the frozen SFT reference, like offline DPO but always on fresh samples of the current
policy. Logged under TRL's names: objective/scores, objective/scores_margin, objective/kl, the
implicit rewards (rewards/chosen, rejected, margins, accuracies), logps/chosen and logps/rejected.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlhfjax.algorithms import dpo
from rlhfjax.algorithms import online
from rlhfjax.data import pipeline
from rlhfjax.errors import ConfigError
from rlhfjax.feedback import annotators
from rlhfjax.models import lora
from rlhfjax.models import policy
from rlhfjax.models import sampling
from rlhfjax.models.config import ModelConfig
from rlhfjax.rollout import engine
from rlhfjax.training import experiment
from rlhfjax.training import program as program_lib
from rlhfjax.training.state import TrainState

PREFERENCE = "preference"  # Batch key: per pair, 0 when the first answer wins, 1 the second.


def pairs(x: jax.Array, second_wins: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(chosen, rejected) rows of `x` [2P, ...] whose pairs are rows 2g, 2g + 1, given per pair
  whether the second row wins [P]."""
  a, b = x[0::2], x[1::2]
  w = second_wins.reshape((-1,) + (1,) * (a.ndim - 1))
  return jnp.where(w, b, a), jnp.where(w, a, b)


def train_step(state: TrainState, ref_params: Any, reward_params: Any, batch: pipeline.Batch,
               rng: jax.Array, *, cfg: ModelConfig, c: Any, tx: optax.GradientTransformation,
               eos_id: sampling.EosIds) -> tuple[TrainState, dict[str, jax.Array]]:
  """Judge each pair (RM in the step, or `batch['preference']` from an annotator), then one AdamW
  step of the DPO loss on all pairs."""
  del rng  # One full-batch step: nothing to shuffle.
  group = online.group(c, 2)
  scores, raw = engine.rewards_at_eos(reward_params, batch, cfg, eos_id,
                                      c.no_eos_score if c.penalize_no_eos else None, group)
  if PREFERENCE in batch:
    second_wins = batch[PREFERENCE] == 1
  else:
    second_wins = scores[1::2] > scores[0::2]
  ref = policy.response_logprobs(lora.reference(state.params["policy"], ref_params), batch, cfg,
                                temperature=c.temperature, group=group)
  m = batch["response_mask"].astype(jnp.float32)

  def loss_fn(params):
    logp, entropy = policy.response_token_stats(params["policy"], batch, cfg,
                                                temperature=c.temperature, group=group)
    seq, ref_seq = logp.sum(-1), ref.sum(-1)
    lc, lr = pairs(seq, second_wins)
    rc, rr = pairs(ref_seq, second_wins)
    loss, stats = dpo.dpo_loss(lc, lr, rc, rr, c.beta, c.loss_type, c.label_smoothing)
    kl = jax.lax.stop_gradient(seq - ref_seq)
    return loss, {**stats, "logps/chosen": lc.mean(), "logps/rejected": lr.mean(), "kl": kl,
                  "entropy": jax.lax.stop_gradient(entropy.sum(-1))}

  (loss, aux), grads = lora.value_and_grad(loss_fn, has_aux=True)(state.params)
  state = state.apply_gradients(grads, tx)
  kl, entropy = aux.pop("kl"), aux.pop("entropy")
  sc, sr = pairs(scores, second_wins)
  stats = {"loss/dpo": loss, "policy/grad_norm": optax.tree.norm(grads), **aux,
           "objective/kl": kl.mean(), "objective/entropy": entropy.mean(),
           "objective/scores": scores.mean(), "objective/raw_scores": raw.mean(),
           "objective/scores_margin": (sc - sr).mean(),
           "objective/non_score_reward": (-c.beta * kl).mean(),
           "objective/rlhf_reward": (scores - c.beta * kl).mean(), "beta": jnp.float32(c.beta),
           "val/contain_eos_token": sampling.is_eos(batch["response"], eos_id).any(-1).astype(jnp.float32)
           .mean(), "response/length": m.sum(-1).mean()}
  return state, stats


def pool_annotate(exp: experiment.Experiment) -> online.Annotate | None:
  """With `online_dpo.judge` naming an annotator, a host-side labeller for each sampled pair."""
  c = exp.config.online_dpo
  if c.judge == "rm":
    return None
  judge = annotators.build(c.judge, exp.config.annotators)

  def annotate(texts: list[str], rows: list, step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([exp.config.seed, 13, step])
    labels = judge.annotate(rows[0::2], texts[0::2], texts[1::2], rng)
    return {PREFERENCE: (np.asarray(labels) == 1).astype(np.int32)}

  return annotate


def check_config(c: Any) -> None:
  """Clear errors for online DPO settings that cannot work."""
  if c.loss_type not in dpo.REFERENCE_LOSSES:
    raise ConfigError(f"online_dpo.loss_type must be one of {dpo.REFERENCE_LOSSES}, got "
                      f"{c.loss_type!r}")
  if c.truncated_is:
    raise ConfigError("online_dpo.truncated_is: online DPO's loss has no per-token policy-gradient "
                      "term to weight; set it False")
  if c.old_policy != "recompute":
    raise ConfigError("online_dpo.old_policy: online DPO's loss has no importance ratio to anchor; "
                      "leave it 'recompute'")
  online.check_sampling("online_dpo", c, 2)


def program(exp: experiment.Experiment) -> program_lib.Program:
  """Online DPO's update step as `run` trains it (`online.program`): one update per iteration, on
  pairs the annotator ordered (`PREFERENCE`, one label per pair)."""
  pairs = exp.config.online_dpo.rollout_batch // 2
  label = jax.ShapeDtypeStruct((pairs,), jnp.int32, sharding=exp.parallel.batch)
  return online.program(exp, "online_dpo", train_step, 1, {PREFERENCE: label})


def run(config, workdir: str) -> TrainState:
  check_config(config.online_dpo)
  return online.run_policy(config, workdir, "online_dpo", program, 2, pool_annotate)
