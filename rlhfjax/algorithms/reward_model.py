"""Reward model (task=rm): a Bradley–Terry model of pairwise preferences, initialised from SFT.

The model is the SFT decoder with a scalar head read at the last real token of prompt + response
(the response's eos when it ended). For a comparison with chosen response c and rejected r,

  loss = -log sigmoid(r_θ(x, c) - r_θ(x, r)),

averaged over the batch; one epoch by default (Stiennon et al. found more epochs overfit).

With `rm.likelihood_weight` λ ≠ 0 the score is

  r_θ(x, y) = head(h_last) + λ · (1/|y|) Σ_t log π_θ(y_t | x, y_<t),

where π_θ is the model's own language-model head (the SFT policy's, at first) and λ is a learned
parameter starting at the config value: the length-normalised likelihood that RRHF and
SimPO use as an implicit reward, added to the scalar head and trained with it. The SFT model has
learned which details follow from a post (a wrong age or relation is unlikely under it); a small
head trained on a few thousand noisy pairs does not learn that check on its own
(docs/reward_model.md). λ = 0 is the head-only model of Stiennon et al. `rm.head_init_scale`
multiplies the head's initial kernel; at 0 a model with the likelihood term starts as the SFT
policy's likelihood judge rather than that judge plus a random head.

After training, the head's bias is shifted (and, with `normalize_std`, the head and λ are scaled)
so that the reference summaries (or the SFT samples) of the PREF posts score mean 0 (std 1): the
normalised model is saved in `<workdir>/rm/model` with the offsets in its metadata, and every later
stage reads rewards from it.

The score itself is `models/reward.score` (rollouts and every method read it there); the report on
what the model learned is `evaluation/rm_report.py`, which task=rm runs after this module.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlhfjax.algorithms import sft
from rlhfjax.data import pipeline
from rlhfjax.data import records
from rlhfjax.data import tables
from rlhfjax.errors import ConfigError, DataError
from rlhfjax.feedback import annotators
from rlhfjax.feedback import contrast
from rlhfjax.models.config import ModelConfig
from rlhfjax.models import heads
from rlhfjax.models import lora
from rlhfjax.models.reward import score, score_batch  # noqa: F401  (this module's API too)
from rlhfjax.models import transformer
from rlhfjax.parallel.sharding import to_host
from rlhfjax.rollout import reward_functions
from rlhfjax.training import checkpoint
from rlhfjax.training import experiment
from rlhfjax.training import loop
from rlhfjax.training import metrics as metrics_lib
from rlhfjax.training import optimizer
from rlhfjax.training.state import TrainState

NORMALIZE = ("reference", "sft", "none")
LIKELIHOOD = heads.LIKELIHOOD


def bradley_terry(r_chosen: jax.Array, r_rejected: jax.Array) -> dict[str, jax.Array]:
  """Mean Bradley–Terry loss `-log σ(r_c - r_r)`, accuracy (r_c > r_r) and mean margin."""
  margin = r_chosen - r_rejected
  return {"loss": -jax.nn.log_sigmoid(margin).mean(),
          "accuracy": (margin > 0).astype(jnp.float32).mean(), "margin": margin.mean()}


CONTRAST = "contrast_"  # Batch keys of the label-free contrastive pairs (`feedback.contrast`).


def _pairs(batch: pipeline.Batch, prefix: str = "") -> list[pipeline.Batch]:
  """The chosen and the rejected side of the pairs `prefix`* of `batch`, as response batches."""
  return [{"prompt": batch[prefix + "prompt"], "prompt_mask": batch[prefix + "prompt_mask"],
           "response": batch[prefix + side], "response_mask": batch[prefix + side + "_mask"]}
          for side in ("chosen", "rejected")]


def train_step(state: TrainState, batch: pipeline.Batch, *, cfg: ModelConfig,
               tx: optax.GradientTransformation,
               contrast_weight: float = 1.0) -> tuple[TrainState, dict[str, jax.Array]]:
  """One AdamW step on the Bradley–Terry loss; chosen and rejected share one forward pass. When
  the batch also holds contrastive pairs (keys `contrast_*`, `feedback.contrast`), their
  Bradley–Terry loss is added with weight `contrast_weight`, in the same forward pass."""
  sides = _pairs(batch) + (_pairs(batch, CONTRAST) if CONTRAST + "chosen" in batch else [])
  both = {k: jnp.concatenate([b[k] for b in sides]) for k in sides[0]}
  sizes = np.cumsum([b["prompt"].shape[0] for b in sides])[:-1]

  def loss_fn(params):
    r = jnp.split(score(params, both, cfg), sizes)
    out = bradley_terry(r[0], r[1])
    if len(r) == 4:
      extra = bradley_terry(r[2], r[3])
      out = {**out, "loss": out["loss"] + contrast_weight * extra["loss"],
             "preference_loss": out["loss"], "contrast_loss": extra["loss"],
             "contrast_accuracy": extra["accuracy"]}
    return out["loss"], out

  (_, m), grads = lora.value_and_grad(loss_fn, has_aux=True)(state.params)
  state = state.apply_gradients(grads, tx)
  return state, {**{f"train/{k}": v for k, v in m.items()}, "train/grad_norm": optax.tree.norm(grads)}


def score_texts(params, exp: experiment.Experiment, posts: Sequence[pipeline.Post | pipeline.Tldr],
                texts: Sequence[str]) -> np.ndarray:
  """Rewards of `texts` as summaries of `posts`, in fixed-shape batches."""
  fmt, bs = exp.config.format, exp.config.rm.eval_batch_size
  data = {**pipeline.encode_prompts(exp.tokenizer, posts, fmt.prompt_len),
          **pipeline.encode_responses(exp.tokenizer, texts, fmt.response_len, posts=posts)}
  batches = metrics_lib.progress(pipeline.fixed_batches(data, bs), -(-len(texts) // bs), "scoring",
                                 "batch")
  out = [to_host(score_batch(params, b, exp.model))[:n] for b, n in batches]
  return np.concatenate(out) if out else np.zeros((0,), np.float32)


def reward_of_texts(exp: experiment.Experiment, params: Any,
                    functions: Sequence[reward_functions.RewardFunction]
                    ) -> Callable[[Sequence[Any], Sequence[str]], np.ndarray]:
  """The reward the online methods train on, as a function of (examples, texts): the reward
  model's score times `reward.model_weight` (`params` None: no reward model) plus the reward
  functions' weighted sum, their `completion_ids` the texts encoded again."""
  weight = float(exp.config.reward.model_weight)

  def score(examples: Sequence[Any], texts: Sequence[str]) -> np.ndarray:
    total = np.zeros((len(texts),), np.float32)
    if params is not None:
      total += weight * score_texts(params, exp, examples, texts)
    if functions:
      ids = [exp.tokenizer.encode(t) for t in texts]
      total += reward_functions.evaluate(functions, examples, texts, ids)[0]
    return total

  return score


