"""Hugging Face checkpoints (`config.json` + safetensors) in and out of rlhfjax parameters.

`load(directory)` reads `model.safetensors`, or the shards that `model.safetensors.index.json`
lists, with the architecture taken from `config.json` alone; `save(params, cfg, directory)` writes
both files so that transformers loads them as `LlamaForCausalLM`, `Qwen2ForCausalLM`,
`Qwen3ForCausalLM`, `Gemma2ForCausalLM`, `Gemma3ForCausalLM`, `GPTNeoXForCausalLM` or
`GPT2LMHeadModel`. Supported:

- LLaMA family (`model_type` llama, mistral without a sliding window, or qwen2 without one):
  `model.embed_tokens`, `model.layers.N.{self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj,
  input_layernorm, post_attention_layernorm}`, `model.norm`, `lm_head` unless tied. Linear weights
  are PyTorch's [out, in]. HF's LLaMA applies RoPE in the rotate-half form, as `transformer._rope`
  does, so q and k load unpermuted (only GGUF files need `import_gguf.unpermute`). Qwen2 is LLaMA
  with `self_attn.{q,k,v}_proj.bias` (ModelConfig.qkv_bias; a model with it exports as qwen2).
  RoPE is plain or Llama 3.1's scaling (`rope_type` llama3); other scalings are refused.
  Qwen3 is LLaMA with `self_attn.{q,k}_norm.weight`, an RMSNorm of each head's q and k before RoPE
  (ModelConfig.qk_norm; a model with it exports as qwen3), no biases, and `head_dim` from the config
  (transformers' default 128 when absent).
- Gemma 2 (`gemma2`) and Gemma 3's text model (`gemma3_text`, `Gemma3ForCausalLM`): LLaMA's tensor
  names plus `post_attention_layernorm` (after attention: ModelConfig.sandwich_norm),
  `pre_feedforward_layernorm` (LLaMA's post_attention_layernorm: before the MLP) and
  `post_feedforward_layernorm`, every RMSNorm weight stored as w - 1 (norm_plus_one), the MLP
  GeGLU with `hidden_activation` a tanh GELU, embeddings scaled by sqrt(hidden_size) (embed_scale),
  scores by 1/sqrt(`query_pre_attn_scalar`), `attn_logit_softcapping` (Gemma 2; Gemma 3 must leave
  it null, as transformers' Gemma 3 ignores it) and `final_logit_softcapping`, `sliding_window`
  layers as `layer_types` lists them (or `sliding_window_pattern`: every p-th layer global; other
  arrangements are refused). Gemma 3 adds `self_attn.{q,k}_norm` (qk_norm) and RoPE per layer
  type: `rope_parameters.sliding_attention` (transformers 4: `rope_local_base_freq`, plain RoPE)
  and `.full_attention` (`rope_theta` and `rope_scaling`: plain or linear). Tied embeddings unless
  `tie_word_embeddings` is false. The multimodal `gemma3` checkpoints (4B and up, with a vision
  tower) are refused: export their text model as `gemma3_text` first.
- GPT-NeoX / Pythia (`GPTNeoXForCausalLM`): `gpt_neox.embed_in`, `gpt_neox.layers.N.{
  input_layernorm, post_attention_layernorm, attention.query_key_value, attention.dense,
  mlp.dense_h_to_4h, mlp.dense_4h_to_h}` (weights [out, in], all with biases, LayerNorms too),
  `gpt_neox.final_layer_norm`, and the untied head `embed_out` (transformers 5 calls it `lm_head`;
  both load, `embed_out` is written). `query_key_value` is fused per head: its output rows are
  [n_heads, 3 (q, k, v), head_dim]. RoPE covers each head's first `rotary_pct` of dimensions
  (ModelConfig.rotary_dim) with base `rotary_emb_base` (or transformers 5's `rope_parameters`);
  `use_parallel_residual` is ModelConfig.parallel_residual; the MLP's `hidden_act` must be the exact
  GELU ("gelu").
- GPT-2 (`GPT2LMHeadModel`, names with or without the `transformer.` prefix): `wte`, `wpe`,
  `h.N.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}`, `ln_f`. These are Conv1D
  layers, whose weights are [in, out]; `c_attn` holds q, k and v side by side. rlhfjax's GPT-2 MLP
  uses the tanh approximation of GELU, so only the `activation_function`s computing that load.

Unsupported settings, and missing, misshapen or unexpected tensors raise `ConfigError` naming the
file and the key. bfloat16 tensors read as `ml_dtypes.bfloat16` arrays (importing ml_dtypes
registers the type with numpy, which older safetensors versions need). Parameters come back as
numpy arrays, as from `import_gguf.load`. Dropout and rematerialisation are training settings, not
part of a checkpoint: `load` returns them off and `save` writes zero dropout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any, Callable, Sequence

import jax
import ml_dtypes
import numpy as np

from rlhfjax.errors import ConfigError, DataError
from rlhfjax.models import heads
from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"

LLAMA_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
               "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
GEMMA_TYPES = {"gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
LAYER_TYPES = ("sliding_attention", "full_attention")
GPT2_CLASS = "GPT2LMHeadModel"
NEOX_CLASS = "GPTNeoXForCausalLM"
NEOX_HEAD = "embed_out.weight"  # GPT-NeoX's untied head as published (transformers 5: lm_head).
# Every model_type `load` reads, in the order errors list them.
SUPPORTED = (*LLAMA_TYPES, *GEMMA_TYPES, "gpt2", "gpt_neox")
# Reward models (`save(..., reward_pad_id=...)`): the decoder plus a one-label `score` layer.
REWARD_CLASSES = {"llama": "LlamaForSequenceClassification",
                  "mistral": "MistralForSequenceClassification",
                  "qwen2": "Qwen2ForSequenceClassification",
                  "qwen3": "Qwen3ForSequenceClassification",
                  "gemma2": "Gemma2ForSequenceClassification",
                  "gemma3_text": "Gemma3TextForSequenceClassification",
                  "gpt2": "GPT2ForSequenceClassification",
                  "gpt_neox": "GPTNeoXForSequenceClassification"}
# The keys of a `rope_type: llama3` scaling block, and the ModelConfig field each sets.
LLAMA3_ROPE = {"factor": "rope_scaling_factor", "low_freq_factor": "rope_low_freq_factor",
               "high_freq_factor": "rope_high_freq_factor",
               "original_max_position_embeddings": "rope_original_max_len"}
# transformers' activations computing 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_accurate")
# Buffers some checkpoints carry that are not parameters: GPT-2's and GPT-NeoX's causal masks, old
# LLaMA and GPT-NeoX inv_freq.
_BUFFERS = re.compile(r"(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)"
                      r"|model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq"
                      r"|gpt_neox\.layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)")
DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
          "bfloat16": np.dtype(ml_dtypes.bfloat16)}

Tensors = dict[str, np.ndarray]


def _read_json(path: str) -> dict[str, Any]:
  if not os.path.exists(path):
    raise FileNotFoundError(f"not found: {path}")
  with open(path, encoding="utf-8") as f:
    try:
      return json.load(f)
    except json.JSONDecodeError as e:
      raise DataError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from e


def _key(config: dict[str, Any], path: str, key: str, default: Any = ...) -> Any:
  """config[key], or `default`; a missing key without a default names the file and key."""
  if key in config and config[key] is not None:
    return config[key]
  if default is ...:
    raise ConfigError(f"{path}: missing key {key!r}")
  return default


def _rope_settings(config: dict[str, Any], path: str, theta_key: str = "rope_theta"
                   ) -> dict[str, Any]:
  """ModelConfig's RoPE fields: the base (`theta_key`, or `rope_theta` of transformers 5's
  `rope_parameters`), and Llama 3.1's scaling (`rope_type` llama3) if set; other scalings (linear,
  dynamic, yarn, ...) are refused."""
  out = {"rope_theta": float(_key(config, path, theta_key, 10000.0))}
  for key in ("rope_scaling", "rope_parameters"):  # The latter: transformers 5's config layout.
    rope = config.get(key) or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "llama3":
      missing = [k for k in LLAMA3_ROPE if rope.get(k) is None]
      if missing:
        raise ConfigError(f"{path}: {key} of type 'llama3' lacks {', '.join(missing)}")
      out.update({field: type(getattr(ModelConfig, field))(rope[k])
                  for k, field in LLAMA3_ROPE.items()})
    elif kind != "default":
      raise ConfigError(f"{path}: {key} of type {kind!r} is not supported "
                        "(plain RoPE or llama3 only)")
    out["rope_theta"] = float(rope.get("rope_theta", out["rope_theta"]))
  return out


def model_config(directory: str, dtype: str = "float32") -> ModelConfig:
  """The ModelConfig of the checkpoint in `directory`, from its `config.json` (no tensor is read)."""
  path = os.path.join(directory, CONFIG)
  return config_from_json(_read_json(path), path, dtype)


def config_from_json(config: dict[str, Any], path: str = CONFIG,
                     dtype: str = "float32") -> ModelConfig:
  """The ModelConfig a parsed `config.json` describes (`path` names it in errors)."""
  model_type = config.get("model_type")
  if model_type == "gemma3":
    raise ConfigError(f"{path}: model_type 'gemma3' (Gemma 3 with its vision tower) is not "
                      f"supported: rlhfjax reads Gemma 3's text model, model_type 'gemma3_text' "
                      f"({', '.join(SUPPORTED)})")
  if model_type not in SUPPORTED:
    raise ConfigError(f"{path}: model_type {model_type!r} is not supported "
                      f"({', '.join(SUPPORTED)})")
  if model_type in LLAMA_TYPES:  # The LLaMA family reads any of its classes.
    allowed = (*LLAMA_TYPES.values(), *(REWARD_CLASSES[t] for t in LLAMA_TYPES))
  else:
    allowed = ({"gpt2": GPT2_CLASS, "gpt_neox": NEOX_CLASS, **GEMMA_TYPES}[model_type],
               REWARD_CLASSES[model_type])
  archs = config.get("architectures") or list(allowed[:1])
  if not set(archs) & set(allowed):
    raise ConfigError(f"{path}: architectures {archs} has no model rlhfjax reads ({allowed})")
  if model_type in LLAMA_TYPES:
    return _llama_config(config, path, dtype)
  if model_type in GEMMA_TYPES:
    return _gemma_config(config, path, dtype)
  if model_type == "gpt_neox":
    return _neox_config(config, path, dtype)
  return _gpt2_config(config, path, dtype)


def _refuse_others(config: dict[str, Any], path: str, fixed: dict[str, Any]) -> None:
  """Each key of `fixed` must be absent or hold its one supported value."""
  for key, want in fixed.items():
    if _key(config, path, key, want) != want:
      raise ConfigError(f"{path}: {key}={config[key]!r} is not supported ({want!r} only)")


def _llama_config(config: dict[str, Any], path: str, dtype: str) -> ModelConfig:
  """LLaMA, Mistral, Qwen2 (whose q, k and v projections always have biases, o and the MLP
  none, and whose `sliding_window` applies only with `use_sliding_window`) or Qwen3 (no biases
  but per-head q/k RMSNorm, `head_dim` 128 unless set, sliding window as Qwen2's)."""
  get = lambda key, default=...: _key(config, path, key, default)
  model_type = config["model_type"]
  qwen = model_type in ("qwen2", "qwen3")
  fixed = {"hidden_act": "silu", **({"use_sliding_window": False} if qwen else {}),
           **({"attention_bias": False} if model_type != "qwen2" else {}),
           **({"mlp_bias": False} if not qwen else {})}
  _refuse_others(config, path, fixed)
  max_len = int(get("max_position_embeddings"))
  window = None if qwen else config.get("sliding_window")
  if window is not None and int(window) < max_len:
    raise ConfigError(f"{path}: sliding_window={window} is not supported (full attention only)")
  kinds = sorted(set(config.get("layer_types") or ["full_attention"]) - {"full_attention"})
  if kinds:
    raise ConfigError(f"{path}: layer_types {kinds} is not supported (full_attention only)")
  d, h = int(get("hidden_size")), int(get("num_attention_heads"))
  return ModelConfig(
      variant="llama", vocab_size=int(get("vocab_size")), d_model=d,
      n_layers=int(get("num_hidden_layers")), n_heads=h,
      n_kv_heads=int(get("num_key_value_heads", h)),
      d_ff=int(get("intermediate_size")), max_len=max_len,
      head_dim=int(get("head_dim", 128 if model_type == "qwen3" else 0)),  # Qwen3Config's default.
      tie_embeddings=bool(get("tie_word_embeddings", False)),  # LlamaConfig's default.
      norm_eps=float(get("rms_norm_eps", 1e-6)), qkv_bias=model_type == "qwen2",
      qk_norm=model_type == "qwen3", **_rope_settings(config, path), dtype=dtype,
      param_dtype=dtype)


def _window_pattern(config: dict[str, Any], path: str, n_layers: int, default: int) -> int:
  """ModelConfig.sliding_window_pattern from `layer_types` (transformers 5), else
  `sliding_window_pattern` (or `default`): every p-th layer full_attention, the others
  sliding_attention (0: all sliding; -1 stands for all full, no window)."""
  types = config.get("layer_types")
  if types is None:
    return int(config.get("sliding_window_pattern") or default)
  unknown = sorted(set(types) - set(LAYER_TYPES))
  if unknown or len(types) != n_layers:
    raise ConfigError(f"{path}: layer_types must list {n_layers} of {LAYER_TYPES}, got {types}")
  if "full_attention" not in types:  # All local: the family's pattern if it says as much.
    p = int(config.get("sliding_window_pattern") or default)
    return p if n_layers < p else 0
  if "sliding_attention" not in types:
    return -1
  p = types.index("full_attention") + 1
  if types != [LAYER_TYPES[(i + 1) % p == 0] for i in range(n_layers)]:
    raise ConfigError(f"{path}: layer_types {types} is not supported (every p-th layer "
                      "full_attention, the others sliding_attention)")
  return p


def _gemma_rope(config: dict[str, Any], path: str, gemma3: bool) -> dict[str, Any]:
  """ModelConfig's RoPE fields of Gemma 2 (one plain RoPE) or Gemma 3 (the local layers' plain RoPE
  and the global layers' own base, plain or linearly scaled), in transformers 5's
  `rope_parameters` or transformers 4's keys."""
  if not gemma3:
    rope = _rope_settings(config, path)
    if "rope_scaling_factor" in rope:
      raise ConfigError(f"{path}: rope scaling is not supported for gemma2 (plain RoPE only)")
    return rope
  params = config.get("rope_parameters") or {}
  if set(params) & set(LAYER_TYPES):  # transformers 5: one block per layer type.
    full, local, where = (params.get("full_attention") or {}, params.get("sliding_attention") or {},
                          "rope_parameters.")
  else:  # transformers 4: the global layers' rope_theta and rope_scaling, the local base apart.
    full = {**(config.get("rope_scaling") or {}), **params}
    full.setdefault("rope_theta", config.get("rope_theta") or 1e6)
    local = {"rope_theta": config.get("rope_local_base_freq") or 1e4}
    where = ""
  kinds = {n: b.get("rope_type", b.get("type", "default"))
           for n, b in (("full_attention", full), ("sliding_attention", local))}
  if kinds["sliding_attention"] != "default":
    raise ConfigError(f"{path}: {where}sliding_attention rope_type {kinds['sliding_attention']!r} "
                      "is not supported (plain RoPE on the sliding-window layers only)")
  if kinds["full_attention"] not in ("default", "linear"):
    raise ConfigError(f"{path}: {where}full_attention rope_type {kinds['full_attention']!r} is not "
                      "supported (plain or linear RoPE on the global layers)")
  out = {"rope_theta": float(full.get("rope_theta") or 1e6),
         "rope_local_theta": float(local.get("rope_theta") or 1e4)}
  if kinds["full_attention"] == "linear":
    out.update(rope_scaling_type="linear", rope_scaling_factor=float(_key(full, path, "factor")))
  return out


def _gemma_config(config: dict[str, Any], path: str, dtype: str) -> ModelConfig:
  """Gemma 2 or Gemma 3's text model (transformers' Gemma2Config / Gemma3TextConfig defaults for
  absent keys)."""
  get = lambda key, default=...: _key(config, path, key, default)
  gemma3 = config["model_type"] == "gemma3_text"
  act = get("hidden_activation", "gelu_pytorch_tanh")
  if act not in TANH_GELUS:
    raise ConfigError(f"{path}: hidden_activation={act!r} is not supported: rlhfjax's Gemma MLP is "
                      f"GeGLU with the tanh approximation of GELU ({', '.join(TANH_GELUS)})")
  _refuse_others(config, path, {"attention_bias": False, "use_bidirectional_attention": False})
  # Present as null means off; absent means the config class's default.
  attn_cap = config.get("attn_logit_softcapping", None if gemma3 else 50.0)
  if attn_cap is not None and gemma3:
    raise ConfigError(f"{path}: attn_logit_softcapping={attn_cap!r} is not supported for "
                      "gemma3_text (transformers' Gemma 3 does not apply it; null only)")
  final_cap = config.get("final_logit_softcapping", None if gemma3 else 30.0)
  n_layers = int(get("num_hidden_layers"))
  pattern = _window_pattern(config, path, n_layers, default=6 if gemma3 else 2)
  window = 0 if pattern == -1 else int(get("sliding_window", 4096))
  d, h = int(get("hidden_size")), int(get("num_attention_heads"))
  return ModelConfig(
      variant="llama", vocab_size=int(get("vocab_size")), d_model=d, n_layers=n_layers, n_heads=h,
      n_kv_heads=int(get("num_key_value_heads", h)), d_ff=int(get("intermediate_size")),
      max_len=int(get("max_position_embeddings")), head_dim=int(get("head_dim", 256)),
      tie_embeddings=bool(get("tie_word_embeddings", True)),
      norm_eps=float(get("rms_norm_eps", 1e-6)), qk_norm=gemma3, norm_plus_one=True,
      sandwich_norm=True, mlp_activation="gelu_tanh", embed_scale=True,
      query_pre_attn_scalar=float(get("query_pre_attn_scalar", 256)),
      attn_softcap=float(attn_cap or 0.0), final_softcap=float(final_cap or 0.0),
      sliding_window=window, sliding_window_pattern=max(pattern, 0) if window else 0,
      **_gemma_rope(config, path, gemma3), dtype=dtype, param_dtype=dtype)


def _neox_config(config: dict[str, Any], path: str, dtype: str) -> ModelConfig:
  """GPT-NeoX / Pythia, in transformers 4's keys (`rotary_pct`, `rotary_emb_base`) or 5's
  (`rope_parameters` with `partial_rotary_factor` and `rope_theta`)."""
  get = lambda key, default=...: _key(config, path, key, default)
  act = get("hidden_act", "gelu")
  if act != "gelu":
    raise ConfigError(f"{path}: hidden_act={act!r} is not supported: rlhfjax's GPT-NeoX MLP is the "
                      "exact (erf) GELU ('gelu' only)")
  _refuse_others(config, path, {"attention_bias": True})
  rope = _rope_settings(config, path, theta_key="rotary_emb_base")
  if "rope_scaling_factor" in rope:
    raise ConfigError(f"{path}: rope scaling is not supported for gpt_neox (plain RoPE only)")
  if config.get("rope_theta") is not None and not (config.get("rope_parameters") or {}):
    rope["rope_theta"] = float(config["rope_theta"])
  fraction = (config.get("rope_parameters") or {}).get("partial_rotary_factor")
  if fraction is None:
    fraction = config.get("partial_rotary_factor", get("rotary_pct", 0.25))
  d, h = int(get("hidden_size")), int(get("num_attention_heads"))
  dh = d // h
  rotary = int(dh * float(fraction))  # As transformers computes it.
  if rotary % 2 or not 0 < rotary <= dh:
    raise ConfigError(f"{path}: rotary_pct={fraction} gives {rotary} rotary dimensions of a "
                      f"{dh}-dimensional head; an even number from 2 to {dh} is supported")
  return ModelConfig(
      variant="neox", vocab_size=int(get("vocab_size")), d_model=d,
      n_layers=int(get("num_hidden_layers")), n_heads=h, n_kv_heads=h,
      d_ff=int(get("intermediate_size")), max_len=int(get("max_position_embeddings")),
      tie_embeddings=bool(get("tie_word_embeddings", False)),  # GPTNeoXConfig's default.
      norm_eps=float(get("layer_norm_eps", 1e-5)), rotary_dim=0 if rotary == dh else rotary,
      parallel_residual=bool(get("use_parallel_residual", True)), dtype=dtype, param_dtype=dtype,
      **rope)


def _gpt2_config(config: dict[str, Any], path: str, dtype: str) -> ModelConfig:
  get = lambda key, default=...: _key(config, path, key, default)
  act = get("activation_function", "gelu_new")
  if act not in TANH_GELUS:
    raise ConfigError(f"{path}: activation_function={act!r} is not supported: rlhfjax's GPT-2 MLP "
                      f"is the tanh approximation of GELU ({', '.join(TANH_GELUS)})")
  for key, want in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False)):
    if get(key, want) != want:
      raise ConfigError(f"{path}: {key}={config[key]!r} is not supported ({want!r} only)")
  d, h = int(get("n_embd")), int(get("n_head"))
  return ModelConfig(
      variant="gpt2", vocab_size=int(get("vocab_size")), d_model=d, n_layers=int(get("n_layer")),
      n_heads=h, n_kv_heads=h, d_ff=int(get("n_inner", 4 * d)), max_len=int(get("n_positions")),
      tie_embeddings=bool(get("tie_word_embeddings", True)),
      norm_eps=float(get("layer_norm_epsilon", 1e-5)), dtype=dtype, param_dtype=dtype)


