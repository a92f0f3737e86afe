"""Quark (task=quark; Lu et al. 2022) as AlpacaFarm runs it, the pool cut to its top quantile.

Two differences from AlpacaFarm's code (`train_on_best_quantile`): there, no reward token is used
at all (the pool's queries are decoded without it), where here the best bin's control line
conditions sampling, training and evaluation, round 0 included (SFT has never seen it); and
AlpacaFarm's `num_reward_tokens` default is 4 bins, here `num_bins` 5.

Each round: the current policy answers `prompts_per_round` unlabeled prompts after the `control`
code (the reward token of the best bin), at `temperature`; the reward model scores the answers; the
pool is reset to the answers in the top 1/`num_bins` quantile; then `steps_per_round` steps minimise

  NLL(answer | control + prompt) + kl_coef · KL(π(· | control + prompt) ‖ π_ref(· | prompt))

with the KL summed over the vocabulary at every answer position (Quark's per-token KL to the
frozen SFT reference). At the end the policy answers the test prompts after the control code.
A round is one step of the shared loop, so checkpoints and resumption are per round.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlhfjax import rng_streams
from rlhfjax.data import pipeline
from rlhfjax.errors import ConfigError
from rlhfjax.models.config import ModelConfig
from rlhfjax.models import lora
from rlhfjax.models import policy
from rlhfjax.models.reward import score_batch
from rlhfjax.parallel.sharding import to_host
from rlhfjax.rollout import engine
from rlhfjax.rollout import outputs
from rlhfjax.simulated import gold
from rlhfjax.training import checkpoint
from rlhfjax.training import experiment
from rlhfjax.training import loaders
from rlhfjax.training import loop
from rlhfjax.training import metrics as metrics_lib
from rlhfjax.training import program as program_lib
from rlhfjax.training.state import TrainState


def quark_loss(params, ref_params, batch: pipeline.Batch, cfg: ModelConfig,
               kl_coef: float) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Token-mean NLL of the answers after the control code, plus kl_coef times the token-mean KL of
  the conditioned policy from the reference on the plain prompt."""
  m = batch["response_mask"].astype(jnp.float32)
  n = jnp.maximum(m.sum(), 1.0)
  logp_all = policy.response_distributions(params, batch, cfg)
  ref_batch = {**batch, "prompt": batch["ref_prompt"], "prompt_mask": batch["ref_prompt_mask"]}
  ref_params = lora.reference(params, ref_params)
  ref_all = jax.lax.stop_gradient(policy.response_distributions(ref_params, ref_batch, cfg))
  logp = jnp.take_along_axis(logp_all, batch["response"][..., None], -1)[..., 0]
  nll = -(logp * m).sum() / n
  kl = ((jnp.exp(logp_all) * (logp_all - ref_all)).sum(-1) * m).sum() / n
  return nll + kl_coef * kl, {"train/nll": nll, "train/kl": kl}


def train_step(state: TrainState, ref_params: Any, batch: pipeline.Batch, *, cfg: ModelConfig,
               kl_coef: float, tx: optax.GradientTransformation) -> tuple[TrainState, dict]:
  (loss, m), grads = lora.value_and_grad(quark_loss, has_aux=True)(state.params, ref_params,
                                                                   batch, cfg, kl_coef)
  return state.apply_gradients(grads, tx), {"train/loss": loss, **m}


