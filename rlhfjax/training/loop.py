"""The training loop every algorithm shares: resume, step, log, checkpoint, progress bar.

The algorithm supplies `one_step(state, step) -> (state, metrics)` (which must be a pure function of
the state and the step number, so a resumed run repeats an uninterrupted one exactly) and
`periodic(state, done, metrics) -> dict` for the metrics it wants written after step `done`.
On a preemption request (SIGTERM) the loop checkpoints the step just finished and raises
`preemption.Preempted`.

Divergence guard: every step's losses and gradient norms (metrics whose name ends in `loss` or
`grad_norm`) and its gradient (`optimizer.nonfinite_updates`) must be finite. A step's are read one
step later, while the next step runs, so the guard costs no pipeline stall; before a checkpoint is
written the step's own are read, so a checkpoint never holds the parameters a non-finite step
produced. A non-finite value raises `Diverged` naming the step, the metric and the last good
checkpoint, unless the optimizer dropped that update (`skip_nonfinite` > 0: up to that many in a
row): then one line says so and the count goes to the metrics as `train/skipped_updates`.

Resuming under another configuration is refused, except for the settings in
`MAY_CHANGE_ON_RESUME`: the optimizer's (so a run that diverged can go on from its last good
checkpoint with a lower learning rate or with skipping on) and rematerialisation (`model.remat`, the
`remat` block: memory and speed; the results agree up to rounding, so such a resume is no longer
bit-identical to an uninterrupted run); a change there is logged.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from rlhfjax.errors import ConfigError, Diverged
from rlhfjax.parallel import preemption
from rlhfjax.training import checkpoint
from rlhfjax.training import metrics as metrics_lib
from rlhfjax.training import optimizer

# Settings a resumed run may change: they leave the train state's layout as it is. A block of that
# name (the `remat` block of Experiment.remat_meta) may change as a whole.
MAY_CHANGE_ON_RESUME = ("lr", "warmup_steps", "end_lr_frac", "weight_decay", "skip_nonfinite",
                        "remat")


def restore_if_any(ckpt: checkpoint.Checkpointer, state: Any, meta: dict | None = None) -> Any:
  """The latest readable checkpoint restored into `state`'s structure, or `state` if there is none.

  `meta` (saved with every checkpoint) must match the stored one: resuming a workdir with a
  different model or schedule would silently mix two runs. A checkpoint that fails to restore
  (truncated or damaged after it was written) is reported with its path, moved aside and the one
  before it tried, down to starting afresh; the steps after it are then trained again.
  """
  return restore_with_extra(ckpt, state, meta, extra=False)[0]


def restore_with_extra(ckpt: checkpoint.Checkpointer, state: Any, meta: dict | None = None,
                       extra: bool = True) -> tuple[Any, Any]:
  """`restore_if_any`, and the `extra` tree the restored checkpoint holds (None when it holds none,
  or when nothing was restored): read in the same attempt, so a checkpoint whose extra is damaged
  is moved aside like one whose state is, and the one before it tried."""
  for step in reversed(ckpt.all_steps()):
    try:
      stored = ckpt.restore_meta(step)
      _check_meta(ckpt, stored, meta or {})
      restored, _ = ckpt.restore(state, step)
      held = ckpt.restore_extra(step) if extra else None
    except ConfigError:
      raise
    except Exception as e:  # Orbax and TensorStore raise many kinds, some plain Exception.
      moved = ckpt.quarantine(step)
      reason = " ".join(str(e).split())[:200]
      metrics_lib.info(f"checkpoint {ckpt.path(step)} is unreadable ({type(e).__name__}: "
                       f"{reason}); moved it to {moved} and trying the one before")
      continue
    metrics_lib.info(f"resuming from step {int(restored.step)} ({ckpt.directory})")
    return restored, held
  return state, None


def _check_meta(ckpt: checkpoint.Checkpointer, stored: dict, meta: dict) -> None:
  changed, refused = meta_differences(stored, meta)
  if refused:
    raise ConfigError(f"{ckpt.directory} holds a run with another configuration "
                      f"({', '.join(refused)}); use a new --workdir or restore the old settings")
  remat = [c for c in changed if "remat" in c.split(":")[0].split(".")]
  optim = [c for c in changed if c not in remat]
  if optim:
    metrics_lib.info(f"resuming {ckpt.directory} with changed optimizer settings: "
                     f"{', '.join(optim)}")
  if remat:
    metrics_lib.info(f"resuming {ckpt.directory} with another rematerialisation policy: "
                     f"{', '.join(remat)}")


def meta_differences(stored: dict, meta: dict) -> tuple[list[str], list[str]]:
  """(allowed, refused) differences between a run's stored and present settings, as
  `block.key: old -> new`: the settings of `MAY_CHANGE_ON_RESUME` may differ, nothing else; a
  block the stored meta lacks is not compared."""
  changed, refused = [], []
  for key, value in meta.items():
    if key not in stored or stored[key] == value:
      continue
    whole = key in MAY_CHANGE_ON_RESUME  # A block that may change as a whole.
    if not isinstance(value, dict) or not isinstance(stored[key], dict):
      if whole:
        changed.append(f"{key}: {stored[key]!r} -> {value!r}")
      else:
        refused.append(key)
      continue
    for k in sorted(set(value) | set(stored[key])):
      old, new = stored[key].get(k), value.get(k)
      if old != new:
        may = whole or (k in MAY_CHANGE_ON_RESUME and k in stored[key] and k in value)
        (changed if may else refused).append(f"{key}.{k}: {old!r} -> {new!r}")
  return changed, refused


def run(state: Any, total_steps: int, one_step: Callable[[Any, int], tuple[Any, dict]],
        periodic: Callable[[Any, int, dict], dict[str, float]], ckpt: checkpoint.Checkpointer,
        writer: metrics_lib.MetricWriter, tokens_per_step: int, name: str,
        meta: dict | None = None, skip_nonfinite: int = 0,
        extra: Callable[[], Any] | None = None) -> Any:
  """Runs steps `state.step .. total_steps - 1`; saves every `ckpt.every` steps and at the end.

  `skip_nonfinite` must be the setting the optimizer was built with (`optimizer.adamw`); `extra()`:
  what else each checkpoint holds beside the state (Checkpointer.save)."""
  start = int(state.step)
  t0 = time.perf_counter()
  guard = _Guard(ckpt, name, skip_nonfinite, optimizer.nonfinite_updates(state)[1])
  unchecked = None  # (step, metrics, counts) of the step before, read while this one runs.
  with tqdm.tqdm(total=total_steps, initial=start, desc=name, unit="step", dynamic_ncols=True,
                 disable=jax.process_index() != 0) as bar:
    for step in range(start, total_steps):
      state, m = one_step(state, step)
      done = step + 1
      # Copies: the state's own arrays are donated to the next step.
      counts = jax.tree.map(jnp.copy, optimizer.nonfinite_updates(state))
      if unchecked is not None:
        guard(*unchecked)
      unchecked = (done, m, counts)
      out = periodic(state, done, m)
      if out:
        if "train/loss" in out:
          bar.set_postfix(loss=f"{out['train/loss']:.3f}")
        rate = (done - start) / (time.perf_counter() - t0)
        out["perf/steps_per_s"] = rate
        out["perf/tokens_per_s"] = rate * tokens_per_step
        if skip_nonfinite:
          out["train/skipped_updates"] = int(counts[1])
        writer.write(done, out)
      stop = done < total_steps and preemption.requested()
      if ckpt.should_save(done) or done == total_steps or stop:
        guard(*unchecked)
        unchecked = None
        ckpt.save(done, state, meta, extra() if extra else None)
      bar.update()
      if stop:
        ckpt.wait()
        raise preemption.Preempted(done, ckpt.directory)
  ckpt.wait()
  return state


class _Guard:
  """Checks one step's metrics and non-finite update counts; raises `Diverged` or logs a skip."""

  def __init__(self, ckpt: checkpoint.Checkpointer, name: str, skip_nonfinite: int,
               total: jax.Array):
    self.ckpt, self.name, self.limit = ckpt, name, skip_nonfinite
    self.total = int(total)  # Non-finite updates up to the last step checked.

  def __call__(self, step: int, metrics: dict, counts: tuple[jax.Array, jax.Array]) -> None:
    watched = {k: v for k, v in metrics.items() if k.endswith(("loss", "grad_norm"))}
    watched, (in_a_row, total) = jax.device_get((watched, counts))
    bad = [(k, v) for k, v in watched.items() if not np.all(np.isfinite(v))]
    new, self.total = int(total) - self.total, int(total)
    if new and self.limit and in_a_row <= self.limit:
      what = f"{bad[0][0]} = {np.asarray(bad[0][1]).tolist()}" if bad else "gradient"
      metrics_lib.info(f"{self.name}: step {step}: {what} is not finite; dropped {new} update(s) "
                       f"({int(in_a_row)} in a row, {int(total)} in all; skip_nonfinite="
                       f"{self.limit})")
      return
    if bad:
      key, value = bad[0]
      self._stop(step, f"{key} = {np.asarray(value).tolist()} is not finite")
    if in_a_row:  # A non-finite gradient the optimizer applied: past the limit, or no limit.
      more = f" after {self.limit} dropped in a row" if self.limit else ""
      self._stop(step, f"the gradient is not finite{more}")

  def _stop(self, step: int, what: str) -> None:
    try:
      self.ckpt.wait()
    except OSError:  # A failed earlier save: the divergence is the news; the last good one stands.
      pass
    last = self.ckpt.latest_step()
    good = f"{self.ckpt.path(last)} (step {last})" if last is not None else "none yet"
    raise Diverged(f"{self.name}: step {step}: {what}; stopped before saving it. Last good "
                   f"checkpoint: {good}. Rerun with a lower learning rate (or fixed input), or "
                   f"with {self.name}.skip_nonfinite=N to drop up to N such updates in a row: "
                   "it resumes from there")
