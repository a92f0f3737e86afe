"""TPU pod slices: create a TPU VM (or a queued resource), install, run the same rlhfjax command on
every worker, fetch the logs, delete.

  python launch/tpu_pod.py all --name rlhf-v4 --zone us-central2-b --accelerator v4-32 \\
      --bucket my-bucket -- --config configs/tldr_sim.py --config.task=pipeline

Steps: `create`, `install`, `run`, `logs`, `delete`, or `all` (each in turn; `delete` runs even when
`run` fails unless --keep). Every worker runs `python -m rlhfjax.main ...`; JAX finds the other
workers itself (`config.distributed.mode='auto'`), so no addresses are passed. The workdir must be
visible to every worker — with `--bucket` each worker mounts it with gcsfuse at /mnt/<bucket> and
the workdir defaults to /mnt/<bucket>/<name>. Spot/preemptible slices (`--spot`) are SIGTERMed
before they go: the run checkpoints and exits 75; `run` again on a new slice to resume.
`--dry_run` prints the gcloud commands instead of running them.

Before it creates or runs anything, the job is compiled for the requested slice on this machine
(`task=compile` with libtpu, no TPU: `pip install -e '.[tpu]'`): a job whose steps do not fit the
chips' memory, or do not compile for that slice, is refused with the numbers, dry run or not.
With `--config.mesh.auto=True` the mesh the check picked is passed on to the job.
`--fit_steps` narrows the check to the steps the job runs (default: all of them);
`--no_fit_check` skips it.
"""

from __future__ import annotations

import argparse
import os
import json
import shlex
import subprocess
import sys
import tempfile

import cli  # launch/cli.py, beside this script.

# Default TPU VM software for each generation (override with --version).
RUNTIMES = {"v4": "tpu-ubuntu2204-base", "v5litepod": "v2-alpha-tpuv5-lite",
            "v5p": "v2-alpha-tpuv5", "v6e": "v2-alpha-tpuv6e"}
STEPS = ("create", "install", "run", "logs", "delete")
LOG = "~/rlhfjax-run.log"
ARCHIVE = "/tmp/rlhfjax-src.tar.gz"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def runtime(accelerator: str) -> str:
  generation = accelerator.rsplit("-", 1)[0]
  if generation not in RUNTIMES:
    raise SystemExit(f"unknown accelerator {accelerator!r}: pass --version (known generations: "
                     f"{', '.join(RUNTIMES)})")
  return RUNTIMES[generation]


def _where(ns) -> list[str]:
  out = [f"--zone={ns.zone}"]
  return out + [f"--project={ns.project}"] if ns.project else out


def _ssh(ns, command: str, worker: str = "all") -> list[str]:
  return ["gcloud", "compute", "tpus", "tpu-vm", "ssh", ns.name, *_where(ns), f"--worker={worker}",
          f"--command={command}"]


def workdir(ns) -> str:
  if ns.workdir:
    return ns.workdir
  if ns.bucket:
    return f"/mnt/{ns.bucket}/{ns.name}"
  raise SystemExit("pass --bucket (a GCS bucket every worker mounts) or --workdir on a shared "
                   "filesystem: checkpoints are written by all workers together")


