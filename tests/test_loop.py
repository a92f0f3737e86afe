"""The training loop's divergence guard and resume rules, on a quadratic whose steps are worked out:
a dropped non-finite update leaves the state as if the step never came, too many in a row stop the
run before saving, and a resumed run may change the learning rate but not the model."""

import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rlhfjax.errors import ConfigError, Diverged
from rlhfjax.training import checkpoint
from rlhfjax.training import loop
from rlhfjax.training import metrics as metrics_lib
from rlhfjax.training import optimizer
from rlhfjax.training.state import TrainState

TARGET = jnp.array([1.0, -2.0, 3.0])


def _cfg(skip: int, lr: float = 0.1) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(lr=lr, warmup_steps=0, schedule="constant", end_lr_frac=1.0,
                                        b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0, grad_clip=1.0,
                                        skip_nonfinite=skip))


def _train(tmp_path, name: str, steps: int, nan_at: tuple[int, ...] = (), skip: int = 0,
           lr: float = 0.1, meta: dict | None = None):
  """Trains 0.5 |p - TARGET|^2 from zeros for `steps` steps, the gradient of each step in `nan_at`
  made NaN; returns (state, checkpointer, metrics rows)."""
  tx = optimizer.adamw(_cfg(skip, lr), steps)
  state = TrainState.create({"p": jnp.zeros(3)}, tx)
  ckpt = checkpoint.Checkpointer(str(tmp_path / name / "ckpt"), every=1, keep=50)
  state = loop.restore_if_any(ckpt, state, meta)
  bad = jnp.array([s in nan_at for s in range(steps)])

  @jax.jit
  def one_step(state, step):
    loss, grads = jax.value_and_grad(lambda p: 0.5 * jnp.sum((p["p"] - TARGET) ** 2))(state.params)
    scale = jnp.where(bad[step], jnp.nan, 1.0)
    grads = jax.tree.map(lambda g: g * scale, grads)
    return state.apply_gradients(grads, tx), {"train/loss": loss * scale}

  writer = metrics_lib.MetricWriter(str(tmp_path / name), "metrics")
  try:
    state = loop.run(state, steps, one_step, lambda s, done, m: {"train/loss": float(m["train/loss"])},
                     ckpt, writer, 1, "toy", meta, skip)
  finally:
    writer.close()
    ckpt.wait()
  with open(tmp_path / name / "metrics.jsonl") as f:
    return state, ckpt, [json.loads(line) for line in f]


def test_a_dropped_update_is_as_if_the_step_never_came(tmp_path, capsys):
  skipped, _, rows = _train(tmp_path, "skip", 6, nan_at=(2,), skip=1)
  clean, _, _ = _train(tmp_path, "clean", 5)
  np.testing.assert_array_equal(skipped.params["p"], clean.params["p"])
  assert int(skipped.step) == 6
  assert [r["train/skipped_updates"] for r in rows] == [0, 0, 1, 1, 1, 1]
  assert np.isnan(rows[2]["train/loss"])
  assert "toy: step 3: train/loss = nan is not finite; dropped 1 update(s) (1 in a row, 1 in all; " \
         "skip_nonfinite=1)" in capsys.readouterr().out


def test_more_in_a_row_than_allowed_stops_before_saving(tmp_path):
  with pytest.raises(Diverged, match=r"toy: step 4: train/loss = nan is not finite; stopped before "
                     r"saving it\. Last good checkpoint: .*/ckpt/3 \(step 3\)\. .*toy\.skip_nonfinite"):
    _train(tmp_path, "run", 6, nan_at=(2, 3), skip=1)
  ckpt = checkpoint.Checkpointer(str(tmp_path / "run" / "ckpt"), every=1)
  assert ckpt.all_steps() == [1, 2, 3]


def test_without_skipping_the_first_non_finite_step_stops(tmp_path):
  with pytest.raises(Diverged, match=r"toy: step 3: train/loss = nan .* Last good checkpoint: "
                     r".*/ckpt/2 \(step 2\)"):
    _train(tmp_path, "run", 6, nan_at=(2,))


def test_a_non_finite_gradient_with_a_finite_loss_stops_too(tmp_path):
  tx = optimizer.adamw(_cfg(0), 4)
  state = TrainState.create({"p": jnp.zeros(3)}, tx)
  ckpt = checkpoint.Checkpointer(str(tmp_path / "ckpt"), every=1)
  step_fn = jax.jit(lambda s, step: (s.apply_gradients({"p": jnp.full(3, jnp.inf)}, tx),
                                     {"train/loss": jnp.float32(1.0)}))
  with pytest.raises(Diverged, match=r"toy: step 1: the gradient is not finite; .*none yet"):
    loop.run(state, 4, step_fn, lambda *_: {}, ckpt, metrics_lib.MetricWriter(str(tmp_path), "m"),
             1, "toy")
  assert ckpt.all_steps() == []


def test_resume_may_change_the_learning_rate_and_skipping_but_not_the_rest(tmp_path, capsys):
  toy = {"lr": 0.1, "steps": 3, "skip_nonfinite": 0}
  _train(tmp_path, "run", 3, meta={"model": "small", "toy": toy})
  changed = {"model": "small", "toy": {"lr": 0.01, "steps": 3, "skip_nonfinite": 2}}
  state, _, _ = _train(tmp_path, "run", 3, lr=0.01, skip=2, meta=changed)
  assert int(state.step) == 3
  assert ("with changed optimizer settings: toy.lr: 0.1 -> 0.01, toy.skip_nonfinite: 0 -> 2"
          in capsys.readouterr().out)
  for other, named in [({"toy": dict(toy, steps=4)}, "toy.steps: 3 -> 4"),
                       ({"toy": {"lr": 0.1, "steps": 3}}, "toy.skip_nonfinite: 0 -> None"),
                       ({"toy": toy, "model": "big"}, "model")]:
    with pytest.raises(ConfigError, match=r"ckpt holds a run with another configuration \("
                       + named.replace(".", r"\.") + r"\); use a new --workdir"):
      _train(tmp_path, "run", 3, meta={"model": "small", **other})


def test_bad_skip_setting_names_the_key():
  with pytest.raises(ConfigError, match="skip_nonfinite must be an integer >= 0, got -1"):
    optimizer.adamw(_cfg(-1), 10)
