"""The decoder's hyper-parameters as a hashable value, so jitted functions can take it as static."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from rlhfjax.errors import ConfigError

VARIANTS = ("gpt2", "llama")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture of a decoder-only transformer.

  `variant="gpt2"`: learned positions, LayerNorm, GELU MLP, biases, tied embeddings.
  `variant="llama"`: RoPE, RMSNorm, SwiGLU MLP, grouped-query attention, no biases.
  """

  variant: str = "gpt2"
  vocab_size: int = 2048
  d_model: int = 128
  n_layers: int = 4
  n_heads: int = 4
  n_kv_heads: int = 4
  d_ff: int = 512
  max_len: int = 256
  head_dim: int = 0  # 0 means d_model // n_heads.
  tie_embeddings: bool = True
  norm_eps: float = 1e-5
  rope_theta: float = 10000.0
  dropout: float = 0.0
  dtype: str = "float32"  # Activations.
  param_dtype: str = "float32"
  remat: bool = False

  def __post_init__(self):
    if self.variant not in VARIANTS:
      raise ConfigError(f"model.variant must be one of {VARIANTS}, got {self.variant!r}")
    if self.n_heads % self.n_kv_heads:
      raise ConfigError(
          f"model.n_heads ({self.n_heads}) must be a multiple of model.n_kv_heads ({self.n_kv_heads})")
    if not self.head_dim and self.d_model % self.n_heads:
      raise ConfigError(
          f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})")

  @property
  def dim_per_head(self) -> int:
    return self.head_dim or self.d_model // self.n_heads

  @classmethod
  def from_mapping(cls, mapping: Mapping[str, Any]) -> "ModelConfig":
    """Builds from a config block (e.g. `config.model`), naming any unknown key."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(mapping) - names)
    if unknown:
      raise ConfigError(f"unknown model config key(s): {', '.join('model.' + k for k in unknown)}")
    return cls(**dict(mapping))

  def replace(self, **kwargs) -> "ModelConfig":
    return dataclasses.replace(self, **kwargs)
