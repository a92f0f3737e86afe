"""A decoder-only transformer as pure functions over an explicit parameter pytree.

`init(rng, cfg) -> params`, `forward(params, tokens, cfg, ...) -> (hidden, cache)`,
`lm_logits(params, hidden, cfg) -> logits`, and for sampling `init_cache` / `prefill`. Layers are
stacked on a leading `layers` axis and run with `lax.scan`, so compile time does not grow with depth;
only a forward through a KV cache (a decode step) unrolls them, so that each layer's cache is its own
buffer, updated in place. `param_axes(cfg)` names every parameter dimension with a logical axis
(`vocab`, `embed`, `heads`, `kv_heads`, `head_dim`, `mlp`, `layers`); sharding rules map those names
to mesh axes.

Variants: `gpt2` (learned positions, LayerNorm, tanh-GELU, biases), `llama` (RoPE in the
rotate-half form, optionally with Llama 3.1's frequency scaling, RMSNorm, SwiGLU, grouped-query
attention, no biases but optional q/k/v biases as in Qwen2), laid out like Hugging Face's LLaMA so
real checkpoints load unchanged, and `neox` (GPT-NeoX / Pythia: RoPE, LayerNorm, exact-GELU MLP,
biases everywhere). Switches on top, each one family's detail: `qk_norm` (Qwen3: RMSNorm of each
head's q and k, before RoPE), `rotary_dim` (GPT-NeoX: RoPE on each head's first dimensions only)
and `parallel_residual` (GPT-NeoX: x + attn(ln1(x)) + mlp(ln2(x))); Gemma 2 and 3's (see
ModelConfig): RMSNorm by 1 + w (`norm_plus_one`), norms after attention and MLP too
(`sandwich_norm`), GeGLU (`mlp_activation`), embeddings times sqrt(d_model) (`embed_scale`),
`query_pre_attn_scalar`, soft-caps of the attention scores and output logits, and sliding-window
layers with a RoPE base of their own (`rope_local_theta`).

Sliding windows: a local layer's query at position p sees the real keys at positions
p - sliding_window + 1 .. p, positions as the model counts them (real tokens only), so a
left-padded prompt, samples packed after a shared prompt and a KV cache all get the window the
unpadded row would. Local and global layers differ only in their mask (and RoPE table), so the
layers stay one `lax.scan`, a per-layer flag choosing between the two. The KV cache keeps every
slot for every layer and a local layer masks the reads outside its window (masked reads, not a
ring buffer of `sliding_window` slots): one cache layout for all layers, so the sampler's prefill,
its blocked reads (`cache_read`), its sharding in the rollout layout and `task=compile` are those
of every other family; the price is memory and reads for slots a local layer never uses, nothing
at the lengths RLHF samples (prompt plus response within Gemma 3's 512 to 1024-token windows),
up to (1 - 1/pattern) of the cache at long contexts.

A tree may carry LoRA adapters under `lora` (models/lora.py); every projection adds those it finds.

Padding: `mask` marks real tokens. A query attends to keys at the same or an earlier array index that
are real; positions count real tokens only, so a left-padded prompt starts at position 0.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

from rlhfjax.errors import ConfigError
from rlhfjax.models import attention
from rlhfjax.models.config import ModelConfig
from rlhfjax.models import lora
from rlhfjax.models import sharding_rules

Params = dict[str, Any]
Cache = dict[str, Any]  # {'k': [per-layer arrays], 'v': [...], 'mask': array}; see init_cache.

# The residual stream [B, T, D] is split by batch only (see sharding_rules.constrain).
ACTIVATION_AXES = ("batch", "length", None)
CACHE_AXES = ("batch", "kv_heads", "length", "head_dim")  # One layer's keys or values in the cache.


def _dims(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[str | None, ...]]]:
  """Shape and logical axes of every per-layer parameter, without the leading layer axis."""
  d, h, kv, dh, f = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.dim_per_head, cfg.d_ff
  out = {
      "attn_norm/scale": ((d,), ("embed",)),
      "attn/q": ((d, h, dh), ("embed", "heads", "head_dim")),
      "attn/k": ((d, kv, dh), ("embed", "kv_heads", "head_dim")),
      "attn/v": ((d, kv, dh), ("embed", "kv_heads", "head_dim")),
      "attn/o": ((h, dh, d), ("heads", "head_dim", "embed")),
      "mlp_norm/scale": ((d,), ("embed",)),
      "mlp/wi": ((d, f), ("embed", "mlp")),
      "mlp/wo": ((f, d), ("mlp", "embed")),
  }
  if cfg.sandwich_norm:  # Gemma 2/3: post_attention_layernorm, post_feedforward_layernorm.
    out.update({"attn_post_norm/scale": ((d,), ("embed",)),
                "mlp_post_norm/scale": ((d,), ("embed",))})
  if cfg.biases:
    out.update({
        "attn_norm/bias": ((d,), ("embed",)),
        "attn/q_bias": ((h, dh), ("heads", "head_dim")),
        "attn/k_bias": ((kv, dh), ("kv_heads", "head_dim")),
        "attn/v_bias": ((kv, dh), ("kv_heads", "head_dim")),
        "attn/o_bias": ((d,), ("embed",)),
        "mlp_norm/bias": ((d,), ("embed",)),
        "mlp/bi": ((f,), ("mlp",)),
        "mlp/bo": ((d,), ("embed",)),
    })
  else:
    out["mlp/wg"] = ((d, f), ("embed", "mlp"))
    if cfg.qkv_bias:
      out.update({"attn/q_bias": ((h, dh), ("heads", "head_dim")),
                  "attn/k_bias": ((kv, dh), ("kv_heads", "head_dim")),
                  "attn/v_bias": ((kv, dh), ("kv_heads", "head_dim"))})
    if cfg.qk_norm:  # One scale per head dimension, shared by all heads (Qwen3's q_norm, k_norm).
      out.update({"attn/q_norm": ((dh,), ("head_dim",)), "attn/k_norm": ((dh,), ("head_dim",))})
  return out


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
  out: dict[str, Any] = {}
  for path, v in flat.items():
    group, name = path.split("/")
    out.setdefault(group, {})[name] = v
  return out


def param_axes(cfg: ModelConfig) -> Params:
  """The logical axis names of every parameter, in the structure of `init`'s output."""
  axes: Params = {"embed": {"embedding": ("vocab", "embed")},
                  "layers": _nest({k: ("layers",) + a for k, (_, a) in _dims(cfg).items()}),
                  "final_norm": {"scale": ("embed",)}}
  if cfg.variant == "gpt2":
    axes["pos_embed"] = {"embedding": (None, "embed")}
  if cfg.layer_norm:
    axes["final_norm"]["bias"] = ("embed",)
  if not cfg.tie_embeddings:
    axes["lm_head"] = {"kernel": ("embed", "vocab")}
  return axes


