"""Metric writers: JSONL (one line per step, appended) and TensorBoard event files (tensorboardX).

Only process 0 writes, so multi-host runs do not produce duplicate logs. A resumed run appends; a
step logged twice (after the last checkpoint, before a kill) appears twice in the JSONL, and readers
keep the last line for a step.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Mapping, Sequence, TypeVar

import jax
import numpy as np
import tqdm

from rlhfjax import imports

T = TypeVar("T")


def _scalar(v: Any) -> float:
  return float(np.asarray(v))


class MetricWriter:
  """Writes scalar metrics to `<workdir>/<name>.jsonl` and `<workdir>/tb/<name>/`."""

  def __init__(self, workdir: str, name: str):
    self.enabled = jax.process_index() == 0
    self.path = os.path.join(workdir, f"{name}.jsonl")
    if self.enabled:
      with imports.without("torch"):  # Scalars and text only: no torch tensors to accept.
        from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      os.makedirs(workdir, exist_ok=True)
      self._jsonl = open(self.path, "a", encoding="utf-8")
      self._tb = SummaryWriter(os.path.join(workdir, "tb", name))

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    if not self.enabled:
      return
    scalars = {k: _scalar(v) for k, v in metrics.items()}
    self._jsonl.write(json.dumps({"step": int(step), **scalars}) + "\n")
    self._jsonl.flush()
    for k, v in scalars.items():
      self._tb.add_scalar(k, v, int(step))

  def write_text(self, step: int, tag: str, text: str) -> None:
    if self.enabled:
      self._tb.add_text(tag, text, int(step))

  def close(self) -> None:
    if self.enabled:
      self._jsonl.close()
      self._tb.close()


def append_rows(path: str, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
  """Appends `rows` of iteration `step` to the JSONL file `path` (process 0 only): a rerun of the
  step after a resume appends them again, and `read_rows` keeps the latest."""
  if jax.process_index() != 0:
    return
  with open(path, "a", encoding="utf-8") as f:
    f.write("".join(json.dumps({"step": int(step), **r}) + "\n" for r in rows))


def read_rows(path: str) -> dict[int, list[dict[str, Any]]]:
  """`append_rows`' file as {step: rows}, each step's latest rows."""
  out: dict[int, list[dict[str, Any]]] = {}
  last = None
  with open(path, encoding="utf-8") as f:
    for line in f:
      row = json.loads(line)
      step = int(row.pop("step"))
      if step != last:
        out[step], last = [], step
      out[step].append(row)
  return out


def read_jsonl(path: str) -> dict[int, dict[str, float]]:
  """Reads a metrics JSONL file into {step: metrics}, the last line for a step winning."""
  out: dict[int, dict[str, float]] = {}
  with open(path, encoding="utf-8") as f:
    for line in f:
      row = json.loads(line)
      out[int(row.pop("step"))] = row
  return out


def info(message: str) -> None:
  """Prints on process 0 only, without breaking an active progress bar."""
  if jax.process_index() == 0:
    tqdm.tqdm.write(message)


def progress(items: Iterable[T], total: int, desc: str, unit: str) -> Iterable[T]:
  """`items` with a progress bar (rate and ETA) on process 0; for the long loops outside training
  (sampling, scoring)."""
  return tqdm.tqdm(items, total=total, desc=desc, unit=unit, dynamic_ncols=True, leave=False,
                   disable=jax.process_index() != 0)
