"""Online RL throughput: PPO's episodes/s beside RLOO's and GRPO's, rollout tokens/s, and the share
of each iteration spent generating.

  python bench/ppo_speed.py [--config configs/tldr_sim.py] [--methods ppo,rloo,grpo]
                            [--iterations 4] [--lora 0,8] [--json out.json]

Random policy and reward/value parameters of the config's model (the speed does not depend on the
weights), each method's config block (rollout batch, samples per prompt, minibatch, epochs) and
format. Each iteration is what the task does: sample a rollout with the KV-cache sampler (k samples
of each of rollout_batch / k prompts), then one jitted `train_step` (experience + all minibatch
updates). The first iteration compiles and is not timed. The update's model FLOPs (PaLM accounting,
as bench/throughput.py) are compared with this device's measured matmul peak: PPO runs policy and
value forward+backward per epoch after the experience forwards of policy, reference, value and
reward; RLOO and GRPO have no value model (policy forward+backward per epoch after policy,
reference and reward forwards), and with `share_prompt` (the default) each of their passes runs a
prompt once with its k responses packed after it, so the FLOPs count those packed rows; with
`--lora`, adapters on the trained models and a backward pass without base weight gradients. Prints
numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from rlhfjax import runtime
from rlhfjax.algorithms import grpo
from rlhfjax.algorithms import online
from rlhfjax.algorithms import ppo
from rlhfjax.algorithms import rloo
from rlhfjax.models import heads
from rlhfjax.models import lora
from rlhfjax.models import sampling
from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig
from rlhfjax.training.state import TrainState
from throughput import load_config, matmul_params, matmul_peak

EOS = 1
CRITIC_FREE = {"rloo": rloo, "grpo": grpo}


def random_models(cfg: ModelConfig) -> tuple[dict, dict]:
  """A random policy and reward model of `cfg` (the speed does not depend on the weights)."""
  keys = jax.random.split(jax.random.key(0), 3)
  return transformer.init(keys[0], cfg), {"backbone": transformer.init(keys[1], cfg),
                                          "head": heads.init_scalar_head(keys[2], cfg.d_model)}


def setup(method: str, config, cfg: ModelConfig, policy, reward, rank: int):
  """(state, jitted step, samples per prompt, forward passes of the update per episode) of one
  method at its config block's settings; with `rank` > 0, LoRA adapters on the policy (and PPO's
  value model), whose base is then the reference."""
  c = config[method]
  lcfg = lora.LoraConfig(rank=rank)
  trainable = lora.trainable if rank else None
  train_passes = 2 if rank else 3  # Forward + backward; LoRA computes no base weight gradients.
  adapt = lambda p, key: lora.adapt(jax.random.key(key), p, lcfg, "policy")
  policy, reward = jax.tree.map(jnp.copy, (policy, reward))  # Donated: never the frozen trees.
  if method == "ppo":
    tx = ppo.adamw(c, trainable)
    params = {"policy": adapt(policy, 1),
              "value": {**reward, "backbone": adapt(reward["backbone"], 2)}}
    state = ppo.PPOState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                         kl_coef=jnp.asarray(c.kl_coef, jnp.float32))
    step_fn, k, passes = ppo.train_step, 1, 4 + 2 * train_passes * c.epochs
  else:
    tx = online.adamw(c, online.minibatch_updates_per_step(c), trainable)
    state = TrainState.create({"policy": adapt(policy, 1)}, tx)
    step_fn, k, passes = CRITIC_FREE[method].train_step, c.k, 3 + train_passes * c.epochs
  step = jax.jit(functools.partial(step_fn, cfg=cfg, c=c, tx=tx, eos_id=EOS), donate_argnums=0)
  return state, step, k, passes


def measure(method: str, config, cfg: ModelConfig, policy, reward, iterations: int,
            peak: float, rank: int = 0) -> dict:
  c, fmt = config[method], config.format
  state, step, k, passes = setup(method, config, cfg, policy, reward, rank)
  ref = None if rank else policy  # A LoRA policy's reference is its own base.
  scfg = sampling.SamplingConfig(max_new_tokens=fmt.response_len, temperature=c.temperature,
                                 eos_id=EOS, pad_id=0)
  rng = np.random.default_rng(0)
  n, plen, rlen = c.rollout_batch, fmt.prompt_len, fmt.response_len
  prompts = rng.integers(4, cfg.vocab_size, (n // k, plen), dtype=np.int32)
  lengths = rng.integers(plen // 2, plen + 1, n // k)
  pmask = np.arange(plen)[None, :] >= (plen - lengths)[:, None]
  prompts[~pmask] = 0
  # k adjacent samples of each prompt, which the sampler prefills once (as the tasks do).
  repeated, repeated_mask = np.repeat(prompts, k, 0), np.repeat(pmask, k, 0)

  gen_s, upd_s, tokens = [], [], []
  for i in range(iterations + 1):
    t0 = time.perf_counter()
    out = sampling.sample(state.params["policy"], prompts, pmask, jax.random.key(i), cfg, scfg,
                          k=k)
    mask = jnp.arange(rlen)[None] < out.lengths[:, None]
    batch = {"prompt": repeated, "prompt_mask": repeated_mask, "response": out.tokens,
             "response_mask": mask}
    jax.block_until_ready(batch)
    t1 = time.perf_counter()
    state, m = step(state, ref, reward, batch, jax.random.key(100 + i))
    jax.block_until_ready(m)
    t2 = time.perf_counter()
    if i:  # Iteration 0 compiles.
      gen_s.append(t1 - t0)
      upd_s.append(t2 - t1)
      tokens.append(int(np.asarray(out.lengths).sum()))
  gen, upd = float(np.mean(gen_s)), float(np.mean(upd_s))
  # Tokens of one forward pass over the rollout, each attending to every key of its row: n rows of
  # prompt + response, or with share_prompt n / k rows of a prompt and its k packed responses.
  rows_per_pass, seq = (n // k, plen + k * rlen) if k > 1 and c.share_prompt else (n, plen + rlen)
  per_token_fwd = 2 * matmul_params(cfg) + 4 * cfg.n_layers * cfg.d_model * seq
  update_flops = rows_per_pass * seq * per_token_fwd * passes
  return {"method": method, "lora_rank": rank, "rollout_batch": n, "k": k, "episodes_per_s": n / (gen + upd),
          "rollout_tokens_per_s": float(np.mean(tokens)) / gen,
          "generation_share": gen / (gen + upd), "generate_s": gen, "update_s": upd,
          "update_fraction_of_peak": update_flops / upd / peak, "matmul_peak_gflops": peak / 1e9,
          "epochs": c.epochs, "minibatch_size": c.minibatch_size}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "..", "configs",
                                                   "tldr_sim.py"))
  ap.add_argument("--methods", default="ppo,rloo,grpo")
  ap.add_argument("--iterations", type=int, default=4)
  ap.add_argument("--lora", default="0", help="LoRA ranks to measure, e.g. 0,8 (0: full)")
  ap.add_argument("--json", default="", help="also write the numbers here")
  args = ap.parse_args()

  config = load_config(args.config)
  runtime.apply(config.get("runtime"), config.model.dtype)  # As rlhfjax.main runs.
  fmt = config.format
  cfg = ModelConfig.from_mapping(config.model.to_dict())
  policy, reward = random_models(cfg)
  peak = matmul_peak()
  print(f"model {cfg.variant} d{cfg.d_model} L{cfg.n_layers} V{cfg.vocab_size}; prompts "
        f"{fmt.prompt_len} + {fmt.response_len} new tokens; {jax.devices()[0].device_kind} "
        f"x{jax.device_count()}; matmul peak {peak / 1e9:.0f} GFLOP/s (this run)")
  rows = []
  for method, rank in [(m, int(r)) for m in args.methods.split(",") for r in args.lora.split(",")]:
    r = measure(method, config, cfg, policy, reward, args.iterations, peak, rank)
    rows.append(r)
    name = f"{method} (LoRA r={rank})" if rank else method
    print(f"{name}: {r['episodes_per_s']:.1f} episodes/s ({r['rollout_batch']} = "
          f"{r['rollout_batch'] // r['k']} prompts x {r['k']}, {r['epochs']} epochs of minibatch "
          f"{r['minibatch_size']}) | generate {r['generate_s']:.2f} s "
          f"({r['rollout_tokens_per_s']:.0f} sampled tok/s) + update {r['update_s']:.2f} s | "
          f"generation share {100 * r['generation_share']:.0f}% | update at "
          f"{100 * r['update_fraction_of_peak']:.0f}% of the peak")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(rows, f, indent=2)


if __name__ == "__main__":
  main()
