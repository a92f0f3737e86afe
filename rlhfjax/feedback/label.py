"""task=label: sample response pairs from the SFT policy and have an annotator compare them.

Two responses per post are sampled at `label.temperature` (1.0, as in AlpacaFarm) on the PREF split
(training pairs) and on the validation split (held-out pairs), labelled by `label.annotator`, and
written as OpenAI-layout comparison files `<workdir>/label/{train,valid}.jsonl`. Beside them,
`annotators.md` reports each annotator's agreement with the gold argmax, its variance and its length
preference on the held-out pairs. A rerun with the same settings reuses the files.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import jax
import numpy as np

from rlhfjax.algorithms import reward_model
from rlhfjax.algorithms import sft
from rlhfjax.data import pipeline
from rlhfjax.data import world
from rlhfjax.errors import ConfigError
from rlhfjax.evaluation import agreement
from rlhfjax.feedback import annotators
from rlhfjax.feedback import records
from rlhfjax.models import generate
from rlhfjax.models import sampling
from rlhfjax.training import experiment
from rlhfjax.training import metrics as metrics_lib

SPLITS = {"train": "pref", "valid1": "validation"}  # Comparison split -> data split.


def sample_pairs(exp: experiment.Experiment, params: Any, examples: Sequence[world.Example],
                 rng: jax.Array) -> tuple[list[str], list[str]]:
  """Two independent samples from the policy for each post."""
  c = exp.config.label
  prompts = pipeline.encode_prompts(exp.tokenizer, examples, exp.config.format.prompt_len)
  both = {k: np.concatenate([v, v]) for k, v in prompts.items()}
  scfg = sampling.SamplingConfig(max_new_tokens=exp.config.format.response_len,
                                 temperature=c.temperature, top_k=c.top_k, top_p=c.top_p,
                                 eos_id=exp.tokenizer.eos_id, pad_id=exp.tokenizer.pad_id)
  out = generate.generate(params, exp.model, scfg, both, rng, c.batch_size)
  texts = [exp.tokenizer.decode(r).strip() for r in out["response"]]
  return texts[:len(examples)], texts[len(examples):]


def to_records(examples: Sequence[world.Example], a: Sequence[str], b: Sequence[str],
               choices: np.ndarray, annotator: str, split: str, policy: str) -> list[records.Comparison]:
  return [records.Comparison(prompt=e.post, response_a=x, response_b=y, choice=int(ch),
                             annotator=annotator, split=split, policy_a=policy, policy_b=policy,
                             id=e.id, title=e.title, subreddit=e.subreddit, batch="label")
          for e, x, y, ch in zip(examples, a, b, choices)]


def _meta(exp: experiment.Experiment) -> dict:
  c = exp.config
  return json.loads(json.dumps({"label": c.label.to_dict(), "annotators": c.annotators.to_dict(),
                                "data": c.data.to_dict(), "sft": c.sft.to_dict(),
                                "model": c.model.to_dict(), "format": c.format.to_dict()}))


def label(exp: experiment.Experiment) -> dict[str, str]:
  """Writes (or reuses) the train and validation comparison files; returns their paths."""
  c = exp.config.label
  task_dir = exp.task_dir("label")
  paths = {"train": os.path.join(task_dir, "train.jsonl"),
           "valid1": os.path.join(task_dir, "valid.jsonl")}
  meta_path = os.path.join(task_dir, "meta.json")
  meta = _meta(exp)
  if os.path.exists(meta_path) and all(os.path.exists(p) for p in paths.values()):
    with open(meta_path, encoding="utf-8") as f:
      if json.load(f) != meta:
        raise ConfigError(f"{task_dir} holds comparisons made under another configuration; use a "
                          "new --workdir or restore the old settings")
    metrics_lib.info(f"comparisons already labelled: {task_dir}")
    return paths

  params = sft.load_policy(exp)
  annotator = annotators.build(c.annotator, exp.config.annotators,
                               reward_model=lambda: reward_model.annotator(exp))
  sizes = {"train": c.num_pairs, "valid1": c.num_val_pairs}
  key = jax.random.fold_in(jax.random.key(exp.config.seed), 11)
  held_out = None
  for i, (split, path) in enumerate(paths.items()):
    examples = exp.splits[SPLITS[split]][:sizes[split]]
    a, b = sample_pairs(exp, params, examples, jax.random.fold_in(key, i))
    choices = annotator.annotate(examples, a, b, np.random.default_rng([exp.config.seed, 11, i]))
    records.write(path, to_records(examples, a, b, choices, annotator.name, split,
                                   f"sft-t{c.temperature:g}"), "openai")
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
                      examples: Sequence[world.Example], a: Sequence[str],
                      b: Sequence[str]) -> dict[str, dict[str, float]]:
  """Agreement with gold, variance and length preference of the simulated pools and `chosen`."""
  rng = np.random.default_rng([exp.config.seed, 12])
  judges: dict[str, Any] = dict(annotators.pools(exp.config.annotators))
  judges.setdefault(chosen.name, chosen)
  draws = exp.config.label.report_draws
  return {name: agreement.annotator_report(j, examples, a, b, rng, draws) for name, j in judges.items()}


def run(config, workdir: str) -> dict[str, str]:
  return label(experiment.prepare(config, workdir))