def training_reward(exp: experiment.Experiment
                    ) -> Callable[[Sequence[Any], Sequence[str]], np.ndarray]:
  """`reward_of_texts` of the configured reward (block `reward`): the workdir's reward model
  unless `reward.model_weight` is 0, and `reward.functions`."""
  params = load(exp)[0] if reward_functions.uses_model(exp.config.reward) else None
  return reward_of_texts(exp, params, reward_functions.load(exp.config.reward))


def comparison_files(exp: experiment.Experiment) -> dict[str, str]:
  """The train and validation comparison files: `rm.train_file`/`rm.valid_file`, or task=label's."""
  c = exp.config.rm
  return {"train": c.train_file or os.path.join(exp.workdir, "label", "train.jsonl"),
          "valid": c.valid_file or os.path.join(exp.workdir, "label", "valid.jsonl")}


def files_meta(exp: experiment.Experiment, files: dict[str, str]) -> dict[str, str]:
  """`files` as recorded in checkpoint metadata: relative to the workdir when inside it, so a
  copied or moved workdir still matches its checkpoints."""
  root = os.path.abspath(exp.workdir)
  out = {}
  for k, path in files.items():
    full = os.path.abspath(path)
    out[k] = os.path.relpath(full, root) if full.startswith(root + os.sep) else full
  return out


