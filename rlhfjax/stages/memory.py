"""Memory planning: bytes per device of a training step and of generation, for a model and a mesh.

`plan(cfg, mesh, batch, seq_len)` counts exactly what the sharding rules put on one device —
parameters, AdamW's two moments (in the parameters' dtype, as optax keeps them) — and estimates
what XLA adds for a step (see `plan`): gradients, the weights cast to the compute dtype, the
activations kept for the backward pass (as `model.remat` says: every layer's activations, its
input, or its input and matmul outputs; plus one layer's working set, attention scores only for the
queries the attention kernel takes at once) and the logits where the step takes them; and for
sampling, the KV cache. Parameters and optimizer bytes are exact; the whole was within 15% of
XLA's per-chip bytes for 34 of 40 steps of Llama 1B/8B/70B compiled for v5e, v5p and v6e slices
(full remat), within 19% for all but one (docs/tpu.md says which and why).
`xla_step_bytes` asks the compiler what it actually allocates, so the two can be compared
(`task=memory` prints both; `task=compile` beside every step).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from rlhfjax.algorithms import ppo
from rlhfjax.algorithms import sft
from rlhfjax.models import attention
from rlhfjax.models.config import ModelConfig
from rlhfjax.models.config import REMAT
from rlhfjax.models import lora
from rlhfjax.models import pretrained
from rlhfjax.models import sharding_rules
from rlhfjax.models import transformer
from rlhfjax.parallel.sharding import Parallel
from rlhfjax.training import experiment
from rlhfjax.training import metrics


def _shard_fraction(axes: tuple, shape: tuple, mesh: Mesh) -> float:
  spec = sharding_rules.spec(axes, shape, mesh)
  ways = 1
  for entry in spec:
    for a in (entry if isinstance(entry, tuple) else (entry,)):
      if a is not None:
        ways *= mesh.shape[a]
  return 1.0 / ways


def param_bytes(cfg: ModelConfig, mesh: Mesh, axes: Any = None, shapes: Any = None) -> dict:
  """Total and per-device bytes of the parameters (the policy's unless `axes`/`shapes` given)."""
  shapes = shapes or jax.eval_shape(lambda: transformer.init(jax.random.key(0), cfg))
  axes = axes or transformer.param_axes(cfg)
  leaves = jax.tree.leaves(jax.tree.map(
      lambda ax, x: (x.size * x.dtype.itemsize, _shard_fraction(ax, x.shape, mesh)), axes, shapes,
      is_leaf=lambda x: isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)),
      is_leaf=lambda x: isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], float))
  total = sum(b for b, _ in leaves)
  per_device = sum(b * f for b, f in leaves)
  count = sum(x.size for x in jax.tree.leaves(shapes))
  return {"count": int(count), "total": int(total), "per_device": int(per_device)}