def init(rng: jax.Array, cfg: ModelConfig) -> Params:
  """Normal(0.02) weights; residual output projections scaled by 1/sqrt(2 L); norm scales (q/k
  norms included) 1 (stored as 0 under `norm_plus_one`), biases 0."""
  dtype = jnp.dtype(cfg.param_dtype)
  dims = _dims(cfg)
  keys = dict(zip(dims, jax.random.split(rng, len(dims))))
  resid = 0.02 / math.sqrt(2 * cfg.n_layers)
  layers = {}
  for path, (shape, _) in dims.items():
    full = (cfg.n_layers,) + shape
    name = path.split("/")[1]
    if name in ("scale", "q_norm", "k_norm"):
      layers[path] = (jnp.zeros if cfg.norm_plus_one else jnp.ones)(full, dtype)
    elif "bias" in name or name in ("bi", "bo"):
      layers[path] = jnp.zeros(full, dtype)
    else:
      std = resid if name in ("o", "wo") else 0.02
      layers[path] = (std * jax.random.normal(keys[path], full)).astype(dtype)
  k_emb, k_pos, k_head = jax.random.split(jax.random.fold_in(rng, 1), 3)
  params: Params = {
      "embed": {"embedding": (0.02 * jax.random.normal(k_emb, (cfg.vocab_size, cfg.d_model))
                              ).astype(dtype)},
      "layers": _nest(layers),
      "final_norm": {"scale": (jnp.zeros if cfg.norm_plus_one else jnp.ones)((cfg.d_model,),
                                                                             dtype)},
  }
  if cfg.variant == "gpt2":
    params["pos_embed"] = {"embedding": (0.01 * jax.random.normal(k_pos, (cfg.max_len, cfg.d_model))
                                         ).astype(dtype)}
  if cfg.layer_norm:
    params["final_norm"]["bias"] = jnp.zeros((cfg.d_model,), dtype)
  if not cfg.tie_embeddings:
    params["lm_head"] = {"kernel": (0.02 * jax.random.normal(k_head, (cfg.d_model, cfg.vocab_size))
                                    ).astype(dtype)}
  return params


