"""Supervised fine-tuning (the SFT baseline): maximise log p(reference | prompt).

The loss is the mean negative log-likelihood over summary tokens only (eos included, padding and
prompt excluded). One jitted pure step; the loop around it logs, validates, checkpoints and resumes.
At the end the policy answers the test prompts (`<workdir>/sft/outputs.json`); task=sft then runs
`evaluation/sft_report.py`, which compares them with the reference and the extractive baselines on
gold reward and ROUGE-L.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlhfjax import rng_streams
from rlhfjax.data import pipeline
from rlhfjax.errors import DataError
from rlhfjax.models import lora
from rlhfjax.models import policy
from rlhfjax.models import pretrained
from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig
from rlhfjax.rollout import engine
from rlhfjax.rollout import outputs
from rlhfjax.training import checkpoint
from rlhfjax.training import experiment
from rlhfjax.training import loaders
from rlhfjax.training import loop
from rlhfjax.training import metrics as metrics_lib
from rlhfjax.training import optimizer
from rlhfjax.training import program as program_lib
from rlhfjax.training.state import TrainState


def response_nll(params, batch: pipeline.Batch, cfg: ModelConfig,
                 dropout_rng: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Summed negative log-likelihood of the response tokens, and their count."""
  logp = policy.response_logprobs(params, batch, cfg, dropout_rng)
  return -logp.sum(), batch["response_mask"].astype(jnp.float32).sum()


def train_step(state: TrainState, batch: pipeline.Batch, rng: jax.Array, *, cfg: ModelConfig,
               tx: optax.GradientTransformation) -> tuple[TrainState, dict[str, jax.Array]]:
  """One AdamW step on the mean response-token NLL of `batch`."""

  def loss_fn(params):
    nll, n = response_nll(params, batch, cfg, rng if cfg.dropout > 0 else None)
    return nll / jnp.maximum(n, 1.0)

  loss, grads = lora.value_and_grad(loss_fn)(state.params)
  state = state.apply_gradients(grads, tx)
  return state, {"train/loss": loss, "train/grad_norm": optax.tree.norm(grads)}


def program(exp: experiment.Experiment, task: str = "sft") -> program_lib.Program:
  """The update step `train(exp, task)` runs: config block `task`'s batch and AdamW schedule over
  its `steps`, the model `loaders.model_kind(task)` with its adapters and remat policy."""
  c, fmt, par = exp.config[task], exp.config.format, exp.parallel
  par.check_batch(f"{task}.batch_size", c.batch_size)
  kind = loaders.model_kind(task)
  tx = optimizer.adamw(c, c.steps, exp.trainable(kind))
  make = lambda k: TrainState.create(
      lora.adapt(k, transformer.init(k, exp.model), exp.lora, kind), tx)
  state, shardings = par.train_state(make, loaders.policy_axes(exp, task), tx, jax.random.key(0),
                                     abstract=True)
  step = par.jit(functools.partial(train_step, cfg=exp.model_for(kind), tx=tx),
                 (shardings, par.batch, par.replicated), (shardings, par.replicated), (0,))
  batch = program_lib.tokens(par, c.batch_size, {"prompt": fmt.prompt_len,
                                                 "response": fmt.response_len})
  return program_lib.Program(step, (state, batch, program_lib.key(par)), state, shardings, tx)


def data_digest(data: pipeline.Batch) -> str:
  """A short SHA-256 of a batch's arrays (names, shapes, dtypes and bytes), in name order."""
  h = hashlib.sha256()
  for name in sorted(data):
    a = np.ascontiguousarray(np.asarray(data[name]))
    h.update(f"{name}:{a.dtype}:{a.shape};".encode())
    h.update(a.tobytes())
  return h.hexdigest()[:16]


