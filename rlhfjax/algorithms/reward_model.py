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

Reported: train/val accuracy on the (noisy) labels it was trained on, accuracy against the noiseless
evaluation pool and against the gold argmax (gold ties excluded), the mean margin, the length-only
heuristic beside it, that agreement split by the gold component that decides each pair (an
omission, a wrong fact, ...), the probe table and the agreement table.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlhfjax.algorithms import sft
from rlhfjax.data import pipeline
from rlhfjax.data import world
from rlhfjax.errors import ConfigError
from rlhfjax.evaluation import agreement
from rlhfjax.evaluation import rm_probes
from rlhfjax.evaluation import summaries
from rlhfjax.feedback import annotators
from rlhfjax.feedback import contrast
from rlhfjax.feedback import records
from rlhfjax.models import heads
from rlhfjax.models import policy
from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig
from rlhfjax.parallel.sharding import to_host
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


def score(params, batch: pipeline.Batch, cfg: ModelConfig, response: str = "response") -> jax.Array:
  """The reward [B] of `batch[response]` after `batch['prompt']`: the head read at the last real
  token, plus, in a model with a likelihood term, its weight times the response's mean token
  log-probability under the model's own language-model head."""
  tokens, mask = pipeline.prompt_and(batch, response)
  hidden, _ = transformer.forward(params["backbone"], tokens, cfg, mask=mask)
  r = heads.read_last(params["head"], hidden, mask)
  if LIKELIHOOD in params:
    logp = policy.mean_response_logprob(params["backbone"], hidden, batch, cfg, response)
    r = r + params[LIKELIHOOD]["weight"] * logp
  return r


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

  (_, m), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  state = state.apply_gradients(grads, tx)
  return state, {**{f"train/{k}": v for k, v in m.items()}, "train/grad_norm": optax.tree.norm(grads)}


# `score` jitted once for every caller: the reward of each row of a fixed-shape batch.
score_batch = jax.jit(score, static_argnames=("cfg", "response"))


def score_texts(params, exp: experiment.Experiment, posts: Sequence[pipeline.Post | world.Example],
                texts: Sequence[str]) -> np.ndarray:
  """Rewards of `texts` as summaries of `posts`, in fixed-shape batches."""
  fmt, bs = exp.config.format, exp.config.rm.eval_batch_size
  data = {**pipeline.encode_prompts(exp.tokenizer, posts, fmt.prompt_len),
          **pipeline.encode_responses(exp.tokenizer, texts, fmt.response_len)}
  out = [to_host(score_batch(params, b, exp.model))[:n] for b, n in pipeline.fixed_batches(data, bs)]
  return np.concatenate(out) if out else np.zeros((0,), np.float32)


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


