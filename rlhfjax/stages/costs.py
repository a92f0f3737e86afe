"""What each method's update step computes, for task=compile's rows: model FLOPs (analytic, the
whole slice), hardware FLOPs (plus what the trained models' remat policies recompute), the tokens
it processes, the passes over each model's weights and the planner's per-chip bytes. The step
itself, its arguments and its state come from the method's builder (`program(exp)`); this is the
arithmetic beside it, one function per step, looked up in `COSTS`, and `Step`, the step and
its costs together as task=compile lowers and compiles it."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
from jax.sharding import Mesh

from rlhfjax.algorithms import dpo
from rlhfjax.models.config import ModelConfig
from rlhfjax.models import flops
from rlhfjax.models import sampling
from rlhfjax.stages import memory
from rlhfjax.training import experiment
from rlhfjax.training.program import Program


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


def per_chip(tree: Any) -> int:
  """Bytes of an abstract sharded tree on one chip (None: 0)."""
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
             for x in jax.tree.leaves(tree))


def recomputed(cfg: ModelConfig, batch: int, tokens: int) -> float:
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


def _shape(exp: experiment.Experiment) -> tuple[int, int, int, int]:
  """(prompt, response, sequence length, logit tokens of the reward model: only with its
  likelihood term)."""
  p, r = exp.config.format.prompt_len, exp.config.format.response_len
  return p, r, p + r, r if exp.config.rm.likelihood_weight else 0


def _plan(exp: experiment.Experiment, role: str, batch: int, logit_tokens: int) -> dict:
  return memory.plan(exp.model_for(role), exp.parallel.mesh, batch, _shape(exp)[2],
                     logit_tokens=logit_tokens)


def _trained(exp: experiment.Experiment, role: str, batch: int, logit_tokens: int,
             passes: dict, forwards: float = 0.0, held: int = 0) -> dict:
  """One training pass of `role` over `batch` sequences plus `forwards` FLOPs of frozen passes,
  and `held` bytes of frozen trees beside the plan's training step."""
  seq = _shape(exp)[2]
  f = flops.training(exp.model, batch, seq, logit_tokens=logit_tokens) + forwards
  return {"model_flops": f, "hardware_flops": f + recomputed(exp.model_for(role), batch, seq),
          "tokens": batch * seq, "weight_passes": passes,
          "plan_bytes": _plan(exp, role, batch, logit_tokens)["train_step"] + held}


def sft(exp: experiment.Experiment, prog: Program) -> dict:
  return _trained(exp, "sft", exp.config.sft.batch_size, _shape(exp)[1], {"policy": (3, True)})


def rm(exp: experiment.Experiment, prog: Program) -> dict:
  return _trained(exp, "rm", 2 * exp.config.rm.batch_size, _shape(exp)[3], {"reward": (3, True)})


def preference(task: str) -> Callable[[experiment.Experiment, Program], dict]:
  """DPO or SimPO (one module, two blocks): chosen and rejected through the policy, and through
  the reference where the loss reads one."""
  def cost(exp: experiment.Experiment, prog: Program) -> dict:
    c, (_, r, seq, _) = exp.config[task], _shape(exp)
    with_ref = c.loss_type in dpo.REFERENCE_LOSSES
    ref = flops.forward(exp.model, 2 * c.batch_size, seq, logit_tokens=r) if with_ref else 0.0
    passes = {"policy": (3, True), **({"reference": (1, False)} if with_ref else {})}
    return _trained(exp, "policy", 2 * c.batch_size, r, passes, ref, per_chip(prog.args[1]))
  return cost


def kto(exp: experiment.Experiment, prog: Program) -> dict:
  """The policy trains on the matched rows; both models read the mismatched."""
  b, (_, r, seq, _) = exp.config.kto.batch_size, _shape(exp)
  out = _trained(exp, "policy", b, r, {"policy": (4, True), "reference": (1, False)},
                 flops.forward(exp.model, 3 * b, seq, logit_tokens=r), per_chip(prog.args[1]))
  return {**out, "tokens": 2 * b * seq}


def online_update(task: str) -> Callable[[experiment.Experiment, Program], dict]:
  """PPO or a critic-free method: experience (policy, reference, value and reward forward over the
  rollout), then `epochs` passes of policy (and value) training over it (each prompt counted once
  per row: an upper bound with share_prompt). Planned: the trained models with their optimizer
  state, the frozen trees, and the larger of the experience's forwards and a minibatch's
  training."""
  def cost(exp: experiment.Experiment, prog: Program) -> dict:
    c, cfg, (_, r, seq, lm_rm) = exp.config[task], exp.model, _shape(exp)
    b, trunk = c.rollout_batch, task != "ppo" or c.value_model == "policy_trunk"
    policy_fwd = flops.forward(cfg, b, seq, logit_tokens=r)
    value_fwd = 0.0 if trunk else flops.forward(cfg, b, seq, logit_tokens=0)
    f = (2 * policy_fwd + value_fwd + flops.forward(cfg, b, seq, logit_tokens=lm_rm)
         + c.epochs * 3 * (policy_fwd + value_fwd))
    roles = ("policy",) if trunk else ("policy", "value")
    hardware = f + c.epochs * sum(recomputed(exp.model_for(m), b, seq) for m in roles)
    update = _plan(exp, "policy", c.minibatch_size, r)
    experience = memory.plan(cfg, exp.parallel.mesh, b, seq, logit_tokens=r)
    planned = (len(roles) * (update["train_step"] - update["activations"])
               + per_chip(prog.args[1:3])
               + max(update["activations"], experience["forward_step"] - experience["params"]))
    passes = {m: (1 + 3 * c.epochs, True) for m in roles}
    return {"model_flops": f, "hardware_flops": hardware, "tokens": b * seq * (1 + c.epochs),
            "weight_passes": {**passes, "reference": (1, False), "reward": (1, False)},
            "plan_bytes": planned}
  return cost


# Step name -> its cost; the critic-free updates are `<task>_update` (compile.CRITIC_FREE).
COSTS = {"sft": sft, "rm": rm, "dpo": preference("dpo"), "simpo": preference("simpo"),
         "kto": kto, "ppo_update": online_update("ppo")}


def decode_seconds(row: dict, config: Any, hbm_bandwidth: float) -> tuple[float, float]:
  """(estimate, HBM roofline) of a response's `response_len - 1` decode steps from the compiled
  (last-block) decode step's `row`: each cache block's steps read the slots that block reads
  (its HBM bytes scaled from the compiled step's), the roofline the weights and the filled
  cache once per token."""
  p_len, r_len = config.format.prompt_len, config.format.response_len
  decode_s = roofline = 0.0
  for start, end, read in sampling.blocks(p_len, r_len, int(config.rollout.cache_block)):
    read = read or p_len + r_len
    hbm = row["hbm_bytes"] + row["kv_slot_bytes"] * (read - row["cache_read"])
    decode_s += (end - start) * max(row["compute_s"], hbm / hbm_bandwidth, row["ici_s"])
    filled = (end - start) * (p_len + (start + end + 1) / 2)  # Slots p_len + i + 1 summed.
    roofline += (end - start) * row["weights_bytes"] + row["kv_slot_bytes"] * filled
  return decode_s, roofline / hbm_bandwidth
