"""Batched generation over a whole split with the jitted sampler, in fixed-shape batches."""

from __future__ import annotations

import jax
import numpy as np

from rlhfjax.data import pipeline
from rlhfjax.models import sampling
from rlhfjax.models.config import ModelConfig
from rlhfjax.parallel.sharding import to_host


def generate(params, cfg: ModelConfig, scfg: sampling.SamplingConfig, prompts: pipeline.Batch,
             rng: jax.Array, batch_size: int) -> dict[str, np.ndarray]:
  """Samples a response for every prompt; returns numpy `response`, `logprobs`, `lengths`.

  Batch b uses `fold_in(rng, b)`, so results depend only on the rng and the batch size.
  """
  outs = []
  for b, (batch, n) in enumerate(pipeline.fixed_batches(prompts, batch_size)):
    out = sampling.sample(params, batch["prompt"], batch["prompt_mask"],
                          jax.random.fold_in(rng, b), cfg, scfg)
    outs.append(jax.tree.map(lambda x, n=n: x[:n], to_host(out)))
  return {"response": np.concatenate([o.tokens for o in outs]),
          "logprobs": np.concatenate([o.logprobs for o in outs]),
          "lengths": np.concatenate([o.lengths for o in outs])}
