"""Reward model: the Bradley–Terry loss by hand, the score read at the last real token, normalisation,
training that learns, and the SFT -> label -> RM pipeline with its outputs and reruns."""

import dataclasses
import functools
import json
import math
import shutil
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rlhfjax.algorithms import reward_model
from rlhfjax.data import records
from rlhfjax.errors import ConfigError, DataError
from rlhfjax.evaluation import agreement
from rlhfjax.evaluation import rm_report
from rlhfjax import main
from rlhfjax.models.config import ModelConfig
from rlhfjax.models import heads
from rlhfjax.models import policy
from rlhfjax.models import transformer
from rlhfjax.rollout import rewards
from rlhfjax.training import loaders
from rlhfjax.training import optimizer
from rlhfjax.training.state import TrainState

CFG = ModelConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32, max_len=24)
PARAMS = heads.init(jax.random.key(0), CFG)


def test_bradley_terry_hand_computed():
  out = reward_model.bradley_terry(jnp.array([1.0, -0.5, 2.0]), jnp.array([0.0, 0.5, 2.0]))
  # Margins 1, -1, 0: losses log(1 + e^-1), log(1 + e), log 2.
  expected = (math.log1p(math.exp(-1)) + math.log1p(math.e) + math.log(2)) / 3
  assert float(out["loss"]) == pytest.approx(expected, rel=1e-6)
  assert float(out["accuracy"]) == pytest.approx(1.5 / 3)  # The tie (margin 0) counts 1/2.
  assert float(out["margin"]) == pytest.approx(0.0, abs=1e-7)


def _batch(prompt, response, prompt_len, response_len):
  """One row: `prompt` left-padded to prompt_len, `response` right-padded to response_len."""
  p = np.zeros((1, prompt_len), np.int32)
  pm = np.zeros((1, prompt_len), bool)
  p[0, prompt_len - len(prompt):], pm[0, prompt_len - len(prompt):] = prompt, True
  r = np.full((1, response_len), 7, np.int32)  # Padding with a real-looking id: it must not count.
  rm = np.zeros((1, response_len), bool)
  r[0, :len(response)], rm[0, :len(response)] = response, True
  return {"prompt": p, "prompt_mask": pm, "response": r, "response_mask": rm}


def test_reward_read_at_last_real_token_whatever_the_padding():
  prompt, response = [5, 9, 4], [12, 13, 1]
  scores = [float(reward_model.score(PARAMS, _batch(prompt, response, pl, rl), CFG)[0])
            for pl, rl in ((3, 3), (6, 3), (3, 8), (8, 9))]
  np.testing.assert_allclose(scores, scores[0], rtol=1e-5)
  # It is the per-token value at the eos, and differs from the value one token earlier.
  b = _batch(prompt, response, 6, 5)
  tokens = np.concatenate([b["prompt"], b["response"]], 1)
  mask = np.concatenate([b["prompt_mask"], b["response_mask"]], 1)
  v = heads.values(PARAMS, tokens, mask, CFG)[0]
  assert int(heads.last_token_index(mask)[0]) == 8
  assert float(v[8]) == pytest.approx(scores[0], rel=1e-5)
  assert abs(float(v[7]) - scores[0]) > 1e-4


# The same model with the likelihood term (rm.likelihood_weight = 1.5).
PARAMS_LIK = {**PARAMS, reward_model.LIKELIHOOD: {"weight": jnp.asarray(1.5)}}


