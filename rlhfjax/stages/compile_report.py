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
  if report["rows"]:  # None where compile.steps names none (the asynchronous section alone).
    lines += ["", *_row_lines(report["rows"])]
  if report["candidates"]:
    lines += ["", "mesh.auto candidates (planner's per-chip GiB; compiled ones with XLA's fit and "
              "estimated time of the non-rollout steps plus the whole PPO step):", ""]
    for c in report["candidates"]:
      tail = (f", compiled: {'fits' if c['fits'] else 'does not fit'}, {c['time_s']:.3f} s"
              if "rows" in c else "")
      lines.append(f"- {c['mesh']}: plan {gib(c['plan'])} GiB{tail}")
  if "async" in report:
    lines += ["", *_async_lines(report["async"])]
  return "\n".join(lines)


def _shape(s: dict) -> str:
  return f"({s['data']}, {s['fsdp']}, {s['tensor']})"


def _async_lines(section: dict) -> list[str]:
  """rollout.placement='split': each division of the slice (trainer chips first), its analytic
  and (where compiled) compiled estimates — generation, training, push, the asynchronous
  iteration max(generation, training) + push — beside the colocated whole step, then the
  best division's compiled rows."""
  colocated = section["colocated_s"]
  best = section["candidates"][section["best"]]
  lines = ["Asynchronous rollouts (rollout.placement='split'): max(generation, training) + push; "
           "colocated whole step " + (f"{colocated:.2f} s" if colocated is not None else
                                      "not compiled (compile.steps without the PPO steps)"), "",
           "| sampler share | sampler / trainer chips | trainer mesh | rollout layout | plan GiB "
           "| estimate | fits | push GiB: crossing, received/chip (HLO) | generation s "
           "| training s | push ms | async iteration s | compile s |",
           "|---|---|---|---|---:|---|---|---|---:|---:|---:|---:|---:|"]
  for c in section["candidates"]:
    head = f"| {c['sampler']}/{c['sampler'] + c['trainer']} | {c['sampler']} / {c['trainer']} |"
    if "error" in c:
      lines.append(f"{head} not possible: {c['error']} |" + " |" * 10)
      continue
    compiled = "rows" in c
    figures = c if compiled else c["estimate"]
    fit = ("yes" if c["fits"] else "**no**") if compiled else ""
    pushed = (f"{c['push_bytes'] / 2**30:.2f}, {c['push_received_bytes'] / 2**30:.3f}"
              if c.get("push_bytes") is not None else "")
    mark = "**" if c is best else ""
    seconds = f"{c['compile_s']:.1f}" if compiled else ""
    lines.append(
        f"{head} {_shape(c['mesh'])} | {_shape(c['layout'])} {c['layout']['dtype']} | "
        f"{c['plan'] / 2**30:.2f} | {'compiled' if compiled else 'analytic'} | {fit} | "
        f"{pushed} | {figures['generation_s']:.2f} | {figures['training_s']:.2f} | "
        f"{figures['push_s'] * 1e3:.1f} | {mark}{figures['iteration_s']:.2f}{mark} | "
        f"{seconds} |")
  lines += ["", f"Best division: {best['sampler']} sampler chips, {best['trainer']} trainer chips "
            f"(rollout layout: {best['layout']['reason']}):", "", *_row_lines(best["rows"])]
  return lines


def _row_lines(rows: dict) -> list[str]:
  """The table of compiled rows."""
  gib = lambda b: f"{b / 2**30:.2f}"
  lines = ["| step | args GiB | temp GiB | out GiB | resident GiB | per chip GiB | plan GiB "
           "| fits | collectives: count GiB/chip | model TFLOP | time ms | bound "
           "| x HBM roofline | MFU | tokens/s | compile s |",
           "|---|" + "---:|" * 7 + "---|" + "---:|" * 7]
  for r in rows.values():
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
  return lines
