"""rlhfjax against the PyTorch stack on this machine: the table of speed ratios.

  sh bench/peers/setup.sh                      # once: .venv-peers with torch (CPU), transformers, trl
  python bench/peers/run.py [--works sample,prefill,rm,ppo,rloo] [--repeats 3] [--json out.json]

Each work runs in its own fresh process, PyTorch side first, then rlhfjax, one after the other (never
both at once), with the same thread count (`--threads`, default 2: torch.set_num_threads on one side,
the CPU client's default on the other) and glibc set for both to reuse large freed buffers
rather than return them to the kernel on every step (what rlhfjax's `runtime.host_malloc` does by
itself). The matmul peak is measured in the
same run, and each rlhfjax work is reported as FLOP/s and fraction of that peak; "ratio at the
peak" is the PyTorch time over the time the work's least FLOPs (causal attention halved) take at
that peak: the ratio no float32 implementation can pass on this machine. Absolute times
depend on the machine; the ratios are the result. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# One arena and no mmap: a worker thread's buffer over 32 MB otherwise gets a fresh mapping on every
# call, whatever the thresholds say (rlhfjax/runtime.py).
MALLOC = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "2147483647"}
UNITS = {"sample": ("tokens_per_s", "new tok/s"), "prefill": ("prompt_tokens_per_s", "prompt tok/s"),
         "rm": ("tokens_per_s", "tok/s"), "ppo": ("episodes_per_s", "episodes/s"),
         "rloo": ("episodes_per_s", "episodes/s")}


def run_side(python: str, script: str, work: str, repeats: int, threads: int,
             extra: list[str], strict: bool = True) -> dict:
  """One work in a fresh process; its JSON report. A failure ends the run, or with `strict`
  False is reported as {"error": the end of its stderr}."""
  env = {**os.environ, **MALLOC, "PEER_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
  with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
    out = f.name
  cmd = [python, os.path.join(HERE, script), "--work", work, "--repeats", str(repeats),
         "--json", out, *extra]
  proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
  if proc.returncode:
    os.unlink(out)
    if not strict:
      return {"error": proc.stderr[-3000:], "returncode": proc.returncode}
    raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
  with open(out, encoding="utf-8") as f:
    result = json.load(f)
  os.unlink(out)
  return result


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--works", default="sample,prefill,rm,ppo,rloo")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--threads", type=int, default=2)
  ap.add_argument("--torch-python", default=os.path.join(ROOT, ".venv-peers", "bin", "python"))
  ap.add_argument("--attention", default="chunked", help="rlhfjax's attention kernel")
  ap.add_argument("--chunk", type=int, default=128, help="queries per block of 'chunked'")
  ap.add_argument("--scan-layers", action="store_true", help="rlhfjax's layers as a lax.scan")
  ap.add_argument("--json", default="")
  args = ap.parse_args()
  if not os.path.exists(args.torch_python):
    raise SystemExit(f"{args.torch_python} not found: run sh bench/peers/setup.sh first")

  peak = run_side(sys.executable, "jax_side.py", "peak", args.repeats, args.threads, [])
  peak_flops = peak["flops"] / peak["seconds"]
  rows = []
  for work in args.works.split(","):
    torch = run_side(args.torch_python, "torch_side.py", work, args.repeats, args.threads, [])
    jax = run_side(sys.executable, "jax_side.py", work, args.repeats, args.threads,
                   ["--attention", args.attention, "--chunk", str(args.chunk)]
                   + (["--scan-layers"] if args.scan_layers else []))
    rows.append({"work": work, "torch": torch, "rlhfjax": jax,
                 "speedup": torch["seconds"] / jax["seconds"],
                 "fraction_of_peak": jax["flops"] / jax["seconds"] / peak_flops,
                 # No implementation does the work faster than its least FLOPs at the peak: the
                 # highest ratio over this PyTorch time that any float32 code could reach here.
                 "ceiling": torch["seconds"] / (jax["least_flops"] / peak_flops)})

  print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus, {args.threads} "
        f"threads; matmul peak {peak_flops / 1e9:.0f} GFLOP/s (jitted 2048^3 float32, this run); "
        f"rlhfjax attention '{args.attention}'"
        + (f" (blocks of {args.chunk})" if args.attention == "chunked" else "")
        + (", layers scanned" if args.scan_layers else ", layers unrolled"))
  print("| work | PyTorch stack | rlhfjax | rlhfjax / PyTorch | rlhfjax GFLOP/s | of peak "
        "| ratio at the peak |")
  print("|---|---|---|---|---|---|---|")
  for r in rows:
    key, unit = UNITS[r["work"]]
    t, j = r["torch"], r["rlhfjax"]
    tv = t["rate"]  # torch_side.py reports its works' rate under one name.
    print(f"| {r['work']} | {t['seconds'] * 1e3:.0f} ms ({tv:.1f} {unit}) | "
          f"{j['seconds'] * 1e3:.0f} ms ({j[key]:.1f} {unit}) | {r['speedup']:.2f}x | "
          f"{j['gflops']:.1f} | {100 * r['fraction_of_peak']:.0f}% | {r['ceiling']:.2f}x |")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump({"peak_flops": peak_flops, "threads": args.threads, "rows": rows}, f, indent=2)


if __name__ == "__main__":
  main()
