"""The launchers' dry runs: the commands they would run for the local, TPU pod and SLURM cases."""

import importlib.util
import os
import shlex
import sys

import pytest

from conftest import ROOT

MAIN_ARGS = ["--config", "configs/tldr_sim.py", "--config.mesh.fsdp=-1", "--config.mesh.data=1"]


def _load(name):
  if os.path.join(ROOT, "launch") not in sys.path:  # Launchers import launch/cli.py beside them.
    sys.path.insert(0, os.path.join(ROOT, "launch"))
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "launch", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _lines(capsys):
  return [shlex.split(l) for l in capsys.readouterr().out.strip().splitlines() if l.strip()]


def test_local_launcher_gives_each_process_its_id_and_one_coordinator(capsys):
  local = _load("multiprocess")
  assert local.main(["--processes", "3", "--devices_per_process", "2", "--port", "4321",
                     "--dry_run", "--", *MAIN_ARGS]) == 0
  lines = _lines(capsys)
  assert lines[-1] == ["wait"]
  procs = lines[:-1]
  assert len(procs) == 3
  for i, cmd in enumerate(procs):
    assert cmd[0] == "XLA_FLAGS=--xla_force_host_platform_device_count=2"
    assert cmd[2:4] == ["-m", "rlhfjax.main"] and cmd[4:4 + len(MAIN_ARGS)] == MAIN_ARGS
    assert "--config.distributed.mode=explicit" in cmd
    assert "--config.distributed.coordinator_address=127.0.0.1:4321" in cmd
    assert "--config.distributed.num_processes=3" in cmd
    assert f"--config.distributed.process_id={i}" in cmd
  env = local.environment(4, {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --foo"})
  assert env["XLA_FLAGS"] == "--foo --xla_force_host_platform_device_count=4"


def test_tpu_pod_all_steps(capsys):
  tpu = _load("tpu_pod")
  assert tpu.main(["all", "--name", "rl", "--zone", "us-central2-b", "--accelerator", "v4-32",
                   "--bucket", "bk", "--workers", "4", "--spot", "--dry_run", "--no_fit_check", "--",
                   *MAIN_ARGS]) == 0
  lines = _lines(capsys)
  create, archive, ship, install, run, *logs, delete = lines
  assert create[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "rl"]
  assert {"--zone=us-central2-b", "--accelerator-type=v4-32", "--version=tpu-ubuntu2204-base",
          "--spot"} <= set(create)
  assert archive[:2] == ["git", "-C"] and "HEAD" in archive
  assert ship[4] == "scp" and "--worker=all" in ship
  assert "--worker=all" in install and "gcsfuse --implicit-dirs bk /mnt/bk" in install[-1]
  assert "jax[tpu]" in install[-1]
  assert "--worker=all" in run
  command = run[-1].split("=", 1)[1]
  assert "python3 -m rlhfjax.main " + shlex.join(MAIN_ARGS) + " --workdir=/mnt/bk/rl" in command
  assert "PIPESTATUS" in command  # The run's own exit status, not tee's.
  assert [l[-1] for l in logs] == [f"--worker={w}" for w in range(4)]
  assert delete[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "delete", "rl"]


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs '.[tpu]'")
def test_tpu_pod_refuses_a_job_that_does_not_fit_before_creating_anything(capsys):
  tpu = _load("tpu_pod")
  with pytest.raises(SystemExit, match=r"refused: the job does not fit v5litepod-1 .*sft needs"):
    tpu.main(["all", "--name", "big", "--zone", "z", "--accelerator", "v5litepod-1", "--bucket",
              "bk", "--dry_run", "--fit_steps", "sft", "--", "--config", "configs/llama3_8b_tldr.py"])
  assert "gcloud" not in capsys.readouterr().out  # Nothing was (or would have been) created.


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs '.[tpu]'")
def test_tpu_pod_passes_the_mesh_auto_chose_to_the_job(capsys):
  tpu = _load("tpu_pod")
  assert tpu.main(["run", "--name", "ok", "--zone", "z", "--accelerator", "v5litepod-4",
                   "--bucket", "bk", "--dry_run", "--fit_steps", "sft", "--", "--config",
                   "configs/tldr_sim.py:tiny", "--config.mesh.auto=True"]) == 0
  run = [line for line in capsys.readouterr().out.splitlines() if line.startswith("gcloud")][-1]
  assert "--config.mesh.auto=False" in run and "--config.mesh.fsdp=" in run


def test_tpu_pod_queued_resources_and_generation_runtimes(capsys):
  tpu = _load("tpu_pod")
  tpu.main(["create", "--name", "q", "--zone", "z", "--accelerator", "v5litepod-16", "--queued",
            "--dry_run"])
  tpu.main(["delete", "--name", "q", "--zone", "z", "--queued", "--dry_run"])
  create, describe, delete = _lines(capsys)
  assert create[3:6] == ["queued-resources", "create", "q"]
  assert "--node-id=q" in create and "--runtime-version=v2-alpha-tpuv5-lite" in create
  assert describe[4] == "describe"
  assert delete[3:5] == ["queued-resources", "delete"] and "--force" in delete
  with pytest.raises(SystemExit, match="--bucket"):
    tpu.main(["run", "--name", "q", "--zone", "z", "--dry_run", "--no_fit_check", "--", *MAIN_ARGS])


def test_slurm_script_runs_one_process_per_node_and_requeues_on_preemption(capsys):
  slurm = _load("slurm")
  assert slurm.main(["--nodes", "4", "--gpus_per_node", "8", "--partition", "gpu",
                     "--workdir", "/shared/run", "--venv", "/shared/venv", "--dry_run", "--",
                     *MAIN_ARGS]) == 0
  out = capsys.readouterr().out
  for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
               "#SBATCH --partition=gpu", "#SBATCH --requeue", "source /shared/venv/bin/activate",
               'if [ "$status" -eq 75 ]; then scontrol requeue "$SLURM_JOB_ID"; fi'):
    assert line in out.splitlines(), line
  assert "#SBATCH --signal=TERM@180" in out
  srun = next(l for l in out.splitlines() if l.startswith("srun"))
  assert srun.endswith("python -m rlhfjax.main " + shlex.join(MAIN_ARGS) + " --workdir=/shared/run")
  assert out.strip().splitlines()[-1] == "sbatch logs/rlhfjax.sbatch"
