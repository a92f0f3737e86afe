"""PPO against the learned reward model (task=ppo), as in Ziegler et al. / Stiennon et al.

Four parameter trees: the policy (from SFT, trained), the reference (frozen SFT), the value model
(initialised from the reward model, trained) and the reward model (frozen). With
`ppo.value_model='policy_trunk'` the value model is instead a scalar head on the policy's own final
hidden states (TRL's older PPOTrainer with a value head): one trained backbone instead of two, one
policy forward for log-probs and values, and the value loss trains the policy trunk too.

One iteration:

1. Rollout: the jitted KV-cache sampler draws `format.response_len` tokens at `ppo.temperature` for
   `ppo.rollout_batch` prompts of the unlabeled split; everything after the first eos is padding.
2. Experience: the reward model scores each response at its eos; a response that never ends gets
   `ppo.no_eos_score` instead (with `penalize_no_eos`). Per-token rewards are the KL penalty
   `-β (log π − log π_ref)` on every response token plus the score on the last one; log-probs are
   taken at the sampling temperature. GAE (γ, λ) gives advantages and returns; advantages are
   whitened over the whole rollout (AlpacaFarm) or per minibatch.
3. Update: `ppo.epochs` passes over shuffled minibatches (`lax.scan`) of the clipped policy loss plus
   `vf_coef` times the clipped value loss; global-norm clipping, AdamW, learning rate linear to 0.
   With `truncated_is`, each token's surrogate term is weighted by min(π_old / π_sampler, tis_cap).
   Then β follows the adaptive controller of Ziegler et al. when `adaptive_kl` is set.

Steps 2 and 3 are one jitted pure function, `train_step`. Padding after eos counts nowhere.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from rlhfjax import rng_streams
from rlhfjax.algorithms import online
from rlhfjax.data import pipeline
from rlhfjax.errors import ConfigError
from rlhfjax.models import heads
from rlhfjax.models import lora
from rlhfjax.models import policy
from rlhfjax.models import sampling
from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig
from rlhfjax.rollout import engine
from rlhfjax.rollout import outputs
from rlhfjax.rollout import reward_functions
from rlhfjax.rollout import rewards
from rlhfjax.training import checkpoint
from rlhfjax.training import experiment
from rlhfjax.training import loaders
from rlhfjax.training import optimizer
from rlhfjax.training import program as program_lib
from rlhfjax.training.state import TrainState

WHITEN = ("batch", "minibatch")
VALUE_MODELS = ("separate", "policy_trunk")


@flax.struct.dataclass
class PPOState(TrainState):
  """Trained parameters, their optimizer state, and the current KL coefficient β (part of the state
  so that a resumed run repeats exactly). `params` is `{'policy', 'value'}` (a value model with its
  own backbone, `value_model='separate'`) or `{'policy', 'value_head'}` (a scalar head on the
  policy's hidden states, `'policy_trunk'`); the step functions follow whichever layout they get."""
  kl_coef: jax.Array


def whiten(x: jax.Array, mask: jax.Array, shift_mean: bool = True) -> jax.Array:
  """(x − mean) / std over the real entries of `x` (padding is ignored and left at 0)."""
  mean = online.masked_mean(x, mask)
  var = online.masked_mean(jnp.square(x - mean), mask)
  out = (x - mean) * jax.lax.rsqrt(var + 1e-8)
  if not shift_mean:
    out = out + mean
  return jnp.where(mask, out, 0.0)


def gae(rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: float,
        lam: float) -> tuple[jax.Array, jax.Array]:
  """Generalised advantage estimation over response tokens [B, R]; returns (advantages, returns).

  δ_t = r_t + γ V_{t+1} − V_t and A_t = δ_t + γ λ A_{t+1}, with V and r zero after the last real token,
  so the episode ends at eos.
  """
  mask = mask.astype(values.dtype)
  values = values * mask
  next_values = jnp.concatenate([values[:, 1:], jnp.zeros_like(values[:, :1])], 1)
  deltas = (rewards + gamma * next_values - values) * mask

  def back(carry, delta):
    adv = delta + gamma * lam * carry
    return adv, adv

  _, adv = jax.lax.scan(back, jnp.zeros(deltas.shape[0], deltas.dtype), deltas.T, reverse=True)
  adv = adv.T * mask
  return adv, (adv + values) * mask


def token_rewards(scores: jax.Array, kl: jax.Array, mask: jax.Array,
                  kl_coef: jax.Array) -> jax.Array:
  """−β·kl on every response token plus the sequence score on its last real token. [B, R]."""
  last = heads.last_token_index(mask)
  at_last = jax.nn.one_hot(last, mask.shape[1], dtype=kl.dtype) * scores[:, None]
  return jnp.where(mask, -kl_coef * kl + at_last, 0.0)


def adaptive_kl_coef(kl_coef: jax.Array, kl: jax.Array, target: float, horizon: float,
                     n_steps: int) -> jax.Array:
  """Ziegler et al.'s proportional controller: β ← β (1 + clip(KL/target − 1, ±0.2) n / horizon)."""
  error = jnp.clip(kl / target - 1.0, -0.2, 0.2)
  return kl_coef * (1.0 + error * n_steps / horizon)


def policy_loss(logp: jax.Array, batch: dict[str, jax.Array],
                cliprange: float) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The clipped surrogate on per-token ratios and advantages (`batch['old_logprobs']` the old
  log-probs, `batch['advantages']` [B, R]), as a token mean over the real tokens. With
  `tis_weights` in the batch (online.tis_weights) each token's clipped surrogate term is multiplied
  by its weight, as verl and TRL do."""
  m = batch["response_mask"].astype(jnp.float32)
  adv = batch["advantages"]
  log_ratio = logp - batch["old_logprobs"]
  ratio = jnp.exp(log_ratio)
  pg1, pg2 = -adv * ratio, -adv * jnp.clip(ratio, 1.0 - cliprange, 1.0 + cliprange)
  pg = jnp.maximum(pg1, pg2)
  if "tis_weights" in batch:
    pg = pg * batch["tis_weights"]
  return online.masked_mean(pg, m), {
      "policy/approxkl_avg": 0.5 * online.masked_mean(jnp.square(log_ratio), m),
      "policy/clipfrac_avg": online.masked_mean((pg2 > pg1).astype(jnp.float32), m),
      "val/ratio": online.masked_mean(ratio, m)}


def ppo_losses(logp: jax.Array, values: jax.Array, batch: dict[str, jax.Array], cliprange: float,
               cliprange_value: float) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
  """`policy_loss` and the clipped value loss, as token means over real tokens (TIS weights
  multiply the policy's terms only)."""
  m = batch["response_mask"].astype(jnp.float32)
  pg_loss, stats = policy_loss(logp, batch, cliprange)
  v_clipped = batch["values"] + jnp.clip(values - batch["values"], -cliprange_value, cliprange_value)
  vf1, vf2 = jnp.square(values - batch["returns"]), jnp.square(v_clipped - batch["returns"])
  vf_loss = 0.5 * online.masked_mean(jnp.maximum(vf1, vf2), m)
  vf_clipped = (vf2 > vf1).astype(jnp.float32)
  return pg_loss, vf_loss, {**stats, "val/clipfrac_avg": online.masked_mean(vf_clipped, m)}


def _response_values(v: jax.Array, batch: pipeline.Batch) -> jax.Array:
  """Per-token head outputs over prompt + response [B, T] -> V(state before each response token)
  [B, R], 0 at padding."""
  p = batch["prompt"].shape[1]
  return jnp.where(batch["response_mask"], v[:, p - 1:-1], 0.0)


def _values(value_params, batch: pipeline.Batch, cfg: ModelConfig) -> jax.Array:
  """The separate value model's V(state before each response token) [B, R], 0 at padding."""
  tokens, mask = pipeline.prompt_and(batch)
  return _response_values(heads.values(value_params, tokens, mask, cfg), batch)


def _policy_and_values(params: dict, batch: pipeline.Batch, cfg: ModelConfig, temperature: float,
                       value_cfg: ModelConfig | None = None
                       ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Response log-probs, entropies and values, each [B, R] and 0 at padding.

  With a separate value model, its own forward (under `value_cfg`, default `cfg`: the two may
  differ in rematerialisation only); with a `value_head`, the head reads the hidden states of the
  policy's one forward pass, so values cost no second backbone pass.
  """
  if "value_head" not in params:
    logp, entropy = policy.response_token_stats(params["policy"], batch, cfg,
                                                temperature=temperature)
    return logp, entropy, _values(params["value"], batch, value_cfg or cfg)
  hidden, _, last = policy.hidden_states(params["policy"], batch, cfg)
  logp, entropy = policy.token_stats(policy.distributions_from_hidden(
      params["policy"], hidden, last, cfg, temperature), batch)
  return logp, entropy, _response_values(heads.apply_scalar_head(params["value_head"], hidden),
                                         batch)


def experience(params: dict, ref_params: Any, reward_params: dict, batch: pipeline.Batch,
               kl_coef: jax.Array, *, cfg: ModelConfig, c: Any,
               eos_id: sampling.EosIds) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
  """Log-probs, values, scores, per-token rewards, advantages and returns of one rollout; with
  `truncated_is`, the TIS weights of its tokens too (online.tis_weights)."""
  m = batch["response_mask"]
  logp, entropy, values = _policy_and_values(params, batch, cfg, c.temperature)
  ref_logp = policy.response_logprobs(ref_params, batch, cfg, temperature=c.temperature)
  scores, raw = engine.rewards_at_eos(reward_params, batch, cfg, eos_id,
                                      c.no_eos_score if c.penalize_no_eos else None)
  kl = logp - ref_logp
  rewards = token_rewards(scores, kl, m, kl_coef)
  adv, returns = gae(rewards, values, m, c.gamma, c.lam)
  if c.whiten == "batch":
    adv = whiten(adv, m)
  kl_sum = kl.sum(-1)
  stats = {"objective/kl": kl_sum.mean(), "objective/entropy": entropy.sum(-1).mean(),
           "objective/scores": scores.mean(), "objective/raw_scores": raw.mean(),
           "objective/rlhf_reward": (scores - kl_coef * kl_sum).mean(),
           "objective/non_score_reward": (-kl_coef * kl_sum).mean(), "objective/kl_coef": kl_coef,
           "val/num_eos_tokens": sampling.is_eos(batch["response"], eos_id).sum().astype(jnp.float32),
           "val/mean": online.masked_mean(values, m),
           "returns/mean": online.masked_mean(returns, m),
           "response/length": m.sum(-1).mean(), **online.sampler_gap(logp, batch)}
  rollout = {**batch, "old_logprobs": online.old_logprobs(logp, batch, c), "values": values,
             "advantages": adv, "returns": returns}
  weights = online.tis_weights(logp, batch, c, "ppo")
  if weights is not None:
    rollout["tis_weights"] = weights
  return rollout, stats


def update(state: PPOState, rollout: dict[str, jax.Array], rng: jax.Array, *, cfg: ModelConfig,
           c: Any, tx: optax.GradientTransformation,
           value_cfg: ModelConfig | None = None) -> tuple[PPOState, dict[str, jax.Array]]:
  """`c.epochs` passes of minibatch PPO over one rollout (online.minibatch_updates), the policy
  under `cfg` and a separate value model under `value_cfg` (default `cfg`); the state's `step`
  then counts this iteration once."""

  def loss_fn(params, mb):
    if c.whiten == "minibatch":  # Advantages do not depend on the parameters: no gradient here.
      mb = {**mb, "advantages": whiten(mb["advantages"], mb["response_mask"])}
    # With a value head on the policy trunk, the value loss's gradient reaches the trunk too.
    logp, entropy, values = _policy_and_values(params, mb, cfg, c.temperature, value_cfg)
    pg_loss, vf_loss, stats = ppo_losses(logp, values, mb, c.cliprange, c.cliprange_value)
    loss = pg_loss + c.vf_coef * vf_loss
    m = mb["response_mask"].astype(jnp.float32)
    return loss, {**stats, "loss/policy_avg": pg_loss, "loss/value_avg": vf_loss,
                  "loss/total": loss, "policy/entropy_avg": online.masked_mean(entropy, m)}

  return online.minibatch_updates(state, rollout, rng, loss_fn, c.epochs, c.minibatch_size, tx)


def train_step(state: PPOState, ref_params: Any, reward_params: dict, batch: pipeline.Batch,
               rng: jax.Array, *, cfg: ModelConfig, c: Any, tx: optax.GradientTransformation,
               eos_id: sampling.EosIds,
               value_cfg: ModelConfig | None = None) -> tuple[PPOState, dict[str, jax.Array]]:
  """Experience and update for one rollout batch, then the KL-controller update. `ref_params` None:
  the reference is the LoRA policy with its adapters off. `cfg` is the policy's (the forward-only
  experience runs under it too: rematerialisation changes nothing there), `value_cfg` a separate
  value model's in the update (default `cfg`)."""
  ref_params = lora.reference(state.params["policy"], ref_params)
  rollout, stats = experience(state.params, ref_params, reward_params, batch, state.kl_coef,
                              cfg=cfg, c=c, eos_id=eos_id)
  state, update_stats = update(state, rollout, rng, cfg=cfg, c=c, tx=tx, value_cfg=value_cfg)
  if c.adaptive_kl:  # Not from a non-finite KL: a dropped update (skip_nonfinite) leaves it too.
    n = batch["response"].shape[0]
    kl_coef = adaptive_kl_coef(state.kl_coef, stats["objective/kl"], c.kl_target, c.kl_horizon, n)
    state = state.replace(kl_coef=jnp.where(jnp.isfinite(kl_coef), kl_coef, state.kl_coef))
  return state, {**stats, **update_stats}


def frozen(params: Any, dtype: str) -> Any:
  """A frozen model's parameters (reference, reward) in `dtype` ('' keeps theirs). Cast after
  `init_state` copied the policy and value model from them: those train in their own precision.
  Meant for `model.dtype=bfloat16`, where every matmul already rounds the weights to bfloat16, so
  the reference's log-probs equal the initial policy's and the KL starts at 0; under float32
  compute a bfloat16 reference differs from the policy by its rounding from the first step."""
  if not dtype:
    return params
  return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x,
                      params)


def check_config(c: Any) -> None:
  """Clear errors for PPO settings that cannot work."""
  if c.whiten not in WHITEN + ("none",):
    raise ConfigError(f"ppo.whiten must be one of {WHITEN + ('none',)}, got {c.whiten!r}")
  if c.rollout_batch % c.minibatch_size:
    raise ConfigError(f"ppo.rollout_batch ({c.rollout_batch}) must be a multiple of "
                      f"ppo.minibatch_size ({c.minibatch_size})")
  if c.temperature <= 0:
    raise ConfigError(f"ppo.temperature must be > 0 (PPO samples), got {c.temperature}")
  if c.value_model not in VALUE_MODELS:
    raise ConfigError(f"ppo.value_model must be one of {VALUE_MODELS}, got {c.value_model!r}")


def adamw(c: Any, trainable: Any = None) -> optax.GradientTransformation:
  """PPO's optimizer: AdamW over every minibatch update of every epoch of every iteration (of the
  leaves `trainable` marks, when given: see optimizer.adamw)."""
  return optimizer.adamw(c, c.steps * c.epochs * (c.rollout_batch // c.minibatch_size), trainable)


def init_state(exp: experiment.Experiment, sft_params: Any, rm_params: dict, *,
               lcfg: lora.LoraConfig = lora.LoraConfig()) -> PPOState:
  """Policy from SFT, β from `ppo.kl_coef`, and the value model from the reward model's backbone and
  head (not its likelihood term: values are per-token head outputs) — or, with
  `value_model='policy_trunk'`, the reward model's head alone: it starts as the RM's read-out
  applied to the policy's features. Policy and value backbone take fresh adapters where `lcfg`
  applies to them (lora.MODELS 'policy', 'value')."""
  c = exp.config.ppo
  if c.value_model == "policy_trunk":
    # The RM head rather than a fresh one: policy and RM backbones both come from SFT, so its
    # read-out is the closest to a value estimate at hand, both layouts start from the same head,
    # and no seed is needed.
    params = {"policy": sft_params, "value_head": rm_params["head"]}
  else:
    params = {"policy": sft_params,
              "value": {"backbone": rm_params["backbone"], "head": rm_params["head"]}}
  # Copies: the trained trees must not alias the frozen reference and reward trees.
  params = jax.tree.map(jnp.copy, params)
  if lcfg.rank:
    k_policy, k_value = jax.random.split(jax.random.fold_in(jax.random.key(exp.config.seed),
                                                           rng_streams.POLICY_LORA))
    params["policy"] = lora.adapt(k_policy, params["policy"], lcfg, "policy")
    if "value" in params:
      params["value"] = {**params["value"], "backbone": lora.adapt(
          k_value, params["value"]["backbone"], lcfg, "value")}
  # The rule of `Experiment.trainable('policy', 'value')`: the same optimizer state layout as train.
  adapted = lcfg.applies_to("policy") or lcfg.applies_to("value")
  tx = adamw(c, lora.trainable if adapted else None)
  return PPOState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                  kl_coef=jnp.asarray(c.kl_coef, jnp.float32))


def _roles(exp: experiment.Experiment) -> tuple[str, ...]:
  """The models PPO trains (lora.MODELS): the policy, and a separate value model."""
  return ("policy",) if exp.config.ppo.value_model == "policy_trunk" else ("policy", "value")


def _meta(exp: experiment.Experiment) -> dict:
  skip = ("log_every", "eval_every", "eval_examples")
  return {"model": dataclasses.asdict(exp.model), "format": exp.config.format.to_dict(),
          "ppo": {k: v for k, v in exp.config.ppo.items() if k not in skip},
          "reward": exp.config.reward.to_dict(),  # Resuming under another reward is refused.
          **exp.lora_meta("policy"), **exp.lora_meta("value"), **exp.remat_meta(*_roles(exp))}


def program(exp: experiment.Experiment) -> program_lib.Program:
  """PPO's update step (experience and minibatch passes) as `train` runs it: AdamW over every
  minibatch update, the policy and value model with their adapters and remat policies (dropout
  off: log-probs must be exact), the frozen reference (none under LoRA: the policy's base) and
  reward model (none with reward functions alone) in `ppo.frozen_dtype`, the run's eos ids."""
  c, par = exp.config.ppo, exp.parallel
  check_config(c)
  par.check_batch("ppo.rollout_batch", c.rollout_batch)
  cfg, value_cfg = (dataclasses.replace(exp.model_for(r), dropout=0.0) for r in ("policy", "value"))
  tx = adamw(c, exp.trainable("policy", "value"))
  policy_shapes = jax.eval_shape(lambda: transformer.init(jax.random.key(0), exp.model))
  state, shardings = par.train_state(functools.partial(init_state, exp, lcfg=exp.lora),
                                     param_axes(exp.model, c.value_model, exp.lora), tx,
                                     policy_shapes, loaders.reward_model_template(exp),
                                     abstract=True)
  cast = lambda tree: None if tree is None else par.abstract(
      jax.eval_shape(lambda t: frozen(t, c.frozen_dtype), tree), program_lib.shardings_of(tree))
  ref = None if exp.lora.applies_to("policy") else cast(state.params["policy"])
  reward = cast(rewards.reward_template(exp))
  step = par.jit(functools.partial(train_step, cfg=cfg, c=c, tx=tx, eos_id=exp.eos_ids,
                                   value_cfg=value_cfg),
                 (shardings, program_lib.shardings_of(ref), program_lib.shardings_of(reward),
                  par.batch, par.replicated), (shardings, par.replicated), (0,))
  args = (state, ref, reward, online.rollout_batch(exp, c.rollout_batch), program_lib.key(par))
  return program_lib.Program(step, args, state, shardings, tx)


def train(exp: experiment.Experiment) -> PPOState:
  """Runs (or resumes) PPO in `<workdir>/ppo`."""
  c = exp.config.ppo
  prog = program(exp)
  ref_params = loaders.load_policy(exp)
  if reward_functions.uses_model(exp.config.reward):
    reward_params, _ = loaders.load_reward_model(exp)
    value_source = reward_params
  else:  # Reward functions alone: the value model starts from SFT with a zero head.
    reward_params = None
    value_source = {"backbone": ref_params,
                    "head": {"kernel": jnp.zeros((exp.model.d_model,), jnp.float32),
                             "bias": jnp.zeros((), jnp.float32)}}
  state = prog.init(functools.partial(init_state, exp, lcfg=exp.lora), ref_params, value_source)
  # The trained copies are made; the frozen models may now drop to their own dtype. A LoRA
  # policy's reference is its own base (one backbone for both): no separate tree, no cast.
  ref_params = (None if exp.lora.applies_to("policy")
                else frozen(ref_params, c.frozen_dtype))
  reward_params = None if reward_params is None else frozen(reward_params, c.frozen_dtype)
  return online.train(exp, "ppo", state, prog.step, ref_params, reward_params, _meta(exp))


def param_axes(cfg: ModelConfig, value_model: str = "separate",
               lcfg: lora.LoraConfig = lora.LoraConfig()) -> dict:
  """Logical axes of PPO's trained parameters: the policy and the value model (`ppo.value_model`:
  a whole reward/value model, or only a scalar head on the policy trunk), with the adapters
  `lcfg` gives them."""
  policy_axes = lora.model_axes(transformer.param_axes(cfg), lcfg, "policy")
  if value_model == "policy_trunk":
    return {"policy": policy_axes, "value_head": heads.scalar_head_axes()}
  value = heads.param_axes(cfg)
  return {"policy": policy_axes,
          "value": {**value, "backbone": lora.model_axes(value["backbone"], lcfg, "value")}}


def load_policy(exp: experiment.Experiment) -> Any:
  """The policy parameters of the finished PPO run in `<workdir>/ppo`, adapters merged."""
  state, _ = checkpoint.restore_finished(f"{exp.workdir}/ppo/checkpoints", program(exp).state,
                                         exp.config.ppo.steps, "ppo")
  return lora.merged(state.params["policy"])


def run(config, workdir: str) -> PPOState:
  exp = experiment.prepare(config, workdir)
  state = train(exp)
  outputs.save_policy(exp, "ppo", state.params["policy"], loaders.load_policy(exp))
  return state
