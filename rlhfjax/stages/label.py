"""task=label: sample response pairs from the SFT policy and have an annotator compare them.

Two responses per post are sampled at `label.temperature` (0.7, as Stiennon et al. sampled the pairs they labelled) on the PREF split
(training pairs) and on the validation split (held-out pairs), labelled by `label.annotator`, and
written as comparison files `<workdir>/label/{train,valid}.jsonl` — in OpenAI's layout for TL;DR
posts, in AlpacaFarm's for instructions (`rm.layout` must name it, as task=rm reads them). Beside them,
`annotators.md` reports each annotator's agreement with the gold argmax, its variance and its length
preference on the held-out pairs. A rerun with the same settings reuses the files.

Real data has no latent situation (`pipeline.has_gold`), so the simulated annotators cannot judge
it: there `label.annotator` must be `rm` or `file:PATH`, and the report leaves out gold and the pools.
With `label.comparisons` naming a TFDS dataset of human comparisons (`HUMAN`: OpenAI's
summarize-from-feedback comparisons, built from `data.manual_dir`), nothing is sampled or judged:
the files are the first `label.num_pairs` comparisons of its training split and the first
`label.num_val_pairs` of its validation split.

With `label.protocol=binary` the annotator gives thumbs up or down instead (binary feedback, what
KTO learns from): one sample per post, desirable when the annotator prefers it to the post's
reference summary (its pairwise judgement against that fixed point: a simulated annotator's
utility above the reference's, with its own noise, position bias and flips). The files are
`<workdir>/label/binary_{train,valid}.jsonl` in the binary layout, beside the comparison files;
each set has its own meta, so a workdir may hold both.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import jax
import numpy as np

from rlhfjax import rng_streams
from rlhfjax.data import pipeline
from rlhfjax.data import records
from rlhfjax.errors import ConfigError
from rlhfjax.evaluation import agreement
from rlhfjax.evaluation import judges
from rlhfjax.feedback import annotators
from rlhfjax.rollout import engine
from rlhfjax.sources import loading
from rlhfjax.sources import tfds_builders
from rlhfjax.training import experiment
from rlhfjax.training import loaders
from rlhfjax.training import loop
from rlhfjax.training import metrics as metrics_lib

SPLITS = {"train": "pref", "valid1": "validation"}  # Comparison split -> data split.
PROTOCOLS = ("pairs", "binary")
# TFDS datasets of human comparisons (`label.comparisons`) -> their split for each comparison split.
HUMAN = {"openai_comparisons": {"train": "train", "valid1": "valid1"}}


def sample(exp: experiment.Experiment, params: Any, examples: Sequence[pipeline.Tldr],
           rng: jax.Array, k: int = 2) -> list[list[str]]:
  """`k` independent samples from the policy for each post: k lists in the order of `examples`."""
  c = exp.config.label
  prompts = pipeline.encode_prompts(exp.tokenizer, examples, exp.config.format.prompt_len)
  rows = {key: np.concatenate([v] * k) for key, v in prompts.items()}
  out = engine.generate_split(exp, params, rows, rng, c.batch_size, c.temperature, c.top_k, c.top_p)
  texts = [exp.tokenizer.decode(r).strip() for r in out["response"]]
  return [texts[i * len(examples):(i + 1) * len(examples)] for i in range(k)]


def to_records(examples: Sequence[pipeline.Example], a: Sequence[str], b: Sequence[str],
               choices: np.ndarray, annotator: str, split: str, policy: str) -> list[records.Comparison]:
  return [records.Comparison(response_a=x, response_b=y, choice=int(ch), annotator=annotator,
                             split=split, policy_a=policy, policy_b=policy, batch="label",
                             **pipeline.comparison_prompt(e))
          for e, x, y, ch in zip(examples, a, b, choices)]


def layout_of(exp: experiment.Experiment, examples: Sequence[pipeline.Example]) -> str:
  """The comparison layout that holds these prompts, checked against `rm.layout`."""
  layout = ("trl" if any(isinstance(e, pipeline.Prompted) for e in examples) else
            "alpaca" if any(isinstance(e, pipeline.Instruction) for e in examples) else "openai")
  if exp.config.rm.layout != layout:
    raise ConfigError(f"rm.layout: task=label writes the comparisons of these prompts in the "
                      f"{layout!r} layout and task=rm reads them with rm.layout "
                      f"({exp.config.rm.layout!r}); set rm.layout={layout}")
  return layout


def human_comparisons(exp: experiment.Experiment, paths: dict[str, str]) -> None:
  """Writes the comparisons of the TFDS dataset `label.comparisons` as the files `paths`."""

  c = exp.config.label
  if c.comparisons not in HUMAN:
    raise ConfigError(f"label.comparisons: {c.comparisons!r} is not a dataset of human comparisons "
                      f"(available: {', '.join(repr(n) for n in HUMAN)}, or '' to label samples)")
  builder = loading.prepare_tfds(exp.config.data, c.comparisons)
  sizes = {"train": c.num_pairs, "valid1": c.num_val_pairs}
  for split, path in paths.items():
    theirs = HUMAN[c.comparisons][split]
    if theirs not in builder.info.splits:
      raise ConfigError(f"label.comparisons: {builder.info.full_name} has no split {theirs!r}")
    source = builder.as_data_source(theirs)
    rows = source.__getitems__(range(min(sizes[split], len(source))))
    comps = [tfds_builders.to_comparison(r) for r in rows]
    records.write(path, comps, layout_of(exp, pipeline.posts_of(comps)))
    metrics_lib.info(f"{len(comps)} {split} comparisons of {builder.info.full_name}: {path}")


def _meta(exp: experiment.Experiment) -> dict:
  """The settings the labels depend on. Not `label.protocol`: it picks the files (each protocol's
  set has its own meta), so a workdir labelled before the key existed is reused as it was."""
  c = exp.config
  label = {k: v for k, v in c.label.to_dict().items() if k != "protocol"}
  return json.loads(json.dumps({"label": label, "annotators": c.annotators.to_dict(),
                                "data": c.data.to_dict(), "sft": c.sft.to_dict(),
                                "model": c.model.to_dict(), "format": c.format.to_dict()}))


def binary(exp: experiment.Experiment, paths: dict[str, str]) -> None:
  """label.protocol=binary: writes one sample per post as binary feedback, desirable where the
  annotator prefers it to the post's reference."""
  c = exp.config.label
  if c.comparisons:
    raise ConfigError("label.protocol=binary samples and judges; label.comparisons copies human "
                      "pairs instead (KTO reads those with kto.feedback=pairs)")
  sizes = {"train": c.num_pairs, "valid1": c.num_val_pairs}
  chosen = {split: exp.splits[SPLITS[split]][:sizes[split]] for split in paths}
  annotator = judges.build(exp, "label.annotator", c.annotator,
                           [e for examples in chosen.values() for e in examples])
  params = loaders.load_policy(exp)
  key = jax.random.fold_in(jax.random.key(exp.config.seed), rng_streams.LABEL_BINARY)
  for i, (split, path) in enumerate(paths.items()):
    examples = chosen[split]
    (texts,) = sample(exp, params, examples, jax.random.fold_in(key, i), k=1)
    # A label per sample: preferred to the reference or not (a tie is the annotator's coin flip).
    up = annotator.annotate(examples, texts, [e.reference for e in examples],
                            np.random.default_rng([exp.config.seed, 13, i])) == 0
    records.write_binary(path, [
        records.Feedback(completion=t, label=bool(u), annotator=annotator.name, split=split,
                         policy=f"sft-t{c.temperature:g}", batch="label",
                         **pipeline.comparison_prompt(e))
        for e, t, u in zip(examples, texts, up)])
    metrics_lib.info(f"labelled {len(examples)} {split} samples with {annotator.name}, "
                     f"{int(up.sum())} desirable ({up.mean():.0%}): {path}")