def commands(step: str, ns, args: list[str]) -> list[list[str]]:
  """The gcloud command lines of one step."""
  version = ns.version or runtime(ns.accelerator)
  if step == "create":
    extra = ["--spot"] if ns.spot else []
    if ns.queued:
      return [["gcloud", "compute", "tpus", "queued-resources", "create", ns.name,
               f"--node-id={ns.name}", *_where(ns), f"--accelerator-type={ns.accelerator}",
               f"--runtime-version={version}", *extra],
              ["gcloud", "compute", "tpus", "queued-resources", "describe", ns.name, *_where(ns),
               "--format=value(state.state)"]]
    return [["gcloud", "compute", "tpus", "tpu-vm", "create", ns.name, *_where(ns),
             f"--accelerator-type={ns.accelerator}", f"--version={version}", *extra]]
  if step == "install":
    ship = []
    if ns.source:
      fetch = (f"(git clone --depth 1 {shlex.quote(ns.source)} ~/rlhfjax || "
               "(cd ~/rlhfjax && git pull --ff-only))")
    else:  # This checkout's HEAD, shipped to every worker.
      ship = [["git", "-C", ROOT, "archive", "--format=tar.gz", f"--output={ARCHIVE}", "HEAD"],
              ["gcloud", "compute", "tpus", "tpu-vm", "scp", ARCHIVE, f"{ns.name}:{ARCHIVE}",
               *_where(ns), "--worker=all"]]
      fetch = f"mkdir -p ~/rlhfjax && tar -xzf {ARCHIVE} -C ~/rlhfjax"
    setup = [fetch, "python3 -m pip install -q -U 'jax[tpu]'",
             "python3 -m pip install -q -e ~/rlhfjax"]
    if ns.bucket:
      setup.append(f"sudo mkdir -p /mnt/{ns.bucket} && sudo chmod 777 /mnt/{ns.bucket} && "
                   f"(mountpoint -q /mnt/{ns.bucket} || gcsfuse --implicit-dirs {ns.bucket} "
                   f"/mnt/{ns.bucket})")
    return ship + [_ssh(ns, " && ".join(setup))]
  if step == "run":
    main = ["python3", "-m", "rlhfjax.main", *args, f"--workdir={workdir(ns)}"]
    return [_ssh(ns, f"cd ~/rlhfjax && {shlex.join(main)} 2>&1 | tee {LOG}; "
                     "exit ${PIPESTATUS[0]}")]
  if step == "logs":
    return [["gcloud", "compute", "tpus", "tpu-vm", "scp", f"{ns.name}:{LOG}",
             f"{ns.logs}/{ns.name}-worker{w}.log", *_where(ns), f"--worker={w}"]
            for w in range(ns.workers)]
  if step == "delete":
    if ns.queued:
      return [["gcloud", "compute", "tpus", "queued-resources", "delete", ns.name, *_where(ns),
               "--force", "--quiet"]]
    return [["gcloud", "compute", "tpus", "tpu-vm", "delete", ns.name, *_where(ns), "--quiet"]]
  raise ValueError(step)


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("step", choices=STEPS + ("all",))
  parser.add_argument("--name", required=True, help="TPU VM (and queued resource) name")
  parser.add_argument("--zone", required=True)
  parser.add_argument("--project", default="")
  parser.add_argument("--accelerator", default="v4-8", help="e.g. v4-32, v5litepod-16, v5p-64")
  parser.add_argument("--version", default="", help="TPU VM runtime (default: per generation)")
  parser.add_argument("--spot", action="store_true", help="spot capacity (preemptible)")
  parser.add_argument("--queued", action="store_true", help="create through a queued resource")
  parser.add_argument("--source", default="",
                      help="git URL each worker clones (default: ship this checkout's HEAD)")
  parser.add_argument("--bucket", default="", help="GCS bucket mounted on every worker")
  parser.add_argument("--workdir", default="", help="shared workdir (default /mnt/<bucket>/<name>)")
  parser.add_argument("--workers", type=int, default=1, help="how many workers' logs to fetch")
  parser.add_argument("--logs", default="logs", help="local directory for fetched logs")
  parser.add_argument("--keep", action="store_true", help="with 'all': do not delete at the end")
  parser.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
  parser.add_argument("--fit_steps", default="",
                      help="steps the fit check compiles, e.g. sft,rm (default: all)")
  parser.add_argument("--no_fit_check", action="store_true",
                      help="do not compile the job for the slice before creating or running it")
  return cli.parse(parser, argv, needs_main=lambda ns: ns.step in ("run", "all"))


def fit_check(ns, args: list[str]) -> list[str]:
  """Compiles the job for the slice of `ns.accelerator` here; exits with the reason when it does not
  fit, else returns the arguments that pin the mesh `mesh.auto` chose (none without auto)."""
  from rlhfjax.errors import ConfigError  # pylint: disable=g-import-not-at-top
  from rlhfjax.parallel import tpu  # pylint: disable=g-import-not-at-top
  try:
    topology = tpu.topology_for(ns.accelerator)
  except ConfigError as e:
    raise SystemExit(f"refused: {e}") from e
  with tempfile.TemporaryDirectory() as workdir:
    cmd = [sys.executable, "-m", "rlhfjax.main", *args, "--config.task=compile",
           f"--config.compile.topology={topology}", f"--workdir={workdir}"]
    if ns.fit_steps:
      cmd.append(f"--config.compile.steps={ns.fit_steps}")
    print(f"checking the job on {ns.accelerator} ({topology}): {shlex.join(cmd)}", flush=True)
    if subprocess.call(cmd, cwd=ROOT):
      raise SystemExit(f"refused: the job does not compile for {ns.accelerator} (see above)")
    with open(f"{workdir}/compile/{topology.replace(':', '_')}.json", encoding="utf-8") as f:
      report = json.load(f)
  if not report["fits"]:
    over = [f"{r['step']} needs {r['per_chip'] / 2**30:.1f} GiB per chip of "
            f"{r['hbm'] / 2**30:.1f} GiB" for r in report["rows"].values() if not r["fits"]]
    raise SystemExit(f"refused: the job does not fit {ns.accelerator} with mesh "
                     f"{report['mesh']}: {'; '.join(over)}. Use a larger slice, "
                     "--config.mesh.auto=True, model.remat, or smaller batches.")
  if not report["candidates"]:
    return []
  pinned = [f"--config.mesh.{a}={n}" for a, n in report["mesh"].items()]
  return pinned + ["--config.mesh.auto=False"]


def main(argv: list[str] | None = None) -> int:
  ns, args = parse(argv)
  steps = STEPS if ns.step == "all" else (ns.step,)
  if args and not ns.no_fit_check and {"create", "run"} & set(steps):
    args = args + fit_check(ns, args)
  status = 0
  for step in steps:
    if step == "delete" and ns.step == "all" and ns.keep:
      continue
    if status and step != "delete":
      continue  # After a failure only clean up.
    for cmd in commands(step, ns, args):
      if ns.dry_run:
        print(shlex.join(cmd))
        continue
      rc = subprocess.call(cmd)
      status = status or rc
  return status


if __name__ == "__main__":
  sys.exit(main())