def _norm(x: jax.Array, p: Params, cfg: ModelConfig) -> jax.Array:
  """LayerNorm (gpt2, neox) or RMSNorm (llama) over the last axis, computed in float32."""
  return _normalize(x, p["scale"], p.get("bias"), cfg.norm_eps, center=cfg.layer_norm,
                    plus_one=cfg.norm_plus_one)


def _normalize(x: jax.Array, scale: jax.Array, bias: jax.Array | None, eps: float,
               center: bool, plus_one: bool = False) -> jax.Array:
  """`plus_one`: multiplied by 1 + scale (Gemma), the sum taken in float32 as transformers does."""
  x32 = x.astype(jnp.float32)
  if center:
    x32 = x32 - x32.mean(-1, keepdims=True)
  y = x32 * jax.lax.rsqrt(jnp.square(x32).mean(-1, keepdims=True) + eps)
  y = y * (1.0 + scale.astype(jnp.float32) if plus_one else scale.astype(jnp.float32))
  if bias is not None:
    y = y + bias.astype(jnp.float32)
  return y.astype(x.dtype)


def rope_frequencies(cfg: ModelConfig, local: bool = False) -> jax.Array:
  """The rotary angular frequency of each dimension pair [R/2] (R = `cfg.rotary_dims`, the head's
  rotated dimensions): theta^(-2i/R), rescaled as Llama 3.1 does when `cfg.rope_scaling_factor` is
  not 1 (slow pairs divided by the factor, fast ones kept, a smooth blend between), so a long
  context reuses the angles seen in training, or all divided by it (`rope_scaling_type` linear).
  `local`: a sliding-window layer's, which with `cfg.rope_local_theta` has that base and no
  scaling (Gemma 3)."""
  half = cfg.rotary_dims // 2
  if local and cfg.rope_local_theta:
    return cfg.rope_local_theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
  freq = cfg.rope_theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
  if cfg.rope_scaling_factor == 1:
    return freq
  if cfg.rope_scaling_type == "linear":
    return freq / cfg.rope_scaling_factor
  low, high = cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
  wavelen = 2 * math.pi / freq
  smooth = jnp.clip((cfg.rope_original_max_len / wavelen - low) / (high - low), 0.0, 1.0)
  return (1 - smooth) * freq / cfg.rope_scaling_factor + smooth * freq