def top_quantile(scores: np.ndarray, num_bins: int) -> np.ndarray:
  """Indices of the scores in the top 1/num_bins quantile (at least one)."""
  k = max(1, len(scores) // num_bins)
  return np.argsort(-scores, kind="stable")[:k]


def program(exp: experiment.Experiment) -> program_lib.Program:
  """The update step `run` takes on the pool: AdamW over every step of every round, the policy
  with its adapters and remat policy, the reference tree unless the policy is a LoRA policy."""
  c, fmt = exp.config.quark, exp.config.format
  batch = program_lib.tokens(exp.parallel, c.batch_size, {"prompt": fmt.prompt_len,
                                                          "ref_prompt": fmt.prompt_len,
                                                          "response": fmt.response_len})
  return program_lib.against_reference(exp, "quark", c.rounds * c.steps_per_round,
                                       functools.partial(train_step, kl_coef=c.kl_coef), batch)


def run(config, workdir: str) -> Any:
  exp = experiment.prepare(config, workdir)
  c, fmt = config.quark, config.format
  if c.num_bins < 2 or c.prompts_per_round < c.num_bins:
    raise ConfigError(f"quark.num_bins must be >= 2 and <= quark.prompts_per_round, got "
                      f"{c.num_bins} and {c.prompts_per_round}")
  ref_params = loaders.load_policy(exp)
  reward_params, _ = loaders.load_reward_model(exp)
  par = exp.parallel
  prog = program(exp)
  state, step_fn = prog.init(loaders.policy_init(exp, prog.tx), ref_params), prog.step
  held_ref = None if exp.lora.applies_to("policy") else ref_params  # None: the policy's base.
  examples = exp.splits["unlabeled"]
  with_gold = pipeline.has_gold(examples)  # Real data has no gold reward: `quark/gold` is left out.
  plain = pipeline.encode_prompts(exp.tokenizer, examples, fmt.prompt_len)
  controlled = pipeline.encode_prompts(exp.tokenizer, examples, fmt.prompt_len,
                                       [c.control] * len(examples))
  key = jax.random.fold_in(jax.random.key(config.seed), rng_streams.QUARK)
  task_dir = exp.task_dir("quark")
  ckpt = checkpoint.Checkpointer(f"{task_dir}/checkpoints", 1, config.checkpoint.keep)
  writer = metrics_lib.MetricWriter(task_dir, "metrics")
  meta = {"model": dataclasses.asdict(exp.model), "format": config.format.to_dict(),
          "data": config.data.to_dict(), "quark": c.to_dict(),
          **exp.lora_meta("policy"), **exp.remat_meta("policy")}
  state = loop.restore_if_any(ckpt, state, meta)

  def one_round(state, r):
    idx = pipeline.batch_indices(len(examples), c.prompts_per_round, config.seed, r)
    round_key = jax.random.fold_in(key, r)
    sampler = engine.rollout_params(exp, state.params, c.sample_batch_size)  # One per round.
    parts = [(engine.sample_batch(sampler, b, jax.random.fold_in(round_key, i), exp,
                                  c.temperature), n)
             for i, (b, n) in enumerate(pipeline.fixed_batches(pipeline.take(controlled, idx),
                                                               c.sample_batch_size))]
    response = np.concatenate([to_host(p["response"])[:n] for p, n in parts])
    response_mask = np.concatenate([to_host(p["response_mask"])[:n] for p, n in parts])
    answers = {**pipeline.take(plain, idx), "response": response, "response_mask": response_mask}
    scores = np.concatenate([to_host(score_batch(reward_params, b, exp.model))[:n]
                             for b, n in pipeline.fixed_batches(answers, c.sample_batch_size)])
    keep = top_quantile(scores, c.num_bins)  # The pool, reset every round.
    top = idx[keep]
    pool = {"prompt": controlled["prompt"][top], "prompt_mask": controlled["prompt_mask"][top],
            "ref_prompt": plain["prompt"][top], "ref_prompt_mask": plain["prompt_mask"][top],
            "response": response[keep], "response_mask": response_mask[keep]}
    for s in range(c.steps_per_round):
      b = pipeline.batch_indices(len(keep), min(c.batch_size, len(keep)), config.seed + r, s)
      state, m = step_fn(state, held_ref, par.put_batch(pool, b))
    m = {k: float(v) for k, v in m.items()}
    m.update({"quark/score": float(scores.mean()), "quark/pool_score": float(scores[keep].mean())})
    if with_gold:
      texts = engine.decode(exp, response)
      m["quark/gold"] = float(gold.gold_rewards([examples[i] for i in idx], texts).mean())
    shown = f"  gold {m['quark/gold']:.3f}" if with_gold else ""
    metrics_lib.info(f"quark round {r + 1}: RM score {m['quark/score']:.3f} (pool "
                     f"{m['quark/pool_score']:.3f}){shown}  KL {m['train/kl']:.3f}")
    return state.replace(step=jnp.asarray(r + 1, jnp.int32)), m

  state = loop.run(state, c.rounds, one_round, lambda state, done, m: m, ckpt, writer,
                   c.steps_per_round * c.batch_size * (fmt.prompt_len + fmt.response_len), "quark",
                   meta, c.skip_nonfinite)
  writer.close()
  ckpt.close()
  outputs.save_policy(exp, "quark", state.params, ref_params, control=c.control)
  return state
