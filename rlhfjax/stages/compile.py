"""task=compile: every step of the pipeline compiled for real TPU slices on a host without a TPU.

  python -m rlhfjax.main --config configs/llama3_8b_tldr.py --config.task=compile \\
      --config.compile.topology=v5p:2x2x2

For each topology in `compile.topology` (comma-separated; see rlhfjax/parallel/tpu.py) the config's
model and mesh are laid on the slice's chips (libtpu gives them; nothing runs) and each step the
pipeline runs — the SFT, reward-model, DPO, SimPO, KTO and PPO update steps, the PPO rollout's
prefill and one decode step with its KV cache, best-of-N scoring, and where `compile.steps` names
them the critic-free updates (`<task>_update` for rloo, grpo, dapo, gspo, reinforce_pp) — is lowered
with the same shardings as training and compiled by XLA for that TPU. The rollout's steps
(stages/rollout_steps.py) run in the rollout layout (parallel/rollout.py, config block `rollout`)
chosen as a run on that slice would choose it: the slice's chips (one ICI domain) as the fast
domain, and the chip's HBM less `compile.headroom` less the training state and the frozen models as
the room it has; `rollout_reshard` is the copy of the policy into it, once per iteration (cast and
resharding compiled as one program; none with `rollout.mesh='train'`, which samples from the
trainer's layout and float32 weights). The decode step is the one of the last cache block
(`rollout.cache_block`): it reads the most cache slots. Each update step is its method's builder's
program (`program(exp)`, the one its training loop runs: docs/design.md, "One program per method"),
so it holds what a run of the config trains: with a `lora` block, the adapters and their AdamW
moments beside the frozen base, and no reference tree where the policy's own base is the reference;
and the run's eos ids (the planner's `plan` and the analytic FLOPs still count full fine-tuning).
One row per step:

- per-chip bytes from XLA's `memory_analysis()`: arguments, temporaries, outputs (less what is
  donated), plus what stays resident in HBM while the step runs without being its argument (during
  rollout: the training state, the reference and reward models), against the chip's HBM less
  `compile.headroom`: fits or not;
- the planner's estimate (`stages/memory.py`) beside it;
- the collectives of the compiled program, counted from its HLO (parallel/hlo.py): number and
  result bytes per chip of its all-gathers, all-reduces, reduce-scatters, all-to-alls and
  collective-permutes;
- model FLOPs counted analytically (`models/flops.py`; XLA's cost analysis sees one layer of the
  scan), hardware FLOPs (plus what each trained model's remat policy recomputes: the whole forward
  of its layers for "full", their attention score matmuls for "dots" and "offload"; `model.remat`
  and the `remat` block), and a roofline time: the largest of FLOPs / peak, HBM bytes / HBM
  bandwidth and ICI bytes / ICI bandwidth (below), whence MFU (model FLOPs / (chips x peak x
  time)) and tokens/s; for the decode step also its HBM roofline (the weights in the compute dtype
  and the filled cache, read once per token) and the ratio of its time to it;
- compile seconds.

"ppo (whole step)" = prefill + reshard + response_len - 1 decode steps (each block's steps reading
the slots that block reads) + update. With `mesh.auto` the (data, fsdp, tensor) shapes of the
slice are ranked by the planner and the best `compile.auto_candidates` compiled; the fitting one
with the shortest estimated time wins. Writes `<workdir>/compile/<topology>.json` and `.md` (the
table: stages/compile_report.py). With `rollout.placement='split'` the report adds the
asynchronous iteration (stages/split.py).

ICI traffic (bytes each chip receives) is counted from the compiled HLO (parallel/hlo.py: ring
algorithms over each collective's replica group, a while loop's collectives its trip count times).
Only a step XLA refuses (out of memory) falls back to the model: with fsdp=f, each pass gathers (f-1)/f of the weights and the gradients are
reduce-scattered; data parallel all-reduces the gradient shard; tensor parallel all-reduces two
activations per layer and pass. HBM traffic (estimate): for a decode step the weights as its
argument holds them (gathered, written and read once more under fsdp), the cache slots it reads,
one slot written and the logits; for the other steps every argument read once, every output
written once, every temporary written and read once, and the weights read once more for each
further pass over them. The roofline assumes perfect overlap: real steps run slower (docs/tpu.md
compares with MaxText's measured MFU).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh

from rlhfjax.algorithms import dpo
from rlhfjax.algorithms import grpo
from rlhfjax.algorithms import kto
from rlhfjax.algorithms import ppo
from rlhfjax.algorithms import reinforce_pp
from rlhfjax.algorithms import reward_model
from rlhfjax.algorithms import rloo
from rlhfjax.algorithms import sft
from rlhfjax.errors import ConfigError
from rlhfjax.models.config import ModelConfig
from rlhfjax.models import flops
from rlhfjax.models import lora
from rlhfjax.models import pretrained
from rlhfjax.parallel import hlo
from rlhfjax.parallel.mesh import AXES
from rlhfjax.parallel.mesh import mesh_shape
from rlhfjax.parallel import placement
from rlhfjax.parallel.sharding import Parallel
from rlhfjax.parallel import tpu
from rlhfjax.stages import compile_report
from rlhfjax.stages import costs
from rlhfjax.stages import memory
from rlhfjax.stages import rollout_steps
from rlhfjax.stages import split
from rlhfjax.stages.costs import Step
from rlhfjax.training import experiment
from rlhfjax.training import loaders
from rlhfjax.training import metrics
from rlhfjax.training.program import shardings_of, tokens
# XLA's out-of-memory message: "... HLO temporaries (492.77G) exceeds available HBM (15.75G)".
_OOM_TEMPS = re.compile(r"temporaries \(([\d.]+)([KMGT])\)")
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# The schedule's length of the methods whose steps the data sets (rm, dpo, simpo, kto: epochs x
# their pairs), which task=compile does not read: a constant of the program, it changes no shape,
# byte or collective.
DATA_STEPS = 1000
# Each update step's builder (the one that trains it), called with the Experiment.
PROGRAMS = {"sft": sft.program,
            "rm": lambda exp: reward_model.program(exp, DATA_STEPS, exp.config.rm.batch_size),
            "dpo": lambda exp: dpo.program(exp, "dpo", DATA_STEPS),
            "simpo": lambda exp: dpo.program(exp, "simpo", DATA_STEPS),
            "kto": lambda exp: kto.program(exp, DATA_STEPS), "ppo_update": ppo.program}
# The critic-free online methods whose update (experience and minibatch passes) compiles as
# `<task>_update`; dapo, gspo and dr_grpo are grpo.py under their own blocks.
CRITIC_FREE = {"rloo": rloo.program,
               **{t: functools.partial(grpo.program, task=t)
                  for t in ("grpo", "dapo", "gspo", "dr_grpo")},
               "reinforce_pp": reinforce_pp.program}
STEPS = ("sft", "rm", "dpo", "simpo", "kto", "ppo_prefill", "ppo_decode", "ppo_update",
         *(f"{task}_update" for task in CRITIC_FREE), "best_of_n_score")
WHOLE_PPO = "ppo (whole step)"
RESHARD = rollout_steps.RESHARD  # With the rollout steps where the rollout's layout is another.
PUSH = rollout_steps.PUSH  # rollout.placement='split': the policy to the sampler's chips.


def model_config(config: Any) -> ModelConfig:
  """The model of a config: its `model` block, or the architecture a pretrained `init_from` names
  (only its shapes are needed here)."""
  return pretrained.block_config(config.model.to_dict())


def _experiment(config: Any, cfg: ModelConfig, par: Parallel) -> experiment.Experiment:
  """The Experiment the builders read, without data or a tokenizer: the model, the mesh and the
  `lora` block, so each step holds the adapters and optimizer state a run of this config trains
  with (the eos ids: `Experiment.eos_ids`, read from the config as the run would)."""
  return experiment.Experiment(config, "", {}, None, cfg, par, "",
                               lora.from_config(config.lora))



def steps(config: Any, cfg: ModelConfig, par: Parallel, names: Sequence[str] = STEPS, *,
          fast_domain: int = 1, hbm_usable: float | None = None) -> list[Step]:
  """The pipeline's steps for `cfg` on `par`'s mesh, with abstract arguments: each update step the
  program its method's builder returns (what the run trains), with its cost (stages/costs.py).
  The rollout's (prefill, decode and the copy into its layout) run in the layout `rollout.choose`
  picks for a slice whose `fast_domain` chips share the fast interconnect, with `hbm_usable` bytes
  per chip (None: unlimited)."""
  exp = _experiment(config, cfg, par)
  programs = {**PROGRAMS, **{f"{task}_update": fn for task, fn in CRITIC_FREE.items()}}
  sampled = {"ppo_prefill", "ppo_decode"} & set(names)
  out: list[Step] = []
  for name, build in programs.items():
    if name not in names and not (name == "ppo_update" and sampled):
      continue
    prog = build(exp)
    if name == "ppo_update" and sampled:
      out += rollout_steps.steps(exp, prog, sampled, fast_domain, hbm_usable)
    if name in names:
      cost = costs.COSTS.get(name) or costs.online_update(name.removesuffix("_update"))
      out.append(Step(name, prog.step, prog.args, **cost(exp, prog)))
  if "best_of_n_score" in names:  # The reward model's scoring (no update step, no builder).
    fmt, b = config.format, config.rm.eval_batch_size
    seq, lm_rm = fmt.prompt_len + fmt.response_len, fmt.response_len * bool(config.rm.likelihood_weight)
    par.check_batch("rm.eval_batch_size", b)
    rm_params = loaders.reward_model_template(exp)
    fn = par.jit(functools.partial(reward_model.score, cfg=cfg),
                 (shardings_of(rm_params), par.batch), par.batch)
    f = flops.forward(cfg, b, seq, logit_tokens=lm_rm)
    batch = tokens(par, b, {"prompt": fmt.prompt_len, "response": fmt.response_len})
    out.append(Step("best_of_n_score", fn, (rm_params, batch), f, f, b * seq,
                    {"reward": (1, False)},
                    memory.plan(cfg, par.mesh, b, seq, logit_tokens=lm_rm)["forward_step"]))
  return out



def _weight_bytes(cfg: ModelConfig, mesh: Mesh) -> float:
  """Bytes of one model's weights as a chip's matmuls read them (compute dtype; split by tensor)."""
  n = memory.param_bytes(cfg, mesh)["count"]
  return n * jnp.dtype(cfg.dtype).itemsize / mesh.shape["tensor"]


def _ici_bytes(step: Step, cfg: ModelConfig, mesh: Mesh) -> float:
  """Bytes each chip receives over ICI in one step (see the module docstring)."""
  d, f, t = (mesh.shape[a] for a in AXES)
  weights = _weight_bytes(cfg, mesh)
  grads = memory.param_bytes(cfg, mesh)["total"] / t  # Parameter dtype.
  total = 0.0
  for passes, trained in step.weight_passes.values():
    total += passes * weights * (f - 1) / f
    if trained:
      total += grads * (f - 1) / f + 2 * grads / f * (d - 1) / d
  if t > 1:
    rows = step.tokens / (d * f)  # Token positions per chip.
    act = rows * cfg.d_model * jnp.dtype(cfg.dtype).itemsize
    passes = sum(p for p, _ in step.weight_passes.values())
    total += passes * cfg.n_layers * 2 * 2 * act * (t - 1) / t
  return total


def analyse(step: Step, cfg: ModelConfig, par: Parallel, chip: tpu.Chip, headroom: float) -> dict:
  """Compiles `step` and returns its row: XLA's bytes, fit, FLOPs, roofline, MFU, tokens/s."""
  t0 = time.perf_counter()
  error, counted = "", None
  mesh = step.mesh or par.mesh
  try:
    compiled = step.fn.lower(*step.args).compile()
    m = compiled.memory_analysis()
    args, temps = int(m.argument_size_in_bytes), int(m.temp_size_in_bytes)
    outs, alias = int(m.output_size_in_bytes), int(m.alias_size_in_bytes)
    counted = hlo.collectives(compiled.as_text(), mesh.size)
  except jax.errors.JaxRuntimeError as e:  # XLA refuses a program that exceeds the chip's HBM.
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    error = str(e).strip().splitlines()[0]
    found = _OOM_TEMPS.search(error)
    args, outs, alias = costs.per_chip(step.args), 0, 0
    temps = int(float(found.group(1)) * _UNITS[found.group(2)]) if found else 0
  seconds = time.perf_counter() - t0
  total = args + temps + outs - alias + step.resident
  chips = mesh.size
  weights = _weight_bytes(cfg, mesh)
  extra_passes = sum(p for p, _ in step.weight_passes.values()) - len(step.weight_passes)
  hbm = (args + outs + 2 * temps + extra_passes * weights if step.hbm_bytes is None
         else step.hbm_bytes)
  ici = counted["received"] if counted else _ici_bytes(step, cfg, mesh)
  times = {"compute_s": step.hardware_flops / chips / chip.peak_flops,
           "hbm_s": hbm / chip.hbm_bandwidth, "ici_s": ici / chip.ici_bandwidth}
  est = max(times.values())
  usable = chip.hbm_bytes * (1 - headroom)
  decode = {}
  if step.kv_slot:  # What a token must read: the weights and the filled cache.
    roofline = (step.weights + step.kv_slot * step.cache_read) / chip.hbm_bandwidth
    decode = {"cache_read": step.cache_read, "weights_bytes": step.weights,
              "kv_slot_bytes": step.kv_slot, "hbm_roofline_s": roofline,
              "roofline_ratio": est / roofline}
  return {"step": step.name, "layout": step.layout, "arguments": args, "temporaries": temps,
          "outputs": outs - alias,
          "resident": step.resident, "per_chip": total, "plan": step.plan_bytes + step.resident,
          "hbm": chip.hbm_bytes, "fits": not error and total <= usable, "headroom": usable - total,
          "xla_error": error,
          "model_flops": step.model_flops, "hardware_flops": step.hardware_flops,
          "hbm_bytes": hbm, "ici_bytes": ici, "ici_counted": counted is not None,
          "collectives": counted["ops"] if counted else None, **times, **decode, "time_s": est,
          "bound": max(times, key=times.get)[:-2],
          "mfu": step.model_flops / (chips * chip.peak_flops * est) if est else 0.0,
          "tokens_per_s": step.tokens / est if est else 0.0, "compile_s": seconds}


