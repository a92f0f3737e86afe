"""Scalar heads on the decoder: the reward model (read at the last real token) and the value model.

Reward and value models are `{'backbone': transformer params, 'head': scalar head}`. The head's kernel
starts at N(0, 1/(d_model + 1)) (std 1/sqrt(d_model + 1)), as in Stiennon et al. / lm-human-preferences,
so initial scores are of order one.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig


# A reward model's optional likelihood term, `{LIKELIHOOD: {'weight': λ}}` beside backbone and head
# (see models/reward.score).
LIKELIHOOD = "likelihood"


def init_scalar_head(rng: jax.Array, d_model: int) -> dict[str, jax.Array]:
  return {"kernel": jax.random.normal(rng, (d_model,)) / math.sqrt(d_model + 1),
          "bias": jnp.zeros(())}


def scalar_head_axes() -> dict[str, tuple[str, ...]]:
  return {"kernel": ("embed",), "bias": ()}


def param_axes(cfg: ModelConfig) -> dict:
  """Logical axes of a reward/value model's parameters (see transformer.param_axes)."""
  return {"backbone": transformer.param_axes(cfg), "head": scalar_head_axes()}


def apply_scalar_head(head: dict[str, jax.Array], hidden: jax.Array) -> jax.Array:
  """[B,T,D] -> [B,T] float32."""
  return hidden.astype(jnp.float32) @ head["kernel"].astype(jnp.float32) + head["bias"]


def last_token_index(mask: jax.Array) -> jax.Array:
  """Index of the last real token of each row, whether padding is on the left or the right."""
  t = mask.shape[-1]
  return (t - 1 - jnp.argmax(jnp.flip(mask.astype(bool), -1), -1)).astype(jnp.int32)


def gather_last(values: jax.Array, mask: jax.Array) -> jax.Array:
  """values[b, last real token of b]."""
  return jnp.take_along_axis(values, last_token_index(mask)[:, None], -1)[:, 0]


def init(rng: jax.Array, cfg: ModelConfig) -> dict:
  """A reward/value model from scratch (usually the backbone comes from an SFT checkpoint)."""
  k1, k2 = jax.random.split(rng)
  return {"backbone": transformer.init(k1, cfg), "head": init_scalar_head(k2, cfg.d_model)}


def values(params: dict, tokens: jax.Array, mask: jax.Array, cfg: ModelConfig) -> jax.Array:
  """Per-token scalar outputs [B,T] (the value model)."""
  hidden, _ = transformer.forward(params["backbone"], tokens, cfg, mask=mask)
  return apply_scalar_head(params["head"], hidden)


def read_last(head: dict[str, jax.Array], hidden: jax.Array, mask: jax.Array) -> jax.Array:
  """The head's score of each sequence [B], read at its last real token of hidden [B,T,D]."""
  return gather_last(apply_scalar_head(head, hidden), mask)