def _rope(x: jax.Array, positions: jax.Array, cfg: ModelConfig,
          local: bool | jax.Array = False) -> jax.Array:
  """Rotary embedding, rotate-half form, on each head's first R = `cfg.rotary_dims` dimensions
  (all of them but in GPT-NeoX): dims i and i + R/2 form a pair, dims from R on pass unchanged, as
  in Hugging Face's GPT-NeoX. x: [B,T,H,Dh]. `local` (a bool, or traced in the layers' scan):
  the frequencies of a sliding-window layer (`rope_frequencies`)."""
  rot = cfg.rotary_dims
  half = rot // 2
  if not cfg.rope_local_theta:  # One RoPE for every layer.
    freq = rope_frequencies(cfg)
  elif isinstance(local, bool):
    freq = rope_frequencies(cfg, local=local)
  else:
    freq = jnp.where(local, rope_frequencies(cfg, local=True), rope_frequencies(cfg))
  angle = positions[..., None].astype(jnp.float32) * freq  # [B,T,half]
  cos, sin = jnp.cos(angle)[:, :, None, :], jnp.sin(angle)[:, :, None, :]
  x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:rot].astype(jnp.float32)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)
  return rotated if rot == x.shape[-1] else jnp.concatenate([rotated, x[..., rot:]], -1)


def _dropout(x: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
  if rng is None or rate <= 0:
    return x
  keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
  return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)


def _qkv(p: Params, x: jax.Array, positions: jax.Array, cfg: ModelConfig,
         ad: Params | None = None, scale: jax.Array | None = None,
         local: bool | jax.Array = False):
  """Query, key and value projections [B,T,heads,Dh] (plus their LoRA adapters `ad`, if any):
  biases added (gpt2, neox, or llama with `qkv_bias`), each head's q and k RMS-normalised
  (`qk_norm`), then RoPE applied (llama, neox): the order of Hugging Face's Qwen2 and Qwen3."""
  dt = x.dtype
  q = jnp.einsum("btd,dhk->bthk", x, p["q"].astype(dt)) + lora.delta(x, ad, "q", scale)
  k = jnp.einsum("btd,dhk->bthk", x, p["k"].astype(dt)) + lora.delta(x, ad, "k", scale)
  v = jnp.einsum("btd,dhk->bthk", x, p["v"].astype(dt)) + lora.delta(x, ad, "v", scale)
  if cfg.biases or cfg.qkv_bias:
    q, k, v = q + p["q_bias"].astype(dt), k + p["k_bias"].astype(dt), v + p["v_bias"].astype(dt)
  if cfg.qk_norm:
    q = _normalize(q, p["q_norm"], None, cfg.norm_eps, center=False, plus_one=cfg.norm_plus_one)
    k = _normalize(k, p["k_norm"], None, cfg.norm_eps, center=False, plus_one=cfg.norm_plus_one)
  if cfg.variant != "gpt2":
    q, k = _rope(q, positions, cfg, local), _rope(k, positions, cfg, local)
  return q, k, v


def _attend(p: Params, q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array,
            cfg: ModelConfig, rng: jax.Array | None, heads_major: bool,
            ad: Params | None = None, scale: jax.Array | None = None,
            causal: bool = False, packed: bool = False,
            local: bool | jax.Array = False) -> jax.Array:
  """Softmax attention of q [B,T,H,Dh] over k, v ([B,S,KV,Dh], or [B,KV,S,Dh] if `heads_major`)
  by the kernel `cfg.attention` names (see models/attention.py), then the output projection."""
  dt = q.dtype
  out = attention.attend(q, k, v, allowed, cfg, heads_major=heads_major, causal=causal,
                         packed=packed, rng=rng, local=local)
  out = jnp.einsum("bthk,hkd->btd", out, p["o"].astype(dt)) + lora.delta(out, ad, "o", scale)
  if cfg.biases:
    out = out + p["o_bias"].astype(dt)
  return out


def _mlp(p: Params, x: jax.Array, cfg: ModelConfig, ad: Params | None = None,
         scale: jax.Array | None = None) -> jax.Array:
  dt = x.dtype
  proj = lambda h, name: h @ p[name].astype(dt) + lora.delta(h, ad, name, scale)
  if cfg.biases:  # GPT-2's tanh approximation of GELU; GPT-NeoX's exact (erf) GELU.
    hid = jax.nn.gelu(proj(x, "wi") + p["bi"].astype(dt), approximate=cfg.variant == "gpt2")
    return proj(hid, "wo") + p["bo"].astype(dt)
  gate = proj(x, "wg")  # SwiGLU, or Gemma's GeGLU with the tanh GELU (gelu_pytorch_tanh).
  gate = jax.nn.silu(gate) if cfg.mlp_activation == "silu" else jax.nn.gelu(gate, approximate=True)
  return proj(gate * proj(x, "wi"), "wo")