def load_comparisons(path: str, layout: str) -> list[records.Comparison]:
  """The usable comparisons of `path`; malformed lines are reported (file:line) and skipped."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"comparisons file not found: {path} (run task=label, or set "
                            "rm.train_file / rm.valid_file)")
  comps, problems = records.read(path, layout)
  for p in problems[:5]:
    metrics_lib.info(f"skipping malformed comparison: {p}")
  if len(problems) > 5:
    metrics_lib.info(f"... and {len(problems) - 5} more malformed lines in {path}")
  if not comps:
    raise ConfigError(f"{path} holds no usable comparisons")
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


def _meta(exp: experiment.Experiment, files: dict[str, str]) -> dict:
  """What determines the trained reward model; resuming under other values is refused."""
  skip = ("log_every", "eval_every", "eval_batch_size", "probe_examples", "bootstrap")
  rm = {k: v for k, v in exp.config.rm.items() if k not in skip}
  if not rm.get("contrast_batch_size"):  # Without contrastive pairs their settings play no part.
    rm = {k: v for k, v in rm.items() if not k.startswith("contrast_")}
  return {"model": dataclasses.asdict(exp.model), "format": exp.config.format.to_dict(),
          "rm": rm,
          "files": files_meta(exp, files)}


def train(exp: experiment.Experiment, sft_params: Any, train_comps: Sequence[records.Comparison],
          val_comps: Sequence[records.Comparison], meta: dict) -> TrainState:
  """Trains (or resumes) the reward model in `<workdir>/rm/checkpoints`."""
  config, c, fmt = exp.config, exp.config.rm, exp.config.format
  data = pipeline.encode_comparisons(exp.tokenizer, train_comps, fmt.prompt_len, fmt.response_len)
  val = pipeline.encode_comparisons(exp.tokenizer, val_comps, fmt.prompt_len, fmt.response_len)
  steps = int(c.epochs * len(train_comps)) // c.batch_size
  if steps <= 0:
    raise ConfigError(f"rm.batch_size ({c.batch_size}) exceeds rm.epochs x {len(train_comps)} pairs")
  par = exp.parallel
  par.check_batch("rm.batch_size", c.batch_size)
  tx = optimizer.adamw(c, steps)
  state, shardings = par.train_state(lambda p: TrainState.create(init_params(exp, p), tx),
                                     param_axes(exp), tx, sft_params)
  step_fn = par.jit(functools.partial(train_step, cfg=exp.model, tx=tx,
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
    idx = pipeline.batch_indices(len(train_comps), c.batch_size, config.seed, step)
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
                   2 * c.batch_size * (fmt.prompt_len + fmt.response_len), "rm", meta)
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
  val_comps = load_comparisons(files["valid"], c.layout)
  meta = _meta(exp, files)
  model_dir = f"{exp.workdir}/rm/model"
  if checkpoint.latest_step(model_dir) == 1:
    params, stored = load(exp)
    if {k: stored.get(k) for k in meta} != meta:
      raise ConfigError(f"{model_dir} holds a reward model trained under another configuration; "
                        "use a new --workdir or restore the old settings")
    metrics_lib.info(f"reward model already trained: {model_dir}")
    return params, stored
  train_comps = load_comparisons(files["train"], c.layout)
  sft_params = sft.load_policy(exp)
  state = train(exp, sft_params, train_comps, val_comps, meta)
  params, norm = state.params, {"mean": 0.0, "gain": 1.0, "count": 0}
  if c.normalize != "none":
    posts, texts = _norm_set(exp, train_comps)
    params, norm = normalize(params, score_texts(params, exp, posts, texts), c.normalize_std)
  meta = {**meta, "normalization": {"target": c.normalize, **norm}}
  ckpt = checkpoint.Checkpointer(model_dir, 0, keep=1)
  ckpt.save(1, params, meta)
  ckpt.close()
  return params, meta


def _examples_of(exp: experiment.Experiment,
                 comps: Sequence[records.Comparison]) -> list[world.Example] | None:
  """The simulated examples behind the comparisons, or None when any is not from this world (or
  the data has no latent situations: real posts share ids with their comparisons)."""
  by_id = {e.id: e for split in exp.splits.values() for e in split}
  found = [by_id.get(c.id) for c in comps]
  return None if any(e is None for e in found) or not world.has_gold(found) else found


def _judge(params: dict, exp: experiment.Experiment,
           comps: Sequence[records.Comparison]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The reward model's preference (0 prefers response_a, 1 response_b, 0.5 tie) on `comps`, and
  its margin for each comparison's labelled choice."""
  posts = pipeline.posts_of(comps)
  sa = score_texts(params, exp, posts, [x.response_a for x in comps])
  sb = score_texts(params, exp, posts, [x.response_b for x in comps])
  labels = np.array([x.choice for x in comps])
  return agreement.prefer_higher(sa, sb), labels, np.where(labels == 1, sb - sa, sa - sb)


def evaluate(exp: experiment.Experiment, params: dict, files: dict[str, str],
             sft_params: Any) -> dict[str, Any]:
  """Accuracies, the probe table and the agreement table on the validation pairs."""
  c = exp.config.rm
  val_comps = load_comparisons(files["valid"], c.layout)
  # Training accuracy on as many training pairs as there are held-out ones.
  train_pref, train_labels, _ = _judge(
      params, exp, load_comparisons(files["train"], c.layout)[:len(val_comps)])
  rm_pref, labels, margin = _judge(params, exp, val_comps)
  a = [x.response_a for x in val_comps]
  b = [x.response_b for x in val_comps]
  report: dict[str, Any] = {"pairs": len(val_comps),
                            "train_accuracy": agreement.agreement(train_pref, train_labels),
                            "accuracy": agreement.agreement(rm_pref, labels),
                            "margin": float(margin.mean())}
  examples = _examples_of(exp, val_comps)
  if examples is None:
    metrics_lib.info("validation pairs are not from the simulated world: gold metrics skipped")
    return report
  rng = np.random.default_rng([exp.config.seed, 5])
  pools = annotators.pools(exp.config.annotators)
  gold_pref = agreement.gold_preference(examples, a, b)
  eval_labels = pools["eval_pool"].annotate(examples, a, b, rng)
  report.update({
      "accuracy_eval_pool": agreement.agreement(rm_pref, eval_labels),
      "accuracy_gold": agreement.accuracy_against(rm_pref, gold_pref),
      "gold_ties": float(np.mean(gold_pref == 0.5)),
      "length_accuracy_gold": agreement.accuracy_against(agreement.length_preference(a, b),
                                                         gold_pref),
      "labels_accuracy_gold": agreement.accuracy_against(labels, gold_pref)})

  heuristics = heuristic_preferences(exp, sft_params, examples, a, b)
  report["likelihood_accuracy_gold"] = agreement.accuracy_against(heuristics["SFT mean log p"],
                                                                 gold_pref)
  prefs = {"train pool": labels, "eval pool": eval_labels,
           "single": pools["single"].annotate(examples, a, b, rng), "gold": gold_pref,
           "RM": rm_pref, **heuristics}
  mean, se = agreement.agreement_matrix(prefs, rng, c.bootstrap)
  report["agreement"] = {"names": list(prefs), "mean": mean.tolist(), "se": se.tolist()}
  report["by_component"] = agreement.by_component(
      {"RM": rm_pref, "length": heuristics["length"], "SFT mean log p": heuristics["SFT mean log p"],
       "training labels": labels}, gold_pref, agreement.deciding_component(examples, a, b))

  probe_examples = exp.splits["test"][:c.probe_examples]
  report["probes"] = rm_probes.probe_table(
      lambda ex, texts: score_texts(params, exp, ex, texts), probe_examples, rng)
  return report


