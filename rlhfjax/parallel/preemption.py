"""Preemption: on SIGTERM (spot/preemptible VMs, SLURM's --signal, `kill`) the training loop saves
a checkpoint after the step in flight and the process exits with status `EXIT_CODE`; rerunning the
same command resumes from that checkpoint.

With several processes, SIGTERM may reach them at different times: `requested()` agrees across all
processes (a tiny all-gather per step), so every process saves the same step and stops together.
"""

from __future__ import annotations

import signal
import threading

import jax
import numpy as np
from jax.experimental import multihost_utils

EXIT_CODE = 75  # EX_TEMPFAIL: "try again" — a relaunch resumes.

_flag = threading.Event()


class Preempted(Exception):
  """Raised by the training loop after it saved the checkpoint of `step`."""

  def __init__(self, step: int, directory: str):
    super().__init__(f"preempted: saved step {step} in {directory}; rerun the same command to "
                     "resume")
    self.step = step


def _handler(signum, frame) -> None:
  del frame
  _flag.set()


def install() -> None:
  """Routes SIGTERM to the flag (main thread only; a no-op elsewhere, e.g. in a notebook thread)."""
  if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGTERM, _handler)


def request() -> None:
  """What the handler does; for tests and for callers with their own signal handling."""
  _flag.set()


def clear() -> None:
  _flag.clear()


def requested() -> bool:
  """Whether any process was asked to stop."""
  mine = _flag.is_set()
  if jax.process_count() == 1:
    return mine
  return bool(np.any(multihost_utils.process_allgather(np.array(mine))))
