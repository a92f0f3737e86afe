"""Attention kernels: chunked, splash, xla and auto against the reference, memory, cuDNN's
arguments, and TPU lowering."""

import os

# libtpu reads these when it loads (here: to describe a TPU topology on a CPU host); they must be
# set before jax initialises a backend, so at import. The last lets it load beside other processes.
for _key, _value in (("TPU_SKIP_MDS_QUERY", "1"), ("TPU_ACCELERATOR_TYPE", "v5litepod-4"),
                     ("TPU_WORKER_HOSTNAMES", "localhost"), ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")):
  os.environ.setdefault(_key, _value)

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhfjax.errors import ConfigError
from rlhfjax.models import attention
from rlhfjax.models.config import ModelConfig
from rlhfjax.models import sampling
from rlhfjax.models import transformer

GPT2 = ModelConfig(variant="gpt2", vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4,
                   d_ff=64, max_len=128)
LLAMA = ModelConfig(variant="llama", vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                    d_ff=64, max_len=128, tie_embeddings=False)
# Gemma's details inside the kernels: a window of 4 on layers 0 and 2 (layer 1 global), scores
# scaled by 1/sqrt(24) and soft-capped at 2, the local layers' own RoPE base.
GEMMA = LLAMA.replace(n_layers=3, head_dim=16, norm_plus_one=True, sandwich_norm=True,
                      mlp_activation="gelu_tanh", embed_scale=True, query_pre_attn_scalar=24.0,
                      attn_softcap=2.0, final_softcap=8.0, sliding_window=4,
                      sliding_window_pattern=2, qk_norm=True, rope_local_theta=100.0)


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
  for name in ("chunked", "splash", "xla", "auto"):
    with pytest.raises(ConfigError, match="model.attention"):
      LLAMA.replace(attention=name, dropout=0.1)
  with pytest.raises(ConfigError, match="model.attention"):
    LLAMA.replace(attention="cudnn", dtype="bfloat16", dropout=0.1)
  with pytest.raises(ConfigError, match="model.dtype"):
    LLAMA.replace(attention="cudnn")  # float32 activations.
  with pytest.raises(ConfigError, match="head dims"):
    LLAMA.replace(attention="cudnn", dtype="bfloat16", head_dim=12)
  LLAMA.replace(attention="cudnn", dtype="float16")
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


@pytest.mark.parametrize("cfg,grads", [(GPT2, False), (LLAMA.replace(remat="full"), True)],
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
  cfg = LLAMA.replace(attention="splash", remat="full", dtype="bfloat16", max_len=256)
  shapes = jax.eval_shape(lambda: transformer.init(jax.random.key(0), cfg))
  param_shardings = par.shardings(transformer.param_axes(cfg), shapes)
  step = jax.jit(jax.value_and_grad(lambda p, tokens, mask: _model_loss(p, tokens, mask, cfg)[0]),
                 in_shardings=(param_shardings, par.batch, par.batch),
                 out_shardings=(par.replicated, param_shardings))
  args = (par.abstract(shapes, param_shardings),
          jax.ShapeDtypeStruct((4, 256), jnp.int32, sharding=par.batch),
          jax.ShapeDtypeStruct((4, 256), jnp.bool_, sharding=par.batch))
  # A bfloat16 model runs at JAX's default precision (runtime.matmul_precision 'auto'); the test
  # session's blanket 'highest' (conftest) would ask Mosaic for float32 bfloat16 matmuls.
  with jax.set_mesh(mesh), jax.default_matmul_precision("default"):
    compiled = step.lower(*args).compile()
  assert compiled.as_text().count("tpu_custom_call") >= 3  # Forward, dq and dkv kernels.


def test_resolve_names_the_kernel_auto_runs():
  auto, bf16 = LLAMA.replace(attention="auto"), LLAMA.replace(attention="auto", dtype="bfloat16")
  assert attention.resolve(auto, "tpu") == attention.resolve(bf16, "tpu") == "splash"
  assert attention.resolve(bf16, "cuda") == "cudnn"
  assert attention.resolve(bf16, "rocm") == "chunked"  # A GPU without cuDNN.
  assert attention.resolve(bf16.replace(dtype="float16"), "cuda") == "cudnn"
  assert attention.resolve(auto, "cuda") == "chunked"  # float32 activations.
  assert attention.resolve(bf16.replace(head_dim=12), "cuda") == "chunked"
  assert attention.resolve(bf16.replace(head_dim=256), "cuda") == "chunked"  # Not on every GPU.
  assert attention.resolve(auto, "cpu") == attention.resolve(bf16, "cpu") == "chunked"
  for name in ("reference", "chunked", "splash", "xla"):
    assert attention.resolve(LLAMA.replace(attention=name), "tpu") == name
  assert attention.resolve(bf16.replace(attention="cudnn"), "cpu") == "cudnn"


@pytest.mark.parametrize("kind,t", [("xla", 20), ("xla", 21), ("auto", 20)])
def test_sdpa_and_auto_match_reference(kind, t):
  """Causal self-attention through `attend` with GQA and left and right padding: outputs at real
  queries and gradients as the reference's. xla at an odd T runs one padded position more; auto
  on CPU is chunked (blocks of 8)."""
  b = 3
  q, k, v = _qkv(b, t, t, 4, 2, 8)
  mask = _padded(b, t)
  allowed = jnp.asarray(np.tril(np.ones((t, t), bool))[None] & mask[:, None])
  weight = jnp.asarray(np.random.default_rng(1).normal(size=q.shape) * mask[:, :, None, None],
                       jnp.float32)  # Padding queries' outputs are never read.
  cfg = LLAMA.replace(attention=kind, attention_chunk=8)
  ref = _value_and_grads(attention.reference, q, k, v, allowed, weight=weight)
  got = _value_and_grads(lambda q, k, v, a: attention.attend(q, k, v, a, cfg, causal=True),
                         q, k, v, allowed, weight=weight)
  assert np.isfinite(got[0]).all()  # Left-padding queries see no key: finite all the same.
  np.testing.assert_allclose(np.asarray(got[0])[mask], np.asarray(ref[0])[mask], atol=1e-5)
  for a, b_ in zip(got[1], ref[1]):
    np.testing.assert_allclose(a, b_, atol=1e-5)


@pytest.mark.parametrize("kind", ["xla", "auto"])
def test_sdpa_and_auto_models_match_reference(kind):
  """The llama model (GQA) with padded rows: hidden states, loss and gradients."""
  _compare_models(LLAMA, LLAMA.replace(attention=kind, attention_chunk=8), 20, grads=True)


@pytest.mark.parametrize("kind,base", [("xla", LLAMA), ("auto", LLAMA), ("chunked", GEMMA),
                                       ("reference", GEMMA)], ids=["xla", "auto", "gemma-chunked",
                                                                   "gemma-reference"])
def test_shared_prompt_matches_reference(kind, base):
  """Responses packed after their prompt (P + k R = 23 tokens: xla pads to 24, auto is chunked in
  blocks of 4 across the prompt/response boundary) against each row run alone by the reference:
  left-padded prompts, right-padded responses, an empty one. Gemma's window of 4 counts positions,
  so a response's first tokens see the prompt's last ones across the packed siblings between."""
  g, k, p, r = 2, 3, 8, 5
  rng = np.random.default_rng(4)
  prompt_mask = np.arange(p)[None] >= (p - np.array([8, 3]))[:, None]
  prompt = rng.integers(3, 64, (g, p)) * prompt_mask
  lengths = rng.integers(1, r + 1, g * k)
  lengths[4] = 0
  response_mask = np.arange(r)[None] < lengths[:, None]
  response = rng.integers(3, 64, (g * k, r)) * response_mask
  params = _params(base)
  shared = jax.jit(transformer.forward_shared_prompt, static_argnums=5)(
      params, jnp.asarray(prompt), jnp.asarray(prompt_mask), jnp.asarray(response),
      jnp.asarray(response_mask), base.replace(attention=kind, attention_chunk=4))
  tokens = np.concatenate([np.repeat(prompt, k, 0), response], 1)
  mask = np.concatenate([np.repeat(prompt_mask, k, 0), response_mask], 1)
  full = jax.jit(lambda p, t, m: transformer.forward(p, t, base, mask=m)[0])(params, tokens, mask)
  real = mask[:, p - 1:]  # The prompt's last token (real), then the response.
  np.testing.assert_allclose(np.asarray(shared)[real], np.asarray(full)[:, p - 1:][real],
                             atol=2e-5)


@pytest.mark.parametrize("kind", ["xla"])  # auto on CPU is chunked: test_chunked_cached_forward_...
def test_sdpa_and_auto_cached_paths_match_reference(kind):
  """A prompt's forward through a KV cache (heads-major: the reference under xla, chunked blocks
  of 8 under auto on CPU) and sampling (a prefill, then decode steps through the cache) give the
  reference's hidden states, tokens and log-probs."""
  cfg = LLAMA.replace(attention=kind, attention_chunk=8)
  tokens = jnp.asarray(np.random.default_rng(3).integers(3, 64, (2, 20)), jnp.int32)
  mask = jnp.asarray(_padded(2, 20))
  params = _params(LLAMA)

  @functools.partial(jax.jit, static_argnums=0)
  def cached(cfg):
    return transformer.forward(params, tokens, cfg, mask=mask,
                               cache=transformer.init_cache(cfg, 2, 24))[0]

  real = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(cached(cfg))[real], np.asarray(cached(LLAMA))[real],
                             atol=1e-5)
  scfg = sampling.SamplingConfig(max_new_tokens=5, eos_id=1, pad_id=0)
  ref = sampling.sample(params, tokens, mask, jax.random.key(5), LLAMA, scfg)
  got = sampling.sample(params, tokens, mask, jax.random.key(5), cfg, scfg)
  np.testing.assert_array_equal(got.tokens, ref.tokens)
  np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=1e-5)