def columns(exp: experiment.Experiment) -> dict[str, str] | None:
  """`data.columns`: TRL's field names mapped to a file's columns (layout `trl`), or None."""
  return dict(exp.config.data.get("columns") or {}) or None


def load_comparisons(path: str, layout: str, key: str = "", report: bool = True,
                     columns: dict[str, str] | None = None) -> list[records.Comparison]:
  """The usable comparisons of `path` (any file `records.read` takes: JSON Lines, JSON, Parquet,
  Arrow; a file, a directory of shards or a glob): malformed records are skipped, ties left out,
  and with `report` (off for a second read of the same file) one line says how many records were
  read and kept, followed by the malformed ones (file:line or file: row N). `key` names the config
  key that chose the file, for the error when nothing decisive is left; `columns` maps TRL's
  names to the file's (layout `trl`)."""
  if not os.path.exists(path) and not tables.is_pattern(path):
    raise FileNotFoundError(f"comparisons file not found: {path} (run task=label, or set "
                            "rm.train_file / rm.valid_file)")
  needs = f"{key} needs at least one pair with a preferred side" if key else ""
  comps, problems = records.read(path, layout, columns if layout == records.TRL else None)
  if not comps:
    first = f": {problems[0]} (and {len(problems) - 1} more; is the layout {layout!r} right?)" \
        if problems else ": the file is empty" + (f" ({needs})" if needs else "")
    raise DataError(f"{path} holds no comparisons{first}")
  ties = sum(c.tie for c in comps)  # Human labels may say "neither"; Bradley–Terry needs a side.
  if report:
    read = len(comps) + len(problems)
    left_out = [f"{n} {what}" for n, what in ((len(problems), "malformed"), (ties, "ties")) if n]
    metrics_lib.info(f"{path}: read {read} records, kept {len(comps) - ties}" +
                     (f" ({', '.join(left_out)} left out)" if left_out else ""))
    for p in problems[:5]:
      metrics_lib.info(f"  malformed: {p}")
    if len(problems) > 5:
      metrics_lib.info(f"  ... and {len(problems) - 5} more malformed records in {path}")
  comps = [c for c in comps if not c.tie]
  if not comps:
    raise DataError(f"{path} holds only ties ({ties}): {needs or 'no pair has a preferred side'}")
  return comps


def init_params(exp: experiment.Experiment, sft_params: Any) -> dict:
  """SFT backbone with a fresh scalar head (kernel std `rm.head_init_scale` / sqrt(d_model + 1),
  bias 0), and the likelihood term's weight at `rm.likelihood_weight` unless that is 0."""
  key = jax.random.fold_in(jax.random.key(exp.config.seed), 3)
  head = heads.init_scalar_head(key, exp.model.d_model)
  params = {"backbone": sft_params,
            "head": {**head, "kernel": head["kernel"] * exp.config.rm.head_init_scale}}
  if exp.config.rm.likelihood_weight:
    params[LIKELIHOOD] = {"weight": jnp.asarray(exp.config.rm.likelihood_weight, jnp.float32)}
  return params


def param_axes(exp: experiment.Experiment) -> dict:
  """Logical axes of the reward model's parameters (`init_params`' tree)."""
  axes = heads.param_axes(exp.model)
  return {**axes, LIKELIHOOD: {"weight": ()}} if exp.config.rm.likelihood_weight else axes


