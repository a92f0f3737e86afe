"""REINFORCE leave-one-out (task=rloo; Ahmadian et al. 2024, "Back to basics"), as TRL's RLOOTrainer.

k responses per prompt from the current policy (`rloo.k`). Each response is one action with the
sequence reward

  R_i = score_i − β Σ_t (log π(y_t) − log π_ref(y_t))

(the RM score at eos after the truncation rule, less the KL penalty summed over its tokens: TRL's
default sequence-level KL in the reward). Its baseline is the mean reward of the prompt's other
k − 1 responses, so no value network is needed:

  A_i = R_i − (1 / (k − 1)) Σ_{j ≠ i} R_j.

The update is TRL's: `rloo.epochs` passes over shuffled minibatches of the clipped surrogate on the
sequence-level ratio ρ_i = exp(Σ_t log π_θ(y_t) − log π_old(y_t)),
loss = mean_i max(−A_i ρ_i, −A_i clip(ρ_i, 1 ± ε)). With one epoch of one minibatch, ρ = 1 and
this is Ahmadian et al.'s plain REINFORCE with the leave-one-out baseline. `normalize_advantages`
whitens A over the batch (TRL's `normalize_advantage`, off by default). `truncated_is` weights each
token's term of the gradient by min(π_old / π_sampler, tis_cap) (see `sequence_clipped_loss`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from rlhfjax.algorithms import online
from rlhfjax.data import pipeline
from rlhfjax.models import policy
from rlhfjax.models import sampling
from rlhfjax.models.config import ModelConfig
from rlhfjax.training import experiment
from rlhfjax.training import program as program_lib
from rlhfjax.training.state import TrainState


def leave_one_out(rewards: jax.Array, k: int) -> jax.Array:
  """R_i minus the mean of the other k − 1 rewards of its prompt; rows g·k … g·k + k − 1 are one
  prompt's samples. [B] -> [B]."""
  r = rewards.reshape(-1, k)
  baseline = (r.sum(-1, keepdims=True) - r) / (k - 1)
  return (r - baseline).reshape(-1)


def sequence_clipped_loss(logp: jax.Array, old_logp: jax.Array, adv: jax.Array, mask: jax.Array,
                          cliprange: float, weights: jax.Array | None = None
                          ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The clipped surrogate on the sequence-level ratio, mean over sequences; TRL's statistics.

  TIS `weights` [B, R] (online.tis_weights) multiply each token's term of the gradient: the ratio
  keeps its value (and clipping), and ∇ρ_i = ρ_i Σ_t w_t ∇log π_θ(y_t), the token-level
  correction GRPO and PPO apply to their per-token losses.
  """
  delta = logp - old_logp
  if weights is not None:
    delta = jax.lax.stop_gradient(delta) + weights * (delta - jax.lax.stop_gradient(delta))
  log_ratio = (delta * mask).sum(-1)
  ratio = jnp.exp(log_ratio)
  pg1, pg2 = -adv * ratio, -adv * jnp.clip(ratio, 1.0 - cliprange, 1.0 + cliprange)
  return jnp.maximum(pg1, pg2).mean(), {
      "policy/approxkl_avg": 0.5 * jnp.square(log_ratio).mean(),
      "policy/clipfrac_avg": (pg2 > pg1).astype(jnp.float32).mean(),
      "val/ratio": ratio.mean()}


def advantages(scores: jax.Array, kl: jax.Array, k: int, kl_coef: float,
               normalize: bool) -> tuple[jax.Array, jax.Array]:
  """(rewards [B], advantages [B]) from scores [B] and per-token KL [B, R] (0 at padding)."""
  rewards = scores - kl_coef * kl.sum(-1)
  adv = leave_one_out(rewards, k)
  if normalize:
    adv = (adv - adv.mean()) * jax.lax.rsqrt(adv.var() + 1e-8)
  return rewards, adv


def train_step(state: TrainState, ref_params: Any, reward_params: Any, batch: pipeline.Batch,
               rng: jax.Array, *, cfg: ModelConfig, c: Any, tx: optax.GradientTransformation,
               eos_id: sampling.EosIds) -> tuple[TrainState, dict[str, jax.Array]]:
  """Experience (log-probs, scores, leave-one-out advantages) and `c.epochs` of minibatch
  updates for one batch of `c.k` samples per prompt."""
  group = online.group(c, c.k)
  e = online.experience(state, ref_params, reward_params, batch, cfg, c, eos_id, group)
  kl = e["old_logprobs"] - e["ref_logprobs"]
  rewards, adv = advantages(e["scores"], kl, c.k, c.kl_coef, c.normalize_advantages)
  data = {**batch, "old_logprobs": online.old_logprobs(e["old_logprobs"], batch, c),
          "advantages": adv}
  weights = online.tis_weights(e["old_logprobs"], batch, c, "rloo")
  if weights is not None:
    data["tis_weights"] = weights

  def loss_fn(params, mb):
    logp, entropy = policy.response_token_stats(params["policy"], mb, cfg,
                                                temperature=c.temperature, group=group)
    mask = mb["response_mask"].astype(jnp.float32)
    loss, stats = sequence_clipped_loss(logp, mb["old_logprobs"], mb["advantages"], mask,
                                        c.cliprange, mb.get("tis_weights"))
    return loss, {**stats, "loss/policy_avg": loss,
                  "policy/entropy_avg": online.masked_mean(entropy, mask)}

  state, update_stats = online.minibatch_updates(state, data, rng, loss_fn, c.epochs,
                                                 c.minibatch_size, tx, group)
  stats = {**online.rollout_stats(e, batch, eos_id),
           "objective/non_score_reward": (-c.kl_coef * kl.sum(-1)).mean(),
           "objective/rlhf_reward": rewards.mean(), "objective/advantage_std": adv.std(),
           **online.sampler_gap(e["old_logprobs"], batch)}
  return state, {**stats, **update_stats}


def program(exp: experiment.Experiment) -> program_lib.Program:
  """RLOO's update step as `run` trains it (`online.program`)."""
  return online.program(exp, "rloo", train_step,
                        online.minibatch_updates_per_step(exp.config.rloo))


def run(config, workdir: str) -> TrainState:
  c = config.rloo
  online.check_sampling("rloo", c, c.k, "the baseline leaves one sample out")
  return online.run_policy(config, workdir, "rloo", program, c.k)
