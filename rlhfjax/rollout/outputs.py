"""Each method's responses on the test prompts, `<workdir>/<method>/outputs.json`: what task=eval
judges. Policies answer at `eval.temperature` (0: greedy). Their KL to SFT is that of the two
samplers at the evaluation temperature (temperature 1 for greedy), estimated on the policy's own
samples, so it compares with best-of-N's analytic KL to the SFT sampler it draws from.

On a verifiable task (`eval.pass_k` > 0), each policy also answers every test prompt `pass_k` times
at `eval.pass_temperature`, and `eval.correct` (a reward function that gives 1.0 to a right
answer) marks each sample: the outputs file keeps how many of each prompt's samples are right,
which `evaluation/pass_at_k.py` turns into pass@1 and pass@k.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import jax
import numpy as np

from rlhfjax import rng_streams
from rlhfjax.data import pipeline
from rlhfjax.rollout import engine
from rlhfjax.rollout import reward_functions
from rlhfjax.training import experiment


def path(workdir: str, method: str) -> str:
  return os.path.join(workdir, method, "outputs.json")


def save(exp: experiment.Experiment, method: str, examples: Sequence[pipeline.Tldr],
         texts: Sequence[str], kl: float, **extra: Any) -> None:
  """Writes the outputs file atomically."""
  exp.task_dir(method)
  experiment.write_json(path(exp.workdir, method), {
      "method": method, "kl": float(kl), **extra,
      "outputs": [{"id": e.id, "output": t} for e, t in zip(examples, texts)]})


def load(workdir: str, method: str) -> dict[str, Any]:
  p = path(workdir, method)
  if not os.path.exists(p):
    raise FileNotFoundError(f"no outputs for method {method!r}: {p} is missing (run task={method} "
                            "first, or remove it from eval.methods)")
  with open(p, encoding="utf-8") as f:
    return json.load(f)


def test_examples(exp: experiment.Experiment) -> list[pipeline.Tldr]:
  return exp.splits["test"][:exp.config.eval.num_examples]


def kl_temperature(exp: experiment.Experiment) -> float:
  """The temperature at which methods are compared by KL: the evaluation's (1 for greedy)."""
  return exp.config.eval.temperature if exp.config.eval.temperature > 0 else 1.0


def pass_counts(exp: experiment.Experiment, params: Any, examples: Sequence[pipeline.Example],
                control: str = "") -> dict[str, Any]:
  """{'pass': {'n', 'temperature', 'correct'}}: how many of `eval.pass_k` samples of each example
  `eval.correct` finds right; {} when `eval.pass_k` is 0."""
  e = exp.config.eval
  k = int(e.pass_k)
  if k <= 0:
    return {}
  correct = reward_functions.load({"functions": e.correct, "weights": "", "model_weight": 1.0})
  repeated = [x for x in examples for _ in range(k)]
  key = jax.random.key(exp.config.seed + rng_streams.PASS_AT_K)
  texts, _ = engine.sample_texts(exp, params, repeated, key, e.pass_temperature, e.batch_size,
                                 control=control)
  ids = [exp.tokenizer.encode(t) for t in texts]
  _, values = reward_functions.evaluate(correct, repeated, texts, ids)
  right = np.nan_to_num(next(iter(values.values()))).reshape(len(examples), k) == 1.0
  return {"pass": {"n": k, "temperature": float(e.pass_temperature),
                   "correct": [int(c) for c in right.sum(1)]}}


def save_policy(exp: experiment.Experiment, method: str, params: Any, sft_params: Any,
                control: str = "") -> None:
  """Answers the test prompts with `params` (after `control`, for the conditioned methods) and
  saves them with the policy's KL to SFT."""
  e = exp.config.eval
  examples = test_examples(exp)
  key = jax.random.key(exp.config.seed + rng_streams.OUTPUTS)
  texts, _ = engine.sample_texts(exp, params, examples, key, e.temperature, e.batch_size,
                                 top_k=e.top_k, top_p=e.top_p, control=control)
  _, kl = engine.sample_texts(exp, params, examples, jax.random.fold_in(key, 1),
                              kl_temperature(exp), e.batch_size, sft_params, control=control)
  save(exp, method, examples, texts, float(np.mean(kl)), temperature=e.temperature,
       **pass_counts(exp, params, examples, control))
