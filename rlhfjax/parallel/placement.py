"""Where the sampler runs: on the trainer's devices, taking turns with it, or on devices of its own.

`rollout.placement`:
  "colocated"  (the default) the sampler and the trainer share every device and take turns: each
               rollout copies the policy into the rollout layout over the trainer's devices.
  "split"      the devices are divided: the trainer's mesh (`config.mesh`) is laid over the first
               ones and the sampler's rollout layout over the last `rollout.sampler_share` of them,
               so one generates while the other updates (asynchronous rollouts: `max_staleness`).
               After each update the policy is pushed to the sampler's devices, cast to the rollout
               dtype and resharded into the rollout layout across the two meshes (XLA's own
               cross-device copy, as verl's and NeMo-RL's weight sync).

The trainer takes the first devices, so a split run's trainer mesh is exactly the mesh a colocated
run with the same `config.mesh` over that many devices would build: with `max_staleness=0` the two
runs compute the same programs on the same shapes. One process only, for now (`split`).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import jax

from rlhfjax.errors import ConfigError

PLACEMENTS = ("colocated", "split")


def sampler_count(block: Mapping[str, Any], devices: int) -> int:
  """How many of `devices` sample under `rollout.placement='split'` (0 when colocated): the
  nearest whole number to `sampler_share` × devices, leaving the trainer at least one."""
  placement = str(block["placement"])
  if placement not in PLACEMENTS:
    raise ConfigError(f"rollout.placement must be one of {PLACEMENTS}, got {placement!r}")
  if placement == "colocated":
    return 0
  share = float(block["sampler_share"])
  n = int(round(share * devices))
  if not 0 < share < 1 or not 0 < n < devices:
    raise ConfigError(f"rollout.sampler_share={share} leaves {n} of {devices} devices to the "
                      f"sampler and {devices - n} to the trainer with rollout.placement='split': "
                      f"each side needs at least one (more devices, or another share)")
  if str(block["mesh"]) == "train":
    raise ConfigError("rollout.mesh='train' samples in the trainer's own layout, which "
                      "rollout.placement='split' does not have: use 'auto' or an explicit shape")
  return n


def split(block: Mapping[str, Any],
          devices: Sequence[Any] | None = None) -> tuple[list, list]:
  """(trainer devices, sampler devices) of `devices` (default: every process's) under the `rollout`
  block: colocated, every device trains and the sampler list is empty; split, the trainer takes
  the first devices and the sampler the rest. One process only: the push copies the policy
  between two device sets with `jax.device_put`, which JAX does across processes only in its
  TFRT TPU runtime and only between shardings of the same layout (a training and a rollout layout
  differ)."""
  devices = list(jax.devices() if devices is None else devices)
  n = sampler_count(block, len(devices))
  processes = {getattr(d, "process_index", 0) for d in devices}
  if n and len(processes) > 1:
    raise ConfigError(f"rollout.placement='split' runs in one process; this run has "
                      f"{len(processes)}: the push between the trainer's and the sampler's "
                      f"devices would cross processes, which jax.device_put cannot do between "
                      f"different layouts (use 'colocated' across hosts)")
  return devices[:len(devices) - n], devices[len(devices) - n:]


def check_staleness(block: Mapping[str, Any]) -> int:
  """`rollout.max_staleness`: how many policy versions old a batch may be when it is trained on."""
  k = block["max_staleness"]
  if isinstance(k, bool) or not isinstance(k, int) or k < 0:
    raise ConfigError(f"rollout.max_staleness must be a whole number >= 0, got {k!r}")
  return k


def meta(staleness: int) -> dict[str, dict[str, int]]:
  """What a checkpoint records of the staleness, so that a resume under another is refused. (A
  checkpoint of an earlier version has no such block, and is not compared.)"""
  return {"async": {"max_staleness": int(staleness)}}


def describe(trainer: Sequence[jax.Device], sampler: Sequence[jax.Device], staleness: int) -> str:
  """One line: how the devices are divided, and how stale a batch may be."""
  where = (f"the sampler on {len(sampler)} device(s), the trainer on {len(trainer)}" if sampler
           else f"sampler and trainer take turns on {len(trainer)} device(s)")
  lag = (f"a batch is at most {staleness} policy version(s) old" if staleness
         else "every batch from the policy it trains (synchronous)")
  return f"rollout placement: {where}; {lag}"


def bytes_received(tree: Any) -> int:
  """Bytes a push lands on the sampler's devices: each array's shard on every device that holds
  one (a replicated weight counts once per replica), from the arrays' shardings."""
  return int(sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
                 * len(x.sharding.device_set) for x in jax.tree.leaves(tree)))
