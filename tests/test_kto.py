"""KTO: the loss worked by hand on one desirable and one undesirable response (the KL reference
point from the mismatched pairs, clamped at 0 and without a gradient; the weights), TRL's
mismatched pairs, the weights' balance advice, a step that learns from binary feedback, and
task=kto on the tiny pipeline: from the comparison files (each pair split in two) and from
task=label's binary feedback (label.protocol=binary), into its folder and the leaderboard."""

import functools
import json
import math
import os
import shutil

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rlhfjax import main
from rlhfjax.algorithms import kto
from rlhfjax.data import records
from rlhfjax.errors import ConfigError, DataError
from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig
from rlhfjax.training import metrics as metrics_lib
from rlhfjax.training import optimizer
from rlhfjax.training.state import TrainState

TRL_NAMES = ("train/loss", "train/grad_norm", "kl", "rewards/chosen", "rewards/rejected",
             "rewards/margins", "logps/chosen", "logps/rejected")


def sigmoid(t: float) -> float:
  return 1.0 / (1.0 + math.exp(-t))


# Row 0 desirable, row 1 undesirable. Policy and reference log-probs (sums over the response):
# -4 against -5 and -10 against -8, so r = log π/π_ref = 1 and -2. The mismatched pairs (each
# prompt with the other row's response) have log-ratios -7 - (-7.5) = 0.5 and -6 - (-6.1) = 0.1.
LOGP, REF = jnp.array([-4.0, -10.0]), jnp.array([-5.0, -8.0])
KL_LOGP, KL_REF = jnp.array([-7.0, -6.0]), jnp.array([-7.5, -6.1])
DESIRABLE = jnp.array([True, False])


def test_kto_loss_hand_computed():
  # z0 = mean(0.5, 0.1) = 0.3 (positive: kept). With β = 0.1:
  #   desirable:   1 − σ(0.1 · (1 − 0.3))    = 1 − σ(0.07) = 1 − 0.5174929 = 0.4825071
  #   undesirable: 1 − σ(0.1 · (0.3 − (−2))) = 1 − σ(0.23) = 1 − 0.5572479 = 0.4427521
  # and the loss is their mean over the batch, 0.4626296.
  loss, m = kto.kto_loss(LOGP, REF, KL_LOGP, KL_REF, DESIRABLE, beta=0.1)
  assert float(loss) == pytest.approx(0.4626296, abs=1e-6)
  assert float(loss) == pytest.approx(((1 - sigmoid(0.07)) + (1 - sigmoid(0.23))) / 2, rel=1e-6)
  # TRL's metrics: the KL estimate, the implicit rewards β r of each side and the log-prob sums.
  expected = {"kl": 0.3, "rewards/chosen": 0.1, "rewards/rejected": -0.2, "rewards/margins": 0.3,
              "logps/chosen": -4.0, "logps/rejected": -10.0}
  assert {k: float(v) for k, v in m.items()} == pytest.approx(expected, abs=1e-6)
  # λ_D = 2, λ_U = 0.5: (2 · 0.4825071 + 0.5 · 0.4427521) / 2 = 0.5931952.
  weighted, _ = kto.kto_loss(LOGP, REF, KL_LOGP, KL_REF, DESIRABLE, 0.1, 2.0, 0.5)
  assert float(weighted) == pytest.approx(0.5931952, abs=1e-6)
  # Mismatched log-ratios of mean −0.3: z0 is clamped to 0, not −0.3, so the terms are
  # 1 − σ(0.1 · 1) = 0.4750208 and 1 − σ(0.1 · 2) = 0.4501660, mean 0.4625934.
  clamped, m = kto.kto_loss(LOGP, REF, KL_REF, KL_LOGP, DESIRABLE, beta=0.1)
  assert float(m["kl"]) == 0.0
  assert float(clamped) == pytest.approx(0.4625934, abs=1e-6)


def test_kto_gradient_flows_through_the_rewards_only():
  # d/dr of 1 − σ(β (r − z0)) is −β σ(t)(1 − σ(t)) at t = 0.07; of 1 − σ(β (z0 − r)), +β σ(u)(1 −
  # σ(u)) at u = 0.23; each over the batch of 2: −0.0124847 and +0.0123361. None reaches z0.
  loss = lambda logp, kl_logp: kto.kto_loss(logp, REF, kl_logp, KL_REF, DESIRABLE, 0.1)[0]
  d_logp, d_kl = jax.grad(loss, argnums=(0, 1))(LOGP, KL_LOGP)
  np.testing.assert_allclose(d_logp, [-0.0124847, 0.0123361], atol=1e-7)
  np.testing.assert_array_equal(d_kl, [0.0, 0.0])


