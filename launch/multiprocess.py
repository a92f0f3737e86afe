"""Runs one rlhfjax command as several local processes on JAX's distributed runtime.

  python launch/multiprocess.py --processes 2 --devices_per_process 2 -- \\
      --config configs/tldr_sim.py:tiny --workdir runs/mp --config.task=rm

Each process runs `python -m rlhfjax.main <args>` with `config.distributed` set to an explicit
coordinator (127.0.0.1 on a free port) and its process id; on CPU `--devices_per_process` forces that
many host devices per process. This is how multi-host code is tested on one machine, and the same
command shape the TPU and SLURM launchers run on every host. `--dry_run` prints the commands.
Exit status: the first non-zero status of any process (75 = preempted, rerun to resume); if one
process fails, the others are stopped.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import subprocess
import sys

import cli  # launch/cli.py, beside this script.
import threading
import time


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def commands(args: list[str], processes: int, port: int, python: str = sys.executable
             ) -> list[list[str]]:
  """The command line of each process."""
  return [[python, "-m", "rlhfjax.main", *args, "--config.distributed.mode=explicit",
           f"--config.distributed.coordinator_address=127.0.0.1:{port}",
           f"--config.distributed.num_processes={processes}",
           f"--config.distributed.process_id={i}"] for i in range(processes)]


def environment(devices_per_process: int, base: dict[str, str] | None = None) -> dict[str, str]:
  env = dict(os.environ if base is None else base)
  if devices_per_process > 0:
    flags = env.get("XLA_FLAGS", "").split()
    flags = [f for f in flags if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join(flags + [
        f"--xla_force_host_platform_device_count={devices_per_process}"])
    env.setdefault("JAX_PLATFORMS", "cpu")
  return env


def _pump(i: int, stream, out) -> None:
  for line in iter(stream.readline, ""):
    out.write(f"[{i}] {line}")
    out.flush()


def run(cmds: list[list[str]], env: dict[str, str], timeout: float | None = None) -> int:
  """Starts every command, streams their output with a [process] prefix, returns the exit status."""
  procs = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for c in cmds]
  pumps = [threading.Thread(target=_pump, args=(i, p.stdout, sys.stdout), daemon=True)
           for i, p in enumerate(procs)]
  for t in pumps:
    t.start()
  deadline = None if timeout is None else time.monotonic() + timeout
  status = 0
  try:
    while any(p.poll() is None for p in procs):
      failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
      if failed or (deadline is not None and time.monotonic() > deadline):
        status = failed[0] if failed else 124
        break
      time.sleep(0.2)
  finally:
    for p in procs:
      if p.poll() is None:
        p.terminate()
    for p in procs:
      try:
        p.wait(timeout=30)
      except subprocess.TimeoutExpired:
        p.kill()
    for t in pumps:
      t.join(timeout=5)
  return status or next((p.returncode for p in procs if p.returncode), 0)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--processes", type=int, default=2)
  parser.add_argument("--devices_per_process", type=int, default=0,
                      help="force this many CPU devices per process (0: the platform's own)")
  parser.add_argument("--port", type=int, default=0, help="coordinator port (0: a free one)")
  parser.add_argument("--timeout", type=float, default=None, help="seconds before stopping all")
  parser.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
  ns, args = cli.parse(parser, argv)
  cmds = commands(args, ns.processes, ns.port or free_port())
  env = environment(ns.devices_per_process)
  if ns.dry_run:
    prefix = f"XLA_FLAGS={shlex.quote(env['XLA_FLAGS'])} " if ns.devices_per_process else ""
    for c in cmds:
      print(prefix + shlex.join(c) + " &")
    print("wait")
    return 0
  return run(cmds, env, ns.timeout)


if __name__ == "__main__":
  sys.exit(main())
