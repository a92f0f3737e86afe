"""Kahneman–Tversky optimisation (task=kto; Ethayarajh et al. 2024, "KTO: Model Alignment as
Prospect Theoretic Optimization"; TRL's KTOTrainer, loss_type 'kto').

KTO learns from responses judged one at a time, desirable or undesirable (binary feedback), not
from pairs. The policy starts from SFT, with the frozen SFT policy as reference. For a response y
to x, with r = log π(y|x) − log π_ref(y|x) (sums over the response's tokens), the reference point
z0 is the policy's KL to the reference, estimated on the batch itself as TRL does: each prompt
paired with another row's response (row i with the response of row i − 1, the batch rotated by
one), z0 = max(0, mean over the batch of log π(y'|x) − log π_ref(y'|x)), with no gradient. Then

  desirable:    λ_D · (1 − σ(β (r − z0)))
  undesirable:  λ_U · (1 − σ(β (z0 − r)))

averaged over the batch (λ_D = `desirable_weight`, λ_U = `undesirable_weight`). The rotation is
of the whole global batch; TRL rotates each device's share and averages those estimates, the same
estimator over different mismatched pairs.

The feedback (`kto.feedback`): 'pairs', the comparison files of task=rm split into their chosen
responses (desirable) and rejected ones (undesirable), as in the paper's own experiments and TRL's
handling of paired data; or 'binary', a file in the binary layout (`data/records.py`), by default
task=label's with `label.protocol=binary`. One jitted step runs the policy on the matched rows
(with its gradient) and on the mismatched ones, and the reference on both. Logged like TRL:
`kl` (z0), rewards/chosen and rewards/rejected (β r of the desirable and undesirable responses),
rewards/margins, logps/chosen and logps/rejected (sums over the response); a side the batch lacks
is left out of that step's line, as TRL leaves it out. At the end the policy answers the test
prompts for task=eval.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import optax

from rlhfjax.data import pipeline
from rlhfjax.data import records
from rlhfjax.data import tables
from rlhfjax.errors import ConfigError, DataError
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

FEEDBACK = ("pairs", "binary")
# The paper's Eq. 8: λ_D n_D / (λ_U n_U) in [1, 4/3] (TRL warns outside it).
BALANCE = (1.0, 4.0 / 3.0)


def _mean_where(x: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean of `x` where `mask` holds; NaN where it holds nowhere."""
  n = mask.sum()
  return jnp.where(n > 0, jnp.where(mask, x, 0.0).sum() / jnp.maximum(n, 1), jnp.nan)


def kto_loss(logp: jax.Array, ref_logp: jax.Array, kl_logp: jax.Array, kl_ref_logp: jax.Array,
             desirable: jax.Array, beta: float, desirable_weight: float = 1.0,
             undesirable_weight: float = 1.0) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean KTO loss from per-sequence log-probs [B] of the policy and the reference on the matched
  (`logp`, `ref_logp`) and mismatched (`kl_logp`, `kl_ref_logp`) pairs, and TRL-style metrics."""
  ratio = logp - ref_logp
  z0 = jax.lax.stop_gradient(jnp.maximum((kl_logp - kl_ref_logp).mean(), 0.0))
  # 1 − σ(t) = σ(−t).
  losses = jnp.where(desirable, desirable_weight * jax.nn.sigmoid(-beta * (ratio - z0)),
                     undesirable_weight * jax.nn.sigmoid(-beta * (z0 - ratio)))
  rewards = beta * jax.lax.stop_gradient(ratio)
  undesirable = ~desirable
  chosen, rejected = _mean_where(rewards, desirable), _mean_where(rewards, undesirable)
  return losses.mean(), {
      "kl": z0, "rewards/chosen": chosen, "rewards/rejected": rejected,
      "rewards/margins": chosen - rejected,
      "logps/chosen": _mean_where(jax.lax.stop_gradient(logp), desirable),
      "logps/rejected": _mean_where(jax.lax.stop_gradient(logp), undesirable)}


def _mismatched(batch: pipeline.Batch) -> pipeline.Batch:
  """TRL's KL pairs: each prompt with the response of the row before it (the last row's for the
  first)."""
  return {"prompt": batch["prompt"], "prompt_mask": batch["prompt_mask"],
          "response": jnp.roll(batch["response"], 1, axis=0),
          "response_mask": jnp.roll(batch["response_mask"], 1, axis=0)}


def train_step(state: TrainState, ref_params: Any, batch: pipeline.Batch, *, cfg: ModelConfig,
               c: Any, tx: optax.GradientTransformation) -> tuple[TrainState, dict[str, jax.Array]]:
  """One AdamW step on the KTO loss of a batch of binary feedback (`ref_params` None: the LoRA
  policy's base is the reference)."""
  matched = {k: batch[k] for k in ("prompt", "prompt_mask", "response", "response_mask")}
  mismatched = _mismatched(batch)
  n = batch["prompt"].shape[0]
  both = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), matched, mismatched)
  ref_params = lora.reference(state.params, ref_params)
  ref = jax.lax.stop_gradient(policy.response_logprobs(ref_params, both, cfg).sum(-1))
  kl_logp = jax.lax.stop_gradient(policy.response_logprobs(state.params, mismatched, cfg).sum(-1))

  def loss_fn(params):
    logp = policy.response_logprobs(params, matched, cfg).sum(-1)
    return kto_loss(logp, ref[:n], kl_logp, ref[n:], batch["label"], c.beta,
                    c.desirable_weight, c.undesirable_weight)

  (loss, m), grads = lora.value_and_grad(loss_fn, has_aux=True)(state.params)
  state = state.apply_gradients(grads, tx)
  return state, {"train/loss": loss, "train/grad_norm": optax.tree.norm(grads), **m}


