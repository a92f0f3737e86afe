"""Batched generation over a whole split with the jitted sampler, in fixed-shape batches."""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

from rlhfjax.data import pipeline
from rlhfjax.models.config import ModelConfig
from rlhfjax.models import sampling
from rlhfjax.parallel.sharding import to_host


def generate(params, cfg: ModelConfig, scfg: sampling.SamplingConfig, prompts: pipeline.Batch,
             rng: jax.Array, batch_size: int,
             place: Callable[[np.ndarray], Any] = lambda x: x) -> dict[str, np.ndarray]:
  """Samples a response for every prompt; returns numpy `response`, `logprobs`, `lengths`.

  Batch b uses `fold_in(rng, b)`, so results depend only on the rng and the batch size. `place`
  puts each batch's token arrays where the sampler runs (the rollout layout's rows).
  """
  outs = []
  for b, (batch, n) in enumerate(pipeline.fixed_batches(prompts, batch_size)):
    out = sampling.sample(params, place(batch["prompt"]), place(batch["prompt_mask"]),
                          jax.random.fold_in(rng, b), cfg, scfg)
    outs.append([x[:n] for x in to_host((out.tokens, out.logprobs, out.lengths))])
  return {name: np.concatenate([o[i] for o in outs])
          for i, name in enumerate(("response", "logprobs", "lengths"))}
