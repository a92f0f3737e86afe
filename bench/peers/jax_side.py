"""The rlhfjax side of the peer comparison: the same works, shapes and settings as torch_side.py.

  python bench/peers/jax_side.py --work {sample,prefill,rm,ppo,rloo,peak} [--json OUT]
      [--repeats 3]

The model is the GPT-2 shape of the comparison (4 layers, d_model 256, 4 heads, d_ff 1024, vocab
2,000, float32, random weights) with the settings for long sequences on a CPU: `--attention
chunked` in blocks of `--chunk` 128 queries (causal blocks skipped) and the layers unrolled
(`--scan-layers` scans them, as TPU configs with many layers do). Each work is
compiled and run once untimed, then timed `--repeats` times; the best (minimum) seconds per call
count, as on the PyTorch side. Beside the time, each work reports its model FLOPs (analytic: 2 per
matmul parameter per token forward, 6 forward + backward, plus attention's 4 * layers * d_model *
attended keys forward per token, PaLM's accounting with causal attention counted in full) and the
FLOP/s achieved, and the least FLOPs any implementation needs (`least_flops`: causal attention's
half of the score matrix): with the peak, a bound on how fast either side can be. `peak` times a jitted 2048^3 float32 matmul (bench/throughput.py's
`matmul_peak`): the roofline the fraction of peak is taken against; run.py measures it in the same
run. Asserts nothing.

- sample: 64 prompts x 512 tokens, left-padded (real lengths 128-512), + 48 sampled tokens at
  temperature 1, eos disabled: `sampling.sample`, the whole call.
- prefill: the same call with 1 new token.
- rm: one `reward_model.train_step` (Bradley-Terry, AdamW, clip 1.0) on 16 pairs of 512 + 48
  tokens: 32 sequences of 560 in one forward pass.
- ppo: one `ppo.train_step` on 16 episodes of 512 + 48 tokens (experience with policy, reference,
  value and reward models, then 4 epochs of one 16-episode minibatch, separate value network).
- rloo: one whole RLOO iteration, sampling included: 16 prompts of 512 tokens (left-padded) x 2
  samples of 48 tokens, then `rloo.train_step` (2 epochs of minibatches of 16).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from throughput import load_config, matmul_params, matmul_peak  # noqa: E402  (bench/ is not a package)

from rlhfjax.algorithms import online  # noqa: E402
from rlhfjax.algorithms import ppo  # noqa: E402
from rlhfjax.algorithms import reward_model  # noqa: E402
from rlhfjax.algorithms import rloo  # noqa: E402
from rlhfjax.models import heads  # noqa: E402
from rlhfjax.models import sampling  # noqa: E402
from rlhfjax.models import transformer  # noqa: E402
from rlhfjax.models.config import ModelConfig  # noqa: E402
from rlhfjax.training import optimizer  # noqa: E402
from rlhfjax.training.state import TrainState  # noqa: E402

BATCH, PROMPT, NEW = 64, 512, 48
PAIRS, EPISODES, EPOCHS = 16, 16, 4
RLOO_PROMPTS, EPOCHS_RLOO = 16, 2  # RLOO: 16 prompts x k = 2 samples, 2 epochs of minibatch 16.
CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs",
                      "tldr_sim.py")


def model_config(attention: str, chunk: int, scan_layers: bool) -> ModelConfig:
  return ModelConfig(variant="gpt2", vocab_size=2000, d_model=256, n_layers=4, n_heads=4,
                     n_kv_heads=4, d_ff=1024, max_len=1024, tie_embeddings=True, dtype="float32",
                     param_dtype="float32", attention=attention, attention_chunk=chunk,
                     scan_layers=scan_layers)


def best_seconds(fn, repeats: int) -> tuple[float, list[float]]:
  """Minimum wall time of `repeats` calls after one untimed (compiling) call."""
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
  return min(times), times


def forward_flops(cfg: ModelConfig, tokens: int, keys: float) -> float:
  """Forward FLOPs of `tokens` tokens that each attend to `keys` keys (LM head included)."""
  return tokens * (2 * matmul_params(cfg) + 4 * cfg.n_layers * cfg.d_model * keys)


def left_padded(rng: np.random.Generator, n: int, length: int, min_length: int,
                vocab: int) -> tuple[np.ndarray, np.ndarray]:
  """`n` random prompts of real length in [min_length, length], left-padded with 0: (ids, mask)."""
  prompts = rng.integers(4, vocab, (n, length), dtype=np.int32)
  lengths = rng.integers(min_length, length + 1, n)
  mask = np.arange(length)[None, :] >= (length - lengths)[:, None]
  prompts[~mask] = 0
  return prompts, mask


def left_padded_prompts(rng: np.random.Generator, n: int, cfg: ModelConfig):
  return left_padded(rng, n, PROMPT, PROMPT // 4, cfg.vocab_size)


def work_sample(cfg: ModelConfig, repeats: int, new: int) -> dict:
  rng = np.random.default_rng(0)
  params = transformer.init(jax.random.key(0), cfg)
  prompts, mask = left_padded_prompts(rng, BATCH, cfg)
  scfg = sampling.SamplingConfig(max_new_tokens=new, temperature=1.0, eos_id=-1, pad_id=0)
  best, times = best_seconds(
      lambda: sampling.sample(params, prompts, mask, jax.random.key(1), cfg, scfg).tokens, repeats)
  # Prefill: every prompt slot; decode step i: one token over PROMPT + i + 1 cache slots (the
  # sampler's cache has a fixed PROMPT + new slots, all computed).
  flops = forward_flops(cfg, BATCH * PROMPT, PROMPT) + forward_flops(cfg, BATCH * (new - 1),
                                                                     PROMPT + new)
  # The least: causal prefill attends over half its keys; decode step i only over its real ones.
  least = forward_flops(cfg, BATCH * PROMPT, PROMPT / 2) + forward_flops(cfg, BATCH * (new - 1),
                                                                         PROMPT + new / 2)
  return {"seconds": best, "all": times, "flops": flops, "least_flops": least, "batch": BATCH,
          "prompt": PROMPT, "new": new, "tokens_per_s": BATCH * new / best,
          "prompt_tokens_per_s": BATCH * PROMPT / best}


def work_rm(cfg: ModelConfig, repeats: int) -> dict:
  rng = np.random.default_rng(0)
  params = {"backbone": transformer.init(jax.random.key(0), cfg),
            "head": heads.init_scalar_head(jax.random.key(1), cfg.d_model)}
  prompts, mask = left_padded_prompts(rng, PAIRS, cfg)
  batch = {"prompt": prompts, "prompt_mask": mask,
           "chosen": rng.integers(4, cfg.vocab_size, (PAIRS, NEW), dtype=np.int32),
           "chosen_mask": np.ones((PAIRS, NEW), bool),
           "rejected": rng.integers(4, cfg.vocab_size, (PAIRS, NEW), dtype=np.int32),
           "rejected_mask": np.ones((PAIRS, NEW), bool)}
  config = load_config(CONFIG)
  tx = optimizer.adamw(config.rm, 1000)
  step = jax.jit(functools.partial(reward_model.train_step, cfg=cfg, tx=tx), donate_argnums=0)
  state = [TrainState.create(params, tx)]

  def call():
    state[0], m = step(state[0], batch)
    return m["train/loss"]

  best, times = best_seconds(call, repeats)
  seq = PROMPT + NEW
  tokens = 2 * PAIRS * seq
  return {"seconds": best, "all": times, "flops": 3 * forward_flops(cfg, tokens, seq),
          "least_flops": 3 * forward_flops(cfg, tokens, seq / 2), "sequences": 2 * PAIRS,
          "seq": seq, "tokens_per_s": tokens / best}


def work_ppo(cfg: ModelConfig, repeats: int) -> dict:
  rng = np.random.default_rng(0)
  config = load_config(CONFIG)
  c = config.ppo
  c.update(rollout_batch=EPISODES, minibatch_size=EPISODES, epochs=EPOCHS, value_model="separate")
  keys = jax.random.split(jax.random.key(0), 3)
  policy = transformer.init(keys[0], cfg)
  reward = {"backbone": transformer.init(keys[1], cfg),
            "head": heads.init_scalar_head(keys[2], cfg.d_model)}
  tx = ppo.adamw(c)
  params = jax.tree.map(jnp.copy, {"policy": policy, "value": reward})
  state = [ppo.PPOState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                        kl_coef=jnp.asarray(c.kl_coef, jnp.float32))]
  step = jax.jit(functools.partial(ppo.train_step, cfg=cfg, c=c, tx=tx, eos_id=1),
                 donate_argnums=0)
  prompts, mask = left_padded_prompts(rng, EPISODES, cfg)
  response = rng.integers(4, cfg.vocab_size, (EPISODES, NEW), dtype=np.int32)
  batch = {"prompt": prompts, "prompt_mask": mask, "response": response,
           "response_mask": np.ones((EPISODES, NEW), bool)}

  def call():
    state[0], m = step(state[0], policy, reward, batch, jax.random.key(2))
    return m

  best, times = best_seconds(call, repeats)
  seq = PROMPT + NEW
  fwd = forward_flops(cfg, EPISODES * seq, seq)
  # Experience: policy, reference, value and reward forwards; each epoch: policy and value
  # forward + backward.
  passes = 4 + 2 * 3 * EPOCHS
  return {"seconds": best, "all": times, "flops": fwd * passes,
          "least_flops": forward_flops(cfg, EPISODES * seq, seq / 2) * passes,
          "episodes": EPISODES, "epochs": EPOCHS, "episodes_per_s": EPISODES / best}


def work_rloo(cfg: ModelConfig, repeats: int) -> dict:
  """One RLOO iteration as task=rloo runs it: sample k = 2 responses to each of RLOO_PROMPTS
  left-padded prompts (48 new tokens, eos disabled), then one `rloo.train_step` (experience with
  policy, reference and reward models; `EPOCHS_RLOO` epochs of minibatches of 16)."""
  rng = np.random.default_rng(0)
  config = load_config(CONFIG)
  c = config.rloo
  n = RLOO_PROMPTS * c.k
  c.update(rollout_batch=n, minibatch_size=16, epochs=EPOCHS_RLOO)
  keys = jax.random.split(jax.random.key(0), 3)
  policy = transformer.init(keys[0], cfg)
  reward = {"backbone": transformer.init(keys[1], cfg),
            "head": heads.init_scalar_head(keys[2], cfg.d_model)}
  tx = online.adamw(c, online.minibatch_updates_per_step(c))
  state = [TrainState.create({"policy": jax.tree.map(jnp.copy, policy)}, tx)]
  step = jax.jit(functools.partial(rloo.train_step, cfg=cfg, c=c, tx=tx, eos_id=-1),
                 donate_argnums=0)
  unique, unique_mask = left_padded_prompts(rng, RLOO_PROMPTS, cfg)
  # k adjacent samples of each prompt, which the sampler prefills once (as task=rloo does).
  prompts, mask = np.repeat(unique, c.k, 0), np.repeat(unique_mask, c.k, 0)
  scfg = sampling.SamplingConfig(max_new_tokens=NEW, temperature=c.temperature, eos_id=-1, pad_id=0)
  calls = [0]

  def call():
    calls[0] += 1
    key = jax.random.key(calls[0])
    out = sampling.sample(state[0].params["policy"], unique, unique_mask, key, cfg, scfg, k=c.k)
    batch = {"prompt": prompts, "prompt_mask": mask, "response": out.tokens,
             "response_mask": np.ones((n, NEW), bool)}
    state[0], m = step(state[0], policy, reward, batch, jax.random.fold_in(key, 1))
    return m

  best, times = best_seconds(call, repeats)
  seq = PROMPT + NEW
  # Sampling as work_sample, the prefill once per prompt; experience: policy, reference and reward
  # forwards; each epoch: policy forward + backward.
  sample = (forward_flops(cfg, RLOO_PROMPTS * PROMPT, PROMPT)
            + forward_flops(cfg, n * (NEW - 1), seq))
  least_sample = (forward_flops(cfg, RLOO_PROMPTS * PROMPT, PROMPT / 2)
                  + forward_flops(cfg, n * (NEW - 1), PROMPT + NEW / 2))
  passes = 3 + 3 * EPOCHS_RLOO
  if c.share_prompt:  # Each pass runs RLOO_PROMPTS rows of the prompt and its k packed responses.
    packed = PROMPT + c.k * NEW
    fwd = forward_flops(cfg, RLOO_PROMPTS * packed, packed)
    least = (forward_flops(cfg, RLOO_PROMPTS * PROMPT, PROMPT / 2)
             + forward_flops(cfg, n * NEW, PROMPT + NEW / 2))
  else:
    fwd, least = forward_flops(cfg, n * seq, seq), forward_flops(cfg, n * seq, seq / 2)
  return {"seconds": best, "all": times, "flops": sample + fwd * passes,
          "least_flops": least_sample + least * passes, "share_prompt": bool(c.share_prompt),
          "episodes": n, "prompts": RLOO_PROMPTS, "k": c.k, "epochs": EPOCHS_RLOO,
          "episodes_per_s": n / best}


def work_peak(n: int = 2048) -> dict:
  """bench/throughput.py's measured float32 matmul peak, as a work report."""
  flops = 2.0 * n**3
  return {"seconds": flops / matmul_peak(n), "all": [], "flops": flops, "n": n}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--work", required=True,
                  choices=("sample", "prefill", "rm", "ppo", "rloo", "peak"))
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--attention", default="chunked")
  ap.add_argument("--chunk", type=int, default=128, help="queries per block of 'chunked'")
  ap.add_argument("--scan-layers", action="store_true", help="layers as a lax.scan")
  ap.add_argument("--json", default="")
  args = ap.parse_args()
  cfg = model_config(args.attention, args.chunk, args.scan_layers)
  if args.work == "sample":
    out = work_sample(cfg, args.repeats, NEW)
  elif args.work == "prefill":
    out = work_sample(cfg, args.repeats, 1)
  elif args.work == "rm":
    out = work_rm(cfg, args.repeats)
  elif args.work == "ppo":
    out = work_ppo(cfg, args.repeats)
  elif args.work == "rloo":
    out = work_rloo(cfg, args.repeats)
  else:
    out = work_peak()
  out = {"work": args.work, "side": "rlhfjax", "attention": args.attention, "chunk": args.chunk,
         "scan_layers": args.scan_layers,
         "jax": jax.__version__, "device": jax.devices()[0].device_kind, **out,
         "gflops": out["flops"] / out["seconds"] / 1e9}
  print(f"rlhfjax {args.work}: {out['seconds'] * 1e3:.1f} ms best of {args.repeats} "
        f"({out['gflops']:.1f} GFLOP/s)")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(out, f, indent=2)


if __name__ == "__main__":
  main()
