"""The KV-cache sampler: support restriction, eos handling, log-probs, padding invariance."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhfjax.models import sampling
from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig

CFG = ModelConfig(variant="llama", vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                  d_ff=64, max_len=64)
PARAMS = transformer.init(jax.random.key(0), CFG)
PROMPTS = np.random.default_rng(0).integers(3, 64, (8, 6)).astype(np.int32)
MASK = np.ones_like(PROMPTS, bool)
MASK[::2, :2] = False
PROMPTS[~MASK] = 0


def _sample(scfg, params=PARAMS, prompts=PROMPTS, mask=MASK, seed=0):
  return jax.tree.map(np.asarray, sampling.sample(params, prompts, mask, jax.random.key(seed), CFG,
                                                  scfg))


def _step_logits(params, prompts, mask, tokens):
  """Full-forward logits at every generated step, for checking each choice."""
  seq = np.concatenate([prompts, tokens], 1)
  m = np.concatenate([mask, np.ones_like(tokens, bool)], 1)
  hidden, _ = transformer.forward(params, seq, CFG, mask=m)
  return np.asarray(transformer.lm_logits(params, hidden, CFG))[:, prompts.shape[1] - 1:-1]


def test_truncate_keeps_top_k_and_nucleus():
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
  keep = lambda x: np.asarray(x > -1e29)[0].tolist()
  assert keep(sampling.truncate(logits, 2, 1.0)) == [True, True, False, False]
  assert keep(sampling.truncate(logits, 0, 0.75)) == [True, True, False, False]
  assert keep(sampling.truncate(logits, 0, 0.85)) == [True, True, True, False]
  assert keep(sampling.truncate(logits, 0, 0.1)) == [True, False, False, False]


@pytest.mark.parametrize("top_k,top_p", [(3, 1.0), (0, 0.5)])
def test_samples_stay_in_support(top_k, top_p):
  scfg = sampling.SamplingConfig(max_new_tokens=6, eos_id=-1, pad_id=0, temperature=1.5,
                                 top_k=top_k, top_p=top_p)
  for seed in range(3):
    out = _sample(scfg, seed=seed)
    logits = _step_logits(PARAMS, PROMPTS, MASK, out.tokens) / 1.5
    allowed = np.asarray(sampling.truncate(jnp.asarray(logits), top_k, top_p)) > -1e29
    assert np.take_along_axis(allowed, out.tokens[..., None], -1).all()


def test_logprobs_match_recomputation():
  scfg = sampling.SamplingConfig(max_new_tokens=7, eos_id=-1, pad_id=0, temperature=0.8, top_k=5)
  out = _sample(scfg)
  logits = _step_logits(PARAMS, PROMPTS, MASK, out.tokens)
  expect = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits / 0.8)), out.tokens[..., None],
                              -1)[..., 0]
  np.testing.assert_allclose(out.logprobs, expect, atol=1e-4)


def test_one_compile_serves_every_temperature_and_top_p():
  """Temperature and top-p are values of the compiled sampler (as a server takes them per
  request): the stages that sample at different temperatures share one compile, and each value is
  the one its log-probs are taken at."""
  base = sampling.SamplingConfig(max_new_tokens=4, eos_id=-1, pad_id=0, temperature=0.7, top_p=0.9)
  # The jitted function's count of compiled programs (JAX's, private: a JAX upgrade may move it).
  compiled = sampling._sample._cache_size()  # pylint: disable=protected-access
  for temperature, top_p in ((0.7, 0.9), (1.3, 0.9), (0.7, 0.6)):
    out = _sample(dataclasses.replace(base, temperature=temperature, top_p=top_p))
    logits = _step_logits(PARAMS, PROMPTS, MASK, out.tokens) / temperature
    expect = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), out.tokens[..., None],
                                -1)[..., 0]
    np.testing.assert_allclose(out.logprobs, expect, atol=1e-4)
    allowed = np.asarray(sampling.truncate(jnp.asarray(logits), 0, top_p)) > -1e29
    assert np.take_along_axis(allowed, out.tokens[..., None], -1).all()
  assert sampling._sample._cache_size() == compiled + 1  # pylint: disable=protected-access
  # A step's log-probs are, bit for bit, those of the temperature compiled in as a constant (what
  # the trainer's forward pass computes, and the sampler did before the temperature was a value).
  logits = jax.random.normal(jax.random.key(1), (8, 64)) * 4
  choose = jax.jit(sampling._choose, static_argnums=3)  # pylint: disable=protected-access
  for temperature in (0.7, 1.3, 0.33):
    scfg = dataclasses.replace(base, temperature=temperature)
    token, logp = choose(logits, jax.random.key(2), scfg.knobs(), scfg.program())
    constant = jax.jit(lambda x, t=temperature: jax.nn.log_softmax(x / t))(logits)
    np.testing.assert_array_equal(logp, np.take_along_axis(np.asarray(constant),
                                                           np.asarray(token)[:, None], -1)[:, 0])
  # Greedy, and no nucleus, are other programs; greedy at any top-k or top-p is one.
  _sample(dataclasses.replace(base, temperature=0.0))
  _sample(dataclasses.replace(base, temperature=0.0, top_k=5, top_p=1.0))
  _sample(dataclasses.replace(base, top_p=1.0))
  assert sampling._sample._cache_size() == compiled + 3  # pylint: disable=protected-access


def test_greedy_is_argmax_and_padding_invariant():
  scfg = sampling.SamplingConfig(max_new_tokens=6, eos_id=-1, pad_id=0, temperature=0.0)
  out = _sample(scfg)
  logits = _step_logits(PARAMS, PROMPTS, MASK, out.tokens)
  np.testing.assert_array_equal(out.tokens, logits.argmax(-1))
  # The same real prompt with more left padding continues identically.
  padded = np.concatenate([np.zeros((8, 3), np.int32), PROMPTS], 1)
  pmask = np.concatenate([np.zeros((8, 3), bool), MASK], 1)
  np.testing.assert_array_equal(_sample(scfg, prompts=padded, mask=pmask).tokens, out.tokens)


@pytest.mark.parametrize("several", [False, True])
def test_eos_stops_and_pads(several):
  free = _sample(sampling.SamplingConfig(max_new_tokens=10, eos_id=-1, pad_id=0, temperature=0.0))
  eos = int(free.tokens[0, 3])  # Declare the token greedy emits at step 3 of row 0 to be eos.
  # Several: the token of step 2 of row 1 ends a response too (an instruct model's turn end).
  eos = (eos, int(free.tokens[1, 2])) if several else eos
  out = _sample(sampling.SamplingConfig(max_new_tokens=10, eos_id=eos, pad_id=0, temperature=0.0))
  assert np.isin(free.tokens[:, :10], eos).any(1).sum() >= 1 + several
  for row, lp, n, ref in zip(out.tokens, out.logprobs, out.lengths, free.tokens):
    ends = np.flatnonzero(np.isin(ref, eos))
    if len(ends):
      first = ends[0]
      assert n == first + 1
      np.testing.assert_array_equal(row[:first + 1], ref[:first + 1])
      assert (row[first + 1:] == 0).all() and (lp[first + 1:] == 0).all()
      assert lp[first] < 0
    else:
      assert n == 10 and (row == ref).all()
  assert out.lengths[0] <= 4 and (not several or out.lengths[1] <= 3)


def test_k_samples_share_one_prefill_and_equal_sampling_repeated_prompts():
  scfg = sampling.SamplingConfig(max_new_tokens=5, eos_id=1, pad_id=0, temperature=1.0)
  shared = jax.tree.map(np.asarray, sampling.sample(PARAMS, PROMPTS, MASK, jax.random.key(3), CFG,
                                                    scfg, k=3))
  repeated = _sample(scfg, prompts=jnp.repeat(PROMPTS, 3, 0), mask=jnp.repeat(MASK, 3, 0), seed=3)
  assert shared.tokens.shape == (3 * PROMPTS.shape[0], 5)
  np.testing.assert_array_equal(shared.tokens, repeated.tokens)
  np.testing.assert_array_equal(shared.lengths, repeated.lengths)
  # A prefill of fewer rows may block its matmuls differently: log-probs agree to float rounding.
  np.testing.assert_allclose(shared.logprobs, repeated.logprobs, atol=1e-6)
  assert not np.array_equal(shared.tokens[0], shared.tokens[1])  # Samples of one prompt differ.