def _model_type(cfg: ModelConfig) -> str:
  """The HF `model_type` `cfg` exports as: HF's LLaMA has no q/k/v-only biases, Qwen2 does,
  Qwen3 has q/k norms; Gemma's switches make a Gemma 3 (with q/k norms) or a Gemma 2."""
  if cfg.variant == "llama" and _gemma_switches(cfg):
    return "gemma3_text" if cfg.qk_norm else "gemma2"
  if cfg.variant == "llama":
    return "qwen3" if cfg.qk_norm else "qwen2" if cfg.qkv_bias else "llama"
  return "gpt_neox" if cfg.variant == "neox" else "gpt2"


def _rotary_pct(cfg: ModelConfig) -> float:
  """GPT-NeoX's `rotary_pct` for `cfg.rotary_dim`, one that transformers turns back into exactly
  that many dimensions (int(head_dim * rotary_pct))."""
  dh, rot = cfg.dim_per_head, cfg.rotary_dims
  for pct in (rot / dh, (rot + 0.5) / dh):
    if int(dh * pct) == rot:
      return pct
  raise ConfigError(f"model.rotary_dim={rot} has no rotary_pct of a {dh}-dimensional head")


def _gemma_switches(cfg: ModelConfig) -> list[str]:
  """The Gemma switches `cfg` has on."""
  return [k for k, on in (("norm_plus_one", cfg.norm_plus_one),
                          ("sandwich_norm", cfg.sandwich_norm),
                          ("mlp_activation", cfg.mlp_activation != "silu"),
                          ("embed_scale", cfg.embed_scale)) if on]


