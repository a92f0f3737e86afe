"""Chaos run: each method of a list killed with SIGKILL at random points and relaunched, compared
with an uninterrupted run.

  python tests/chaos.py [--methods grpo,dapo,rloo,online_dpo,dpo,kto] [--kills 20] [--seed 0]
                        [--workdir DIR] [--config configs/tldr_sim.py:tiny] [--checkpoint_every 1]

`--methods` (default: the quickstart's stages, sft,label,rm,ppo,best_of_n,expert_iteration,eval)
are pipeline stages. The stages they need and do not list themselves (`NEEDS`: SFT, labels and the
reward model for the online methods; SFT and labels for DPO and KTO) run once, uninterrupted, in
`DIR/clean`; then each method runs there in a process of its own (`--config.stages=METHOD`), to the
end. Each method then runs again in `DIR/METHOD/repeat`, a copy of the clean workdir's stages it
needs, uninterrupted: it must equal the clean run (else a difference below would not be the kills'
doing), and its wall time W (start-up from the compilation cache included) sets the kill window.
Then the method is killed in `DIR/METHOD/chaos1`, another such copy, by SIGKILL and relaunched until
it finishes, and compared; in fresh copies (`chaos2`, ...) until its share of `--kills` (an even
split over the methods) has landed in it. Each launch runs with a checkpoint after every step
(`--checkpoint_every`, 1; 0 keeps the config's and times every kill) and is killed either after a
random 2 s to 0.9 W (2 s: Python's and JAX's imports, before the method's own start-up; past 0.9 W
most launches would finish first) or, every second kill, 0-0.3 s after a checkpoint drawn from those
the launch has yet to write, the last aside, in the steps after it: a resume mid-run, which timed
kills reach seldom, as start-up, held-out evaluation and sampling take most of a tiny run. A kill
counts for the method when its last file (`FINISHED`) is not yet written; one that lands later,
while the process exits, is logged but not counted, and the method then runs to the end. All runs
share one compilation cache (`DIR/xla-cache`, unless JAX_COMPILATION_CACHE_DIR is set), so a
relaunch gets past compiling quickly and the kills land in the method's work: loading, sampling,
steps, checkpoints, its outputs. Each kill's line names the method's latest checkpoint at that
moment.

Every chaos workdir must hold the clean run's results for its method: outputs and reports byte for
byte, every metric of every step (the last row written for a step; the wall-clock `perf/*` and
`time/*` aside) and the last checkpoint (parameters, optimizer state, step) bit for bit. Prints
each kill, the kills per method and every difference; exits 1 on a difference.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = ("sft", "label", "rm", "ppo", "best_of_n", "expert_iteration", "eval")
_ONLINE = ("ppo", "rloo", "grpo", "dapo", "gspo", "reinforce_pp", "online_dpo", "best_of_n",
           "expert_iteration", "quark")
_OFFLINE = ("dpo", "simpo", "kto", "feedme", "reward_conditioning")
# The earlier stages each stage reads (the tiny config's eval.methods for eval).
NEEDS = {"sft": (), "label": ("sft",), "rm": ("sft", "label"),
         **{m: ("sft", "label", "rm") for m in _ONLINE}, **{m: ("sft", "label") for m in _OFFLINE},
         "eval": STAGES[:-1]}
# The file each stage writes last: a stage whose file is missing has not finished.
FINISHED = {"sft": "sft/eval.md", "label": "label/annotators.md", "rm": "rm/eval.md",
            "eval": "eval/leaderboard.md", **{m: f"{m}/outputs.json" for m in _ONLINE + _OFFLINE}}


def command(config: str, workdir: str) -> list[str]:
  return [sys.executable, "-m", "rlhfjax.main", "--config", config, "--workdir", workdir]


def prerequisites(methods: tuple[str, ...]) -> tuple[str, ...]:
  """The stages `methods` need and do not list, in the order the pipeline runs them."""
  unknown = [m for m in methods if m not in NEEDS]
  if unknown:
    raise SystemExit(f"--methods: unknown {', '.join(unknown)} (known: {', '.join(NEEDS)})")
  needed, todo = set(), list(methods)
  while todo:
    for s in NEEDS[todo.pop()]:
      if s not in needed:
        needed.add(s)
        todo.append(s)
  return tuple(s for s in NEEDS if s in needed and s not in methods)


def copy_needs(clean: str, workdir: str, method: str) -> None:
  """A fresh `workdir` holding what `method` needs of the clean workdir: its stages and the root's
  files (the tokenizer)."""
  shutil.rmtree(workdir, ignore_errors=True)
  os.makedirs(workdir)
  if not NEEDS[method]:
    return
  for name in os.listdir(clean):
    src = os.path.join(clean, name)
    if os.path.isfile(src):
      shutil.copy(src, workdir)
  for stage in NEEDS[method]:
    shutil.copytree(os.path.join(clean, stage), os.path.join(workdir, stage))


def _stage(workdir: str, stages: tuple[str, ...]) -> str:
  """The first of `stages` that has not finished (what a kill now interrupts)."""
  return next((s for s in stages if not os.path.exists(os.path.join(workdir, FINISHED[s]))),
              "after the last stage")


def _saved(workdir: str, stage: str) -> int | None:
  """The latest complete checkpoint of `stage` in `workdir` (Orbax renames a finished one to its
  step), None before the first."""
  directory = os.path.join(workdir, stage, "checkpoints")
  steps = [int(d) for d in os.listdir(directory) if d.isdigit()] if os.path.isdir(directory) else []
  return max(steps, default=None)


def run_with_kills(config: str, workdir: str, kills: int, rng: random.Random, log,
                   window: tuple[float, float] = (3.0, 25.0), extra: tuple[str, ...] = (),
                   stages: tuple[str, ...] = STAGES, steps: int = 0) -> list[dict[str, Any]]:
  """Launches the pipeline in `workdir` and kills it after a uniform draw from `window` seconds,
  again and again until `kills` kills have landed in `stages` (before their last file), a kill lands
  after the last one (while the process exits) or a launch finishes before its kill; then runs it
  to the end. `extra` flags go to every launch. With `steps` > 1 (one stage of that many steps, a
  checkpoint after each) every second kill lands instead 0-0.3 s after a checkpoint drawn from those
  after the latest one and before the last, in the steps that follow it: a resume mid-run, which
  timed kills reach seldom where start-up and sampling take most of a launch. Returns every kill,
  one after the last stage too (`stage`: "after the last stage")."""
  events = []
  while sum(e["stage"] in stages for e in events) < kills:
    stage = _stage(workdir, stages)
    saved = (_saved(workdir, stage) or 0) if stage in stages else steps
    target = rng.randint(saved + 1, steps - 1) if len(events) % 2 and saved + 1 < steps else None
    delay = rng.uniform(*window) if target is None else rng.uniform(0.0, 0.3)
    proc = subprocess.Popen(command(config, workdir) + list(extra), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    start, reached = time.time(), None
    while proc.poll() is None:
      if target is not None and reached is None and (_saved(workdir, stage) or 0) >= target:
        reached = time.time()
      due = start + delay if target is None else (reached and reached + delay)
      if due is not None and time.time() >= due:
        break
      time.sleep(0.05)
    if proc.poll() is None:
      stage = _stage(workdir, stages)
      proc.send_signal(signal.SIGKILL)
      proc.wait()
      saved = _saved(workdir, stage) if stage in stages else None
      when = (f"after {time.time() - start:.1f} s" if target is None else
              f"{delay:.1f} s after checkpoint {target} ({time.time() - start:.1f} s)")
      events.append({"kill": len(events) + 1, "after_s": round(time.time() - start, 1),
                     "stage": stage, "checkpoint": saved})
      log(f"kill {len(events)}: {when}, in {stage}" +
          ("" if saved is None else f" (its checkpoint {saved} written)"))
      if stage not in stages:  # Killed while it exits: a relaunch only redoes the last files.
        break
      continue
    if proc.returncode != 0:
      raise RuntimeError(f"the pipeline failed (exit {proc.returncode}) after {len(events)} kills")
    log(f"the pipeline finished before kill {len(events) + 1}")
    return events
  finish(config, workdir, extra)
  return events


def kill_after_checkpoint(cmd: list[str], workdir: str, stage: str, step: int = 1,
                          timeout: float = 300.0, env: dict[str, str] | None = None) -> int | None:
  """Launches `cmd` in a session of its own and kills it, with every process it started, by SIGKILL
  as soon as checkpoint `step` (or a later one) of `stage` is written in `workdir`: a kill in the
  middle of the method, which the relaunch resumes. Returns the checkpoint it found, None when the
  command ended first."""
  proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, start_new_session=True)
  deadline = time.time() + timeout
  while proc.poll() is None:
    saved = _saved(workdir, stage)
    if (saved is not None and saved >= step) or time.time() > deadline:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()
      if saved is None or saved < step:
        raise TimeoutError(f"no checkpoint {step} of {stage} in {workdir} after {timeout:.0f} s")
      return saved
    time.sleep(0.05)
  if proc.returncode != 0:
    raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}) before its kill")
  return None


def finish(config: str, workdir: str, extra: tuple[str, ...] = ()) -> float:
  """Runs the pipeline in `workdir` to the end; returns its wall time."""
  t0 = time.time()
  proc = subprocess.run(command(config, workdir) + list(extra), cwd=ROOT, capture_output=True,
                        text=True)
  if proc.returncode != 0:
    raise RuntimeError(f"{' '.join(extra)} in {workdir} failed (exit {proc.returncode}):\n"
                       f"{proc.stderr[-3000:]}")
  return time.time() - t0


def _metrics(path: str) -> dict[int, dict[str, float]]:
  """The last row written for each step, wall-clock figures (`perf/*`, `time/*`) left out."""
  rows = {}
  with open(path) as f:
    for line in f:
      row = json.loads(line)
      rows[row["step"]] = {k: v for k, v in row.items() if not k.startswith(("perf/", "time/"))}
  return rows


def _arrays(directory: str) -> dict[str, np.ndarray]:
  """A checkpoint's arrays as host arrays, whatever devices (or processes) wrote them."""
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  checkpointer = ocp.PyTreeCheckpointer()
  layout = checkpointer.metadata(directory).item_metadata
  tree = checkpointer.restore(directory, restore_args=jax.tree.map(
      lambda _: ocp.RestoreArgs(restore_type=np.ndarray), layout))
  return {jax.tree_util.keystr(k): np.asarray(v)
          for k, v in jax.tree_util.tree_leaves_with_path(tree)}