def plan(cfg: ModelConfig, mesh: Mesh, batch: int, seq_len: int, sample_batch: int = 0, *,
         logit_tokens: int | None = None) -> dict:
  """Bytes per device for one training step on `batch` sequences of `seq_len` tokens taking logits
  at `logit_tokens` positions of each (default: all; SFT, DPO and PPO take them at the response
  only), one forward pass of the same batch, and the KV cache for sampling `sample_batch`
  sequences of `seq_len` tokens (0: the training batch).

  What a training step's temporaries hold, as XLA's buffer assignment for the layer-scanned,
  rematerialised model on TPU shows them: the gradients twice (the result and the layer scan's
  accumulators); every weight cast to the compute dtype once (XLA hoists the cast out of the
  scan) when it differs from the parameters'; what each layer keeps for the backward pass under
  `cfg.remat` (see `kept_per_layer`); one layer's working set (about 1.35x the matmul outputs
  counted below, plus the attention scores of the queries the kernel takes at once); and the
  logits once in the compute dtype. The constants were fitted to compiles of Llama-3.2-1B,
  3.1-8B and 3.1-70B on v5p slices (docs/tpu.md).
  """
  p = param_bytes(cfg, mesh)
  dp = math.prod(mesh.shape[a] for a in sharding_rules.LOGICAL_RULES["batch"])
  tp, fsdp = mesh.shape["tensor"], mesh.shape["fsdp"]
  b_local = max(batch // dp, 1)
  act = jnp.dtype(cfg.dtype).itemsize
  d, f, h, kv, dh = cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.n_kv_heads, cfg.dim_per_head
  local = lambda n: n // tp if n % tp == 0 else n  # What the tensor axis splits (sharding_rules).
  tokens = b_local * seq_len
  # Attention's float32 scores and probabilities (and their gradient) for the queries computed at
  # once: all of them (reference, xla), a block (chunked), none outside the kernel's on-chip blocks
  # (splash, cudnn), by the kernel the config runs on the mesh's platform (TPU for task=compile).
  # cuDNN instead reads the padding mask as a [B,1,T,S] bias and writes its (unused) gradient.
  kernel = attention.resolve(cfg, attention.platform_of(mesh.devices.flat[0]))
  queries = {"reference": seq_len, "xla": seq_len, "chunked": min(cfg.attention_chunk, seq_len),
             "splash": 0, "cudnn": 0}[kernel]
  scores = b_local * local(h) * queries * seq_len * (act + 8)
  if kernel == "cudnn":
    scores += 2 * b_local * seq_len * seq_len * act
  matmul_outputs = tokens * (4 * d + (local(h) + 2 * local(kv)) * dh + local(h) * dh
                             + 3 * local(f)) * act
  copies = 2 if fsdp == 1 else 1  # Under fsdp the stacked layer inputs are not copied again.
  kept, host = kept_per_layer(cfg, tokens, matmul_outputs + scores, local, copies)
  layers = cfg.n_layers * kept
  logits = b_local * (seq_len if logit_tokens is None else logit_tokens) * local(cfg.vocab_size)
  param_size = jnp.dtype(cfg.param_dtype).itemsize
  cast = 0 if act == param_size else p["per_device"] * act // param_size
  sb = max((sample_batch or batch) // dp, 1)
  kv_cache = 2 * cfg.n_layers * sb * seq_len * local(kv) * dh * act
  out = {"devices": int(mesh.size), "mesh": dict(mesh.shape), "params_total": p["total"],
         "param_count": p["count"], "params": p["per_device"],
         # optax keeps AdamW's two moments in the parameters' dtype.
         "optimizer": 2 * p["per_device"], "gradients": 2 * p["per_device"],
         "activations": int(cast + layers + 1.35 * matmul_outputs + scores + logits * act),
         "kv_cache": int(kv_cache), "offloaded": int(cfg.n_layers * host)}
  out["train_step"] = out["params"] + out["optimizer"] + out["gradients"] + out["activations"]
  out["forward_step"] = out["params"] + int(matmul_outputs + scores + logits * act)
  return out


def kept_per_layer(cfg: ModelConfig, tokens: int, activations: float, local: Callable[[int], int],
                   copies: int) -> tuple[float, float]:
  """Bytes one layer keeps on the device for the backward pass under `cfg.remat`, and those it
  keeps in host memory, for `tokens` tokens whose activations take `activations` bytes.

  "none": all its activations. "full": its input (`copies` times: the layer scan's stacked output
  and, without fsdp, its copy). "dots": its input and the matmul outputs the backward pass reads
  (models/transformer.py `checkpointed`): q, k, v, the output projection's and the MLP's input
  projections' (the last MLP matmul's output is not read). "offload": what "full" keeps; the
  matmul outputs of "dots" wait in host memory.
  """
  act = jnp.dtype(cfg.dtype).itemsize
  dh, mlp_in = cfg.dim_per_head, 2 if cfg.variant == "llama" else 1
  layer_input = copies * tokens * cfg.d_model * act
  dots = tokens * ((local(cfg.n_heads) + 2 * local(cfg.n_kv_heads)) * dh + cfg.d_model
                   + mlp_in * local(cfg.d_ff)) * act
  return {"none": (activations, 0.0), "full": (layer_input, 0.0),
          "dots": (layer_input + dots, 0.0), "offload": (layer_input, dots)}[cfg.remat]


def remat_costs(cfg: ModelConfig, mesh: Mesh, batch: int, seq_len: int,
                logit_tokens: int | None) -> dict[str, dict[str, int]]:
  """`plan`'s activations (and host bytes) per device of one training step under each remat
  policy, so a config can see what each costs."""
  out = {}
  for remat in REMAT:
    p = plan(cfg.replace(remat=remat), mesh, batch, seq_len, logit_tokens=logit_tokens)
    out[remat] = {"activations": p["activations"], "offloaded": p["offloaded"]}
  return out


def format_remat(rows: dict[str, dict]) -> str:
  """A markdown table of each trained model's activations under every remat policy, MiB per
  device (offload: plus what waits in host memory)."""
  lines = ["| model (step) | remat | " + " | ".join(REMAT) + " |",
           "|---|---|" + "---:|" * len(REMAT)]
  mib = lambda n: f"{n / 2**20:.2f}"
  for name, r in rows.items():
    cells = [mib(r["costs"][k]["activations"]) + (
        f" (+{mib(r['costs'][k]['offloaded'])} host)" if r["costs"][k]["offloaded"] else "")
             for k in REMAT]
    lines.append(f"| {name} | {r['remat']} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n\n(activation MiB per device)"


def xla_step_bytes(lowered: Any) -> dict:
  """What XLA allocates per device for a lowered (jitted) function: arguments, outputs,
  temporaries (activations, gradients, scratch)."""
  m = lowered.compile().memory_analysis()
  return {"arguments": int(m.argument_size_in_bytes), "outputs": int(m.output_size_in_bytes),
          "temporaries": int(m.temp_size_in_bytes), "aliased": int(m.alias_size_in_bytes)}


def xla_param_bytes(params: Any, shardings: Any) -> int:
  """Per-device bytes of `params` as XLA lays them out with `shardings` (an identity program's
  argument size)."""
  fn: Callable = jax.jit(lambda p: jax.tree.map(lambda x: x + 0, p), in_shardings=(shardings,),
                         out_shardings=shardings)
  return xla_step_bytes(fn.lower(params))["arguments"]


def format_plan(rows: dict[str, dict]) -> str:
  """A markdown table, one row per plan, sizes in MiB per device."""
  keys = ("params", "optimizer", "gradients", "activations", "kv_cache", "train_step")
  lines = ["| | " + " | ".join(keys) + " |",
           "|---|" + "---|" * len(keys)]
  for name, r in rows.items():
    lines.append(f"| {name} | " + " | ".join(f"{r[k] / 2**20:.2f}" for k in keys) + " |")
  return "\n".join(lines) + "\n\n(MiB per device)"


def per_device_bytes(tree: Any) -> int:
  """Bytes one device holds of a tree of sharded arrays or ShapeDtypeStructs (the largest shard)."""
  def one(x):
    shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) else x.shape
    return math.prod(shape) * jnp.dtype(x.dtype).itemsize
  return int(sum(one(x) for x in jax.tree.leaves(tree)))


def ppo_held(config: Any, par: Any, cfg: ModelConfig, rank: int) -> dict:
  """What a PPO run of `config` holds per device with LoRA adapters of `rank` on its policy and
  value model (0: full fine-tuning): trained parameters, AdamW state, the reference policy (none of
  its own under LoRA: the policy's base), the reward model; and XLA's bytes for the PPO step
  (arguments: all of those plus the batch; temporaries: gradients, activations)."""
  lcfg = dataclasses.replace(lora.from_config(config.lora), rank=rank,
                             models=("policy", "value"))
  prog = ppo.program(experiment.Experiment(config, "", {}, None, cfg, par, "", lcfg))
  state, ref, reward = prog.args[:3]
  xla = xla_step_bytes(prog.lower())
  trained, total = lora.count(state.params)
  out = {"lora_rank": rank, "trained_params": trained, "params": total,
         "policy_and_value": per_device_bytes(state.params),
         "optimizer": per_device_bytes(state.opt_state),
         "reference": per_device_bytes(ref), "reward_model": per_device_bytes(reward)}
  out["held"] = sum(out[k] for k in ("policy_and_value", "optimizer", "reference", "reward_model"))
  return {**out, "xla_ppo_step": xla}


def format_ppo_held(rows: dict[str, dict]) -> str:
  """A markdown table of `ppo_held` results, MiB per device."""
  keys = ("policy_and_value", "optimizer", "reference", "reward_model", "held")
  lines = ["| PPO | trained params | " + " | ".join(keys) + " | XLA step args | XLA step temps |",
           "|---|---|" + "---|" * (len(keys) + 2)]
  mib = lambda n: f"{n / 2**20:.2f}"
  for name, r in rows.items():
    lines.append(f"| {name} | {r['trained_params']:,} of {r['params']:,} | "
                 + " | ".join(mib(r[k]) for k in keys)
                 + f" | {mib(r['xla_ppo_step']['arguments'])}"
                 f" | {mib(r['xla_ppo_step']['temporaries'])} |")
  return "\n".join(lines) + "\n\n(MiB per device)"


def run(config: Any, workdir: str) -> dict:
  """task=memory: the plan for this config's model (a pretrained `init_from`'s architecture, read
  from its config) and mesh (SFT step, RM step, PPO rollout) beside what XLA allocates for the SFT
  step, each trained model's activations under every remat policy; writes
  `<workdir>/memory.json`."""
  cfg = pretrained.block_config(config.model.to_dict())
  par = Parallel.from_config(config.mesh)
  seq, r_len = config.format.prompt_len + config.format.response_len, config.format.response_len
  rm_logits = r_len if config.rm.likelihood_weight else 0
  exp = experiment.Experiment(config, "", {}, None, cfg, par, "",
                              lora.from_config(config.lora))
  # Each trained model's step: (step, batch, logit tokens); PPO's minibatch for the policy and a
  # value model of its own.
  trained = {"sft": ("sft step", config.sft.batch_size, r_len),
             "rm": ("rm step", 2 * config.rm.batch_size, rm_logits),
             "policy": ("ppo update", config.ppo.minibatch_size, r_len)}
  if config.ppo.value_model == "separate":
    trained["value"] = ("ppo update", config.ppo.minibatch_size, 0)
  remat_rows = {f"{role} ({step})": {"remat": exp.model_for(role).remat,
                                     "costs": remat_costs(cfg, par.mesh, b, seq, logits)}
                for role, (step, b, logits) in trained.items()}
  plans = {"sft step": plan(exp.model_for("sft"), par.mesh, config.sft.batch_size, seq,
                            logit_tokens=r_len),
           "rm step": plan(exp.model_for("rm"), par.mesh, 2 * config.rm.batch_size, seq,
                           logit_tokens=rm_logits),
           "ppo rollout": plan(exp.model_for("policy"), par.mesh, config.ppo.minibatch_size, seq,
                               config.ppo.rollout_batch, logit_tokens=r_len)}
  xla = xla_step_bytes(sft.program(exp).lower())
  sft_plan = plans["sft step"]
  rank = config.lora.rank or 8
  ppo_rows = {"full": ppo_held(config, par, cfg, 0),
              f"LoRA r={rank}": ppo_held(config, par, cfg, rank)}
  report = {"mesh": dict(par.mesh.shape), "plans": plans, "xla_sft_step": xla, "ppo": ppo_rows,
            "remat": remat_rows}
  metrics.info(f"mesh {dict(par.mesh.shape)}, {sft_plan['param_count'] / 1e6:.1f}M parameters "
               f"({sft_plan['params_total'] / 2**20:.1f} MiB in all)\n" + format_plan(plans) +
               f"\n\nXLA, SFT step per device: arguments {xla['arguments'] / 2**20:.2f} MiB (plan: "
               f"params + optimizer + batch), temporaries {xla['temporaries'] / 2**20:.2f} MiB "
               f"(plan: gradients + activations "
               f"{(sft_plan['gradients'] + sft_plan['activations']) / 2**20:.2f} MiB)\n\n"
               "What a PPO run holds, full fine-tuning against LoRA on the policy and value "
               "model (the reference is then the policy's own base):\n" + format_ppo_held(ppo_rows)
               + "\n\nRematerialisation (model.remat, the remat block): each trained model's "
               "activations under every policy:\n" + format_remat(remat_rows))
  os.makedirs(workdir, exist_ok=True)
  experiment.write_json(os.path.join(workdir, "memory.json"), report)
  return report
