"""Optimizers and learning-rate schedules built from a config block (optax)."""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import jax
import optax

from rlhfjax.errors import ConfigError

SCHEDULES = ("cosine", "linear", "constant")


def learning_rate_schedule(cfg: Mapping[str, Any], total_steps: int) -> optax.Schedule:
  """Linear warm-up over `warmup_steps`, then cosine or linear decay to `lr * end_lr_frac`.

  Keys: lr, warmup_steps, schedule ('cosine' | 'linear' | 'constant'), end_lr_frac.
  """
  lr, warmup = float(cfg["lr"]), int(cfg["warmup_steps"])
  kind = cfg["schedule"]
  if kind not in SCHEDULES:
    raise ConfigError(f"schedule must be one of {SCHEDULES}, got {kind!r}")
  end = lr * float(cfg["end_lr_frac"])
  decay_steps = max(total_steps - warmup, 1)
  if kind == "cosine":
    decay = optax.cosine_decay_schedule(lr, decay_steps, alpha=float(cfg["end_lr_frac"]))
  elif kind == "linear":
    decay = optax.linear_schedule(lr, end, decay_steps)
  else:
    decay = optax.constant_schedule(lr)
  if warmup == 0:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), decay], [warmup])


def adamw(cfg: Mapping[str, Any], total_steps: int,
          trainable: Callable[[Any], Any] | None = None) -> optax.GradientTransformation:
  """Global-norm gradient clipping (if `grad_clip` > 0) then AdamW on the schedule above, inside
  `optax.apply_if_finite`.

  Keys: those of `learning_rate_schedule`, plus b1, b2, eps, weight_decay, grad_clip and
  skip_nonfinite (optional, default 0). With `trainable` (params -> a tree of bools, e.g.
  `lora.trainable`) only the marked leaves are clipped, decayed and updated, and only they hold
  AdamW moments; the others never move.

  An update with a non-finite gradient is dropped (parameters and moments unchanged, counted in
  the state) while at most `skip_nonfinite` such updates come in a row; past that it is applied
  and the training loop's guard stops the run before saving it. The wrapper is there at every
  setting, so a run may resume with another `skip_nonfinite`.
  """
  schedule = learning_rate_schedule(cfg, total_steps)
  parts = []
  if float(cfg["grad_clip"]) > 0:
    parts.append(optax.clip_by_global_norm(float(cfg["grad_clip"])))
  parts.append(optax.adamw(schedule, b1=float(cfg["b1"]), b2=float(cfg["b2"]), eps=float(cfg["eps"]),
                           weight_decay=float(cfg["weight_decay"])))
  tx = optax.chain(*parts)
  if trainable is not None:
    labels = lambda params: jax.tree.map(lambda t: "train" if t else "frozen", trainable(params))
    tx = optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)
  skips = cfg["skip_nonfinite"]
  if not isinstance(skips, int) or skips < 0:
    raise ConfigError(f"skip_nonfinite must be an integer >= 0, got {skips!r}")
  return optax.apply_if_finite(tx, skips)


def nonfinite_updates(state: Any) -> tuple[jax.Array, jax.Array]:
  """(in a row up to now, in all) updates with a non-finite gradient that `optax.apply_if_finite`
  saw, over every optimizer state in `state` (a train state or a tree of them)."""
  found = [v for _, v in optax.tree_utils.tree_get_all_with_path(state, "notfinite_count")]
  total = [v for _, v in optax.tree_utils.tree_get_all_with_path(state, "total_notfinite")]
  zero = jax.numpy.zeros((), jax.numpy.int32)
  return (functools.reduce(jax.numpy.maximum, found, zero), sum(total, zero))
