"""PPO throughput: episodes/s, rollout tokens/s, and the share of each iteration spent generating.

  python bench/ppo_speed.py [--config configs/tldr_sim.py] [--iterations 4] [--json out.json]

Random policy and reward/value parameters of the config's model (the speed does not depend on the
weights), the config's `ppo` block (rollout batch, minibatch, epochs) and format. Each iteration is
what task=ppo does: sample a rollout with the KV-cache sampler, then one jitted `ppo.train_step`
(experience + all minibatch updates). The first iteration compiles and is not timed. The update's
model FLOPs (PaLM accounting, as bench/throughput.py: policy and value forward+backward per epoch,
plus the experience forwards of policy, reference, value and reward) are compared with this
device's measured matmul peak. Prints numbers; asserts nothing.
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

from rlhfjax.algorithms import ppo
from rlhfjax.models import heads
from rlhfjax.models import sampling
from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig
from throughput import load_config, matmul_params, matmul_peak


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "..", "configs",
                                                   "tldr_sim.py"))
  ap.add_argument("--iterations", type=int, default=4)
  ap.add_argument("--json", default="", help="also write the numbers here")
  args = ap.parse_args()

  config = load_config(args.config)
  c, fmt = config.ppo, config.format
  cfg = ModelConfig.from_mapping(config.model.to_dict())
  keys = jax.random.split(jax.random.key(0), 3)
  policy = transformer.init(keys[0], cfg)
  reward = {"backbone": transformer.init(keys[1], cfg),
            "head": heads.init_scalar_head(keys[2], cfg.d_model)}
  tx = ppo.adamw(c)
  params = jax.tree.map(jnp.copy, {"policy": policy, "value": reward})
  state = ppo.PPOState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                       kl_coef=jnp.asarray(c.kl_coef, jnp.float32))
  eos = 1
  step = jax.jit(functools.partial(ppo.train_step, cfg=cfg, c=c, tx=tx, eos_id=eos),
                 donate_argnums=0)
  scfg = sampling.SamplingConfig(max_new_tokens=fmt.response_len, temperature=c.temperature,
                                 eos_id=eos, pad_id=0)
  rng = np.random.default_rng(0)
  n, plen, rlen = c.rollout_batch, fmt.prompt_len, fmt.response_len
  prompts = rng.integers(4, cfg.vocab_size, (n, plen), dtype=np.int32)
  lengths = rng.integers(plen // 2, plen + 1, n)
  pmask = np.arange(plen)[None, :] >= (plen - lengths)[:, None]
  prompts[~pmask] = 0

  gen_s, upd_s, tokens = [], [], []
  for i in range(args.iterations + 1):
    t0 = time.perf_counter()
    out = sampling.sample(state.params["policy"], prompts, pmask, jax.random.key(i), cfg, scfg)
    mask = jnp.arange(rlen)[None] < out.lengths[:, None]
    batch = {"prompt": prompts, "prompt_mask": pmask, "response": out.tokens, "response_mask": mask}
    jax.block_until_ready(batch)
    t1 = time.perf_counter()
    state, m = step(state, policy, reward, batch, jax.random.key(100 + i))
    jax.block_until_ready(m)
    t2 = time.perf_counter()
    if i:  # Iteration 0 compiles.
      gen_s.append(t1 - t0)
      upd_s.append(t2 - t1)
      tokens.append(int(np.asarray(out.lengths).sum()))
  gen, upd = float(np.mean(gen_s)), float(np.mean(upd_s))
  seq = plen + rlen
  per_token_fwd = 2 * matmul_params(cfg) + 4 * cfg.n_layers * cfg.d_model * seq
  # Experience: 4 forwards; update: policy and value forward + backward (3x) per epoch.
  update_flops = n * seq * per_token_fwd * (4 + 2 * 3 * c.epochs)
  peak = matmul_peak()
  row = {"rollout_batch": n, "episodes_per_s": n / (gen + upd),
         "rollout_tokens_per_s": float(np.mean(tokens)) / gen,
         "generation_share": gen / (gen + upd), "generate_s": gen, "update_s": upd,
         "update_fraction_of_peak": update_flops / upd / peak, "matmul_peak_gflops": peak / 1e9}
  print(f"model {cfg.variant} d{cfg.d_model} L{cfg.n_layers} V{cfg.vocab_size}; rollout {n} x "
        f"({plen} + {rlen}) tokens, {c.epochs} epochs of minibatch {c.minibatch_size}; "
        f"{jax.devices()[0].device_kind} x{jax.device_count()}")
  print(f"PPO: {row['episodes_per_s']:.1f} episodes/s | generate {gen:.2f} s "
        f"({row['rollout_tokens_per_s']:.0f} sampled tok/s) + update {upd:.2f} s per iteration | "
        f"generation share {100 * row['generation_share']:.0f}% | update at "
        f"{100 * row['update_fraction_of_peak']:.0f}% of the measured {peak / 1e9:.0f} GFLOP/s")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(row, f, indent=2)


if __name__ == "__main__":
  main()