def balance(n_desirable: int, n_undesirable: int, desirable_weight: float,
            undesirable_weight: float) -> str:
  """The counts of each kind, and, when λ_D n_D / (λ_U n_U) lies outside `BALANCE`, the weights
  that would bring it inside (either one, not both), as TRL advises."""
  line = f"{n_desirable} desirable and {n_undesirable} undesirable responses"
  if not n_desirable or not n_undesirable:
    return line + " (one kind only: rewards/margins is not logged)"
  ratio = desirable_weight * n_desirable / (undesirable_weight * n_undesirable)
  if BALANCE[0] <= ratio <= BALANCE[1]:
    return line
  d = undesirable_weight * n_undesirable / n_desirable
  u = desirable_weight * n_desirable / n_undesirable
  return (f"{line}; desirable_weight x {n_desirable} / (undesirable_weight x {n_undesirable}) = "
          f"{ratio:.2f}, outside KTO's [1, 4/3]: set kto.desirable_weight in "
          f"[{d * BALANCE[0]:.2f}, {d * BALANCE[1]:.2f}] or kto.undesirable_weight in "
          f"[{u / BALANCE[1]:.2f}, {u / BALANCE[0]:.2f}]")


def _binary_file(path: str, layout: str = records.BINARY,
                 columns: dict[str, str] | None = None) -> list[records.Feedback]:
  """The good records of a file of binary feedback (`kto.layout`: 'binary' or TRL's unpaired
  'trl'; any file `records.read_binary` takes); the malformed ones are left out and named."""
  if not os.path.exists(path) and not tables.is_pattern(path):
    raise FileNotFoundError(f"binary feedback file not found: {path} (run task=label with "
                            "label.protocol=binary, or set kto.train_file)")
  items, problems = records.read_binary(path, layout, columns if layout == records.TRL else None)
  if not items:
    first = f": {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
    raise DataError(f"{path} holds no binary feedback" + (first if problems else ": it is empty"))
  metrics_lib.info(f"{path}: read {len(items) + len(problems)} records, kept {len(items)}" +
                   (f" ({len(problems)} malformed left out)" if problems else ""))
  for p in problems[:5]:
    metrics_lib.info(f"  malformed: {p}")
  return items


