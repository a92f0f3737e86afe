"""Sharding rules, sharded steps equal to one device, fsdp memory, memory planning against XLA,
two processes on jax.distributed equal to one (and, killed by SIGKILL and relaunched, to their
uninterrupted run), SIGTERM checkpoint-and-resume."""

import json
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
from jax.sharding import PartitionSpec as P

import chaos  # tests/chaos.py
from conftest import ROOT
from rlhfjax.errors import ConfigError
from rlhfjax.models import sharding_rules
from rlhfjax.parallel import distributed, preemption
from rlhfjax.parallel.mesh import mesh_shape
from rlhfjax.training import checkpoint, loop, metrics
from rlhfjax.training.state import TrainState

ALGORITHMS = ("sft", "rm", "ppo", "dpo", "simpo", "kto", "rloo", "grpo", "dapo_gspo",
              "reinforce_pp", "online_dpo")
MESHES = {"2x2x2": ALGORITHMS, "8x1x1": ("sft", "ppo"), "1x8x1": ("sft",)}  # As parallel_steps.py.


def test_mesh_shape_resolves_minus_one_and_rejects_bad_shapes():
  assert mesh_shape({"data": -1, "fsdp": 2, "tensor": 2}, 8) == (2, 2, 2)
  assert mesh_shape({"data": 1, "fsdp": -1, "tensor": 1}, 8) == (1, 8, 1)
  assert mesh_shape({"data": 2, "fsdp": 1, "tensor": 1}, 8) == (2, 1, 1)  # A subset of devices.
  for bad in ({"data": -1, "fsdp": -1, "tensor": 1}, {"data": -1, "fsdp": 3, "tensor": 1},
              {"data": 16, "fsdp": 1, "tensor": 1}, {"data": 0, "fsdp": 1, "tensor": 1}):
    with pytest.raises(ConfigError, match="mesh"):
      mesh_shape(bad, 8)


def test_rules_shard_what_divides_and_replicate_the_rest():
  class FakeMesh:  # sharding_rules.spec only reads the axis sizes.
    shape = {"data": 2, "fsdp": 4, "tensor": 2}
  mesh = FakeMesh()
  spec = sharding_rules.spec
  assert spec(("vocab", "embed"), (64, 32), mesh) == P("tensor", "fsdp")
  assert spec(("embed", "heads", "head_dim"), (32, 3, 8), mesh) == P("fsdp", None, None)
  assert spec(("batch", "length"), (8, 5), mesh) == P(("data", "fsdp"), None)
  assert spec(("batch",), (6,), mesh) == P(None)  # 6 rows do not split 8 ways.
  assert spec(("layers", "embed", "mlp"), (2, 30, 64), mesh) == P(None, None, "tensor")
  assert spec((), (), mesh) == P()


def test_distributed_config_errors_and_single_process_default():
  base = dict(mode="auto", coordinator_address="", num_processes=1, process_id=0,
              initialization_timeout=10)
  assert distributed.initialize(base) is False  # No cluster in the environment: one process.
  with pytest.raises(ConfigError, match="distributed.mode"):
    distributed.initialize({**base, "mode": "mpi"})
  with pytest.raises(ConfigError, match="coordinator_address"):
    distributed.initialize({**base, "mode": "explicit"})
  with pytest.raises(ConfigError, match="process_id"):
    distributed.initialize({**base, "mode": "explicit", "coordinator_address": "127.0.0.1:1",
                            "num_processes": 2, "process_id": 2})


def test_cluster_detection_from_the_environment(monkeypatch):
  for var in ("SLURM_NTASKS", "SLURM_STEP_ID", "JAX_COORDINATOR_ADDRESS", "TPU_WORKER_HOSTNAMES",
              "MEGASCALE_COORDINATOR_ADDRESS"):
    monkeypatch.delenv(var, raising=False)
  assert distributed._cluster_env() is None  # pylint: disable=protected-access
  monkeypatch.setenv("SLURM_NTASKS", "1")
  monkeypatch.setenv("SLURM_STEP_ID", "0")
  assert distributed._cluster_env() is None  # One task: one process.  # pylint: disable=protected-access
  monkeypatch.setenv("SLURM_NTASKS", "4")
  assert distributed._cluster_env() == "slurm"  # pylint: disable=protected-access
  monkeypatch.delenv("SLURM_NTASKS")
  monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "w0,w1,w2,w3")
  assert distributed._cluster_env() == "tpu"  # pylint: disable=protected-access