def test_a_side_the_batch_lacks_is_nan():
  _, m = kto.kto_loss(LOGP, REF, KL_LOGP, KL_REF, jnp.array([True, True]), 0.1)
  assert float(m["rewards/chosen"]) == pytest.approx((0.1 - 0.2) / 2)
  assert all(math.isnan(float(m[k])) for k in ("rewards/rejected", "rewards/margins",
                                               "logps/rejected"))


def test_mismatched_pairs_rotate_the_responses_by_one_row():
  batch = {"prompt": jnp.arange(3)[:, None], "prompt_mask": jnp.ones((3, 1), bool),
           "response": jnp.array([[10, 11], [20, 21], [30, 31]]),
           "response_mask": jnp.array([[True, True], [True, False], [True, True]])}
  out = kto._mismatched(batch)  # pylint: disable=protected-access
  np.testing.assert_array_equal(out["prompt"], batch["prompt"])  # Prompt i ...
  np.testing.assert_array_equal(out["response"], [[30, 31], [10, 11], [20, 21]])  # ... y_{i-1}.
  np.testing.assert_array_equal(out["response_mask"], [[True, True], [True, True], [True, False]])


def test_balance_advice_hand_worked():
  assert kto.balance(40, 35, 1.0, 1.0) == "40 desirable and 35 undesirable responses"  # 1.14.
  # 30 desirable, 10 undesirable: 1 · 30 / (1 · 10) = 3. In [1, 4/3] with desirable_weight in
  # [10/30, 1.33 · 10/30] = [0.33, 0.44], or undesirable_weight in [30/10 / (4/3), 30/10].
  line = kto.balance(30, 10, 1.0, 1.0)
  assert "= 3.00, outside KTO's [1, 4/3]" in line
  assert "kto.desirable_weight in [0.33, 0.44]" in line
  assert "kto.undesirable_weight in [2.25, 3.00]" in line
  assert "one kind only" in kto.balance(0, 10, 1.0, 1.0)


CFG = ModelConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32,
                  max_len=24)


def test_kto_step_learns_from_binary_feedback():
  """Responses ending in token 20 are desirable, in 21 undesirable (one response per prompt)."""
  rng = np.random.default_rng(1)
  n = 16
  label = np.arange(n) % 2 == 0
  response = np.concatenate([rng.integers(4, 20, (n, 4)), np.where(label, 20, 21)[:, None]], 1)
  batch = {"prompt": rng.integers(4, 32, (n, 6)).astype(np.int32),
           "prompt_mask": np.ones((n, 6), bool), "response": response.astype(np.int32),
           "response_mask": np.ones((n, 5), bool), "label": label}
  c = ml_collections.FrozenConfigDict(dict(beta=0.5, desirable_weight=1.0,
                                           undesirable_weight=1.0))
  tx = optimizer.adamw(dict(lr=1e-2, warmup_steps=0, schedule="constant", end_lr_frac=1.0,
                            b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0, grad_clip=1.0,
                            skip_nonfinite=0), 30)
  params = transformer.init(jax.random.key(0), CFG)
  step = jax.jit(functools.partial(kto.train_step, cfg=CFG, c=c, tx=tx))
  state = TrainState.create(jax.tree.map(jnp.copy, params), tx)
  state, first = step(state, params, batch)
  # π = π_ref at first: r = 0 and z0 = 0, so every term is 1 − σ(0) = 0.5.
  assert float(first["train/loss"]) == pytest.approx(0.5, rel=1e-6)
  assert float(first["kl"]) == 0.0
  for _ in range(20):
    state, m = step(state, params, batch)
  assert float(m["train/loss"]) < 0.35
  assert float(m["rewards/chosen"]) > 0 > float(m["rewards/rejected"])
  assert float(m["rewards/margins"]) > 1.0


