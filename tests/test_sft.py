"""SFT: the loss sees only summary tokens, it falls, and a killed run resumes to the same parameters."""

import os
import re
import signal
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from conftest import ROOT
from rlhfjax.algorithms import sft
from rlhfjax.data import pipeline
from rlhfjax.errors import ConfigError
from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig
from rlhfjax.training import checkpoint
from rlhfjax.training import experiment
from rlhfjax.training import metrics


def test_response_nll_counts_summary_tokens_only():
  cfg = ModelConfig(vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32,
                    max_len=16)
  params = transformer.init(jax.random.key(0), cfg)
  batch = {"prompt": np.array([[0, 0, 5, 6], [7, 8, 9, 10]], np.int32),
           "prompt_mask": np.array([[0, 0, 1, 1], [1, 1, 1, 1]], bool),
           "response": np.array([[11, 1, 0], [12, 13, 1]], np.int32),
           "response_mask": np.array([[1, 1, 0], [1, 1, 1]], bool)}
  nll, n = sft.response_nll(params, batch, cfg)
  assert int(n) == 5
  # By hand: log-softmax of the full forward at the positions that predict response tokens.
  tokens = np.concatenate([batch["prompt"], batch["response"]], 1)
  mask = np.concatenate([batch["prompt_mask"], batch["response_mask"]], 1)
  hidden, _ = transformer.forward(params, tokens, cfg, mask=mask)
  logp = np.asarray(jax.nn.log_softmax(transformer.lm_logits(params, hidden, cfg)))
  expected = -sum(logp[b, t - 1, tokens[b, t]] for b in range(2) for t in range(4, 7) if mask[b, t])
  np.testing.assert_allclose(float(nll), expected, rtol=1e-5)
  # Padding (before the prompt, after eos) carries no loss.
  changed = dict(batch, prompt=batch["prompt"].copy(), response=batch["response"].copy())
  changed["prompt"][0, :2] = 3
  changed["response"][0, 2] = 4
  np.testing.assert_allclose(float(sft.response_nll(params, changed, cfg)[0]), float(nll), rtol=1e-6)


def test_sft_loss_falls(tmp_path, tiny_config):
  tiny_config.sft.update(steps=60, lr=3e-3, eval_every=60)
  exp = experiment.prepare(tiny_config, str(tmp_path))
  val = pipeline.encode_sft(exp.tokenizer, exp.splits["validation"], 128, 32)
  init_params = transformer.init(jax.random.split(jax.random.key(tiny_config.seed))[0], exp.model)
  before = sft.response_nll(init_params, val, exp.model)
  state = sft.train(exp)
  after = sft.response_nll(state.params, val, exp.model)
  assert float(after[0] / after[1]) < 0.7 * float(before[0] / before[1])
  logged = metrics.read_jsonl(str(tmp_path / "sft" / "metrics.jsonl"))
  assert logged[60]["val/loss"] < logged[2]["train/loss"]


_KILL_AT_STEP_8 = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from conftest import load_config
from rlhfjax.training import checkpoint
from rlhfjax import main
orig = checkpoint.Checkpointer.should_save
def should_save(self, step):
  if step == 8:
    os.kill(os.getpid(), signal.SIGKILL)
  return orig(self, step)
checkpoint.Checkpointer.should_save = should_save
config = load_config()
config.sft.update(steps=12)
config.stages = "sft"
config.checkpoint.update(every=3)
main.run(config, {workdir!r})
"""


def test_kill_and_resume_equals_uninterrupted(tmp_path, tiny_config, capfd):
  tiny_config.sft.update(steps=12)
  tiny_config.checkpoint.update(every=3)
  tiny_config.eval.update(num_examples=0)
  straight = sft.train(experiment.prepare(tiny_config, str(tmp_path / "a")))

  workdir = str(tmp_path / "b")
  code = _KILL_AT_STEP_8.format(tests=os.path.join(ROOT, "tests"), workdir=workdir)
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == -signal.SIGKILL, r.stderr[-3000:]
  killed_at = checkpoint.Checkpointer(f"{workdir}/sft/checkpoints", 3).latest_step()
  assert killed_at is not None and killed_at < 12

  resumed = sft.train(experiment.prepare(tiny_config, workdir))
  assert int(resumed.step) == int(straight.step) == 12
  for a, b in zip(jax.tree.leaves(straight), jax.tree.leaves(resumed)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  # A damaged latest checkpoint (a data file cut in half) is reported with its path, moved aside,
  # and the run falls back to the one before and trains the last steps again, to the same result.
  ckpt_dir = f"{workdir}/sft/checkpoints"
  assert checkpoint.Checkpointer(ckpt_dir, 3).all_steps() == [9, 12]
  data = max((os.path.join(root, f) for root, _, files in os.walk(f"{ckpt_dir}/12/state")
              for f in files if os.sep + "d" + os.sep in os.path.join(root, f)),
             key=os.path.getsize)
  os.truncate(data, os.path.getsize(data) // 2)
  capfd.readouterr()
  again = sft.train(experiment.prepare(tiny_config, workdir))
  out = capfd.readouterr().out
  assert f"checkpoint {ckpt_dir}/12 is unreadable" in out and "resuming from step 9" in out
  assert any(name.startswith("12.unreadable-") for name in os.listdir(ckpt_dir))
  assert checkpoint.Checkpointer(ckpt_dir, 3).all_steps() == [9, 12]
  for a, b in zip(jax.tree.leaves(straight), jax.tree.leaves(again)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  # Resuming the same workdir under another batch size is refused, naming what changed.
  tiny_config.sft.update(batch_size=4)
  with pytest.raises(ConfigError, match=r"sft\.batch_size: 8 -> 4"):
    sft.train(experiment.prepare(tiny_config, workdir))


def test_a_diverging_run_stops_with_one_line_and_keeps_the_last_good_checkpoint(tmp_path):
  """A learning rate of 1e30 makes the loss non-finite within a few steps: the run stops naming the
  step, the metric and the last good checkpoint, and no checkpoint holds a non-finite parameter."""
  r = subprocess.run(
      [sys.executable, "-m", "rlhfjax.main", "--config", "configs/tldr_sim.py:tiny", "--workdir",
       str(tmp_path), "--config.task=sft", "--config.sft.lr=1e30", "--config.sft.steps=12",
       "--config.sft.warmup_steps=0", "--config.checkpoint.every=1", "--config.checkpoint.keep=20"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert r.returncode == 3, r.stderr[-2000:]
  line = r.stderr.strip().splitlines()[-1]
  assert re.match(r"rlhfjax: diverged: sft: step \d+: train/\w+ = .* is not finite; stopped before "
                  r"saving it\. Last good checkpoint: .*/sft/checkpoints/\d+ \(step \d+\)", line), line
  stopped = int(re.search(r"step (\d+):", line).group(1))
  ckpt = checkpoint.Checkpointer(f"{tmp_path}/sft/checkpoints", 1)
  assert ckpt.latest_step() == stopped - 1
  for step in ckpt.all_steps():
    saved = ocp.PyTreeCheckpointer().restore(os.path.join(ckpt.path(step), "state"))
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(saved)), step
  ckpt.close()
