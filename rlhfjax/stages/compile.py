"""task=compile: every step of the pipeline compiled for real TPU slices on a host without a TPU.

  python -m rlhfjax.main --config configs/llama3_8b_tldr.py --config.task=compile \\
      --config.compile.topology=v5p:2x2x2

For each topology in `compile.topology` (comma-separated; see rlhfjax/parallel/tpu.py) the config's
model and mesh are laid on the slice's chips (libtpu gives them; nothing runs) and each step the
pipeline runs — the SFT, reward-model, DPO, SimPO, KTO and PPO update steps, the PPO rollout's
prefill and one decode step with its KV cache, best-of-N scoring, and where `compile.steps` names
them the critic-free updates (`<task>_update` for rloo, grpo, dapo, gspo, reinforce_pp) — is
lowered with the same
shardings as training and compiled by XLA for that TPU. The rollout's steps run in the rollout
layout (parallel/rollout.py, config block `rollout`) chosen as a run on that slice would choose it:
the slice's chips (one ICI domain) as the fast domain, and the chip's HBM less `compile.headroom`
less the training state and the frozen models as the room it has; `rollout_reshard` is the copy of
the policy into it, once per iteration (cast and resharding compiled as one program; none with
`rollout.mesh='train'`, which samples from the trainer's layout and float32 weights). The decode
step is the one of the last cache block (`rollout.cache_block`): it reads the most cache slots.
Each step holds what a run of the config trains: with a `lora` block, the adapters and their AdamW
moments beside the frozen base, and no reference tree where the policy's own base is the reference
(the planner's `plan` and the analytic FLOPs still count full fine-tuning). One row per step:

- per-chip bytes from XLA's `memory_analysis()`: arguments, temporaries, outputs (less what is
  donated), plus what stays resident in HBM while the step runs without being its argument (during
  rollout: the training state, the reference and reward models), against the chip's HBM less
  `compile.headroom`: fits or not;
- the planner's estimate (`stages/memory.py`) beside it;
- the collectives of the compiled program, counted from its HLO (`collectives`): number and
  result bytes per chip of its all-gathers, all-reduces, reduce-scatters, all-to-alls and
  collective-permutes;
- model FLOPs counted analytically (`models/flops.py`; XLA's cost analysis sees one layer of the
  scan), hardware FLOPs (plus what each trained model's remat policy recomputes: the whole
  forward of its layers for "full", their attention score matmuls for "dots" and "offload";
  `model.remat` and the `remat` block), and a roofline time: the largest of FLOPs / peak,
  HBM bytes / HBM bandwidth and ICI bytes / ICI bandwidth (below), whence MFU
  (model FLOPs / (chips x peak x time)) and tokens/s; for the decode step also its HBM roofline
  (the weights in the compute dtype and the filled cache, read once per token) and the ratio of
  its time to it;
- compile seconds.

"ppo (whole step)" = prefill + reshard + response_len - 1 decode steps (each block's steps reading
the slots that block reads) + update. With `mesh.auto` the (data, fsdp, tensor) shapes of the
slice are ranked by the planner and the best `compile.auto_candidates` compiled; the fitting one
with the shortest estimated time wins. Writes `<workdir>/compile/<topology>.json` and `.md`.

ICI traffic (bytes each chip receives) is counted from the compiled HLO: per collective, from its
result bytes and replica group of n chips, ring algorithms: all-gather and all-to-all (n-1)/n of
the result, all-reduce 2(n-1)/n, reduce-scatter (n-1) times, collective-permute the result; a
while loop's collectives count its trip count times. Only a step XLA refuses (out of memory) falls
back to the model: with fsdp=f, each pass gathers (f-1)/f of the weights and the gradients are
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
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding

from rlhfjax.algorithms import dpo
from rlhfjax.algorithms import grpo
from rlhfjax.algorithms import kto
from rlhfjax.algorithms import online
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
from rlhfjax.models import sampling
from rlhfjax.models import sharding_rules
from rlhfjax.models import transformer
from rlhfjax.parallel.mesh import AXES
from rlhfjax.parallel.mesh import mesh_shape
from rlhfjax.parallel import rollout
from rlhfjax.parallel.sharding import Parallel
from rlhfjax.parallel import tpu
from rlhfjax.stages import memory
from rlhfjax.training import experiment
from rlhfjax.training import loaders
from rlhfjax.training import metrics
from rlhfjax.training import optimizer
from rlhfjax.training.state import TrainState

# XLA's out-of-memory message: "... HLO temporaries (492.77G) exceeds available HBM (15.75G)".
_OOM_TEMPS = re.compile(r"temporaries \(([\d.]+)([KMGT])\)")
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# The critic-free online methods whose update (experience and minibatch passes) compiles as
# `<task>_update`; dapo and gspo are grpo.py under their own blocks.
CRITIC_FREE = {"rloo": rloo, "grpo": grpo, "dapo": grpo, "gspo": grpo, "dr_grpo": grpo, "reinforce_pp": reinforce_pp}
STEPS = ("sft", "rm", "dpo", "simpo", "kto", "ppo_prefill", "ppo_decode", "ppo_update",
         *(f"{task}_update" for task in CRITIC_FREE), "best_of_n_score")
WHOLE_PPO = "ppo (whole step)"
RESHARD = "rollout_reshard"  # With the rollout steps where the rollout's layout is another.
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")

# Compiled HLO text: an instruction `%name = <result shape(s)> <collective>[-start|-done](...)`, a
# computation's header `[ENTRY] %name (params) -> result {`, the computations an instruction calls.
_OP = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = ([^%=]+?) (" + "|".join(COLLECTIVES)
                 + r")(-start|-done)?\((.*)$")
_SHAPE = re.compile(r"\b([a-z][a-z0-9]*)\[([\d,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+) .*\{\s*$")
_CALLS = re.compile(r"\b(?:calls|to_apply|body|condition)=%?([\w.\-]+)")
_CALL_LISTS = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_CONDITION = re.compile(r"\bcondition=%?([\w.\-]+)")
_INT = re.compile(r"= [su](?:32|64)\[\][^ ]* constant\((\d+)\)")
_CHANNEL = re.compile(r"\bchannel_id=(\d+)")
_GROUPS_MESH = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}")
_GROUPS_IOTA = re.compile(r"replica_groups=\[([\d,]+)\]<=")
_GROUPS_LIST = re.compile(r"replica_groups=\{\{([\d,]*)\}")


@dataclasses.dataclass
class Step:
  """One jitted step with abstract (sharded) arguments, and what it computes."""
  name: str
  fn: Callable  # Parallel.jit(...): has .lower(*args).
  args: tuple
  model_flops: float  # Analytic, the whole slice.
  hardware_flops: float  # Plus rematerialisation.
  tokens: int  # Tokens the step processes (new tokens for a decode step).
  weight_passes: dict[str, tuple[int, bool]]  # Model -> (passes over its weights, trained).
  plan_bytes: int  # The planner's per-chip estimate (memory.plan), less `resident`.
  resident: int = 0  # Per-chip bytes held in HBM while it runs that are not its arguments.
  mesh: Mesh | None = None  # The mesh it runs on (the rollout's); None: the trainer's.
  layout: dict | None = None  # The rollout layout it runs in (shape, dtype, why).
  # A decode step: the per-chip bytes one token must read of the weights (compute dtype) and of
  # one cache slot (every layer's key and value), the slots its attention reads, and its HBM
  # traffic (weights, the slots read, one slot written, logits in and out).
  weights: float = 0.0
  kv_slot: float = 0.0
  cache_read: int = 0
  hbm_bytes: float | None = None


def model_config(config: Any) -> ModelConfig:
  """The model of a config: its `model` block, or the architecture a pretrained `init_from` names
  (only its shapes are needed here)."""
  return pretrained.block_config(config.model.to_dict())


def _experiment(config: Any, cfg: ModelConfig, par: Parallel) -> experiment.Experiment:
  """The parts of an Experiment the algorithms' state templates read (no data, no tokenizer): the
  model, the mesh and the `lora` block, so each step holds the adapters and optimizer state a run
  of this config trains with."""
  return experiment.Experiment(config, "", {}, None, cfg, par, "",
                               lora.from_config(config.get("lora")))


def _key(par: Parallel) -> jax.ShapeDtypeStruct:
  key = jax.eval_shape(lambda: jax.random.key(0))
  return jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=par.replicated)


def _policy_state(exp: experiment.Experiment, cfg: ModelConfig, par: Parallel,
                  tx: Any, role: str) -> tuple[TrainState, Any]:
  """The abstract train state of a policy trained as `role` (of lora.MODELS), with the adapters
  and the optimizer state the `lora` block gives it, and its shardings."""
  make = lambda k: TrainState.create(lora.adapt(k, transformer.init(k, cfg), exp.lora, role), tx)
  return par.train_state(make, lora.model_axes(transformer.param_axes(cfg), exp.lora, role), tx,
                         jax.random.key(0), abstract=True)


def _tokens(par: Parallel, batch: int, names: dict[str, int]) -> dict[str, jax.ShapeDtypeStruct]:
  """Abstract token batches `name: [batch, length]` with their masks, split over the data axes."""
  out = {}
  for name, length in names.items():
    out[name] = jax.ShapeDtypeStruct((batch, length), jnp.int32, sharding=par.batch)
    out[f"{name}_mask"] = jax.ShapeDtypeStruct((batch, length), jnp.bool_, sharding=par.batch)
  return out


def _frozen(par: Parallel, tree: Any, dtype: str) -> Any:
  """Abstract frozen parameters as `ppo.frozen` casts them, on their shardings."""
  return par.abstract(jax.eval_shape(lambda t: ppo.frozen(t, dtype), tree),
                      jax.tree.map(lambda x: x.sharding, tree))


def _per_chip(tree: Any) -> int:
  """Bytes of an abstract sharded tree on one chip."""
  total = 0
  for x in jax.tree.leaves(tree):
    shard = x.sharding.shard_shape(x.shape)
    total += math.prod(shard) * x.dtype.itemsize
  return total


def _shape_bytes(text: str) -> float:
  """Bytes of the array shapes in `text` (`bf16[4096,14336]{1,0}`; a tuple counts every one)."""
  total = 0.0
  for dtype, dims in _SHAPE.findall(text):
    digits = re.search(r"\d+", dtype)
    bits = int(digits.group()) if digits else 8 if dtype == "pred" else 0
    total += math.prod(int(d) for d in dims.split(",") if d) * bits / 8
  return total


def _group_size(text: str, devices: int) -> int:
  """Chips in each replica group of a collective (all `devices` where the text does not say)."""
  if m := _GROUPS_MESH.search(text):
    sizes = dict(re.findall(r"'(\w+)'=(\d+)", m.group(1)))
    return math.prod(int(sizes[a]) for a in re.findall(r"'(\w+)'", m.group(2)))
  if m := _GROUPS_IOTA.search(text):
    return int(m.group(1).split(",")[-1])
  if m := _GROUPS_LIST.search(text):
    return len(m.group(1).split(","))
  return devices


def _received(kind: str, result: float, n: int) -> float:
  """Bytes a chip receives in one collective with `result` bytes per chip over `n` chips (ring)."""
  if kind == "all-reduce":
    return 2 * result * (n - 1) / n
  if kind == "reduce-scatter":
    return result * (n - 1)
  if kind == "collective-permute":
    return result
  return result * (n - 1) / n  # all-gather, all-to-all.


def collectives(hlo: str, devices: int = 1) -> dict:
  """The collectives one run of a compiled program (`compiled.as_text()`) executes on a chip:
  per kind, their number, the bytes of their results and the largest result, and the bytes the
  chip receives in all of them (`received`). An async pair counts once (its `-start`; the
  `-done`'s result gives the bytes); one collective (one channel id) that the TPU compiler
  copies into several fusions counts once; a while loop's body counts its trip count times:
  XLA's known_trip_count, or else the bound its condition compares the counter with (the
  largest integer constant there: a scan from 0)."""
  ops: dict[str, list[dict]] = {}  # Computation -> its collectives.
  calls: dict[str, list[tuple[str, Any]]] = {}  # Computation -> (callee, times or condition).
  bounds: dict[str, int] = {}  # Computation -> its largest integer scalar constant.
  entry = current = ""
  for line in hlo.splitlines():
    if not line.startswith((" ", "\t")):
      if m := _HEADER.match(line):
        current = m.group(2)
        ops[current], calls[current] = [], []
        entry = current if m.group(1) else entry
      continue
    if not current:
      continue
    if const := _INT.search(line):
      bounds[current] = max(bounds.get(current, 0), int(const.group(1)))
    trip: Any = 1
    if " while(" in line:
      known, cond = _TRIP.search(line), _CONDITION.search(line)
      trip = int(known.group(1)) if known else cond.group(1) if cond else 1
    calls[current] += [(c, trip) for c in _CALLS.findall(line)]
    for group in _CALL_LISTS.findall(line):
      calls[current] += [(c.strip().lstrip("%"), 1) for c in group.split(",") if c.strip()]
    if not (m := _OP.match(line)):
      continue
    name, shape, kind, phase, rest = m.groups()
    if phase == "-done":  # The result of the `-start` it names.
      start = re.search(r"%([\w.\-]+)", rest)
      for op in ops[current]:
        if start and op["name"] == start.group(1):
          op["bytes"] = _shape_bytes(shape)
      continue
    channel = _CHANNEL.search(rest)
    ops[current].append({"name": name, "kind": kind, "bytes": _shape_bytes(shape),
                         "key": channel.group(1) if channel else (current, name),
                         "group": _group_size(rest, devices)})
  times: dict[Any, tuple[dict, int]] = {}
  seen = set()

  def visit(comp: str, n: int) -> None:
    if (comp, n) in seen:
      return
    seen.add((comp, n))
    for op in ops.get(comp, []):
      if n > times.get(op["key"], (op, 0))[1]:
        times[op["key"]] = (op, n)
    for callee, trip in calls.get(comp, []):
      visit(callee, n * (trip if isinstance(trip, int) else max(bounds.get(trip, 1), 1)))

  visit(entry, 1)
  out = {k: {"count": 0, "bytes": 0.0, "largest": 0.0} for k in COLLECTIVES}
  received = 0.0
  for op, n in times.values():
    row = out[op["kind"]]
    row["count"] += n
    row["bytes"] += n * op["bytes"]
    row["largest"] = max(row["largest"], op["bytes"])
    received += n * _received(op["kind"], op["bytes"], op["group"])
  return {"ops": out, "received": received}


def _recomputed(cfg: ModelConfig, batch: int, tokens: int) -> float:
  """FLOPs the backward pass of one training pass over `batch` sequences of `tokens` recomputes
  under `cfg.remat`: every layer's forward ("full"), only the attention score matmuls ("dots",
  "offload": batched over heads, they are not among the saved matmul outputs; element-wise work
  is not counted), nothing ("none"). The LM head lies outside the rematerialised layers."""
  if cfg.remat == "none":
    return 0.0
  layers = flops.forward(cfg, batch, tokens, logit_tokens=0)
  if cfg.remat == "full":
    return layers
  return layers - 2 * batch * tokens * cfg.n_layers * flops.layer_matmul_params(cfg)


def steps(config: Any, cfg: ModelConfig, par: Parallel, names: Sequence[str] = STEPS, *,
          fast_domain: int = 1, hbm_usable: float | None = None) -> list[Step]:
  """The pipeline's steps for `cfg` on `par`'s mesh, with abstract arguments. The rollout's
  (prefill, decode and the copy into its layout) run in the layout `rollout.choose` picks for a
  slice whose `fast_domain` chips share the fast interconnect, with `hbm_usable` bytes per chip
  (None: unlimited)."""
  fmt = config.format
  p_len, r_len = fmt.prompt_len, fmt.response_len
  seq = p_len + r_len
  exp = _experiment(config, cfg, par)
  key = _key(par)
  likelihood = bool(config.rm.likelihood_weight)
  lm_rm = r_len if likelihood else 0  # The reward model takes logits only with its likelihood term.
  frozen = config.ppo.frozen_dtype
  rm_params = loaders.reward_model_template(exp)
  out: list[Step] = []

  def plan(batch: int, logit_tokens: int, tokens: int = seq, model: ModelConfig = cfg) -> dict:
    return memory.plan(model, par.mesh, batch, tokens, logit_tokens=logit_tokens)

  if "sft" in names:
    c = config.sft
    par.check_batch("sft.batch_size", c.batch_size)
    tx = optimizer.adamw(c, c.steps, exp.trainable("sft"))
    state, sh = _policy_state(exp, cfg, par, tx, "sft")
    trained = exp.model_for("sft")
    fn = par.jit(functools.partial(sft.train_step, cfg=trained, tx=tx),
                 (sh, par.batch, par.replicated), (sh, par.replicated), (0,))
    f = flops.training(cfg, c.batch_size, seq, logit_tokens=r_len)
    out.append(Step("sft", fn, (state, _tokens(par, c.batch_size, {"prompt": p_len,
                                                                    "response": r_len}), key),
                    f, f + _recomputed(trained, c.batch_size, seq), c.batch_size * seq,
                    {"policy": (3, True)}, plan(c.batch_size, r_len, model=trained)["train_step"]))
  if "rm" in names:
    c = config.rm
    par.check_batch("rm.batch_size", c.batch_size)
    tx = optimizer.adamw(c, 1000, exp.trainable("rm"))
    axes = loaders.reward_model_axes(exp)
    axes = {**axes, "backbone": lora.model_axes(axes["backbone"], exp.lora, "rm")}
    adapt = lambda p: {**p, "backbone": lora.adapt(jax.random.key(0), p["backbone"], exp.lora,
                                                   "rm")}
    state, sh = par.train_state(lambda p: TrainState.create(adapt(p), tx), axes, tx, rm_params,
                                abstract=True)
    trained = exp.model_for("rm")
    fn = par.jit(functools.partial(reward_model.train_step, cfg=trained, tx=tx), (sh, par.batch),
                 (sh, par.replicated), (0,))
    batch = _tokens(par, c.batch_size, {"prompt": p_len, "chosen": r_len, "rejected": r_len})
    f = flops.training(cfg, 2 * c.batch_size, seq, logit_tokens=lm_rm)
    out.append(Step("rm", fn, (state, batch), f, f + _recomputed(trained, 2 * c.batch_size, seq),
                    2 * c.batch_size * seq, {"reward": (3, True)},
                    plan(2 * c.batch_size, lm_rm, model=trained)["train_step"]))
  for task in ("dpo", "simpo"):  # One module, two config blocks; SimPO has no reference.
    if task not in names:
      continue
    c = config[task]
    par.check_batch(f"{task}.batch_size", c.batch_size)
    tx = optimizer.adamw(c, 1000, exp.trainable("policy"))
    state, sh = _policy_state(exp, cfg, par, tx, "policy")
    trained = exp.model_for("policy")
    with_ref = c.loss_type in dpo.REFERENCE_LOSSES
    # A LoRA policy's reference is its own base (no tree of its own), as dpo.train runs it.
    ref_tree = with_ref and not exp.lora.applies_to("policy")
    fn = par.jit(functools.partial(dpo.train_step, cfg=trained, c=c, tx=tx),
                 (sh, sh.params if ref_tree else None, par.batch), (sh, par.replicated), (0,))
    batch = _tokens(par, c.batch_size, {"prompt": p_len, "chosen": r_len, "rejected": r_len})
    train = flops.training(cfg, 2 * c.batch_size, seq, logit_tokens=r_len)
    ref = flops.forward(cfg, 2 * c.batch_size, seq, logit_tokens=r_len) if with_ref else 0.0
    passes = {"policy": (3, True), **({"reference": (1, False)} if with_ref else {})}
    out.append(Step(task, fn, (state, state.params if ref_tree else None, batch), train + ref,
                    train + ref + _recomputed(trained, 2 * c.batch_size, seq),
                    2 * c.batch_size * seq, passes,
                    plan(2 * c.batch_size, r_len, model=trained)["train_step"]
                    + (_per_chip(state.params) if ref_tree else 0)))
  if "kto" in names:  # The policy trains on the matched rows; both models read the mismatched.
    c = config.kto
    par.check_batch("kto.batch_size", c.batch_size)
    tx = optimizer.adamw(c, 1000, exp.trainable("policy"))
    state, sh = _policy_state(exp, cfg, par, tx, "policy")
    trained = exp.model_for("policy")
    ref_tree = not exp.lora.applies_to("policy")
    fn = par.jit(functools.partial(kto.train_step, cfg=trained, c=c, tx=tx),
                 (sh, sh.params if ref_tree else None, par.batch), (sh, par.replicated), (0,))
    batch = {**_tokens(par, c.batch_size, {"prompt": p_len, "response": r_len}),
             "label": jax.ShapeDtypeStruct((c.batch_size,), jnp.bool_, sharding=par.batch)}
    train = flops.training(cfg, c.batch_size, seq, logit_tokens=r_len)
    forwards = flops.forward(cfg, 3 * c.batch_size, seq, logit_tokens=r_len)
    out.append(Step("kto", fn, (state, state.params if ref_tree else None, batch),
                    train + forwards, train + forwards + _recomputed(trained, c.batch_size, seq),
                    2 * c.batch_size * seq, {"policy": (4, True), "reference": (1, False)},
                    plan(c.batch_size, r_len, model=trained)["train_step"]
                    + (_per_chip(state.params) if ref_tree else 0)))

  c = config.ppo
  ppo_names = {"ppo_prefill", "ppo_decode", "ppo_update"} & set(names)
  if ppo_names:
    ppo.check_config(c)
    par.check_batch("ppo.rollout_batch", c.rollout_batch)
    tx = ppo.adamw(c, exp.trainable("policy", "value"))
    policy_abstract = jax.eval_shape(lambda: transformer.init(jax.random.key(0), cfg))
    state, sh = par.train_state(functools.partial(ppo.init_state, exp, lcfg=exp.lora),
                                ppo.param_axes(cfg, c.value_model, exp.lora), tx, policy_abstract,
                                rm_params, abstract=True)
    trunk = c.value_model == "policy_trunk"  # The value head reads the policy's hidden states.
    # A LoRA policy's reference is its own base, adapters off (ppo.train): no tree of its own.
    ref = (None if exp.lora.applies_to("policy")
           else _frozen(par, state.params["policy"], frozen))
    reward = _frozen(par, rm_params, frozen)
    b = c.rollout_batch
    everything = _per_chip((state, ref, reward))
  if "ppo_prefill" in ppo_names or "ppo_decode" in ppo_names:
    # The rollout layout, chosen beside what stays resident: the training state, the frozen models.
    layout = rollout.choose(config.get("rollout", {}), cfg, dict(par.mesh.shape), platform="tpu",
                            fast_domain=fast_domain, rows=b, length=seq,
                            free_bytes=None if hbm_usable is None else hbm_usable - everything)
    rpar = Parallel(rollout.mesh(layout, par.mesh))
    trainer = state.params["policy"]
    cast = functools.partial(rollout.cast, dtype=layout.dtype)
    policy_axes = lora.model_axes(transformer.param_axes(cfg), exp.lora, "policy")
    policy = rpar.abstract(jax.eval_shape(cast, trainer),
                           rollout.shardings(policy_axes, trainer, rpar.mesh))
    policy_sh = jax.tree.map(lambda x: x.sharding, policy)
    # The trainer's own layout (rollout.mesh='train') samples from its weights: no copy.
    same = all(a.dtype == r.dtype and a.sharding == r.sharding
               for a, r in zip(jax.tree.leaves(trainer), jax.tree.leaves(policy)))
    resident = everything - (_per_chip(trainer) if same else 0)
    where = {**layout.shape, "dtype": layout.dtype, "reason": layout.reason}
    cache = jax.eval_shape(lambda: transformer.init_cache(cfg, b, seq))
    cache_sh = _cache_shardings(rpar, cache)
    logits_sh = NamedSharding(rpar.mesh, sharding_rules.spec(("batch", "vocab"),
                                                             (b, cfg.vocab_size), rpar.mesh))
    if not same:  # Once per rollout: cast where the weights lie, then XLA's resharding.
      fn = jax.jit(cast, in_shardings=(sh.params["policy"],), out_shardings=policy_sh)
      out.append(Step(RESHARD, fn, (trainer,), 0.0, 0.0, 0, {}, _per_chip(policy), everything,
                      rpar.mesh, where))
  if "ppo_prefill" in ppo_names:
    fn = rpar.jit(functools.partial(sampling.prefill, cfg=cfg, max_new_tokens=r_len),
                  (policy_sh, rpar.batch, rpar.batch), (cache_sh, logits_sh))
    prompts = _tokens(rpar, b, {"prompt": p_len})
    f = flops.forward(cfg, b, p_len, logit_tokens=1)
    # The prompt's keys and values of every layer, then the padded cache built from them.
    planned = plan(b, 1, p_len)["forward_step"] + 2 * plan(b, 1)["kv_cache"]
    out.append(Step("ppo_prefill", fn, (policy, prompts["prompt"], prompts["prompt_mask"]), f, f,
                    b * p_len, {"policy": (1, False)}, planned, resident, rpar.mesh, where))
  if "ppo_decode" in ppo_names:
    # Token ids only enter as values: any eos/pad compiles to the same program. The step of the
    # last cache block: it reads the most slots (the worst case; `whole_ppo` scales the others).
    scfg = sampling.SamplingConfig(max_new_tokens=r_len, eos_id=2, pad_id=0,
                                   temperature=c.temperature)
    read = 0  # The last block reads every slot (sampling.blocks).
    rows = NamedSharding(rpar.mesh, sharding_rules.spec(("batch",), (b,), rpar.mesh))
    fn = rpar.jit(functools.partial(sampling.decode_step, cfg=cfg, scfg=scfg, prompt_len=p_len,
                                    cache_read=read),
                  (policy_sh, cache_sh, logits_sh, rows, rpar.replicated, rpar.replicated, rows),
                  (cache_sh, logits_sh, rows, (rows, rows, rows)), (1,))
    abstract = lambda shape, dtype, s: jax.ShapeDtypeStruct(shape, dtype, sharding=s)
    kv = rpar.abstract(cache, cache_sh)
    logits = abstract((b, cfg.vocab_size), jnp.float32, logits_sh)
    args = (policy, kv, logits, abstract((b,), jnp.bool_, rows),
            abstract((), jnp.int32, rpar.replicated), _key(rpar),
            abstract((b,), jnp.int32, rows))
    f = flops.forward(cfg, b, 1, keys=read or seq)
    planned = plan(b, 1)
    # Weights as the matmuls read them; under fsdp they are gathered, written and read again.
    weights = rollout.weight_bytes(cfg, layout.tensor, cfg.dtype)
    kv_slot = _per_chip({"k": kv["k"], "v": kv["v"]}) / seq
    hbm = (_per_chip(policy) + (2 * weights if layout.fsdp > 1 else 0)
           + kv_slot * ((read or seq) + 1) + 2 * _per_chip(logits))
    out.append(Step("ppo_decode", fn, args, f, f, b, {"policy": (1, False)},
                    planned["params"] + planned["kv_cache"], resident, rpar.mesh, where,
                    weights, kv_slot, read or seq, hbm))
  if "ppo_update" in ppo_names:
    policy_cfg, value_cfg = exp.model_for("policy"), exp.model_for("value")
    fn = par.jit(functools.partial(ppo.train_step, cfg=policy_cfg, c=c, tx=tx, eos_id=2,
                                   value_cfg=value_cfg),
                 (sh, None if ref is None else jax.tree.map(lambda x: x.sharding, ref),
                  jax.tree.map(lambda x: x.sharding, reward), par.batch, par.replicated),
                 (sh, par.replicated), (0,))
    batch = _tokens(par, b, {"prompt": p_len, "response": r_len})
    # Experience: policy, reference, value and reward forward; then `epochs` passes of policy and
    # value training over the whole rollout.
    policy_fwd = flops.forward(cfg, b, seq, logit_tokens=r_len)
    value_fwd = 0.0 if trunk else flops.forward(cfg, b, seq, logit_tokens=0)
    reward_fwd = flops.forward(cfg, b, seq, logit_tokens=lm_rm)
    train = c.epochs * 3 * (policy_fwd + value_fwd)
    f = 2 * policy_fwd + value_fwd + reward_fwd + train
    # Policy and value (one backbone with the trunk option) with their optimizer state, the frozen
    # models, and the larger of the experience's forward passes over the rollout and a
    # minibatch's training.
    update, experience = plan(c.minibatch_size, r_len, model=policy_cfg), plan(b, r_len)
    planned = ((1 if trunk else 2) * (update["train_step"] - update["activations"])
               + _per_chip((ref, reward))
               + max(update["activations"], experience["forward_step"] - experience["params"]))
    passes = {"policy": (1 + 3 * c.epochs, True), "reference": (1, False), "reward": (1, False)}
    if not trunk:
      passes["value"] = (1 + 3 * c.epochs, True)
    recomputed = c.epochs * (_recomputed(policy_cfg, b, seq)
                             + (0.0 if trunk else _recomputed(value_cfg, b, seq)))
    out.append(Step("ppo_update", fn, (state, ref, reward, batch, key), f, f + recomputed,
                    b * seq * (1 + c.epochs), passes, planned))
  for task, module in CRITIC_FREE.items():
    if f"{task}_update" not in names:
      continue
    c = config[task]
    par.check_batch(f"{task}.rollout_batch", c.rollout_batch)
    b = c.rollout_batch
    tx = online.adamw(c, online.minibatch_updates_per_step(c), exp.trainable("policy"))
    policy_axes = lora.model_axes(transformer.param_axes(cfg), exp.lora, "policy")
    state, sh = par.train_state(
        lambda k: TrainState.create(
            {"policy": lora.adapt(k, transformer.init(k, cfg), exp.lora, "policy")}, tx),
        {"policy": policy_axes}, tx, jax.random.key(0), abstract=True)
    policy_cfg = exp.model_for("policy")
    # A LoRA policy's reference is its own base (online.train): no tree of its own.
    ref = None if exp.lora.applies_to("policy") else state.params["policy"]
    ref_sh = None if ref is None else sh.params["policy"]
    rm_sh = jax.tree.map(lambda x: x.sharding, rm_params)
    fn = par.jit(functools.partial(module.train_step, cfg=policy_cfg, c=c, tx=tx, eos_id=2),
                 (sh, ref_sh, rm_sh, par.batch, par.replicated), (sh, par.replicated), (0,))
    batch = {**_tokens(par, b, {"prompt": p_len, "response": r_len}),
             "sampler_logprobs": jax.ShapeDtypeStruct((b, r_len), jnp.float32, sharding=par.batch)}
    # Experience: policy, reference and reward forward over the rollout; then `epochs` passes of
    # policy training over it (each prompt counted once per row: an upper bound with share_prompt).
    policy_fwd = flops.forward(cfg, b, seq, logit_tokens=r_len)
    f = 2 * policy_fwd + flops.forward(cfg, b, seq, logit_tokens=lm_rm) + c.epochs * 3 * policy_fwd
    update, experience = plan(c.minibatch_size, r_len, model=policy_cfg), plan(b, r_len)
    planned = (update["train_step"] - update["activations"] + _per_chip((ref, rm_params))
               + max(update["activations"], experience["forward_step"] - experience["params"]))
    out.append(Step(f"{task}_update", fn, (state, ref, rm_params, batch, key),
                    f, f + c.epochs * _recomputed(policy_cfg, b, seq), b * seq * (1 + c.epochs),
                    {"policy": (1 + 3 * c.epochs, True), "reference": (1, False),
                     "reward": (1, False)}, planned))
  if "best_of_n_score" in names:
    b = config.rm.eval_batch_size
    par.check_batch("rm.eval_batch_size", b)
    rm_sh = jax.tree.map(lambda x: x.sharding, rm_params)
    fn = par.jit(functools.partial(reward_model.score, cfg=cfg), (rm_sh, par.batch), par.batch)
    f = flops.forward(cfg, b, seq, logit_tokens=lm_rm)
    out.append(Step("best_of_n_score", fn,
                    (rm_params, _tokens(par, b, {"prompt": p_len, "response": r_len})), f, f,
                    b * seq, {"reward": (1, False)}, plan(b, lm_rm)["forward_step"]))
  return out


def _cache_shardings(par: Parallel, cache: Any) -> Any:
  """KV cache: [B, kv_heads, length, Dh] per layer split by batch and kv heads; mask by batch."""
  def one(x):
    axes = ("batch", "kv_heads", "length", "head_dim") if x.ndim == 4 else ("batch", "length")
    return NamedSharding(par.mesh, sharding_rules.spec(axes, x.shape, par.mesh))
  return jax.tree.map(one, cache)


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
    counted = collectives(compiled.as_text(), mesh.size)
  except jax.errors.JaxRuntimeError as e:  # XLA refuses a program that exceeds the chip's HBM.
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    error = str(e).strip().splitlines()[0]
    found = _OOM_TEMPS.search(error)
    args, outs, alias = _per_chip(step.args), 0, 0
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
  d, b = rows["ppo_decode"], config.ppo.rollout_batch
  block = int(config.get("rollout", {}).get("cache_block", 0))
  decode_s = roofline_s = 0.0
  for start, end, read in sampling.blocks(p_len, r_len, block):
    read = read or p_len + r_len
    hbm = d["hbm_bytes"] + d["kv_slot_bytes"] * (read - d["cache_read"])
    decode_s += (end - start) * max(d["compute_s"], hbm / chip.hbm_bandwidth, d["ici_s"])
    filled = (end - start) * (p_len + (start + end + 1) / 2)  # Slots p_len + i + 1 summed.
    roofline_s += ((end - start) * d["weights_bytes"] + d["kv_slot_bytes"] * filled)
  roofline_s /= chip.hbm_bandwidth
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
  if config.mesh.get("auto", False):
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
          "candidates": candidates}


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
    table = format_report(report)
    metrics.info(table + "\n")
    name = topology.replace(":", "_")
    experiment.write_json(os.path.join(out_dir, f"{name}.json"), report)
    experiment.write_text(os.path.join(out_dir, f"{name}.md"), table + "\n")
    reports[topology] = report
  return reports
