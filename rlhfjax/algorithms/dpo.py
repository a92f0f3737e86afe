"""Direct preference optimisation (task=dpo; Rafailov et al.), with IPO (Azar et al.) as an option.

The policy starts from SFT and learns from the comparisons directly, with the frozen SFT policy as
reference. With h = [log π(c) − log π_ref(c)] − [log π(r) − log π_ref(r)] (sums over response tokens
of the chosen c and rejected r responses):

  sigmoid (DPO):  loss = −log σ(β h)           (with label smoothing ε: the conservative-DPO mix)
  ipo:            loss = (h − 1/(2β))²

One jitted step evaluates policy and reference on chosen and rejected in one batch. The implicit
reward β (log π − log π_ref) is logged like TRL's rewards/chosen, rewards/rejected, rewards/margins
and rewards/accuracies. At the end the policy answers the test prompts for task=eval.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from rlhfjax.algorithms import reward_model
from rlhfjax.algorithms import sft
from rlhfjax.data import pipeline
from rlhfjax.errors import ConfigError
from rlhfjax.models import lora
from rlhfjax.models import policy
from rlhfjax.models.config import ModelConfig
from rlhfjax.rollout import outputs
from rlhfjax.training import checkpoint
from rlhfjax.training import experiment
from rlhfjax.training import loop
from rlhfjax.training import metrics as metrics_lib
from rlhfjax.training import optimizer
from rlhfjax.training.state import TrainState

LOSSES = ("sigmoid", "ipo")


def dpo_loss(logp_chosen: jax.Array, logp_rejected: jax.Array, ref_chosen: jax.Array,
             ref_rejected: jax.Array, beta: float, loss_type: str = "sigmoid",
             label_smoothing: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean DPO/IPO loss from per-sequence log-probs [B], and TRL-style implicit-reward metrics."""
  chosen = logp_chosen - ref_chosen
  rejected = logp_rejected - ref_rejected
  h = chosen - rejected
  if loss_type == "sigmoid":
    losses = (-(1 - label_smoothing) * jax.nn.log_sigmoid(beta * h)
              - label_smoothing * jax.nn.log_sigmoid(-beta * h))
  elif loss_type == "ipo":
    losses = jnp.square(h - 1.0 / (2.0 * beta))
  else:
    raise ValueError(f"unknown DPO loss {loss_type!r}; expected one of {LOSSES}")
  r_c, r_r = beta * chosen, beta * rejected
  return losses.mean(), {"rewards/chosen": r_c.mean(), "rewards/rejected": r_r.mean(),
                         "rewards/margins": (r_c - r_r).mean(),
                         "rewards/accuracies": (r_c > r_r).astype(jnp.float32).mean()}


def _both(batch: pipeline.Batch) -> pipeline.Batch:
  """Chosen and rejected stacked into one batch of prompt + response."""
  return {"prompt": jnp.concatenate([batch["prompt"]] * 2),
          "prompt_mask": jnp.concatenate([batch["prompt_mask"]] * 2),
          "response": jnp.concatenate([batch["chosen"], batch["rejected"]]),
          "response_mask": jnp.concatenate([batch["chosen_mask"], batch["rejected_mask"]])}


def train_step(state: TrainState, ref_params: Any, batch: pipeline.Batch, *, cfg: ModelConfig,
               c: Any, tx: optax.GradientTransformation) -> tuple[TrainState, dict[str, jax.Array]]:
  """One AdamW step on the DPO (or IPO) loss of a batch of comparisons (`ref_params` None: the
  LoRA policy's base is the reference)."""
  both = _both(batch)
  n = batch["prompt"].shape[0]
  ref_params = lora.reference(state.params, ref_params)
  ref = jax.lax.stop_gradient(policy.response_logprobs(ref_params, both, cfg).sum(-1))

  def loss_fn(params):
    logp = policy.response_logprobs(params, both, cfg).sum(-1)
    return dpo_loss(logp[:n], logp[n:], ref[:n], ref[n:], c.beta, c.loss_type, c.label_smoothing)

  (loss, m), grads = lora.value_and_grad(loss_fn, has_aux=True)(state.params)
  state = state.apply_gradients(grads, tx)
  return state, {"train/loss": loss, "train/grad_norm": optax.tree.norm(grads), **m}


def train(exp: experiment.Experiment) -> TrainState:
  """Trains (or resumes) DPO in `<workdir>/dpo` on the comparison files of task=rm."""
  config, c, fmt = exp.config, exp.config.dpo, exp.config.format
  if c.loss_type not in LOSSES:
    raise ConfigError(f"dpo.loss_type must be one of {LOSSES}, got {c.loss_type!r}")
  files = reward_model.comparison_files(exp)
  comps = reward_model.load_comparisons(files["train"], config.rm.layout)
  data = pipeline.encode_comparisons(exp.tokenizer, comps, fmt.prompt_len, fmt.response_len)
  steps = int(c.epochs * len(comps)) // c.batch_size
  if steps <= 0:
    raise ConfigError(f"dpo.batch_size ({c.batch_size}) exceeds dpo.epochs x {len(comps)} pairs")
  cfg = dataclasses.replace(exp.model_for("policy"), dropout=0.0)
  ref_params = sft.load_policy(exp)
  par = exp.parallel
  par.check_batch("dpo.batch_size", c.batch_size)
  tx = optimizer.adamw(c, steps, exp.trainable("policy"))
  state, shardings = sft.policy_state(exp, tx, ref_params)
  if exp.lora.applies_to("policy"):
    ref_params = None  # The policy's own base: one backbone.
  step_fn = par.jit(functools.partial(train_step, cfg=cfg, c=c, tx=tx),
                    (shardings, None if ref_params is None else shardings.params, par.batch),
                    (shardings, par.replicated), (0,))
  task_dir = exp.task_dir("dpo")
  ckpt = checkpoint.Checkpointer(f"{task_dir}/checkpoints", config.checkpoint.every,
                                 config.checkpoint.keep)
  writer = metrics_lib.MetricWriter(task_dir, "metrics")
  meta = {"model": dataclasses.asdict(exp.model), "files": reward_model.files_meta(exp, files),
          "dpo": {k: v for k, v in c.items() if k != "log_every"}, **exp.lora_meta("policy"),
          **exp.remat_meta("policy")}
  state = loop.restore_if_any(ckpt, state, meta)

  def one_step(state, step):
    idx = pipeline.batch_indices(len(comps), c.batch_size, config.seed, step)
    return step_fn(state, ref_params, par.put_batch(data, idx))

  def periodic(state, done, m) -> dict[str, float]:
    return {k: float(v) for k, v in m.items()} if done % c.log_every == 0 or done == steps else {}

  state = loop.run(state, steps, one_step, periodic, ckpt, writer,
                   4 * c.batch_size * (fmt.prompt_len + fmt.response_len), "dpo", meta,
                   c.get("skip_nonfinite", 0))
  writer.close()
  ckpt.close()
  return state


def run(config, workdir: str) -> TrainState:
  exp = experiment.prepare(config, workdir)
  state = train(exp)
  outputs.save_policy(exp, "dpo", state.params, sft.load_policy(exp))
  return state
