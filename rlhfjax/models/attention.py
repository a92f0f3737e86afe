"""Attention kernels: softmax(q k^T / sqrt(Dh), masked) v, as pure functions.

Two Gemma details go inside every kernel: the scores are divided by sqrt(`cfg.attn_scale_dim`)
(Gemma's `query_pre_attn_scalar`, else Dh), then soft-capped, cap * tanh(s / cap), when
`cfg.attn_softcap` is set (Gemma 2; "xla" and "cudnn" have no soft-cap: the config refuses them, and
"auto" picks chunked instead of cudnn). A sliding window (`cfg.sliding_window`) reaches the kernels
that take a mask through `allowed` itself (the model hides keys outside a local layer's window);
splash, which builds its mask from the key mask, takes the layer's `local` flag and adds a local
mask of the window to its causal one.

q is [B,T,H,Dh]; k and v are [B,S,KV,Dh], or [B,KV,S,Dh] with `heads_major` (the KV-cache layout);
q head i uses kv head i // (H / KV) (grouped-query attention). `allowed` [B,T,S] says which keys
each query sees. The result is [B,T,H,Dh] in q's dtype; the output projection stays with the model.

`ModelConfig.attention` picks the implementation (`attend` dispatches):
  "reference": the whole [B,H,T,S] float32 score matrix at once; the only one with dropout.
  "chunked": the same math over blocks of `attention_chunk` queries, each block rematerialised in
    the backward pass, so memory peaks at B x H x chunk x S instead of B x H x T x S. In causal
    self-attention (`causal`: the model's uncached forward) block i attends only to the keys up to
    its last query, skipping the blocks above the diagonal: about half the score FLOPs and memory
    traffic at long T. Plain XLA: runs anywhere.
  "splash": the Pallas TPU splash-attention kernel (flash attention: no score matrix in memory at
    all, and causally masked blocks skipped). TPU only.
  "xla": `jax.nn.dot_product_attention(implementation="xla")`: like the reference, the whole
    float32 score matrix at once, and no block skipped. Runs anywhere; it is there to run, on any
    host, exactly the arguments "cudnn" gets (`sdpa_arguments`).
  "cudnn": the same call with `implementation="cudnn"`: cuDNN's flash attention, no score matrix
    in memory and the blocks above the diagonal skipped, but `allowed` read as a [B,1,T,S] additive
    bias in the compute dtype (and a bias gradient of that shape written, unused, in the backward
    pass). CUDA GPUs only, bf16 or fp16 activations, Dh a multiple of 8 (at most 128 before Hopper,
    256 from it).
  "auto": per platform, chosen when the step is lowered (`resolve` names the choice): splash on
    TPU, cudnn on a CUDA GPU for bf16/fp16 activations and Dh a multiple of 8 up to 128, chunked
    elsewhere.
A KV-cache step (`heads_major`: its queries sit at an offset in the cache) runs the reference under
splash, xla and cudnn (so under auto on TPU and GPU; on a CPU auto is chunked there too). Packed
samples after a shared prompt (`packed`) go through chunked under splash; xla and cudnn take their
whole mask (it is causal too, so `is_causal` holds). An odd length gains one masked position for
xla and cudnn (see `sdpa_arguments`).

Padding (left-padded prompts, right-padded responses): `allowed` hides padding keys from every
query. A padding query sees no key at all (left padding) or, under splash, only padding: its output
is a finite average of values that differs between kernels, and is never read.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.extend.backend
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from rlhfjax.models.config import ModelConfig
from rlhfjax.models import sharding_rules

_NEG_INF = -1e30  # Finite, so a fully masked (padding) query row stays NaN-free.
_SPLASH_BLOCKS = (512, 256, 128)  # Tile sizes tried, largest first (multiples of 128 lanes).
# What "auto" sends to cuDNN: the activation dtypes it takes, and head dims every GPU it runs on
# takes (Ampere's limit; Hopper takes up to 256).
_CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
_CUDNN_MAX_HEAD_DIM = 128


def attend(q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array, cfg: ModelConfig, *,
           heads_major: bool = False, causal: bool = False, packed: bool = False,
           rng: jax.Array | None = None, local: bool | jax.Array = False) -> jax.Array:
  """Attention by `cfg.attention`; `rng` drives dropout on the probabilities (reference only).
  `causal` promises that `allowed` never lets query t see a key after position t (T == S);
  `packed`, that it also hides some earlier real keys (samples packed after a shared prompt),
  which splash's causal-and-padding mask cannot express: chunked attention runs those. `local`
  (a bool, or a traced one inside the layers' scan): the layer is a sliding-window one, whose
  window `allowed` already applies; only splash reads it."""
  if cfg.attention != "auto":
    return _run(cfg.attention, q, k, v, allowed, cfg, heads_major=heads_major, causal=causal,
                packed=packed, rng=rng, local=local)

  def on(platform):  # The branch for one platform: the kernel `resolve` names there.
    return lambda q, k, v, allowed: _run(resolve(cfg, platform), q, k, v, allowed, cfg,
                                         heads_major=heads_major, causal=causal, packed=packed,
                                         local=local)

  # Every branch is traced, only the lowering platform's is compiled. Tracing cuDNN's needs a CUDA
  # backend in this process, where JAX finds cuDNN; a TPU step lowered on any host gets splash.
  cuda = {"cuda": on("cuda")} if _has_cuda() and resolve(cfg, "cuda") != "chunked" else {}
  return jax.lax.platform_dependent(q, k, v, allowed, tpu=on("tpu"), default=on("cpu"), **cuda)


def resolve(cfg: ModelConfig, platform: str) -> str:
  """The kernel `cfg.attention` means on `platform` (a lowering platform: "cpu", "cuda", "rocm",
  "tpu"; `platform_of` names a device's): itself, but for "auto" splash on TPU, cudnn on a CUDA
  GPU when the activations are bf16/fp16 and the head dim one that every cuDNN GPU takes, chunked
  otherwise (and whenever the scores are soft-capped, which cuDNN cannot do)."""
  if cfg.attention != "auto":
    return cfg.attention
  if platform == "tpu":
    return "splash"
  dh = cfg.dim_per_head
  if (platform == "cuda" and not cfg.attn_softcap and jnp.dtype(cfg.dtype) in _CUDNN_DTYPES
      and dh % 8 == 0
      and dh <= _CUDNN_MAX_HEAD_DIM):
    return "cudnn"
  return "chunked"


def platform_of(device: jax.Device) -> str:
  """`device`'s lowering platform as `resolve` takes it: a device says "gpu" for CUDA and ROCm
  alike, and only CUDA has cuDNN."""
  if device.platform != "gpu":
    return device.platform
  return "cuda" if _has_cuda() else "rocm"


def _has_cuda() -> bool:
  """Whether this process has a CUDA backend. JAX's cuDNN attention checks for cuDNN when it is
  traced, whatever platform it is then lowered for, and the CUDA plugin is what brings cuDNN; the
  backends a process has (`jax.extend.backend.backends()`, by platform name) say so, untraced."""
  return "cuda" in jax.extend.backend.backends()


def _run(kernel: str, q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array,
         cfg: ModelConfig, *, heads_major: bool, causal: bool, packed: bool,
         rng: jax.Array | None = None, local: bool | jax.Array = False) -> jax.Array:
  """`attend` by the concrete `kernel` (any of config.ATTENTION but "auto")."""
  logits = {"scale_dim": cfg.attn_scale_dim, "softcap": cfg.attn_softcap}
  if kernel == "chunked" or (kernel == "splash" and packed):
    return chunked(q, k, v, allowed, cfg.attention_chunk, heads_major=heads_major, causal=causal,
                   **logits)
  if kernel == "reference" or heads_major:
    return reference(q, k, v, allowed, heads_major=heads_major, dropout=cfg.dropout, rng=rng,
                     **logits)
  if kernel == "splash":
    # Uncached self-attention: `allowed` is causal AND key-is-real (AND in the window), so its
    # diagonal is the key mask.
    key_mask = jnp.diagonal(allowed, axis1=1, axis2=2)
    run = lambda window: lambda q, k, v, m: splash(q, k, v, m, window=window, **logits)
    if not cfg.sliding_window or isinstance(local, bool):
      return run(cfg.sliding_window if local else 0)(q, k, v, key_mask)
    return jax.lax.cond(local, run(cfg.sliding_window), run(0), q, k, v, key_mask)
  return sdpa(q, k, v, allowed, causal=causal, implementation=kernel,
              scale=1 / math.sqrt(cfg.attn_scale_dim))


def _scores(scores: jax.Array, scale_dim: float | None, softcap: float, dh: int) -> jax.Array:
  """Raw q·k scores (float32) scaled by 1/sqrt(`scale_dim`, else Dh), soft-capped if `softcap`."""
  scores = scores / math.sqrt(scale_dim or dh)
  if softcap:
    scores = softcap * jnp.tanh(scores / softcap)
  return scores


def sdpa_arguments(q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array, *,
                   causal: bool, scale: float | None = None
                   ) -> tuple[tuple[jax.Array, jax.Array, jax.Array], dict]:
  """The positional and keyword arguments "xla" and "cudnn" both give
  `jax.nn.dot_product_attention`, so that "xla" runs, on any host, what cuDNN gets.

  q [B,T,H,Dh] and k, v [B,S,KV,Dh] are already its query and key layouts (BTNH, BSKH; query head
  n uses kv head n // (H/KV), as here). The mask is all of `allowed`, as [B,1,T,S]: cuDNN turns a
  boolean mask into an additive bias (0, or a large finite negative) and takes a bias that spans
  T x S, broadcast over heads only (and batch), so this is the smallest it accepts; it covers left
  and right padding and the packed layout alike. A query that sees no key gets a finite average.
  `is_causal` (allowed: `allowed` is causal) lets cuDNN skip the blocks above the diagonal. An odd
  T or S gets one more position, a query that sees nothing and a key that nothing sees (cuDNN's
  backward with a bias needs even lengths); `sdpa` drops the extra query's output. `scale`: the
  scores' factor (None: 1/sqrt(Dh)).
  """
  pad_t, pad_s = q.shape[1] % 2, k.shape[1] % 2
  q = jnp.pad(q, ((0, 0), (0, pad_t), (0, 0), (0, 0)))
  k, v = (jnp.pad(x.astype(q.dtype), ((0, 0), (0, pad_s), (0, 0), (0, 0))) for x in (k, v))
  mask = jnp.pad(allowed, ((0, 0), (0, pad_t), (0, pad_s)))[:, None]
  scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
  return (q, k, v), {"mask": mask, "is_causal": causal, "scale": scale}


def sdpa(q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array, *, causal: bool,
         implementation: str, scale: float | None = None) -> jax.Array:
  """`jax.nn.dot_product_attention` by `implementation` ("xla" or "cudnn") on `sdpa_arguments`."""
  args, kwargs = sdpa_arguments(q, k, v, allowed, causal=causal, scale=scale)
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:  # cuDNN's partitioner wants q, k and v split alike.
    q_spec, kv_spec = _head_specs(args[0].shape, args[1].shape, mesh, head_axis=2)
    args = tuple(jax.lax.with_sharding_constraint(x, s)
                 for x, s in zip(args, (q_spec, kv_spec, kv_spec)))
  out = jax.nn.dot_product_attention(*args, **kwargs, implementation=implementation)
  return out[:, :q.shape[1]]


def reference(q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array, *,
              heads_major: bool = False, dropout: float = 0.0,
              rng: jax.Array | None = None, scale_dim: float | None = None,
              softcap: float = 0.0) -> jax.Array:
  """The whole score matrix in float32 (scaled and soft-capped as `_scores` says), softmax,
  dropout (given an `rng`), weighted values."""
  dt = q.dtype
  b, t, h, dh = q.shape
  kv_heads = k.shape[1 if heads_major else 2]
  q = q.reshape(b, t, kv_heads, h // kv_heads, dh)  # q head i uses kv head i // groups.
  kv_spec = "bksd" if heads_major else "bskd"
  scores = _scores(jnp.einsum(f"btkgd,{kv_spec}->bkgts", q, k.astype(dt)).astype(jnp.float32),
                   scale_dim, softcap, dh)
  scores = jnp.where(allowed[:, None, None], scores, _NEG_INF)
  probs = jax.nn.softmax(scores, -1)
  if rng is not None and dropout > 0:
    keep = jax.random.bernoulli(rng, 1.0 - dropout, probs.shape)
    probs = jnp.where(keep, probs / (1.0 - dropout), 0)
  return jnp.einsum(f"bkgts,{kv_spec}->btkgd", probs.astype(dt), v.astype(dt)).reshape(b, t, h, dh)


def chunked(q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array, chunk: int, *,
            heads_major: bool = False, causal: bool = False, scale_dim: float | None = None,
            softcap: float = 0.0) -> jax.Array:
  """`reference` (without dropout) over blocks of `chunk` queries, one at a time.

  Each block takes its softmax over all the keys it may see, so results match the reference up to
  rounding. The block is a `jax.checkpoint`, so the backward pass recomputes its probabilities
  rather than keeping all T/chunk of them. Without `causal`, the blocks run in a `lax.map` over all
  S keys, T padded up to a multiple of `chunk` with queries that see no key; with it, block i
  (queries [i*chunk, (i+1)*chunk)) sees only keys [0, (i+1)*chunk): the masked keys after it would
  add exactly zero probability. (A query that sees no key at all, left padding, averages the values
  it was given, which now differ by block: such outputs are never read.)
  """
  b, t, h, dh = q.shape
  logits = {"scale_dim": scale_dim, "softcap": softcap}
  if t <= chunk:
    return reference(q, k, v, allowed, heads_major=heads_major, **logits)
  if causal and not heads_major:
    return _causal_blocks(q, k, v, allowed, chunk, **logits)
  n = -(-t // chunk)
  pad = n * chunk - t
  q = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b, n, chunk, h, dh)
  allowed = jnp.pad(allowed, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk, allowed.shape[-1])

  @jax.checkpoint
  def block(xs):
    q_block, allowed_block = xs
    return reference(q_block, k, v, allowed_block, heads_major=heads_major, **logits)

  out = jax.lax.map(block, (q.swapaxes(0, 1), allowed.swapaxes(0, 1)))  # [n,B,chunk,H,Dh]
  return out.swapaxes(0, 1).reshape(b, n * chunk, h, dh)[:, :t]


def _causal_blocks(q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array,
                   chunk: int, scale_dim: float | None = None, softcap: float = 0.0) -> jax.Array:
  """`chunked` for causal self-attention: block i of queries against keys [0, (i+1)*chunk), in a
  heads-major layout ([B,KV,G,T,Dh] queries, [B,KV,S,Dh] keys and values, transposed once), where
  every score and mixing matmul is a plain batched matmul: on CPU about 1.4x faster than the
  token-major einsums of `reference` (bench/peers)."""
  b, t, h, dh = q.shape
  kv_heads = k.shape[2]
  q = q.reshape(b, t, kv_heads, h // kv_heads, dh).transpose(0, 2, 3, 1, 4)
  k, v = k.transpose(0, 2, 1, 3).astype(q.dtype), v.transpose(0, 2, 1, 3).astype(q.dtype)

  @jax.checkpoint
  def block(q, k, v, allowed):
    scores = _scores(jnp.einsum("bkgtd,bksd->bkgts", q, k).astype(jnp.float32), scale_dim, softcap,
                     dh)
    probs = jax.nn.softmax(jnp.where(allowed[:, None, None], scores, _NEG_INF), -1)
    return jnp.einsum("bkgts,bksd->bkgtd", probs.astype(q.dtype), v)

  out = jnp.concatenate([block(q[:, :, :, i:i + chunk], k[:, :, :i + chunk], v[:, :, :i + chunk],
                               allowed[:, i:i + chunk, :i + chunk])
                         for i in range(0, t, chunk)], 3)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, dh)


def _head_specs(q_shape: tuple[int, ...], kv_shape: tuple[int, ...], mesh: Any,
                head_axis: int) -> tuple[P, P]:
  """Partition specs of q and of k, v (4-d, heads on `head_axis`): batch by the sharding rules,
  heads too where the tensor axis splits q's and kv's heads alike, so each device keeps whole
  q-head groups (grouped-query attention); otherwise batch only, for all three."""
  def spec(heads: str, shape: tuple[int, ...]) -> P:
    axes: list[str | None] = ["batch", None, None, None]
    axes[head_axis] = heads
    return sharding_rules.spec(tuple(axes), shape, mesh)

  q_spec, kv_spec = spec("heads", q_shape), spec("kv_heads", kv_shape)
  if q_spec[head_axis] != kv_spec[head_axis]:
    q_spec = kv_spec = P(q_spec[0], None, None, None)
  return q_spec, kv_spec


def splash(q: jax.Array, k: jax.Array, v: jax.Array, key_mask: jax.Array, *, window: int = 0,
           scale_dim: float | None = None, softcap: float = 0.0) -> jax.Array:
  """Causal self-attention by the Pallas splash kernel; q [B,T,H,Dh], k, v [B,T,KV,Dh].

  `window` > 0: each query sees only the `window` latest keys (itself included), by the kernel's
  local mask, which skips the blocks left of the window as the causal mask skips those above the
  diagonal. The kernel counts array slots, the model positions: they agree where a row's real
  tokens are contiguous (left-padded prompts, right-padded responses: every layout the project
  feeds it; packed samples go to chunked attention). `scale_dim` and `softcap` as in `reference`
  (the kernel's own `attn_logits_soft_cap` caps the scores after q is scaled).

  Padding goes in as segment ids (`key_mask` [B,T] as 0/1): a real token attends to the real tokens
  at or before it, as in `reference`, but a padding token attends to the padding at or before it
  (there is always itself, so no row is empty), not to real keys; outputs at padding positions
  differ from the reference and must not be used. The kernel's tiles need a multiple of 128 tokens:
  T is padded up to one at the end, where causal masking hides the extra keys from every query.
  Inside a sharded step (a mesh is set) the kernel, a custom call that XLA cannot partition, runs
  per device under `shard_map`, batch and heads split by the sharding rules. Lowered for a platform
  other than TPU, it runs the kernel's emulation (Pallas interpret mode): correct but slow, for
  tests.
  """
  # Imported here: Pallas and the kernel take a quarter of a second to import, and only splash
  # runs need them.
  from jax.experimental.pallas.ops.tpu import splash_attention
  splash_lib = splash_attention.splash_attention_kernel
  splash_mask = splash_attention.splash_attention_mask
  b, t, h, dh = q.shape
  padded = -(-t // 128) * 128
  block = next(n for n in _SPLASH_BLOCKS if padded % n == 0)
  sizes = splash_lib.BlockSizes(block_q=block, block_kv=block, block_q_dkv=block,
                                block_kv_dkv=block, block_q_dq=block, block_kv_dq=block)
  q = q / jnp.asarray(math.sqrt(scale_dim or dh), q.dtype)  # The kernel does not scale.
  # [B,heads,T,Dh] with T padded; padding tokens get segment 0.
  q, k, v = (jnp.pad(x, ((0, 0), (0, padded - t), (0, 0), (0, 0))).transpose(0, 2, 1, 3)
             for x in (q, k, v))
  segments = jnp.pad(key_mask.astype(jnp.int32), ((0, 0), (0, padded - t)))

  def run(q, k, v, segments):  # Per device under a mesh: its heads of q (q.shape[1]) and k, v.
    one = (splash_mask.LocalMask((padded, padded), window_size=(window - 1, 0), offset=0)
           if window else splash_mask.CausalMask((padded, padded)))
    mask = splash_mask.MultiHeadMask([one] * q.shape[1])

    def kernel(interpret):
      fn = splash_lib.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                      attn_logits_soft_cap=softcap or None, interpret=interpret)
      return jax.vmap(lambda q, k, v, s: fn(q, k, v, splash_lib.SegmentIds(s, s)))

    return jax.lax.platform_dependent(q, k, v, segments, tpu=kernel(False), default=kernel(True))

  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    q_spec, kv_spec = _head_specs(q.shape, k.shape, mesh, head_axis=1)
    run = jax.shard_map(run, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, P(q_spec[0])),
                        out_specs=q_spec, check_vma=False)  # The kernel declares no vma.
  return run(q, k, v, segments).transpose(0, 2, 1, 3)[:, :t]
