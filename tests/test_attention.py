"""Attention kernels: chunked and splash against the reference, memory, and a TPU compile."""

import os

# libtpu reads these when it loads (here: to describe a TPU topology on a CPU host); they must be
# set before jax initialises a backend, so at import. The last lets it load beside other processes.
for _key, _value in (("TPU_SKIP_MDS_QUERY", "1"), ("TPU_ACCELERATOR_TYPE", "v5litepod-4"),
                     ("TPU_WORKER_HOSTNAMES", "localhost"), ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")):
  os.environ.setdefault(_key, _value)

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhfjax.errors import ConfigError
from rlhfjax.models import attention
from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig

GPT2 = ModelConfig(variant="gpt2", vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4,
                   d_ff=64, max_len=128)
LLAMA = ModelConfig(variant="llama", vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                    d_ff=64, max_len=128, tie_embeddings=False)


def _padded(b: int, t: int) -> np.ndarray:
  """A [b, t] real-token mask: row 0 left-padded, row 1 right-padded, the rest full."""
  mask = np.ones((b, t), bool)
  mask[0, :5] = False
  mask[1, -3:] = False
  return mask


def _qkv(b, t, s, h, kv, dh, seed=0):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.normal(size=(b, t, h, dh)), jnp.float32)
  k, v = (jnp.asarray(rng.normal(size=(b, s, kv, dh)), jnp.float32) for _ in range(2))
  return q, k, v


def _value_and_grads(fn, q, k, v, *args, weight):
  """fn's output, and the gradients w.r.t. q, k, v of its `weight`ed sum."""
  def loss(q, k, v):
    out = fn(q, k, v, *args)
    return (out * weight).sum(), out
  (_, out), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(q, k, v)
  return out, grads


def test_config_validation():
  with pytest.raises(ConfigError, match="model.attention"):
    LLAMA.replace(attention="flash")
  with pytest.raises(ConfigError, match="model.attention"):
    LLAMA.replace(attention="chunked", dropout=0.1)
  with pytest.raises(ConfigError, match="model.attention_chunk"):
    LLAMA.replace(attention="chunked", attention_chunk=0)


@pytest.mark.parametrize("heads_major", [False, True])
def test_chunked_matches_reference(heads_major):
  """GQA, left and right padding, T = 20 queries in blocks of 8 at slots 2..21 of S = 30 keys, as a
  prompt in a KV cache (three left-padding queries see no key at all), in both key layouts."""
  b, t, s, offset = 3, 20, 30, 2
  q, k, v = _qkv(b, t, s, 4, 2, 8)
  key_mask = _padded(b, s)
  allowed = jnp.asarray((np.arange(s)[None] <= offset + np.arange(t)[:, None])[None]
                        & key_mask[:, None])
  if heads_major:
    k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
  weight = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)
  ref = _value_and_grads(functools.partial(attention.reference, heads_major=heads_major),
                         q, k, v, allowed, weight=weight)
  got = _value_and_grads(functools.partial(attention.chunked, chunk=8, heads_major=heads_major),
                         q, k, v, allowed, weight=weight)
  for a, b_ in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
    np.testing.assert_allclose(a, b_, atol=1e-5, rtol=1e-5)