def whole_ppo(rows: dict[str, dict], config: Any, cfg: ModelConfig, chips: int,
              chip: tpu.Chip) -> dict | None:
  """The PPO iteration: prefill, the copy into the rollout layout (if any), response_len - 1
  decode steps and the update. Each decode step's HBM bytes are the compiled (last-block) step's
  with the cache slots its block reads; its roofline reads the weights and the filled cache."""
  if not all(k in rows for k in ("ppo_prefill", "ppo_decode", "ppo_update")):
    return None
  p_len, r_len = config.format.prompt_len, config.format.response_len
  b = config.ppo.rollout_batch
  decode_s, roofline_s = costs.decode_seconds(rows["ppo_decode"], config, chip.hbm_bandwidth)
  parts = [k for k in ("ppo_prefill", RESHARD, "ppo_update") if k in rows]
  rollout_s = decode_s + sum(rows[k]["time_s"] for k in parts if k != "ppo_update")
  est = rollout_s + rows["ppo_update"]["time_s"]
  # Decode FLOPs are linear in the keys read: (r_len - 1) steps at the mean filled length.
  model = (rows["ppo_prefill"]["model_flops"] + rows["ppo_update"]["model_flops"]
           + (r_len - 1) * flops.forward(cfg, b, 1, keys=p_len + r_len / 2))
  parts.append("ppo_decode")
  return {"step": WHOLE_PPO, "per_chip": max(rows[k]["per_chip"] for k in parts),
          "plan": max(rows[k]["plan"] for k in parts), "hbm": chip.hbm_bytes,
          "fits": all(rows[k]["fits"] for k in parts),
          "headroom": min(rows[k]["headroom"] for k in parts), "model_flops": model,
          "time_s": est, "mfu": model / (chips * chip.peak_flops * est),
          "tokens_per_s": b * (p_len + r_len) / est, "rollout_s": rollout_s,
          "decode_s": decode_s, "decode_roofline_s": roofline_s,
          "roofline_ratio": decode_s / roofline_s if roofline_s else 1.0,
          "rollout_share": rollout_s / est,
          "compile_s": sum(rows[k]["compile_s"] for k in parts)}


