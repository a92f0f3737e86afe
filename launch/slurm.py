"""GPU clusters under SLURM: writes a batch script that runs rlhfjax with `srun`, one process per
GPU (or per node), and submits it.

  python launch/slurm.py --nodes 2 --gpus_per_node 8 --partition gpu --time 24:00:00 \\
      --workdir /shared/runs/tldr -- --config configs/tldr_sim.py --config.mesh.fsdp=8

JAX reads the coordinator, process count and process id from SLURM's variables itself
(`config.distributed.mode='auto'`), so the mesh spans every GPU of every node. The script exports
GPU memory preallocation before Python starts and passes the `runtime` settings (matmul precision,
deterministic GPU ops) to rlhfjax.main as config overrides, so the script shows everything the job
runs with. The workdir must be on a filesystem every node sees. Near the time limit SLURM sends
SIGTERM (`--signal=TERM@<grace>`): the run checkpoints and exits 75, and the script requeues the
job, which resumes. `--dry_run` prints the script and the sbatch command instead of submitting.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys

import cli  # launch/cli.py, beside this script.

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What rlhfjax/runtime.py accepts for runtime.matmul_precision (a test keeps the two equal; the
# launcher does not import rlhfjax, which imports JAX).
PRECISIONS = ("auto", "default", "high", "highest", "bfloat16", "tensorfloat32", "float32")
CPUS_PER_TASK = {"gpu": 8, "node": 16}


def tasks_per_node(ns: argparse.Namespace) -> int:
  """Processes per node: one per GPU, or one."""
  return ns.gpus_per_node if ns.process_per == "gpu" else 1


def sbatch_options(ns: argparse.Namespace) -> list[str]:
  """The #SBATCH options: the allocation, the SIGTERM warning, requeueing, the log file."""
  out = [f"--job-name={ns.job_name}", f"--nodes={ns.nodes}",
         f"--ntasks-per-node={tasks_per_node(ns)}", f"--gpus-per-node={ns.gpus_per_node}",
         f"--cpus-per-task={ns.cpus_per_task}", f"--time={ns.time}", f"--signal=TERM@{ns.grace}",
         "--requeue", f"--output={ns.logs}/%x-%j.out"]
  if ns.partition:
    out.append(f"--partition={ns.partition}")
  if ns.account:
    out.append(f"--account={ns.account}")
  return out


def environment(ns: argparse.Namespace) -> list[str]:
  """Shell lines setting what JAX reads when its GPU backend and distributed runtime start."""
  if ns.no_preallocate:
    lines = ["# GPU memory: allocated as needed (JAX's docs: more prone to fragmentation).",
             "export XLA_PYTHON_CLIENT_PREALLOCATE=false"]
  else:
    # The old name is the one every supported jaxlib reads; newer ones refuse it beside the new.
    lines = [f"# GPU memory: preallocate {ns.mem_fraction:g} of each GPU (JAX's default: 0.75).",
             "unset XLA_CLIENT_MEM_FRACTION",
             f"export XLA_PYTHON_CLIENT_MEM_FRACTION={ns.mem_fraction:g}"]
  if ns.process_per == "node":
    # JAX's SLURM detection gives each process the one GPU numbered SLURM_LOCALID (0 here);
    # jax.distributed.initialize takes JAX_LOCAL_DEVICE_IDS instead, so the process uses them all.
    ids = ",".join(str(i) for i in range(ns.gpus_per_node))
    lines.append(f"export JAX_LOCAL_DEVICE_IDS={ids}")
  return lines


def runtime_overrides(ns: argparse.Namespace) -> list[str]:
  """The launcher flags that override the config's `runtime` block (applied by rlhfjax.main before
  its backend starts); without them the config's own settings hold."""
  out = []
  if ns.matmul_precision:
    out.append(f"--config.runtime.matmul_precision={ns.matmul_precision}")
  if ns.nondeterministic:
    out.append("--config.runtime.deterministic=false")
  return out


def srun(ns: argparse.Namespace, args: list[str]) -> list[str]:
  """The job step: every task runs the same rlhfjax.main command."""
  main = ["python", "-m", "rlhfjax.main", *args, *runtime_overrides(ns), f"--workdir={ns.workdir}"]
  # --cpus-per-task again: srun does not take it from sbatch in some SLURM versions (22.05).
  # --gpu-bind=none: every task sees all its node's GPUs, the numbering that JAX's choice of GPU
  # SLURM_LOCALID (and JAX_LOCAL_DEVICE_IDS) refers to; a task bound to one GPU sees it as GPU 0.
  return ["srun", "--kill-on-bad-exit=1", f"--cpus-per-task={ns.cpus_per_task}",
          "--gpu-bind=none", *main]


