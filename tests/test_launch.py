"""The launchers' dry runs: the commands they would run for the local, TPU pod and SLURM cases."""

import importlib.util
import os
import shlex
import socket
import subprocess
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


def test_local_launcher_gives_each_process_its_id_and_one_coordinator(capsys, monkeypatch):
  monkeypatch.delenv("XLA_FLAGS", raising=False)  # The printed flags are the launcher's own.
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
  """The fit check's task=compile picks the mesh; the job runs on it. One candidate compiled (the
  planner's first; test_compile ranks and compiles several): each is a TPU compile, 10 s here."""
  tpu = _load("tpu_pod")
  assert tpu.main(["run", "--name", "ok", "--zone", "z", "--accelerator", "v5litepod-4",
                   "--bucket", "bk", "--dry_run", "--fit_steps", "sft", "--", "--config",
                   "configs/tldr_sim.py:tiny", "--config.mesh.auto=True",
                   "--config.compile.auto_candidates=1"]) == 0
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


def _slurm(capsys, *flags, args=MAIN_ARGS):
  """(script lines, the sbatch command) of a dry run."""
  assert _load("slurm").main([*flags, "--workdir", "/shared/run", "--dry_run", "--", *args]) == 0
  script, sbatch = capsys.readouterr().out.rstrip("\n").rsplit("\n", 1)
  return script.splitlines(), sbatch


def _sbatch(lines):
  """The #SBATCH options: name -> value ('' for a switch)."""
  return dict(l[len("#SBATCH --"):].partition("=")[::2] for l in lines
              if l.startswith("#SBATCH --"))


def _exports(lines):
  return dict(l[len("export "):].split("=", 1) for l in lines if l.startswith("export "))


def _srun(lines):
  """(srun's options, the command every task runs)."""
  srun = shlex.split(next(l for l in lines if l.startswith("srun ")))
  cut = srun.index("python")
  return srun[1:cut], srun[cut:]


def test_slurm_script_runs_one_process_per_gpu_and_requeues_on_preemption(capsys):
  lines, sbatch = _slurm(capsys, "--nodes", "2", "--gpus_per_node", "8", "--venv", "/shared/venv")
  opts = _sbatch(lines)
  assert {k: opts[k] for k in ("nodes", "ntasks-per-node", "gpus-per-node", "cpus-per-task",
                               "signal")} == {"nodes": "2", "ntasks-per-node": "8",
                                              "gpus-per-node": "8", "cpus-per-task": "8",
                                              "signal": "TERM@180"}
  assert opts["requeue"] == "" and "partition" not in opts
  assert _exports(lines) == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}  # JAX picks SLURM_LOCALID.
  assert "unset XLA_CLIENT_MEM_FRACTION" in lines  # jaxlib refuses both names together.
  srun_opts, command = _srun(lines)
  assert set(srun_opts) == {"--kill-on-bad-exit=1", "--cpus-per-task=8", "--gpu-bind=none"}
  # No runtime flag: the config's own runtime block holds.
  assert command == ["python", "-m", "rlhfjax.main", *MAIN_ARGS, "--workdir=/shared/run"]
  srun_at = next(i for i, l in enumerate(lines) if l.startswith("srun "))
  assert lines.index("source /shared/venv/bin/activate") < srun_at
  assert max(i for i, l in enumerate(lines) if l.startswith(("export", "unset"))) < srun_at
  status, comment, *tail = lines[srun_at + 1:]
  assert status == "status=$?" and comment.startswith("# 75")
  assert tail == ['if [ "$status" -eq 75 ]; then scontrol requeue "$SLURM_JOB_ID"; fi',
                  'exit "$status"']
  assert sbatch == "sbatch logs/rlhfjax.sbatch"


def test_slurm_script_one_process_per_node_uses_all_its_gpus(capsys):
  lines, _ = _slurm(capsys, "--nodes", "4", "--gpus_per_node", "4", "--process_per", "node",
                    "--partition", "gpu", "--account", "lab", "--no_preallocate",
                    "--nondeterministic", "--matmul_precision", "highest")
  opts = _sbatch(lines)
  assert (opts["ntasks-per-node"], opts["gpus-per-node"], opts["cpus-per-task"]) == ("1", "4", "16")
  assert (opts["partition"], opts["account"]) == ("gpu", "lab")
  # JAX's SLURM detection would give the one process of a node only GPU SLURM_LOCALID = 0.
  assert _exports(lines) == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                             "JAX_LOCAL_DEVICE_IDS": "0,1,2,3"}
  srun_opts, command = _srun(lines)
  assert "--cpus-per-task=16" in srun_opts and "--gpu-bind=none" in srun_opts
  assert command[-3:] == ["--config.runtime.matmul_precision=highest",
                          "--config.runtime.deterministic=false", "--workdir=/shared/run"]


