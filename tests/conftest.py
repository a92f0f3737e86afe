"""Shared test helpers: the tiny quickstart config, and one run of the whole tiny pipeline that the
tests of each stage inspect (compiled once per session)."""

import os

import pytest

from rlhfjax import config_file
from rlhfjax import runtime

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