def test_likelihood_term_adds_weight_times_mean_token_logprob():
  prompt, response = [5, 9, 4], [12, 13, 1]
  b = _batch(prompt, response, 6, 5)
  # By hand: log p of each response token given everything before it, on the unpadded sequence.
  seq = np.array([prompt + response])
  logp, _ = transformer.token_logprobs(PARAMS["backbone"], seq, np.ones_like(seq, bool), CFG)
  mean_logp = float(np.asarray(logp)[0, len(prompt) - 1:].mean())
  head_only = float(reward_model.score(PARAMS, b, CFG)[0])
  assert float(reward_model.score(PARAMS_LIK, b, CFG)[0]) == pytest.approx(
      head_only + 1.5 * mean_logp, rel=1e-5)
  # Padding on either side changes nothing, and a weight of 0 is the head alone.
  for pl, rl in ((3, 3), (8, 9)):
    assert float(reward_model.score(PARAMS_LIK, _batch(prompt, response, pl, rl), CFG)[0]) == (
        pytest.approx(head_only + 1.5 * mean_logp, rel=1e-5))
  zero = {**PARAMS, reward_model.LIKELIHOOD: {"weight": jnp.asarray(0.0)}}
  assert float(reward_model.score(zero, b, CFG)[0]) == pytest.approx(head_only, rel=1e-6)


def test_init_reward_model_with_a_zero_head_is_the_likelihood_judge():
  """rm.head_init_scale=0 and rm.likelihood_weight=3: before training the score is 3 x the mean
  token log-probability (the head reads zero); scale 1 is Stiennon et al.'s N(0, 1/(d + 1)) head."""
  def exp(weight, scale):
    rm = ml_collections.ConfigDict(dict(likelihood_weight=weight, head_init_scale=scale))
    return types.SimpleNamespace(config=ml_collections.ConfigDict(dict(seed=0, rm=rm)), model=CFG)

  judge = loaders.init_reward_model(exp(3.0, 0.0), PARAMS["backbone"])
  b = _batch([5, 9, 4], [12, 13, 1], 6, 5)
  hidden, _, last = policy.hidden_states(PARAMS["backbone"], b, CFG)
  mean_logp = float(policy.mean_response_logprob(PARAMS["backbone"], hidden, last, b, CFG)[0])
  assert float(reward_model.score(judge, b, CFG)[0]) == pytest.approx(3.0 * mean_logp, rel=1e-6)
  assert set(judge) == set(loaders.reward_model_axes(exp(3.0, 0.0))) == {"backbone", "head",
                                                                           "likelihood"}
  plain = loaders.init_reward_model(exp(0.0, 1.0), PARAMS["backbone"])
  assert set(plain) == set(loaders.reward_model_axes(exp(0.0, 1.0))) == {"backbone", "head"}
  assert float(jnp.std(plain["head"]["kernel"])) == pytest.approx(1 / math.sqrt(CFG.d_model + 1),
                                                                  rel=0.5)


@pytest.mark.parametrize("model", [PARAMS, PARAMS_LIK], ids=["head", "head+likelihood"])
def test_normalisation_gives_mean_zero_on_the_chosen_set(model):
  rng = np.random.default_rng(0)
  batch = {"prompt": rng.integers(4, 32, (16, 6)).astype(np.int32), "prompt_mask": np.ones((16, 6), bool),
           "response": rng.integers(4, 32, (16, 5)).astype(np.int32),
           "response_mask": np.arange(5)[None] < rng.integers(1, 6, (16, 1))}
  raw = np.asarray(reward_model.score(model, batch, CFG))
  for with_std in (False, True):
    params, norm = reward_model.normalize(model, raw, with_std)
    after = np.asarray(reward_model.score(params, batch, CFG))
    assert abs(after.mean()) < 1e-5 and norm["mean"] == pytest.approx(raw.mean(), rel=1e-6)
    np.testing.assert_allclose(after, (raw - raw.mean()) * norm["gain"], atol=1e-5)
    if with_std:
      assert after.std() == pytest.approx(1.0, rel=1e-4)


