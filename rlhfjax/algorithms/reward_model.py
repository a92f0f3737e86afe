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

The score itself is `models/reward.score` (rollouts and every method read it there); later stages
load the saved model with `training/loaders.load_reward_model` and score texts with
`rollout/rewards.score_texts`. The report on what the model learned is `evaluation/rm_report.py`,
which task=rm runs after this module.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlhfjax import rng_streams
from rlhfjax.data import pipeline
from rlhfjax.data import records
from rlhfjax.errors import ConfigError
from rlhfjax.feedback import contrast
from rlhfjax.models.config import ModelConfig
from rlhfjax.models import heads
from rlhfjax.models import lora
from rlhfjax.models.reward import score, score_batch  # noqa: F401  (this module's API too)
from rlhfjax.parallel.sharding import to_host
from rlhfjax.rollout import rewards
from rlhfjax.training import checkpoint
from rlhfjax.training import experiment
from rlhfjax.training import loaders
from rlhfjax.training import loop
from rlhfjax.training import metrics as metrics_lib
from rlhfjax.training import optimizer
from rlhfjax.training import program as program_lib
from rlhfjax.training.state import TrainState

NORMALIZE = ("reference", "sft", "none")
LIKELIHOOD = heads.LIKELIHOOD


def bradley_terry(r_chosen: jax.Array, r_rejected: jax.Array) -> dict[str, jax.Array]:
  """Mean Bradley–Terry loss `-log σ(r_c - r_r)`, accuracy (r_c > r_r; an exact tie, as a pair of
  identical texts gets, counts 1/2 as in `evaluation.agreement`) and mean margin."""
  margin = r_chosen - r_rejected
  right = (margin > 0).astype(jnp.float32) + 0.5 * (margin == 0).astype(jnp.float32)
  return {"loss": -jax.nn.log_sigmoid(margin).mean(), "accuracy": right.mean(),
          "margin": margin.mean()}


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


def _meta(exp: experiment.Experiment, files: dict[str, str], batch_size: int) -> dict:
  """What determines the trained reward model; resuming under other values is refused. The batch
  size recorded is the one trained with (`batch_size`)."""
  skip = ("log_every", "eval_every", "eval_batch_size", "probe_examples", "bootstrap")
  rm = {k: v for k, v in exp.config.rm.items() if k not in skip}
  if not rm["contrast_batch_size"]:  # Without contrastive pairs their settings play no part.
    rm = {k: v for k, v in rm.items() if not k.startswith("contrast_")}
  return {"model": dataclasses.asdict(exp.model), "format": exp.config.format.to_dict(),
          "rm": {**rm, "batch_size": batch_size},
          "files": loaders.files_meta(exp, files), **exp.lora_meta("rm"), **exp.remat_meta("rm")}


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


def warmup(c: Any, steps: int) -> int:
  """`rm.warmup_steps`, or one less than a shorter run's `steps` (its last step reaches rm.lr)."""
  return min(c.warmup_steps, steps - 1)