class _FakeCudnn:
  """Stands in for jaxlib's cuDNN version query: JAX's cuDNN attention then traces (its shape,
  dtype and layout checks included) on a host without CUDA. Only lowering needs the GPU."""

  @staticmethod
  def cudnn_get_version() -> int:
    return 91000


def _cudnn_primitives(fn, *args) -> set[str]:
  """The cuDNN attention primitives in the jaxpr of `fn`'s gradient w.r.t. its first 3 args."""
  grad = jax.grad(lambda *a: fn(*a).astype(jnp.float32).sum(), (0, 1, 2))
  text = str(jax.make_jaxpr(grad)(*args))
  return {p for p in ("dot_product_attention_fwd", "dot_product_attention_bwd") if p in text}


def test_sdpa_arguments_are_what_cudnn_takes(monkeypatch):
  """xla and cudnn get the whole mask as [B,1,T,S] (cuDNN's bias must span T x S) with
  `is_causal` for a causal call, padded rows and packed rows alike, and scale 1/sqrt(Dh); an odd
  length gains a position no query or key sees. JAX's cuDNN wrapper accepts them, backward pass
  included (it checks shapes and even lengths when tracing)."""
  from jax._src.cudnn import fused_attention_stablehlo  # pylint: disable=g-import-not-at-top
  b, t = 2, 20
  q, k, v = _qkv(b, t, t, 4, 2, 8)
  causal = np.tril(np.ones((t, t), bool))[None] & _padded(b, t)[:, None]
  segments = np.repeat(np.arange(3), [8, 6, 6])  # A prompt, then two packed responses.
  packed = causal & ((segments[None] == 0) | (segments[None] == segments[:, None]))[None]
  for allowed in (causal, packed):
    (q2, k2, v2), kwargs = attention.sdpa_arguments(q, k, v, jnp.asarray(allowed), causal=True)
    assert kwargs.keys() == {"mask", "is_causal", "scale"}
    assert kwargs["is_causal"] is True and kwargs["scale"] == pytest.approx(1 / math.sqrt(8))
    assert kwargs["mask"].shape == (b, 1, t, t) and kwargs["mask"].dtype == jnp.bool_
    np.testing.assert_array_equal(kwargs["mask"][:, 0], allowed)
    for got, want in ((q2, q), (k2, k), (v2, v)):
      np.testing.assert_array_equal(got, want)
  _, kwargs = attention.sdpa_arguments(q, k, v, jnp.asarray(causal), causal=False)
  assert kwargs["is_causal"] is False

  odd = causal[:, :t - 1, :t - 1]
  (q2, k2, _), kwargs = attention.sdpa_arguments(q[:, :-1], k[:, :-1], v[:, :-1], jnp.asarray(odd),
                                                 causal=True)
  assert q2.shape[1] == k2.shape[1] == t and kwargs["mask"].shape == (b, 1, t, t)
  np.testing.assert_array_equal(kwargs["mask"][:, 0, :t - 1, :t - 1], odd)
  assert not kwargs["mask"][:, 0, -1].any() and not kwargs["mask"][:, 0, :, -1].any()

  monkeypatch.setattr(fused_attention_stablehlo, "cuda_versions", _FakeCudnn)
  bf16 = [x[:, :-1].astype(jnp.bfloat16) for x in (q, k, v)]  # T = 19: padded to 20.
  cudnn = lambda q, k, v: attention.sdpa(q, k, v, jnp.asarray(odd), causal=True,
                                         implementation="cudnn")
  assert _cudnn_primitives(cudnn, *bf16) == {"dot_product_attention_fwd",
                                             "dot_product_attention_bwd"}


