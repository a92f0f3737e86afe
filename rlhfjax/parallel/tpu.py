"""TPU chips and slices, known without a TPU: the chips' public figures, a slice's devices from
libtpu, and the environment libtpu needs on a host that has none.

With libtpu installed (`pip install -e '.[tpu]'`), `devices("v5e:4x4")` returns the 16 chips of
that slice; a Mesh over them lowers and compiles real steps for that hardware on a CPU host
(rlhfjax/stages/compile.py). One device is one chip: v4 and v5p are asked for in megacore mode
(their two TensorCores as one device), as a TPU VM runs them.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import math
import os
import re

from rlhfjax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation's public per-chip figures (Google Cloud TPU documentation)."""
  name: str
  peak_flops: float  # Dense bf16 FLOP/s.
  hbm_bytes: int
  hbm_bandwidth: float  # Bytes/s.
  ici_bandwidth: float  # Bytes/s: the inter-chip interconnect figure per chip.
  accelerator: str  # The gcloud accelerator-type prefix (v5e is "v5litepod").
  cores_per_chip: int  # gcloud counts v4 and v5p slices in TensorCores, v5e and v6e in chips.
  dims: int  # 2D (v5e, v6e) or 3D (v4, v5p) torus.


GiB = 2**30
CHIPS: dict[str, Chip] = {
    "v4": Chip("v4", 275e12, 32 * GiB, 1200e9, 2400e9 / 8, "v4", 2, 3),
    "v5e": Chip("v5e", 197e12, 16 * GiB, 819e9, 1600e9 / 8, "v5litepod", 1, 2),
    "v5p": Chip("v5p", 459e12, 95 * GiB, 2765e9, 4800e9 / 8, "v5p", 2, 3),
    "v6e": Chip("v6e", 918e12, 32 * GiB, 1640e9, 3584e9 / 8, "v6e", 1, 2),
}
_HOST_BOUNDS = (2, 2, 1)  # libtpu's default chips per host.
_TOPOLOGY = re.compile(r"^(v4|v5e|v5p|v6e):(\d+(?:x\d+){1,2})$")
# What libtpu needs to start quietly where there is no TPU (it then falls back to the CPU).
# Several processes may load it (tests, a compile beside a training run): there is no chip to share.
_CPU_HOST_ENV = {"TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": "v5litepod-4",
                 "TPU_WORKER_HOSTNAMES": "localhost", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


def has_libtpu() -> bool:
  return importlib.util.find_spec("libtpu") is not None


def quiet_libtpu_without_tpu() -> None:
  """Sets libtpu's environment for a host with no TPU, so importing jax prints no TPU errors.

  libtpu installed on a CPU host otherwise prints TPU_WORKER_HOSTNAMES and accelerator-type errors
  at the first jax call (harmless: jax falls back to the CPU). Nothing is set on a TPU VM (it has
  /dev/accel* or /dev/vfio devices) or where the user named a topology (TPU_ACCELERATOR_TYPE or
  TPU_WORKER_HOSTNAMES); another of these variables that is already set keeps its value.
  """
  if not has_libtpu() or glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
    return
  # Importing jax on a host without TPU chips sets TPU_SKIP_MDS_QUERY itself, so only the topology
  # variables tell that the user chose one; this then works whether or not jax came first.
  if any(k in os.environ for k in ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES")):
    return
  for key, value in _CPU_HOST_ENV.items():
    os.environ.setdefault(key, value)


def parse(topology: str) -> tuple[Chip, tuple[int, ...]]:
  """'v5e:4x4' -> (the v5e Chip, (4, 4)); a clear error for anything else."""
  m = _TOPOLOGY.match(topology.strip())
  if not m:
    raise ConfigError(f"compile.topology: {topology!r} is not a TPU topology like v5e:4x4, "
                      f"v4:2x2x1, v5p:2x2x2 or v6e:2x4 (chips: {', '.join(CHIPS)})")
  chip, shape = CHIPS[m.group(1)], tuple(int(s) for s in m.group(2).split("x"))
  if len(shape) != chip.dims:
    raise ConfigError(f"compile.topology: {chip.name} slices are {chip.dims}D "
                      f"(e.g. {'v5e:4x4' if chip.dims == 2 else chip.name + ':2x2x2'}), "
                      f"got {topology!r}")
  return chip, shape


def chips_in(topology: str) -> int:
  return math.prod(parse(topology)[1])


def devices(topology: str) -> list:
  """The devices (one per chip) of a TPU slice, from libtpu; no TPU needed."""
  chip, shape = parse(topology)
  if not has_libtpu():
    raise ConfigError("compiling for a TPU topology needs libtpu: pip install -e '.[tpu]'")
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  kwargs = {"chip_config_name": "megacore"} if chip.cores_per_chip == 2 else {}
  full = tuple(shape) + (1,) * (3 - len(shape))
  if any(s < b for s, b in zip(full, _HOST_BOUNDS)):  # A slice smaller than one host's chips.
    kwargs["chips_per_host_bounds"] = tuple(min(s, b) for s, b in zip(full, _HOST_BOUNDS))
  name = topology.strip()
  try:
    return list(topologies.get_topology_desc(platform="tpu", topology_name=name, **kwargs).devices)
  except Exception as e:  # libtpu's own message says what went wrong.
    raise ConfigError(f"compile.topology: libtpu gave no devices for {name!r}: {e}") from e


def slice_sizes(chip: Chip) -> tuple[int, ...]:
  """Chip counts of the single slices Google Cloud offers: 2D pods (v5e, v6e) of 1 to 256 chips
  (no 2-chip slice), 3D pods (v4, v5p) from one host of 4 chips, doubling."""
  if chip.dims == 2:
    return (1, 4, 8, 16, 32, 64, 128, 256)
  return tuple(4 * 2**i for i in range(11))


def topology_for(accelerator: str) -> str:
  """The topology of a gcloud accelerator type: 'v5litepod-16' -> 'v5e:4x4', 'v5p-8' -> 'v5p:2x2x1'
  (the default slice shapes: a 2D or 3D torus as square as the chip count allows)."""
  m = re.match(r"^(v4|v5litepod|v5e|v5p|v6e)-(\d+)$", accelerator.strip())
  if not m:
    raise ConfigError(f"unknown accelerator type {accelerator!r} (e.g. v4-8, v5litepod-16, "
                      "v5p-8, v6e-8)")
  chip = next(c for c in CHIPS.values() if m.group(1) in (c.name, c.accelerator))
  count = int(m.group(2))
  chips = count // chip.cores_per_chip
  if count % chip.cores_per_chip or chips not in slice_sizes(chip):
    offered = ", ".join(f"{chip.accelerator}-{n * chip.cores_per_chip}" for n in slice_sizes(chip))
    raise ConfigError(f"{accelerator} is not a {chip.name} slice Google Cloud offers "
                      f"({'TensorCores, 2 per chip' if chip.cores_per_chip == 2 else 'chips'} "
                      f"in the name): {offered}")
  shape = [1] * chip.dims
  for _ in range(chips.bit_length() - 1):  # Double the smallest side, first one first.
    shape[shape.index(min(shape))] *= 2
  shape = sorted(shape)
  if shape[0] == 1 and chip.dims == 3:  # v4-8 / v5p-8 are named 2x2x1.
    shape = shape[1:] + [1]
  return f"{chip.name}:{'x'.join(map(str, shape))}"