def test_slurm_refuses_runtime_settings_twice_and_a_bad_memory_fraction(capsys):
  with pytest.raises(SystemExit):
    _slurm(capsys, args=[*MAIN_ARGS, "--config.runtime.deterministic=false"])
  assert "--nondeterministic" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    _slurm(capsys, "--mem_fraction", "1.5")
  assert "--mem_fraction" in capsys.readouterr().err


def test_slurm_precisions_are_the_runtime_ones():
  from rlhfjax import runtime  # pylint: disable=g-import-not-at-top
  assert _load("slurm").PRECISIONS == runtime.PRECISIONS


@pytest.mark.parametrize("srun_status, requeued", [(0, False), (75, True), (1, False)])
def test_slurm_script_requeues_exactly_on_status_75(capsys, tmp_path, srun_status, requeued):
  """Runs the script under bash with stand-ins for srun and scontrol."""
  lines, _ = _slurm(capsys, "--repo", str(tmp_path))
  (tmp_path / "job.sbatch").write_text("\n".join(lines) + "\n")
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  for name, body in (("srun", f'echo "$XLA_PYTHON_CLIENT_MEM_FRACTION ${{XLA_CLIENT_MEM_FRACTION-}}'
                              f' $*" > srun.log; exit {srun_status}'),
                     ("scontrol", 'echo "$*" > scontrol.log')):
    (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
    (bin_dir / name).chmod(0o755)
  env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "42",
         "XLA_CLIENT_MEM_FRACTION": "0.5"}
  proc = subprocess.run(["bash", str(tmp_path / "job.sbatch")], env=env, cwd=tmp_path,
                        capture_output=True, text=True, timeout=30)
  assert proc.returncode == srun_status, proc.stderr
  srun = (tmp_path / "srun.log").read_text().split()  # Run in --repo, with the exported memory.
  assert srun[0] == "0.9" and srun[1] == "--kill-on-bad-exit=1" and "rlhfjax.main" in srun
  assert (tmp_path / "scontrol.log").exists() == requeued
  if requeued:
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "42"]


def _slurm_tasks(exports: dict[str, str], ntasks: int) -> list[list[str]]:
  """What rlhfjax's distributed start-up and JAX make of each task of a job step with the script's
  exports: [process index, process count, GPUs the process uses] per task (CPU, no GPU needed)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  code = ("import jax; from rlhfjax.parallel import distributed; "
          "assert distributed.initialize({'mode': 'auto', 'initialization_timeout': 60}); "
          "print(jax.process_index(), jax.process_count(), "
          "jax.config.read('jax_cuda_visible_devices'))")
  procs = []
  for i in range(ntasks):
    env = {**os.environ, **exports, "JAX_PLATFORMS": "cpu", "SLURM_JOB_ID": "42",
           "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "localhost", "SLURM_NTASKS": str(ntasks),
           "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i), "JAX_COORDINATOR_PORT": str(port)}
    procs.append(subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE))
  outs = [p.communicate(timeout=120) for p in procs]
  assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
  return [out.split() for out, _ in outs]


@pytest.mark.parametrize("process_per, gpus", [("gpu", ["0", "1"]), ("node", ["0,1,2,3"] * 2)])
def test_slurm_tasks_start_jax_distributed_on_their_gpus(capsys, process_per, gpus):
  """The script's environment in a simulated 2-task job step on one host: rlhfjax's mode='auto'
  starts jax.distributed from SLURM's variables, and each process gets the GPUs the mode says."""
  lines, _ = _slurm(capsys, "--gpus_per_node", "4", "--process_per", process_per)
  tasks = _slurm_tasks(_exports(lines), 2)
  assert tasks == [[str(i), "2", gpus[i]] for i in range(2)]