def load_feedback(exp: experiment.Experiment) -> tuple[list[records.Feedback], str]:
  """The training feedback `kto.feedback` names, and the file it came from."""
  c = exp.config.kto
  if c.feedback == "pairs":
    path = loaders.comparison_files(exp)["train"]
    return records.unpaired(loaders.load_comparisons(
        path, exp.config.rm.layout, columns=loaders.columns(exp))), path
  if c.feedback == "binary":
    path = c.train_file or os.path.join(exp.workdir, "label", "binary_train.jsonl")
    # kto.layout: optional (the configs of TRL-layout files set it); kept out of tldr_sim.py, as
    # the run's meta records the kto block (a new key there refuses resuming an older run).
    return _binary_file(path, c.get("layout", records.BINARY), loaders.columns(exp)), path
  raise ConfigError(f"kto.feedback must be one of {FEEDBACK}, got {c.feedback!r}")


def program(exp: experiment.Experiment, steps: int) -> program_lib.Program:
  """The update step `train` runs for `steps` steps: AdamW over them, the policy with its adapters
  and remat policy, and the reference tree unless the policy is a LoRA policy (whose base is its
  reference)."""
  c, fmt, par = exp.config.kto, exp.config.format, exp.parallel
  batch = {**program_lib.tokens(par, c.batch_size, {"prompt": fmt.prompt_len,
                                                    "response": fmt.response_len}),
           "label": jax.ShapeDtypeStruct((c.batch_size,), jnp.bool_, sharding=par.batch)}
  return program_lib.against_reference(exp, "kto", steps, functools.partial(train_step, c=c),
                                       batch)


def train(exp: experiment.Experiment) -> TrainState:
  """Trains (or resumes) KTO in `<workdir>/kto` on the feedback of `kto.feedback`."""
  config, c, fmt = exp.config, exp.config.kto, exp.config.format
  if c.batch_size < 2:
    raise ConfigError(f"kto.batch_size must be at least 2 (the KL estimate pairs each prompt with "
                      f"another row's response), got {c.batch_size}")
  feedback, path = load_feedback(exp)
  n_desirable = sum(f.label for f in feedback)
  metrics_lib.info("kto: " + balance(n_desirable, len(feedback) - n_desirable,
                                     c.desirable_weight, c.undesirable_weight))
  data = pipeline.encode_feedback(exp.tokenizer, feedback, fmt.prompt_len, fmt.response_len)
  steps = int(c.epochs * len(feedback)) // c.batch_size
  if steps <= 0:
    raise ConfigError(f"kto.batch_size ({c.batch_size}) exceeds kto.epochs x {len(feedback)} "
                      "responses")
  ref_params = loaders.load_policy(exp)
  par = exp.parallel
  prog = program(exp, steps)
  state, step_fn = prog.init(loaders.policy_init(exp, prog.tx), ref_params), prog.step
  if exp.lora.applies_to("policy"):
    ref_params = None  # A LoRA policy's own base is its reference.
  task_dir = exp.task_dir("kto")
  ckpt = checkpoint.Checkpointer(f"{task_dir}/checkpoints", config.checkpoint.every,
                                 config.checkpoint.keep)
  writer = metrics_lib.MetricWriter(task_dir, "metrics")
  meta = {"model": dataclasses.asdict(exp.model),
          "files": loaders.files_meta(exp, {"train": path}),
          "kto": {k: v for k, v in c.items() if k != "log_every"}, **exp.lora_meta("policy"),
          **exp.remat_meta("policy")}
  state = loop.restore_if_any(ckpt, state, meta)

  def one_step(state, step):
    idx = pipeline.batch_indices(len(feedback), c.batch_size, config.seed, step)
    return step_fn(state, ref_params, par.put_batch(data, idx))

  def periodic(state, done, m) -> dict[str, float]:
    if done % c.log_every and done != steps:
      return {}
    return {k: float(v) for k, v in m.items() if not math.isnan(float(v))}

  # Matched and mismatched rows, through the policy and the reference.
  state = loop.run(state, steps, one_step, periodic, ckpt, writer,
                   4 * c.batch_size * (fmt.prompt_len + fmt.response_len), "kto", meta,
                   c.skip_nonfinite)
  writer.close()
  ckpt.close()
  return state


def run(config, workdir: str) -> TrainState:
  """`train`, then the policy answers the test prompts for task=eval (in `<workdir>/kto`)."""
  exp = experiment.prepare(config, workdir)
  state = train(exp)
  outputs.save_policy(exp, "kto", state.params, loaders.load_policy(exp))
  return state