def label(exp: experiment.Experiment) -> dict[str, str]:
  """Writes (or reuses) the train and validation files of `label.protocol`; returns their paths."""
  c = exp.config.label
  if c.protocol not in PROTOCOLS:
    raise ConfigError(f"label.protocol must be one of {PROTOCOLS}, got {c.protocol!r}")
  task_dir = exp.task_dir("label")
  prefix = "binary_" if c.protocol == "binary" else ""
  paths = {"train": os.path.join(task_dir, f"{prefix}train.jsonl"),
           "valid1": os.path.join(task_dir, f"{prefix}valid.jsonl")}
  meta_path = os.path.join(task_dir, f"{prefix}meta.json")
  meta, what = _meta(exp), "binary feedback" if prefix else "comparisons"
  if os.path.exists(meta_path) and all(os.path.exists(p) for p in paths.values()):
    with open(meta_path, encoding="utf-8") as f:
      refused = loop.meta_differences(json.load(f), meta)[1]
    if refused:  # The SFT policy's learning rate may have changed on a resume; nothing else.
      raise ConfigError(f"{task_dir} holds {what} made under another configuration "
                        f"({', '.join(refused)}); use a new --workdir or restore the old settings")
    metrics_lib.info(f"{what} already labelled: {task_dir}")
    return paths
  if c.protocol == "binary":
    binary(exp, paths)
    experiment.write_json(meta_path, meta)
    return paths
  if c.comparisons:
    human_comparisons(exp, paths)
    experiment.write_json(meta_path, meta)
    return paths

  sizes = {"train": c.num_pairs, "valid1": c.num_val_pairs}
  chosen = {split: exp.splits[SPLITS[split]][:sizes[split]] for split in paths}
  prompts = [e for examples in chosen.values() for e in examples]
  layout = layout_of(exp, prompts)
  annotator = judges.build(exp, "label.annotator", c.annotator, prompts)
  params = loaders.load_policy(exp)
  key = jax.random.fold_in(jax.random.key(exp.config.seed), rng_streams.LABEL_PAIRS)
  held_out = None
  for i, (split, path) in enumerate(paths.items()):
    examples = chosen[split]
    a, b = sample(exp, params, examples, jax.random.fold_in(key, i))
    choices = annotator.annotate(examples, a, b, np.random.default_rng([exp.config.seed, 11, i]))
    records.write(path, to_records(examples, a, b, choices, annotator.name, split,
                                   f"sft-t{c.temperature:g}"), layout)
    held_out = (examples, a, b)
    metrics_lib.info(f"labelled {len(examples)} {split} pairs with {annotator.name}: {path}")

  report = annotator_reports(exp, annotator, *held_out)
  experiment.write_json(os.path.join(task_dir, "annotators.json"), report)
  table = agreement.format_reports(report)
  experiment.write_text(os.path.join(task_dir, "annotators.md"), table + "\n")
  metrics_lib.info(f"\nAnnotators on {len(held_out[0])} held-out SFT pairs:\n{table}")
  experiment.write_json(meta_path, meta)  # Written last: its presence marks a finished labelling.
  return paths


def annotator_reports(exp: experiment.Experiment, chosen: annotators.Annotator,
                      examples: Sequence[pipeline.Example], a: Sequence[str],
                      b: Sequence[str]) -> dict[str, dict[str, float]]:
  """Agreement with gold, variance and length preference of the simulated pools and `chosen` (of
  `chosen` alone, without gold, on real data)."""
  rng = np.random.default_rng([exp.config.seed, 12])
  reported: dict[str, Any] = (dict(annotators.pools(exp.config.annotators))
                              if pipeline.has_gold(examples) else {})
  reported.setdefault(chosen.name, chosen)
  draws = exp.config.label.report_draws
  return {name: agreement.annotator_report(j, examples, a, b, rng, draws)
          for name, j in reported.items()}


def run(config, workdir: str) -> dict[str, str]:
  return label(experiment.prepare(config, workdir))