def test_train_step_learns_a_preference():
  """Chosen responses end with token 20, rejected ones with 21: a few steps must separate them."""
  rng = np.random.default_rng(1)
  n = 16
  prompt = rng.integers(4, 32, (n, 6)).astype(np.int32)
  body = rng.integers(4, 20, (n, 4)).astype(np.int32)
  mask = np.ones((n, 5), bool)
  batch = {"prompt": prompt, "prompt_mask": np.ones((n, 6), bool),
           "chosen": np.concatenate([body, np.full((n, 1), 20, np.int32)], 1), "chosen_mask": mask,
           "rejected": np.concatenate([body, np.full((n, 1), 21, np.int32)], 1), "rejected_mask": mask}
  tx = optimizer.adamw(dict(lr=3e-3, warmup_steps=0, schedule="constant", end_lr_frac=1.0, b1=0.9,
                            b2=0.95, eps=1e-8, weight_decay=0.0, grad_clip=1.0,
                            skip_nonfinite=0), 30)
  step = jax.jit(functools.partial(reward_model.train_step, cfg=CFG, tx=tx))
  state = TrainState.create(PARAMS, tx)
  state, first = step(state, batch)
  for _ in range(30):
    state, m = step(state, batch)
  assert float(m["train/loss"]) < 0.2 < float(first["train/loss"])
  assert float(m["train/accuracy"]) == 1.0 and float(m["train/margin"]) > 1.0


def test_train_step_adds_the_weighted_contrastive_loss():
  """With `contrast_*` pairs in the batch the loss is BT(labelled) + weight x BT(contrastive), each
  the loss of the scores computed on its own."""
  rng = np.random.default_rng(2)

  def pairs(n):
    ids = lambda shape: rng.integers(4, 32, shape).astype(np.int32)
    return {"prompt": ids((n, 6)), "prompt_mask": np.ones((n, 6), bool),
            "chosen": ids((n, 5)), "chosen_mask": np.ones((n, 5), bool),
            "rejected": ids((n, 5)), "rejected_mask": np.ones((n, 5), bool)}

  labelled, extra = pairs(4), pairs(2)
  tx = optimizer.adamw(dict(lr=1e-3, warmup_steps=0, schedule="constant", end_lr_frac=1.0, b1=0.9,
                            b2=0.95, eps=1e-8, weight_decay=0.0, grad_clip=1.0,
                            skip_nonfinite=0), 1)

  def bt(batch):
    r = [reward_model.score(PARAMS, {"prompt": batch["prompt"], "prompt_mask": batch["prompt_mask"],
                                     "response": batch[s], "response_mask": batch[s + "_mask"]}, CFG)
         for s in ("chosen", "rejected")]
    return reward_model.bradley_terry(*r)

  step = jax.jit(functools.partial(reward_model.train_step, cfg=CFG, tx=tx, contrast_weight=0.5))
  _, m = step(TrainState.create(PARAMS, tx),
              {**labelled, **{"contrast_" + k: v for k, v in extra.items()}})
  want_pref, want_contrast = bt(labelled), bt(extra)
  np.testing.assert_allclose(float(m["train/preference_loss"]), float(want_pref["loss"]), rtol=1e-5)
  np.testing.assert_allclose(float(m["train/contrast_loss"]), float(want_contrast["loss"]),
                             rtol=1e-5)
  np.testing.assert_allclose(float(m["train/loss"]),
                             float(want_pref["loss"]) + 0.5 * float(want_contrast["loss"]), rtol=1e-5)
  assert float(m["train/contrast_accuracy"]) == float(want_contrast["accuracy"])
  assert float(m["train/accuracy"]) == float(want_pref["accuracy"])


@pytest.fixture(scope="module")
def pipeline_run(tiny_pipeline):
  config, workdir = tiny_pipeline
  with open(f"{workdir}/rm/eval.json") as f:
    return config, workdir, json.load(f)


