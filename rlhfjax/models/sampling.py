"""The fixed-shape, jitted KV-cache sampler: the engine of every rollout.

One prefill forward writes the (left-padded) prompt into a cache of `prompt_len + max_new_tokens`
slots; then a `lax.while_loop` decodes one token per step. Shapes never depend on the data, so one
compile serves every batch, and the sampler is jitted at module level with the model and the
sampler's program static, so compiles are cached across calls.

Two things keep decoding at the work it must do (`SamplingConfig`):
- `early_stop`: the loop ends as soon as every row has emitted its eos (or at `max_new_tokens`).
  The tokens, log-probs and lengths are those of the full-length loop: after its eos a row only
  ever emits padding with log-prob 0, which is what the skipped steps would have written.
- `cache_block`: the decode steps run in blocks of this many tokens, and the steps of a block read
  the cache only up to the block's last slot (prompt plus the tokens decoded by then), not all
  `prompt_len + max_new_tokens` slots from the first token on (the last block reads them all). Each
  block is its own loop with a static read length (XLA needs static shapes), so the compiled
  program grows with the number of blocks; 0 reads the whole cache at every step. Reading fewer
  (masked) slots changes results only by the rounding of the softmax's sum.

Log-probs are those of the sampled token under `log_softmax(logits / temperature)` *before* top-k /
top-p truncation: exactly what a later forward pass at the same temperature recomputes (as PPO does),
so the two agree. Greedy decoding (temperature 0) reports log-probs at temperature 1. After the first
eos every token is `pad_id` with log-prob 0.

The temperature and top-p reach the compiled sampler as values (`Knobs`), as a server such as vLLM
takes them per request: only whether it is greedy and whether it truncates to a nucleus are compiled
in (`SamplingConfig.program`), so the evaluation's, the labels' and the rollouts' temperatures share
one compile at a batch shape (on a TPU, minutes for an 8B model). top-k stays compiled in: it sets
the shape of `lax.top_k`. The logits are multiplied by the temperature's float32 reciprocal, which
is what XLA makes of a division by a constant temperature (as in the trainer's forward pass), so the
sampler's log-probs are those it computed when the temperature was compiled in, bit for bit.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlhfjax.models.config import ModelConfig
from rlhfjax.models import sharding_rules
from rlhfjax.models import transformer

_NEG_INF = -1e30
# The end-of-sequence id, or every id that ends a response (as a generation config's eos_token_id
# list: an instruct model's turn end and its tokenizer's eos).
EosIds = int | tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  max_new_tokens: int
  eos_id: EosIds
  pad_id: int
  temperature: float = 1.0  # 0.0 means greedy.
  top_k: int = 0  # 0 means no top-k truncation.
  top_p: float = 1.0  # 1.0 means no nucleus truncation.
  early_stop: bool = True  # End when every row has emitted eos.
  cache_block: int = 0  # Decode steps per block reading the cache up to its end; 0: all slots.

  def program(self) -> SamplingConfig:
    """This config as the compiled sampler sees it: the temperature only as greedy (0.0) or not
    (1.0), top-p only as a nucleus (`PROGRAM_NUCLEUS`) or none (1.0), their values being
    `knobs()`; greedy decoding truncates nothing, so it drops top-k and top-p."""
    if self.temperature == 0.0:
      return dataclasses.replace(self, temperature=0.0, top_k=0, top_p=1.0)
    return dataclasses.replace(self, temperature=1.0,
                               top_p=PROGRAM_NUCLEUS if self.top_p < 1.0 else 1.0)

  def knobs(self) -> Knobs:
    """The temperature (as its reciprocal; 1 when greedy) and top-p, as values passed to the
    compiled sampler."""
    inverse = np.float32(1.0) / np.float32(self.temperature or 1.0)
    return Knobs(inverse, np.float32(self.top_p))


# `SamplingConfig.program`'s top-p when a nucleus is on: a marker; the top-p sampled with is
# `Knobs.top_p`.
PROGRAM_NUCLEUS = 0.5


class Knobs(NamedTuple):
  """The sampling settings that are values of the compiled sampler, not part of its program."""
  inverse_temperature: jax.typing.ArrayLike  # [] float32; 1 when greedy (unused).
  top_p: jax.typing.ArrayLike  # [] float32; unused without a nucleus.


class SampleOutput(NamedTuple):
  tokens: jax.Array  # [B, T] int32, pad after the first eos.
  logprobs: jax.Array  # [B, T] float32, 0 after the first eos.
  lengths: jax.Array  # [B] int32, tokens up to and including the first eos.
  steps: jax.Array  # [] int32, tokens drawn per row: max_new_tokens, or one past the last eos.


def truncate(logits: jax.Array, top_k: int, top_p: float | jax.Array) -> jax.Array:
  """Sets logits outside the top-k and outside the top-p nucleus to -inf (the top token survives).
  The nucleus keeps each token whose higher-ranked tokens hold less than `top_p` of the mass (the
  token that crosses `top_p` stays, as in transformers' `TopPLogitsWarper`); tokens tied with the
  last one kept stay too, where transformers keeps whichever its sort puts first (top-k keeps ties
  the same way, as transformers does). A number `top_p` of 1.0 or more skips the nucleus; a traced
  `top_p` always computes it."""
  if top_k > 0:
    kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, _NEG_INF, logits)
  if isinstance(top_p, jax.Array) or top_p < 1.0:
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


def _choose(logits: jax.Array, rng: jax.Array, knobs: Knobs,
            scfg: SamplingConfig) -> tuple[jax.Array, jax.Array]:
  """Next token and its log-prob from [B,V] logits."""
  if scfg.temperature == 0.0:
    token = _argmax(logits)
    logp = jax.nn.log_softmax(logits)
  else:
    scaled = logits * knobs.inverse_temperature
    logp = jax.nn.log_softmax(scaled)
    # jax.random.categorical(rng, truncated), spelled out: the same Gumbel noise, a faster argmax.
    truncated = truncate(scaled, scfg.top_k, knobs.top_p if scfg.top_p < 1.0 else 1.0)
    token = _argmax(truncated + jax.random.gumbel(rng, truncated.shape, truncated.dtype))
  return token.astype(jnp.int32), jnp.take_along_axis(logp, token[:, None], -1)[:, 0]


def is_eos(tokens: jax.Array, eos_id: EosIds) -> jax.Array:
  """Where `tokens` end a response: equal to the eos id, or to any of them."""
  return jnp.isin(tokens, jnp.asarray(eos_id, jnp.int32))


def _emit(logits: jax.Array, done: jax.Array, i: jax.Array, rng: jax.Array, knobs: Knobs,
          scfg: SamplingConfig) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Token `i` of every row (pad after its eos), its log-prob, whether it was emitted, and done."""
  token, logp = _choose(logits, jax.random.fold_in(rng, i), knobs, scfg)
  emitted = ~done
  token = jnp.where(emitted, token, scfg.pad_id)
  logp = jnp.where(emitted, logp, 0.0)
  return token, logp, emitted, done | is_eos(token, scfg.eos_id)


def prefill(params, prompt_tokens: jax.Array, prompt_mask: jax.Array, cfg: ModelConfig,
            max_new_tokens: int) -> tuple[transformer.Cache, jax.Array]:
  """The prompts [B,P] written into a cache of P + max_new_tokens slots, and the logits [B,V] of
  the first new token."""
  hidden, cache = transformer.prefill(params, prompt_tokens, cfg, mask=prompt_mask,
                                      length=prompt_tokens.shape[1] + max_new_tokens)
  return cache, transformer.lm_logits(params, hidden[:, -1], cfg)


def decode_step(params, cache: transformer.Cache, logits: jax.Array, done: jax.Array,
                i: jax.Array, rng: jax.Array, first_position: jax.Array, knobs: Knobs,
                cfg: ModelConfig, scfg: SamplingConfig, prompt_len: int, cache_read: int = 0):
  """New token `i`: drawn from `logits` at `knobs`' temperature and top-p, then written into the
  cache by one forward pass that gives the next logits, reading the first `cache_read` slots of the
  cache (0: all). Returns (cache, next logits, done, (token, log-prob, emitted))."""
  token, logp, emitted, done = _emit(logits, done, i, rng, knobs, scfg)
  hidden, cache = transformer.forward(params, token[:, None], cfg, mask=emitted[:, None],
                                      positions=(first_position + i)[:, None], cache=cache,
                                      cache_index=prompt_len + i, cache_read=cache_read)
  return cache, transformer.lm_logits(params, hidden[:, 0], cfg), done, (token, logp, emitted)


def blocks(prompt_len: int, max_new_tokens: int, cache_block: int) -> list[tuple[int, int, int]]:
  """The decode steps (those with a forward pass: all but the last token) in blocks
  (start, end, slots read) of `cache_block` steps (0: one block); a block reads the cache up to
  its last step's slot, the last block all `prompt_len + max_new_tokens` slots (one more than it
  needs: one block is then exactly the unblocked loop)."""
  last = max_new_tokens - 1
  size = cache_block if cache_block > 0 else max(last, 1)
  return [(s, min(s + size, last), prompt_len + s + size if s + size < last else 0)
          for s in range(0, last, size)]


def sample(params, prompt_tokens: jax.Array, prompt_mask: jax.Array, rng: jax.Array,
           cfg: ModelConfig, scfg: SamplingConfig, k: int = 1) -> SampleOutput:
  """Samples up to `scfg.max_new_tokens` tokens after left-padded prompts [B,P]; with `k` > 1, `k`
  samples of each prompt (rows [B*k], a prompt's samples adjacent). The prompts are prefilled once
  and their cache copied k times: the same samples as prefilling each repeated row, for 1/k of
  the prefill. Compiled once per model, shapes, `k` and `scfg.program()`."""
  return _sample(params, prompt_tokens, prompt_mask, rng, scfg.knobs(), cfg=cfg,
                 scfg=scfg.program(), k=k)


@functools.partial(jax.jit, static_argnames=("cfg", "scfg", "k"))
def _sample(params, prompt_tokens: jax.Array, prompt_mask: jax.Array, rng: jax.Array,
            knobs: Knobs, cfg: ModelConfig, scfg: SamplingConfig, k: int) -> SampleOutput:
  plen = prompt_tokens.shape[1]
  cache, logits = prefill(params, prompt_tokens, prompt_mask, cfg, scfg.max_new_tokens)
  first_position = prompt_mask.astype(jnp.int32).sum(-1)
  if k > 1:
    cache, logits, first_position = jax.tree.map(lambda x: jnp.repeat(x, k, axis=0),
                                                 (cache, logits, first_position))
  cache = _constrain_cache(cache)
  batch, steps = logits.shape[0], scfg.max_new_tokens
  out = (jnp.full((steps, batch), scfg.pad_id, jnp.int32), jnp.zeros((steps, batch), jnp.float32),
         jnp.zeros((steps, batch), bool))
  carry = (jnp.zeros((), jnp.int32), cache, logits, jnp.zeros((batch,), bool), out)

  for _, end, read in blocks(plen, steps, scfg.cache_block):

    def more(carry, end=end):
      i, _, _, done, _ = carry
      return (i < end) & ~(scfg.early_stop & done.all())

    def step(carry, read=read):
      i, cache, logits, done, out = carry
      cache, logits, done, new = decode_step(params, cache, logits, done, i, rng, first_position,
                                             knobs, cfg, scfg, plen, read)
      return i + 1, cache, logits, done, tuple(o.at[i].set(n) for o, n in zip(out, new))

    carry = jax.lax.while_loop(more, step, carry)
  # The last token needs no forward pass after it. After an early stop every row is done, and
  # this writes the padding that is already there.
  i, _, logits, done, out = carry
  new = _emit(logits, done, i, rng, knobs, scfg)[:3]
  tokens, logps, emitted = (o.at[i].set(n) for o, n in zip(out, new))
  return SampleOutput(tokens.T, logps.T, emitted.sum(0).astype(jnp.int32), i + 1)


def _constrain_cache(cache: transformer.Cache) -> transformer.Cache:
  """The KV cache split by rows and kv heads under the mesh the sampler runs in (a no-op
  outside one), so it lives in the rollout layout."""
  kv = transformer.CACHE_AXES
  return {"k": [sharding_rules.constrain(c, kv) for c in cache["k"]],
          "v": [sharding_rules.constrain(c, kv) for c in cache["v"]],
          "mask": sharding_rules.constrain(cache["mask"], ("batch", "length"))}
