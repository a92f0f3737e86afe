"""Which wrong facts decide the held-out pairs the reward model gets wrong.

    python docs/research/world_v2/wrong_facts.py runs/quickstart

Scores the workdir's held-out pairs (`label/valid.jsonl`) with its reward model (`rm/model`) and,
for the pairs that gold decides by a wrong fact, names the facts that only the worse summary gets
wrong (`simulated.gold.wrong_facts`, what gold's accuracy penalty counts): an age given to the
poster or to the other party (the other person's number, "swapped"; another number; or the right
number with the wrong gender), a relation, an event, a feeling or a number.
"""
import collections
import sys

from rlhfjax import config_file
from rlhfjax.data import pipeline
from rlhfjax.evaluation import agreement, rm_report
from rlhfjax.rollout import rewards
from rlhfjax.simulated import gold
from rlhfjax.training import experiment
from rlhfjax.training import loaders

def main(workdir: str) -> None:
  exp = experiment.prepare(config_file.load("configs/tldr_sim.py", None), workdir)
  params, _ = loaders.load_reward_model(exp)
  comps = loaders.load_comparisons(f"{workdir}/label/valid.jsonl", "openai", report=False)
  posts = pipeline.posts_of(comps)
  a, b = [c.response_a for c in comps], [c.response_b for c in comps]
  rm = agreement.prefer_higher(rewards.score_texts(params, exp, posts, a),
                               rewards.score_texts(params, exp, posts, b))
  examples = rm_report._examples_of(exp, comps)
  gold_pref = agreement.gold_preference(examples, a, b)
  component = agreement.deciding_component(examples, a, b)
  pairs, right = collections.Counter(), collections.Counter()
  for i, e in enumerate(examples):
    if component[i] != "wrong fact" or gold_pref[i] == 0.5:
      continue
    facts_a, facts_b = gold.wrong_facts(e.situation, a[i]), gold.wrong_facts(e.situation, b[i])
    worse, better = (facts_b, facts_a) if gold_pref[i] == 0 else (facts_a, facts_b)
    own = collections.Counter(worse) - collections.Counter(better)
    key = " + ".join(sorted(own)) or "(none of its own)"
    pairs[key] += 1
    right[key] += rm[i] == gold_pref[i]
  print("| the worse summary's own wrong facts | pairs | RM agrees with gold |\n|---|---|---|")
  for key, n in pairs.most_common():
    print(f"| {key} | {n} | {right[key] / n:.0%} |")
  samples = [gold.wrong_facts(e.situation, t) for e, x, y in zip(examples, a, b) for t in (x, y)]
  poster = sum(any(f.startswith("poster") for f in s) for s in samples)
  print(f"\n{poster} of {len(samples)} held-out samples give the poster a wrong age.")


if __name__ == "__main__":
  main(sys.argv[1])