def test_causal_chunked_matches_reference_and_skips_masked_blocks():
  """Causal self-attention (T = S = 20, blocks of 8, the last one short) with GQA and padding:
  outputs and gradients as the reference's; and at T = 512 the compiled blocks do a bit over half
  the reference's FLOPs, the key blocks after each query block being skipped."""
  b, t = 3, 20
  q, k, v = _qkv(b, t, t, 4, 2, 8)
  allowed = np.tril(np.ones((t, t), bool))[None] & _padded(b, t)[:, None]
  # A query that sees no key (left padding) gets a meaningless average; the model never reads it.
  sees = allowed.any(-1)
  weight = np.random.default_rng(1).normal(size=q.shape) * sees[..., None, None]
  ref = _value_and_grads(attention.reference, q, k, v, jnp.asarray(allowed),
                         weight=jnp.asarray(weight, jnp.float32))
  got = _value_and_grads(functools.partial(attention.chunked, chunk=8, causal=True),
                         q, k, v, jnp.asarray(allowed), weight=jnp.asarray(weight, jnp.float32))
  np.testing.assert_allclose(np.asarray(got[0])[sees], np.asarray(ref[0])[sees], atol=1e-5)
  for a, b_ in zip(jax.tree.leaves(got[1]), jax.tree.leaves(ref[1])):
    np.testing.assert_allclose(a, b_, atol=1e-5, rtol=1e-5)

  t = 512
  shapes = (jax.ShapeDtypeStruct((1, t, 4, 64), jnp.float32),) * 3 + (
      jax.ShapeDtypeStruct((1, t, t), jnp.bool_),)

  def flops(fn):
    return jax.jit(fn).lower(*shapes).compile().cost_analysis()["flops"]

  full = flops(attention.reference)
  causal = flops(functools.partial(attention.chunked, chunk=64, causal=True))
  assert 0.5 * full < causal < 0.65 * full


@functools.cache
def _params(cfg):
  return jax.jit(transformer.init, static_argnums=1)(jax.random.key(0), cfg)


def _model_loss(params, tokens, mask, cfg):
  """Sum of the log-probabilities of real tokens predicted from real tokens, and the hidden states.
  (A left-padded row's first token is predicted from padding, where the kernels' states differ.)"""
  hidden, _ = transformer.forward(params, tokens, cfg, mask=mask)
  logp = jax.nn.log_softmax(transformer.lm_logits(params, hidden[:, :-1], cfg))
  chosen = jnp.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0]
  return jnp.where(mask[:, :-1] & mask[:, 1:], chosen, 0).sum(), hidden


@functools.partial(jax.jit, static_argnums=(3, 4))
def _model_outputs(params, tokens, mask, cfg, grads):
  """(loss, hidden) and, with `grads`, the loss's gradients."""
  if grads:
    return jax.value_and_grad(_model_loss, has_aux=True)(params, tokens, mask, cfg)
  return _model_loss(params, tokens, mask, cfg), None


def _compare_models(cfg, other, t, grads):
  """The model with `cfg` and with `other` agree at real tokens: hidden states, loss (and grads)."""
  params = _params(cfg)
  tokens = jnp.asarray(np.random.default_rng(2).integers(3, cfg.vocab_size, (2, t)), jnp.int32)
  mask = _padded(2, t)
  (ref_loss, ref_hidden), ref_grads = _model_outputs(params, tokens, jnp.asarray(mask), cfg, grads)
  (loss, hidden), got_grads = _model_outputs(params, tokens, jnp.asarray(mask), other, grads)
  np.testing.assert_allclose(np.asarray(hidden)[mask], np.asarray(ref_hidden)[mask], atol=1e-5)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(got_grads), jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("cfg,grads", [(GPT2, False), (LLAMA.replace(remat=True), True)],
                         ids=["gpt2", "llama-remat"])
def test_chunked_model_matches_reference(cfg, grads):
  """T = 20 in blocks of 8; llama has GQA, and its gradients go through remat."""
  _compare_models(cfg, cfg.replace(attention="chunked", attention_chunk=8), 20, grads)


def test_chunked_cached_forward_matches_reference():
  """A prompt written into a KV cache (heads-major keys) attends in blocks too."""
  tokens = jnp.asarray(np.random.default_rng(3).integers(3, 64, (2, 20)), jnp.int32)
  mask = jnp.asarray(_padded(2, 20))

  @functools.partial(jax.jit, static_argnums=1)
  def cached(params, cfg):
    return transformer.forward(params, tokens, cfg, mask=mask,
                               cache=transformer.init_cache(cfg, 2, 24))[0]

  params = _params(LLAMA)
  np.testing.assert_allclose(cached(params, LLAMA.replace(attention="chunked", attention_chunk=8)),
                             cached(params, LLAMA), atol=1e-5)


