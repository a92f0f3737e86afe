"""The memory planner against XLA's per-chip bytes, from task=compile reports (docs/tpu.md).

  python bench/planner_vs_xla.py runs/tpu_slices/*.json

Each report (task=compile's `<workdir>/compile/<topology>.json`, or bench/tpu_slices.py's output)
holds XLA's per-chip bytes of every step it compiled. This recomputes `memory.plan`'s estimate of
the same steps on the same slice and mesh — nothing is compiled, so a changed planner is checked
against every compile at once — and prints plan / XLA per step.
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
from rlhfjax import config_file
from rlhfjax.models.config import ModelConfig
from rlhfjax.parallel.sharding import Parallel
from rlhfjax.parallel import tpu
from rlhfjax.stages import compile as compile_task


def main(paths: list[str]) -> None:
  print("| model | slice | mesh | step | XLA GiB | plan GiB | plan / XLA |")
  print("|---|---|---|---|---:|---:|---:|")
  worst = 0.0
  for path in paths:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
    report, arch = data.get("report", data), data.get("arch", "")
    cfg = ModelConfig(**report["model"])
    config = config_file.load(os.path.join(ROOT, "configs", "tldr_scale.py"),
                              arch or "llama3.1-8b")
    config.model.update({k: v for k, v in report["model"].items() if k in config.model})
    names = [n for n in report["rows"] if n in compile_task.STEPS]
    par = Parallel(compile_task.topology_mesh(tpu.devices(report["topology"]), report["mesh"]))
    for step in compile_task.steps(config, cfg, par, names):
      xla = report["rows"][step.name]["per_chip"]
      plan = step.plan_bytes + step.resident
      worst = max(worst, abs(plan / xla - 1))
      print(f"| {arch or cfg.d_model} | {report['topology']} | {tuple(report['mesh'].values())} "
            f"| {step.name} | {xla / 2**30:.1f} | {plan / 2**30:.1f} | {plan / xla:.2f} |")
  print(f"\nlargest deviation: {100 * worst:.0f}%")


if __name__ == "__main__":
  main(sys.argv[1:])
