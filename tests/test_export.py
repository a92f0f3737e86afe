"""task=export on the tiny pipeline: the PPO policy and the normalised reward model come back from
their Hugging Face directories bit-exact, and the reward model scores as before."""

import json
import os

import jax
import numpy as np
import pytest

from rlhfjax import main
from rlhfjax.algorithms import ppo
from rlhfjax.algorithms import reward_model
from rlhfjax.errors import ConfigError
from rlhfjax.models import hf_checkpoint
from rlhfjax.rollout import rewards
from rlhfjax.training import experiment
from rlhfjax.training import loaders


def _export(config, workdir, model):
  config = config.copy_and_resolve_references()
  config.task = "export"
  config.export.model = model
  return main.run(config, workdir)


def _assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


def test_export_policy_round_trips(tiny_pipeline):
  config, workdir = tiny_pipeline
  directory = _export(config, workdir, "ppo")
  assert directory == os.path.join(workdir, "export", "ppo")
  params, cfg = hf_checkpoint.load(directory)
  exp = experiment.prepare(config, workdir)
  # A checkpoint holds the architecture; whether the layers run as a scan is the loader's choice.
  assert cfg.replace(scan_layers=exp.model.scan_layers) == exp.model
  _assert_trees_equal(params, jax.tree.map(np.asarray, ppo.load_policy(exp)))
  with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
    assert json.load(f)["architectures"] == ["GPT2LMHeadModel"]


def test_export_reward_model_keeps_scores_and_offset(tiny_pipeline):
  config, workdir = tiny_pipeline
  directory = _export(config, workdir, "rm")
  exp = experiment.prepare(config, workdir)
  want, meta = loaders.load_reward_model(exp)
  params, _ = hf_checkpoint.load(directory, reward=True)
  _assert_trees_equal(params, jax.tree.map(np.asarray, want))
  with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
    hf = json.load(f)
  assert hf["architectures"] == ["GPT2ForSequenceClassification"] and hf["num_labels"] == 1
  assert hf["pad_token_id"] == exp.tokenizer.pad_id
  # The normalisation offset lives in the bias, which transformers' score layer lacks.
  assert hf["reward_bias"] == pytest.approx(float(np.asarray(want["head"]["bias"])))
  # The tiny config's reward model has a likelihood term: its weight travels in config.json.
  assert hf["reward_likelihood_weight"] == pytest.approx(
      float(np.asarray(want[reward_model.LIKELIHOOD]["weight"])))
  assert meta["normalization"]["mean"] != 0.0
  examples = exp.splits["test"][:4]
  texts = [e.reference for e in examples]
  np.testing.assert_array_equal(rewards.score_texts(params, exp, examples, texts),
                                rewards.score_texts(want, exp, examples, texts))


def test_export_refuses_unknown_model(tiny_pipeline):
  config, workdir = tiny_pipeline
  with pytest.raises(ConfigError, match="export.model"):
    _export(config, workdir, "policy")