def test_pipeline_writes_comparisons_model_and_report(pipeline_run):
  config, workdir, report = pipeline_run
  train = records.read_strict(f"{workdir}/label/train.jsonl", "openai")
  valid = records.read_strict(f"{workdir}/label/valid.jsonl", "openai")
  assert len(train) == config.label.num_pairs and len(valid) == config.label.num_val_pairs
  assert {c.split for c in train} == {"train"} and {c.annotator for c in train} == {"train_pool"}
  assert all(c.id.startswith("sim-") and c.policy_a == "sft-t0.7" for c in train)
  with open(f"{workdir}/label/annotators.json") as f:
    pools = json.load(f)
  assert pools["gold"]["gold_agreement"] == 1.0 and pools["gold"]["variance"] == 0.0
  for key in ("accuracy", "accuracy_eval_pool", "accuracy_gold", "length_accuracy_gold",
              "likelihood_accuracy_gold", "margin"):
    assert key in report, key
  assert len(report["probes"]) == 8 and len(report["agreement"]["names"]) == 10
  assert report["label_source"] == "training pool, 25% flipped"
  assert report["agreement"]["names"][0] == "train pool"
  split = report["by_component"]
  assert set(split) <= set(agreement.DECIDING) and split, split
  assert all(set(row) == {"pairs", "RM", "length", "SFT mean log p", "training labels"}
             for row in split.values())
  with open(f"{workdir}/rm/eval.json") as f:
    assert json.load(f)["pairs"] == config.label.num_val_pairs


def test_saved_reward_model_is_normalised_on_references(pipeline_run):
  config, workdir, _ = pipeline_run
  from rlhfjax.training import experiment
  exp = experiment.prepare(config, workdir)
  params, meta = loaders.load_reward_model(exp)
  refs = exp.splits["pref"][:config.rm.norm_examples]
  scores = rewards.score_texts(params, exp, refs, [e.reference for e in refs])
  assert abs(scores.mean()) < 1e-4
  assert meta["normalization"]["target"] == "reference" and meta["normalization"]["count"] == len(refs)


def test_rerun_reuses_and_refuses_changed_settings(pipeline_run):
  config, workdir, report = pipeline_run
  again = config.copy_and_resolve_references()
  again.stages = "sft,label,rm"
  again = main.run(again, workdir)  # Everything exists: nothing is retrained or relabelled.
  assert again["accuracy"] == report["accuracy"] and again["probes"] == report["probes"]
  changed = config.copy_and_resolve_references()
  changed.label.temperature = 1.0
  with pytest.raises(ConfigError, match="label"):
    main.run(changed, workdir)
  changed = config.copy_and_resolve_references()
  changed.rm.batch_size = 4
  changed.stages = "rm"
  with pytest.raises(ConfigError, match=r"rm/model holds a reward model trained under another "
                     r"configuration \(rm\.batch_size: 8 -> 4\)"):
    main.run(changed, workdir)


def test_rm_without_comparisons_names_the_task(tmp_path):
  from conftest import load_config
  config = load_config()
  config.stages = "rm"
  with pytest.raises(FileNotFoundError, match="task=label"):
    main.run(config, str(tmp_path))


def test_a_copied_workdir_keeps_its_reward_model(pipeline_run, tmp_path):
  config, workdir, report = pipeline_run
  copy = str(tmp_path / "copy")
  shutil.copytree(workdir, copy)
  again = config.copy_and_resolve_references()
  again.stages = "rm"
  assert main.run(again, copy)["accuracy"] == report["accuracy"]  # Reused, not refused.