def test_loop_checkpoints_and_stops_on_preemption_then_resumes(tmp_path):
  import optax
  tx = optax.sgd(0.1)
  state = TrainState.create({"w": jax.numpy.ones(3)}, tx)
  step = lambda s, i: (s.apply_gradients({"w": jax.numpy.full(3, float(i))}, tx), {"i": i})
  ckpt = checkpoint.Checkpointer(str(tmp_path / "ckpt"), every=100)
  writer = metrics.MetricWriter(str(tmp_path), "m")

  def periodic(s, done, m):
    if done == 3:
      preemption.request()  # What SIGTERM's handler does, mid-run.
    return {}
  try:
    with pytest.raises(preemption.Preempted, match="saved step 3"):
      loop.run(state, 10, step, periodic, ckpt, writer, 1, "t")
  finally:
    preemption.clear()
  assert ckpt.latest_step() == 3
  resumed = loop.run(loop.restore_if_any(ckpt, state), 10, step, lambda *a: {}, ckpt, writer, 1, "t")
  straight = state
  for i in range(10):
    straight, _ = step(straight, i)
  np.testing.assert_allclose(resumed.params["w"], straight.params["w"])
  ckpt.close()
  writer.close()


# --- Sharded steps on 8 forced CPU devices (one subprocess runs them all) -------------------------


@pytest.fixture(scope="module")
def mesh_runs(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("meshes"))
  subprocess.run([sys.executable, os.path.join(ROOT, "tests", "parallel_steps.py"), out],
                 check=True, cwd=ROOT, timeout=900, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  return out


@pytest.mark.parametrize("mesh", MESHES)
def test_sharded_steps_match_one_device(mesh_runs, mesh):
  base = np.load(os.path.join(mesh_runs, "1x1x1.npz"))
  other = np.load(os.path.join(mesh_runs, f"{mesh}.npz"))
  assert sorted(k for k in other.files if k.startswith("loss/")) == \
      sorted(f"loss/{a}" for a in MESHES[mesh])
  for algo in MESHES[mesh]:
    losses = base[f"loss/{algo}"]
    # Moved by far more than the tolerance below (online DPO's 3 small steps move it least).
    assert np.abs(np.diff(losses)).max() > 1e-4, f"{algo} did not train"
    np.testing.assert_allclose(other[f"loss/{algo}"], losses, rtol=1e-5, atol=1e-6, err_msg=algo)
    names = [k for k in base.files if k.startswith(f"params/{algo}/")]
    assert names
    for k in names:
      np.testing.assert_allclose(other[k], base[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_rollout_layouts_sample_what_one_device_samples(mesh_runs):
  """The policy copied out of each training mesh into its rollout layouts (replicas; tensor
  parallel) samples the same tokens as on one device; log-probs agree to float rounding."""
  base = np.load(os.path.join(mesh_runs, "1x1x1.npz"))
  tokens = base["rollout/auto/tokens"]
  for mesh, layouts in {"2x2x2": ("auto", "data=-1,tensor=2"), "1x8x1": ("auto",)}.items():
    other = np.load(os.path.join(mesh_runs, f"{mesh}.npz"))
    for spec in layouts:
      np.testing.assert_array_equal(other[f"rollout/{spec}/tokens"], tokens, err_msg=spec)
      np.testing.assert_array_equal(other[f"rollout/{spec}/lengths"],
                                    base["rollout/auto/lengths"], err_msg=spec)
      np.testing.assert_allclose(other[f"rollout/{spec}/logprobs"], base["rollout/auto/logprobs"],
                                 atol=1e-5, err_msg=spec)


def test_fsdp_splits_parameters_and_optimizer_state(mesh_runs):
  with open(os.path.join(mesh_runs, "bytes.json"), encoding="utf-8") as f:
    report = json.load(f)
  one, fsdp = report["1x1x1"], report["1x8x1"]
  total = one["params_total"]
  assert one["sft_params"] == total == one["sft_params_total"]
  assert total / 8 <= fsdp["sft_params"] <= 1.15 * total / 8  # Only small vectors stay whole.
  assert one["sft_opt_state"] >= 2 * total
  assert fsdp["sft_opt_state"] <= 1.15 * one["sft_opt_state"] / 8
  assert report["8x1x1"]["sft_params"] == total  # Pure data parallelism replicates.


def test_memory_plan_agrees_with_xla(mesh_runs):
  with open(os.path.join(mesh_runs, "bytes.json"), encoding="utf-8") as f:
    report = json.load(f)
  for mesh, r in report.items():
    assert abs(r["plan_params"] - r["xla_params"]) <= 0.1 * r["xla_params"], mesh
    assert r["plan_params"] == r["sft_params"], mesh  # The plan is what the shardings place.


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