def _meta(exp: experiment.Experiment, files: dict[str, str], batch_size: int) -> dict:
  """What determines the trained reward model; resuming under other values is refused. The batch
  size recorded is the one trained with (`batch_size`)."""
  skip = ("log_every", "eval_every", "eval_batch_size", "probe_examples", "bootstrap")
  rm = {k: v for k, v in exp.config.rm.items() if k not in skip}
  if not rm.get("contrast_batch_size"):  # Without contrastive pairs their settings play no part.
    rm = {k: v for k, v in rm.items() if not k.startswith("contrast_")}
  return {"model": dataclasses.asdict(exp.model), "format": exp.config.format.to_dict(),
          "rm": {**rm, "batch_size": batch_size},
          "files": files_meta(exp, files), **exp.lora_meta("rm"), **exp.remat_meta("rm")}


def train_batch_size(exp: experiment.Experiment, pairs: int, path: str) -> tuple[int, str]:
  """`rm.batch_size`, or, when the `pairs` decisive pairs of `path` fill no such batch (a small
  round of human labels), the largest batch they fill that splits over the data-parallel devices,
  with a line that says so. A batch holds each pair at most once (`pipeline.batch_indices`)."""
  c, dp = exp.config.rm, exp.parallel.data_parallel
  fits = min(pairs, int(c.epochs * pairs))
  if c.batch_size <= fits:
    return c.batch_size, ""
  what = f"{pairs} pair{'s' * (pairs != 1)}" + (
      f" x {c.epochs:g} epoch{'s' * (c.epochs != 1)}" if c.epochs <= 1 else "")
  if fits < dp:
    fix = "set rm.epochs=1" if pairs >= dp else f"it needs at least {dp} decisive pairs"
    raise ConfigError(f"rm.batch_size ({c.batch_size}): the {what} of {path} fill a batch of at "
                      f"most {fits}, fewer than the mesh's {dp} data-parallel devices (a batch "
                      f"needs one pair for each); {fix}")
  size = fits - fits % dp
  return size, (f"rm: rm.batch_size {c.batch_size} is more than the {what} of {path}: training "
                f"with batch {size} (set rm.batch_size to choose another)")


