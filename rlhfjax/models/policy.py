"""The policy's view of a response: per-token log-probabilities and entropies after a prompt.

Shared by SFT (the likelihood), PPO (ratios, KL to the reference, entropy), DPO and the evaluations.
Log-probs are taken under `softmax(logits / temperature)`, the distribution a sampler at that
temperature draws from.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlhfjax.data import pipeline
from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig


def hidden_states(params, batch: pipeline.Batch, cfg: ModelConfig, *, group: int = 1,
                  dropout_rng: jax.Array | None = None,
                  response: str = "response") -> tuple[jax.Array, jax.Array, int]:
  """The decoder's final hidden states over prompt + `batch[response]`, their mask, and the column
  of the prompt's last token (whose state predicts the first response token).

  `group` k > 1: the rows come in groups of k answering one prompt (rows g·k … g·k + k − 1, as the
  rollout engine lays them out), and each prompt is computed once for its k responses
  (transformer.forward_shared_prompt); the states then start at the prompt's last token,
  [B, 1 + R, D], and equal the full forward's there up to rounding.
  """
  if group == 1:
    tokens, mask = pipeline.prompt_and(batch, response)
    hidden, _ = transformer.forward(params, tokens, cfg, mask=mask, dropout_rng=dropout_rng)
    return hidden, mask, batch["prompt"].shape[1] - 1
  n, p = batch["prompt"].shape
  first = lambda x: x.reshape(n // group, group, p)[:, 0]  # Each group's prompt, once.
  hidden = transformer.forward_shared_prompt(
      params, first(batch["prompt"]), first(batch["prompt_mask"]), batch[response],
      batch[f"{response}_mask"], cfg, dropout_rng=dropout_rng)
  mask = jnp.concatenate([batch["prompt_mask"][:, -1:], batch[f"{response}_mask"]], 1)
  return hidden, mask.astype(bool), 0


def response_distributions(params, batch: pipeline.Batch, cfg: ModelConfig,
                           dropout_rng: jax.Array | None = None,
                           temperature: float = 1.0, group: int = 1) -> jax.Array:
  """log softmax(logits / temperature) over the vocabulary at every response position [B, R, V]:
  the distribution each response token was drawn from (`group`: see hidden_states)."""
  hidden, _, last = hidden_states(params, batch, cfg, group=group, dropout_rng=dropout_rng)
  return distributions_from_hidden(params, hidden, last, cfg, temperature)


def distributions_from_hidden(params, hidden: jax.Array, last: int, cfg: ModelConfig,
                              temperature: float = 1.0) -> jax.Array:
  """`response_distributions` from the decoder's final hidden states [B, T, D] whose column `last`
  is the prompt's last token (the response follows it)."""
  # Position t predicts token t+1: the last prompt column predicts the first response token.
  logits = transformer.lm_logits(params, hidden[:, last:-1], cfg) / temperature
  return jax.nn.log_softmax(logits)


def _chosen(logp_all: jax.Array, tokens: jax.Array) -> jax.Array:
  """log p of each token [B, R] from the distributions it was drawn from [B, R, V]."""
  return jnp.take_along_axis(logp_all, tokens[..., None], -1)[..., 0]


def mean_response_logprob(params, hidden: jax.Array, last: int, batch: pipeline.Batch,
                          cfg: ModelConfig, response: str = "response") -> jax.Array:
  """Mean log p per real token of `batch[response]` [B] (the length-normalised likelihood of
  RRHF / SimPO), from the decoder's final hidden states as `hidden_states` returns them (`last`:
  the prompt's last column). Always at temperature 1: a reward is a function of the text, not of
  the sampler that wrote it."""
  logp = _chosen(distributions_from_hidden(params, hidden, last, cfg), batch[response])
  m = batch[f"{response}_mask"]
  return jnp.where(m, logp, 0.0).sum(-1) / jnp.maximum(m.sum(-1), 1)


def response_token_stats(params, batch: pipeline.Batch, cfg: ModelConfig,
                         dropout_rng: jax.Array | None = None, temperature: float = 1.0,
                         group: int = 1) -> tuple[jax.Array, jax.Array]:
  """log p(response token | prompt, earlier tokens) under `softmax(logits / temperature)`, and the
  entropy of that distribution; both [B, R] and 0 at padding (`group`: see hidden_states)."""
  return token_stats(response_distributions(params, batch, cfg, dropout_rng, temperature, group),
                     batch)


def token_stats(logp_all: jax.Array, batch: pipeline.Batch) -> tuple[jax.Array, jax.Array]:
  """`response_token_stats` from the response's distributions [B, R, V] (e.g. those of
  `distributions_from_hidden`, when the caller needs the hidden states too)."""
  logp = _chosen(logp_all, batch["response"])
  entropy = -(jnp.exp(logp_all) * logp_all).sum(-1)
  m = batch["response_mask"]
  return jnp.where(m, logp, 0.0), jnp.where(m, entropy, 0.0)


def response_logprobs(params, batch: pipeline.Batch, cfg: ModelConfig,
                      dropout_rng: jax.Array | None = None, temperature: float = 1.0,
                      group: int = 1) -> jax.Array:
  """log p(response token | prompt, earlier tokens) [B, R], 0 at padding (`group`: see
  hidden_states)."""
  return response_token_stats(params, batch, cfg, dropout_rng, temperature, group)[0]