def test_chunked_does_not_store_full_scores():
  """Gradient of attention at T = S = 1024: the reference keeps [B,H,T,S] float32 probabilities,
  the chunked path only one block's [B,H,128,S] at a time."""
  b, t, h, kv, dh = 1, 1024, 4, 2, 32
  shapes = (jax.ShapeDtypeStruct((b, t, h, dh), jnp.float32),
            jax.ShapeDtypeStruct((b, t, kv, dh), jnp.float32),
            jax.ShapeDtypeStruct((b, t, kv, dh), jnp.float32),
            jax.ShapeDtypeStruct((b, t, t), jnp.bool_))

  def temp_bytes(fn):
    grad = jax.grad(lambda q, k, v, allowed: fn(q, k, v, allowed).sum(), (0, 1, 2))
    return jax.jit(grad).lower(*shapes).compile().memory_analysis().temp_size_in_bytes

  full = b * h * t * t * 4
  ref = temp_bytes(attention.reference)
  chunked = temp_bytes(functools.partial(attention.chunked, chunk=128))
  assert ref >= full
  assert chunked < full and chunked * 4 < ref


def test_splash_matches_reference_in_interpret_mode():
  """Off TPU the splash kernel runs in Pallas interpret mode: same outputs and gradients at real
  tokens, with GQA, T = 330 padded to 3 blocks of 128."""
  b, t = 3, 330
  q, k, v = _qkv(b, t, t, 4, 2, 16)
  mask = _padded(b, t)
  allowed = jnp.asarray(np.tril(np.ones((t, t), bool))[None] & mask[:, None])
  weight = jnp.asarray(np.random.default_rng(1).normal(size=q.shape) * mask[:, :, None, None],
                       jnp.float32)  # Padding outputs differ by design: give them no gradient.
  ref = _value_and_grads(attention.reference, q, k, v, allowed, weight=weight)
  got = _value_and_grads(attention.splash, q, k, v, jnp.asarray(mask), weight=weight)
  np.testing.assert_allclose(np.asarray(got[0])[mask], np.asarray(ref[0])[mask], atol=1e-5)
  for a, b_ in zip(got[1], ref[1]):
    np.testing.assert_allclose(a, b_, atol=1e-5)


def test_splash_model_matches_reference():
  _compare_models(LLAMA, LLAMA.replace(attention="splash"), 20, grads=False)


def test_splash_compiles_for_tpu():
  """A sharded training step (forward + grad, remat, bf16) with splash attention lowers and compiles
  for 4 TPU v5e chips, batch split over fsdp and heads over tensor, the kernel a TPU custom call."""
  pytest.importorskip("libtpu")
  from jax.experimental import topologies
  from jax.sharding import AxisType, Mesh

  from rlhfjax.parallel.sharding import Parallel

  devices = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices
  mesh = Mesh(np.array(devices).reshape(1, 2, 2), ("data", "fsdp", "tensor"),
              axis_types=(AxisType.Auto,) * 3)
  par = Parallel(mesh)
  cfg = LLAMA.replace(attention="splash", remat=True, dtype="bfloat16", max_len=256)
  shapes = jax.eval_shape(lambda: transformer.init(jax.random.key(0), cfg))
  param_shardings = par.shardings(transformer.param_axes(cfg), shapes)
  step = jax.jit(jax.value_and_grad(lambda p, tokens, mask: _model_loss(p, tokens, mask, cfg)[0]),
                 in_shardings=(param_shardings, par.batch, par.batch),
                 out_shardings=(par.replicated, param_shardings))
  args = (par.abstract(shapes, param_shardings),
          jax.ShapeDtypeStruct((4, 256), jnp.int32, sharding=par.batch),
          jax.ShapeDtypeStruct((4, 256), jnp.bool_, sharding=par.batch))
  with jax.set_mesh(mesh):
    compiled = step.lower(*args).compile()
  assert compiled.as_text().count("tpu_custom_call") >= 3  # Forward, dq and dkv kernels.
