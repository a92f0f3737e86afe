"""Direct preference optimisation (task=dpo; Rafailov et al.), with IPO (Azar et al.) and the
reference-free SimPO (task=simpo; Meng et al. 2024) as options.

The policy starts from SFT and learns from the comparisons directly. With the frozen SFT policy as
reference and h = [log π(c) − log π_ref(c)] − [log π(r) − log π_ref(r)] (sums over response tokens
of the chosen c and rejected r responses):

  sigmoid (DPO):  loss = −log σ(β h)           (with label smoothing ε: the conservative-DPO mix)
  ipo:            loss = (h − 1/(2β))²

SimPO has no reference: its reward is the policy's length-normalised log-probability,
r(y) = β/|y| · log π(y) (|y| the response's real tokens, eos included), and a target margin
γ = `gamma_beta_ratio` · β separates the pair:

  simpo:          loss = −log σ(r(c) − r(r) − γ)   (label smoothing ε as for sigmoid)

One jitted step evaluates the policy (and for DPO and IPO the reference) on chosen and rejected in
one batch. The implicit rewards are logged like TRL's rewards/chosen, rewards/rejected,
rewards/margins and rewards/accuracies, beside logps/chosen and logps/rejected (sums over the
response; SimPO's per token, as TRL's CPOTrainer logs them). task=simpo is this module under `config.simpo` (SimPO's
defaults), in its own folder; any loss runs under either block. At the end the policy answers the
test prompts for task=eval.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from rlhfjax.data import pipeline
from rlhfjax.errors import ConfigError
from rlhfjax.models import lora
from rlhfjax.models import policy
from rlhfjax.models.config import ModelConfig
from rlhfjax.rollout import outputs
from rlhfjax.training import checkpoint
from rlhfjax.training import experiment
from rlhfjax.training import loaders
from rlhfjax.training import loop
from rlhfjax.training import metrics as metrics_lib
from rlhfjax.training import program as program_lib
from rlhfjax.training.state import TrainState

REFERENCE_LOSSES = ("sigmoid", "ipo")  # Against the reference policy (online DPO takes these).
LOSSES = REFERENCE_LOSSES + ("simpo",)


def _smoothed_sigmoid_loss(logits: jax.Array, label_smoothing: float) -> jax.Array:
  """−log σ(logits), mixed with −log σ(−logits) at weight ε (the conservative-DPO loss)."""
  return (-(1 - label_smoothing) * jax.nn.log_sigmoid(logits)
          - label_smoothing * jax.nn.log_sigmoid(-logits))


def _reward_stats(r_c: jax.Array, r_r: jax.Array) -> dict[str, jax.Array]:
  """TRL's metrics of the implicit rewards of chosen and rejected responses [B]."""
  return {"rewards/chosen": r_c.mean(), "rewards/rejected": r_r.mean(),
          "rewards/margins": (r_c - r_r).mean(),
          "rewards/accuracies": (r_c > r_r).astype(jnp.float32).mean()}