def test_contrastive_pairs_train_with_the_labels(pipeline_run, tmp_path):
  """rm.contrast_batch_size adds label-free pairs to each step; their settings then determine the
  model (a change is refused), and without them they play no part (the original run is reused)."""
  import shutil
  config, workdir, report = pipeline_run
  unused = config.copy_and_resolve_references()
  unused.stages, unused.rm.contrast_weight = "rm", 5.0  # Off (batch size 0): nothing to refuse.
  assert main.run(unused, workdir)["accuracy"] == report["accuracy"]

  copy = str(tmp_path / "contrast")
  shutil.copytree(workdir, copy, ignore=shutil.ignore_patterns("rm"))
  bad = config.copy_and_resolve_references()
  bad.stages, bad.rm.contrast_batch_size, bad.rm.contrast_split = "rm", 4, "nope"
  with pytest.raises(ConfigError, match="rm.contrast_split"):
    main.run(bad, copy)
  with_pairs = config.copy_and_resolve_references()
  with_pairs.stages, with_pairs.rm.contrast_batch_size = "rm", 4
  main.run(with_pairs, copy)
  with open(f"{copy}/rm/metrics.jsonl") as f:
    last = [json.loads(line) for line in f][-1]
  assert last["train/loss"] == pytest.approx(last["train/preference_loss"]
                                             + last["train/contrast_loss"], rel=1e-5)
  with_pairs.rm.contrast_weight = 0.5
  with pytest.raises(ConfigError, match="rm/model"):
    main.run(with_pairs, copy)


def _exp(data_parallel=1, **rm):
  """A stand-in experiment: the `rm` and `annotators` blocks and the mesh's data-parallel size."""
  config = ml_collections.ConfigDict(dict(rm=rm, annotators=dict(flip_rate=0.25)))
  return types.SimpleNamespace(config=config,
                               parallel=types.SimpleNamespace(data_parallel=data_parallel))


def test_train_batch_size_fits_a_small_round_of_labels():
  fit = lambda pairs, dp=1, **rm: reward_model.train_batch_size(
      _exp(dp, **{"batch_size": 32, "epochs": 1.0, **rm}), pairs, "f.jsonl")
  assert fit(4000) == (32, "") and fit(32) == (32, "")
  assert fit(20, epochs=2.0, batch_size=20) == (20, "")
  assert fit(14) == (14, "rm: rm.batch_size 32 is more than the 14 pairs x 1 epoch of f.jsonl: "
                         "training with batch 14 (set rm.batch_size to choose another)")
  assert fit(15, dp=2)[0] == 14  # Splits over the data-parallel devices.
  assert fit(40, epochs=0.5)[0] == 20
  # More epochs do not make a batch larger than the pairs: it holds each pair once.
  assert fit(14, epochs=3.0) == (14, "rm: rm.batch_size 32 is more than the 14 pairs of f.jsonl: "
                                     "training with batch 14 (set rm.batch_size to choose another)")
  with pytest.raises(ConfigError, match=r"rm\.batch_size \(32\): the 1 pair x 1 epoch of f\.jsonl "
                     r"fill a batch of at most 1, fewer than the mesh's 2 data-parallel devices "
                     r".*; it needs at least 2 decisive pairs"):
    fit(1, dp=2)
  with pytest.raises(ConfigError, match=r"rm\.batch_size \(32\): the 5 pairs x 0\.1 epochs .*"
                     r"set rm\.epochs=1"):
    fit(5, epochs=0.1)


def _comparison(annotator, batch):
  return records.Comparison(prompt="p", response_a="a", response_b="b", choice=0,
                            annotator=annotator, batch=batch)


def test_label_source_names_where_the_labels_came_from():
  exp = _exp()
  pool = [_comparison("train_pool", "label")] * 3
  human = [_comparison(name, "labeling round: stiennon") for name in ("ada", "bob", "cy", "ada")]
  openai = [_comparison("w1", "batch3"), _comparison("w2", "batch3")]
  assert rm_report.label_source(exp, "x.jsonl", pool) == "training pool, 25% flipped"
  exp.config.annotators.flip_rate = 0.125
  assert rm_report.label_source(exp, "x.jsonl", pool) == "training pool, 12.5% flipped"
  assert rm_report.label_source(exp, "e/train.jsonl", human) == (
      "human labels from a labeling round: 3 labelers, stiennon protocol, e/train.jsonl")
  assert rm_report.label_source(exp, "o.jsonl", openai) == "labels of o.jsonl"
  for source in ("training pool, 25% flipped", "human labels from a labeling round: 3 labelers, "
                 "stiennon protocol, e/train.jsonl", "labels of o.jsonl"):
    text = rm_report.format_report({"pairs": 2, "label_source": source, "accuracy": 0.5,
                                    "train_accuracy": 1.0, "margin": 0.25})
    assert text.splitlines()[1] == (f"- accuracy on the labels it learns from ({source}): 50.0% "
                                    "held out, 100.0% on training pairs")