def differences(clean: str, chaos: str, only: tuple[str, ...] = ()) -> list[str]:
  """Every way the chaos workdir's results differ from the clean one's (in the stage directories
  `only`, when given)."""
  out = []
  for root, dirs, files in os.walk(clean):
    rel = os.path.relpath(root, clean)
    dirs[:] = [d for d in dirs if d not in ("tb",) and not d[0].isdigit()
               and not (rel == "." and only and d not in only)]
    for f in files:
      a, b = os.path.join(root, f), os.path.join(chaos, rel, f)
      name = os.path.normpath(os.path.join(rel, f))
      if not os.path.exists(b):
        out.append(f"{name}: missing after the kills")
      elif f == "metrics.jsonl":
        if _metrics(a) != _metrics(b):
          out.append(f"{name}: metrics differ")
      elif f.endswith((".json", ".jsonl", ".md", ".csv", ".model")) and f != "config.json":
        if open(a, "rb").read() != open(b, "rb").read():
          out.append(f"{name}: contents differ")
    if os.path.basename(root) == "checkpoints":
      steps = sorted(int(d) for d in os.listdir(root) if d.isdigit())
      other = os.path.join(chaos, rel)
      for step in steps[-1:]:
        try:
          x, y = _arrays(os.path.join(root, str(step), "state")), _arrays(
              os.path.join(other, str(step), "state"))
        except Exception as e:  # pylint: disable=broad-except
          out.append(f"{os.path.join(rel, str(step))}: cannot compare ({e})")
          continue
        bad = [k for k in x if k not in y or not np.array_equal(x[k], y[k])]
        if bad:
          out.append(f"{os.path.join(rel, str(step))}: {len(bad)} arrays differ, e.g. {bad[0]}")
  return out


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--methods", default=",".join(STAGES))
  parser.add_argument("--kills", type=int, default=20)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--config", default="configs/tldr_sim.py:tiny")
  parser.add_argument("--checkpoint_every", type=int, default=1)
  parser.add_argument("--workdir", default="")
  args = parser.parse_args()
  methods = tuple(m for m in args.methods.split(",") if m)
  prereqs = prerequisites(methods)
  methods = tuple(sorted(methods, key=list(NEEDS).index))  # Each after the stages it needs.
  base = args.workdir or tempfile.mkdtemp(prefix="rlhfjax-chaos-")
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(base, "xla-cache"))
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  extra = (f"--config.checkpoint.every={args.checkpoint_every}",) if args.checkpoint_every else ()
  clean = os.path.join(base, "clean")
  shutil.rmtree(clean, ignore_errors=True)
  start = time.time()
  if prereqs:
    took = finish(args.config, clean, (f"--config.stages={','.join(prereqs)}", *extra))
    print(f"prerequisites {','.join(prereqs)}, uninterrupted: {took:.0f} s", flush=True)
  rng, diff, report = random.Random(args.seed), [], []
  for i, method in enumerate(methods):
    flags = (f"--config.stages={method}", *extra)
    took = finish(args.config, clean, flags)
    repeat = os.path.join(base, method, "repeat")
    copy_needs(clean, repeat, method)
    warm = finish(args.config, repeat, flags)
    print(f"{method}: uninterrupted {took:.0f} s, again {warm:.0f} s", flush=True)
    diff += [f"{method}, uninterrupted again: {d}"
             for d in differences(clean, repeat, only=(method,))]
    share = args.kills // len(methods) + (i < args.kills % len(methods))
    window = (min(2.0, warm / 2), 0.9 * warm)
    steps = _saved(clean, method) or 0  # With a checkpoint after every step, the last one.
    events, rounds, t0 = [], 0, time.time()
    while sum(e["stage"] == method for e in events) < share:
      rounds += 1
      chaos = os.path.join(base, method, f"chaos{rounds}")
      copy_needs(clean, chaos, method)
      left = share - sum(e["stage"] == method for e in events)
      events += run_with_kills(args.config, chaos, left, rng,
                               lambda m, r=rounds: print(f"{method} round {r}, {m}", flush=True),
                               window=window, extra=flags, stages=(method,),
                               steps=steps if args.checkpoint_every == 1 else 0)
      diff += [f"{method} round {rounds}: {d}" for d in differences(clean, chaos, only=(method,))]
    hit = sum(e["stage"] == method for e in events)
    report.append((method, hit, len(events) - hit, rounds, time.time() - t0))
    print(f"{method}: {hit} kills in {rounds} rounds ({len(events) - hit} more after it "
          f"finished), {time.time() - t0:.0f} s", flush=True)
  print(f"{sum(r[1] for r in report)} kills in {time.time() - start:.0f} s; per method: " +
        ", ".join(f"{m} {n} ({after} after, {rounds} rounds, {s:.0f} s)"
                  for m, n, after, rounds, s in report))
  print("\n".join(diff) if diff else "results equal: every output, metric and checkpoint")
  if not args.workdir:
    shutil.rmtree(base, ignore_errors=True)
  return 1 if diff else 0


if __name__ == "__main__":
  sys.exit(main())
