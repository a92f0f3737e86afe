"""task=compile under rollout.placement='split' (parallel/placement.py): which divisions of a slice
into trainer and sampler chips to try, their ranking before anything compiles, and the
asynchronous iteration's estimate.

An asynchronous iteration generates the next batch on the sampler's chips while the trainer
updates on the last one, then pushes the new policy to the sampler: it takes
max(generation, training) + push (rollout.max_staleness >= 1; at 0 the two take turns and the
sum is paid). Generation is the prefill and the response's `response_len - 1` decode steps, on
the sampler's chips in its rollout layout; training the PPO update (its experience forwards —
the policy, reference, value and reward models over the batch — included, as a split run
computes them on the trainer's chips). Candidates are ranked by the same formula on analytic
figures (the update's FLOPs and modelled ICI bytes on the trainer's chips; the prefill's FLOPs,
then each decode step reading its weights and the half-filled cache from HBM; the push moving
each sampler chip's slice of the bf16 weights over ICI), and the best `compile.auto_candidates`
compile, as `mesh.auto` ranks meshes by the planner first.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from rlhfjax.errors import ConfigError
from rlhfjax.models.config import ModelConfig
from rlhfjax.models import flops
from rlhfjax.parallel import placement
from rlhfjax.parallel import rollout as parallel_rollout
from rlhfjax.parallel import tpu
from rlhfjax.stages import costs


def sampler_counts(config: Any, chips: int) -> list[int]:
  """The sampler chip counts to try on a slice of `chips`: `rollout.sampler_share`'s, then each
  share of `compile.split_shares` (comma-separated fractions of the slice), without repeats."""
  counts = [placement.sampler_count(config.rollout, chips)]
  for part in str(config.compile.split_shares).split(","):
    if not part.strip():
      continue
    try:
      share = float(part)
    except ValueError as e:
      raise ConfigError(f"compile.split_shares: {part.strip()!r} is not a fraction of the "
                        "slice's chips (e.g. '0.125,0.25,0.5')") from e
    n = round(share * chips)
    if not 0 < n < chips:
      raise ConfigError(f"compile.split_shares: {share} of {chips} chips leaves the sampler "
                        f"{n} and the trainer {chips - n}; each side needs at least one")
    if n not in counts:
      counts.append(n)
  return counts


def iteration(generation_s: float, training_s: float, push_s: float) -> float:
  """An asynchronous iteration: generation and training overlap, then the push."""
  return max(generation_s, training_s) + push_s


def analytic(update: costs.Step, update_ici: float, layout: dict, cfg: ModelConfig,
             config: Any, chip: tpu.Chip, trainer: int, sampler: int) -> dict[str, float]:
  """Generation, training, push and iteration seconds of a split from analytic figures: the
  update's hardware FLOPs and `update_ici` bytes per chip on `trainer` chips; the prefill's
  FLOPs, and each decode step reading its weights and the half-filled cache (or its FLOPs,
  whichever takes longer) on `sampler` chips in `layout` (a Step's: shape and dtype); the
  push, each sampler chip's weights received over ICI."""
  p_len, r_len, b = config.format.prompt_len, config.format.response_len, config.ppo.rollout_batch
  weights = parallel_rollout.weight_bytes(cfg, layout["tensor"], layout["dtype"])
  cache = parallel_rollout.cache_bytes(cfg, b, p_len + r_len // 2, layout["data"],
                                       layout["tensor"])
  decode = max((weights + cache) / chip.hbm_bandwidth,
               flops.forward(cfg, b, 1, keys=p_len + r_len // 2) / (sampler * chip.peak_flops))
  prefill = flops.forward(cfg, b, p_len, logit_tokens=1) / (sampler * chip.peak_flops)
  generation = prefill + (r_len - 1) * decode
  training = max(update.hardware_flops / (trainer * chip.peak_flops),
                 update_ici / chip.ici_bandwidth)
  push = weights / chip.ici_bandwidth
  return {"generation_s": generation, "training_s": training, "push_s": push,
          "iteration_s": iteration(generation, training, push)}


def compiled(rows: dict[str, dict], config: Any, chip: tpu.Chip, push: str,
             trainer: int) -> dict[str, float]:
  """Generation, training, push and iteration seconds from a split's compiled rows (the decode
  steps scaled per cache block as the colocated whole step scales them), and the push's bytes
  from its HLO: those that cross from the `trainer` chips to the sampler's (its
  collective-permutes' results on each trainer chip, one copy of the policy in the rollout
  dtype) and those each chip receives in all its collectives (the push's time)."""
  generation = (rows["ppo_prefill"]["time_s"]
                + costs.decode_seconds(rows["ppo_decode"], config, chip.hbm_bandwidth)[0])
  training, push_s = rows["ppo_update"]["time_s"], rows[push]["time_s"]
  ops = rows[push]["collectives"]
  return {"generation_s": generation, "training_s": training, "push_s": push_s,
          "iteration_s": iteration(generation, training, push_s),
          "push_bytes": trainer * ops["collective-permute"]["bytes"] if ops else None,
          "push_received_bytes": rows[push]["ici_bytes"]}


def search(config: Any, cfg: ModelConfig, devices: Sequence[Any], chip: tpu.Chip, headroom: float,
           colocated: dict | None, push: str, *,
           build: Callable[[Sequence[Any], Sequence[Any], float], tuple[Any, list, float]],
           analyse: Callable[[Any, Any], dict]) -> dict:
  """The asynchronous iteration on a slice of `devices`: each division into trainer chips (first)
  and sampler chips (`sampler_counts`), built by `build(trainer, sampler, usable HBM) ->
  (Parallel, steps, update ICI bytes)` and ranked by its `analytic` estimate (planned to fit
  first), the best `compile.auto_candidates` compiled (`analyse(step, par) -> row`); beside
  `colocated`, the colocated whole PPO step's row (None where compile.steps left it out)."""
  n, usable = len(devices), chip.hbm_bytes * (1 - headroom)
  candidates, built = [], {}
  for count in sampler_counts(config, n):
    cand = {"sampler": count, "trainer": n - count, "share": count / n}
    candidates.append(cand)
    try:
      par, steps, update_ici = build(devices[:n - count], devices[n - count:], usable)
    except ConfigError as e:  # The trainer's mesh, its batches or the push do not divide.
      cand["error"] = str(e)
      continue
    named = {s.name: s for s in steps}
    layout = named["ppo_decode"].layout
    built[count] = (par, steps)
    cand.update(mesh=dict(par.mesh.shape), layout=layout,
                plan=max(s.plan_bytes + s.resident for s in steps),
                estimate=analytic(named["ppo_update"], update_ici, layout, cfg,
                                  config, chip, n - count, count))
  by_count = {c["sampler"]: c for c in candidates}
  ranked = sorted(built, key=lambda k: (by_count[k]["plan"] > usable,
                                        by_count[k]["estimate"]["iteration_s"]))
  if not ranked:
    raise ConfigError("rollout.sampler_share, compile.split_shares: no division of the "
                      f"{n} chips works: " + "; ".join(
                          f"{c['sampler']} sampler chips: {c['error']}" for c in candidates))
  for count in ranked[:int(config.compile.auto_candidates)]:
    par, steps = built[count]
    rows = {s.name: analyse(s, par) for s in steps}
    by_count[count].update(rows=rows, fits=all(r["fits"] for r in rows.values()),
                           compile_s=sum(r["compile_s"] for r in rows.values()),
                           **compiled(rows, config, chip, push, par.mesh.size))
  done = [c for c in candidates if "rows" in c]
  best = min(done, key=lambda c: (not c["fits"], c["iteration_s"]))
  return {"best": candidates.index(best), "candidates": candidates,
          "colocated_s": colocated["time_s"] if colocated else None}
