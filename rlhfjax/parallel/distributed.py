"""Multi-host start-up on JAX's own distributed runtime (no home-made communication layer).

`config.distributed`:
- `mode='auto'` (default): `jax.distributed.initialize()` when the environment says this is one of
  several processes — a TPU pod slice (JAX reads the TPU metadata itself), a SLURM job step with
  more than one task (JAX reads SLURM_* itself), or `JAX_COORDINATOR_ADDRESS` set — else nothing.
- `mode='explicit'`: `coordinator_address`, `num_processes` and `process_id` from the config (the
  local launcher, or clusters JAX does not detect).
- `mode='off'`: one process.
After start-up every process sees all devices (`jax.devices()`) and builds the same Mesh.
"""

from __future__ import annotations

import os
from typing import Mapping

import jax

from rlhfjax.errors import ConfigError

MODES = ("auto", "explicit", "off")


def _cluster_env() -> str | None:
  """Which multi-process environment this looks like, if any."""
  if int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_STEP_ID" in os.environ:
    return "slurm"
  if os.environ.get("JAX_COORDINATOR_ADDRESS"):
    return "env"
  if os.environ.get("TPU_WORKER_HOSTNAMES", "").count(",") >= 1 or \
     os.environ.get("MEGASCALE_COORDINATOR_ADDRESS"):
    return "tpu"
  return None


def initialize(cfg: Mapping) -> bool:
  """Starts the distributed runtime if this run spans several processes; True when it did.
  Must run before anything touches a device."""
  mode = cfg["mode"]
  if mode not in MODES:
    raise ConfigError(f"distributed.mode must be one of {MODES}, got {mode!r}")
  if mode == "off" or jax.distributed.is_initialized():
    return False
  timeout = int(cfg["initialization_timeout"])
  if mode == "explicit":
    if not cfg["coordinator_address"] or int(cfg["num_processes"]) < 1 or \
       not 0 <= int(cfg["process_id"]) < int(cfg["num_processes"]):
      raise ConfigError("distributed.mode='explicit' needs distributed.coordinator_address "
                        "(host:port), distributed.num_processes >= 1 and 0 <= "
                        "distributed.process_id < num_processes; got "
                        f"{cfg['coordinator_address']!r}, {cfg['num_processes']}, "
                        f"{cfg['process_id']}")
    jax.distributed.initialize(cfg["coordinator_address"], int(cfg["num_processes"]),
                               int(cfg["process_id"]), initialization_timeout=timeout)
    return True
  if _cluster_env() is None:
    return False
  jax.distributed.initialize(initialization_timeout=timeout)
  return True
