"""Speed of the KV-cache sampler (`rlhfjax.models.sampling.sample`) on the quickstart model.

  python bench/sampling_speed.py [--config configs/tldr_sim.py] [--batches 64,128] [--json out.json]
  python bench/sampling_speed.py --config configs/smollm2_tldr_sim.py --batches 1,8   # SmolLM2

Random parameters (`transformer.init`), or a config's pretrained model (`model.init_from`: the
real weights), and random left-padded prompts; temperature-1 sampling with
eos disabled, so every one of `response_len` new tokens counts. `--model KEY=VALUE` changes a
model setting, e.g. a sliding window on every other layer (Gemma's local layers: the cache keeps
every slot and a local layer masks its reads, see models/transformer.py) to compare with none:

  python bench/sampling_speed.py --batches 64 --model sliding_window=32 \
      --model sliding_window_pattern=2 Each batch size is compiled once
(excluded), then timed best-of-3. Prefill is timed as a `max_new_tokens=1` call, and decode is the
rest: the `response_len - 1` forward passes after the first token. Model FLOPs per token are 2 * (non-embedding matmul parameters) + 2 * d_model * vocab (the LM
head) + 4 * layers * d_model * (attended slots); the fraction is against a nominal `--peak-gflops`
(88: 2 cores x AVX2 FMA at ~2.75 GHz), not a measured peak. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import ast
import json
import os

import jax
import numpy as np

from rlhfjax.models import pretrained
from rlhfjax.models import sampling
from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig
from throughput import load_config, matmul_params, matmul_peak, timeit


def flops(cfg: ModelConfig, batch: int, plen: int, new: int) -> tuple[float, float]:
  """(prefill, decode) model FLOPs: matmuls, LM head on the last position(s), attention scores+mix.

  Attention is counted over the slots the kernel actually computes: prefill is [P,P], decode step i
  attends to all P + new cache slots (the sampler's shapes are fixed).
  """
  head = 2 * cfg.d_model * cfg.vocab_size
  per_token = 2 * matmul_params(cfg) - head  # matmul_params counts the LM head: added per use below.
  attn_per_slot = 4 * cfg.n_layers * cfg.n_heads * cfg.dim_per_head
  prefill = batch * (plen * per_token + head + plen * plen * attn_per_slot)
  decode = batch * new * (per_token + head + (plen + new) * attn_per_slot)
  return float(prefill), float(decode)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "..", "configs",
                                                   "tldr_sim.py"))
  ap.add_argument("--batches", default="64,128")
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--peak-gflops", type=float, default=88.0)
  ap.add_argument("--json", default="", help="also write the numbers here")
  ap.add_argument("--model", action="append", default=[], metavar="KEY=VALUE",
                  help="a model setting (a ModelConfig field), e.g. sliding_window=32")
  args = ap.parse_args()

  config = load_config(args.config)
  mblock = config.model.to_dict()
  for setting in args.model:
    key, value = setting.split("=", 1)
    try:
      mblock[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      mblock[key] = value  # A string, e.g. mlp_activation=gelu_tanh.
  if mblock.get("init_from"):
    path = pretrained.resolve(mblock["init_from"])
    mcfg = pretrained.model_config(path, mblock)
    params = pretrained.params(path, mcfg)
  else:
    mcfg = ModelConfig.from_mapping(mblock)
    params = transformer.init(jax.random.key(0), mcfg)
  plen, rlen = config.format.prompt_len, config.format.response_len
  scfg = sampling.SamplingConfig(max_new_tokens=rlen, temperature=1.0, eos_id=-1, pad_id=0)
  prefill_cfg = sampling.SamplingConfig(max_new_tokens=1, temperature=1.0, eos_id=-1, pad_id=0)
  rng = np.random.default_rng(0)
  peak = matmul_peak()
  print(f"float32 matmul peak measured now: {peak / 1e9:.1f} GFLOP/s")
  print(f"model {mcfg.variant} d{mcfg.d_model} L{mcfg.n_layers} H{mcfg.n_heads} V{mcfg.vocab_size} "
        f"{mcfg.dtype}; prompt_len {plen}, new tokens {rlen}; {jax.devices()[0].device_kind} "
        f"x{jax.device_count()}, {os.cpu_count()} cpus")

  results = []
  for batch in (int(b) for b in args.batches.split(",")):
    prompts = rng.integers(4, mcfg.vocab_size, (batch, plen), dtype=np.int32)
    lengths = rng.integers(plen // 4, plen + 1, batch)  # Left padding: real tokens at the end.
    pmask = np.arange(plen)[None, :] >= (plen - lengths)[:, None]
    prompts[~pmask] = 0
    key = jax.random.key(1)
    total = timeit(lambda: sampling.sample(params, prompts, pmask, key, mcfg, scfg), args.repeats)
    prefill = timeit(lambda: sampling.sample(params, prompts, pmask, key, mcfg, prefill_cfg),
                      args.repeats)
    decode = max(total - prefill, 1e-9)
    f_pre, f_dec = flops(mcfg, batch, plen, rlen)
    row = {
        "batch": batch,
        "samples_per_s": batch / total,
        "tokens_per_s": batch * rlen / total,
        "batch_s": total,
        "prefill_s": prefill,
        "decode_s": decode,
        "prefill_tokens_per_s": batch * plen / prefill,  # Prompt slots, padding included.
        "decode_ms_per_step": 1e3 * decode / max(rlen - 1, 1),
        "decode_tokens_per_s": batch * (rlen - 1) / decode,
        "model_gflops": (f_pre + f_dec) / total / 1e9,
        "fraction_of_peak": (f_pre + f_dec) / total / (args.peak_gflops * 1e9),
        "decode_fraction_of_peak": f_dec / decode / (args.peak_gflops * 1e9),
        "fraction_of_measured_peak": (f_pre + f_dec) / total / peak,
        "sliding_window": mcfg.sliding_window,
    }
    results.append(row)
    print(f"batch {batch:4d}: {row['samples_per_s']:7.1f} samples/s  {row['tokens_per_s']:8.0f} tok/s"
          f"  | batch {total * 1e3:7.1f} ms = prefill {prefill * 1e3:6.1f} ms "
          f"({row['prefill_tokens_per_s']:.0f} prompt tok/s) + decode {decode * 1e3:7.1f} ms "
          f"({row['decode_ms_per_step']:.2f} ms/step, {row['decode_tokens_per_s']:.1f} tok/s)"
          f"  | {row['model_gflops']:5.2f} GFLOP/s = {100 * row['fraction_of_peak']:4.1f}% of "
          f"{args.peak_gflops:g} (decode {100 * row['decode_fraction_of_peak']:4.1f}%), "
          f"{100 * row['fraction_of_measured_peak']:4.1f}% of the measured peak")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(results, f, indent=2)


if __name__ == "__main__":
  main()