def program(exp: experiment.Experiment, steps: int, batch_size: int) -> program_lib.Program:
  """The update step `train` runs for `steps` steps of `batch_size` comparisons (plus
  `rm.contrast_batch_size` contrastive pairs): AdamW over them, the adapters `lora` gives the
  reward model's backbone, its remat policy."""
  c, fmt, par = exp.config.rm, exp.config.format, exp.parallel
  par.check_batch("rm.batch_size", batch_size)
  tx = optimizer.adamw({**c.to_dict(), "warmup_steps": warmup(c, steps)}, steps,
                       exp.trainable("rm"))
  adapt = lambda p: {**p, "backbone": lora.adapt(jax.random.key(0), p["backbone"], exp.lora, "rm")}
  axes = loaders.reward_model_axes(exp)
  axes = {**axes, "backbone": lora.model_axes(axes["backbone"], exp.lora, "rm")}
  state, shardings = par.train_state(lambda p: TrainState.create(adapt(p), tx), axes, tx,
                                     loaders.reward_model_template(exp), abstract=True)
  step = par.jit(functools.partial(train_step, cfg=exp.model_for("rm"), tx=tx,
                                   contrast_weight=c.contrast_weight),
                 (shardings, par.batch), (shardings, par.replicated), (0,))
  names = {"prompt": fmt.prompt_len, "chosen": fmt.response_len, "rejected": fmt.response_len}
  batch = program_lib.tokens(par, batch_size, names)
  if c.contrast_batch_size:
    par.check_batch("rm.contrast_batch_size", c.contrast_batch_size)
    batch.update({CONTRAST + k: v for k, v in
                  program_lib.tokens(par, c.contrast_batch_size, names).items()})
  return program_lib.Program(step, (state, batch), state, shardings, tx)


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
  # A run shorter than its warm-up (a small round of labels) would never leave it, and one step
  # would train at learning rate 0: its last step reaches rm.lr.
  if warmup(c, steps) < c.warmup_steps:
    metrics_lib.info(f"rm: rm.warmup_steps {c.warmup_steps} is more than the run's {steps} "
                     f"step{'s' * (steps != 1)}: warming up over {warmup(c, steps)}")
  prog = program(exp, steps, bs)
  lora_key = jax.random.fold_in(jax.random.key(config.seed), rng_streams.RM_LORA)

  def make(sft_params):
    params = loaders.init_reward_model(exp, sft_params)
    backbone = lora.adapt(lora_key, params["backbone"], exp.lora, "rm")
    return TrainState.create({**params, "backbone": backbone}, prog.tx)

  state, step_fn = prog.init(make, sft_params), prog.step
  contrast_data = None
  if c.contrast_batch_size:
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
                   c.skip_nonfinite)
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


def fit(exp: experiment.Experiment, files: dict[str, str]) -> tuple[dict, dict]:
  """Trains and normalises the reward model unless `<workdir>/rm/model` already holds it."""
  c = exp.config.rm
  if c.normalize not in NORMALIZE:
    raise ConfigError(f"rm.normalize must be one of {NORMALIZE}, got {c.normalize!r}")
  cols = loaders.columns(exp)
  val_comps = loaders.load_comparisons(files["valid"], c.layout, "rm.valid_file", columns=cols)
  train_comps = loaders.load_comparisons(files["train"], c.layout, "rm.train_file", columns=cols)
  size, why = train_batch_size(exp, len(train_comps), files["train"])
  meta = _meta(exp, files, size)
  model_dir = f"{exp.workdir}/rm/model"
  if checkpoint.latest_step(model_dir) == 1:
    params, stored = loaders.load_reward_model(exp)
    changed, refused = loop.meta_differences({k: stored.get(k) for k in meta}, meta)
    if refused:
      raise ConfigError(f"{model_dir} holds a reward model trained under another configuration "
                        f"({', '.join(refused)}); use a new --workdir or restore the old settings")
    metrics_lib.info(f"reward model already trained: {model_dir}" + (
        f" (settings since changed: {', '.join(changed)})" if changed else ""))
    return params, stored
  if why:
    metrics_lib.info(why)
  sft_params = loaders.load_policy(exp)
  state = train(exp, sft_params, train_comps, val_comps, meta)
  # Adapters merged: `rm/model` is a plain reward model, whatever trained it.
  params, norm = lora.merged(state.params), {"mean": 0.0, "gain": 1.0, "count": 0}
  if c.normalize != "none":
    posts, texts = _norm_set(exp, train_comps)
    scores = rewards.score_texts(params, exp, posts, texts)
    params, norm = normalize(params, scores, c.normalize_std)
  meta = {**meta, "normalization": {"target": c.normalize, **norm}}
  ckpt = checkpoint.Checkpointer(model_dir, 0, keep=1)
  ckpt.save(1, params, meta)
  ckpt.close()
  return params, meta


def run(config, workdir: str) -> dict[str, Any]:
  """Trains and normalises the reward model (task=rm); `evaluation.rm_report` reports on it."""
  exp = experiment.prepare(config, workdir)
  _, meta = fit(exp, loaders.comparison_files(exp))
  return meta
