"""Which wrong facts decide the held-out pairs the reward model gets wrong.

    python docs/research/world_v2/wrong_facts.py runs/quickstart

Scores the workdir's held-out pairs (`label/valid.jsonl`) with its reward model (`rm/model`) and,
for the pairs that gold decides by a wrong fact, names the facts that only the worse summary gets
wrong: an age given to the poster or to the other party (the other person's number, "swapped"; a
number in neither of them; or the right number with the wrong gender), a relation, an event or a
feeling.
"""
import collections
import re
import sys

from rlhfjax import config_file
from rlhfjax.algorithms import reward_model
from rlhfjax.data import pipeline
from rlhfjax.evaluation import agreement, rm_report
from rlhfjax.simulated import gold, world
from rlhfjax.training import experiment

_WORD = re.compile(r"[a-z0-9']+")
_AGE = re.compile(r"^(\d+)([mf])$")


def wrong_facts(s: world.Situation, summary: str) -> list[str]:
  """The wrong facts of a summary, as gold counts them (`gold.gold_components`), by kind."""
  tokens = _WORD.findall(summary.lower())
  words = set(tokens)
  rel = s.relation.split()[-1]
  other_at = {i + 1 for i, t in enumerate(tokens[:-1]) if t == rel}
  out = []
  for i, t in enumerate(tokens):
    if m := _AGE.match(t):
      whose = "other" if i in other_at else "poster"
      want = (s.other_age, s.other_gender) if whose == "other" else (s.poster_age, s.poster_gender)
      age = int(m.group(1))
      if (age, m.group(2).upper()) != want:
        how = ("gender" if age == want[0] else
               "swapped" if age in (s.poster_age, s.other_age) else "another number")
        out.append(f"{whose}'s age: {how}")
  out += ["relation" for w, r in gold._RELATION_WORDS.items() if w in words and r != s.relation]
  out += ["event" for e in world.EVENTS if e not in s.events and gold._event_mentioned(words, e)]
  out += ["feeling" for f in world.FEELINGS if f != s.feeling and f in words]
  return out


def main(workdir: str) -> None:
  exp = experiment.prepare(config_file.load("configs/tldr_sim.py", None), workdir)
  params, _ = reward_model.load(exp)
  comps = reward_model.load_comparisons(f"{workdir}/label/valid.jsonl", "openai", report=False)
  posts = pipeline.posts_of(comps)
  a, b = [c.response_a for c in comps], [c.response_b for c in comps]
  rm = agreement.prefer_higher(reward_model.score_texts(params, exp, posts, a),
                               reward_model.score_texts(params, exp, posts, b))
  examples = rm_report._examples_of(exp, comps)
  gold_pref = agreement.gold_preference(examples, a, b)
  component = agreement.deciding_component(examples, a, b)
  pairs, right = collections.Counter(), collections.Counter()
  for i, e in enumerate(examples):
    if component[i] != "wrong fact" or gold_pref[i] == 0.5:
      continue
    facts_a, facts_b = wrong_facts(e.situation, a[i]), wrong_facts(e.situation, b[i])
    worse, better = (facts_b, facts_a) if gold_pref[i] == 0 else (facts_a, facts_b)
    key = " + ".join(sorted(collections.Counter(worse) - collections.Counter(better))) or "(none of its own)"
    pairs[key] += 1
    right[key] += rm[i] == gold_pref[i]
  print("| the worse summary's own wrong facts | pairs | RM agrees with gold |\n|---|---|---|")
  for key, n in pairs.most_common():
    print(f"| {key} | {n} | {right[key] / n:.0%} |")
  samples = [wrong_facts(e.situation, t) for e, x, y in zip(examples, a, b) for t in (x, y)]
  poster = sum(any(f.startswith("poster") for f in s) for s in samples)
  print(f"\n{poster} of {len(samples)} held-out samples give the poster a wrong age.")


if __name__ == "__main__":
  main(sys.argv[1])
