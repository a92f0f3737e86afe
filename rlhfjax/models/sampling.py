"""The fixed-shape, jitted KV-cache sampler: the engine of every rollout.

One prefill forward writes the (left-padded) prompt into a cache of `prompt_len + max_new_tokens`
slots; then `lax.scan` decodes one token per step. Shapes never depend on the data, so one compile
serves every batch, and `sample` is jitted at module level with the configs static, so compiles are
cached across calls.

Log-probs are those of the sampled token under `log_softmax(logits / temperature)` *before* top-k /
top-p truncation: exactly what a later forward pass at the same temperature recomputes (as PPO does),
so the two agree. Greedy decoding (temperature 0) reports log-probs at temperature 1. After the first
eos every token is `pad_id` with log-prob 0.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig

_NEG_INF = -1e30


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  max_new_tokens: int
  eos_id: int
  pad_id: int
  temperature: float = 1.0  # 0.0 means greedy.
  top_k: int = 0  # 0 means no top-k truncation.
  top_p: float = 1.0  # 1.0 means no nucleus truncation.


class SampleOutput(NamedTuple):
  tokens: jax.Array  # [B, T] int32, pad after the first eos.
  logprobs: jax.Array  # [B, T] float32, 0 after the first eos.
  lengths: jax.Array  # [B] int32, tokens up to and including the first eos.


def truncate(logits: jax.Array, top_k: int, top_p: float) -> jax.Array:
  """Sets logits outside the top-k and outside the top-p nucleus to -inf (the top token survives)."""
  if top_k > 0:
    kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, _NEG_INF, logits)
  if top_p < 1.0:
    sorted_logits = jnp.sort(logits, -1)[..., ::-1]
    probs = jax.nn.softmax(sorted_logits, -1)
    mass_before = jnp.cumsum(probs, -1) - probs
    cutoff = jnp.min(jnp.where(mass_before < top_p, sorted_logits, jnp.inf), -1, keepdims=True)
    logits = jnp.where(logits < cutoff, _NEG_INF, logits)
  return logits


def _argmax(x: jax.Array) -> jax.Array:
  """`jnp.argmax(x, -1)` (the first maximum) as two plain reductions: XLA's CPU argmax is a
  variadic (value, index) reduce that does not vectorise, and fused behind the Gumbel noise of a
  categorical draw it cost more than the rest of a decode step."""
  top = x.max(-1, keepdims=True)
  return jnp.min(jnp.where(x == top, jnp.arange(x.shape[-1], dtype=jnp.int32), x.shape[-1]), -1)


def _choose(logits: jax.Array, rng: jax.Array, scfg: SamplingConfig) -> tuple[jax.Array, jax.Array]:
  """Next token and its log-prob from [B,V] logits."""
  if scfg.temperature == 0.0:
    token = _argmax(logits)
    logp = jax.nn.log_softmax(logits)
  else:
    scaled = logits / scfg.temperature
    logp = jax.nn.log_softmax(scaled)
    # jax.random.categorical(rng, truncated), spelled out: the same Gumbel noise, a faster argmax.
    truncated = truncate(scaled, scfg.top_k, scfg.top_p)
    token = _argmax(truncated + jax.random.gumbel(rng, truncated.shape, truncated.dtype))
  return token.astype(jnp.int32), jnp.take_along_axis(logp, token[:, None], -1)[:, 0]


def _emit(logits: jax.Array, done: jax.Array, i: jax.Array, rng: jax.Array,
          scfg: SamplingConfig) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Token `i` of every row (pad after its eos), its log-prob, whether it was emitted, and done."""
  token, logp = _choose(logits, jax.random.fold_in(rng, i), scfg)
  emitted = ~done
  token = jnp.where(emitted, token, scfg.pad_id)
  logp = jnp.where(emitted, logp, 0.0)
  return token, logp, emitted, done | (token == scfg.eos_id)


def prefill(params, prompt_tokens: jax.Array, prompt_mask: jax.Array, cfg: ModelConfig,
            max_new_tokens: int) -> tuple[transformer.Cache, jax.Array]:
  """The prompts [B,P] written into a cache of P + max_new_tokens slots, and the logits [B,V] of
  the first new token."""
  hidden, cache = transformer.prefill(params, prompt_tokens, cfg, mask=prompt_mask,
                                      length=prompt_tokens.shape[1] + max_new_tokens)
  return cache, transformer.lm_logits(params, hidden[:, -1], cfg)


def decode_step(params, cache: transformer.Cache, logits: jax.Array, done: jax.Array,
                i: jax.Array, rng: jax.Array, first_position: jax.Array, cfg: ModelConfig,
                scfg: SamplingConfig, prompt_len: int):
  """New token `i`: drawn from `logits`, then written into the cache by one forward pass that
  gives the next logits. Returns (cache, next logits, done, (token, log-prob, emitted))."""
  token, logp, emitted, done = _emit(logits, done, i, rng, scfg)
  hidden, cache = transformer.forward(params, token[:, None], cfg, mask=emitted[:, None],
                                      positions=(first_position + i)[:, None], cache=cache,
                                      cache_index=prompt_len + i)
  return cache, transformer.lm_logits(params, hidden[:, 0], cfg), done, (token, logp, emitted)


@functools.partial(jax.jit, static_argnames=("cfg", "scfg", "k"))
def sample(params, prompt_tokens: jax.Array, prompt_mask: jax.Array, rng: jax.Array,
           cfg: ModelConfig, scfg: SamplingConfig, k: int = 1) -> SampleOutput:
  """Samples `scfg.max_new_tokens` tokens after left-padded prompts [B,P]; with `k` > 1, `k`
  samples of each prompt (rows [B*k], a prompt's samples adjacent). The prompts are prefilled once
  and their cache copied k times: the same samples as prefilling each repeated row, for 1/k of
  the prefill."""
  plen = prompt_tokens.shape[1]
  cache, logits = prefill(params, prompt_tokens, prompt_mask, cfg, scfg.max_new_tokens)
  first_position = prompt_mask.astype(jnp.int32).sum(-1)
  if k > 1:
    cache, logits, first_position = jax.tree.map(lambda x: jnp.repeat(x, k, axis=0),
                                                 (cache, logits, first_position))
  batch = logits.shape[0]

  def step(carry, i):
    cache, logits, done, out = decode_step(params, *carry, i, rng, first_position, cfg, scfg, plen)
    return (cache, logits, done), out

  # The last token needs no forward pass after it.
  last = scfg.max_new_tokens - 1
  init = (cache, logits, jnp.zeros((batch,), bool))
  (_, logits, done), (tokens, logps, emitted) = jax.lax.scan(step, init, jnp.arange(last))
  token, logp, emit_last, _ = _emit(logits, done, last, rng, scfg)
  tokens = jnp.concatenate([tokens, token[None]], 0)
  logps = jnp.concatenate([logps, logp[None]], 0)
  emitted = jnp.concatenate([emitted, emit_last[None]], 0)
  return SampleOutput(tokens.T, logps.T, emitted.sum(0).astype(jnp.int32))
