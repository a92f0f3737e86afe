"""rlhfjax beside PyTorch + transformers on one GPU at Llama 3.2 1B, bf16: issue #24's table.

  python bench/gpu.py [--works sft,rm,sample,ppo,rloo] [--attention auto] [--remat none]
                      [--deterministic] [--torch-python PY] [--repeats 3] [--iterations 3]
                      [--json out.json]
  python bench/gpu.py --tiny   # the same works scaled down, on any machine (float32 there)

The works, their shapes and how each side times them: bench/peers/presets.py, jax_gpu.py and
torch_gpu.py. As bench/peers/run.py does, each work runs in its own fresh process, PyTorch first
and then rlhfjax, never both at once, and the peaks are measured in the same run (through JAX: a
matmul in the model's dtype and a streaming copy). The PyTorch side runs in `--torch-python`:
.venv-peers/bin/python when it exists (bench/peers/setup.sh), else this interpreter, as on a GPU
image that has torch and transformers beside jax.

- MFU = model FLOPs (rlhfjax.models.flops: 2 per matmul parameter per token forward, 3x that with
  the backward, attention's causal half, the LM head where logits are taken) / the device's dense
  bf16 peak from its datasheet (DATASHEET, by jax device kind).
- The decode fraction of HBM bandwidth = the bytes one decode step reads (every weight, and the KV
  cache at its filled length, averaged over the steps) / the step's time / the datasheet
  bandwidth. The step's time is (the sampling call - the same call with 1 new token) / (new - 1).
- Episodes/s = episodes / the mean wall time of an iteration (sampling, scoring, update), the
  first iteration untimed.
A device with no datasheet entry (a CPU) is measured against the peaks of the run, as the header
says. A work that runs out of memory shows OOM, one that fails "failed" (its stderr is printed);
the command carries on. Ratios are rlhfjax's rate over PyTorch's. Asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "peers"))
import presets  # noqa: E402
from run import ROOT, run_side  # noqa: E402

from rlhfjax.models import architectures  # noqa: E402
from rlhfjax.models import flops  # noqa: E402
from rlhfjax.models.config import ModelConfig  # noqa: E402

# Dense bf16 FLOP/s and HBM bytes/s from NVIDIA's datasheets (no sparsity), by jax device kind.
DATASHEET = {"NVIDIA H100 80GB HBM3": (989e12, 3.35e12), "NVIDIA H100 PCIe": (756e12, 2.0e12),
             "NVIDIA H200": (989e12, 4.8e12), "NVIDIA A100-SXM4-80GB": (312e12, 2.039e12)}
# Each rlhfjax work and the PyTorch works timed beside it.
PAIRS = {"sft": ("sft",), "rm": ("rm",), "sample": ("sample", "sample_static"),
         "ppo": ("ppo", "ppo_static"), "rloo": ("rloo",)}


def label(torch_work: str, p: presets.Preset) -> str:
  seq = f"{p.seq_prompt} + {p.seq_response}"
  rl = (f"{p.episodes} episodes, prompts {p.rl_min_prompt}-{p.rl_prompt} + {p.rl_response}, "
        f"{p.epochs} epochs of {p.minibatch}")
  return {"sft": f"SFT step, {p.seq_batch} x ({seq})",
          "rm": f"RM step, {p.rm_pairs} pairs x ({seq})",
          "sample": (f"sampling {p.sample_batch} x {p.sample_prompt} + {p.sample_new}, "
                     "PyTorch generate"),
          "sample_static": "same, PyTorch with its static cache",
          "ppo": f"PPO iteration, {rl}, PyTorch generate",
          "ppo_static": "same, PyTorch with its static cache",
          "rloo": f"RLOO iteration, k {p.rloo_k}, {rl}; PyTorch: TRL"}[torch_work]


def amount(work: str, p: presets.Preset) -> tuple[int, str]:
  """What one timed call of `work` produces, and the unit of its rate."""
  if work in ("sft", "rm"):
    return p.seq_batch * (p.seq_prompt + p.seq_response), "tok/s"
  if work == "sample":
    return p.sample_batch * p.sample_new, "new tok/s"
  return p.episodes, "episodes/s"


def model_flops(work: str, p: presets.Preset, cfg: ModelConfig) -> float:
  """Model FLOPs of one SFT or RM step (0 for the other works)."""
  seq = p.seq_prompt + p.seq_response
  if work == "sft":  # Logits at the response positions only, on both sides.
    return flops.training(cfg, p.seq_batch, seq, logit_tokens=p.seq_response)
  if work == "rm":
    return flops.training(cfg, p.seq_batch, seq, logit_tokens=0)
  return 0.0


def decode_bytes(p: presets.Preset, report: dict) -> float:
  """Bytes one decode step reads, averaged over the steps: every weight, and the KV cache up to
  its filled length (step i attends over the prompt + i + 1 slots, i = 0 .. new - 2)."""
  return report["weight_bytes"] + report["kv_bytes_per_slot"] * (p.sample_prompt
                                                                 + p.sample_new / 2)


def num(x: float) -> str:
  return f"{x / 1e3:.1f}k" if x >= 1e4 else f"{x:,.0f}" if x >= 100 else f"{x:.2f}"


def failure(report: dict) -> str:
  """The cell of a work without a time: OOM, skipped (and why), or failed."""
  if "skipped" in report:
    return f"— ({report['skipped']})"
  err = report["error"].lower()
  if "out of memory" in err or "resource_exhausted" in err or "outofmemoryerror" in err:
    return "OOM"
  return f"failed (exit {report['returncode']})"


def rate_cell(work: str, report: dict, p: presets.Preset, cfg: ModelConfig,
              mfu_peak: float = 0.0) -> str:
  """A side's rate, with its MFU against `mfu_peak` if given (SFT, RM) or where its iteration's
  time went (PPO, RLOO)."""
  if "seconds" not in report:
    return failure(report)
  n, unit = amount(work, p)
  cell = f"{num(n / report['seconds'])} {unit}"
  if model_flops(work, p, cfg):
    mfu = model_flops(work, p, cfg) / report["seconds"] / mfu_peak if mfu_peak else 0.0
    return cell + (f", {100 * mfu:.0f}% MFU" if mfu else "")
  parts = report.get("parts", {})
  return cell + (" (" + " + ".join(f"{k} {v:.2f} s" for k, v in parts.items()) + ")"
                 if parts else "")


def figure_cell(work: str, report: dict, p: presets.Preset, peaks: tuple[float, float],
                cfg: ModelConfig, datasheet: bool) -> str:
  """rlhfjax's MFU (SFT, RM) or its decode step's fraction of the memory bandwidth (sampling)."""
  if "seconds" not in report:
    return ""
  if model_flops(work, p, cfg):
    return f"{100 * model_flops(work, p, cfg) / report['seconds'] / peaks[0]:.0f}% MFU"
  if work == "sample":
    step, moved = report["decode_step_seconds"], decode_bytes(p, report)
    bandwidth = "HBM bandwidth" if datasheet else "the measured copy bandwidth"
    return (f"decode {step * 1e3:.2f} ms/step reading {moved / 1e9:.3g} GB: "
            f"{100 * moved / step / peaks[1]:.0f}% of {bandwidth}")
  return ""


def ratio(jax_report: dict, torch_report: dict) -> str:
  if "seconds" in jax_report and "seconds" in torch_report:
    return f"{torch_report['seconds'] / jax_report['seconds']:.2f}x"
  return "—"


def run_work(python: str, side: str, work: str, args: argparse.Namespace,
             extra: list[str]) -> dict:
  """One side of one work, with progress and any failure's stderr on stderr."""
  start = time.perf_counter()
  script = "jax_gpu.py" if side == "rlhfjax" else "torch_gpu.py"
  report = run_side(python, script, work, args.repeats, args.threads,
                    extra + ["--iterations", str(args.iterations)], strict=False)
  if "error" in report:
    print(f"{side} {work} failed:\n{report['error']}", file=sys.stderr)
  print(f"[bench/gpu.py] {side} {work}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
  return report


def header(peak: dict, p: presets.Preset, args: argparse.Namespace, torch: dict) -> str:
  """The device, its peaks (datasheet and measured), the model and each side's software."""
  kind = peak["device"]
  measured = (f"measured in this run: {p.peak_n}^3 {p.dtype} matmul "
              f"{peak['matmul_flops_per_s'] / 1e12:.3g} TFLOP/s, copy "
              f"{peak['stream_bytes_per_s'] / 1e9:,.0f} GB/s")
  sheet = (f"datasheet {DATASHEET[kind][0] / 1e12:.0f} TFLOP/s dense bf16, "
           f"{DATASHEET[kind][1] / 1e9:,.0f} GB/s HBM" if kind in DATASHEET else
           "no datasheet entry: MFU and bandwidth fractions are of the peaks measured here")
  return "\n".join([
      f"{kind}: {sheet}; {measured}",
      f"model {p.arch} ({p.name} preset), {p.dtype} parameters and compute, random weights",
      f"rlhfjax: jax {peak['jax']}, attention {args.attention!r}, remat {args.remat!r}, "
      f"runtime {peak['runtime']}",
      f"PyTorch: {args.torch_python}, torch {torch.get('torch', '?')}, transformers "
      f"{torch.get('transformers', '?')} on {torch.get('device_name', '?')}, "
      f"{torch.get('attn_implementation', '?')} attention"])


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--tiny", action="store_true", help="presets.TINY: a scaled-down check")
  ap.add_argument("--works", default=",".join(PAIRS))
  ap.add_argument("--attention", default="auto", help="rlhfjax's model.attention")
  ap.add_argument("--remat", default="none", help="rlhfjax's model.remat")
  ap.add_argument("--deterministic", action="store_true",
                  help="rlhfjax with XLA's deterministic GPU ops (their cost)")
  venv = os.path.join(ROOT, ".venv-peers", "bin", "python")
  ap.add_argument("--torch-python", default=venv if os.path.exists(venv) else sys.executable)
  ap.add_argument("--repeats", type=int, default=3, help="timed steps and sampling calls")
  ap.add_argument("--iterations", type=int, default=3, help="timed PPO / RLOO iterations")
  ap.add_argument("--threads", type=int, default=os.cpu_count(), help="host threads per side")
  ap.add_argument("--json", default="")
  args = ap.parse_args()

  p = presets.TINY if args.tiny else presets.GPU_1B
  cfg = architectures.model_config(p.arch, **p.overrides)  # Shapes only: FLOPs, PyTorch's model.
  jax_extra = ["--preset", p.name, "--attention", args.attention, "--remat", args.remat]
  jax_extra += ["--deterministic"] if args.deterministic else []
  torch_extra = ["--preset", p.name, "--model", json.dumps(dataclasses.asdict(cfg))]
  peak = run_work(sys.executable, "rlhfjax", "peak", args, jax_extra)
  if "error" in peak:
    raise SystemExit("the peak measurement failed: nothing to measure against")
  datasheet = peak["device"] in DATASHEET
  peaks = DATASHEET.get(peak["device"], (peak["matmul_flops_per_s"], peak["stream_bytes_per_s"]))
  rows = []
  for work in args.works.split(","):
    torch_reports = {t: run_work(args.torch_python, "pytorch", t, args, torch_extra)
                     for t in PAIRS[work]}
    jax_report = run_work(sys.executable, "rlhfjax", work, args, jax_extra)
    for t, torch_report in torch_reports.items():
      rows.append({"label": label(t, p), "work": work, "torch_work": t, "rlhfjax": jax_report,
                   "pytorch": torch_report, "ratio": ratio(jax_report, torch_report),
                   "figure": figure_cell(work, jax_report, p, peaks, cfg, datasheet)})

  torch = next((r["pytorch"] for r in rows if "torch" in r["pytorch"]), {})
  print(header(peak, p, args, torch))
  print("\n| work | rlhfjax | PyTorch | rlhfjax / PyTorch | rlhfjax MFU or HBM fraction |")
  print("|---|---|---|---|---|")
  for r in rows:
    jax_cell = rate_cell(r["work"], r["rlhfjax"], p, cfg)
    torch_cell = rate_cell(r["work"], r["pytorch"], p, cfg, peaks[0])
    print(f"| {r['label']} | {jax_cell} | {torch_cell} | {r['ratio']} | {r['figure']} |")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump({"preset": dataclasses.asdict(p), "peak": peak, "peaks_used": peaks,
                 "rows": rows}, f, indent=2)


if __name__ == "__main__":
  main()