def positions_from_mask(mask: jax.Array) -> jax.Array:
  """Position of each token among the real ones: left padding does not shift a prompt."""
  return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), -1) - 1, 0)


def init_cache(cfg: ModelConfig, batch: int, length: int) -> Cache:
  """An empty KV cache for `length` tokens.

  "k" and "v" hold one [B, kv_heads, length, Dh] array per layer (heads before slots, so attention
  reads a layer's cache as it lies), "mask" [B, length] marks the real slots. Separate per-layer
  buffers, rather than one stacked array, let XLA update each in place and feed it to the attention
  matmuls without first copying the layer out: on a CPU that copy dominated a decode step.
  """
  shape = (batch, cfg.n_kv_heads, length, cfg.dim_per_head)
  dt = jnp.dtype(cfg.dtype)
  return {"k": [jnp.zeros(shape, dt) for _ in range(cfg.n_layers)],
          "v": [jnp.zeros(shape, dt) for _ in range(cfg.n_layers)],
          "mask": jnp.zeros((batch, length), bool)}


def forward(params: Params, tokens: jax.Array, cfg: ModelConfig, *, mask: jax.Array | None = None,
            positions: jax.Array | None = None, cache: Cache | None = None,
            cache_index: int | jax.Array = 0, cache_read: int = 0,
            dropout_rng: jax.Array | None = None) -> tuple[jax.Array, Cache | None]:
  """Final hidden states [B,T,D] of `tokens`, and the updated cache if one was given.

  With a cache, the tokens occupy cache slots `cache_index .. cache_index + T - 1` and attend to
  every earlier real slot; `positions` must then be given (or derive from the cache's mask). The
  cached path unrolls the layers (a decode step is small), so each layer's cache stays its own buffer.
  `cache_read` > 0 (static): attention reads only the first `cache_read` slots, which must hold
  every slot written so far (a decode step reads the filled part of its cache, not all of it).
  """
  hidden, cache, _ = _forward(params, tokens, cfg, mask, positions, cache, cache_index, dropout_rng,
                              cache_read=cache_read)
  return hidden, cache


def forward_shared_prompt(params: Params, prompt: jax.Array, prompt_mask: jax.Array,
                          response: jax.Array, response_mask: jax.Array, cfg: ModelConfig, *,
                          dropout_rng: jax.Array | None = None) -> jax.Array:
  """`forward` over prompt + response for k responses per prompt, each prompt computed once.

  prompt [G, P] (left-padded, its last column real), response [G·k, R] with rows g·k … g·k + k − 1
  answering prompt g. Returns the final hidden states [G·k, 1 + R, D] at the prompt's last token and
  at every response token: those of `forward` on the concatenated rows (up to rounding), which are
  all a policy's log-probs or a reward head read. The k responses are packed after their prompt in
  one row of P + k·R tokens; each response attends to the prompt and to itself (causal), never to
  its siblings, and takes the positions it has after the prompt alone. So the prompt's projections,
  MLPs and self-attention run once per group instead of k times: with long prompts and short
  responses (RLHF's shape) that is most of the work.
  """
  g, p = prompt.shape
  n, r = response.shape
  k = n // g
  prompt_mask, response_mask = prompt_mask.astype(bool), response_mask.astype(bool)
  tokens = jnp.concatenate([prompt, response.reshape(g, k * r)], 1)
  mask = jnp.concatenate([prompt_mask, response_mask.reshape(g, k * r)], 1)
  # Each response counts its positions on from the prompt's real tokens, as if it stood alone.
  after = prompt_mask.sum(-1, dtype=jnp.int32)[:, None, None]
  resp_pos = jnp.maximum(after + jnp.cumsum(response_mask.reshape(g, k, r), -1, dtype=jnp.int32) - 1,
                         0)
  positions = jnp.concatenate([positions_from_mask(prompt_mask), resp_pos.reshape(g, k * r)], 1)
  # Segment 0: the prompt, seen by all; segment s + 1: response s, seen by itself only.
  segments = jnp.concatenate([jnp.zeros((p,), jnp.int32), jnp.repeat(jnp.arange(1, k + 1), r)])
  hidden, _, _ = _forward(params, tokens, cfg, mask, positions, None, 0, dropout_rng,
                          segments=segments)
  last = jnp.repeat(hidden[:, p - 1:p], k, axis=0)  # [G·k, 1, D]
  return jnp.concatenate([last, hidden[:, p:].reshape(n, r, -1)], 1)


