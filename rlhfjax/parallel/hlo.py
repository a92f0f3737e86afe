"""The collectives of a compiled XLA program, counted from its HLO text (`compiled.as_text()`):
per kind (all-gather, all-reduce, reduce-scatter, all-to-all, collective-permute) their number,
the bytes of their results per chip, and the bytes each chip receives over the interconnect.

Received bytes, per collective, from its result bytes and its replica group of n chips, ring
algorithms: all-gather and all-to-all (n-1)/n of the result, all-reduce 2(n-1)/n, reduce-scatter
(n-1) times, collective-permute the result; a while loop's collectives count its trip count
times. task=compile (rlhfjax/stages/compile.py) reads its rows' ICI traffic from here.
"""

from __future__ import annotations

import math
import re
from typing import Any

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")

# Compiled HLO text: an instruction `%name = <result shape(s)> <collective>[-start|-done](...)`, a
# computation's header `[ENTRY] %name (params) -> result {`, the computations an instruction calls.
_OP = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = ([^%=]+?) (" + "|".join(COLLECTIVES)
                 + r")(-start|-done)?\((.*)$")
_SHAPE = re.compile(r"\b([a-z][a-z0-9]*)\[([\d,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+) .*\{\s*$")
_CALLS = re.compile(r"\b(?:calls|to_apply|body|condition)=%?([\w.\-]+)")
_CALL_LISTS = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_CONDITION = re.compile(r"\bcondition=%?([\w.\-]+)")
_INT = re.compile(r"= [su](?:32|64)\[\][^ ]* constant\((\d+)\)")
_CHANNEL = re.compile(r"\bchannel_id=(\d+)")
_GROUPS_MESH = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}")
_GROUPS_IOTA = re.compile(r"replica_groups=\[([\d,]+)\]<=")
_GROUPS_LIST = re.compile(r"replica_groups=\{\{([\d,]*)\}")


def _shape_bytes(text: str) -> float:
  """Bytes of the array shapes in `text` (`bf16[4096,14336]{1,0}`; a tuple counts every one)."""
  total = 0.0
  for dtype, dims in _SHAPE.findall(text):
    digits = re.search(r"\d+", dtype)
    bits = int(digits.group()) if digits else 8 if dtype == "pred" else 0
    total += math.prod(int(d) for d in dims.split(",") if d) * bits / 8
  return total


def _group_size(text: str, devices: int) -> int:
  """Chips in each replica group of a collective (all `devices` where the text does not say)."""
  if m := _GROUPS_MESH.search(text):
    sizes = dict(re.findall(r"'(\w+)'=(\d+)", m.group(1)))
    return math.prod(int(sizes[a]) for a in re.findall(r"'(\w+)'", m.group(2)))
  if m := _GROUPS_IOTA.search(text):
    return int(m.group(1).split(",")[-1])
  if m := _GROUPS_LIST.search(text):
    return len(m.group(1).split(","))
  return devices


def _received(kind: str, result: float, n: int) -> float:
  """Bytes a chip receives in one collective with `result` bytes per chip over `n` chips (ring)."""
  if kind == "all-reduce":
    return 2 * result * (n - 1) / n
  if kind == "reduce-scatter":
    return result * (n - 1)
  if kind == "collective-permute":
    return result
  return result * (n - 1) / n  # all-gather, all-to-all.


def collectives(hlo: str, devices: int = 1) -> dict:
  """The collectives one run of a compiled program (`compiled.as_text()`) executes on a chip:
  per kind, their number, the bytes of their results and the largest result, and the bytes the
  chip receives in all of them (`received`). An async pair counts once (its `-start`; the
  `-done`'s result gives the bytes); one collective (one channel id) that the TPU compiler
  copies into several fusions counts once; a while loop's body counts its trip count times:
  XLA's known_trip_count, or else the bound its condition compares the counter with (the
  largest integer constant there: a scan from 0)."""
  ops: dict[str, list[dict]] = {}  # Computation -> its collectives.
  calls: dict[str, list[tuple[str, Any]]] = {}  # Computation -> (callee, times or condition).
  bounds: dict[str, int] = {}  # Computation -> its largest integer scalar constant.
  entry = current = ""
  for line in hlo.splitlines():
    if not line.startswith((" ", "\t")):
      if m := _HEADER.match(line):
        current = m.group(2)
        ops[current], calls[current] = [], []
        entry = current if m.group(1) else entry
      continue
    if not current:
      continue
    if const := _INT.search(line):
      bounds[current] = max(bounds.get(current, 0), int(const.group(1)))
    trip: Any = 1
    if " while(" in line:
      known, cond = _TRIP.search(line), _CONDITION.search(line)
      trip = int(known.group(1)) if known else cond.group(1) if cond else 1
    calls[current] += [(c, trip) for c in _CALLS.findall(line)]
    for group in _CALL_LISTS.findall(line):
      calls[current] += [(c.strip().lstrip("%"), 1) for c in group.split(",") if c.strip()]
    if not (m := _OP.match(line)):
      continue
    name, shape, kind, phase, rest = m.groups()
    if phase == "-done":  # The result of the `-start` it names.
      start = re.search(r"%([\w.\-]+)", rest)
      for op in ops[current]:
        if start and op["name"] == start.group(1):
          op["bytes"] = _shape_bytes(shape)
      continue
    channel = _CHANNEL.search(rest)
    ops[current].append({"name": name, "kind": kind, "bytes": _shape_bytes(shape),
                         "key": channel.group(1) if channel else (current, name),
                         "group": _group_size(rest, devices)})
  times: dict[Any, tuple[dict, int]] = {}
  seen = set()

  def visit(comp: str, n: int) -> None:
    if (comp, n) in seen:
      return
    seen.add((comp, n))
    for op in ops.get(comp, []):
      if n > times.get(op["key"], (op, 0))[1]:
        times[op["key"]] = (op, n)
    for callee, trip in calls.get(comp, []):
      visit(callee, n * (trip if isinstance(trip, int) else max(bounds.get(trip, 1), 1)))

  visit(entry, 1)
  out = {k: {"count": 0, "bytes": 0.0, "largest": 0.0} for k in COLLECTIVES}
  received = 0.0
  for op, n in times.values():
    row = out[op["kind"]]
    row["count"] += n
    row["bytes"] += n * op["bytes"]
    row["largest"] = max(row["largest"], op["bytes"])
    received += n * _received(op["kind"], op["bytes"], op["group"])
  return {"ops": out, "received": received}
