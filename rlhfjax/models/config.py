"""The decoder's hyper-parameters as a hashable value, so jitted functions can take it as static."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from rlhfjax.errors import ConfigError

VARIANTS = ("gpt2", "llama", "neox")
# Rematerialisation in the backward pass (models/transformer.py `checkpointed`): keep every
# activation, recompute each layer from its input, keep the outputs of the projection and MLP
# matmuls, or offload those to pinned host memory.
REMAT = ("none", "full", "dots", "offload")
# The gated MLP's activation (llama variant): SwiGLU's SiLU, or Gemma's tanh-approximated GELU.
MLP_ACTIVATIONS = ("silu", "gelu_tanh")
# RoPE scalings (`rope_scaling_factor` != 1): Llama 3.1's per-wavelength blend, or every frequency
# divided by the factor (transformers' "linear", Gemma 3's global layers).
ROPE_SCALINGS = ("llama3", "linear")
ATTENTION = ("reference", "chunked", "splash", "xla", "cudnn", "auto")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture of a decoder-only transformer.

  `variant="gpt2"`: learned positions, LayerNorm, GELU MLP, biases, tied embeddings.
  `variant="llama"`: RoPE, RMSNorm, SwiGLU MLP, grouped-query attention, no biases (but q, k, v
  biases with `qkv_bias`, as in Qwen2; RMSNorm of each head's q and k with `qk_norm`, as in Qwen3).
  `variant="neox"`: GPT-NeoX (Pythia): RoPE, LayerNorm with biases, exact (erf) GELU MLP, biases on
  every projection; usually with `parallel_residual` and a partial `rotary_dim`.

  Gemma 2 and Gemma 3 are `variant="llama"` with Gemma's switches: `norm_plus_one` (RMSNorm scales
  stored as w - 1), `sandwich_norm` (norms after attention and after the MLP too),
  `mlp_activation="gelu_tanh"` (GeGLU), `embed_scale` (embeddings times sqrt(d_model)),
  `query_pre_attn_scalar`, the soft-caps `attn_softcap` (Gemma 2) and `final_softcap`,
  sliding-window layers (`sliding_window`, `sliding_window_pattern`) and, in Gemma 3, `qk_norm`,
  a RoPE base of their own for the local layers (`rope_local_theta`) and linear RoPE scaling on
  the global ones.
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
  qkv_bias: bool = False  # llama only: biases on the q, k, v projections (Qwen2).
  qk_norm: bool = False  # llama only: RMSNorm of each head's q and k before RoPE (Qwen3).
  # RoPE on each head's first `rotary_dim` dimensions only (GPT-NeoX's rotary_pct); 0: all of them.
  rotary_dim: int = 0
  # x + attn(norm1(x)) + mlp(norm2(x)) in one step (GPT-NeoX's use_parallel_residual), instead of
  # the MLP reading x + attn(norm1(x)).
  parallel_residual: bool = False
  # Llama 3.1's RoPE scaling ("rope_type": "llama3"); factor 1 means none. Wavelengths above
  # original_max_len / low_freq_factor are stretched by the factor, those below
  # original_max_len / high_freq_factor kept, those between interpolated.
  rope_scaling_factor: float = 1.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_len: int = 8192
  rope_scaling_type: str = "llama3"  # One of ROPE_SCALINGS; read only when the factor is not 1.
  # Gemma's switches (llama variant). RMSNorm (q/k norms included) multiplies by 1 + w, its
  # parameters stored as w - 1 and initialised at 0.
  norm_plus_one: bool = False
  # Norms after the attention and after the MLP, before each joins the residual stream, as well as
  # before them (Gemma 2/3's post_attention_layernorm and post_feedforward_layernorm).
  sandwich_norm: bool = False
  mlp_activation: str = "silu"  # One of MLP_ACTIVATIONS: the gated MLP's act(x W_g) * (x W_i).
  # Embeddings times sqrt(d_model), that factor first rounded to the compute dtype (as Gemma does).
  embed_scale: bool = False
  # Attention scores scaled by 1/sqrt(query_pre_attn_scalar), not 1/sqrt(head_dim); 0: head_dim.
  query_pre_attn_scalar: float = 0.0
  # cap * tanh(x / cap) on the attention scores (after scaling) and on the output logits; 0: none.
  attn_softcap: float = 0.0
  final_softcap: float = 0.0
  # Sliding-window attention: a query of a local layer sees the `sliding_window` latest positions
  # (itself included), counted in positions, not array slots. 0: every layer global.
  sliding_window: int = 0
  # With a window: layer i (from 0) is global when (i + 1) % pattern == 0, local otherwise (Gemma 2:
  # 2, Gemma 3: 6); 0: every layer local.
  sliding_window_pattern: int = 0
  # RoPE base of the local layers, never scaled (Gemma 3's rope_local_base_freq); 0: the local
  # layers rotate as the global ones do (rope_theta, and its scaling).
  rope_local_theta: float = 0.0
  dropout: float = 0.0
  dtype: str = "float32"  # Activations.
  param_dtype: str = "float32"  # float32 master weights (and AdamW moments) under bf16 `dtype`.
  # Run the layers as one `lax.scan` (compile time independent of depth) or unrolled (XLA's cost
  # analysis then counts every layer; rlhfjax/stages/compile.py uses it to count a step's work).
  scan_layers: bool = True
  # One of REMAT, by name (not a bool).
  remat: str = "none"
  # Attention kernel: one of ATTENTION; "auto" picks one per platform (see models/attention.py).
  attention: str = "reference"
  attention_chunk: int = 512  # Queries per block of attention="chunked".

  def __post_init__(self):
    if str(self.remat).lower() in ("true", "false"):  # A bool, or one from the command line.
      raise ConfigError(f"model.remat must be one of {REMAT}, by name, got {self.remat!r} (for "
                        "True say 'full', for False 'none')")
    if self.remat not in REMAT:
      raise ConfigError(f"model.remat must be one of {REMAT}, got {self.remat!r}")
    if self.variant not in VARIANTS:
      raise ConfigError(f"model.variant must be one of {VARIANTS}, got {self.variant!r}")
    if self.n_heads % self.n_kv_heads:
      raise ConfigError(
          f"model.n_heads ({self.n_heads}) must be a multiple of model.n_kv_heads ({self.n_kv_heads})")
    if not self.head_dim and self.d_model % self.n_heads:
      raise ConfigError(
          f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})")
    if self.attention not in ATTENTION:
      raise ConfigError(f"model.attention must be one of {ATTENTION}, got {self.attention!r}")
    if self.attention != "reference" and self.dropout > 0:
      raise ConfigError(f"model.attention={self.attention!r} has no attention dropout: use "
                        f"model.attention='reference' with model.dropout={self.dropout}")
    if self.attention == "cudnn" and self.dtype not in ("bfloat16", "float16"):
      raise ConfigError(f"model.attention='cudnn' takes bfloat16 or float16 activations, got "
                        f"model.dtype={self.dtype!r}")
    if self.attention == "cudnn" and (self.dim_per_head % 8 or self.dim_per_head > 256):
      raise ConfigError(f"model.attention='cudnn' takes head dims that are multiples of 8 up to "
                        f"256, got {self.dim_per_head}")
    if self.attention_chunk < 1:
      raise ConfigError(f"model.attention_chunk must be positive, got {self.attention_chunk}")
    if self.qkv_bias and self.variant != "llama":
      raise ConfigError("model.qkv_bias is for the llama variant (gpt2 and neox always have their "
                        "biases)")
    if self.qk_norm and self.variant != "llama":
      raise ConfigError(f"model.qk_norm is for the llama variant, not {self.variant!r}")
    if self.rotary_dim and self.variant == "gpt2":
      raise ConfigError("model.rotary_dim is for the RoPE variants (llama, neox); gpt2 has learned "
                        "positions")
    if self.rotary_dim < 0 or self.rotary_dim % 2 or self.rotary_dim > self.dim_per_head:
      raise ConfigError(f"model.rotary_dim must be an even number of dimensions up to the head's "
                        f"{self.dim_per_head} (0: all), got {self.rotary_dim}")
    if self.rope_scaling_type not in ROPE_SCALINGS:
      raise ConfigError(f"model.rope_scaling_type must be one of {ROPE_SCALINGS}, got "
                        f"{self.rope_scaling_type!r}")
    if self.mlp_activation not in MLP_ACTIVATIONS:
      raise ConfigError(f"model.mlp_activation must be one of {MLP_ACTIVATIONS}, got "
                        f"{self.mlp_activation!r}")
    gemma = {"norm_plus_one": self.norm_plus_one, "sandwich_norm": self.sandwich_norm,
             "mlp_activation": self.mlp_activation != "silu"}
    for key, on in gemma.items():
      if on and self.variant != "llama":
        raise ConfigError(f"model.{key} is for the llama variant, not {self.variant!r}")
    for key in ("query_pre_attn_scalar", "attn_softcap", "final_softcap", "sliding_window",
                "sliding_window_pattern", "rope_local_theta"):
      if getattr(self, key) < 0:
        raise ConfigError(f"model.{key} must not be negative, got {getattr(self, key)}")
    if self.rope_local_theta and not self.sliding_window:
      raise ConfigError("model.rope_local_theta is the RoPE base of sliding-window layers: set "
                        "model.sliding_window too")
    if self.attn_softcap and self.attention in ("xla", "cudnn"):
      raise ConfigError(f"model.attention={self.attention!r} has no attention soft-cap "
                        f"(model.attn_softcap={self.attn_softcap}): use 'chunked', 'splash', "
                        "'reference' or 'auto'")
    if self.rope_scaling_factor != 1 and self.rope_scaling_type == "llama3" and not (
        self.rope_low_freq_factor < self.rope_high_freq_factor):
      raise ConfigError(f"model.rope_low_freq_factor ({self.rope_low_freq_factor}) must be below "
                        f"model.rope_high_freq_factor ({self.rope_high_freq_factor})")

  @property
  def dim_per_head(self) -> int:
    return self.head_dim or self.d_model // self.n_heads

  @property
  def local_layers(self) -> tuple[bool, ...]:
    """Whether each layer attends through the sliding window (all False without one)."""
    p = self.sliding_window_pattern
    return tuple(bool(self.sliding_window) and (p == 0 or (i + 1) % p != 0)
                 for i in range(self.n_layers))

  @property
  def attn_scale_dim(self) -> float:
    """Attention scores are divided by the square root of this."""
    return self.query_pre_attn_scalar or self.dim_per_head

  @property
  def rotary_dims(self) -> int:
    """How many of each head's dimensions RoPE rotates (the first ones)."""
    return self.rotary_dim or self.dim_per_head

  @property
  def layer_norm(self) -> bool:
    """LayerNorm with biases (gpt2, neox) rather than RMSNorm (llama)."""
    return self.variant in ("gpt2", "neox")

  @property
  def biases(self) -> bool:
    """Biases on every projection and norm (gpt2, neox)."""
    return self.variant in ("gpt2", "neox")

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