def topology_mesh(devices: Sequence[Any], shape: dict[str, int]) -> Mesh:
  """A (data, fsdp, tensor) Mesh over a slice's devices, as `parallel.mesh.make_mesh` builds it."""
  sizes = tuple(shape[a] for a in AXES)
  return Mesh(np.array(devices[:math.prod(sizes)], dtype=object).reshape(sizes), AXES,
              axis_types=(AxisType.Auto,) * len(AXES))


def mesh_candidates(config: Any, cfg: ModelConfig, chips: int) -> list[dict[str, int]]:
  """The (data, fsdp, tensor) shapes of `chips` devices that every batch of the config divides
  over (tensor at most 8: it stays inside a host)."""
  batches = [config.sft.batch_size, config.rm.batch_size, config.dpo.batch_size,
             config.simpo.batch_size, config.kto.batch_size, config.ppo.rollout_batch,
             config.rm.eval_batch_size]
  out = []
  for t in (1, 2, 4, 8):
    if chips % t or cfg.n_heads % t:
      continue
    for f in (2**i for i in range(int(math.log2(chips // t)) + 1)):
      d = chips // (t * f)
      if d * f * t == chips and all(b % (d * f) == 0 for b in batches):
        out.append({"data": d, "fsdp": f, "tensor": t})
  return out


def _resolve_mesh(config: Any, devices: Sequence[Any]) -> dict[str, int]:
  """`config.mesh` on the slice's devices (one axis may be -1)."""
  return dict(zip(AXES, mesh_shape({a: config.mesh[a] for a in AXES}, len(devices))))


def compile_topology(config: Any, cfg: ModelConfig, topology: str,
                     names: Sequence[str] = STEPS) -> dict:
  """Rows for every step on `topology` with the config's mesh (or, with `mesh.auto`, the best)."""
  chip, _ = tpu.parse(topology)
  devices = tpu.devices(topology)
  headroom = float(config.compile.headroom)
  where = {"fast_domain": len(devices), "hbm_usable": chip.hbm_bytes * (1 - headroom)}
  candidates = []
  if config.mesh.auto:
    shapes = mesh_candidates(config, cfg, len(devices))
    if not shapes:
      raise ConfigError(f"mesh.auto: no (data, fsdp, tensor) shape of {len(devices)} chips "
                        "divides every batch size of the config")
    # Rank by the planner (nothing compiled), then compile the best few for real.
    for shape in shapes:
      par = Parallel(topology_mesh(devices, shape))
      planned = max(s.plan_bytes + s.resident for s in steps(config, cfg, par, names, **where))
      candidates.append({"mesh": shape, "plan": planned})
    # Planned to fit first, widest data parallelism (least communication) first among those;
    # then the nearest misses (the plan is an estimate: a near miss may fit).
    usable = chip.hbm_bytes * (1 - headroom)
    candidates.sort(key=lambda c: (c["plan"] > usable, 0 if c["plan"] > usable else
                                   -c["mesh"]["data"] * c["mesh"]["fsdp"], c["plan"]))
    for cand in candidates[:int(config.compile.auto_candidates)]:
      cand.update(_compile_all(config, cfg, cand["mesh"], devices, chip, headroom, names, where))
    compiled = [c for c in candidates if "rows" in c]
    fitting = [c for c in compiled if c["fits"]] or compiled
    best = min(fitting, key=lambda c: (not c["fits"], c["time_s"]))
  else:
    best = _compile_all(config, cfg, _resolve_mesh(config, devices), devices, chip, headroom,
                        names, where)
  par = Parallel(topology_mesh(devices, best["mesh"]))
  exp = _experiment(config, cfg, par)
  return {"topology": topology, "chip": dataclasses.asdict(chip), "chips": len(devices),
          "model": dataclasses.asdict(cfg), "param_count": memory.param_bytes(
              cfg, par.mesh)["count"],
          # The rematerialisation each trained model's step ran under (model.remat, `remat`).
          "remat": {role: exp.model_for(role).remat for role in lora.MODELS},
          "mesh": best["mesh"], "fits": best["fits"], "rows": best["rows"],
          "candidates": candidates,
          **({"async": split.search(
              config, cfg, devices, chip, headroom, best["rows"].get(WHOLE_PPO), PUSH,
              build=functools.partial(split_steps, config, cfg),
              analyse=lambda step, par: analyse(step, cfg, par, chip, headroom))}
             if placement.sampler_count(config.rollout, len(devices)) else {})}


def split_steps(config: Any, cfg: ModelConfig, trainer: Sequence[Any], sampler: Sequence[Any],
                hbm_usable: float) -> tuple[Parallel, list[Step], float]:
  """PPO's programs under rollout.placement='split': the update on the `trainer` chips
  (`config.mesh` over them), prefill and decode in the rollout layout on the `sampler` chips, the
  push between them (stages/rollout_steps.py); and the update's modelled ICI bytes per chip."""
  par = Parallel(topology_mesh(trainer, _resolve_mesh(config, trainer)))
  exp = _experiment(config, cfg, par)
  prog = ppo.program(exp)
  update = Step("ppo_update", prog.step, prog.args, **costs.COSTS["ppo_update"](exp, prog))
  steps_ = rollout_steps.steps(exp, prog, {"ppo_prefill", "ppo_decode"}, len(sampler),
                               hbm_usable, sampler)
  return par, [update, *steps_], _ici_bytes(update, cfg, par.mesh)


def _compile_all(config: Any, cfg: ModelConfig, shape: dict[str, int], devices: Sequence[Any],
                 chip: tpu.Chip, headroom: float, names: Sequence[str], where: dict) -> dict:
  par = Parallel(topology_mesh(devices, shape))
  rows = {s.name: analyse(s, cfg, par, chip, headroom)
          for s in steps(config, cfg, par, names, **where)}
  whole = whole_ppo(rows, config, cfg, par.mesh.size, chip)
  if whole:
    rows[WHOLE_PPO] = whole
  rollout_parts = ("ppo_prefill", "ppo_decode", "ppo_update", RESHARD)
  timed = [r for k, r in rows.items() if k not in rollout_parts]
  return {"mesh": shape, "rows": rows, "fits": all(r["fits"] for r in rows.values()),
          "time_s": sum(r["time_s"] for r in timed)}


def run(config: Any, workdir: str) -> dict[str, dict]:
  """task=compile: the table for every topology of `compile.topology`; writes JSON and Markdown."""
  topologies = [t.strip() for t in str(config.compile.topology).split(",") if t.strip()]
  if not topologies:
    raise ConfigError("compile.topology: name at least one TPU slice, e.g. v5e:4x4 or v5p:2x2x2")
  names = [s.strip() for s in str(config.compile.steps).split(",") if s.strip()]
  unknown = sorted(set(names) - set(STEPS))
  if unknown:
    raise ConfigError(f"compile.steps: unknown step(s) {unknown}; known: {', '.join(STEPS)}")
  cfg = model_config(config)
  out_dir = os.path.join(workdir, "compile")
  os.makedirs(out_dir, exist_ok=True)
  reports = {}
  for topology in topologies:
    report = compile_topology(config, cfg, topology, names)
    table = compile_report.format_report(report)
    metrics.info(table + "\n")
    name = topology.replace(":", "_")
    experiment.write_json(os.path.join(out_dir, f"{name}.json"), report)
    experiment.write_text(os.path.join(out_dir, f"{name}.md"), table + "\n")
    reports[topology] = report
  return reports
