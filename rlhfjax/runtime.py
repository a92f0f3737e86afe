"""How JAX computes on this machine (`config.runtime`): matmul precision and deterministic GPU ops.

Two defaults of JAX break promises this project makes for float32 configs — parity with reference
implementations, and a resumed run equal to an uninterrupted one — on accelerators (not on a CPU,
where both settings change nothing):
  - float32 matmuls run as TF32 on NVIDIA GPUs and as bfloat16 passes on TPUs (JAX's "default"
    precision): on an H100, logits differed from Hugging Face's by up to 7e-3 (shared/notes/gpu.md);
  - GPU reductions and scatters use atomics, so two runs of the same step differ in the last bits.

`apply` sets both, before the backend starts (XLA reads its flags once, when the first computation
creates the backend):
  matmul_precision: "auto" (default) is "highest" when the model computes in float32 and JAX's
    "default" otherwise (bfloat16 activations round every matmul input already); or one of JAX's
    names: "default", "high", "highest", "bfloat16", "tensorfloat32", "float32".
  deterministic: True (default) adds XLA's `--xla_gpu_deterministic_ops=true` (deterministic
    reductions and scatters, autotuning restricted to deterministic kernels). False is the fast
    setting for bfloat16 training on GPUs, where a resumed run then differs in the last bits.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import jax
from jax._src import xla_bridge  # backends_are_initialized: JAX's own distributed.initialize uses it.

from rlhfjax.errors import ConfigError

PRECISIONS = ("auto", "default", "high", "highest", "bfloat16", "tensorfloat32", "float32")
DETERMINISTIC_FLAG = "--xla_gpu_deterministic_ops=true"
DEFAULTS = {"matmul_precision": "auto", "deterministic": True}


def matmul_precision(name: str, model_dtype: str) -> str:
  """The JAX precision `runtime.matmul_precision` means for a model computing in `model_dtype`."""
  if name not in PRECISIONS:
    raise ConfigError(f"runtime.matmul_precision must be one of {PRECISIONS}, got {name!r}")
  if name == "auto":
    return "highest" if model_dtype == "float32" else "default"
  return name


def _flags() -> list[str]:
  return os.environ.get("XLA_FLAGS", "").split()


def apply(block: Mapping[str, Any] | None, model_dtype: str) -> dict[str, str]:
  """Sets JAX's default matmul precision and, with `deterministic`, XLA's deterministic GPU ops
  flag (in XLA_FLAGS, before the backend starts); returns what is in effect.

  Called once the backend has started (a notebook that computed before), the flag can no longer
  reach XLA: on a GPU that is a ConfigError saying how to set it; elsewhere the flag means nothing.
  Both settings stay for the rest of the process (XLA's flags cannot be taken back once read).
  """
  block = {**DEFAULTS, **dict(block or {})}
  unknown = sorted(set(block) - set(DEFAULTS))
  if unknown:
    raise ConfigError(f"unknown runtime config key(s): {', '.join('runtime.' + k for k in unknown)}")
  precision = matmul_precision(block["matmul_precision"], model_dtype)
  jax.config.update("jax_default_matmul_precision", None if precision == "default" else precision)
  deterministic = bool(block["deterministic"])
  flags = _flags()
  if deterministic and DETERMINISTIC_FLAG not in flags:
    if not xla_bridge.backends_are_initialized():
      os.environ["XLA_FLAGS"] = " ".join(flags + [DETERMINISTIC_FLAG])
    elif jax.default_backend() == "gpu":
      raise ConfigError(
          "runtime.deterministic=True: JAX's GPU backend started before rlhfjax could set "
          f"{DETERMINISTIC_FLAG}; export XLA_FLAGS={DETERMINISTIC_FLAG} before starting Python "
          "(or run rlhfjax before computing anything), or set runtime.deterministic=False")
  # Whether XLA runs deterministic GPU ops: the flag may also come from the user's XLA_FLAGS or an
  # earlier run in this process (XLA reads it once), whatever this block asks.
  return {"matmul_precision": precision,
          "deterministic": str(DETERMINISTIC_FLAG in _flags()).lower()}
