"""Group relative policy optimisation (task=grpo; Shao et al. 2024, DeepSeekMath), as TRL's GRPOTrainer.

A group of G responses per prompt (`grpo.k`). Each response's reward r_i (the RM score at eos after
the truncation rule) is normalised within its group, and every token of the response gets it:

  A_i = (r_i − mean(r_group)) / (std(r_group) + ε)      (`scale_rewards='group'`)

(`'batch'`: the std over the whole batch; `'none'`: no division, Dr. GRPO). No value network. The
per-token loss is the clipped surrogate minus the KL penalty in the loss,

  ℓ_t = −[min(ρ_t A_i, clip(ρ_t, 1 − ε_low, 1 + ε_high) A_i) − β KL_t],
  ρ_t = π_θ(y_t) / π_old(y_t),  ε_low = `cliprange`, ε_high = `cliprange_high` (= ε_low: GRPO),

with KL_t the k3 estimator π_ref/π_θ − log(π_ref/π_θ) − 1 (an unbiased value of KL(π_θ‖π_ref),
always ≥ 0; as a loss term its expected gradient is that of KL(π_ref‖π_θ), as in TRL).
`kl_in='reward'` instead subtracts β Σ_t KL_t from r_i before the group normalisation, as PPO and RLOO do, where
`kl_estimator='k1'` (log π_θ − log π_ref) may serve too; in the loss k1 is refused, its gradient
∇ log π_θ being zero in expectation over π_θ's samples. How the token losses become one number is what GRPO's follow-ups
argue about (`loss_type`):

  'grpo'    (Shao et al.)  mean over sequences of each sequence's token mean;
  'bnpo'    (DAPO's token-level) sum over all real tokens / their count;
  'dr_grpo' (Liu et al.)   sum over all real tokens / (sequences × response_len), a constant.

`grpo.epochs` passes over shuffled minibatches (μ of the paper; one epoch of one minibatch is the
on-policy default, ρ = 1). std is the unbiased sample std with ε = 1e-4, as in TRL. `truncated_is`
multiplies each token's clipped surrogate term by min(π_old / π_sampler, tis_cap) (TRL's
`vllm_importance_sampling_correction`, token-truncated).

DAPO (Yu et al. 2025), each part its own knob, all off by default: the clip range decoupled
(ε_low = `cliprange`, ε_high = `cliprange_high`; DAPO's 0.2 and 0.28); the token-level loss
('bnpo'); overlong reward shaping (`overlong_buffer` L_cache, `overlong_penalty_factor`: the
reward falls linearly over the last L_cache tokens before response_len); dynamic sampling
(`dynamic_sampling`: the groups whose rewards are all equal leave the loss; with
`max_num_gen_batches` > 1 the loop samples other prompts in their place, `online.Refill`).
GSPO (Zheng et al. 2025): `importance_sampling_level='sequence'` takes one ratio per response,
the geometric mean of its token ratios, clipped as a whole; 'sequence_token' (GSPO-token) has its
value and a gradient per token. task=dapo, task=gspo and task=dr_grpo run this step under the
`dapo`, `gspo` and `dr_grpo` blocks, which hold the papers' settings; each block is complete and
independent of `grpo`'s (configs/tldr_sim.py); docs/grpo_variants.md gives the formulas.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from rlhfjax.algorithms import online
from rlhfjax.data import pipeline
from rlhfjax.errors import ConfigError
from rlhfjax.models import policy
from rlhfjax.models import sampling
from rlhfjax.models.config import ModelConfig
from rlhfjax.rollout import engine
from rlhfjax.training import experiment
from rlhfjax.training import program as program_lib
from rlhfjax.training.state import TrainState

SCALES = ("group", "batch", "none")
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo")
KL_ESTIMATORS = ("k3", "k1")
KL_IN = ("loss", "reward")
IS_LEVELS = ("token", "sequence", "sequence_token")
# What dynamic sampling tests for a spread: the score (DAPO's accuracy; verl's
# `filter_groups.metric`), or the shaped reward the advantages are made of.
FILTER_METRICS = ("score", "reward")
STD_EPS = 1e-4
ZERO_STD = 1e-6  # A group whose rewards spread less than this carries no gradient.
# The knobs the step reads of its block, beside the online loop's: every GRPO block (grpo, dapo,
# gspo, dr_grpo) holds each of them, with no default in code (configs/tldr_sim.py).
KNOBS = ("k", "beta", "kl_estimator", "kl_in", "cliprange", "cliprange_high", "scale_rewards",
         "loss_type", "epochs", "minibatch_size", "overlong_buffer", "overlong_penalty_factor",
         "dynamic_sampling", "dynamic_sampling_metric", "max_num_gen_batches",
         "importance_sampling_level")


def kl_estimate(logp: jax.Array, ref_logp: jax.Array, estimator: str) -> jax.Array:
  """Per-token estimate of KL(π ‖ π_ref) from samples of π: k1 = log π − log π_ref; k3 (Schulman)
  = π_ref/π − log(π_ref/π) − 1."""
  if estimator == "k1":
    return logp - ref_logp
  d = ref_logp - logp
  return jnp.exp(d) - d - 1.0


def group_advantages(rewards: jax.Array, k: int, scale: str) -> tuple[jax.Array, jax.Array]:
  """(advantages [B], each group's std [B // k]): rewards less their group's mean, over the group's
  std (`'group'`), the batch's (`'batch'`) or 1 (`'none'`), each plus ε."""
  r = rewards.reshape(-1, k)
  std = r.std(-1, ddof=1)
  centred = r - r.mean(-1, keepdims=True)
  if scale == "group":
    centred = centred / (std[:, None] + STD_EPS)
  elif scale == "batch":
    centred = centred / (rewards.std(ddof=1) + STD_EPS)
  return centred.reshape(-1), std


def overlong_penalty(lengths: jax.Array, max_len: int, buffer: int,
                     factor: float) -> jax.Array:
  """DAPO's soft overlong punishment [B] for responses of `lengths` real tokens: 0 up to
  L_max − L_cache (`max_len` − `buffer`), then falling linearly to −1 at L_max, −1 beyond; times
  `factor`. Tells a response running into the length limit from one that ends in time."""
  start = max_len - buffer
  return factor * jnp.clip((start - lengths) / buffer, -1.0, 0.0)


def length_shaping(batch: pipeline.Batch, eos_id: sampling.EosIds, c: Any) -> jax.Array | None:
  """The overlong penalty [B] each response's reward gets (None with `overlong_buffer` 0). With
  `penalize_no_eos` a response without eos (cut off at response_len: DAPO's |y| > L_max) already
  scores `no_eos_score` in place of its reward, and gets no penalty on top; without the rule it
  gets the full −`overlong_penalty_factor`."""
  buffer = c.overlong_buffer
  if buffer <= 0:
    return None
  mask = batch["response_mask"]
  penalty = overlong_penalty(mask.astype(jnp.float32).sum(-1), mask.shape[1], buffer,
                             c.overlong_penalty_factor)
  if c.penalize_no_eos:
    penalty = jnp.where(sampling.is_eos(batch["response"], eos_id).any(-1), penalty, 0.0)
  return penalty


def informative_groups(group_std: jax.Array) -> jax.Array:
  """Which groups [B // k] have values that differ (std ≥ ZERO_STD); DAPO's dynamic sampling
  leaves the others out."""
  return group_std >= ZERO_STD


def filter_std(scores: jax.Array, rewards: jax.Array, c: Any) -> jax.Array:
  """Each group's std [B // k] of what dynamic sampling tests (`dynamic_sampling_metric`):
  'score', the scores before the overlong shaping and any KL (DAPO drops the groups whose
  accuracy is all 1 or all 0, however their lengths differ: verl's `metric=acc`); 'reward', the
  rewards the advantages are made of (a group left in has a nonzero advantage somewhere)."""
  values = scores if c.dynamic_sampling_metric == "score" else rewards
  return values.reshape(-1, c.k).std(-1, ddof=1)


def importance_ratio(logp: jax.Array, old_logp: jax.Array, mask: jax.Array | None,
                     level: str) -> jax.Array:
  """The ratio ρ [B, R] the surrogate clips, per `level`: 'token' π_θ(y_t)/π_old(y_t) (GRPO);
  'sequence' (GSPO) s_i = exp(mean over the real tokens (`mask`) of log π_θ − log π_old), the
  same on every token of the response, its gradient spread over them; 'sequence_token'
  (GSPO-token) sg[s_i] · π_θ(y_t)/sg[π_θ(y_t)], equal to s_i with each token's own gradient."""
  log_ratio = logp - old_logp
  if level == "token":
    return jnp.exp(log_ratio)
  if mask is None:
    raise ValueError(f"importance_sampling_level={level!r} needs the response mask")
  real = mask > 0
  seq = (jnp.where(real, log_ratio, 0.0).sum(-1, keepdims=True)
         / jnp.maximum(real.sum(-1, keepdims=True), 1))
  if level == "sequence":
    return jnp.broadcast_to(jnp.exp(seq), logp.shape)
  return jnp.exp(jax.lax.stop_gradient(seq) + logp - jax.lax.stop_gradient(logp))


def aggregate(token_loss: jax.Array, mask: jax.Array, loss_type: str,
              rows: jax.Array | None = None) -> jax.Array:
  """One loss from per-token losses [B, R] over the real tokens (`mask`), per `loss_type`. `rows`
  [B] (1 or 0): the sequences that count (dynamic sampling's kept groups), the others out of both
  the sum and the normaliser; None: all."""
  if rows is not None:
    mask = mask * rows[:, None]
  total = (token_loss * mask).sum(-1)
  if loss_type == "grpo":
    per_sequence = total / jnp.maximum(mask.sum(-1), 1.0)
    if rows is None:
      return per_sequence.mean()
    return per_sequence.sum() / jnp.maximum(rows.sum(), 1.0)
  if loss_type == "bnpo":
    return total.sum() / jnp.maximum(mask.sum(), 1.0)
  if rows is None:
    return total.sum() / mask.size  # dr_grpo: a constant normaliser (sequences × response_len).
  return total.sum() / (jnp.maximum(rows.sum(), 1.0) * mask.shape[1])


def token_losses(logp: jax.Array, old_logp: jax.Array, ref_logp: jax.Array, adv: jax.Array,
                 c: Any, weights: jax.Array | None = None, mask: jax.Array | None = None
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(ℓ_t, KL_t, whether ρ_t was clipped) [B, R] for sequence advantages `adv` [B], with the ratio
  of `importance_sampling_level` (the sequence levels need the response `mask`) clipped to
  [1 − cliprange, 1 + cliprange_high]. TIS `weights` [B, R] (online.tis_weights) multiply the
  clipped surrogate term, not the KL term, as in TRL."""
  ratio = importance_ratio(logp, old_logp, mask, c.importance_sampling_level)
  a = adv[:, None]
  surrogate = jnp.minimum(ratio * a, jnp.clip(ratio, 1.0 - c.cliprange,
                                              1.0 + c.cliprange_high) * a)
  kl = kl_estimate(logp, ref_logp, c.kl_estimator)
  pg = -surrogate if weights is None else -surrogate * weights
  loss = pg + (c.beta * kl if c.kl_in == "loss" else 0.0)
  clipped = (ratio * a) > surrogate
  return loss, kl, clipped


def shaped_rewards(e: dict[str, jax.Array], batch: pipeline.Batch, c: Any,
                   eos_id: sampling.EosIds) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(rewards r_i [B] the advantages are made of, their metrics): `experience`'s scores (after the
  truncation rule) plus the overlong penalty, less β Σ_t KL_t with `kl_in='reward'` (which reads
  the log-probs `e` then holds)."""
  rewards, stats = e["scores"], {}
  penalty = length_shaping(batch, eos_id, c)
  if penalty is not None:
    rewards = rewards + penalty
    stats.update({"overlong/penalty": penalty.mean(),
                  "overlong/frac_penalized": (penalty < 0).astype(jnp.float32).mean()})
  if c.kl_in == "reward":
    m = batch["response_mask"].astype(jnp.float32)
    rewards = rewards - c.beta * (kl_estimate(e["old_logprobs"], e["ref_logprobs"], c.kl_estimator)
                                  * m).sum(-1)
  return rewards, stats


def informative(state: TrainState, ref_params: Any, reward_params: Any, batch: pipeline.Batch, *,
                cfg: ModelConfig, c: Any, eos_id: sampling.EosIds) -> jax.Array:
  """Which groups [B // k] of a sampled batch the step keeps (the refill's test, `filter_std`, as
  the step applies it): the reward model alone, or the whole experience pass where the test is on
  rewards that `kl_in='reward'` puts the policy's KL into."""
  group = online.group(c, c.k)
  on_rewards = c.dynamic_sampling_metric == "reward"
  if on_rewards and c.kl_in == "reward":
    e = online.experience(state, ref_params, reward_params, batch, cfg, c, eos_id, group)
  else:
    scores, _ = engine.rewards_at_eos(reward_params, batch, cfg, eos_id,
                                      c.no_eos_score if c.penalize_no_eos else None, group)
    e = {"scores": scores}
  rewards = shaped_rewards(e, batch, c, eos_id)[0] if on_rewards else e["scores"]
  return informative_groups(filter_std(e["scores"], rewards, c))


def train_step(state: TrainState, ref_params: Any, reward_params: Any, batch: pipeline.Batch,
               rng: jax.Array, *, cfg: ModelConfig, c: Any, tx: optax.GradientTransformation,
               eos_id: sampling.EosIds, task: str = "grpo"
               ) -> tuple[TrainState, dict[str, jax.Array]]:
  """Experience (log-probs, scores, group-normalised advantages) and `c.epochs` of minibatch
  updates for one batch of `c.k` samples per prompt, under the block of `task` (grpo, dapo, gspo,
  dr_grpo: the name its errors give)."""
  group = online.group(c, c.k)
  e = online.experience(state, ref_params, reward_params, batch, cfg, c, eos_id, group)
  rewards, variant_stats = shaped_rewards(e, batch, c, eos_id)
  adv, group_std = group_advantages(rewards, c.k, c.scale_rewards)
  data = {**batch, "old_logprobs": online.old_logprobs(e["old_logprobs"], batch, c),
          "ref_logprobs": e["ref_logprobs"],
          "advantages": adv}
  if c.dynamic_sampling:
    kept = informative_groups(filter_std(e["scores"], rewards, c))
    data["rows"] = jnp.repeat(kept.astype(jnp.float32), c.k)
    variant_stats.update({
        "dynamic_sampling/dropped_groups": (~kept).sum().astype(jnp.float32),
        "dynamic_sampling/kept_fraction": kept.astype(jnp.float32).mean()})
  weights = online.tis_weights(e["old_logprobs"], batch, c, task)
  if weights is not None:
    data["tis_weights"] = weights

  def loss_fn(params, mb):
    logp = policy.response_logprobs(params["policy"], mb, cfg, temperature=c.temperature,
                                    group=group)
    mask = mb["response_mask"].astype(jnp.float32)
    losses, kl, clipped = token_losses(logp, mb["old_logprobs"], mb["ref_logprobs"],
                                       mb["advantages"], c, mb.get("tis_weights"), mask)
    rows = mb.get("rows")
    loss = aggregate(losses, mask, c.loss_type, rows)
    counted = mask if rows is None else mask * rows[:, None]  # The tokens the loss counts.
    return loss, {"loss/policy_avg": loss, "kl": online.masked_mean(kl, counted),
                  "policy/clipfrac_avg": online.masked_mean(clipped.astype(jnp.float32), counted)}

  state, update_stats = online.minibatch_updates(state, data, rng, loss_fn, c.epochs,
                                                 c.minibatch_size, tx, group)
  stats = {**online.rollout_stats(e, batch, eos_id),
           "reward": rewards.mean(), "reward_std": group_std.mean(),
           "frac_reward_zero_std": (group_std < ZERO_STD).astype(jnp.float32).mean(),
           **variant_stats, **online.sampler_gap(e["old_logprobs"], batch)}
  return state, {**stats, **update_stats}


def check_config(c: Any, response_len: int | None = None, task: str = "grpo") -> None:
  """Clear errors for the settings of the GRPO block `task` (grpo, dapo, gspo, dr_grpo) that cannot
  work (`response_len`: the format's, which the overlong buffer must fit in)."""
  missing = [key for key in KNOBS if key not in c]
  if missing:
    raise ConfigError(f"{task} has no {', '.join(missing)}: every GRPO block (grpo, dapo, gspo, "
                      f"dr_grpo) holds each of its knobs (configs/tldr_sim.py)")
  if c.loss_type == "dapo":
    raise ConfigError(f"{task}.loss_type 'dapo' (TRL's name) is 'bnpo' here: the token mean over "
                      "each minibatch; DAPO's other parts are their own knobs (cliprange_high, "
                      "overlong_buffer, dynamic_sampling, max_num_gen_batches), all set in the "
                      "dapo block that task=dapo runs (docs/grpo_variants.md)")
  for key, allowed in (("scale_rewards", SCALES), ("loss_type", LOSS_TYPES),
                       ("kl_estimator", KL_ESTIMATORS), ("kl_in", KL_IN),
                       ("dynamic_sampling_metric", FILTER_METRICS)):
    if c[key] not in allowed:
      raise ConfigError(f"{task}.{key} must be one of {allowed}, got {c[key]!r}")
  if c.kl_estimator == "k1" and c.kl_in == "loss" and c.beta > 0:
    # ∇(log π − log π_ref) = ∇ log π, and E_π[∇ log π] = 0: the penalty would pull nowhere.
    raise ConfigError(f"{task}.kl_estimator='k1' with {task}.kl_in='loss' has a zero gradient in "
                      f"expectation (β {c.beta} pulls nothing towards the reference): use "
                      f"{task}.kl_estimator='k3' in the loss, or {task}.kl_in='reward' for k1")
  level = c.importance_sampling_level
  if level not in IS_LEVELS:
    raise ConfigError(f"{task}.importance_sampling_level must be one of {IS_LEVELS}, got {level!r}")
  if not c.cliprange_high > 0:
    raise ConfigError(f"{task}.cliprange_high must be > 0, got {c.cliprange_high!r}")
  buffer, most = c.overlong_buffer, response_len
  if buffer < 0 or (most is not None and buffer > most):
    within = ">= 0" if most is None else f"in [0, format.response_len ({most})]"
    raise ConfigError(f"{task}.overlong_buffer must be {within}, got {buffer!r}")
  if not c.overlong_penalty_factor >= 0:
    raise ConfigError(f"{task}.overlong_penalty_factor must be >= 0, got "
                      f"{c.overlong_penalty_factor!r}")
  draws = c.max_num_gen_batches
  if not (isinstance(draws, int) and draws >= 1):
    raise ConfigError(f"{task}.max_num_gen_batches must be an integer >= 1 (1: no refill), got "
                      f"{draws!r}")
  if draws > 1 and not c.dynamic_sampling:
    raise ConfigError(f"{task}.max_num_gen_batches ({draws}) refills the groups that dynamic "
                      f"sampling drops: set {task}.dynamic_sampling=True or leave it at 1")
  online.check_sampling(task, c, c.k, "advantages are relative to the group")


def program(exp: experiment.Experiment, task: str = "grpo") -> program_lib.Program:
  """The update step of the GRPO block `task` (grpo, dapo, gspo, dr_grpo) as `run` trains it
  (`online.program`)."""
  return online.program(exp, task, functools.partial(train_step, task=task),
                        online.minibatch_updates_per_step(exp.config[task]))


def run(config, workdir: str, task: str = "grpo") -> TrainState:
  """Trains (or resumes) the GRPO block `task` in `<workdir>/<task>`: grpo, or dapo, gspo and
  dr_grpo (the same step under their papers' settings, each block read alone), refilling dropped
  groups where `max_num_gen_batches` allows more than one draw."""
  c = config[task]
  check_config(c, config.format.response_len, task)
  draws = c.max_num_gen_batches
  refill = online.Refill(informative, draws) if draws > 1 else None
  return online.run_policy(config, workdir, task, functools.partial(program, task=task), c.k,
                           refill=refill)