def script(ns: argparse.Namespace, args: list[str]) -> str:
  """The sbatch script."""
  if ns.process_per == "gpu":
    layout = ["# One process per GPU on jax.distributed: JAX reads SLURM_NTASKS, SLURM_PROCID,",
              "# SLURM_STEP_NODELIST (coordinator: its first host) and SLURM_LOCALID (the GPU)."]
  else:
    layout = ["# One process per node on jax.distributed: JAX reads SLURM_NTASKS, SLURM_PROCID and",
              "# SLURM_STEP_NODELIST (coordinator: its first host); each process uses all GPUs."]
  lines = ["#!/bin/bash", *(f"#SBATCH {o}" for o in sbatch_options(ns)), "", *layout,
           "set -uo pipefail", f"cd {shlex.quote(ns.repo)}"]
  if ns.venv:
    lines.append(f"source {shlex.quote(ns.venv)}/bin/activate")
  lines += [*environment(ns), "", shlex.join(srun(ns, args)), "status=$?",
            "# 75: preempted or out of time after a checkpoint; requeue and the rerun resumes.",
            'if [ "$status" -eq 75 ]; then scontrol requeue "$SLURM_JOB_ID"; fi',
            'exit "$status"', ""]
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--nodes", type=int, default=1)
  parser.add_argument("--gpus_per_node", type=int, default=8)
  parser.add_argument("--process_per", choices=("gpu", "node"), default="gpu",
                      help="one process per GPU (JAX's layout on GPU clusters) or per node")
  parser.add_argument("--cpus_per_task", type=int, default=0,
                      help=f"CPUs per process (default: {CPUS_PER_TASK['gpu']} per GPU process, "
                           f"{CPUS_PER_TASK['node']} per node process)")
  parser.add_argument("--mem_fraction", type=float, default=0.9,
                      help="share of each GPU's memory JAX preallocates")
  parser.add_argument("--no_preallocate", action="store_true",
                      help="allocate GPU memory as needed instead of preallocating")
  parser.add_argument("--matmul_precision", choices=PRECISIONS, default=None,
                      help="overrides the config's runtime.matmul_precision (its default, auto: "
                           "highest for float32 models, JAX's default for bfloat16 ones)")
  parser.add_argument("--nondeterministic", action="store_true",
                      help="overrides the config's runtime.deterministic with false: XLA may "
                           "pick non-deterministic (faster) GPU kernels; a resumed run then "
                           "differs from an uninterrupted one")
  parser.add_argument("--time", default="24:00:00")
  parser.add_argument("--grace", type=int, default=180, help="seconds of SIGTERM warning")
  parser.add_argument("--partition", default="")
  parser.add_argument("--account", default="")
  parser.add_argument("--job_name", default="rlhfjax")
  parser.add_argument("--workdir", required=True, help="on a filesystem every node sees")
  parser.add_argument("--repo", default=ROOT, help="this checkout, as the nodes see it")
  parser.add_argument("--venv", default="", help="virtual environment to activate on each node")
  parser.add_argument("--logs", default="logs")
  parser.add_argument("--script", default="", help="where to write the script "
                      "(default: <logs>/<job_name>.sbatch)")
  parser.add_argument("--dry_run", action="store_true", help="print, do not submit")
  ns, args = cli.parse(parser, argv)
  if not 0 < ns.mem_fraction <= 1:
    parser.error(f"--mem_fraction must be in (0, 1], got {ns.mem_fraction}")
  if any(a.startswith("--config.runtime") for a in args):
    parser.error("the runtime settings are this launcher's --matmul_precision and "
                 "--nondeterministic; do not also pass --config.runtime after --")
  ns.cpus_per_task = ns.cpus_per_task or CPUS_PER_TASK[ns.process_per]
  text = script(ns, args)
  path = ns.script or os.path.join(ns.logs, f"{ns.job_name}.sbatch")
  if ns.dry_run:
    print(text)
    print(f"sbatch {shlex.quote(path)}")
    return 0
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  os.makedirs(ns.logs, exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
  return subprocess.call(["sbatch", path])


if __name__ == "__main__":
  sys.exit(main())
