"""The shapes of the GPU comparison (bench/gpu.py), shared by its two sides.

Plain Python, no jax or torch: the PyTorch side imports it from its own interpreter. `GPU_1B` is
the Llama 3.2 1B table of issue #24 (shared/notes/gpu.md's shapes); `TINY` is the same works
scaled down so the whole command runs in a few minutes on a 2-core CPU (`--tiny`).
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Preset:
  """Model and shapes of every work; both sides read the same instance."""

  name: str
  arch: str  # rlhfjax.models.architectures name.
  overrides: dict[str, Any]  # ModelConfig fields on top of `arch` (the scale-down of TINY).
  dtype: str  # Parameters and compute, both sides.
  peak_n: int  # The measured matmul peak: one jitted peak_n^3 matmul in `dtype`.
  stream_mib: int  # The measured memory bandwidth: x * 2 over an array of this many MiB.
  seq_batch: int  # SFT sequences per step; the RM step's seq_batch / 2 pairs.
  seq_prompt: int  # SFT and RM: prompt tokens (all real) ...
  seq_response: int  # ... then response tokens (all real).
  sample_batch: int  # Sampling: prompts (all real tokens) ...
  sample_prompt: int
  sample_new: int  # ... and new tokens, eos disabled.
  episodes: int  # PPO and RLOO: episodes per iteration.
  rl_prompt: int  # Their prompts, left-padded: real lengths in [rl_min_prompt, rl_prompt].
  rl_min_prompt: int
  rl_response: int  # Sampled tokens per episode, eos disabled.
  epochs: int  # Passes over the rollout ...
  minibatch: int  # ... in minibatches of this many episodes.
  rloo_k: int  # RLOO: samples per prompt (episodes / rloo_k prompts).

  @property
  def rm_pairs(self) -> int:
    return self.seq_batch // 2


GPU_1B = Preset(
    name="gpu-1b", arch="llama3.2-1b", overrides={}, dtype="bfloat16", peak_n=8192,
    stream_mib=2048, seq_batch=8, seq_prompt=1024, seq_response=1024, sample_batch=64,
    sample_prompt=512, sample_new=128, episodes=64, rl_prompt=512, rl_min_prompt=256,
    rl_response=128, epochs=2, minibatch=16, rloo_k=2)

TINY = Preset(
    name="tiny", arch="llama3.2-1b",
    overrides={"n_layers": 2, "d_model": 128, "n_heads": 4, "n_kv_heads": 2, "d_ff": 512,
               "vocab_size": 2048},
    dtype="float32", peak_n=1024, stream_mib=64, seq_batch=4, seq_prompt=64, seq_response=64,
    sample_batch=8, sample_prompt=64, sample_new=16, episodes=16, rl_prompt=64, rl_min_prompt=32,
    rl_response=16, epochs=2, minibatch=4, rloo_k=2)

PRESETS = {p.name: p for p in (GPU_1B, TINY)}
