"""REINFORCE++ (task=reinforce_pp; Hu et al. 2025, arXiv 2501.03262), as OpenRLHF's `reinforce` and
`reinforce_baseline` advantage estimators.

PPO without the critic. Each iteration samples `k` responses per prompt (`reinforce_pp.k`). Token t
of a response gets PPO's per-token reward: the KL penalty (k1 estimator, log-probs at the sampling
temperature), plus the score on the last real token,

  r_t = −β (log π_old(y_t) − log π_ref(y_t)) + 1[t = last] · score

(β = `kl_coef`; the score is the RM's at eos after the truncation rule). Its return is the
discounted reward-to-go G_t = Σ_{s ≥ t} γ^{s−t} r_s (γ = `gamma`), and its advantage is G_t whitened
over every real token of the whole rollout batch: the global batch, not each prompt's group,

  A_t = (G_t − mean) / std.

`advantage_estimator='reinforce_pp_baseline'` (OpenRLHF's `reinforce_baseline`, k ≥ 2) first
subtracts from each score the mean score of its prompt's k responses, then goes on as above.

The update is PPO's clipped surrogate on token ratios (`ppo.policy_loss`, `cliprange`), a token mean
over each minibatch, for `epochs` passes over shuffled minibatches; no value network. `truncated_is`
weights each token's surrogate term by min(π_old / π_sampler, tis_cap), as in PPO. Logged under
PPO's names: objective/*, policy/approxkl_avg, policy/clipfrac_avg, policy/entropy_avg,
loss/policy_avg, val/ratio, returns/mean.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from rlhfjax.algorithms import online
from rlhfjax.algorithms import ppo
from rlhfjax.data import pipeline
from rlhfjax.errors import ConfigError
from rlhfjax.models import policy
from rlhfjax.models import sampling
from rlhfjax.models.config import ModelConfig
from rlhfjax.training import experiment
from rlhfjax.training import program as program_lib
from rlhfjax.training.state import TrainState

ESTIMATORS = ("reinforce_pp", "reinforce_pp_baseline")


def group_centred(scores: jax.Array, k: int) -> jax.Array:
  """Each score less the mean score of its prompt's k responses (adjacent rows). [B] -> [B]."""
  r = scores.reshape(-1, k)
  return (r - r.mean(-1, keepdims=True)).reshape(-1)


def advantages(scores: jax.Array, kl: jax.Array, mask: jax.Array, c: Any,
               k: int) -> tuple[jax.Array, jax.Array]:
  """(returns, advantages) [B, R] from scores [B] and per-token KL [B, R]: the reward-to-go of the
  per-token rewards (each prompt's mean score subtracted first for the baseline estimator), then
  whitened over the real tokens of the whole batch. 0 at padding."""
  if c.advantage_estimator == "reinforce_pp_baseline":
    scores = group_centred(scores, k)
  rewards = ppo.token_rewards(scores, kl, mask, c.kl_coef)
  # GAE with V ≡ 0 and λ = 1 is the discounted reward-to-go.
  _, returns = ppo.gae(rewards, jnp.zeros_like(rewards), mask, c.gamma, 1.0)
  return returns, ppo.whiten(returns, mask)


def train_step(state: TrainState, ref_params: Any, reward_params: Any, batch: pipeline.Batch,
               rng: jax.Array, *, cfg: ModelConfig, c: Any, tx: optax.GradientTransformation,
               eos_id: sampling.EosIds) -> tuple[TrainState, dict[str, jax.Array]]:
  """Experience (log-probs, scores, globally whitened returns) and `c.epochs` of minibatch updates
  for one batch of `c.k` samples per prompt."""
  group = online.group(c, c.k)
  e = online.experience(state, ref_params, reward_params, batch, cfg, c, eos_id, group)
  mask = batch["response_mask"]
  kl = e["old_logprobs"] - e["ref_logprobs"]  # 0 at padding: both log-probs are.
  returns, adv = advantages(e["scores"], kl, mask, c, c.k)
  data = {**batch, "old_logprobs": online.old_logprobs(e["old_logprobs"], batch, c),
          "advantages": adv}
  weights = online.tis_weights(e["old_logprobs"], batch, c, "reinforce_pp")
  if weights is not None:
    data["tis_weights"] = weights

  def loss_fn(params, mb):
    logp, entropy = policy.response_token_stats(params["policy"], mb, cfg,
                                                temperature=c.temperature, group=group)
    loss, stats = ppo.policy_loss(logp, mb, c.cliprange)
    m = mb["response_mask"].astype(jnp.float32)
    return loss, {**stats, "loss/policy_avg": loss,
                  "policy/entropy_avg": online.masked_mean(entropy, m)}

  state, update_stats = online.minibatch_updates(state, data, rng, loss_fn, c.epochs,
                                                 c.minibatch_size, tx, group)
  non_score = -c.kl_coef * kl.sum(-1)
  stats = {**online.rollout_stats(e, batch, eos_id),
           "objective/non_score_reward": non_score.mean(),
           "objective/rlhf_reward": (e["scores"] + non_score).mean(),
           "returns/mean": online.masked_mean(returns, mask),
           **online.sampler_gap(e["old_logprobs"], batch)}
  return state, {**stats, **update_stats}


def check_config(c: Any) -> None:
  """Clear errors for REINFORCE++ settings that cannot work."""
  if c.advantage_estimator not in ESTIMATORS:
    raise ConfigError(f"reinforce_pp.advantage_estimator must be one of {ESTIMATORS}, got "
                      f"{c.advantage_estimator!r}")
  baseline = c.advantage_estimator == "reinforce_pp_baseline"
  if baseline and c.gamma != 1.0:
    raise ConfigError(f"reinforce_pp.gamma must be 1 with the baseline estimator (as OpenRLHF "
                      f"fixes it for reinforce_baseline), got {c.gamma}")
  online.check_sampling("reinforce_pp", c, c.k,
                        "the baseline estimator subtracts the group's mean" if baseline else "")


def program(exp: experiment.Experiment) -> program_lib.Program:
  """REINFORCE++'s update step as `run` trains it (`online.program`)."""
  return online.program(exp, "reinforce_pp", train_step,
                        online.minibatch_updates_per_step(exp.config.reinforce_pp))


def run(config, workdir: str) -> TrainState:
  c = config.reinforce_pp
  check_config(c)
  return online.run_policy(config, workdir, "reinforce_pp", program, c.k)
