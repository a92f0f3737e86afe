"""Proxy study of the simulated world's agreement structure (issue #39), in seconds.

SFT samples ~ draws from the reference generator (+ an error process); the SFT likelihood judge ~
the log-probability of the generator's choices; the RM ~ logistic regression on bag-of-words
(unigram+bigram) differences trained on train_pool labels. Prints each judge's agreement with gold.
"""
import collections, math, sys, re
import numpy as np
from rlhfjax.simulated import world, gold
from rlhfjax.feedback import annotators
from rlhfjax.data import pipeline

def pick(rng, options, probs=None):
  probs = np.ones(len(options)) / len(options) if probs is None else np.asarray(probs, float)
  i = rng.choice(len(options), p=probs)
  return options[i], math.log(probs[i])

def ref_v1(s, rng, noise=1.0, err=0.1):
  lp = 0.0
  def coin(p):
    nonlocal lp
    x = rng.random() < p
    lp += math.log(p if x else 1 - p) if 0 < p < 1 else 0.0
    return x
  drop = {k: coin(noise * p) for k, p in world.HUMAN_NOISE.items()}
  events = list(s.events)
  if len(events) > 1 and drop["second_event"]:
    events = events[:1]
  # error process: replace an event by a wrong (fluent) one
  if coin(err):
    pool = [e for e in world.EVENTS if e not in s.events]
    w, l = pick(rng, pool); lp += l; events[0] = w
  ev = " and ".join(world._fill(world.EVENTS[e][1], s.other_gender) for e in events)
  me = "" if drop["poster_age"] else " " + world._age(s.poster_age, s.poster_gender)
  them = world._age(s.other_age, s.other_gender)
  of = f" of {s.duration}" if s.duration else ""
  if drop["feeling"]:
    forms = (f"My{me} {s.relation} {them}{of} {ev}.",)
  else:
    forms = (f"My{me} {s.relation} {them}{of} {ev}. I feel {s.feeling}.",
             f"I{me} feel {s.feeling} because my {s.relation} {them}{of} {ev}.",
             f"My {s.relation} {them}{of} {ev} and I{me} feel {s.feeling}.")
  f, l = pick(rng, forms); lp += l
  parts = [f]
  if drop["distractor"]:
    kind, value = s.distractors[0]
    parts.append(world._DISTRACTOR_REF[kind].format(x=value))
  if not drop["question"]:
    parts.append(world.question_text(s))
  return " ".join(parts), lp

WORD = re.compile(r"[a-z0-9']+|[().?!]")
def feats(text):
  t = WORD.findall(text.lower())
  c = collections.Counter(t)
  c.update(f"{a}_{b}" for a, b in zip(t, t[1:]))
  return c

def study(ref_fn, n_train=4000, n_val=1000, seed=0, flip=0.25, **kw):
  rng = np.random.default_rng(seed)
  exs = world.generate(seed, 0, n_train + n_val)
  A, B, LA, LB = [], [], [], []
  for e in exs:
    a, la = ref_fn(e.situation, rng, **kw); b, lb = ref_fn(e.situation, rng, **kw)
    A.append(a); B.append(b); LA.append(la); LB.append(lb)
  g = np.array([gold.gold_reward(e.situation, x) - gold.gold_reward(e.situation, y) for e, x, y in zip(exs, A, B)])
  cfg = dict(pool_size=8, seed=0, flip_rate=flip, file_layout="openai", traits=dict(
      weight_coverage=(0.6, 1.4), weight_accuracy=(0.6, 1.4), weight_conciseness=(0.3, 1.5),
      weight_fluency=(0.5, 1.5), length_bias=(0.0, 0.02), position_bias=(-0.5, 0.5),
      temperature=(0.05, 0.15)))
  pool = annotators.build("train_pool", cfg)
  tr = slice(0, n_train); va = slice(n_train, None)
  labels = pool.annotate(exs[tr], A[tr], B[tr], np.random.default_rng(1))  # 0: a preferred
  # logistic regression on feature differences
  vocab = {}
  def vec(x, y):
    d = collections.Counter(feats(x)); d.subtract(feats(y)); return d
  rows = [vec(x, y) for x, y in zip(A, B)]
  for r in rows[tr]:
    for k in r: vocab.setdefault(k, len(vocab))
  X = np.zeros((len(rows), len(vocab)), np.float32)
  for i, r in enumerate(rows):
    for k, v in r.items():
      if k in vocab: X[i, vocab[k]] = v
  y = (np.asarray(labels) == 0).astype(np.float32)
  w = np.zeros(len(vocab), np.float32); lr = 0.5; l2 = 1e-3
  for it in range(300):
    p = 1 / (1 + np.exp(-X[tr] @ w))
    w -= lr * (X[tr].T @ (p - y) / n_train + l2 * w)
  rm = X[va] @ w
  gv = g[va]; keep = gv != 0
  def agree(score):
    s = np.asarray(score)[keep]; gg = gv[keep]
    return 100 * np.mean(np.where(s == 0, 0.5, (np.sign(s) == np.sign(gg))))
  la, lb = np.array(LA)[va], np.array(LB)[va]
  lenA = np.array([len(x.split()) for x in A])[va]; lenB = np.array([len(x.split()) for x in B])[va]
  res = {"rm(bow)": agree(rm), "logp": agree(la - lb), "mean logp": agree(la / lenA - lb / lenB),
         "length": agree(lenA - lenB), "labels(train)": 100 * np.mean((np.asarray(labels) == 0) == (g[tr] > 0)),
         "ties%": 100 * (1 - keep.mean()), "gold(samples)": 100 * np.mean([gold.gold_reward(e.situation, x) for e, x in zip(exs[:500], A[:500])])}
  return res

if __name__ == "__main__":
  print({k: round(float(v), 1) for k, v in study(ref_v1).items()})
