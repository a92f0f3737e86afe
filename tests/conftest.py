"""Shared test helpers: the tiny quickstart config, and one run of the whole tiny pipeline that the
tests of each stage inspect (compiled once per session)."""

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
  """(config, workdir) of a finished tiny run of every default stage."""
  from rlhfjax import main
  config = load_config()
  workdir = str(tmp_path_factory.mktemp("pipeline"))
  main.run(config, workdir)
  return config, workdir


def pytest_sessionfinish(session, exitstatus):
  if _OWN_CACHE:
    shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