def test_kto_task_from_the_comparison_files(tiny_pipeline):
  """The default feedback: task=rm's comparison files, each pair a desirable and an undesirable
  response; TRL's metric names logged, the test answers written for task=eval."""
  config, workdir = tiny_pipeline
  changed = config.copy_and_resolve_references()
  changed.stages = "kto"
  main.run(changed, workdir)
  with open(f"{workdir}/kto/outputs.json") as f:
    stored = json.load(f)
  assert len(stored["outputs"]) == config.eval.num_examples
  logged = metrics_lib.read_jsonl(f"{workdir}/kto/metrics.jsonl")
  steps = 2 * config.label.num_pairs // config.kto.batch_size  # Two responses per pair.
  assert max(logged) == steps
  for name in TRL_NAMES:
    assert name in logged[steps], name
  assert logged[steps]["kl"] >= 0 and logged[steps]["logps/chosen"] < 0


def _workdir(tiny_pipeline, tmp_path) -> str:
  """A copy of the tiny pipeline's tokenizer, SFT policy, comparisons and reward model."""
  _, workdir = tiny_pipeline
  other = str(tmp_path / "work")
  os.makedirs(other)
  for part in ("tokenizer.model", "sft", "label", "rm"):
    src = os.path.join(workdir, part)
    (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, os.path.join(other, part))
  return other


def test_binary_labels_then_kto_then_the_leaderboard(tiny_pipeline, tmp_path):
  """label.protocol=binary writes thumbs up / down beside the comparisons (which stay as they
  were), task=kto trains on them (kto.feedback=binary) and task=eval ranks it as KTO."""
  config, _ = tiny_pipeline
  workdir = _workdir(tiny_pipeline, tmp_path)
  pairs_meta = open(f"{workdir}/label/meta.json", encoding="utf-8").read()
  changed = config.copy_and_resolve_references()
  changed.stages = "label,kto,eval"
  changed.label.protocol = "binary"
  changed.kto.feedback = "binary"
  changed.eval.methods = "kto"
  rows = main.run(changed, workdir)
  assert [r["method"] for r in rows] == ["KTO"]
  train = records.read_binary_strict(f"{workdir}/label/binary_train.jsonl")
  valid = records.read_binary_strict(f"{workdir}/label/binary_valid.jsonl")
  assert (len(train), len(valid)) == (config.label.num_pairs, config.label.num_val_pairs)
  assert {f.split for f in train} == {"train"} and {f.annotator for f in train} == {"train_pool"}
  assert all(f.policy == "sft-t0.7" and f.subreddit for f in train)
  assert open(f"{workdir}/label/meta.json", encoding="utf-8").read() == pairs_meta
  assert os.path.exists(f"{workdir}/label/binary_meta.json")
  logged = metrics_lib.read_jsonl(f"{workdir}/kto/metrics.jsonl")
  assert max(logged) == config.label.num_pairs // config.kto.batch_size
  with open(f"{workdir}/kto/outputs.json") as f:
    assert len(json.load(f)["outputs"]) == config.eval.num_examples
  # Labelling again reuses both sets; the pairs' meta never held the protocol.
  changed.stages = "label"
  for protocol in ("binary", "pairs"):
    changed.label.protocol = protocol
    main.run(changed, workdir)
  assert len(records.read_binary_strict(f"{workdir}/label/binary_train.jsonl")) == len(train)


def test_kto_refuses_what_it_cannot_train_on(tiny_pipeline, tmp_path):
  config, _ = tiny_pipeline
  workdir = _workdir(tiny_pipeline, tmp_path)
  changed = config.copy_and_resolve_references()
  changed.stages = "kto"
  for key, value, error, message in (
      ("feedback", "thumbs", ConfigError, "kto.feedback must be one of"),
      ("batch_size", 1, ConfigError, "kto.batch_size must be at least 2"),
      ("beta", 0.0, ConfigError, "kto.beta must be > 0")):
    bad = changed.copy_and_resolve_references()
    bad.kto[key] = value
    with pytest.raises(error, match=message):
      main.run(bad, workdir)
  changed.kto.feedback = "binary"
  with pytest.raises(FileNotFoundError, match="label.protocol=binary, or set kto.train_file"):
    main.run(changed, workdir)
  path = tmp_path / "feedback.jsonl"
  path.write_text(json.dumps({"prompt": "p", "completion": "c", "label": 1}) + "\n")
  changed.kto.train_file = str(path)
  with pytest.raises(DataError, match=f"{path} holds no binary feedback: {path}:1: 'label' must "
                                      "be true or false, got 1"):
    main.run(changed, workdir)
  bad = changed.copy_and_resolve_references()
  bad.label.protocol = "triplets"
  bad.stages = "label"
  with pytest.raises(ConfigError, match="label.protocol must be one of"):
    main.run(bad, workdir)
