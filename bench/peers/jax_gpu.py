"""The rlhfjax side of the GPU comparison (bench/gpu.py): one work of a preset, timed.

  python bench/peers/jax_gpu.py --work {peak,sft,rm,sample,ppo,rloo} [--preset gpu-1b|tiny]
      [--attention auto] [--remat none] [--deterministic] [--repeats 3] [--iterations 3]
      [--json OUT]

The model is `architectures.model_config(preset.arch, **preset.overrides)` with parameters and
compute in the preset's dtype, `--attention` and `--remat` passed through as model.attention and
model.remat, random weights. Before anything computes, `runtime.apply` sets the fast setting for
bfloat16 (JAX's default matmul precision, XLA's non-deterministic GPU ops); `--deterministic`
measures the deterministic ops instead. The process lets XLA take 95% of the device's memory
(XLA_PYTHON_CLIENT_MEM_FRACTION, unless set): it is alone on the device. Eos is disabled
everywhere, so every sampled token counts. The side reports seconds; bench/gpu.py turns them into
rates, MFU and fractions of the bandwidth. Asserts nothing.

- peak: a jitted peak_n^3 matmul in the preset's dtype (FLOP/s), and x * 2 over stream_mib MiB
  (bytes read + written per second): the measured peaks of this run, best of max(repeats, 10).
- sft: one `sft.train_step` (AdamW) on seq_batch sequences of seq_prompt + seq_response real
  tokens; best of `--repeats` after one compiling call.
- rm: one `reward_model.train_step` on seq_batch / 2 pairs of the same length (chosen and
  rejected in one forward pass).
- sample: `sampling.sample` on sample_batch prompts of sample_prompt real tokens, sample_new new
  tokens, and the same call with 1 new token (prefill and the first token): the difference is
  the sample_new - 1 decode steps, each one jitted forward of the whole batch over the cache.
  The policy samples as every rollout does: copied into the rollout layout of the config's
  `rollout` block (parallel/rollout.py: compute dtype, tensor parallel where there are several
  devices) with its cache blocks; ppo and rloo make that copy once per iteration, timed.
  Also reports the bytes of the weights and of one KV-cache slot of the batch (k and v, all
  layers), from which bench/gpu.py counts what a decode step reads.
- ppo: iterations of what task=ppo does: sample the responses of `episodes` left-padded prompts
  with the current policy, then one `ppo.train_step` (experience with policy, reference, value
  and reward models; `epochs` passes of minibatches of `minibatch`; separate value network).
  One untimed first iteration, then the mean of `--iterations`.
- rloo: the same for task=rloo: episodes / rloo_k prompts, each prefilled once and sampled
  rloo_k times, then one `rloo.train_step`.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import presets  # noqa: E402
from jax_side import CONFIG, best_seconds, left_padded  # noqa: E402
from throughput import load_config  # noqa: E402  (jax_side puts bench/ on the path)

from rlhfjax import runtime  # noqa: E402
from rlhfjax.algorithms import online  # noqa: E402
from rlhfjax.algorithms import ppo  # noqa: E402
from rlhfjax.algorithms import reward_model  # noqa: E402
from rlhfjax.algorithms import rloo  # noqa: E402
from rlhfjax.algorithms import sft  # noqa: E402
from rlhfjax.models import architectures  # noqa: E402
from rlhfjax.models import heads  # noqa: E402
from rlhfjax.models import sampling  # noqa: E402
from rlhfjax.models import transformer  # noqa: E402
from rlhfjax.models.config import ModelConfig  # noqa: E402
from rlhfjax.parallel import rollout as parallel_rollout  # noqa: E402
from rlhfjax.parallel.mesh import make_mesh  # noqa: E402
from rlhfjax.training import optimizer  # noqa: E402
from rlhfjax.training.state import TrainState  # noqa: E402

NO_EOS = -1


def work_peak(p: presets.Preset, repeats: int) -> dict:
  dtype = jnp.dtype(p.dtype)
  a = jax.random.normal(jax.random.key(0), (p.peak_n, p.peak_n), dtype)
  x = jnp.ones(((p.stream_mib << 20) // dtype.itemsize,), dtype)
  matmul, double = jax.jit(lambda a: a @ a), jax.jit(lambda x: x * 2)
  mm = best_seconds(lambda: matmul(a), max(repeats, 10))[0]
  stream = best_seconds(lambda: double(x), max(repeats, 10))[0]
  return {"seconds": mm, "matmul_flops_per_s": 2 * p.peak_n**3 / mm,
          "stream_bytes_per_s": 2 * x.nbytes / stream}


def tokens(rng: np.random.Generator, cfg: ModelConfig, rows: int, length: int) -> np.ndarray:
  return rng.integers(4, cfg.vocab_size, (rows, length), dtype=np.int32)


def step_seconds(step: Callable, state: Any, args: tuple, repeats: int) -> dict:
  """Best seconds of the jitted train step `step(state, *args)`, which donates its state."""
  holder = [state]

  def call():
    holder[0], metrics = step(holder[0], *args)
    return metrics

  best, times = best_seconds(call, repeats)
  return {"seconds": best, "all": times}


def work_sft(p: presets.Preset, cfg: ModelConfig, repeats: int) -> dict:
  rng = np.random.default_rng(0)
  n = p.seq_batch
  batch = jax.device_put({
      "prompt": tokens(rng, cfg, n, p.seq_prompt), "prompt_mask": np.ones((n, p.seq_prompt), bool),
      "response": tokens(rng, cfg, n, p.seq_response),
      "response_mask": np.ones((n, p.seq_response), bool)})
  tx = optimizer.adamw(load_config(CONFIG).sft, 1000)
  step = jax.jit(functools.partial(sft.train_step, cfg=cfg, tx=tx), donate_argnums=0)
  state = TrainState.create(transformer.init(jax.random.key(0), cfg), tx)
  return step_seconds(step, state, (batch, jax.random.key(1)), repeats)


def work_rm(p: presets.Preset, cfg: ModelConfig, repeats: int) -> dict:
  rng = np.random.default_rng(0)
  n, plen, rlen = p.rm_pairs, p.seq_prompt, p.seq_response
  batch = jax.device_put({
      "prompt": tokens(rng, cfg, n, plen), "prompt_mask": np.ones((n, plen), bool),
      "chosen": tokens(rng, cfg, n, rlen), "chosen_mask": np.ones((n, rlen), bool),
      "rejected": tokens(rng, cfg, n, rlen), "rejected_mask": np.ones((n, rlen), bool)})
  params = {"backbone": transformer.init(jax.random.key(0), cfg),
            "head": heads.init_scalar_head(jax.random.key(1), cfg.d_model)}
  tx = optimizer.adamw(load_config(CONFIG).rm, 1000)
  step = jax.jit(functools.partial(reward_model.train_step, cfg=cfg, tx=tx), donate_argnums=0)
  return step_seconds(step, TrainState.create(params, tx), (batch,), repeats)


def in_rollout_layout(cfg: ModelConfig, rows: int, length: int,
                      new: int) -> tuple[Callable[[Any], Any], sampling.SamplingConfig]:
  """(copy, sampling config): `copy(params)` puts the policy into the rollout layout that the
  config's `rollout` block picks on these devices for `rows` rows of `length` slots; the config
  samples `new` tokens at temperature 1 with its cache blocks (eos disabled)."""
  block = load_config(CONFIG).rollout
  train = make_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  layout = parallel_rollout.choose(block, cfg, dict(train.shape),
                                   platform=jax.devices()[0].platform,
                                   fast_domain=jax.local_device_count(), rows=rows, length=length,
                                   free_bytes=None)
  mesh = parallel_rollout.mesh(layout, train.devices)
  print(parallel_rollout.describe(layout, cfg, rows, length), file=sys.stderr)
  scfg = sampling.SamplingConfig(max_new_tokens=new, temperature=1.0, eos_id=NO_EOS, pad_id=0,
                                 early_stop=block.early_stop, cache_block=block.cache_block)
  axes = transformer.param_axes(cfg)
  return lambda params: parallel_rollout.reshard(params, axes, layout, mesh), scfg


def work_sample(p: presets.Preset, cfg: ModelConfig, repeats: int) -> dict:
  copy, scfg = in_rollout_layout(cfg, p.sample_batch, p.sample_prompt + p.sample_new,
                                 p.sample_new)
  params = copy(transformer.init(jax.random.key(0), cfg))
  prompts = jax.device_put(tokens(np.random.default_rng(0), cfg, p.sample_batch, p.sample_prompt))
  mask = jnp.ones(prompts.shape, bool)

  def seconds(new: int) -> tuple[float, list[float]]:
    new_cfg = dataclasses.replace(scfg, max_new_tokens=new)
    return best_seconds(
        lambda: sampling.sample(params, prompts, mask, jax.random.key(1), cfg, new_cfg).tokens,
        repeats)

  whole, times = seconds(p.sample_new)
  first = seconds(1)[0]
  kv_per_slot = (2 * cfg.n_layers * p.sample_batch * cfg.n_kv_heads * cfg.dim_per_head
                 * jnp.dtype(cfg.dtype).itemsize)  # transformer.init_cache's k and v, per slot.
  return {"seconds": whole, "all": times, "prefill_seconds": first,
          "decode_step_seconds": (whole - first) / (p.sample_new - 1),
          "weight_bytes": sum(x.nbytes for x in jax.tree.leaves(params)),
          "kv_bytes_per_slot": kv_per_slot}


def iterate(sample: Callable[[int], dict], update: Callable[[dict, int], Any], n: int) -> dict:
  """Mean seconds of sampling and of the update over `n` iterations after an untimed first one."""
  parts = []
  for i in range(n + 1):
    start = time.perf_counter()
    batch = jax.block_until_ready(sample(i))
    sampled = time.perf_counter()
    jax.block_until_ready(update(batch, i))
    parts.append((sampled - start, time.perf_counter() - sampled))
  gen, upd = np.mean(parts[1:], 0).tolist()
  return {"seconds": gen + upd, "parts": {"sample": gen, "update": upd},
          "all": [g + u for g, u in parts[1:]]}


def policy_and_reward(cfg: ModelConfig) -> tuple[Any, dict]:
  keys = jax.random.split(jax.random.key(0), 3)
  return transformer.init(keys[0], cfg), {"backbone": transformer.init(keys[1], cfg),
                                          "head": heads.init_scalar_head(keys[2], cfg.d_model)}


def rl_prompts(p: presets.Preset, cfg: ModelConfig, n: int) -> tuple[jax.Array, jax.Array]:
  return jax.device_put(left_padded(np.random.default_rng(0), n, p.rl_prompt, p.rl_min_prompt,
                                    cfg.vocab_size))


def work_ppo(p: presets.Preset, cfg: ModelConfig, iterations: int) -> dict:
  c = load_config(CONFIG).ppo
  c.update(rollout_batch=p.episodes, minibatch_size=p.minibatch, epochs=p.epochs,
           value_model="separate")
  policy, reward = policy_and_reward(cfg)
  tx = ppo.adamw(c)
  params = jax.tree.map(jnp.copy, {"policy": policy, "value": reward})  # Donated: not the frozen.
  state = [ppo.PPOState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                        kl_coef=jnp.asarray(c.kl_coef, jnp.float32))]
  step = jax.jit(functools.partial(ppo.train_step, cfg=cfg, c=c, tx=tx, eos_id=NO_EOS),
                 donate_argnums=0)
  prompts, mask = rl_prompts(p, cfg, p.episodes)
  copy, scfg = in_rollout_layout(cfg, p.episodes, p.rl_prompt + p.rl_response, p.rl_response)
  draw = lambda params, i: sampling.sample(copy(params["policy"]), prompts, mask,
                                           jax.random.key(i), cfg, scfg).tokens
  return rl_iterations(state, step, policy, reward, draw, prompts, mask, iterations)


def work_rloo(p: presets.Preset, cfg: ModelConfig, iterations: int) -> dict:
  c = load_config(CONFIG).rloo
  c.update(rollout_batch=p.episodes, k=p.rloo_k, minibatch_size=p.minibatch, epochs=p.epochs)
  policy, reward = policy_and_reward(cfg)
  tx = online.adamw(c, online.minibatch_updates_per_step(c))
  state = [TrainState.create({"policy": jax.tree.map(jnp.copy, policy)}, tx)]
  step = jax.jit(functools.partial(rloo.train_step, cfg=cfg, c=c, tx=tx, eos_id=NO_EOS),
                 donate_argnums=0)
  unique, unique_mask = rl_prompts(p, cfg, p.episodes // c.k)
  # k adjacent samples of each prompt, which the sampler prefills once (as task=rloo does).
  prompts, mask = jnp.repeat(unique, c.k, 0), jnp.repeat(unique_mask, c.k, 0)
  copy, scfg = in_rollout_layout(cfg, p.episodes, p.rl_prompt + p.rl_response, p.rl_response)
  draw = lambda params, i: sampling.sample(copy(params["policy"]), unique, unique_mask,
                                           jax.random.key(i), cfg, scfg, k=c.k).tokens
  return rl_iterations(state, step, policy, reward, draw, prompts, mask, iterations)


def rl_iterations(state: list, step, policy, reward, draw, prompts: jax.Array, mask: jax.Array,
                  iterations: int) -> dict:
  """`iterate` over an RL step: `draw(params, i)` samples responses (every token real: no eos) to
  `prompts` from the policy in `state[0]`, then `step` updates `state[0]` in place."""
  def sample(i: int) -> dict:
    response = draw(state[0].params, i)
    return {"prompt": prompts, "prompt_mask": mask, "response": response,
            "response_mask": jnp.ones(response.shape, bool)}

  def update(batch: dict, i: int) -> dict:
    state[0], metrics = step(state[0], policy, reward, batch, jax.random.key(1000 + i))
    return metrics

  return iterate(sample, update, iterations)


def run(work: str, p: presets.Preset, args: argparse.Namespace) -> dict:
  if work == "peak":
    return work_peak(p, args.repeats)
  cfg = architectures.model_config(p.arch, **p.overrides, dtype=p.dtype, param_dtype=p.dtype,
                                   attention=args.attention, remat=args.remat)
  if work in ("ppo", "rloo"):
    return {"ppo": work_ppo, "rloo": work_rloo}[work](p, cfg, args.iterations)
  return {"sft": work_sft, "rm": work_rm, "sample": work_sample}[work](p, cfg, args.repeats)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--work", required=True, choices=("peak", "sft", "rm", "sample", "ppo", "rloo"))
  ap.add_argument("--preset", default="gpu-1b", choices=sorted(presets.PRESETS))
  ap.add_argument("--attention", default="auto", help="model.attention")
  ap.add_argument("--remat", default="none", help="model.remat")
  ap.add_argument("--deterministic", action="store_true", help="XLA's deterministic GPU ops")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--iterations", type=int, default=3, help="timed PPO / RLOO iterations")
  ap.add_argument("--json", default="")
  args = ap.parse_args()
  os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
  p = presets.PRESETS[args.preset]
  settings = runtime.apply({"matmul_precision": "default", "deterministic": args.deterministic},
                           p.dtype)
  out = run(args.work, p, args)
  out = {"work": args.work, "side": "rlhfjax", "jax": jax.__version__,
         "device": jax.devices()[0].device_kind, "attention": args.attention,
         "remat": args.remat, "runtime": settings, **out}
  print(f"rlhfjax {args.work}: {out['seconds'] * 1e3:.1f} ms")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(out, f, indent=2)


if __name__ == "__main__":
  main()
