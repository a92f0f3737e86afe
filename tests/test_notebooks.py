"""The Colab TPU demo notebooks run headless on CPU (tiny config) and produce their results."""

import math
import os
import shutil

import jax
import nbformat
from nbclient import NotebookClient
import numpy as np

from conftest import ROOT
from rlhfjax.models import hf_checkpoint
from rlhfjax.training import metrics as metrics_lib

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
  # The notebook adds the 8 CPU devices to XLA_FLAGS where they name no device count, as on a fresh
  # Colab; the suite's other flags (conftest) stay, as any flags a user set would.
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  monkeypatch.setenv("XLA_FLAGS", " ".join(flags))
  nb = _execute("sharding_colab_tpu.ipynb", tmp_path, monkeypatch)
  text = _text(nb)
  assert "cpu 8 devices" in text  # The notebook forced 8 host devices in its own kernel.
  for mesh in ("1x1x1", "8x1x1", "1x8x1", "2x2x2"):
    assert f"mesh {mesh}: loss" in text
  assert "| 1x8x1 |" in text


def test_pretrained_notebook(tmp_path, monkeypatch):
  """The pretrained notebook runs SFT, labels, the RM, GRPO, DPO and the leaderboard with LoRA from
  a tiny random Qwen3 checkpoint (written here: nothing is downloaded), shows the memory plan and
  exports both policies, which transformers loads with the source model's tokenizer."""
  # Imported here, not above: it skips (or, in CI, fails) without torch and transformers, and the
  # other notebooks need neither.
  from test_family_pipelines import hf_checkpoint_dir  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  init_from = hf_checkpoint_dir(tmp_path / "hf", "qwen3")
  monkeypatch.setenv("RLHFJAX_INIT_FROM", init_from)
  nb = _execute("pretrained_colab_tpu.ipynb", tmp_path, monkeypatch)
  text = _text(nb)
  work = tmp_path / "work"
  assert "cpu 1 devices" in text and f"init_from: {init_from}" in text
  assert "| sft step |" in text and "| LoRA r=4 |" in text  # The memory plan.
  for stage in ("grpo", "dpo"):
    assert f"| {stage} | " in text  # The notebook's metrics table (it checks they are finite).
    logged = metrics_lib.read_jsonl(str(work / stage / "metrics.jsonl"))
    assert logged and all(math.isfinite(v) for m in logged.values() for v in m.values())
  board = (work / "eval" / "leaderboard.md").read_text()
  assert "| GRPO |" in board and "| DPO |" in board
  assert "reference [" in text and "grpo [" in text  # The example post's summaries.
  start, _ = hf_checkpoint.load(init_from)
  for method in ("grpo", "dpo"):
    directory = str(work / "export" / method)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert transformers.AutoTokenizer.from_pretrained(directory).eos_token == "<|im_end|>"
    params, _ = hf_checkpoint.load(directory)
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(start),
                                                       jax.tree.leaves(params)))