def train(exp: experiment.Experiment, task: str = "sft", data: pipeline.Batch | None = None,
          init_params: Any = None) -> TrainState:
  """Trains (or resumes) supervised fine-tuning in `<workdir>/<task>` and returns the final state.

  Optimisation settings come from config block `task`; `data` holds prompts and target responses
  (default: the SFT split and its references); training starts from `init_params` (default: a
  fresh model). Expert iteration, binary FeedME and reward conditioning are this loop on other data.
  """
  config, c = exp.config, exp.config[task]
  plen, rlen = config.format.prompt_len, config.format.response_len
  if data is None:
    if not exp.splits["sft"]:
      raise DataError(f"task={task}: no training example has a response to learn (data.source="
                      f"{config.data.source!r}, data.train_file={config.data.get('train_file')!r}"
                      "): SFT needs prompt-completion rows, preference rows (their chosen) or "
                      "unpaired rows labelled true; prompt-only data serves the RL tasks")
    data = pipeline.encode_sft(exp.tokenizer, exp.splits["sft"], plen, rlen)
  held = [e for e in exp.splits["validation"] if e.reference]  # Prompt-only rows: nothing to score.
  val = pipeline.encode_sft(exp.tokenizer, held[:c.eval_batches * c.batch_size], plen, rlen)
  n_train = len(data["prompt"])
  par = exp.parallel
  prog = program(exp, task)
  kind = loaders.model_kind(task)
  init_key, train_key = jax.random.split(jax.random.key(config.seed))
  lora_key = jax.random.fold_in(init_key, 1)
  adapt = lambda p: lora.adapt(lora_key, p, exp.lora, kind)
  if init_params is None:
    state = prog.init(lambda k: TrainState.create(adapt(transformer.init(k, exp.model)), prog.tx),
                      init_key)
  else:  # A new buffer on the mesh: the trained tree never aliases `init_params`.
    state = prog.init(lambda p: TrainState.create(adapt(p), prog.tx), init_params)
  step_fn = prog.step
  nll_fn = jax.jit(functools.partial(response_nll, cfg=exp.model))

  def validate(params) -> float:
    sums = [nll_fn(params, b) for b, _ in pipeline.fixed_batches(val, c.batch_size)]
    return float(sum(s for s, _ in sums) / sum(n for _, n in sums))

  task_dir = exp.task_dir(task)
  ckpt = checkpoint.Checkpointer(f"{task_dir}/checkpoints", config.checkpoint.every,
                                 config.checkpoint.keep)
  writer = metrics_lib.MetricWriter(task_dir, "metrics")
  # What determines the trained parameters; resuming under other values is refused. The data's
  # digest catches what the config does not name: a relabelled comparisons file (FeedME, reward
  # conditioning), new best-of-n winners (expert iteration), an edited train file.
  meta = {"model": dataclasses.asdict(exp.model), "format": config.format.to_dict(),
          "data": config.data.to_dict(), "training_data": data_digest(data),
          task: {k: v for k, v in c.items()
                 if k not in ("log_every", "eval_every", "eval_batches")},
          **exp.lora_meta(kind), **exp.remat_meta(kind)}
  state = loop.restore_if_any(ckpt, state, meta)
  tokens_per_step = c.batch_size * (plen + rlen)

  def one_step(state, step):
    batch = par.put_batch(data, pipeline.batch_indices(n_train, c.batch_size, config.seed, step))
    return step_fn(state, batch, jax.random.fold_in(train_key, step))

  def periodic(state, done, m) -> dict[str, float]:
    out = {}
    if done % c.log_every == 0 or done == c.steps:
      out.update({k: float(v) for k, v in m.items()})
    if done % c.eval_every == 0 or done == c.steps:
      out["val/loss"] = validate(state.params)
      metrics_lib.info(f"step {done}: train loss {float(m['train/loss']):.3f}  "
                       f"val loss {out['val/loss']:.3f}")
    return out

  state = loop.run(state, c.steps, one_step, periodic, ckpt, writer, tokens_per_step, task, meta,
                   c.skip_nonfinite)
  writer.close()
  ckpt.close()
  return state


def answer_test_prompts(exp: experiment.Experiment, params: Any) -> list[str]:
  """Samples the policy on the test prompts at the evaluation's settings and saves the answers as
  `<workdir>/sft/outputs.json` (with the share that ended with eos); `evaluation/sft_report.py`
  and task=eval read them."""
  e = exp.config.eval
  if e.num_examples <= 0:
    return []
  examples = outputs.test_examples(exp)
  prompts = pipeline.encode_prompts(exp.tokenizer, examples, exp.config.format.prompt_len)
  out = engine.generate_split(exp, params, prompts, jax.random.key(exp.config.seed + rng_streams.OUTPUTS),
                             e.batch_size, e.temperature, e.top_k, e.top_p)
  texts = [exp.tokenizer.decode(r).strip() for r in out["response"]]
  ended = np.isin(out["response"], exp.tokenizer.eos_ids).any(axis=1)
  outputs.save(exp, "sft", examples, texts, 0.0, temperature=e.temperature,
               ended_with_eos=float(ended.mean()), **outputs.pass_counts(exp, params, examples))
  return texts


def run(config, workdir: str) -> TrainState:
  """Trains the SFT policy (task=sft) and answers the test prompts with it."""
  exp = experiment.prepare(config, workdir)
  init = pretrained.params(exp.init_from, exp.model) if exp.init_from else None
  state = train(exp, init_params=init)
  answer_test_prompts(exp, state.params)
  return state
