"""The verifiable task over seeds: each stage of configs/verifiable.py timed, then one table.

  python bench/verifiable_seeds.py --seeds 0,1,2 --workdir runs/verifiable_seeds

For each seed s, `<workdir>/seed_<s>` runs SFT, GRPO, DAPO, GSPO and Dr. GRPO with `seed=s` (the
problems stay those of `data.seed`), then task=pass_at_k. A rerun resumes: finished stages are not
trained again (their wall time is then the earlier run's, kept in `<workdir>/seed_<s>/times.json`).
Prints, per method and seed, pass@1 and pass@8 with their 95% intervals, the one-sided p-value of
pass@1 against SFT's, the stage's wall time, and for DAPO the share of groups its dynamic sampling
dropped in each iteration's first draw; then the float32 matmul peak measured in the same run.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import matmul_peak  # noqa: E402  pylint: disable=g-import-not-at-top

from rlhfjax import config_file  # noqa: E402
from rlhfjax import main as rlhfjax_main  # noqa: E402
from rlhfjax.training import metrics as metrics_lib  # noqa: E402

CONFIG = os.path.join(os.path.dirname(__file__), "..", "configs", "verifiable.py")


def run_seed(seed: int, workdir: str, arg: str | None) -> dict[str, float]:
  """Runs every stage for `seed` in `workdir`; returns each stage's wall seconds."""
  times_path = os.path.join(workdir, "times.json")
  times = {}
  if os.path.exists(times_path):
    with open(times_path, encoding="utf-8") as f:
      times = json.load(f)
  config = config_file.load(CONFIG, arg)
  config.seed = seed
  for stage in config.stages.split(","):
    one = config.copy_and_resolve_references()
    one.stages = stage
    t = time.perf_counter()
    rlhfjax_main.run(one, workdir)
    if stage not in times:
      times[stage] = time.perf_counter() - t
      os.makedirs(workdir, exist_ok=True)
      with open(times_path, "w", encoding="utf-8") as f:
        json.dump(times, f)
  return times


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", default="0,1,2")
  ap.add_argument("--workdir", default="runs/verifiable_seeds")
  ap.add_argument("--config-arg", default="", help="e.g. 'tiny'")
  args = ap.parse_args()
  rows = []
  for seed in (int(s) for s in args.seeds.split(",")):
    workdir = os.path.join(args.workdir, f"seed_{seed}")
    times = run_seed(seed, workdir, args.config_arg or None)
    with open(os.path.join(workdir, "pass_at_k", "leaderboard.json"), encoding="utf-8") as f:
      board = json.load(f)
    dapo = metrics_lib.read_jsonl(os.path.join(workdir, "dapo", "metrics.jsonl"))
    dropped = [m["dynamic_sampling/first_draw_dropped_fraction"] for s, m in sorted(dapo.items())
               if "dynamic_sampling/first_draw_dropped_fraction" in m]
    for r in board:
      rows.append({"seed": seed, **r, "minutes": times.get(r["method"], float("nan")) / 60,
                   "dropped": dropped if r["method"] == "dapo" else None})
  print("| method | seed | pass@1 (%) | pass@8 (%) | p vs SFT | wall (min) |")
  print("|---|---:|---:|---:|---:|---:|")
  for r in rows:
    p = r.get("p_vs_first")
    print(f"| {r['method']} | {r['seed']} | {100 * r['pass@1']:.1f} ± {100 * r['pass@1_ci']:.1f} "
          f"| {100 * r['pass@k']:.1f} ± {100 * r['pass@k_ci']:.1f} | "
          + ("" if p is None else f"{p:.1g}") + f" | {r['minutes']:.1f} |")
  for r in rows:
    if r["dropped"]:
      d = np.asarray(r["dropped"])
      print(f"DAPO seed {r['seed']}: groups dropped in the first draw per iteration: mean "
            f"{100 * d.mean():.0f}%, first {100 * d[0]:.0f}%, last {100 * d[-1]:.0f}%")
  print(f"float32 matmul peak measured now: {matmul_peak() / 1e9:.1f} GFLOP/s")


if __name__ == "__main__":
  main()
