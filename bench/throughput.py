"""Sampling and SFT-step throughput, the fraction of this device's measured matmul peak, and how
fast the simulated world generates its examples.

  python bench/throughput.py [--config configs/tldr_sim.py] [--batch 64] [--json out.json]

Prints numbers; asserts nothing. The peak is measured here (a jitted float32 N^3 matmul), so the
fraction is against what this device really does, not a datasheet. Model FLOPs per trained token are
6 * (matmul parameters) + 12 * layers * d_model * sequence (PaLM's accounting, causal attention
counted in full); sampling FLOPs are not counted, since decoding is bound by memory, not matmuls.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from rlhfjax import config_file
from rlhfjax import runtime
from rlhfjax.algorithms import sft
from rlhfjax.models import sampling
from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig
from rlhfjax.simulated import world
from rlhfjax.training import optimizer
from rlhfjax.training.state import TrainState


def timeit(fn, repeats: int) -> float:
  """Best-of-3 mean seconds per call after one warm-up call (compilation excluded)."""
  jax.block_until_ready(fn())
  best = float("inf")
  for _ in range(3):
    t = time.perf_counter()
    for _ in range(repeats):
      out = fn()
    jax.block_until_ready(out)
    best = min(best, (time.perf_counter() - t) / repeats)
  return best


def matmul_peak(n: int = 2048) -> float:
  """Measured float32 matmul FLOP/s."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  return 2 * n**3 / timeit(lambda: f(a), 5)


def matmul_params(cfg: ModelConfig) -> int:
  """Parameters that take part in matmuls per token (embedding lookup excluded, LM head included)."""
  params = jax.eval_shape(functools.partial(transformer.init, cfg=cfg), jax.random.key(0))
  total = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  lookups = cfg.vocab_size * cfg.d_model * (0 if cfg.tie_embeddings else 1)
  if cfg.variant == "gpt2":
    lookups += cfg.max_len * cfg.d_model
  return total - lookups


def report(out: dict, json_path: str = "") -> None:
  """Prints `out` as aligned `name  value` lines, and writes it to `json_path` if given."""
  width = max(map(len, out))
  for k, v in out.items():
    print(f"{k:<{width}}  {v:.4g}" if isinstance(v, float) else f"{k:<{width}}  {v}")
  if json_path:
    with open(json_path, "w", encoding="utf-8") as f:
      json.dump(out, f, indent=2)


def load_config(path: str):
  return config_file.load(path)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "..", "configs",
                                                   "tldr_sim.py"))
  ap.add_argument("--batch", type=int, default=0, help="default: the config's sft.batch_size")
  ap.add_argument("--sample-batch", type=int, default=64)
  ap.add_argument("--variant", default="", help="override model.variant")
  ap.add_argument("--json", default="", help="also write the numbers here")
  args = ap.parse_args()

  config = load_config(args.config)
  # As `python -m rlhfjax.main` runs it: the config's precision and host allocator settings.
  settings = runtime.apply(config.get("runtime"), config.model.dtype)
  mcfg = ModelConfig.from_mapping(config.model.to_dict())
  if args.variant:
    mcfg = mcfg.replace(variant=args.variant)
  plen, rlen = config.format.prompt_len, config.format.response_len
  batch = args.batch or config.sft.batch_size
  rng = np.random.default_rng(0)
  params = transformer.init(jax.random.key(0), mcfg)

  # Sampling: prefill a full prompt, then decode `rlen` tokens (eos disabled: every token counts).
  scfg = sampling.SamplingConfig(max_new_tokens=rlen, temperature=1.0, eos_id=-1, pad_id=0)
  prompts = rng.integers(4, mcfg.vocab_size, (args.sample_batch, plen), dtype=np.int32)
  pmask = np.ones_like(prompts, bool)
  sample_s = timeit(lambda: sampling.sample(params, prompts, pmask, jax.random.key(1), mcfg, scfg), 2)

  # SFT step: forward + backward + AdamW on a full batch.
  tx = optimizer.adamw(config.sft, config.sft.steps)
  step = jax.jit(functools.partial(sft.train_step, cfg=mcfg, tx=tx))
  data = {"prompt": rng.integers(4, mcfg.vocab_size, (batch, plen), dtype=np.int32),
          "prompt_mask": np.ones((batch, plen), bool),
          "response": rng.integers(4, mcfg.vocab_size, (batch, rlen), dtype=np.int32),
          "response_mask": np.ones((batch, rlen), bool)}
  state = TrainState.create(params, tx)
  step_s = timeit(lambda: step(state, data, jax.random.key(2))[1]["train/loss"], 5)

  # The simulated world: posts, references and latent situations, on one core.
  start = time.perf_counter()
  world.generate(0, 0, 10_000)
  world_s = time.perf_counter() - start

  seq = plen + rlen
  flops_per_token = 6 * matmul_params(mcfg) + 12 * mcfg.n_layers * mcfg.d_model * seq
  peak = matmul_peak()
  sft_tokens_s = batch * seq / step_s
  out = {
      "device": f"{jax.devices()[0].device_kind} x{jax.device_count()}",
      "host": platform.processor() or platform.machine(),
      "host_malloc": settings["host_malloc"],
      "model": f"{mcfg.variant} d{mcfg.d_model} L{mcfg.n_layers} V{mcfg.vocab_size}",
      "matmul_params": matmul_params(mcfg),
      "matmul_peak_gflops": peak / 1e9,
      "sample_batch": args.sample_batch, "prompt_len": plen, "new_tokens": rlen,
      "sampling_tokens_per_s": args.sample_batch * rlen / sample_s,
      "sampling_batch_latency_s": sample_s,
      "sft_batch": batch, "sft_seq": seq,
      "sft_tokens_per_s": sft_tokens_s,
      "sft_step_s": step_s,
      "sft_model_gflops": flops_per_token * sft_tokens_s / 1e9,
      "sft_fraction_of_peak": flops_per_token * sft_tokens_s / peak,
      "world_examples_per_s": 10_000 / world_s,
  }
  report(out, args.json)


if __name__ == "__main__":
  main()
