"""Where the quickstart's training steps spend their time: an op-by-op profile (jax.profiler) of the
jitted SFT step, reward-model step and PPO update, grouped by what each XLA operation does.

  python bench/profile_steps.py [--config configs/tldr_sim.py] [--steps sft,rm,ppo] [--repeats 5]
                                [--top 10] [--json out.json]

Random parameters of the config's model at its shapes and batch sizes (the speed does not depend on
the weights). Each step is compiled, run once, then traced for `repeats` calls. Every operation the
trace records (on this CPU, one XLA thunk) is matched by name to the compiled HLO and put in a
group: `matmul` (a dot, or a fusion holding one: XLA CPU fuses element-wise work into its matmul
fusions), `element-wise`/`reduction` fusions, `copy`/`transpose`, and `other`. Per group: the
share of the step's time (operations running at once share it) and, for matmuls, their FLOPs (from
the HLO shapes) and GFLOP/s against the float32 matmul peak measured in the same run. Then the slowest operations,
with the JAX operation that made each. The profiler costs time per operation (on this CPU a traced
SFT step takes about 1.7 times as long), so the shares are indicative, and confirm a finding by
timing the step without the profiler. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import functools
import glob
import json
import math
import os
import re
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from rlhfjax import runtime
from rlhfjax.algorithms import reward_model
from rlhfjax.algorithms import sft
from rlhfjax.models import heads
from rlhfjax.models import sampling
from rlhfjax.models.config import ModelConfig
from rlhfjax.training import optimizer
from rlhfjax.training.state import TrainState
from ppo_speed import EOS, random_models, setup
from throughput import load_config, matmul_peak, timeit

_COMPUTATION = re.compile(r"^(?:ENTRY )?%(\S+) .*\{$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.*)$")
_OPCODE = re.compile(r"([a-z][a-z0-9\-]*)\(")
_SHAPE = re.compile(r"^[a-z0-9]+\[([0-9,]*)\]")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def _split(rhs: str) -> tuple[str, str, str]:
  """(type, opcode, rest) of an HLO instruction's right-hand side: the opcode is the first name
  followed by '(' outside the (possibly tuple) type."""
  for m in _OPCODE.finditer(rhs):
    head = rhs[:m.start()]
    if head.count("(") == head.count(")") and head.count("[") == head.count("]"):
      return head.strip(), m.group(1), rhs[m.end():]
  return rhs, "", ""


def _dims(type_: str) -> list[int]:
  m = _SHAPE.match(type_)
  return [int(d) for d in m.group(1).split(",") if d] if m else []


def parse_hlo(text: str) -> dict[str, dict]:
  """Every instruction of an optimized HLO module: {name: {opcode, computation it calls (or ''),
  dot FLOPs (its own, or its fused computation's), op_name}}."""
  comps: dict[str, list[tuple[str, ...]]] = {}  # name, type, opcode, calls, op_name, the rest.
  current = None
  for line in text.splitlines():
    if (m := _COMPUTATION.match(line)) and " = " not in line:
      current = comps.setdefault(m.group(1), [])
    elif current is not None and (m := _INSTRUCTION.match(line)):
      type_, opcode, rest = _split(m.group(2))
      calls = re.search(r"calls=%([\w.\-]+)", rest)
      op_name = _OP_NAME.search(rest)
      current.append((m.group(1), type_, opcode, calls.group(1) if calls else "",
                      op_name.group(1) if op_name else "") + (rest,))
  shapes = {n: _dims(t) for insts in comps.values() for n, t, *_ in insts}

  def own_flops(type_: str, opcode: str, rest: str) -> float:
    if opcode != "dot":
      return 0.0
    operands = re.findall(r"%([\w.\-]+)", rest.split(")")[0])
    lhs = shapes.get(operands[0], []) if operands else []
    contract = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", rest)
    k = math.prod(lhs[int(d)] for d in contract.group(1).split(",") if d) if contract and lhs else 1
    return 2.0 * math.prod(_dims(type_)) * k

  flops = {name: sum(own_flops(t, o, r) for _, t, o, _, _, r in insts)
           for name, insts in comps.items()}
  plain = ("parameter", "constant", "broadcast", "bitcast", "reshape", "get-tuple-element", "tuple")
  mix = {name: collections.Counter(o for _, _, o, _, _, _ in insts if o not in plain)
         for name, insts in comps.items()}
  out = {}
  for insts in comps.values():
    for name, type_, opcode, calls, op_name, rest in insts:
      f = flops.get(calls, 0.0) if opcode == "fusion" else own_flops(type_, opcode, rest)
      out[name] = {"opcode": opcode, "calls": calls, "flops": f, "op_name": op_name,
                   "kind": (re.search(r"kind=(\w+)", rest) or [None, ""])[1],
                   "shape": type_.split("{")[0],
                   "mix": ",".join(o for o, _ in mix.get(calls, collections.Counter()).most_common(4))}
  return out


def group(inst: dict) -> str:
  if inst["flops"] > 0:
    return "matmul"
  if inst["opcode"] == "fusion":
    return "reduction fusion" if inst["kind"] == "kInput" else "element-wise fusion"
  if inst["opcode"] in ("copy", "transpose", "bitcast", "dynamic-update-slice", "dynamic-slice",
                        "slice", "concatenate", "pad"):
    return "copy / transpose / slice"
  return "other"


def trace_ops(fn, repeats: int, names: set[str]) -> tuple[dict[str, float], dict[str, int]]:
  """Seconds of wall time, and number of executions, of each operation in `names` over `repeats`
  calls of `fn` (already compiled).

  XLA:CPU runs independent operations concurrently, often more of them than there are cores, so
  traced durations overlap and add up to more than the call took. Each stretch of time between two
  event boundaries is therefore split evenly among the operations running in it: the seconds then
  add up to the time the call was busy, and an operation's share is its share of the step.
  """
  with tempfile.TemporaryDirectory(prefix="rlhfjax-profile-") as directory:
    with jax.profiler.trace(directory):
      for _ in range(repeats):
        jax.block_until_ready(fn())
    path = sorted(glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True))[-1]
    planes = jax.profiler.ProfileData.from_file(path).planes
  edges, runs = [], collections.Counter()
  for plane in planes:
    if plane.name != "/host:CPU":
      continue
    for line in plane.lines:
      for event in line.events:
        if event.name in names:
          edges += [(event.start_ns, 1, event.name), (event.end_ns, -1, event.name)]
          runs[event.name] += 1
  seconds, running, last = collections.Counter(), collections.Counter(), None
  for t, change, name in sorted(edges):
    if last is not None and running:
      active = sum(running.values())
      for op, n in running.items():
        seconds[op] += n * (t - last) * 1e-9 / active
    running[name] += change
    if not running[name]:
      del running[name]
    last = t
  return dict(seconds), dict(runs)


def profile(name: str, jitted, args: tuple, repeats: int, peak: float, top: int) -> dict:
  """The grouped op-by-op profile of `jitted(*args)`, printed and returned."""
  compiled = jitted.lower(*args).compile()
  hlo = parse_hlo(compiled.as_text())
  call = lambda: compiled(*args)
  wall = timeit(call, repeats)
  seconds, runs = trace_ops(call, repeats, set(hlo))
  # Per call; an operation in a loop body (PPO's minibatches) runs, and does its FLOPs, many times.
  seconds = {k: v / repeats for k, v in seconds.items()}
  flops = {k: hlo[k]["flops"] * runs[k] / repeats for k in seconds}
  traced = sum(seconds.values())
  groups = collections.defaultdict(lambda: {"s": 0.0, "flops": 0.0, "ops": 0})
  for op, s in seconds.items():
    g = groups[group(hlo[op])]
    g["s"] += s
    g["flops"] += flops[op]
    g["ops"] += 1
  total_flops = sum(flops.values())
  # Tracing costs time per operation, so a traced call takes longer than `wall`: the shares are
  # of the traced calls, and many small operations look costlier than they are.
  print(f"\n{name}: {wall * 1e3:.1f} ms a call; traced, {traced * 1e3:.1f} ms in XLA operations "
        f"(the profiler's own cost included); matmul FLOPs {total_flops / 1e9:.2f} G = "
        f"{total_flops / wall / 1e9:.0f} GFLOP/s over the call, "
        f"{100 * total_flops / wall / peak:.0f}% of the peak")
  print(f"  {'group':<26}{'ops':>5}{'share':>8}{'ms':>9}{'GFLOP/s':>9}{'of peak':>9}")
  for g, v in sorted(groups.items(), key=lambda kv: -kv[1]["s"]):
    rate = v["flops"] / v["s"] / 1e9 if v["flops"] and v["s"] else 0.0
    print(f"  {g:<26}{v['ops']:>5}{100 * v['s'] / traced:>7.0f}%{v['s'] * 1e3:>9.1f}"
          + (f"{rate:>9.0f}{100 * rate * 1e9 / peak:>8.0f}%" if rate else ""))
  rows = sorted(seconds.items(), key=lambda kv: -kv[1])[:top]
  print(f"  slowest {len(rows)}:")
  for op, s in rows:
    i = hlo[op]
    rate = f"{flops[op] / s / 1e9:.0f} GFLOP/s" if flops[op] and s else ""
    print(f"    {s * 1e3:7.2f} ms x{runs[op] // repeats:<3}{group(i):<20}{rate:>13}  {i['shape']:<22} "
          f"[{i['mix']}]  {i['op_name'].split('/')[-1][-40:]}")
  return {"step": name, "wall_s": wall, "traced_s": traced, "matmul_flops": total_flops,
          "fraction_of_peak": total_flops / wall / peak,
          "groups": {g: dict(v) for g, v in groups.items()}}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "..", "configs",
                                                   "tldr_sim.py"))
  ap.add_argument("--steps", default="sft,rm,ppo")
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--top", type=int, default=10)
  ap.add_argument("--json", default="", help="also write the numbers here")
  args = ap.parse_args()

  config = load_config(args.config)
  runtime.apply(config.get("runtime"), config.model.dtype)  # As rlhfjax.main runs.
  cfg = ModelConfig.from_mapping(config.model.to_dict())
  plen, rlen = config.format.prompt_len, config.format.response_len
  rng = np.random.default_rng(0)
  tokens = lambda n, t: rng.integers(4, cfg.vocab_size, (n, t), dtype=np.int32)
  policy, reward = random_models(cfg)
  peak = matmul_peak()
  print(f"model {cfg.variant} d{cfg.d_model} L{cfg.n_layers} V{cfg.vocab_size}, {plen} + {rlen} "
        f"tokens; {jax.devices()[0].device_kind} x{jax.device_count()}; matmul peak "
        f"{peak / 1e9:.0f} GFLOP/s (this run)")
  out = []
  steps = args.steps.split(",")
  if "sft" in steps:
    b = config.sft.batch_size
    tx = optimizer.adamw(config.sft, config.sft.steps)
    batch = {"prompt": tokens(b, plen), "prompt_mask": np.ones((b, plen), bool),
             "response": tokens(b, rlen), "response_mask": np.ones((b, rlen), bool)}
    step = jax.jit(functools.partial(sft.train_step, cfg=cfg, tx=tx))
    out.append(profile(f"SFT step, {b} x {plen + rlen} tokens", step,
                       (TrainState.create(policy, tx), batch, jax.random.key(1)), args.repeats,
                       peak, args.top))
  if "rm" in steps:
    b, c = config.rm.batch_size, config.rm
    tx = optimizer.adamw(c, 125)
    params = dict(reward)
    if c.likelihood_weight:
      params[heads.LIKELIHOOD] = {"weight": jnp.asarray(c.likelihood_weight, jnp.float32)}
    batch = {"prompt": tokens(b, plen), "prompt_mask": np.ones((b, plen), bool),
             **{f"{side}{s}": v for side in ("chosen", "rejected")
                for s, v in (("", tokens(b, rlen)), ("_mask", np.ones((b, rlen), bool)))}}
    step = jax.jit(functools.partial(reward_model.train_step, cfg=cfg, tx=tx))
    out.append(profile(f"reward-model step, {b} pairs x {plen + rlen} tokens", step,
                       (TrainState.create(params, tx), batch), args.repeats, peak, args.top))
  if "ppo" in steps:
    c = config.ppo
    state, step, _, _ = setup("ppo", config, cfg, policy, reward, 0)
    scfg = sampling.SamplingConfig(max_new_tokens=rlen, temperature=c.temperature, eos_id=EOS,
                                   pad_id=0)
    prompts = tokens(c.rollout_batch, plen)
    pmask = np.ones_like(prompts, bool)
    sampled = sampling.sample(policy, prompts, pmask, jax.random.key(2), cfg, scfg)
    batch = {"prompt": prompts, "prompt_mask": pmask, "response": sampled.tokens,
             "response_mask": jnp.arange(rlen)[None] < sampled.lengths[:, None]}
    step = jax.jit(step.__wrapped__)  # The same step without donating the state: it runs again.
    out.append(profile(f"PPO update, {c.rollout_batch} episodes, {c.epochs} epochs of minibatch "
                       f"{c.minibatch_size}", step,
                       (state, policy, reward, batch, jax.random.key(3)), args.repeats, peak,
                       args.top))
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump({"matmul_peak": peak, "steps": out}, f, indent=2)


if __name__ == "__main__":
  main()
