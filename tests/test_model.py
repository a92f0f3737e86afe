"""The decoder: causal masking, KV-cache parity, left padding, shared prompts, axes, heads."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhfjax.models import heads
from rlhfjax.models import policy
from rlhfjax.models import reward
from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig

CONFIGS = {
    "gpt2": ModelConfig(variant="gpt2", vocab_size=64, d_model=32, n_layers=2, n_heads=4,
                        n_kv_heads=4, d_ff=64, max_len=32),
    "llama": ModelConfig(variant="llama", vocab_size=64, d_model=32, n_layers=2, n_heads=4,
                         n_kv_heads=2, d_ff=64, max_len=32, tie_embeddings=False),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model(request):
  cfg = CONFIGS[request.param]
  return cfg, transformer.init(jax.random.key(0), cfg)


def _logits(params, tokens, cfg, mask=None):
  hidden, _ = transformer.forward(params, jnp.asarray(tokens), cfg, mask=mask)
  return np.asarray(transformer.lm_logits(params, hidden, cfg))


def test_causal(model):
  cfg, params = model
  tokens = np.random.default_rng(0).integers(3, 64, (2, 12))
  changed = tokens.copy()
  changed[:, 7:] = (changed[:, 7:] + 5) % 64
  a, b = _logits(params, tokens, cfg), _logits(params, changed, cfg)
  np.testing.assert_allclose(a[:, :7], b[:, :7], atol=1e-6)
  assert np.abs(a[:, 7:] - b[:, 7:]).max() > 1e-4


def test_kv_cache_matches_full_forward(model):
  cfg, params = model
  rng = np.random.default_rng(1)
  tokens = rng.integers(3, 64, (2, 14)).astype(np.int32)
  mask = np.ones_like(tokens, bool)
  mask[0, :3] = False  # Left padding on the first row.
  tokens[0, :3] = 0
  full = _logits(params, tokens, cfg, mask)
  cache = transformer.init_cache(cfg, 2, 14)
  hidden, cache = transformer.forward(params, tokens[:, :6], cfg, mask=mask[:, :6], cache=cache)
  steps = [np.asarray(transformer.lm_logits(params, hidden, cfg))]
  for t in range(6, 14):
    hidden, cache = transformer.forward(params, tokens[:, t:t + 1], cfg, mask=mask[:, t:t + 1],
                                        cache=cache, cache_index=t)
    steps.append(np.asarray(transformer.lm_logits(params, hidden, cfg)))
  cached = np.concatenate(steps, 1)
  np.testing.assert_allclose(cached[0, 3:], full[0, 3:], atol=1e-5)
  np.testing.assert_allclose(cached[1], full[1], atol=1e-5)


def test_left_padding_does_not_change_logits(model):
  cfg, params = model
  prompt = np.random.default_rng(2).integers(3, 64, 9)
  outs = []
  for pad in (0, 4):
    tokens = np.concatenate([np.zeros(pad, int), prompt])[None]
    mask = np.concatenate([np.zeros(pad, bool), np.ones(9, bool)])[None]
    outs.append(_logits(params, tokens, cfg, mask)[0, pad:])
  np.testing.assert_allclose(outs[0], outs[1], atol=1e-5)


def test_shared_prompt_forward_matches_full_forward(model):
  """k responses packed after one computation of their prompt: the same hidden states, log-probs,
  rewards (with the likelihood term) and gradients as each row run alone, with left-padded prompts,
  right-padded responses and an empty response; llama through the chunked kernel (its causal
  blocks then cross the prompt/response boundary), gpt2 through the reference one."""
  cfg, params = model
  cfg = dataclasses.replace(cfg, attention="chunked" if cfg.variant == "llama" else "reference",
                            attention_chunk=4)
  rng = np.random.default_rng(3)
  g, k, p, r = 3, 4, 9, 7
  prompt_mask = np.arange(p)[None] >= (p - np.array([9, 4, 1]))[:, None]
  prompt = rng.integers(3, 64, (g, p)) * prompt_mask
  lengths = rng.integers(1, r + 1, g * k)
  lengths[5] = 0
  response_mask = np.arange(r)[None] < lengths[:, None]
  batch = {"prompt": jnp.repeat(prompt, k, 0), "prompt_mask": jnp.repeat(prompt_mask, k, 0),
           "response": jnp.asarray(rng.integers(3, 64, (g * k, r)) * response_mask),
           "response_mask": jnp.asarray(response_mask)}
  rm = {**heads.init(jax.random.key(1), cfg), heads.LIKELIHOOD: {"weight": jnp.float32(2.0)}}

  @functools.partial(jax.jit, static_argnums=0)
  def views(group, params, rm, batch):
    hidden, mask, last = policy.hidden_states(params, batch, cfg, group=group)
    loss = lambda w: (policy.response_logprobs(w, batch, cfg, group=group)
                      * jnp.arange(1, r + 1)).sum()
    return (hidden[:, last:], mask[:, last:],
            policy.response_token_stats(params, batch, cfg, temperature=0.7, group=group),
            reward.score(rm, batch, cfg, group=group), jax.grad(loss)(params))

  full, mask, stats, score, grads = views(1, params, rm, batch)
  shared, shared_mask, shared_stats, shared_score, shared_grads = views(k, params, rm, batch)
  assert shared.shape == (g * k, 1 + r, cfg.d_model)
  real = np.asarray(shared_mask)
  np.testing.assert_array_equal(real, np.asarray(mask))
  np.testing.assert_allclose(np.asarray(shared)[real], np.asarray(full)[real], atol=2e-5)
  for a, b in zip(stats, shared_stats):
    np.testing.assert_allclose(a, b, atol=2e-5)
  np.testing.assert_allclose(score, shared_score, atol=2e-5)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(shared_grads)):
    np.testing.assert_allclose(a, b, atol=1e-4 * max(float(jnp.abs(a).max()), 1.0))


def test_param_axes_match_params(model):
  cfg, params = model
  axes = transformer.param_axes(cfg)
  is_axes = lambda x: isinstance(x, tuple)
  assert jax.tree.structure(axes, is_leaf=is_axes) == jax.tree.structure(params)
  for a, p in zip(jax.tree.leaves(axes, is_leaf=is_axes), jax.tree.leaves(params)):
    assert len(a) == p.ndim
  if cfg.variant == "llama":
    assert params["layers"]["attn"]["k"].shape == (2, 32, 2, 8)  # Grouped k/v heads.
    assert "lm_head" in params and "pos_embed" not in params


def test_token_logprobs_match_logits(model):
  cfg, params = model
  tokens = np.random.default_rng(3).integers(3, 64, (2, 8))
  mask = np.ones_like(tokens, bool)
  mask[1, 6:] = False
  logp, ent = transformer.token_logprobs(params, tokens, mask, cfg, temperature=0.7)
  ref = jax.nn.log_softmax(_logits(params, tokens, cfg, mask)[:, :-1] / 0.7)
  expect = np.take_along_axis(np.asarray(ref), tokens[:, 1:, None], -1)[..., 0]
  np.testing.assert_allclose(np.asarray(logp)[0], expect[0], atol=1e-5)
  assert np.all(np.asarray(logp)[1, 5:] == 0) and np.all(np.asarray(ent)[1, 5:] == 0)
  assert np.all(np.asarray(ent)[0] > 0)


def test_lm_head_logits_are_float32_under_bfloat16(model):
  """Under a bf16 compute dtype the LM head (tied embedding: gpt2; a head of its own: llama)
  multiplies bf16 hidden states and weights into float32 logits: a float32 head over the same bf16
  inputs, not those logits rounded to bf16's grid afterwards."""
  cfg, params = model
  hidden = (4.0 * jax.random.normal(jax.random.key(5), (2, 3, cfg.d_model))).astype(jnp.bfloat16)
  logits = transformer.lm_logits(params, hidden, cfg.replace(dtype="bfloat16"))
  assert logits.dtype == jnp.float32
  w = params["embed"]["embedding"].T if cfg.tie_embeddings else params["lm_head"]["kernel"]
  want = np.asarray(hidden, np.float32) @ np.asarray(w.astype(jnp.bfloat16), np.float32)
  np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-6)
  on_grid = np.asarray(logits.astype(jnp.bfloat16).astype(jnp.float32))
  assert (np.asarray(logits) != on_grid).mean() > 0.5