def test_auto_traces_cudnn_only_with_cuda(monkeypatch):
  """auto's CUDA branch, for bf16 activations, exists only in a process with a CUDA backend (this
  one has none: it is faked here); lowered for the CPU, the branch is dropped and chunked runs."""
  from jax._src.cudnn import fused_attention_stablehlo  # pylint: disable=g-import-not-at-top
  b, t = 2, 20
  q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(b, t, t, 4, 2, 8))
  allowed = jnp.asarray(np.tril(np.ones((t, t), bool))[None] & _padded(b, t)[:, None])
  cfg = LLAMA.replace(attention="auto", dtype="bfloat16", attention_chunk=8)
  fn = lambda q, k, v: attention.attend(q, k, v, allowed, cfg, causal=True)
  assert not _cudnn_primitives(fn, q, k, v)
  monkeypatch.setattr(fused_attention_stablehlo, "cuda_versions", _FakeCudnn)
  monkeypatch.setattr(attention, "_has_cuda", lambda: True)
  assert _cudnn_primitives(fn, q, k, v) == {"dot_product_attention_fwd",
                                            "dot_product_attention_bwd"}
  expected = jax.jit(lambda q, k, v: attention.chunked(q, k, v, allowed, 8, causal=True))(q, k, v)
  np.testing.assert_array_equal(jax.jit(fn)(q, k, v), expected)


