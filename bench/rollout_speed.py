"""The quickstart's rollout with and without early stop (and with the KV cache read in blocks),
through the rollout engine as PPO draws it, beside this device's measured matmul peak.

  python bench/rollout_speed.py --workdir runs/quickstart [--config configs/tldr_sim.py]
                                [--rollouts 4] [--cache-block 16] [--json out.json]

With `--workdir` a finished quickstart run (its tokenizer and SFT policy) samples, so responses end
at their eos as in PPO; without one, a random policy of the config's model (which rarely emits
eos: early stop then saves nothing, and says so). The blocked setting decodes in blocks of
`--cache-block` steps (default 16: the quickstart's 47 decode steps in 3 blocks; its config's 128
makes one). Each setting draws `--rollouts` PPO rollouts
(`ppo.rollout_batch` unlabeled prompts at `ppo.temperature`, the same prompts and keys for every
setting) after one untimed call that compiles; the best of 3 passes is kept. Printed per setting:
seconds per rollout, decode steps run (the longest response, plus one) against `response_len`,
mean response length, tokens/s, and the tokens each setting sampled are compared with the first
setting's. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import numpy as np

from rlhfjax import config_file
from rlhfjax import runtime
from rlhfjax.data import pipeline
from rlhfjax.models import transformer
from rlhfjax.rollout import engine
from rlhfjax.training import experiment
from rlhfjax.training import loaders
from throughput import matmul_peak

SETTINGS = {"full length, every slot": dict(early_stop=False, cache_block=0),
            "early stop, every slot": dict(early_stop=True, cache_block=0),
            "early stop, cache blocks": dict(early_stop=True, cache_block=None)}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "..", "configs",
                                                   "tldr_sim.py"))
  ap.add_argument("--workdir", default="", help="a finished quickstart run (tokenizer, SFT)")
  ap.add_argument("--rollouts", type=int, default=4)
  ap.add_argument("--cache-block", type=int, default=16)
  ap.add_argument("--json", default="", help="also write the numbers here")
  args = ap.parse_args()

  config = config_file.load(args.config)
  runtime.apply(config.get("runtime"), config.model.dtype)  # As rlhfjax.main runs.
  workdir = args.workdir or os.path.join("/tmp", "rlhfjax-rollout-bench")
  exp = experiment.prepare(config, workdir)
  trained = bool(args.workdir)
  params = (loaders.load_policy(exp) if trained
            else transformer.init(jax.random.key(0), exp.model))
  c, fmt = config.ppo, config.format
  examples = exp.splits["unlabeled"]
  prompts = pipeline.encode_prompts(exp.tokenizer, examples, fmt.prompt_len)
  batches = [exp.parallel.put_batch(prompts, pipeline.batch_indices(len(examples), c.rollout_batch,
                                                                    config.seed, i))
             for i in range(args.rollouts)]
  peak = matmul_peak()
  print(f"{'SFT policy of ' + args.workdir if trained else 'random policy'}: "
        f"{exp.model.variant} d{exp.model.d_model} L{exp.model.n_layers}; rollout_batch "
        f"{c.rollout_batch}, prompt_len {fmt.prompt_len}, response_len {fmt.response_len}, "
        f"{jax.devices()[0].device_kind} x{jax.device_count()}, "
        f"{os.cpu_count()} cpus; matmul peak {peak / 1e9:.0f} GFLOP/s (float32, measured now)")

  results, first = [], None
  for name, setting in SETTINGS.items():
    setting = {**setting, "cache_block": (args.cache_block if setting["cache_block"] is None
                                          else setting["cache_block"])}
    exp.config.rollout.update(setting)
    draw = lambda: [engine.sample_batch(params, b, jax.random.fold_in(jax.random.key(7), i), exp,
                                        c.temperature) for i, b in enumerate(batches)]
    jax.block_until_ready(draw())  # Compiles.
    best = float("inf")
    for _ in range(3):
      t = time.perf_counter()
      out = jax.block_until_ready(draw())
      best = min(best, (time.perf_counter() - t) / args.rollouts)
    tokens = np.concatenate([np.asarray(o["response"]) for o in out])
    lengths = np.concatenate([np.asarray(o["response_mask"]).sum(-1) for o in out])
    steps = [min(int(np.asarray(o["response_mask"]).sum(-1).max()) + 1, fmt.response_len)
             if setting["early_stop"] else fmt.response_len for o in out]
    same = "" if first is None else (", same tokens as the first" if np.array_equal(tokens, first)
                                     else ", TOKENS DIFFER from the first")
    first = tokens if first is None else first
    row = {"setting": name, **setting,
           "seconds_per_rollout": best, "decode_steps": float(np.mean(steps)),
           "mean_length": float(lengths.mean()),
           "ended": float((lengths < fmt.response_len).mean()),
           "tokens_per_s": float(lengths.sum()) / args.rollouts / best,
           "matmul_peak_gflops": peak / 1e9}
    results.append(row)
    print(f"{name:26s}: {best * 1e3:8.1f} ms per rollout, {row['decode_steps']:5.1f} of "
          f"{fmt.response_len} decode steps, mean length {row['mean_length']:.1f} "
          f"({100 * row['ended']:.0f}% ended), {row['tokens_per_s']:7.0f} response tok/s{same}")
  base = results[0]["seconds_per_rollout"]
  for r in results[1:]:
    print(f"{r['setting']}: {base / r['seconds_per_rollout']:.2f}x the full-length loop")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(results, f, indent=2)


if __name__ == "__main__":
  main()
