"""Binary reward conditioning (task=reward_conditioning; AlpacaFarm's reference method, after
Keskar et al.'s control codes): fine-tune the SFT policy on both responses of every training
comparison, the preferred one after the `positive` control code and the other after `negative`;
then answer after `positive`.

The control code is a line of text before the prompt (`formats.tldr_prompt`). The comparisons are
task=rm's; the optimiser settings are the `reward_conditioning` block's.
"""

from __future__ import annotations

from typing import Any

from rlhfjax.algorithms import sft
from rlhfjax.data import pipeline
from rlhfjax.data import records
from rlhfjax.errors import ConfigError
from rlhfjax.rollout import outputs
from rlhfjax.training import experiment
from rlhfjax.training import loaders

TASK = "reward_conditioning"


def conditioned_data(exp: experiment.Experiment, comps: list[records.Comparison], positive: str,
                     negative: str) -> pipeline.Batch:
  """Chosen responses after `positive`, rejected ones after `negative` (2 rows per comparison)."""
  chosen, rejected = zip(*records.preferred(comps))
  posts = pipeline.posts_of(comps)
  fmt = exp.config.format
  return pipeline.encode_targets(exp.tokenizer, posts + posts, list(chosen) + list(rejected),
                                 fmt.prompt_len, fmt.response_len,
                                 [positive] * len(comps) + [negative] * len(comps))


def run(config, workdir: str) -> Any:
  exp = experiment.prepare(config, workdir)
  c = config[TASK]
  if not c.positive or c.positive == c.negative:
    raise ConfigError(f"{TASK}.positive and {TASK}.negative must be two different non-empty codes")
  comps = loaders.load_comparisons(loaders.comparison_files(exp)["train"],
                                   config.rm.layout, columns=loaders.columns(exp))
  sft_params = loaders.load_policy(exp)
  state = sft.train(exp, TASK, conditioned_data(exp, comps, c.positive, c.negative), sft_params)
  outputs.save_policy(exp, TASK, state.params, sft_params, control=c.positive)
  return state