def test_a_small_round_of_human_labels_trains_and_names_its_source(pipeline_run, tmp_path,
                                                                   capsys):
  """A labeling round's export: 5 decisive labels and a tie from 3 labelers train with the batch
  they fill (the config's is 8), on 2 decisive validation pairs; a rerun reuses the model, a
  resume from the checkpoint gives the same model, and files with nothing decisive are refused."""
  config, workdir, _ = pipeline_run
  work = str(tmp_path / "work")
  shutil.copytree(workdir, work, ignore=shutil.ignore_patterns("rm"))
  export = tmp_path / "export"
  export.mkdir()

  def human(split, n, tie):
    comps = records.read_strict(f"{workdir}/label/{split}.jsonl", "openai")[:n]
    return [dataclasses.replace(c, annotator=("ada", "bob", "cy")[i % 3],
                                batch="labeling round: stiennon", tie=i == tie)
            for i, c in enumerate(comps)]

  files = {name: str(export / f"{name}.jsonl") for name in ("train", "valid", "ties", "empty")}
  records.write(files["train"], human("train", 6, 2), "openai")
  records.write(files["valid"], human("valid", 3, 0), "openai")
  records.write(files["ties"], [dataclasses.replace(c, tie=True) for c in human("valid", 2, 0)],
                "openai")
  records.write(files["empty"], [], "openai")
  small = config.copy_and_resolve_references()
  small.stages, small.rm.train_file = "rm", files["train"]
  for bad in ("ties", "empty"):
    small.rm.valid_file = files[bad]
    with pytest.raises(DataError, match=r"rm\.valid_file needs at least one pair with a preferred "
                       "side"):
      main.run(small, work)
  small.rm.valid_file = files["valid"]
  impossible = small.copy_and_resolve_references()
  impossible.rm.epochs = 0.1
  with pytest.raises(ConfigError, match=r"rm\.batch_size \(8\): the 5 pairs x 0\.1 epochs"):
    main.run(impossible, work)
  capsys.readouterr()

  report = main.run(small, work)
  out = capsys.readouterr().out
  assert (f"rm: rm.batch_size 8 is more than the 5 pairs x 1 epoch of {files['train']}: training "
          "with batch 5 (set rm.batch_size to choose another)") in out
  # One step: no warm-up, so it trains at rm.lr rather than 0.
  assert "rm: rm.warmup_steps 1 is more than the run's 1 step: warming up over 0" in out
  source = f"human labels from a labeling round: 3 labelers, stiennon protocol, {files['train']}"
  assert report["label_source"] == source and report["pairs"] == 2
  assert report["agreement"]["names"][0] == "labels"
  with open(f"{work}/rm/eval.md") as f:
    assert f"({source})" in f.read()
  with open(f"{work}/rm/metrics.jsonl") as f:
    assert [json.loads(line)["step"] for line in f] == [1]
  from rlhfjax.training import experiment
  exp = experiment.prepare(small, work)
  params, meta = loaders.load_reward_model(exp)
  assert meta["rm"]["batch_size"] == 5

  assert main.run(small, work)["accuracy"] == report["accuracy"]  # Reused: the same settings.
  assert "training with batch" not in capsys.readouterr().out
  shutil.rmtree(f"{work}/rm/model")  # Resumed from the final checkpoint: the same model.
  main.run(small, work)
  again, _ = loaders.load_reward_model(exp)
  jax.tree.map(np.testing.assert_array_equal, params, again)