def prefill(params: Params, tokens: jax.Array, cfg: ModelConfig, *, mask: jax.Array | None = None,
            length: int) -> tuple[jax.Array, Cache]:
  """`forward` of a prompt into a fresh cache of `length` slots, i.e. the same result as
  `forward(params, tokens, cfg, mask=mask, cache=init_cache(cfg, B, length), cache_index=0)`, but the
  prompt attends over its own T slots only (not all `length`) and the layers stay a `lax.scan`."""
  b, t = tokens.shape
  mask = jnp.ones((b, t), bool) if mask is None else mask.astype(bool)
  hidden, _, (k, v) = _forward(params, tokens, cfg, mask, None, None, 0, None, keep_kv=True)
  dt = jnp.dtype(cfg.dtype)
  pad = ((0, 0), (0, 0), (0, 0), (0, length - t), (0, 0))
  k, v = (jnp.pad(a.transpose(0, 1, 3, 2, 4).astype(dt), pad) for a in (k, v))  # [L,B,KV,S,Dh]
  return hidden, {"k": list(k), "v": list(v), "mask": jnp.pad(mask, ((0, 0), (0, length - t)))}


def _forward(params, tokens, cfg, mask, positions, cache, cache_index, dropout_rng, keep_kv=False,
             segments=None, cache_read=0):
  """`forward`, and with `keep_kv` (no cache) also every layer's keys and values [L,B,T,KV,Dh].
  `segments` [T] (no cache): a key of segment s > 0 is seen only by queries of segment s; segment 0
  by every later query (see forward_shared_prompt). `cache_read`: see `forward`."""
  b, t = tokens.shape
  mask = jnp.ones((b, t), bool) if mask is None else mask.astype(bool)
  cache_index = jnp.asarray(cache_index, jnp.int32)
  if cache is not None:
    key_mask = jax.lax.dynamic_update_slice(cache["mask"], mask, (0, cache_index))
    if positions is None:
      positions = jax.lax.dynamic_slice_in_dim(positions_from_mask(key_mask), cache_index, t, 1)
    q_idx = cache_index + jnp.arange(t)
    read = cache_read or key_mask.shape[1]
    k_idx = jnp.arange(read)
    key_positions = positions_from_mask(key_mask)[:, :read] if cfg.sliding_window else None
  else:
    key_mask = mask
    if positions is None:
      positions = positions_from_mask(mask)
    q_idx = k_idx = jnp.arange(t)
    key_positions = positions
  allowed = (k_idx[None, :] <= q_idx[:, None])[None] & key_mask[:, None, :len(k_idx)]  # [B,T,S]
  if segments is not None:
    allowed &= ((segments[None, :] == 0) | (segments[None, :] == segments[:, None]))[None]
  # A local layer's keys: those fewer than `sliding_window` positions back (see the module doc).
  in_window = (None if not cfg.sliding_window else
               positions[:, :, None] - key_positions[:, None, :] < cfg.sliding_window)

  def layer_allowed(local):
    if in_window is None or local is False:
      return allowed
    return allowed & in_window if local is True else allowed & (in_window | ~local)

  dt = jnp.dtype(cfg.dtype)
  x = params["embed"]["embedding"].astype(dt)[tokens]
  if cfg.embed_scale:  # The factor rounded to the compute dtype first, as Gemma's checkpoints were.
    x = x * jnp.asarray(math.sqrt(cfg.d_model), jnp.float32).astype(dt)
  if cfg.variant == "gpt2":
    x = x + params["pos_embed"]["embedding"].astype(dt)[positions]
  rngs = (None if dropout_rng is None or cfg.dropout <= 0
          else jax.random.split(dropout_rng, cfg.n_layers + 1))
  if rngs is not None:
    x = _dropout(x, cfg.dropout, rngs[-1])
  x = sharding_rules.constrain(x, ACTIVATION_AXES)

  # LoRA adapters (models/lora.py), if the tree carries them: per-layer trees beside the layers'.
  adapters = params.get(lora.KEY)
  scale = None if adapters is None else adapters["scale"]
  ad_layers = None if adapters is None else {g: a for g, a in adapters.items() if g != "scale"}

  def block(x, p, rng, kv, ad, local):
    r = (None, None, None) if rng is None else tuple(jax.random.split(rng, 3))
    ad_attn, ad_mlp = (None, None) if ad is None else (ad.get("attn"), ad.get("mlp"))
    q, k, v = _qkv(p["attn"], _norm(x, p["attn_norm"], cfg), positions, cfg, ad_attn, scale,
                   local)
    allowed = layer_allowed(local)
    if kv is None:  # Attend over the tokens themselves.
      h = _attend(p["attn"], q, k, v, allowed, cfg, r[0], heads_major=False, ad=ad_attn,
                  scale=scale, causal=True, packed=segments is not None, local=local)
      kv = (k, v) if keep_kv else None
    else:  # Write this call's keys/values at their slots, then attend over the slots read.
      start = (0, 0, cache_index, 0)
      # Pinned to the cache's own split: else, where `tensor` exceeds the kv heads, XLA keeps the
      # updated cache split as the k/v projections are (part of a head per device) and gathers it
      # whole for attention, every layer and token.
      kv = tuple(sharding_rules.constrain(jax.lax.dynamic_update_slice(
          c, new.transpose(0, 2, 1, 3).astype(c.dtype), start), CACHE_AXES)
                 for c, new in zip(kv, (k, v)))
      h = _attend(p["attn"], q, *(c[:, :, :allowed.shape[-1]] for c in kv), allowed, cfg, r[0],
                  heads_major=True, ad=ad_attn, scale=scale, local=local)
    if cfg.sandwich_norm:
      h = _norm(h, p["attn_post_norm"], cfg)
    h = _dropout(h, cfg.dropout, r[1])
    # Parallel residual (GPT-NeoX): the MLP reads the block's input, not x + attention.
    mlp_in = x if cfg.parallel_residual else x + h
    m = _mlp(p["mlp"], _norm(mlp_in, p["mlp_norm"], cfg), cfg, ad_mlp, scale)
    if cfg.sandwich_norm:
      m = _norm(m, p["mlp_post_norm"], cfg)
    m = _dropout(m, cfg.dropout, r[2])
    x = x + h + m if cfg.parallel_residual else mlp_in + m
    return sharding_rules.constrain(x, ACTIVATION_AXES), kv

  # Each layer's block under the remat policy, its `local` flag (a bool, or traced in the scan)
  # closed over rather than an argument, so that a Python bool stays static.
  run_block = lambda local: checkpointed(functools.partial(block, local=local), cfg)
  layer_rngs = None if rngs is None else rngs[:-1]
  local_layers = cfg.local_layers
  if cache is None and cfg.scan_layers:
    # Which layers are local rides along as data when they differ; else it is a constant.
    mixed = len(set(local_layers)) > 1
    flags = jnp.asarray(local_layers) if mixed else None

    def layer(x, inputs):
      p, rng, ad, local = inputs
      return run_block(local if mixed else local_layers[0])(x, p, rng, None, ad)

    x, kv = jax.lax.scan(layer, x, (params["layers"], layer_rngs, ad_layers, flags))
    return _norm(x, params["final_norm"], cfg), None, kv
  # A decode step, or unrolled layers (scan_layers=False): one layer after another.
  kvs = []
  for i in range(cfg.n_layers):
    p, ad = jax.tree.map(lambda a, i=i: a[i], (params["layers"], ad_layers))
    kv = None if cache is None else (cache["k"][i], cache["v"][i])
    x, kv = run_block(local_layers[i])(x, p, None if layer_rngs is None else layer_rngs[i], kv, ad)
    kvs.append(kv)
  x = _norm(x, params["final_norm"], cfg)
  if cache is None:
    return x, None, jax.tree.map(lambda *a: jnp.stack(a), *kvs) if keep_kv else None
  return x, {"k": [k for k, _ in kvs], "v": [v for _, v in kvs], "mask": key_mask}, None