def heuristic_preferences(exp: experiment.Experiment, sft_params: Any,
                          examples: Sequence[world.Example], a: Sequence[str],
                          b: Sequence[str]) -> dict[str, np.ndarray]:
  """Preferences of the heuristics in Stiennon et al.'s Table 20: the longer summary, the one that
  copies more of the post, the higher ROUGE-L against the reference, the higher SFT log-probability;
  and the higher mean log-probability per token (the likelihood term alone, with no labels)."""
  logp, mean_logp = sft_log_probs(sft_params, exp, examples, list(a) + list(b))
  refs = [e.reference for e in examples]
  return {"length": agreement.length_preference(a, b),
          "copying": agreement.prefer_higher(*([agreement.copying(t, e.post) for t, e in
                                                zip(texts, examples)] for texts in (a, b))),
          "ROUGE-L": agreement.prefer_higher(summaries.rouge_l(a, refs), summaries.rouge_l(b, refs)),
          "SFT log p": agreement.prefer_higher(logp[:len(a)], logp[len(a):]),
          "SFT mean log p": agreement.prefer_higher(mean_logp[:len(a)], mean_logp[len(a):])}


_logp_fn = jax.jit(policy.response_logprobs, static_argnames="cfg")


def sft_log_probs(params: Any, exp: experiment.Experiment,
                  posts: Sequence[pipeline.Post | world.Example],
                  texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
  """Total and mean per-token log-probability of each of `texts` under the SFT policy; `texts`
  holds one or more responses per post, in blocks of `len(posts)`."""
  fmt = exp.config.format
  data = {**pipeline.encode_prompts(exp.tokenizer, list(posts) * (len(texts) // len(posts)),
                                    fmt.prompt_len),
          **pipeline.encode_responses(exp.tokenizer, texts, fmt.response_len)}
  total, count = [], []
  for b, k in pipeline.fixed_batches(data, exp.config.rm.eval_batch_size):
    total.append(to_host(_logp_fn(params, b, exp.model)).sum(-1)[:k])
    count.append(np.asarray(b["response_mask"]).sum(-1)[:k])
  total, count = np.concatenate(total), np.concatenate(count)
  return total, total / np.maximum(count, 1)


def format_report(report: dict[str, Any]) -> str:
  lines = [f"Reward model on {report['pairs']} held-out pairs:",
           f"- accuracy on the labels it learns from (training pool, 25% flipped): "
           f"{100 * report['accuracy']:.1f}% held out, {100 * report['train_accuracy']:.1f}% on "
           "training pairs"]
  if "accuracy_gold" in report:
    lines += [
        f"- accuracy on the evaluation pool's (noiseless) labels: "
        f"{100 * report['accuracy_eval_pool']:.1f}%",
        f"- agreement with the gold argmax: {100 * report['accuracy_gold']:.1f}% (length-only "
        f"heuristic: {100 * report['length_accuracy_gold']:.1f}%; the SFT policy's mean token "
        f"log-probability alone: {100 * report['likelihood_accuracy_gold']:.1f}%; the training "
        f"labels themselves: "
        f"{100 * report['labels_accuracy_gold']:.1f}%; gold ties excluded, "
        f"{100 * report['gold_ties']:.0f}% of pairs)"]
  lines.append(f"- mean margin (chosen - rejected): {report['margin']:.3f}")
  if "by_component" in report:
    lines += ["", "Agreement with gold by what decides the pair (gold ties left out):",
              agreement.format_by_component(report["by_component"])]
  if "probes" in report:
    lines += ["", "Probes (Stiennon et al. Table 18):", rm_probes.format_table(report["probes"])]
  if "agreement" in report:
    a = report["agreement"]
    lines += ["", "Agreement between labelers in % ± bootstrap s.e. (Stiennon et al. Table 20):",
              agreement.format_matrix(a["names"], np.array(a["mean"]), np.array(a["se"]))]
  return "\n".join(lines)


def run(config, workdir: str) -> dict[str, Any]:
  exp = experiment.prepare(config, workdir)
  files = comparison_files(exp)
  params, meta = fit(exp, files)
  report = evaluate(exp, params, files, sft.load_policy(exp))
  report["normalization"] = meta["normalization"]
  text = format_report(report)
  metrics_lib.info("\n" + text)
  task_dir = exp.task_dir("rm")
  experiment.write_json(f"{task_dir}/eval.json", report)
  experiment.write_text(f"{task_dir}/eval.md", text + "\n")
  return report
