"""Expert iteration (task=expert_iteration), AlpacaFarm's variant: best-of-n on the unlabeled split
with the SFT policy and the reward model, then supervised fine-tuning of the SFT policy on the
winners.

The winners are written to `<workdir>/expert_iteration/winners.json` (so a rerun reuses them) and
the fine-tuning is the SFT loop with the `expert_iteration` block's optimiser settings, starting
from the SFT parameters; at the end the policy answers the test prompts for task=eval.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax

from rlhfjax import rng_streams
from rlhfjax.algorithms import best_of_n
from rlhfjax.algorithms import sft
from rlhfjax.data import pipeline
from rlhfjax.rollout import outputs
from rlhfjax.rollout import rewards
from rlhfjax.training import experiment
from rlhfjax.training import loaders
from rlhfjax.training import metrics as metrics_lib

TASK = "expert_iteration"


def winners(exp: experiment.Experiment, sft_params: Any) -> list[pipeline.Tldr]:
  """The unlabeled prompts with the reward model's best of n SFT samples as their target."""
  c = exp.config[TASK]
  path = os.path.join(exp.task_dir(TASK), "winners.json")
  examples = exp.splits["unlabeled"][:c.num_prompts]
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      stored = json.load(f)
    if (stored["n"], stored.get("temperature"), stored["ids"], stored.get("reward")) == (
        c.n, c.temperature, [e.id for e in examples], exp.config.reward.to_dict()):
      return [dataclasses.replace(e, reference=t) for e, t in zip(examples, stored["winners"])]
  reward_fn = rewards.training_reward(exp)
  cands = best_of_n.candidates(exp, sft_params, examples, c.n, c.temperature,
                               jax.random.key(exp.config.seed + rng_streams.EXPERT_ITERATION), c.sample_batch_size)
  scores = best_of_n.score_candidates(reward_fn, examples, cands)
  texts = best_of_n.best_of(cands, scores, c.n)
  metrics_lib.info(f"expert iteration: best-of-{c.n} on {len(examples)} unlabeled prompts, mean "
                   f"reward {scores.max(1).mean():.3f} (a single sample: {scores[:, 0].mean():.3f})")
  experiment.write_json(path, {"n": c.n, "temperature": c.temperature,
                               "ids": [e.id for e in examples], "winners": texts,
                               "reward": exp.config.reward.to_dict()})
  return [dataclasses.replace(e, reference=t) for e, t in zip(examples, texts)]


def run(config, workdir: str) -> Any:
  best_of_n.check_temperature(TASK, config[TASK].temperature)
  exp = experiment.prepare(config, workdir)
  sft_params = loaders.load_policy(exp)
  fmt = config.format
  data = pipeline.encode_sft(exp.tokenizer, winners(exp, sft_params), fmt.prompt_len,
                             fmt.response_len)
  state = sft.train(exp, TASK, data, sft_params)
  outputs.save_policy(exp, TASK, state.params, sft_params)
  return state
