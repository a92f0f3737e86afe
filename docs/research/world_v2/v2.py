"""World v2 proxy: main vs side event, generic vs specific question, filler, distractors."""
import math, re, sys
import numpy as np
from rlhfjax.simulated import world, gold
import proxy

SEVERITY = {e: i for i, e in enumerate([  # mild -> severe (a fixed, learnable property of the event)
  "dishes", "loud_music", "games", "chores", "guests", "eats_food", "overtime", "cancels_plans",
  "forgot_birthday", "compares", "weight", "ignores_me", "gossips", "no_rent", "borrowed",
  "denied_raise", "graduation", "wedding", "reads_texts", "drinks", "yells", "ex", "flirts",
  "took_credit", "secret", "lied_money", "fire_threat", "cheated"])}
GENERIC_Q = ("What should I do?", "Any advice?", "What do I do?")
FILLER = ("Long story short.", "It has been a rough few weeks.", "Not sure what to do anymore.")

def main_side(s):
  ev = sorted(s.events, key=lambda e: -SEVERITY[e])
  return ev[0], (ev[1] if len(ev) > 1 else None)

P = dict(both=0.45, main=0.30, side=0.25, specific_q=0.4, filler=0.5, distractor=0.3,
         feeling_drop=0.25, age_drop=0.2, err=0.1, budget=24)

def ref_v2(s, rng, **kw):
  p = {**P, **kw}; lp = 0.0
  def coin(q):
    nonlocal lp
    x = rng.random() < q
    lp += math.log(q if x else 1 - q) if 0 < q < 1 else 0.0
    return x
  main, side = main_side(s)
  if side is None:
    events = [main]
  else:
    which, l = proxy.pick(rng, ["both", "main", "side"], [p["both"], p["main"], p["side"]]); lp += l
    events = {"both": [e for e in s.events], "main": [main], "side": [side]}[which]
  if coin(p["err"]):
    pool = [e for e in world.EVENTS if e not in s.events]
    w, l = proxy.pick(rng, pool); lp += l; events[0] = w
  ev = " and ".join(world._fill(world.EVENTS[e][1], s.other_gender) for e in events)
  me = "" if coin(p["age_drop"]) else " " + world._age(s.poster_age, s.poster_gender)
  them = world._age(s.other_age, s.other_gender)
  of = f" of {s.duration}" if s.duration else ""
  if coin(p["feeling_drop"]):
    forms = (f"My{me} {s.relation} {them}{of} {ev}.",)
  else:
    forms = (f"My{me} {s.relation} {them}{of} {ev}. I feel {s.feeling}.",
             f"I{me} feel {s.feeling} because my {s.relation} {them}{of} {ev}.",
             f"My {s.relation} {them}{of} {ev} and I{me} feel {s.feeling}.")
  f, l = proxy.pick(rng, forms); lp += l
  parts = []
  if coin(p["filler"]):
    x, l = proxy.pick(rng, FILLER); lp += l; parts.append(x)
  parts.append(f)
  if coin(p["distractor"]):
    kind, value = s.distractors[0]
    parts.append(world._DISTRACTOR_REF[kind].format(x=value))
  if coin(p["specific_q"]):
    parts.append(world.question_text(s))
  else:
    x, l = proxy.pick(rng, GENERIC_Q); lp += l; parts.append(x)
  return " ".join(parts), lp

W2 = dict(relation=1.0, poster=0.5, other=0.5, duration=0.5, main=1.5, feeling=0.5, question=0.75)
def gold2_components(s, summary, budget=None):
  budget = budget or P["budget"]
  tokens = gold._WORD.findall(summary.lower()); words = set(tokens)
  main, side = main_side(s)
  rel_word = s.relation.split()[-1]
  other_at = {i + 1 for i, t in enumerate(tokens[:-1]) if t == rel_word}
  poster_ok = other_ok = False; wrong = 0
  for i, t in enumerate(tokens):
    m = gold._AGE.match(t)
    if not m: continue
    want = (s.other_age, s.other_gender) if i in other_at else (s.poster_age, s.poster_gender)
    ok = (int(m.group(1)), m.group(2).upper()) == want
    wrong += not ok
    if i in other_at: other_ok |= ok
    else: poster_ok |= ok
  facts = {"relation": rel_word in words, "poster": poster_ok, "other": other_ok,
           "feeling": s.feeling in words, "question": gold._has_any(words, world.QUESTIONS[s.question][1]),
           "main": gold._event_mentioned(words, main)}
  wts = {k: W2[k] for k in facts}
  if s.duration:
    n, unit = s.duration.split()
    facts["duration"] = n in words and gold._has_any(words, (unit, unit.rstrip("s"))); wts["duration"] = W2["duration"]
  coverage = sum(wts[k] for k, v in facts.items() if v) / sum(wts.values())
  wrong += sum(1 for w, r in gold._RELATION_WORDS.items() if w in words and r != s.relation)
  wrong += sum(1 for e in world.EVENTS if e not in s.events and gold._event_mentioned(words, e))
  wrong += sum(1 for f in world.FEELINGS if f != s.feeling and f in words)
  allowed = {str(s.poster_age), str(s.other_age)} | ({s.duration.split()[0]} if s.duration else set())
  wrong += sum(1 for t in words if t.isdigit() and t not in allowed)
  irrelevant = sum(1 for _, v in s.distractors if v in words)
  accuracy = -(0.25 * wrong + 0.2 * irrelevant)
  conciseness = -P.get("per_word", 0.03) * max(0, len(summary.split()) - budget)
  trigrams = list(zip(tokens, tokens[1:], tokens[2:])); repeats = len(trigrams) - len(set(trigrams))
  vocab = world.vocabulary(); oov = sum(t not in vocab for t in tokens) / max(len(tokens), 1)
  ends = summary.rstrip().endswith((".", "!", "?"))
  fluency = -(min(0.1 * repeats, 1.0) + oov + (0.0 if ends else 0.1))
  total = coverage + accuracy + conciseness + fluency
  return {"coverage": coverage, "accuracy": accuracy, "conciseness": conciseness, "fluency": fluency,
          "total": total, "wrong_facts": float(wrong), "irrelevant_details": float(irrelevant)}

if __name__ == "__main__":
  gold.gold_components = gold2_components
  kw = dict(a.split("=") for a in sys.argv[1:])
  kw = {k: float(v) for k, v in kw.items()}
  if "budget" in kw: P["budget"] = int(kw.pop("budget"))
  if "per_word" in kw: P["per_word"] = kw.pop("per_word")
  print({k: round(float(v), 1) for k, v in proxy.study(ref_v2, **kw).items()})
