"""DPO and SimPO: the losses by hand (sigmoid, label smoothing, IPO; SimPO's length-normalised
margin), steps that learn a preference (SimPO's without a reference), and the tasks on the tiny
pipeline's comparisons."""

import functools
import json
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rlhfjax import main
from rlhfjax.algorithms import dpo
from rlhfjax.models import hf_checkpoint
from rlhfjax.models import policy
from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig
from rlhfjax.training import metrics as metrics_lib
from rlhfjax.training import optimizer
from rlhfjax.training.state import TrainState

LOGPS = (jnp.array([-3.0, -6.0]), jnp.array([-5.0, -4.0]), jnp.array([-4.0, -5.0]),
         jnp.array([-4.0, -5.0]))  # policy chosen, policy rejected, reference chosen, reference rejected


def test_dpo_loss_hand_computed():
  # h = (-3 + 4) - (-5 + 4) = 2 and (-6 + 5) - (-4 + 5) = -2; β = 0.1.
  loss, m = dpo.dpo_loss(*LOGPS, beta=0.1)
  expected = (math.log1p(math.exp(-0.2)) + math.log1p(math.exp(0.2))) / 2
  assert float(loss) == pytest.approx(expected, rel=1e-6)
  assert float(m["rewards/margins"]) == pytest.approx(0.0, abs=1e-6)
  assert float(m["rewards/accuracies"]) == 0.5
  assert float(m["rewards/chosen"]) == pytest.approx(0.1 * (1 + -1) / 2, abs=1e-6)
  smooth, _ = dpo.dpo_loss(*LOGPS, beta=0.1, label_smoothing=0.1)
  one = 0.9 * math.log1p(math.exp(-0.2)) + 0.1 * math.log1p(math.exp(0.2))
  two = 0.9 * math.log1p(math.exp(0.2)) + 0.1 * math.log1p(math.exp(-0.2))
  assert float(smooth) == pytest.approx((one + two) / 2, rel=1e-6)
  ipo, _ = dpo.dpo_loss(*LOGPS, beta=0.1, loss_type="ipo")
  assert float(ipo) == pytest.approx(((2 - 5) ** 2 + (-2 - 5) ** 2) / 2, rel=1e-6)


def test_simpo_loss_hand_computed():
  # Two pairs, log-prob sums over lengths: (−6 over 3 tokens vs −4 over 1) and (−10 over 5 vs −3
  # over 2). Per token: −2 vs −4 (the sums preferred the rejected answer; per token, the chosen),
  # and −2 vs −1.5. β = 2, γ/β = 0.5, so γ = 1: the rewards β·logp/|y| are (−4, −8) and (−4, −3),
  # the margins 4 and −1, the logits 4 − 1 = 3 and −1 − 1 = −2.
  args = (jnp.array([-6.0, -10.0]), jnp.array([-4.0, -3.0]), jnp.array([3, 5]), jnp.array([1, 2]))
  loss, m = dpo.simpo_loss(*args, beta=2.0, gamma_beta_ratio=0.5)
  assert float(loss) == pytest.approx((math.log1p(math.exp(-3)) + math.log1p(math.exp(2))) / 2,
                                      rel=1e-6)
  assert float(m["rewards/chosen"]) == pytest.approx(-4.0)
  assert float(m["rewards/rejected"]) == pytest.approx(-5.5)
  assert float(m["rewards/margins"]) == pytest.approx(1.5)
  assert float(m["rewards/accuracies"]) == 0.5
  assert float(m["logps/chosen"]) == pytest.approx(-2.0)
  assert float(m["logps/rejected"]) == pytest.approx(-2.75)
  smooth, _ = dpo.simpo_loss(*args, beta=2.0, gamma_beta_ratio=0.5, label_smoothing=0.1)
  one = 0.9 * math.log1p(math.exp(-3)) + 0.1 * math.log1p(math.exp(3))
  two = 0.9 * math.log1p(math.exp(2)) + 0.1 * math.log1p(math.exp(-2))
  assert float(smooth) == pytest.approx((one + two) / 2, rel=1e-6)
  # No margin (γ = 0): the logits are the margins 4 and −1.
  plain, _ = dpo.simpo_loss(*args, beta=2.0, gamma_beta_ratio=0.0)
  assert float(plain) == pytest.approx((math.log1p(math.exp(-4)) + math.log1p(math.exp(1))) / 2,
                                       rel=1e-6)


def _preference_batch(n: int = 16) -> dict[str, np.ndarray]:
  """Pairs that differ only in their last token (20 chosen, 21 rejected), one length."""
  rng = np.random.default_rng(1)
  body = rng.integers(4, 20, (n, 4)).astype(np.int32)
  mask = np.ones((n, 5), bool)
  return {"prompt": rng.integers(4, 32, (n, 6)).astype(np.int32),
          "prompt_mask": np.ones((n, 6), bool),
          "chosen": np.concatenate([body, np.full((n, 1), 20, np.int32)], 1), "chosen_mask": mask,
          "rejected": np.concatenate([body, np.full((n, 1), 21, np.int32)], 1),
          "rejected_mask": mask}


