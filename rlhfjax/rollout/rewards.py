"""The reward of decoded texts: the reward model's score (`models/reward.score`) of each text as a
response to its example, plus the weighted reward functions (`reward_functions`). Best-of-N, expert
iteration and the online methods rank or train on it; the reward model's report and the `rm`
annotator read `score_texts`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from rlhfjax.data import pipeline
from rlhfjax.models.reward import score_batch
from rlhfjax.parallel.sharding import to_host
from rlhfjax.rollout import reward_functions
from rlhfjax.training import experiment
from rlhfjax.training import loaders
from rlhfjax.training import metrics as metrics_lib


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
  params = (loaders.load_reward_model(exp)[0] if reward_functions.uses_model(exp.config.reward)
            else None)
  return reward_of_texts(exp, params, reward_functions.load(exp.config.reward))


def reward_template(exp: experiment.Experiment) -> Any:
  """The abstract reward model a run reads (None: `reward.model_weight` 0, functions alone)."""
  return (loaders.reward_model_template(exp) if reward_functions.uses_model(exp.config.reward)
          else None)
