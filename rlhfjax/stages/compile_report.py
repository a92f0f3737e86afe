"""task=compile's Markdown table of one topology (rlhfjax/stages/compile.py's report): per step
the per-chip bytes XLA gives, the planner's, the fit, the collectives, FLOPs, roofline time and
bound, MFU, tokens/s and compile seconds; the rollout layout and the `mesh.auto` candidates."""

from __future__ import annotations


def _collectives_cell(ops: dict | None) -> str:
  """`AG 290: 14.02` (all-gathers: count, GiB of results per chip), ... for the kinds present;
  `model` where nothing was compiled (the ICI estimate is then analytic)."""
  if ops is None:
    return "model"
  short = {"all-gather": "AG", "all-reduce": "AR", "reduce-scatter": "RS", "all-to-all": "A2A",
           "collective-permute": "CP"}
  return ", ".join(f"{short[k]} {v['count']}: {v['bytes'] / 2**30:.2f}" for k, v in ops.items()
                   if v["count"]) or "none"


def format_report(report: dict) -> str:
  """The Markdown table of one topology's rows."""
  gib = lambda b: f"{b / 2**30:.2f}"
  chip = report["chip"]
  lines = [f"{report['topology']}: {report['chips']} x TPU {chip['name']} "
           f"({chip['peak_flops'] / 1e12:.0f} TFLOP/s bf16, {gib(chip['hbm_bytes'])} GiB HBM "
           f"each), mesh {report['mesh']}, {report['param_count'] / 1e9:.3f}B parameters",
           "remat: " + ", ".join(f"{role} {r}" for role, r in report["remat"].items())]
  layout = next((r["layout"] for r in report["rows"].values() if r.get("layout")), None)
  if layout:
    lines.append(f"rollout layout: data={layout['data']} fsdp={layout['fsdp']} "
                 f"tensor={layout['tensor']}, weights in {layout['dtype']} ({layout['reason']})")
  lines += ["",
            "| step | args GiB | temp GiB | out GiB | resident GiB | per chip GiB | plan GiB "
            "| fits | collectives: count GiB/chip | model TFLOP | time ms | bound "
            "| x HBM roofline | MFU | tokens/s | compile s |",
            "|---|" + "---:|" * 7 + "---|" + "---:|" * 7]
  for r in report["rows"].values():
    cell = lambda k: gib(r[k]) if k in r else ""
    fit = ("yes" if r["fits"] else "**no**") + f" ({gib(r['headroom'])} free)"
    ratio = f"{r['roofline_ratio']:.2f}" if "roofline_ratio" in r else ""
    moved = _collectives_cell(r["collectives"]) if "collectives" in r else ""
    lines.append(f"| {r['step']} | {cell('arguments')} | {cell('temporaries')} | "
                 f"{cell('outputs')} | {cell('resident')} | {gib(r['per_chip'])} | "
                 f"{gib(r['plan'])} | {fit} | {moved} | "
                 f"{r['model_flops'] / 1e12:.1f} | {r['time_s'] * 1e3:.2f} | "
                 f"{r.get('bound', '')} | {ratio} | {100 * r['mfu']:.1f}% | "
                 f"{r['tokens_per_s']:,.0f} | {r['compile_s']:.1f} |")
  if report["candidates"]:
    lines += ["", "mesh.auto candidates (planner's per-chip GiB; compiled ones with XLA's fit and "
              "estimated time of the non-rollout steps plus the whole PPO step):", ""]
    for c in report["candidates"]:
      tail = (f", compiled: {'fits' if c['fits'] else 'does not fit'}, {c['time_s']:.3f} s"
              if "rows" in c else "")
      lines.append(f"- {c['mesh']}: plan {gib(c['plan'])} GiB{tail}")
  return "\n".join(lines)
