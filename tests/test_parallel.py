"""Sharding rules, sharded steps equal to one device, fsdp memory, memory planning against XLA.
(Two processes and SIGTERM: test_multiprocess.py.)"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

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