def test_auto_lowers_to_splash_for_tpu():
  """Lowered for a TPU (a v5e chip described on this host, as rlhfjax/stages/compile.py does), auto
  is the splash kernel, a TPU custom call; lowered for the CPU, it is not."""
  pytest.importorskip("libtpu")
  from jax.experimental import topologies
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  device = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices[0]
  on_tpu = NamedSharding(Mesh(np.array([device]), ("x",)), PartitionSpec())
  cfg = LLAMA.replace(attention="auto", dtype="bfloat16", max_len=256)
  fn = jax.jit(lambda q, k, v, allowed: attention.attend(q, k, v, allowed, cfg, causal=True))

  def lowered(sharding):
    shapes = [((2, 256, 4, 8), jnp.bfloat16), ((2, 256, 2, 8), jnp.bfloat16),
              ((2, 256, 2, 8), jnp.bfloat16), ((2, 256, 256), jnp.bool_)]
    return fn.lower(*(jax.ShapeDtypeStruct(s, d, sharding=sharding) for s, d in shapes)).as_text()

  assert "tpu_custom_call" in lowered(on_tpu)
  assert "tpu_custom_call" not in lowered(None)


@pytest.mark.parametrize("kind", ["chunked", "splash"])
def test_windowed_soft_capped_kernels_match_reference(kind):
  """Gemma's local and global layers in one scan (T = 20 in blocks of 8; splash picks its local or
  causal kernel per layer by a traced flag), scores scaled and soft-capped; chunked's gradients
  too."""
  _compare_models(GEMMA, GEMMA.replace(attention=kind, attention_chunk=8), 20,
                  grads=kind == "chunked")


def test_windows_in_the_kv_cache_match_a_forward_over_the_whole_sequence():
  """Greedy sampling through the KV cache (the local layers mask their reads to the window, which
  the 12 + 10 tokens cross; left padding; blocks of 3 cache reads or one) reports the log-probs a
  forward over prompt and response recomputes, and the unrolled layers give the scan's."""
  params = _params(GEMMA)
  rng = np.random.default_rng(6)
  mask = np.ones((2, 12), bool)
  mask[0, :5] = False
  prompt = jnp.asarray(rng.integers(3, 64, (2, 12)) * mask, jnp.int32)
  outs = [sampling.sample(params, prompt, jnp.asarray(mask), jax.random.key(0), GEMMA,
                          sampling.SamplingConfig(max_new_tokens=10, eos_id=1, pad_id=0,
                                                  temperature=0.0, cache_block=block))
          for block in (0, 3)]
  np.testing.assert_array_equal(outs[0].tokens, outs[1].tokens)
  emitted = np.arange(10)[None] < np.asarray(outs[0].lengths)[:, None]
  tokens = jnp.concatenate([prompt, outs[0].tokens], 1)
  full_mask = jnp.concatenate([jnp.asarray(mask), jnp.asarray(emitted)], 1)
  for cfg in (GEMMA, GEMMA.replace(scan_layers=False)):
    logp, _ = jax.jit(transformer.token_logprobs, static_argnums=3)(params, tokens, full_mask, cfg)
    want = np.asarray(logp[:, 11:])
    for out in outs:
      np.testing.assert_allclose(np.where(emitted, np.asarray(out.logprobs), 0.0), want, atol=2e-5)
