"""Orbax checkpoints: periodic, keep-N, atomic, and resumable.

Orbax writes each step to a temporary directory and renames it when complete, so a run killed
mid-save leaves the previous checkpoint intact and `latest_step()` ignores the partial one.
Alongside the train state we store a small JSON `meta` (e.g. reward normalisation, the config).
A complete checkpoint damaged later (a truncated file, a disk error) fails to restore; `quarantine`
moves it aside, kept for inspection, so the run can fall back to the one before (`loop`).
A save that fails for lack of space or permission (Orbax reports it from a background thread, as a
TensorStore error) is raised as the OSError it was, naming the checkpoint; its partial temporary
directory is removed when the directory is next opened.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import re
import time
from typing import Any

import jax
import orbax.checkpoint as ocp

from rlhfjax.errors import ConfigError


class Checkpointer:
  """Saves `{'state': pytree, 'meta': json}` (and an optional `extra` tree) every `every` steps
  under `directory`."""

  def __init__(self, directory: str, every: int, keep: int = 2):
    self.every = every
    self._mgr = ocp.CheckpointManager(
        os.path.abspath(directory),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                             enable_async_checkpointing=True,
                                             cleanup_tmp_directories=True))

  @property
  def directory(self) -> str:
    return str(self._mgr.directory)

  def latest_step(self) -> int | None:
    return self._mgr.latest_step()

  def all_steps(self) -> list[int]:
    """The complete checkpoints' steps, oldest first."""
    return sorted(self._mgr.all_steps())

  def path(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def quarantine(self, step: int) -> str:
    """Moves checkpoint `step` aside (renamed, not deleted) so the step can be saved anew; returns
    where it went."""
    self._mgr.wait_until_finished()
    moved = f"{self.path(step)}.unreadable-{int(time.time())}"
    try:
      os.rename(self.path(step), moved)
    except FileNotFoundError:  # Another process of a multi-host run moved it first.
      pass
    self._mgr.reload()
    return moved

  def should_save(self, step: int) -> bool:
    return self.every > 0 and step % self.every == 0

  def save(self, step: int, state: Any, meta: dict | None = None, extra: Any = None) -> None:
    """Saves `state` and `meta` as checkpoint `step`, and `extra` (host arrays that are not the
    train state: an asynchronous run's batches in flight) in the same atomic directory."""
    if step in self._mgr.all_steps():
      return
    items = {"state": ocp.args.StandardSave(state), "meta": ocp.args.JsonSave(meta or {})}
    if extra is not None:
      items["extra"] = ocp.args.StandardSave(extra)
    with self._os_errors(step):
      self._mgr.save(step, args=ocp.args.Composite(**items))

  def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict]:
    """Restores the state into `target`'s structure, shapes and shardings; returns (state, meta)."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    out = self._mgr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    return out["state"], dict(out["meta"] or {})

  def restore_extra(self, step: int) -> Any:
    """The `extra` tree checkpoint `step` was saved with (as numpy arrays), or None."""
    if "extra" not in self._mgr.item_metadata(step):
      return None
    return self._mgr.restore(step, args=ocp.args.Composite(extra=ocp.args.StandardRestore()))["extra"]

  def restore_meta(self, step: int | None = None) -> dict:
    """The JSON metadata of a checkpoint (the latest by default), without loading arrays."""
    step = self.latest_step() if step is None else step
    out = self._mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return dict(out["meta"] or {})

  def wait(self) -> None:
    with self._os_errors(None):
      self._mgr.wait_until_finished()

  def close(self) -> None:
    self.wait()
    self._mgr.close()

  @contextlib.contextmanager
  def _os_errors(self, step: int | None):
    """Re-raises a failed write's operating-system error (Orbax wraps it in a TensorStore message
    with `os_error_code='N'`, or chains it) as that OSError, naming the checkpoint."""
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except
      code = _os_error_code(e)
      if code is None:
        raise
      # Orbax's abandoned write tasks log their errors when collected: now, not after ours.
      gc.collect()
      where = self.directory if step is None else f"{self.directory} (step {step})"
      raise OSError(code, os.strerror(code), where) from e


def _os_error_code(e: BaseException) -> int | None:
  """The errno of a disk-full, read-only or permission failure behind `e`, if that is what it is."""
  while e is not None:
    if isinstance(e, OSError) and e.errno is not None:
      code = e.errno
    else:
      found = re.search(r"os_error_code='?(\d+)", str(e))
      code = int(found.group(1)) if found else None
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG):
      return code
    e = e.__cause__ or e.__context__
  return None


def latest_step(directory: str) -> int | None:
  """The latest complete checkpoint step under `directory`, or None (also when it does not exist)."""
  if not os.path.isdir(directory):
    return None
  ckpt = Checkpointer(directory, 0)
  try:
    return ckpt.latest_step()
  finally:
    ckpt.close()


def restore_finished(directory: str, template: Any, steps: int, task: str) -> tuple[Any, dict]:
  """The state and meta a finished run saved at step `steps`, restored into `template`'s structure
  (abstract arrays are fine), with an error saying which task to run when it is not there."""
  latest = latest_step(directory)
  if latest is None:
    raise FileNotFoundError(f"no checkpoint in {directory}: run task={task} first")
  if latest != steps:
    raise FileNotFoundError(f"{directory} stops at step {latest} of {steps}: rerun task={task} "
                            "to finish it")
  ckpt = Checkpointer(directory, 0)
  try:
    return ckpt.restore(template, steps)
  except ValueError as e:
    if "mismatch" not in str(e).lower():
      raise
    # E.g. a checkpoint from before the optimizer gained `apply_if_finite`'s counters.
    raise ConfigError(f"{ckpt.path(steps)} holds a train state of another layout (an older "
                      f"rlhfjax, or other settings): {' '.join(str(e).split())[:160]}; rerun "
                      f"task={task} in a new --workdir") from None
  finally:
    ckpt.close()
