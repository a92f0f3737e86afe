"""Shapes of published models, by short name, as ModelConfig keyword arguments.

Each entry is the architecture of the model's Hugging Face `config.json` (the base model; an
instruct model of the same size has the same shapes): for sizing runs, memory and throughput
estimates, or a fresh model of a known shape. `model_config(name, **overrides)` builds the config;
the weights themselves come from `model.init_from` (see `pretrained`).
"""

from __future__ import annotations

from typing import Any

from rlhfjax.errors import ConfigError
from rlhfjax.models.config import ModelConfig

# Llama 3.1 / 3.2's RoPE: base 500000, "rope_type": "llama3" scaling from an 8192-token original.
_LLAMA3_ROPE = {"rope_theta": 500000.0, "rope_low_freq_factor": 1.0,
                "rope_high_freq_factor": 4.0, "rope_original_max_len": 8192}
_SMOLLM2 = {"variant": "llama", "vocab_size": 49152, "max_len": 8192, "tie_embeddings": True,
            "norm_eps": 1e-5}
_LLAMA3 = {"variant": "llama", "vocab_size": 128256, "max_len": 131072, "norm_eps": 1e-5,
           **_LLAMA3_ROPE}
_QWEN25 = {"variant": "llama", "norm_eps": 1e-6, "rope_theta": 1000000.0, "qkv_bias": True}
# Qwen3 (the post-trained Qwen/Qwen3-* releases; the -Base models have max_position_embeddings
# 32768): per-head q/k RMSNorm, head_dim 128 whatever the width, no biases.
_QWEN3 = {"variant": "llama", "vocab_size": 151936, "norm_eps": 1e-6, "rope_theta": 1000000.0,
          "qk_norm": True, "head_dim": 128, "n_kv_heads": 8, "max_len": 40960}
# Pythia (GPT-NeoX): RoPE on a quarter of each head (rotary_pct 0.25), parallel residual, an untied
# embed_out; n_kv_heads equals n_heads.
_PYTHIA = {"variant": "neox", "max_len": 2048, "norm_eps": 1e-5, "rope_theta": 10000.0,
           "parallel_residual": True, "tie_embeddings": False}

# Gemma 2 and Gemma 3 (text): RMSNorm by 1 + w before and after attention and the MLP, GeGLU with
# the tanh GELU, embeddings times sqrt(d_model), head_dim 256, tied embeddings, scores scaled by
# 1/sqrt(256) (query_pre_attn_scalar), local sliding-window layers between global ones.
_GEMMA = {"variant": "llama", "norm_eps": 1e-6, "tie_embeddings": True, "head_dim": 256,
          "norm_plus_one": True, "sandwich_norm": True, "mlp_activation": "gelu_tanh",
          "embed_scale": True, "query_pre_attn_scalar": 256.0}
# Gemma 2: every other layer local (window 4096), soft-caps 50 (scores) and 30 (logits), RoPE 10k.
_GEMMA2 = {**_GEMMA, "vocab_size": 256000, "max_len": 8192, "rope_theta": 10000.0,
           "sliding_window": 4096, "sliding_window_pattern": 2, "attn_softcap": 50.0,
           "final_softcap": 30.0}
# Gemma 3 (text): q/k norms, five local layers (RoPE base 10k) per global one (base 1M; from 4B on
# with linear scaling by 8), no soft-caps. The 4B and 12B publish a multimodal checkpoint whose
# text model (`text_config`) has these shapes (and a vocabulary of 262208 with the image tokens;
# the text-only 1B has 262144). Shapes as google's config.json files give them (litgpt's table of
# them, and a published copy of the 4B's text_config, agree).
_GEMMA3 = {**_GEMMA, "qk_norm": True, "rope_theta": 1000000.0, "rope_local_theta": 10000.0,
           "sliding_window_pattern": 6, "sliding_window": 1024, "vocab_size": 262208,
           "max_len": 131072, "rope_scaling_type": "linear", "rope_scaling_factor": 8.0}