def train(exp: experiment.Experiment, sft_params: Any, train_comps: Sequence[records.Comparison],
          val_comps: Sequence[records.Comparison], meta: dict) -> TrainState:
  """Trains (or resumes) the reward model in `<workdir>/rm/checkpoints`, with the batch size of
  `meta` (`batch_size`)."""
  config, c, fmt = exp.config, exp.config.rm, exp.config.format
  data = pipeline.encode_comparisons(exp.tokenizer, train_comps, fmt.prompt_len, fmt.response_len)
  val = pipeline.encode_comparisons(exp.tokenizer, val_comps, fmt.prompt_len, fmt.response_len)
  bs = meta["rm"]["batch_size"]
  steps = int(c.epochs * len(train_comps)) // bs
  par = exp.parallel
  par.check_batch("rm.batch_size", bs)
  # A run shorter than its warm-up (a small round of labels) would never leave it, and one step
  # would train at learning rate 0: its last step reaches rm.lr.
  warmup = min(c.warmup_steps, steps - 1)
  if warmup < c.warmup_steps:
    metrics_lib.info(f"rm: rm.warmup_steps {c.warmup_steps} is more than the run's {steps} "
                     f"step{'s' * (steps != 1)}: warming up over {warmup}")
  tx = optimizer.adamw({**c.to_dict(), "warmup_steps": warmup}, steps, exp.trainable("rm"))
  lora_key = jax.random.fold_in(jax.random.key(config.seed), 5)

  def make(sft_params):
    params = init_params(exp, sft_params)
    backbone = lora.adapt(lora_key, params["backbone"], exp.lora, "rm")
    return TrainState.create({**params, "backbone": backbone}, tx)

  axes = param_axes(exp)
  axes = {**axes, "backbone": lora.model_axes(axes["backbone"], exp.lora, "rm")}
  state, shardings = par.train_state(make, axes, tx, sft_params)
  step_fn = par.jit(functools.partial(train_step, cfg=exp.model_for("rm"), tx=tx,
                                      contrast_weight=c.contrast_weight),
                    (shardings, par.batch), (shardings, par.replicated), (0,))
  contrast_data = None
  if c.contrast_batch_size:
    par.check_batch("rm.contrast_batch_size", c.contrast_batch_size)
    contrast_data = pipeline.encode_comparisons(exp.tokenizer, contrast_comparisons(exp),
                                                fmt.prompt_len, fmt.response_len)
    metrics_lib.info(f"rm: {len(contrast_data['prompt'])} contrastive pairs from the "
                     f"{c.contrast_split!r} split's references, {c.contrast_batch_size} per step "
                     f"at weight {c.contrast_weight}")

  def validate(params) -> dict[str, float]:
    rc, rr = (np.concatenate([to_host(score_batch(params, b, exp.model, r))[:n]
                              for b, n in pipeline.fixed_batches(val, c.eval_batch_size)])
              for r in ("chosen", "rejected"))
    return {f"val/{k}": float(v) for k, v in bradley_terry(rc, rr).items()}

  task_dir = exp.task_dir("rm")
  ckpt = checkpoint.Checkpointer(f"{task_dir}/checkpoints", config.checkpoint.every,
                                 config.checkpoint.keep)
  writer = metrics_lib.MetricWriter(task_dir, "metrics")
  state = loop.restore_if_any(ckpt, state, meta)

  def one_step(state, step):
    idx = pipeline.batch_indices(len(train_comps), bs, config.seed, step)
    batch = par.put_batch(data, idx)
    if contrast_data is not None:
      cidx = pipeline.batch_indices(len(contrast_data["prompt"]), c.contrast_batch_size,
                                    config.seed + 1, step)
      batch.update({CONTRAST + k: v for k, v in par.put_batch(contrast_data, cidx).items()})
    return step_fn(state, batch)

  def periodic(state, done, m) -> dict[str, float]:
    out = {}
    if done % c.log_every == 0 or done == steps:
      out.update({k: float(v) for k, v in m.items()})
    if done % c.eval_every == 0 or done == steps:
      out.update(validate(state.params))
      metrics_lib.info(f"rm step {done}: train loss {float(m['train/loss']):.3f}  val loss "
                       f"{out['val/loss']:.3f}  val accuracy {out['val/accuracy']:.3f}")
    return out

  state = loop.run(state, steps, one_step, periodic, ckpt, writer,
                   2 * bs * (fmt.prompt_len + fmt.response_len), "rm", meta,
                   c.get("skip_nonfinite", 0))
  writer.close()
  ckpt.close()
  return state


def contrast_comparisons(exp: experiment.Experiment) -> list[records.Comparison]:
  """The label-free contrastive pairs of `rm.contrast_split`'s references (`feedback.contrast`)."""
  c = exp.config.rm
  if c.contrast_split not in exp.splits:
    raise ConfigError(f"rm.contrast_split {c.contrast_split!r} is not a data split "
                      f"({', '.join(exp.splits)})")
  examples = exp.splits[c.contrast_split]
  if not examples or not getattr(examples[0], "reference", ""):
    raise ConfigError(f"rm.contrast_split {c.contrast_split!r} has no reference summaries")
  pairs = contrast.comparisons(examples, exp.config.seed, c.contrast_max_df)
  if len(pairs) < c.contrast_batch_size:
    raise ConfigError(f"rm.contrast_batch_size ({c.contrast_batch_size}) exceeds the "
                      f"{len(pairs)} contrastive pairs of split {c.contrast_split!r}")
  return pairs


def normalize(params: dict, scores: np.ndarray, with_std: bool) -> tuple[dict, dict[str, float]]:
  """Folds `(r - mean) / std` (std only `with_std`) of `scores` into the head; returns the new
  params and the offsets applied."""
  mean = float(np.mean(scores))
  gain = 1.0 / float(np.std(scores)) if with_std else 1.0
  out = {**params, "head": {"kernel": params["head"]["kernel"] * gain,
                            "bias": (params["head"]["bias"] - mean) * gain}}
  if LIKELIHOOD in params:
    out[LIKELIHOOD] = {"weight": params[LIKELIHOOD]["weight"] * gain}
  return out, {"mean": mean, "gain": gain, "count": int(len(scores))}


