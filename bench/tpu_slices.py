"""The smallest TPU slice on which a model's SFT, RM and whole PPO step fit (docs/tpu.md).

  python bench/tpu_slices.py --arch llama3.1-8b --chip v5p [--attention splash] \\
      [--out runs/tpu_slices]

For each slice size Google Cloud offers, from the smallest that can hold PPO's trained and frozen
weights, gradients and AdamW moments: the (data, fsdp, tensor) shapes are ranked by the planner as
`mesh.auto` does, the best `--candidates` compiled with task=compile's code (configs/tldr_scale.py
with that architecture; libtpu, no TPU), and the first slice where every step fits is reported
with its per-chip GiB, estimated MFU and tokens/s. Prints one Markdown row per step and writes
`<out>/<arch>_<chip>.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
from rlhfjax import config_file
from rlhfjax.parallel import tpu
from rlhfjax.stages import compile as compile_task
from rlhfjax.stages import memory

STEPS = "sft,rm,ppo_prefill,ppo_decode,ppo_update"
SHOWN = ("sft", "rm", compile_task.WHOLE_PPO)


def topology(chip: tpu.Chip, chips: int) -> str:
  prefix = chip.accelerator
  return tpu.topology_for(f"{prefix}-{chips * chip.cores_per_chip}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--arch", default="llama3.1-8b")
  parser.add_argument("--chip", default="v5p", choices=sorted(tpu.CHIPS))
  parser.add_argument("--candidates", type=int, default=1)
  parser.add_argument("--attention", default="splash",
                      help="model.attention (splash: the TPU kernel)")
  parser.add_argument("--max_chips", type=int, default=256)
  parser.add_argument("--out", default="runs/tpu_slices")
  args = parser.parse_args()
  chip = tpu.CHIPS[args.chip]
  config = config_file.load(os.path.join(ROOT, "configs", "tldr_scale.py"), args.arch)
  config.mesh.auto = True
  config.model.attention = args.attention
  config.compile.update(steps=STEPS, auto_candidates=args.candidates)
  cfg = compile_task.model_config(config)
  # PPO trains policy and value (16 bytes per parameter each: float32 weights, gradients, two
  # moments) beside frozen bfloat16 reference and reward models: fewer chips cannot hold it.
  n = memory.param_bytes(cfg, compile_task.topology_mesh(tpu.devices(topology(chip, 4)),
                                                          {"data": 1, "fsdp": 1, "tensor": 1}))
  n = n["count"]
  sizes = [k for k in tpu.slice_sizes(chip) if k * chip.hbm_bytes >= 36 * n]
  tried = []
  for chips in (k for k in sizes if k <= args.max_chips):
    name = topology(chip, chips)
    t0 = time.perf_counter()
    report = compile_task.compile_topology(config, cfg, name, STEPS.split(","))
    tried.append({"topology": name, "fits": report["fits"], "mesh": report["mesh"],
                  "seconds": time.perf_counter() - t0})
    print(f"{name}: mesh {report['mesh']}, fits: {report['fits']} "
          f"({tried[-1]['seconds']:.0f} s)", flush=True)
    if report["fits"]:
      break
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, f"{args.arch}_{args.chip}.json"), "w", encoding="utf-8") as f:
    json.dump({"arch": args.arch, "chip": args.chip, "tried": tried, "report": report}, f, indent=2)
  print(compile_task.format_report(report))
  if report["fits"]:
    for step in SHOWN:
      r = report["rows"][step]
      print(f"| {args.arch} | {args.chip}-{chips} ({name}) | {step} | "
            f"{r['per_chip'] / 2**30:.1f} | {100 * r['mfu']:.0f}% | {r['tokens_per_s']:,.0f} |")


if __name__ == "__main__":
  main()
