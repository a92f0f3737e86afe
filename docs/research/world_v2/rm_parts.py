"""How much of the quickstart reward model's agreement with gold comes from each of its two parts.

    python docs/research/world_v2/rm_parts.py runs/quickstart

The score is head(h_eos) + λ · mean log π(y | x) (`models/reward.py`), with π the model's own
language-model head, trained with the rest. This scores the workdir's held-out pairs with the whole
model, with λ set to 0 (the head alone), and with the difference of the two (the likelihood term
alone), and prints each one's agreement with gold (gold ties left out).
"""
import sys

import jax
import numpy as np

from rlhfjax import config_file
from rlhfjax.data import pipeline
from rlhfjax.evaluation import agreement, rm_report
from rlhfjax.models import heads
from rlhfjax.rollout import rewards
from rlhfjax.training import experiment
from rlhfjax.training import loaders


def main(workdir: str) -> None:
  exp = experiment.prepare(config_file.load("configs/tldr_sim.py", None), workdir)
  params, _ = loaders.load_reward_model(exp)
  if heads.LIKELIHOOD not in params:
    sys.exit(f"{workdir}/rm/model has no likelihood term (rm.likelihood_weight=0)")
  comps = loaders.load_comparisons(f"{workdir}/label/valid.jsonl", "openai", report=False)
  posts = pipeline.posts_of(comps)
  a, b = [c.response_a for c in comps], [c.response_b for c in comps]
  gold = agreement.gold_preference(rm_report._examples_of(exp, comps), a, b)

  def scores(p) -> tuple[np.ndarray, np.ndarray]:
    return (np.asarray(rewards.score_texts(p, exp, posts, a)),
            np.asarray(rewards.score_texts(p, exp, posts, b)))

  head_only = dict(params, **{heads.LIKELIHOOD: jax.tree.map(lambda w: w * 0,
                                                            params[heads.LIKELIHOOD])})
  (full_a, full_b), (head_a, head_b) = scores(params), scores(head_only)
  parts = {"the whole model": (full_a, full_b), "the head alone": (head_a, head_b),
           "the likelihood term alone": (full_a - head_a, full_b - head_b)}
  print(f"λ = {float(params[heads.LIKELIHOOD]['weight']):.3f}")
  for name, (sa, sb) in parts.items():
    print(f"{name}: {agreement.accuracy_against(agreement.prefer_higher(sa, sb), gold):.1%}")


if __name__ == "__main__":
  main(sys.argv[1])
