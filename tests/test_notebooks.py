"""The Colab TPU demo notebooks run headless on CPU (tiny config) and produce their results."""

import os
import shutil

import nbformat
from nbclient import NotebookClient

from conftest import ROOT

NOTEBOOKS = os.path.join(ROOT, "docs", "notebooks")


def _execute(name: str, tmp_path, monkeypatch) -> nbformat.NotebookNode:
  monkeypatch.setenv("RLHFJAX_TINY", "1")
  monkeypatch.setenv("RLHFJAX_WORKDIR", str(tmp_path / "work"))
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
  NotebookClient(nb, timeout=600, kernel_name="python3",
                 resources={"metadata": {"path": NOTEBOOKS}}).execute()
  return nb


def _text(nb) -> str:
  out = []
  for cell in nb.cells:
    for o in cell.get("outputs", []):
      out.append(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) +
                 str(o.get("data", {}).get("text/markdown", "")))
  return "\n".join(out)


def test_quickstart_notebook(tmp_path, monkeypatch, tiny_pipeline):
  """The notebook's pipeline finds the session's tiny run of the same config finished (it trains
  nothing again: the suite's time is shared), then evaluates, reports and plots."""
  _, done = tiny_pipeline
  (tmp_path / "work").mkdir()
  for name in ("tokenizer.model", "sft", "label", "rm", "ppo"):
    copy = shutil.copytree if os.path.isdir(os.path.join(done, name)) else shutil.copy
    copy(os.path.join(done, name), str(tmp_path / "work" / name))
  nb = _execute("quickstart_colab_tpu.ipynb", tmp_path, monkeypatch)
  text = _text(nb)
  assert "cpu 1 devices" in text
  assert "| sft step |" in text  # The memory plan.
  assert "comparisons already labelled" in text and "reward model already trained" in text
  assert os.path.exists(tmp_path / "work" / "eval" / "leaderboard.md")
  assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def test_sharding_notebook(tmp_path, monkeypatch):
  # The notebook sets the 8 CPU devices only where XLA_FLAGS is unset, as on a fresh Colab.
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  nb = _execute("sharding_colab_tpu.ipynb", tmp_path, monkeypatch)
  text = _text(nb)
  assert "cpu 8 devices" in text  # The notebook forced 8 host devices in its own kernel.
  for mesh in ("1x1x1", "8x1x1", "1x8x1", "2x2x2"):
    assert f"mesh {mesh}: loss" in text
  assert "| 1x8x1 |" in text