def _number(x: float) -> int | float:
  """An integral value as an int (transformers' strict configs type some of these keys int)."""
  return int(x) if float(x).is_integer() else x


def _gemma_hf_config(cfg: ModelConfig, model_type: str) -> dict[str, Any]:
  """Gemma 2's or Gemma 3's `config.json` keys (inverse of `_gemma_config`)."""
  local = cfg.local_layers
  full_rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
  if cfg.rope_scaling_factor != 1:
    full_rope.update(rope_type="linear", factor=cfg.rope_scaling_factor)
  # rope_local_theta 0: the local layers use the global RoPE, its scaling included.
  local_rope = ({"rope_type": "default", "rope_theta": cfg.rope_local_theta}
                if cfg.rope_local_theta else dict(full_rope))
  rope = full_rope if model_type == "gemma2" else {
      "full_attention": full_rope, "sliding_attention": local_rope}
  return {"architectures": [GEMMA_TYPES[model_type]], "model_type": model_type,
          "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
          "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
          "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.dim_per_head,
          "intermediate_size": cfg.d_ff, "hidden_activation": "gelu_pytorch_tanh",
          "max_position_embeddings": cfg.max_len, "rms_norm_eps": cfg.norm_eps,
          "query_pre_attn_scalar": _number(cfg.attn_scale_dim),
          "attn_logit_softcapping": cfg.attn_softcap or None,
          "final_logit_softcapping": cfg.final_softcap or None,
          "sliding_window": cfg.sliding_window or cfg.max_len,
          "layer_types": [LAYER_TYPES[not is_local] for is_local in local],
          "rope_parameters": rope, "attention_bias": False, "attention_dropout": 0.0,
          "use_bidirectional_attention": False}