def checkpointed(block: Callable, cfg: ModelConfig) -> Callable:
  """`block` (one layer) under the rematerialisation policy `cfg.remat`.

  "none": the backward pass reads every activation the forward kept. "full": only the layer's
  input is kept and the whole layer recomputed. "dots": the outputs of matmuls without batch
  dimensions are kept too (q, k, v and output projections, the MLP's), so only element-wise work
  and the attention score matmuls (batched over heads) are recomputed. "offload": the same matmul
  outputs go to pinned host memory and come back for the backward pass. Without a backward pass
  the policy changes nothing: the forward compiles to the same program.
  """
  if cfg.remat == "none":
    return block
  if cfg.remat == "full":
    return jax.checkpoint(block)
  if cfg.remat == "dots":
    return jax.checkpoint(block, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
  kinds = {m.kind for m in jax.devices()[0].addressable_memories()}
  if not {"device", "pinned_host"} <= kinds:
    raise ConfigError(f"model.remat='offload' needs device and pinned_host memories; "
                      f"{jax.default_backend()} has {sorted(kinds)}: use 'dots' or 'full'")
  return jax.checkpoint(block, policy=jax.checkpoint_policies.offload_dot_with_no_batch_dims(
      "device", "pinned_host"))


def lm_logits(params: Params, hidden: jax.Array, cfg: ModelConfig) -> jax.Array:
  """Next-token logits in float32, through the tied embedding or a separate head, soft-capped
  (cap * tanh(logits / cap), in float32) when `cfg.final_softcap` is set. Under a bf16 compute
  dtype the head multiplies the bf16 hidden states and weights with float32 results
  (`preferred_element_type`), so log-probs, ratios and KL are not rounded to bf16's grid (a step
  of 0.0625 between logits 8 and 16); float32 models compute as before."""
  if cfg.tie_embeddings:
    w = params["embed"]["embedding"].astype(hidden.dtype).T
  else:
    w = params["lm_head"]["kernel"].astype(hidden.dtype)
  logits = jnp.matmul(hidden, w, preferred_element_type=jnp.float32)
  if cfg.final_softcap:
    logits = cfg.final_softcap * jnp.tanh(logits / cfg.final_softcap)
  return logits


def token_logprobs(params: Params, tokens: jax.Array, mask: jax.Array, cfg: ModelConfig, *,
                   temperature: float = 1.0) -> tuple[jax.Array, jax.Array]:
  """log p(tokens[:, t+1] | tokens[:, :t+1]) at `temperature`, and the entropy of that distribution.

  Both are [B, T-1] and zero where `mask[:, 1:]` is False.
  """
  hidden, _ = forward(params, tokens, cfg, mask=mask)
  logp = jax.nn.log_softmax(lm_logits(params, hidden[:, :-1], cfg) / temperature)
  chosen = jnp.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0]
  entropy = -(jnp.exp(logp) * logp).sum(-1)
  m = mask[:, 1:]
  return jnp.where(m, chosen, 0.0), jnp.where(m, entropy, 0.0)
