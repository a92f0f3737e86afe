"""Shared test helpers: the tiny quickstart config, and one run of the whole tiny pipeline that the
tests of each stage inspect (compiled once per session)."""

import ctypes.util
import fcntl
import gc
import os
import shutil
import tempfile

# One persistent compilation cache per test session, shared with the processes tests start (CLI
# runs, killed and resumed runs, two-process runs): they compile the same steps as this process and
# as each other, and XLA's compile is most of a tiny step's cost. Set before JAX is imported, so
# this process and every child read it; a JAX_COMPILATION_CACHE_DIR already set is used as it is
# (and kept). A cached program is the same executable, so no result depends on the cache.
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="rlhfjax-test-xla-cache-")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

# The tests' programs are tiny and compiled once each, so on a CPU the compile costs far more than
# the code it makes saves: the suite compiles without LLVM's optimisation passes (a third of
# test_model.py's wall time), with XLA:CPU's older elemental emitters instead of its MLIR fusion
# emitters (a third to two fifths of the rest of a training step's compile:
# tests/parallel_steps.py's SFT, PPO and GRPO steps on one CPU device and on 2x2x2), and as one
# LLVM module instead of several compiled on threads of their own: the suite's two workers keep
# both cores busy, so the split only adds work (a tiny SFT step's compile, on one device and on
# 2x2x2: 17-18% less CPU time). The processes the suite starts inherit the flags. Every test
# compares results computed under the same flags, so none depends on them; a user's runs compile
# with XLA's defaults. A flag set by hand is kept.
for _flag in ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false",
              "--xla_cpu_parallel_codegen_split_count=1"):
  if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), _flag]).strip()
# tcmalloc, where the host has it (Debian's libtcmalloc-minimal4; .ci/run installs it), for every
# process the suite starts: the pytest-xdist workers (started after this file is read, with its
# environment) and the runs they start. Compiling is most of a tiny test's time and allocates in
# small pieces from several threads: with glibc's allocator (one arena, as runtime.host_malloc
# sets it) a TPU compile spent a sixth of its time in malloc and free. Measured on 2 cores:
# test_compile's critic-free updates and one family pipeline 14-23% faster than under `reuse`
# (docs/research/performance_sessions.md). Allocation changes no result. LD_PRELOAD set by hand is
# kept; tcmalloc's notes on allocations over 1 GiB are silenced (some tests read a run's stderr).
if "LD_PRELOAD" not in os.environ:
  _TCMALLOC = ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")
  if _TCMALLOC:
    os.environ["LD_PRELOAD"] = _TCMALLOC
    os.environ.setdefault("TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD", str(2**40))
# pytest-xdist runs the suite in several processes (pytest.ini): on a GPU each would otherwise take
# most of its memory when it starts.
if "PYTEST_XDIST_WORKER" in os.environ:
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# Tracing a step makes and drops many small containers; at Python's default thresholds (700, 10, 10)
# the cyclic collector ran 2,400 times in one family pipeline's test and took 3.5 s of its 70 s,
# mostly walking the objects torch, transformers and JAX left at import. Rarer young collections
# halve that; none of the tests' objects needs collecting sooner.
gc.set_threshold(10_000, 20, 20)

import pytest  # noqa: E402

from rlhfjax import config_file  # noqa: E402
from rlhfjax import runtime  # noqa: E402

# What `python -m rlhfjax.main` sets for float32 configs: full-precision float32 matmuls and
# deterministic GPU ops, so the parity and exact-resume tests hold on a GPU or TPU as on a CPU
# (where both change nothing). Before any test starts a backend.
runtime.apply(None, "float32")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(name: str = "tldr_sim", arg: str | None = "tiny"):
  return config_file.load(os.path.join(ROOT, "configs", f"{name}.py"), arg)


@pytest.fixture
def tiny_config():
  return load_config()


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory):
  """(config, workdir) of a finished tiny run of every default stage: run once per test session,
  by the first pytest-xdist worker that needs it while the others wait on a lock. Tests read it;
  a test that writes copies it first."""
  from rlhfjax import main
  config = load_config()
  shared = tmp_path_factory.getbasetemp()
  if "PYTEST_XDIST_WORKER" in os.environ:
    shared = shared.parent  # The directory every worker's base temp lives in.
  workdir = str(shared / "pipeline")
  with open(str(shared / "pipeline.lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    done = shared / "pipeline.done"
    if not done.exists():
      main.run(config, workdir)  # Resumes whatever a failed worker left.
      done.touch()
  return config, workdir


# The test files that take longest on two cores (`--durations=0` summed per file), longest first.
# pytest-xdist hands out whole files in collection order (pytest.ini: `--dist loadfile
# --no-loadscope-reorder`); starting these first keeps one of them from running alone at the end
# while the other worker has nothing left to do.
_LONGEST_FIRST = ("test_compile.py", "test_multiprocess.py", "test_family_pipelines.py",
                  "test_parallel.py", "test_methods_pipeline.py", "test_async_rollouts.py",
                  "test_chaos.py", "test_pretrained.py", "test_labeling_browser.py",
                  "test_notebooks.py", "test_trl_methods.py", "test_cli.py",
                  "test_reward_functions.py", "test_reward_model.py", "test_attention.py",
                  "test_sft.py")


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # Stable: files stay whole.


# Seconds per test file (setup, call and teardown of its tests: module fixtures included), summed
# from the reports the workers send: what _LONGEST_FIRST orders by and the suite's time is made of.
_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
  name = report.nodeid.split("::")[0]
  _FILE_SECONDS[name] = _FILE_SECONDS.get(name, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
  if not _FILE_SECONDS:
    return
  terminalreporter.section("seconds per test file (the 15 longest; all files "
                           f"{sum(_FILE_SECONDS.values()):.0f} s)")
  for name, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:15]:
    terminalreporter.write_line(f"{seconds:8.1f}  {name}")


def pytest_sessionfinish(session, exitstatus):
  if _OWN_CACHE:
    shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