def test_dropout_only_with_rng():
  cfg = CONFIGS["gpt2"].replace(dropout=0.5)
  params = transformer.init(jax.random.key(0), cfg)
  tokens = jnp.arange(10)[None] % 64
  a, _ = transformer.forward(params, tokens, cfg)
  b, _ = transformer.forward(params, tokens, cfg)
  c, _ = transformer.forward(params, tokens, cfg, dropout_rng=jax.random.key(1))
  np.testing.assert_array_equal(a, b)
  assert np.abs(np.asarray(a - c)).max() > 1e-3


def test_reward_read_at_last_real_token():
  cfg = CONFIGS["gpt2"]
  params = heads.init(jax.random.key(0), cfg)
  seq = np.array([5, 6, 7, 8])
  right = np.array([[5, 6, 7, 8, 0, 0]])
  right_mask = np.array([[1, 1, 1, 1, 0, 0]], bool)
  left = np.array([[0, 0, 5, 6, 7, 8]])
  left_mask = right_mask[:, ::-1]
  def reward(tokens, mask):
    hidden, _ = transformer.forward(params["backbone"], tokens, cfg, mask=mask)
    return heads.read_last(params["head"], hidden, mask)

  plain = reward(seq[None], np.ones((1, 4), bool))
  for tokens, mask in ((right, right_mask), (left, left_mask)):
    np.testing.assert_allclose(reward(tokens, mask), plain, atol=1e-5)
  np.testing.assert_array_equal(heads.last_token_index(np.array([[1, 1, 0], [0, 1, 1]], bool)),
                                [1, 2])


def test_head_init_scale():
  head = heads.init_scalar_head(jax.random.key(0), 4095)
  assert abs(float(jnp.std(head["kernel"])) - 1 / math.sqrt(4096)) < 0.1 / math.sqrt(4096)
  assert float(head["bias"]) == 0.0
