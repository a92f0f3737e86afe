"""The annotator a config names, built for the examples it is to judge: task=label's labeller and
task=eval's judge (`label.annotator`, `eval.annotator`)."""

from __future__ import annotations

from typing import Sequence

from rlhfjax.data import pipeline
from rlhfjax.errors import ConfigError
from rlhfjax.feedback import annotators
from rlhfjax.rollout import rewards
from rlhfjax.training import experiment
from rlhfjax.training import loaders


def build(exp: experiment.Experiment, key: str, name: str,
          examples: Sequence[pipeline.Example]) -> annotators.Annotator:
  """The annotator `name` (config key `key`) for judging responses to `examples`: a simulated one
  (`annotators.POOL_NAMES`) only where the examples have gold, as it judges by their situation."""
  if name in annotators.POOL_NAMES and not pipeline.has_gold(examples):
    raise ConfigError(f"{key}: {name!r} is a simulated annotator, which judges by the latent "
                      "situation of the simulated world, and these examples (real data) have "
                      "none: use 'rm' (the trained reward model) or 'file:PATH' (a comparisons "
                      "file)")
  return annotators.build(name, exp.config.annotators,
                          reward_model=lambda: reward_model_annotator(exp))


def reward_model_annotator(exp: experiment.Experiment) -> annotators.Annotator:
  """The workdir's reward model as an annotator."""
  params = loaders.load_reward_model(exp)[0]
  return annotators.RewardModelAnnotator(
      "rm", lambda examples, texts: rewards.score_texts(params, exp, examples, texts))