def _hf_config(cfg: ModelConfig, torch_dtype: str) -> dict[str, Any]:
  """The `config.json` of `cfg` (inverse of `config_from_json`)."""
  model_type = _model_type(cfg)
  if model_type in GEMMA_TYPES:
    out = _gemma_hf_config(cfg, model_type)
  elif cfg.variant == "llama":
    scaling = None if cfg.rope_scaling_factor == 1 else {
        "rope_type": "llama3", **{k: getattr(cfg, field) for k, field in LLAMA3_ROPE.items()}}
    out = {"architectures": [LLAMA_TYPES[model_type]], "model_type": model_type,
           "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
           "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
           "num_key_value_heads": cfg.n_kv_heads, "intermediate_size": cfg.d_ff,
           "max_position_embeddings": cfg.max_len, "rms_norm_eps": cfg.norm_eps,
           "rope_theta": cfg.rope_theta, "rope_scaling": scaling, "hidden_act": "silu",
           "attention_dropout": 0.0}
    if model_type in ("qwen2", "qwen3"):
      out.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.n_layers)
    if model_type != "qwen2":
      out.update(attention_bias=False)
    if model_type == "llama":
      out.update(mlp_bias=False)
    if cfg.head_dim or model_type == "qwen3":  # Qwen3Config's default is 128, not d / heads.
      out["head_dim"] = cfg.dim_per_head
  elif cfg.variant == "neox":
    out = {"architectures": [NEOX_CLASS], "model_type": "gpt_neox", "vocab_size": cfg.vocab_size,
           "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
           "num_attention_heads": cfg.n_heads, "intermediate_size": cfg.d_ff,
           "max_position_embeddings": cfg.max_len, "layer_norm_eps": cfg.norm_eps,
           "rotary_pct": _rotary_pct(cfg), "rotary_emb_base": cfg.rope_theta,
           "rope_scaling": None, "use_parallel_residual": cfg.parallel_residual,
           "hidden_act": "gelu", "attention_bias": True, "hidden_dropout": 0.0,
           "attention_dropout": 0.0}
  else:
    out = {"architectures": [GPT2_CLASS], "model_type": "gpt2", "vocab_size": cfg.vocab_size,
           "n_embd": cfg.d_model, "n_layer": cfg.n_layers, "n_head": cfg.n_heads,
           "n_inner": cfg.d_ff, "n_positions": cfg.max_len, "n_ctx": cfg.max_len,
           "layer_norm_epsilon": cfg.norm_eps, "activation_function": "gelu_new",
           "scale_attn_weights": True, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
  out.update(tie_word_embeddings=cfg.tie_embeddings, torch_dtype=torch_dtype)
  return out


# Per-layer conversions, each pair inverse of the other. `t(name, shape)` returns an HF tensor.

def _llama_layer(t: Callable[[str, tuple], np.ndarray], cfg: ModelConfig) -> Tensors:
  d, h, kv, dh, f = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.dim_per_head, cfg.d_ff
  # Gemma's four norms: LLaMA's second one (before the MLP) is its pre_feedforward_layernorm.
  mlp_norm = "pre_feedforward_layernorm" if cfg.sandwich_norm else "post_attention_layernorm"
  out = {"attn_norm/scale": t("input_layernorm.weight", (d,)),
         "attn/q": t("self_attn.q_proj.weight", (h * dh, d)).T.reshape(d, h, dh),
         "attn/k": t("self_attn.k_proj.weight", (kv * dh, d)).T.reshape(d, kv, dh),
         "attn/v": t("self_attn.v_proj.weight", (kv * dh, d)).T.reshape(d, kv, dh),
         "attn/o": t("self_attn.o_proj.weight", (d, h * dh)).T.reshape(h, dh, d),
         "mlp_norm/scale": t(mlp_norm + ".weight", (d,)),
         "mlp/wg": t("mlp.gate_proj.weight", (f, d)).T,
         "mlp/wi": t("mlp.up_proj.weight", (f, d)).T,
         "mlp/wo": t("mlp.down_proj.weight", (d, f)).T}
  if cfg.qkv_bias:
    for name, count in (("q", h), ("k", kv), ("v", kv)):
      out[f"attn/{name}_bias"] = t(f"self_attn.{name}_proj.bias", (count * dh,)).reshape(count, dh)
  if cfg.qk_norm:
    out.update({"attn/q_norm": t("self_attn.q_norm.weight", (dh,)),
                "attn/k_norm": t("self_attn.k_norm.weight", (dh,))})
  if cfg.sandwich_norm:
    out.update({"attn_post_norm/scale": t("post_attention_layernorm.weight", (d,)),
                "mlp_post_norm/scale": t("post_feedforward_layernorm.weight", (d,))})
  return out


def _llama_layer_hf(p: Tensors, cfg: ModelConfig) -> Tensors:
  d, h, kv, dh = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.dim_per_head
  out = {"input_layernorm.weight": p["attn_norm/scale"],
         "self_attn.q_proj.weight": p["attn/q"].reshape(d, h * dh).T,
         "self_attn.k_proj.weight": p["attn/k"].reshape(d, kv * dh).T,
         "self_attn.v_proj.weight": p["attn/v"].reshape(d, kv * dh).T,
         "self_attn.o_proj.weight": p["attn/o"].reshape(h * dh, d).T,
         ("pre_feedforward_layernorm.weight" if cfg.sandwich_norm
          else "post_attention_layernorm.weight"): p["mlp_norm/scale"],
         "mlp.gate_proj.weight": p["mlp/wg"].T, "mlp.up_proj.weight": p["mlp/wi"].T,
         "mlp.down_proj.weight": p["mlp/wo"].T}
  if cfg.qkv_bias:
    out.update({f"self_attn.{n}_proj.bias": p[f"attn/{n}_bias"].reshape(-1) for n in "qkv"})
  if cfg.qk_norm:
    out.update({"self_attn.q_norm.weight": p["attn/q_norm"],
                "self_attn.k_norm.weight": p["attn/k_norm"]})
  if cfg.sandwich_norm:
    out.update({"post_attention_layernorm.weight": p["attn_post_norm/scale"],
                "post_feedforward_layernorm.weight": p["mlp_post_norm/scale"]})
  return out


def _neox_layer(t: Callable[[str, tuple], np.ndarray], cfg: ModelConfig) -> Tensors:
  """GPT-NeoX: `query_key_value`'s output rows are [heads, (q, k, v), head_dim], not q, k and v
  side by side as GPT-2's c_attn."""
  d, h, dh, f = cfg.d_model, cfg.n_heads, cfg.dim_per_head, cfg.d_ff
  qkv_w = t("attention.query_key_value.weight", (3 * d, d)).reshape(h, 3, dh, d)
  qkv_b = t("attention.query_key_value.bias", (3 * d,)).reshape(h, 3, dh)
  out = {"attn_norm/scale": t("input_layernorm.weight", (d,)),
         "attn_norm/bias": t("input_layernorm.bias", (d,)),
         "attn/o": t("attention.dense.weight", (d, d)).T.reshape(h, dh, d),
         "attn/o_bias": t("attention.dense.bias", (d,)),
         "mlp_norm/scale": t("post_attention_layernorm.weight", (d,)),
         "mlp_norm/bias": t("post_attention_layernorm.bias", (d,)),
         "mlp/wi": t("mlp.dense_h_to_4h.weight", (f, d)).T,
         "mlp/bi": t("mlp.dense_h_to_4h.bias", (f,)),
         "mlp/wo": t("mlp.dense_4h_to_h.weight", (d, f)).T,
         "mlp/bo": t("mlp.dense_4h_to_h.bias", (d,))}
  for i, name in enumerate("qkv"):
    out[f"attn/{name}"] = qkv_w[:, i].transpose(2, 0, 1)  # [d, heads, head_dim]
    out[f"attn/{name}_bias"] = qkv_b[:, i]
  return out


def _neox_layer_hf(p: Tensors, cfg: ModelConfig) -> Tensors:
  d, h, dh = cfg.d_model, cfg.n_heads, cfg.dim_per_head
  qkv_w = np.stack([p[f"attn/{n}"].transpose(1, 2, 0) for n in "qkv"], 1)  # [h, 3, dh, d]
  qkv_b = np.stack([p[f"attn/{n}_bias"] for n in "qkv"], 1)  # [h, 3, dh]
  return {"input_layernorm.weight": p["attn_norm/scale"],
          "input_layernorm.bias": p["attn_norm/bias"],
          "attention.query_key_value.weight": qkv_w.reshape(3 * h * dh, d),
          "attention.query_key_value.bias": qkv_b.reshape(-1),
          "attention.dense.weight": p["attn/o"].reshape(h * dh, d).T,
          "attention.dense.bias": p["attn/o_bias"],
          "post_attention_layernorm.weight": p["mlp_norm/scale"],
          "post_attention_layernorm.bias": p["mlp_norm/bias"],
          "mlp.dense_h_to_4h.weight": p["mlp/wi"].T, "mlp.dense_h_to_4h.bias": p["mlp/bi"],
          "mlp.dense_4h_to_h.weight": p["mlp/wo"].T, "mlp.dense_4h_to_h.bias": p["mlp/bo"]}


def _gpt2_layer(t: Callable[[str, tuple], np.ndarray], cfg: ModelConfig) -> Tensors:
  d, h, dh, f = cfg.d_model, cfg.n_heads, cfg.dim_per_head, cfg.d_ff
  qkv_w = np.split(t("attn.c_attn.weight", (d, 3 * d)), 3, axis=1)
  qkv_b = np.split(t("attn.c_attn.bias", (3 * d,)), 3)
  out = {"attn_norm/scale": t("ln_1.weight", (d,)), "attn_norm/bias": t("ln_1.bias", (d,)),
         "attn/o": t("attn.c_proj.weight", (d, d)).reshape(h, dh, d),
         "attn/o_bias": t("attn.c_proj.bias", (d,)),
         "mlp_norm/scale": t("ln_2.weight", (d,)), "mlp_norm/bias": t("ln_2.bias", (d,)),
         "mlp/wi": t("mlp.c_fc.weight", (d, f)), "mlp/bi": t("mlp.c_fc.bias", (f,)),
         "mlp/wo": t("mlp.c_proj.weight", (f, d)), "mlp/bo": t("mlp.c_proj.bias", (d,))}
  for name, w, b in zip("qkv", qkv_w, qkv_b):
    out[f"attn/{name}"], out[f"attn/{name}_bias"] = w.reshape(d, h, dh), b.reshape(h, dh)
  return out


def _gpt2_layer_hf(p: Tensors, cfg: ModelConfig) -> Tensors:
  d = cfg.d_model
  return {"ln_1.weight": p["attn_norm/scale"], "ln_1.bias": p["attn_norm/bias"],
          "attn.c_attn.weight": np.concatenate([p[f"attn/{n}"].reshape(d, d) for n in "qkv"], 1),
          "attn.c_attn.bias": np.concatenate([p[f"attn/{n}_bias"].reshape(d) for n in "qkv"]),
          "attn.c_proj.weight": p["attn/o"].reshape(d, d), "attn.c_proj.bias": p["attn/o_bias"],
          "ln_2.weight": p["mlp_norm/scale"], "ln_2.bias": p["mlp_norm/bias"],
          "mlp.c_fc.weight": p["mlp/wi"], "mlp.c_fc.bias": p["mlp/bi"],
          "mlp.c_proj.weight": p["mlp/wo"], "mlp.c_proj.bias": p["mlp/bo"]}


def _read_tensors(directory: str) -> tuple[Tensors, dict[str, str]]:
  """Every tensor of the checkpoint, and the file (path) each came from."""
  from safetensors import SafetensorError  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  single, index = os.path.join(directory, WEIGHTS), os.path.join(directory, INDEX)
  if os.path.exists(single):
    weight_map = None
    files = [single]
  elif os.path.exists(index):
    weight_map = _key(_read_json(index), index, "weight_map")
    files = [os.path.join(directory, f) for f in sorted(set(weight_map.values()))]
  else:
    raise FileNotFoundError(f"no {WEIGHTS} or {INDEX} in {directory}")
  tensors, where = {}, {}
  for path in files:
    if not os.path.exists(path):
      raise FileNotFoundError(f"{index}: lists the missing shard {path}")
    try:
      loaded = load_file(path)
    except SafetensorError as e:  # Empty, truncated or not safetensors at all.
      raise DataError(f"{path}: not a readable safetensors file ({e}; {os.path.getsize(path)} "
                      "bytes)") from None
    for name, array in loaded.items():
      tensors[name], where[name] = array, path
  for name, file in (weight_map or {}).items():
    if name not in tensors:
      raise ConfigError(f"{os.path.join(directory, file)}: no tensor {name!r} (listed in {index})")
  return tensors, where


def load(directory: str, dtype: str | None = None,
         reward: bool = False) -> tuple[dict, ModelConfig]:
  """(params, config) of the Hugging Face checkpoint in `directory`.

  `dtype` (float32, bfloat16, float16) casts the parameters and sets the config's dtypes; None
  keeps the stored dtype when all tensors share one, else float32, so nothing is rounded.
  `reward`: a reward model written by `save(..., reward_pad_id=...)`, returned as
  `{'backbone', 'head'}`, with `heads.LIKELIHOOD` when config.json has `reward_likelihood_weight`.
  """
  config_path = os.path.join(directory, CONFIG)
  hf = _read_json(config_path)
  tensors, where = _read_tensors(directory)
  stored = {a.dtype for n, a in tensors.items() if not _BUFFERS.fullmatch(n)}
  if dtype is None:
    dtype = next((n for n, t in DTYPES.items() if {t} == stored), "float32")
  elif dtype not in DTYPES:
    raise ConfigError(f"dtype must be one of {tuple(DTYPES)}, got {dtype!r}")
  cfg = config_from_json(hf, config_path, dtype)
  weights = os.path.join(directory, WEIGHTS if len(set(where.values())) <= 1 else INDEX)

  def take(name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name not in tensors:
      raise ConfigError(f"{weights}: missing tensor {name!r}")
    array = tensors.pop(name)
    if array.shape != shape:
      raise ConfigError(f"{where[name]}: tensor {name!r} has shape {array.shape}, "
                        f"{config_path} implies {shape}")
    return array.astype(DTYPES[dtype], copy=False)

  d, v = cfg.d_model, cfg.vocab_size
  head = "lm_head.weight"
  if cfg.variant == "llama":
    layer_prefix, convert = "model.layers.{}.", _llama_layer
    embed, final = "model.embed_tokens.weight", "model.norm."
  elif cfg.variant == "neox":
    layer_prefix, convert = "gpt_neox.layers.{}.", _neox_layer
    embed, final = "gpt_neox.embed_in.weight", "gpt_neox.final_layer_norm."
    head = NEOX_HEAD if NEOX_HEAD in tensors or head not in tensors else head
  else:
    prefix = "transformer." if any(n.startswith("transformer.") for n in tensors) else ""
    layer_prefix, convert = prefix + "h.{}.", _gpt2_layer
    embed, final = prefix + "wte.weight", prefix + "ln_f."
  params: dict[str, Any] = {"embed": {"embedding": take(embed, (v, d))},
                            "final_norm": {"scale": take(final + "weight", (d,))}}
  layers = [convert(lambda n, s, i=i: take(layer_prefix.format(i) + n, s), cfg)
            for i in range(cfg.n_layers)]
  stacked = {k: np.stack([l[k] for l in layers]) for k in layers[0]}
  params["layers"] = transformer._nest(stacked)  # pylint: disable=protected-access
  if cfg.layer_norm:
    params["final_norm"]["bias"] = take(final + "bias", (d,))
  if cfg.variant == "gpt2":
    params["pos_embed"] = {"embedding": take(prefix + "wpe.weight", (cfg.max_len, d))}
  if not cfg.tie_embeddings:
    params["lm_head"] = {"kernel": take(head, (v, d)).T}
  elif head in tensors:  # A tied head saved twice must equal the embedding.
    if not np.array_equal(take(head, (v, d)), params["embed"]["embedding"]):
      raise ConfigError(f"{where[head]}: {head!r} differs from the embedding "
                        f"but {config_path} sets tie_word_embeddings")
  if reward:
    head = {"kernel": take("score.weight", (1, d))[0],
            "bias": np.asarray(_key(hf, config_path, "reward_bias", 0.0), DTYPES[dtype])}
    params = {"backbone": params, "head": head}
    if hf.get("reward_likelihood_weight") is not None:
      params[heads.LIKELIHOOD] = {"weight": np.asarray(hf["reward_likelihood_weight"],
                                                       DTYPES[dtype])}
  unexpected = sorted(n for n in tensors if not _BUFFERS.fullmatch(n))
  if unexpected:
    raise ConfigError(f"{where[unexpected[0]]}: unexpected tensor(s) {', '.join(unexpected[:5])}"
                      f"{' ...' if len(unexpected) > 5 else ''} for {cfg.variant}")
  return params, cfg


def hf_tensors(params: dict, cfg: ModelConfig) -> Tensors:
  """The Hugging Face tensors (names and layouts) of rlhfjax `params` (inverse of `load`)."""
  _check_exportable(params, cfg)
  np_params = jax.tree.map(np.asarray, params)
  layers = {f"{g}/{n}": a for g, group in np_params["layers"].items() for n, a in group.items()}
  head = "lm_head.weight"
  if cfg.variant == "llama":
    out = {"model.embed_tokens.weight": np_params["embed"]["embedding"],
           "model.norm.weight": np_params["final_norm"]["scale"]}
    layer_prefix, convert = "model.layers.{}.", _llama_layer_hf
  elif cfg.variant == "neox":
    out = {"gpt_neox.embed_in.weight": np_params["embed"]["embedding"],
           "gpt_neox.final_layer_norm.weight": np_params["final_norm"]["scale"],
           "gpt_neox.final_layer_norm.bias": np_params["final_norm"]["bias"]}
    layer_prefix, convert, head = "gpt_neox.layers.{}.", _neox_layer_hf, NEOX_HEAD
  else:
    out = {"transformer.wte.weight": np_params["embed"]["embedding"],
           "transformer.wpe.weight": np_params["pos_embed"]["embedding"],
           "transformer.ln_f.weight": np_params["final_norm"]["scale"],
           "transformer.ln_f.bias": np_params["final_norm"]["bias"]}
    layer_prefix, convert = "transformer.h.{}.", _gpt2_layer_hf
  for i in range(cfg.n_layers):
    hf_layer = convert({k: a[i] for k, a in layers.items()}, cfg)
    out.update({layer_prefix.format(i) + n: a for n, a in hf_layer.items()})
  if not cfg.tie_embeddings:
    out[head] = np_params["lm_head"]["kernel"].T
  return out


def reward_tensors(params: dict, cfg: ModelConfig) -> Tensors:
  """A reward model (`{'backbone', 'head'}`) as transformers' `*ForSequenceClassification` with one
  label: the decoder's tensors, and the scalar head as `score.weight` [1, d_model] (an untied
  `lm_head.weight` stays in the file, unused there, so that `load(..., reward=True)` is exact)."""
  return {**hf_tensors(params["backbone"], cfg),
          "score.weight": np.asarray(params["head"]["kernel"])[None, :]}


def _reward_config(cfg: ModelConfig, torch_dtype: str, params: dict, pad_id: int) -> dict[str, Any]:
  """`config.json` of a reward model. transformers' score layer has no bias: ours (the
  normalisation offset) is kept as `reward_bias`, to be added to its logit; the score is read at
  the last token that is not `pad_token_id`, as rlhfjax reads it at the last real token. A model
  with a likelihood term also keeps `reward_likelihood_weight` λ: add λ times the response's mean
  token log-probability under the language-model head (the tied embedding or `lm_head.weight`)."""
  out = _hf_config(cfg, torch_dtype)
  out.update(architectures=[REWARD_CLASSES[_model_type(cfg)]], num_labels=1,
             id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0}, pad_token_id=pad_id,
             reward_bias=float(np.asarray(params["head"]["bias"])))
  if heads.LIKELIHOOD in params:
    out["reward_likelihood_weight"] = float(np.asarray(params[heads.LIKELIHOOD]["weight"]))
  return out


def save(params: dict, cfg: ModelConfig, directory: str, dtype: str | None = None,
         reward_pad_id: int | None = None, extra_files: Sequence[str] = (),
         pad_token: str | None = None) -> str:
  """Writes `config.json` and `model.safetensors` of `params` to `directory`, atomically.

  `params` is a decoder's, or, with `reward_pad_id` (the tokenizer's pad id), a reward model's
  (`reward_tensors`). `extra_files` (the source model's tokenizer files) are copied beside them;
  `pad_token` (the text of `reward_pad_id`) then becomes their tokenizer's pad token, since
  transformers' sequence classifiers read the score before the first `pad_token_id` and a tokenizer
  padding with another token (often its eos) would move the score onto padding.
  The files go to `directory + ".tmp"` first; an existing `directory` is replaced only once they
  are complete. `dtype` casts every tensor (None: each keeps its own). Returns `directory`.
  """
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  if dtype is not None and dtype not in DTYPES:
    raise ConfigError(f"dtype must be one of {tuple(DTYPES)}, got {dtype!r}")
  reward = reward_pad_id is not None
  tensors = reward_tensors(params, cfg) if reward else hf_tensors(params, cfg)
  if dtype is not None:
    tensors = {n: a.astype(DTYPES[dtype]) for n, a in tensors.items()}
  embed_dtype = next(iter(tensors.values())).dtype  # The embedding comes first.
  torch_dtype = next((n for n, t in DTYPES.items() if t == embed_dtype), str(embed_dtype))
  directory = os.path.normpath(directory)
  tmp, old = directory + ".tmp", directory + ".old"
  for stale in (tmp, old):
    if os.path.exists(stale):
      shutil.rmtree(stale)
  os.makedirs(tmp)
  with open(os.path.join(tmp, CONFIG), "w", encoding="utf-8") as f:
    config = (_reward_config(cfg, torch_dtype, params, reward_pad_id) if reward
              else _hf_config(cfg, torch_dtype))
    json.dump(config, f, indent=2)
  save_file({n: np.ascontiguousarray(a) for n, a in tensors.items()}, os.path.join(tmp, WEIGHTS),
            metadata={"format": "pt"})  # transformers requires the "pt" format tag.
  for path in extra_files:
    shutil.copyfile(path, os.path.join(tmp, os.path.basename(path)))
  if reward and pad_token is not None:
    _set_pad_token(tmp, pad_token)
  if os.path.exists(directory):
    os.replace(directory, old)
    os.replace(tmp, directory)
    shutil.rmtree(old)
  else:
    os.replace(tmp, directory)
  return directory


def _set_pad_token(directory: str, pad_token: str) -> None:
  """Names `pad_token` as the pad token of the tokenizer files in `directory` that name one."""
  for name in ("tokenizer_config.json", "special_tokens_map.json"):
    path = os.path.join(directory, name)
    if not os.path.exists(path):
      continue
    with open(path, encoding="utf-8") as f:
      meta = json.load(f)
    meta["pad_token"] = pad_token
    with open(path, "w", encoding="utf-8") as f:
      json.dump(meta, f, indent=2, ensure_ascii=False)


def _check_exportable(params: dict, cfg: ModelConfig) -> None:
  """`params` must have exactly the parameters `cfg` describes (e.g. lm_head iff untied), and a
  GPT-2 its fixed head layout."""
  name = {"gpt2": "GPT-2", "neox": "GPT-NeoX"}.get(cfg.variant)
  if name and (cfg.n_kv_heads != cfg.n_heads or cfg.dim_per_head * cfg.n_heads != cfg.d_model):
    raise ConfigError(f"{name} checkpoints need model.n_kv_heads == model.n_heads and "
                      "model.head_dim == model.d_model / model.n_heads")
  _check_gemma_exportable(cfg)
  # Switches no transformers family of this variant has.
  family = {"llama": "LLaMA, Qwen2 and Qwen3", "gpt2": "GPT-2"}.get(cfg.variant)
  unexportable = [k for k, on in (("parallel_residual", cfg.parallel_residual),
                                  ("rotary_dim", bool(cfg.rotary_dim)),
                                  ("qk_norm with model.qkv_bias", cfg.qk_norm and cfg.qkv_bias))
                  if on and family]
  if unexportable:
    raise ConfigError(f"model.{unexportable[0]} has no Hugging Face layout in {family} checkpoints "
                      "(gpt_neox has a parallel residual and partial rotary)")
  want = _paths(transformer.param_axes(cfg), is_leaf=lambda x: isinstance(x, tuple))
  have = _paths(params, is_leaf=lambda x: not isinstance(x, dict))
  if want != have:
    raise ConfigError(f"the parameters do not match the model config: missing "
                      f"{sorted(want - have)}, unexpected {sorted(have - want)}")


def _check_gemma_exportable(cfg: ModelConfig) -> None:
  """Gemma's switches come all together (a Gemma 2 or 3) or not at all, with only the details its
  family has: no soft-cap, window or linear RoPE scaling outside Gemma, no attention soft-cap in
  Gemma 3, one RoPE for all layers in Gemma 2."""
  model_type = _model_type(cfg)
  if model_type in GEMMA_TYPES:
    name = "Gemma 3" if model_type == "gemma3_text" else "Gemma 2"
    missing = sorted({"norm_plus_one", "sandwich_norm", "mlp_activation", "embed_scale"}
                     - set(_gemma_switches(cfg)))
    extra = [k for k, on in (
        ("qkv_bias", cfg.qkv_bias), ("parallel_residual", cfg.parallel_residual),
        ("rotary_dim", bool(cfg.rotary_dim)),
        ("attn_softcap", bool(cfg.attn_softcap) and model_type == "gemma3_text"),
        ("rope_local_theta", bool(cfg.rope_local_theta) and model_type == "gemma2"),
        ("rope_scaling_factor", cfg.rope_scaling_factor != 1 and (
            model_type == "gemma2" or cfg.rope_scaling_type != "linear"))) if on]
    if missing:
      raise ConfigError(f"a Gemma checkpoint needs all of Gemma's switches: model.{missing[0]} is "
                        f"off (with {', '.join(_gemma_switches(cfg))} on)")
    if extra:
      raise ConfigError(f"model.{extra[0]} has no Hugging Face layout in {name} checkpoints")
    return
  gemma_only = [k for k, on in (("attn_softcap", cfg.attn_softcap), ("final_softcap",
                                                                     cfg.final_softcap),
                                ("sliding_window", cfg.sliding_window),
                                ("query_pre_attn_scalar", cfg.query_pre_attn_scalar),
                                ("rope_scaling_type", cfg.rope_scaling_type != "llama3"
                                 and cfg.rope_scaling_factor != 1)) if on]
  if gemma_only:
    raise ConfigError(f"model.{gemma_only[0]} has no Hugging Face layout in {model_type} "
                      "checkpoints (Gemma 2 and 3 have it, with all of Gemma's switches)")


def _paths(tree: dict, is_leaf: Callable[[Any], bool], prefix: str = "") -> set[str]:
  out = set()
  for k, v in tree.items():
    out |= {prefix + k} if is_leaf(v) else _paths(v, is_leaf, f"{prefix}{k}/")
  return out

