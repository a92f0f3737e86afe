"""DPO: the loss by hand (sigmoid, label smoothing, IPO), a step that learns a preference, and the
task on the tiny pipeline's comparisons."""

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
from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig
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


def test_dpo_step_learns_a_preference():
  cfg = ModelConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32,
                    max_len=24)
  params = transformer.init(jax.random.key(0), cfg)
  rng = np.random.default_rng(1)
  n = 16
  body = rng.integers(4, 20, (n, 4)).astype(np.int32)
  mask = np.ones((n, 5), bool)
  batch = {"prompt": rng.integers(4, 32, (n, 6)).astype(np.int32),
           "prompt_mask": np.ones((n, 6), bool),
           "chosen": np.concatenate([body, np.full((n, 1), 20, np.int32)], 1), "chosen_mask": mask,
           "rejected": np.concatenate([body, np.full((n, 1), 21, np.int32)], 1),
           "rejected_mask": mask}
  c = ml_collections.FrozenConfigDict(dict(beta=0.5, loss_type="sigmoid", label_smoothing=0.0))
  tx = optimizer.adamw(dict(lr=1e-2, warmup_steps=0, schedule="constant", end_lr_frac=1.0, b1=0.9,
                            b2=0.95, eps=1e-8, weight_decay=0.0, grad_clip=1.0), 30)
  step = jax.jit(functools.partial(dpo.train_step, cfg=cfg, c=c, tx=tx))
  state = TrainState.create(jax.tree.map(jnp.copy, params), tx)
  state, first = step(state, params, batch)
  assert float(first["train/loss"]) == pytest.approx(math.log(2), rel=1e-5)  # π = π_ref at first.
  for _ in range(20):
    state, m = step(state, params, batch)
  assert float(m["train/loss"]) < 0.3 and float(m["rewards/accuracies"]) == 1.0
  assert float(m["rewards/chosen"]) > float(m["rewards/rejected"])


def test_dpo_task_writes_outputs(tiny_pipeline):
  config, workdir = tiny_pipeline
  changed = config.copy_and_resolve_references()
  changed.stages = "dpo"
  main.run(changed, workdir)
  with open(f"{workdir}/dpo/outputs.json") as f:
    stored = json.load(f)
  assert len(stored["outputs"]) == config.eval.num_examples and stored["kl"] >= -0.5
  changed.dpo.loss_type = "kto"
  with pytest.raises(Exception, match="dpo.loss_type"):
    main.run(changed, workdir)
