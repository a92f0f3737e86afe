"""How JAX computes on this machine (`config.runtime`): matmul precision, deterministic GPU ops, and
how the host's memory allocator treats XLA:CPU's large buffers.

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
  host_malloc: on a CPU, every call of a compiled step allocates its scratch buffer (300 MB for
    the quickstart's SFT step) and frees it after. glibc hands a buffer that large straight to the
    kernel and back (mmap and munmap; in a worker thread's arena even with mmap turned off), so
    every page is faulted in and zeroed again on every step: a fifth of the quickstart's CPU time
    was the kernel's. "reuse" makes glibc keep freed memory for the next step (one malloc arena,
    no mmap, up to 2 GiB of free heap kept): the quickstart's SFT steps ran 15% faster on a 2-core
    CPU, for a larger resident set. One arena means one malloc lock for every thread: measured on
    2 cores only. "auto" (default) is "reuse" where glibc is the C library and JAX will
    compute on the CPU (JAX_PLATFORMS starts with cpu, or the host has no GPU or TPU device
    node); "system" leaves glibc's defaults, as does any setting where an allocator in
    LD_PRELOAD (tcmalloc, jemalloc) replaces glibc's malloc. Set only before the backend starts
    (it governs the threads XLA creates then); afterwards it is left as it was.
"""

from __future__ import annotations

import ctypes
import glob
import os
import platform
from typing import Any, Mapping

import jax
from jax._src import xla_bridge  # backends_are_initialized: JAX's own distributed.initialize uses it.

from rlhfjax.errors import ConfigError

PRECISIONS = ("auto", "default", "high", "highest", "bfloat16", "tensorfloat32", "float32")
DETERMINISTIC_FLAG = "--xla_gpu_deterministic_ops=true"
HOST_MALLOC = ("auto", "reuse", "system")
DEFAULTS = {"matmul_precision": "auto", "deterministic": True, "host_malloc": "auto"}
# glibc's mallopt parameters (malloc.h) and the largest trim threshold an int carries.
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_KEEP_FREE_BYTES = 2**31 - 1
# Device nodes of the accelerators JAX drives: NVIDIA and AMD GPUs, TPUs (accel on v2-v4 hosts, vfio
# on later ones).
_ACCELERATOR_NODES = ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/accel[0-9]*", "/dev/vfio/[0-9]*")


def matmul_precision(name: str, model_dtype: str) -> str:
  """The JAX precision `runtime.matmul_precision` means for a model computing in `model_dtype`."""
  if name not in PRECISIONS:
    raise ConfigError(f"runtime.matmul_precision must be one of {PRECISIONS}, got {name!r}")
  if name == "auto":
    return "highest" if model_dtype == "float32" else "default"
  return name


def computes_on_cpu() -> bool:
  """Whether JAX will compute on the CPU, judged before its backend starts: JAX_PLATFORMS (or
  jax_platforms) names cpu first, or this host has no GPU or TPU device node."""
  platforms = jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS", "")
  if platforms:
    return platforms.split(",")[0].strip() == "cpu"
  return not any(glob.glob(pattern) for pattern in _ACCELERATOR_NODES)


def _reuse_host_memory() -> bool:
  """Makes glibc keep freed memory for reuse instead of returning it to the kernel: one malloc
  arena (buffers a worker thread allocates come from the heap, not a fresh mapping), no mmap, and
  up to 2 GiB of free heap kept. False where the C library is not glibc.

  A thread that allocated before this keeps its own arena, and glibc hands the arena of a finished
  thread to the next new one: call it before any other thread allocates (`python -m rlhfjax.main`
  does; elsewhere MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 in the environment is the sure way).
  False too where another allocator took malloc's place (tcmalloc or jemalloc in LD_PRELOAD): it
  keeps freed memory by itself, and its mallopt does nothing."""
  if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
    return False
  process, libc = ctypes.CDLL(None), ctypes.CDLL("libc.so.6")
  if ctypes.cast(process.malloc, ctypes.c_void_p).value != ctypes.cast(libc.malloc,
                                                                        ctypes.c_void_p).value:
    return False
  mallopt = process.mallopt
  mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
  done = [mallopt(param, value) for param, value in
          ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _KEEP_FREE_BYTES))]
  return all(ok == 1 for ok in done)


_reusing = False  # glibc's settings, once made, stay for the rest of the process.


def _host_malloc(name: str) -> str:
  """Applies `runtime.host_malloc` (before the backend starts) and says what is in effect."""
  global _reusing
  if name not in HOST_MALLOC:
    raise ConfigError(f"runtime.host_malloc must be one of {HOST_MALLOC}, got {name!r}")
  if name == "auto":
    name = "reuse" if computes_on_cpu() else "system"
  if name == "reuse" and not _reusing and not xla_bridge.backends_are_initialized():
    _reusing = _reuse_host_memory()
  return "reuse" if _reusing else "system"


def _flags() -> list[str]:
  return os.environ.get("XLA_FLAGS", "").split()


def apply(block: Mapping[str, Any] | None, model_dtype: str) -> dict[str, str]:
  """Sets JAX's default matmul precision, with `deterministic` XLA's deterministic GPU ops flag (in
  XLA_FLAGS, before the backend starts), and glibc's treatment of large buffers (`host_malloc`,
  before the backend starts); returns what is in effect.

  Called once the backend has started (a notebook that computed before), the flag can no longer
  reach XLA: on a GPU that is a ConfigError saying how to set it; elsewhere the flag means nothing.
  Both settings stay for the rest of the process (XLA's flags cannot be taken back once read).
  """
  block = {**DEFAULTS, **dict(block or {})}
  unknown = sorted(set(block) - set(DEFAULTS))
  if unknown:
    raise ConfigError(f"unknown runtime config key(s): {', '.join('runtime.' + k for k in unknown)}")
  precision = matmul_precision(block["matmul_precision"], model_dtype)
  host_malloc = _host_malloc(block["host_malloc"])
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
          "deterministic": str(DETERMINISTIC_FLAG in _flags()).lower(), "host_malloc": host_malloc}
