"""Binary FeedME (task=feedme; AlpacaFarm's reference method after OpenAI's FeedME): supervised
fine-tuning of the SFT policy on the preferred response of every training comparison.

The comparisons are task=rm's (`rm.train_file`, or task=label's output); the optimiser settings are
the `feedme` block's. At the end the policy answers the test prompts for task=eval.
"""

from __future__ import annotations

from typing import Any

from rlhfjax.algorithms import sft
from rlhfjax.data import pipeline
from rlhfjax.data import records
from rlhfjax.rollout import outputs
from rlhfjax.training import experiment
from rlhfjax.training import loaders


def run(config, workdir: str) -> Any:
  exp = experiment.prepare(config, workdir)
  comps = loaders.load_comparisons(loaders.comparison_files(exp)["train"],
                                   config.rm.layout, columns=loaders.columns(exp))
  chosen = [c for c, _ in records.preferred(comps)]
  data = pipeline.encode_targets(exp.tokenizer, pipeline.posts_of(comps), chosen,
                                 config.format.prompt_len, config.format.response_len)
  sft_params = loaders.load_policy(exp)
  state = sft.train(exp, "feedme", data, sft_params)
  outputs.save_policy(exp, "feedme", state.params, sft_params)
  return state
