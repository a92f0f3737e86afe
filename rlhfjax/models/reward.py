"""The reward model's score of a response: a scalar head on the decoder's last real token, plus an
optional learned multiple of the response's mean token log-probability (`heads.LIKELIHOOD`).

Trained by `algorithms/reward_model.py`; read by the rollout engine (rewards at eos), PPO's
experience and every method that ranks samples, so it lives below all of them.
"""

from __future__ import annotations

import jax

from rlhfjax.data import pipeline
from rlhfjax.models import heads
from rlhfjax.models import policy
from rlhfjax.models.config import ModelConfig


def score(params, batch: pipeline.Batch, cfg: ModelConfig, response: str = "response",
          group: int = 1) -> jax.Array:
  """The reward [B] of `batch[response]` after `batch['prompt']`: the head read at the last real
  token, plus, in a model with a likelihood term, its weight times the response's mean token
  log-probability under the model's own language-model head. `group` k > 1: rows come in groups of
  k sharing a prompt, computed once (policy.hidden_states)."""
  hidden, mask, last = policy.hidden_states(params["backbone"], batch, cfg, group=group,
                                            response=response)
  r = heads.read_last(params["head"], hidden, mask)
  if heads.LIKELIHOOD in params:
    logp = policy.mean_response_logprob(params["backbone"], hidden, last, batch, cfg, response)
    r = r + params[heads.LIKELIHOOD]["weight"] * logp
  return r


# `score` jitted once for every caller: the reward of each row of a fixed-shape batch.
score_batch = jax.jit(score, static_argnames=("cfg", "response", "group"))
