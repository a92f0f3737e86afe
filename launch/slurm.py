"""GPU clusters under SLURM: writes a batch script that runs one rlhfjax process per node with
`srun`, and submits it.

  python launch/slurm.py --nodes 2 --gpus_per_node 8 --partition gpu --time 24:00:00 \\
      --workdir /shared/runs/tldr -- --config configs/tldr_sim.py --config.mesh.fsdp=8

Each process sees its node's GPUs; JAX reads the coordinator, process count and process id from
SLURM's variables itself (`config.distributed.mode='auto'`), so the mesh spans all nodes. The
workdir must be on a filesystem every node sees. Near the time limit SLURM sends SIGTERM
(`--signal=TERM@<grace>`): the run checkpoints and exits 75, and the script requeues the job, which
resumes. `--dry_run` prints the script and the sbatch command instead of submitting.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys

import cli  # launch/cli.py, beside this script.

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def script(ns: argparse.Namespace, args: list[str]) -> str:
  """The sbatch script."""
  sbatch = [f"--job-name={ns.job_name}", f"--nodes={ns.nodes}", "--ntasks-per-node=1",
            f"--gpus-per-node={ns.gpus_per_node}", f"--cpus-per-task={ns.cpus_per_task}",
            f"--time={ns.time}", f"--signal=TERM@{ns.grace}", "--requeue",
            f"--output={ns.logs}/%x-%j.out"]
  if ns.partition:
    sbatch.append(f"--partition={ns.partition}")
  if ns.account:
    sbatch.append(f"--account={ns.account}")
  main = ["python", "-m", "rlhfjax.main", *args, f"--workdir={ns.workdir}"]
  lines = ["#!/bin/bash", *(f"#SBATCH {o}" for o in sbatch), "",
           "# One process per node; JAX's distributed runtime reads SLURM_* to find its peers.",
           "set -uo pipefail", f"cd {shlex.quote(ns.repo)}"]
  if ns.venv:
    lines.append(f"source {shlex.quote(ns.venv)}/bin/activate")
  lines += ["export XLA_PYTHON_CLIENT_MEM_FRACTION=0.9", "",
            f"srun --kill-on-bad-exit=1 {shlex.join(main)}", "status=$?",
            "# 75: preempted or out of time after a checkpoint; requeue and the rerun resumes.",
            'if [ "$status" -eq 75 ]; then scontrol requeue "$SLURM_JOB_ID"; fi',
            'exit "$status"', ""]
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--nodes", type=int, default=1)
  parser.add_argument("--gpus_per_node", type=int, default=8)
  parser.add_argument("--cpus_per_task", type=int, default=16)
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