CFG = ModelConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32,
                  max_len=24)
ADAMW = dict(lr=1e-2, warmup_steps=0, schedule="constant", end_lr_frac=1.0, b1=0.9, b2=0.95,
             eps=1e-8, weight_decay=0.0, grad_clip=1.0, skip_nonfinite=0)


def test_dpo_step_learns_a_preference():
  params = transformer.init(jax.random.key(0), CFG)
  batch = _preference_batch()
  c = ml_collections.FrozenConfigDict(dict(beta=0.5, loss_type="sigmoid", label_smoothing=0.0))
  tx = optimizer.adamw(ADAMW, 30)
  step = jax.jit(functools.partial(dpo.train_step, cfg=CFG, c=c, tx=tx))
  state = TrainState.create(jax.tree.map(jnp.copy, params), tx)
  state, first = step(state, params, batch)
  assert float(first["train/loss"]) == pytest.approx(math.log(2), rel=1e-5)  # π = π_ref at first.
  for _ in range(20):
    state, m = step(state, params, batch)
  assert float(m["train/loss"]) < 0.3 and float(m["rewards/accuracies"]) == 1.0
  assert float(m["rewards/chosen"]) > float(m["rewards/rejected"])


def test_simpo_step_learns_a_preference_without_a_reference():
  params = transformer.init(jax.random.key(0), CFG)
  batch = _preference_batch()
  c = ml_collections.FrozenConfigDict(dict(beta=2.0, gamma_beta_ratio=0.5, loss_type="simpo",
                                           label_smoothing=0.0))
  tx = optimizer.adamw(ADAMW, 30)
  step = jax.jit(functools.partial(dpo.train_step, cfg=CFG, c=c, tx=tx))
  state = TrainState.create(jax.tree.map(jnp.copy, params), tx)
  state, first = step(state, None, batch)  # No reference at all.
  # The first loss is SimPO's on the initial policy's own per-token log-probs (5 tokens each).
  both = dpo._both(jax.tree.map(jnp.asarray, batch))
  logp = policy.response_logprobs(params, both, CFG).sum(-1)
  expected, _ = dpo.simpo_loss(logp[:16], logp[16:], jnp.full(16, 5), jnp.full(16, 5), 2.0, 0.5)
  np.testing.assert_allclose(first["train/loss"], expected, rtol=1e-5)
  for _ in range(20):
    state, m = step(state, None, batch)
  assert float(m["train/loss"]) < 0.3 and float(m["rewards/accuracies"]) == 1.0
  # Past the margin: β (log π(c) − log π(r)) / 5 > γ = 1.
  assert float(m["rewards/margins"]) > 1.0


def test_dpo_task_writes_outputs(tiny_pipeline):
  config, workdir = tiny_pipeline
  changed = config.copy_and_resolve_references()
  changed.stages = "dpo"
  state = main.run(changed, workdir)
  with open(f"{workdir}/dpo/outputs.json") as f:
    stored = json.load(f)
  assert len(stored["outputs"]) == config.eval.num_examples and stored["kl"] >= -0.5
  # task=export writes the trained policy as it is (bit-exact).
  export = changed.copy_and_resolve_references()
  export.task, export.export.model = "export", "dpo"
  params, _ = hf_checkpoint.load(main.run(export, workdir))
  assert jax.tree.structure(params) == jax.tree.structure(state.params)
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(state.params)):
    assert np.array_equal(got, np.asarray(want))
  changed.dpo.loss_type = "kto"
  with pytest.raises(Exception, match="dpo.loss_type"):
    main.run(changed, workdir)
  changed.dpo.update(loss_type="ipo", label_smoothing=0.1)  # TRL only warns.
  with pytest.raises(Exception, match=r"dpo.label_smoothing \(0.1\) has no meaning for IPO"):
    main.run(changed, workdir)


def test_simpo_task_writes_outputs_and_trl_metrics(tiny_pipeline):
  config, workdir = tiny_pipeline
  changed = config.copy_and_resolve_references()
  changed.stages = "simpo"
  main.run(changed, workdir)
  with open(f"{workdir}/simpo/outputs.json") as f:
    assert len(json.load(f)["outputs"]) == config.eval.num_examples
  logged = metrics_lib.read_jsonl(f"{workdir}/simpo/metrics.jsonl")
  last = logged[max(logged)]
  for name in ("train/loss", "rewards/chosen", "rewards/rejected", "rewards/margins",
               "rewards/accuracies", "logps/chosen", "logps/rejected"):
    assert name in last, name
  assert last["logps/chosen"] < 0  # Per token: a mean log-probability.