ARCHITECTURES: dict[str, dict[str, Any]] = {
    "smollm2-135m": {**_SMOLLM2, "d_model": 576, "n_layers": 30, "n_heads": 9, "n_kv_heads": 3,
                     "d_ff": 1536, "rope_theta": 100000.0},
    "smollm2-360m": {**_SMOLLM2, "d_model": 960, "n_layers": 32, "n_heads": 15, "n_kv_heads": 5,
                     "d_ff": 2560, "rope_theta": 100000.0},
    "smollm2-1.7b": {**_SMOLLM2, "d_model": 2048, "n_layers": 24, "n_heads": 32, "n_kv_heads": 32,
                     "d_ff": 8192, "rope_theta": 130000.0},
    "llama3.2-1b": {**_LLAMA3, "d_model": 2048, "n_layers": 16, "n_heads": 32, "n_kv_heads": 8,
                    "d_ff": 8192, "tie_embeddings": True, "rope_scaling_factor": 32.0},
    "llama3.2-3b": {**_LLAMA3, "d_model": 3072, "n_layers": 28, "n_heads": 24, "n_kv_heads": 8,
                    "d_ff": 8192, "tie_embeddings": True, "rope_scaling_factor": 32.0},
    "llama3.1-8b": {**_LLAMA3, "d_model": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8,
                    "d_ff": 14336, "tie_embeddings": False, "rope_scaling_factor": 8.0},
    "llama3.1-70b": {**_LLAMA3, "d_model": 8192, "n_layers": 80, "n_heads": 64, "n_kv_heads": 8,
                     "d_ff": 28672, "tie_embeddings": False, "rope_scaling_factor": 8.0},
    "qwen2.5-0.5b": {**_QWEN25, "vocab_size": 151936, "d_model": 896, "n_layers": 24,
                     "n_heads": 14, "n_kv_heads": 2, "d_ff": 4864, "max_len": 32768,
                     "tie_embeddings": True},
    "qwen2.5-7b": {**_QWEN25, "vocab_size": 152064, "d_model": 3584, "n_layers": 28,
                   "n_heads": 28, "n_kv_heads": 4, "d_ff": 18944, "max_len": 131072,
                   "tie_embeddings": False},
    "qwen3-0.6b": {**_QWEN3, "d_model": 1024, "n_layers": 28, "n_heads": 16, "d_ff": 3072,
                   "tie_embeddings": True},
    "qwen3-1.7b": {**_QWEN3, "d_model": 2048, "n_layers": 28, "n_heads": 16, "d_ff": 6144,
                   "tie_embeddings": True},
    "qwen3-4b": {**_QWEN3, "d_model": 2560, "n_layers": 36, "n_heads": 32, "d_ff": 9728,
                 "tie_embeddings": True},
    "qwen3-8b": {**_QWEN3, "d_model": 4096, "n_layers": 36, "n_heads": 32, "d_ff": 12288,
                 "tie_embeddings": False},
    "gemma-2-2b": {**_GEMMA2, "d_model": 2304, "n_layers": 26, "n_heads": 8, "n_kv_heads": 4,
                   "d_ff": 9216},
    "gemma-2-9b": {**_GEMMA2, "d_model": 3584, "n_layers": 42, "n_heads": 16, "n_kv_heads": 8,
                   "d_ff": 14336},
    "gemma-3-1b": {**_GEMMA3, "vocab_size": 262144, "max_len": 32768, "sliding_window": 512,
                   "rope_scaling_factor": 1.0, "rope_scaling_type": "llama3", "d_model": 1152,
                   "n_layers": 26, "n_heads": 4, "n_kv_heads": 1, "d_ff": 6912},
    "gemma-3-4b": {**_GEMMA3, "d_model": 2560, "n_layers": 34, "n_heads": 8, "n_kv_heads": 4,
                   "d_ff": 10240},
    "gemma-3-12b": {**_GEMMA3, "d_model": 3840, "n_layers": 48, "n_heads": 16, "n_kv_heads": 8,
                    "d_ff": 15360},
    "pythia-1b": {**_PYTHIA, "vocab_size": 50304, "d_model": 2048, "n_layers": 16, "n_heads": 8,
                  "n_kv_heads": 8, "d_ff": 8192, "rotary_dim": 64},
    "pythia-2.8b": {**_PYTHIA, "vocab_size": 50304, "d_model": 2560, "n_layers": 32, "n_heads": 32,
                    "n_kv_heads": 32, "d_ff": 10240, "rotary_dim": 20},
    "pythia-6.9b": {**_PYTHIA, "vocab_size": 50432, "d_model": 4096, "n_layers": 32, "n_heads": 32,
                    "n_kv_heads": 32, "d_ff": 16384, "rotary_dim": 32},
}


def model_config(name: str, **overrides: Any) -> ModelConfig:
  """The ModelConfig of the published model `name`, with `overrides` (e.g. dtype, or fewer layers
  for a scaled-down test) on top; unknown names and keys raise ConfigError naming them."""
  if name not in ARCHITECTURES:
    raise ConfigError(f"unknown architecture {name!r}; known: {', '.join(ARCHITECTURES)}")
  return ModelConfig.from_mapping({**ARCHITECTURES[name], **overrides})