def dpo_loss(logp_chosen: jax.Array, logp_rejected: jax.Array, ref_chosen: jax.Array,
             ref_rejected: jax.Array, beta: float, loss_type: str = "sigmoid",
             label_smoothing: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean DPO/IPO loss from per-sequence log-probs [B], and TRL-style implicit-reward metrics."""
  chosen = logp_chosen - ref_chosen
  rejected = logp_rejected - ref_rejected
  h = chosen - rejected
  if loss_type == "sigmoid":
    losses = _smoothed_sigmoid_loss(beta * h, label_smoothing)
  elif loss_type == "ipo":
    losses = jnp.square(h - 1.0 / (2.0 * beta))
  else:
    raise ValueError(f"unknown DPO loss {loss_type!r}; expected one of {REFERENCE_LOSSES}")
  return losses.mean(), _reward_stats(beta * chosen, beta * rejected)


def simpo_loss(logp_chosen: jax.Array, logp_rejected: jax.Array, len_chosen: jax.Array,
               len_rejected: jax.Array, beta: float, gamma_beta_ratio: float,
               label_smoothing: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean SimPO loss from per-sequence log-prob sums and lengths in tokens [B] (no reference), and
  TRL-style metrics of its reward β · (log π / |y|) and of the per-token log-probs."""
  chosen = logp_chosen / jnp.maximum(len_chosen, 1)
  rejected = logp_rejected / jnp.maximum(len_rejected, 1)
  r_c, r_r = beta * chosen, beta * rejected
  losses = _smoothed_sigmoid_loss(r_c - r_r - gamma_beta_ratio * beta, label_smoothing)
  return losses.mean(), {**_reward_stats(r_c, r_r), "logps/chosen": chosen.mean(),
                         "logps/rejected": rejected.mean()}


def _both(batch: pipeline.Batch) -> pipeline.Batch:
  """Chosen and rejected stacked into one batch of prompt + response."""
  return {"prompt": jnp.concatenate([batch["prompt"]] * 2),
          "prompt_mask": jnp.concatenate([batch["prompt_mask"]] * 2),
          "response": jnp.concatenate([batch["chosen"], batch["rejected"]]),
          "response_mask": jnp.concatenate([batch["chosen_mask"], batch["rejected_mask"]])}


def train_step(state: TrainState, ref_params: Any, batch: pipeline.Batch, *, cfg: ModelConfig,
               c: Any, tx: optax.GradientTransformation) -> tuple[TrainState, dict[str, jax.Array]]:
  """One AdamW step on the DPO, IPO or SimPO loss of a batch of comparisons (`ref_params` None:
  the LoRA policy's base is the reference; SimPO reads no reference and runs no forward of it)."""
  both = _both(batch)
  n = batch["prompt"].shape[0]
  if c.loss_type == "simpo":
    lengths = both["response_mask"].sum(-1)

    def loss_fn(params):
      logp = policy.response_logprobs(params, both, cfg).sum(-1)
      return simpo_loss(logp[:n], logp[n:], lengths[:n], lengths[n:], c.beta,
                        c.gamma_beta_ratio, c.label_smoothing)
  else:
    ref_params = lora.reference(state.params, ref_params)
    ref = jax.lax.stop_gradient(policy.response_logprobs(ref_params, both, cfg).sum(-1))

    def loss_fn(params):
      logp = policy.response_logprobs(params, both, cfg).sum(-1)
      loss, m = dpo_loss(logp[:n], logp[n:], ref[:n], ref[n:], c.beta, c.loss_type,
                         c.label_smoothing)
      return loss, {**m, "logps/chosen": logp[:n].mean(), "logps/rejected": logp[n:].mean()}

  (loss, m), grads = lora.value_and_grad(loss_fn, has_aux=True)(state.params)
  state = state.apply_gradients(grads, tx)
  return state, {"train/loss": loss, "train/grad_norm": optax.tree.norm(grads), **m}


def num_steps(c: Any, task: str, pairs: int) -> int:
  """The steps of `epochs` over `pairs` comparisons in batches of `batch_size` (block `c`)."""
  steps = int(c.epochs * pairs) // c.batch_size
  if steps <= 0:
    raise ConfigError(f"{task}.batch_size ({c.batch_size}) exceeds {task}.epochs x {pairs} pairs")
  return steps


def program(exp: experiment.Experiment, task: str, steps: int) -> program_lib.Program:
  """The update step `train(exp, task)` runs (dpo or simpo, under its config block) for `steps`
  steps: AdamW over them, the policy with its adapters and remat policy, and the reference tree
  where the loss reads one and the policy is not a LoRA policy (whose base is its reference)."""
  c, fmt = exp.config[task], exp.config.format
  batch = program_lib.tokens(exp.parallel, c.batch_size, {"prompt": fmt.prompt_len,
                                                          "chosen": fmt.response_len,
                                                          "rejected": fmt.response_len})
  return program_lib.against_reference(exp, task, steps, functools.partial(train_step, c=c),
                                       batch, with_ref=c.loss_type in REFERENCE_LOSSES)


def train(exp: experiment.Experiment, task: str = "dpo") -> TrainState:
  """Trains (or resumes) `task` (dpo or simpo, under its config block) in `<workdir>/<task>` on
  the comparison files of task=rm."""
  config, c, fmt = exp.config, exp.config[task], exp.config.format
  if c.loss_type not in LOSSES:
    raise ConfigError(f"{task}.loss_type must be one of {LOSSES}, got {c.loss_type!r}")
  if c.loss_type == "ipo" and c.label_smoothing > 0:
    raise ConfigError(f"{task}.label_smoothing ({c.label_smoothing}) has no meaning for IPO's "
                      f"squared loss ({task}.loss_type='ipo'); set it to 0")
  files = loaders.comparison_files(exp)
  comps = loaders.load_comparisons(files["train"], config.rm.layout,
                                   columns=loaders.columns(exp))
  data = pipeline.encode_comparisons(exp.tokenizer, comps, fmt.prompt_len, fmt.response_len)
  steps = num_steps(c, task, len(comps))
  ref_params = loaders.load_policy(exp)
  par = exp.parallel
  prog = program(exp, task, steps)
  state, step_fn = prog.init(loaders.policy_init(exp, prog.tx), ref_params), prog.step
  reference_free = c.loss_type not in REFERENCE_LOSSES
  if reference_free or exp.lora.applies_to("policy"):
    ref_params = None  # SimPO needs none; a LoRA policy's own base is its reference.
  task_dir = exp.task_dir(task)
  ckpt = checkpoint.Checkpointer(f"{task_dir}/checkpoints", config.checkpoint.every,
                                 config.checkpoint.keep)
  writer = metrics_lib.MetricWriter(task_dir, "metrics")
  meta = {"model": dataclasses.asdict(exp.model), "files": loaders.files_meta(exp, files),
          task: {k: v for k, v in c.items() if k != "log_every"}, **exp.lora_meta("policy"),
          **exp.remat_meta("policy")}
  state = loop.restore_if_any(ckpt, state, meta)

  def one_step(state, step):
    idx = pipeline.batch_indices(len(comps), c.batch_size, config.seed, step)
    return step_fn(state, ref_params, par.put_batch(data, idx))

  def periodic(state, done, m) -> dict[str, float]:
    return {k: float(v) for k, v in m.items()} if done % c.log_every == 0 or done == steps else {}

  forwards = 2 if reference_free else 4  # Chosen and rejected, through the policy (and reference).
  state = loop.run(state, steps, one_step, periodic, ckpt, writer,
                   forwards * c.batch_size * (fmt.prompt_len + fmt.response_len), task, meta,
                   c.skip_nonfinite)
  writer.close()
  ckpt.close()
  return state


def load_policy(exp: experiment.Experiment, task: str = "dpo") -> Any:
  """The policy of the finished `task` run (dpo or simpo) in `<workdir>/<task>`, adapters
  merged."""
  files = loaders.comparison_files(exp)
  pairs = len(loaders.load_comparisons(files["train"], exp.config.rm.layout,
                                       columns=loaders.columns(exp)))
  return loaders.load_policy(exp, task, num_steps(exp.config[task], task, pairs))


def run(config, workdir: str, task: str = "dpo") -> TrainState:
  """`train`, then the policy answers the test prompts for task=eval (in `<workdir>/<task>`)."""
  exp = experiment.prepare(config, workdir)
  state = train(exp, task)
  outputs.save_policy(exp, task, state.params, loaders.load_policy(exp))
  return state
