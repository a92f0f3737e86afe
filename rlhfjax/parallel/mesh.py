"""The device Mesh: axes `data` (pure data parallelism), `fsdp` (data parallelism with parameters
and optimizer state sharded, ZeRO-3 style) and `tensor` (Megatron-style model parallelism).

`config.mesh = dict(data=-1, fsdp=1, tensor=1)`: one axis may be -1 and takes the devices left;
the product must equal the number of devices used. Devices are taken in `jax.devices()` order, which
groups each process's devices together, so the data axes split across hosts and `tensor` (the
chattiest) stays inside one.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from rlhfjax.errors import ConfigError

AXES = ("data", "fsdp", "tensor")


def mesh_shape(cfg: Mapping[str, int], num_devices: int) -> tuple[int, ...]:
  """The sizes of AXES for `num_devices` devices, resolving one -1."""
  sizes = [int(cfg[a]) for a in AXES]
  if any(s == 0 or s < -1 for s in sizes):
    raise ConfigError(f"mesh: axis sizes must be positive or -1, got {dict(zip(AXES, sizes))}")
  free = [i for i, s in enumerate(sizes) if s == -1]
  if len(free) > 1:
    raise ConfigError(f"mesh: at most one axis may be -1, got {dict(zip(AXES, sizes))}")
  fixed = math.prod(s for s in sizes if s != -1)
  if free:
    if num_devices % fixed:
      raise ConfigError(f"mesh: {num_devices} devices do not divide into "
                        f"{dict(zip(AXES, sizes))} (the fixed axes use {fixed})")
    sizes[free[0]] = num_devices // fixed
  if math.prod(sizes) > num_devices:
    raise ConfigError(f"mesh: {dict(zip(AXES, sizes))} needs {math.prod(sizes)} devices, "
                      f"{num_devices} available")
  return tuple(sizes)


def make_mesh(cfg: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A Mesh over the first prod(shape) of `devices` (default: all, every process's)."""
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(cfg, len(devices))
  used = np.array(devices[:math.prod(shape)], dtype=object).reshape(shape)
  return Mesh(used, AXES, axis_types=(AxisType.Auto,) * len(AXES))
