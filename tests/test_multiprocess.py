"""Two processes on jax.distributed equal to one (and, killed by SIGKILL and relaunched, to their
uninterrupted run), and SIGTERM's checkpoint-and-resume: whole runs in processes of their own."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import chaos  # tests/chaos.py
from conftest import ROOT
from rlhfjax.parallel import preemption
from rlhfjax.training import checkpoint


# --- Two processes on jax.distributed against one --------------------------------------------------


def _run(cmd, env, timeout=600):
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return proc


# Adam's eps above float32 rounding, so the one- and two-process runs' last-bit differences stay
# last-bit.
MULTIPROCESS_ARGS = ["--config", "configs/tldr_sim.py:tiny", "--config.task=pipeline",
                     "--config.rm.eps=1e-4", "--config.ppo.eps=1e-4"]


def _two_processes(*args: str) -> list[str]:
  """launch/multiprocess.py's command for `args` as 2 processes x 2 CPU devices."""
  return [sys.executable, "launch/multiprocess.py", "--processes", "2", "--devices_per_process",
          "2", "--timeout", "500", "--", *args]


@pytest.fixture(scope="module")
def one_and_two_processes(tiny_pipeline, tmp_path_factory):
  """RM then PPO from the tiny pipeline's SFT and labels: one process with 4 devices (A), and
  launch/multiprocess.py with 2 processes x 2 devices (B)."""
  _, source = tiny_pipeline
  root = tmp_path_factory.mktemp("multiprocess")
  dirs = {}
  for name in ("A", "B"):
    dirs[name] = str(root / name)
    shutil.copytree(source, dirs[name], ignore=shutil.ignore_patterns("rm", "ppo", "eval",
                                                                        "best_of_n"))
  args = [*MULTIPROCESS_ARGS, "--config.stages=rm,ppo"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  one = {**env, "XLA_FLAGS": " ".join([env.get("XLA_FLAGS", ""),
                                       "--xla_force_host_platform_device_count=4"]).strip()}
  _run([sys.executable, "-m", "rlhfjax.main", *args, "--workdir", dirs["A"]], one)
  two = _run(_two_processes(*args, "--workdir", dirs["B"]), env)
  return dirs, two.stdout


def _max_diff(a, b) -> float:
  return max(jax.tree.leaves(jax.tree.map(
      lambda x, y: float(np.max(np.abs(np.asarray(x) - np.asarray(y)))), a, b)))


def test_two_processes_match_one_and_their_checkpoints_restore_in_one(one_and_two_processes,
                                                                      tiny_config):
  from rlhfjax.algorithms import ppo
  from rlhfjax.training import experiment
  from rlhfjax.training import loaders
  dirs, log = one_and_two_processes
  assert "[1] " in log and "[0] " in log  # Both processes ran (only process 0 prints reports).
  exps = {k: experiment.prepare(tiny_config, d) for k, d in dirs.items()}
  # This process (one device) restores what two processes wrote collectively.
  rms = {k: loaders.load_reward_model(e)[0] for k, e in exps.items()}
  policies = {k: ppo.load_policy(e) for k, e in exps.items()}
  assert _max_diff(rms["A"], rms["B"]) < 1e-5
  assert _max_diff(policies["A"], policies["B"]) < 1e-5
  assert _max_diff(loaders.load_policy(exps["A"]), policies["A"]) > 1e-4  # PPO moved the policy.


def test_two_processes_killed_mid_run_resume_to_the_uninterrupted_run(one_and_two_processes,
                                                                       tmp_path):
  """Both processes of a two-process PPO run (and their launcher) killed by SIGKILL once its first
  checkpoint is written, the same command relaunched: it resumes, and ends with the uninterrupted
  two-process run's (B's) outputs, metrics and last checkpoint, bit for bit."""
  dirs, _ = one_and_two_processes
  workdir = str(tmp_path / "C")
  chaos.copy_needs(dirs["B"], workdir, "ppo")  # B's SFT, labels and reward model.
  # A checkpoint after every step (B saved only its last, step 4): the kill lands mid-run.
  cmd = _two_processes(*MULTIPROCESS_ARGS, "--config.stages=ppo", "--config.checkpoint.every=1",
                       "--workdir", workdir)
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  saved = chaos.kill_after_checkpoint(cmd, workdir, "ppo", env=env)
  assert saved is not None and saved < 4, saved
  rerun = _run(cmd, env)
  resumed = re.search(r"resuming from step (\d+)", rerun.stdout)
  assert resumed and saved <= int(resumed.group(1)) < 4, rerun.stdout[-3000:]
  assert chaos.differences(dirs["B"], workdir, only=("ppo",)) == []


# --- SIGTERM -------------------------------------------------------------------------------------


def test_sigterm_saves_a_checkpoint_and_the_rerun_resumes(tmp_path):
  workdir = str(tmp_path / "w")
  cmd = [sys.executable, "-m", "rlhfjax.main", "--config", "configs/tldr_sim.py:tiny",
         "--config.task=sft", "--config.sft.steps=120", "--config.checkpoint.every=1000",
         "--config.eval.num_examples=0", "--workdir", workdir]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
  log = os.path.join(workdir, "sft", "metrics.jsonl")
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None:
    if os.path.exists(log) and sum(1 for _ in open(log, encoding="utf-8")) >= 2:
      break
    time.sleep(0.2)
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=120)
  assert proc.returncode == preemption.EXIT_CODE, out[-2000:]
  assert "preempted: saved step" in out
  saved = checkpoint.latest_step(os.path.join(workdir, "sft", "checkpoints"))
  assert saved is not None and 2 <= saved < 120
  rerun = _run(cmd, env)
  assert f"resuming from step {saved}" in rerun.stdout + rerun.stderr
  assert checkpoint.latest_step(os.path.join(workdir, "sft", "checkpoints")) == 120