def _norm_set(exp: experiment.Experiment, train_comps: Sequence[records.Comparison]):
  """(posts, texts) the normalisation is computed on (`fit` has checked `rm.normalize`)."""
  c = exp.config.rm
  if c.normalize == "reference":
    examples = exp.splits["pref"][:c.norm_examples]
    return examples, [e.reference for e in examples]
  comps = list(train_comps[:c.norm_examples])  # "sft": the SFT samples of the training pairs.
  return pipeline.posts_of(comps), [x.response_a for x in comps]


def model_template(exp: experiment.Experiment) -> dict:
  """The abstract reward-model parameters, sharded on this run's mesh (a restore target)."""
  shapes = jax.eval_shape(lambda: init_params(exp, transformer.init(jax.random.key(0), exp.model)))
  par = exp.parallel
  return par.abstract(shapes, par.shardings(param_axes(exp), shapes))


def load(exp: experiment.Experiment) -> tuple[dict, dict]:
  """The normalised reward model of `<workdir>/rm/model` and its metadata."""
  return checkpoint.restore_finished(f"{exp.workdir}/rm/model", model_template(exp), 1, "rm")


def annotator(exp: experiment.Experiment, params: dict | None = None) -> annotators.Annotator:
  """The reward model as an annotator (the workdir's unless `params` are given)."""
  params = load(exp)[0] if params is None else params
  return annotators.RewardModelAnnotator(
      "rm", lambda examples, texts: score_texts(params, exp, examples, texts))


def fit(exp: experiment.Experiment, files: dict[str, str]) -> tuple[dict, dict]:
  """Trains and normalises the reward model unless `<workdir>/rm/model` already holds it."""
  c = exp.config.rm
  if c.normalize not in NORMALIZE:
    raise ConfigError(f"rm.normalize must be one of {NORMALIZE}, got {c.normalize!r}")
  val_comps = load_comparisons(files["valid"], c.layout, "rm.valid_file", columns=columns(exp))
  train_comps = load_comparisons(files["train"], c.layout, "rm.train_file", columns=columns(exp))
  size, why = train_batch_size(exp, len(train_comps), files["train"])
  meta = _meta(exp, files, size)
  model_dir = f"{exp.workdir}/rm/model"
  if checkpoint.latest_step(model_dir) == 1:
    params, stored = load(exp)
    changed, refused = loop.meta_differences({k: stored.get(k) for k in meta}, meta)
    if refused:
      raise ConfigError(f"{model_dir} holds a reward model trained under another configuration "
                        f"({', '.join(refused)}); use a new --workdir or restore the old settings")
    metrics_lib.info(f"reward model already trained: {model_dir}" + (
        f" (settings since changed: {', '.join(changed)})" if changed else ""))
    return params, stored
  if why:
    metrics_lib.info(why)
  sft_params = sft.load_policy(exp)
  state = train(exp, sft_params, train_comps, val_comps, meta)
  # Adapters merged: `rm/model` is a plain reward model, whatever trained it.
  params, norm = lora.merged(state.params), {"mean": 0.0, "gain": 1.0, "count": 0}
  if c.normalize != "none":
    posts, texts = _norm_set(exp, train_comps)
    params, norm = normalize(params, score_texts(params, exp, posts, texts), c.normalize_std)
  meta = {**meta, "normalization": {"target": c.normalize, **norm}}
  ckpt = checkpoint.Checkpointer(model_dir, 0, keep=1)
  ckpt.save(1, params, meta)
  ckpt.close()
  return params, meta


def run(config, workdir: str) -> dict[str, Any]:
  """Trains and normalises the reward model (task=rm); `evaluation.rm_report` reports on it."""
  exp = experiment.prepare(config, workdir)
  _, meta = fit(exp, comparison_files(exp))
  return meta
