"""The TuringAdvice evaluation protocol, a simulated judge, and the two reference baselines.

Zellers et al. (2021), "TuringAdvice: A Generative and Dynamic Evaluation of Language Use", its
evaluation section and the released crowdsourcing form (`human_eval/turk_interface.html`): for
each situation, a model's advice and the top-rated human advice are shown to a judge in a random order
(drawn anew for every judgement). The judge says which is more helpful, then rates the worse one:
slightly helpful, not helpful, or dangerous. For a slightly helpful one it says whether the problem is
the writing (a rewrite keeping the meaning would be as helpful) or the meaning; for a not helpful or
dangerous one, whether it is possibly helpful (in some other situation) or never helpful. Each
situation is judged three times (three workers) and the majority vote decides it.

Reported (`report`): the score, the % of situations where the model's advice is preferred, with its
standard error and a percentile-bootstrap 95% interval over situations (`winrate.summarize` with a
fixed seed), and the diagnostics: over every judgement in which the model's advice lost, how often
each (helpfulness, follow-up) answer was given. `compare` tests two models judged on the same
situations with the exact McNemar test: only the situations where exactly one model wins count, and
under equal win-rates each of those is a fair coin, so the two-sided p-value is
`min(1, 2 * P(Binomial(n01 + n10, 1/2) <= min(n01, n10)))`. (`winrate.paired_p_value` is the Monte
Carlo form of the same sign test; with binary outcomes the exact value is cheap.)

A judge is any callable `judge(situations, first, second, rng) -> list[Judgement]` seeing the two
advice in presentation order; people, a model-based judge or `SimulatedJudge` plug in the same way.

Baselines: `templated_advice`, a rule-based advice from a fixed template per advice category (see
`TEMPLATES`), and `TfidfRetrieval`, which returns the top advice of the most similar training situation
(TF-IDF of title and text, cosine similarity), the paper's retrieval baseline.
"""

from __future__ import annotations

import dataclasses
import math
import re
import zlib
from typing import Protocol, Sequence

import numpy as np

from rlhfjax.evaluation import winrate
from rlhfjax.sources.reddit_advice import Situation

HELPFULNESS = ("slightly_helpful", "not_helpful", "dangerous")
FOLLOW_UPS = {"slightly_helpful": ("writing", "meaning"),
              "not_helpful": ("possibly_helpful", "never_helpful"),
              "dangerous": ("possibly_helpful", "never_helpful")}
DIAGNOSTICS = tuple(f"{h}/{f}" for h in HELPFULNESS for f in FOLLOW_UPS[h])


@dataclasses.dataclass(frozen=True)
class Judgement:
  """One judgement of two advice in presentation order: `choice` 0 when the first-shown is more
  helpful, 1 when the second is; then the worse one's helpfulness and the follow-up answer."""

  choice: int
  helpfulness: str
  follow_up: str
  definitely: bool = True  # "Definitely" rather than "slightly" better; kept, not scored.

  def __post_init__(self):
    if self.choice not in (0, 1):
      raise ValueError(f"choice must be 0 or 1, got {self.choice!r}")
    if self.helpfulness not in FOLLOW_UPS:
      raise ValueError(f"helpfulness must be one of {HELPFULNESS}, got {self.helpfulness!r}")
    if self.follow_up not in FOLLOW_UPS[self.helpfulness]:
      raise ValueError(f"after {self.helpfulness!r} the follow-up is one of "
                       f"{FOLLOW_UPS[self.helpfulness]}, got {self.follow_up!r}")


class Judge(Protocol):

  def __call__(self, situations: Sequence[Situation], first: Sequence[str], second: Sequence[str],
               rng: np.random.Generator) -> list[Judgement]:
    """One judgement per situation of the advice `first[i]` (shown first) and `second[i]`."""


@dataclasses.dataclass(frozen=True)
class Evaluation:
  """Every judgement of a model's advice against the human advice, as `[situations, ratings]` arrays:
  whether the model's advice was shown first and preferred, and the worse advice's diagnostics."""

  model_first: np.ndarray
  model_preferred: np.ndarray
  helpfulness: np.ndarray
  follow_up: np.ndarray

  @property
  def wins(self) -> np.ndarray:
    """1.0 where the majority of the ratings prefers the model's advice, else 0.0."""
    return majority(self.model_preferred)


def majority(votes: np.ndarray) -> np.ndarray:
  """Per row, 1.0 when more than half of the votes are true; rows need an odd number of votes."""
  votes = np.asarray(votes, bool)
  if votes.shape[-1] % 2 == 0:
    raise ValueError(f"a majority vote needs an odd number of ratings, got {votes.shape[-1]}")
  return (2 * votes.sum(-1) > votes.shape[-1]).astype(np.float64)


def evaluate(judge: Judge, situations: Sequence[Situation], model_advice: Sequence[str],
             rng: np.random.Generator, ratings: int = 3,
             human_advice: Sequence[str] | None = None) -> Evaluation:
  """Judges `model_advice` against the top human advice of each situation (or `human_advice`),
  `ratings` times each, in a fresh random presentation order every time. The judge is called once per
  round of ratings, with every situation."""
  if human_advice is None:
    human_advice = [s.top_advice.body for s in situations]
  if not len(situations) == len(model_advice) == len(human_advice):
    raise ValueError(f"{len(situations)} situations, {len(model_advice)} model and "
                     f"{len(human_advice)} human advice")
  if ratings < 1 or ratings % 2 == 0:
    raise ValueError(f"ratings must be odd for a majority vote, got {ratings}")
  n = len(situations)
  model_first = np.zeros((n, ratings), bool)
  preferred = np.zeros((n, ratings), bool)
  helpfulness = np.full((n, ratings), "", object)
  follow_up = np.full((n, ratings), "", object)
  for r in range(ratings):
    model_first[:, r] = rng.random(n) < 0.5
    first = [m if f else h for m, h, f in zip(model_advice, human_advice, model_first[:, r])]
    second = [h if f else m for m, h, f in zip(model_advice, human_advice, model_first[:, r])]
    judgements = judge(situations, first, second, rng)
    if len(judgements) != n:
      raise ValueError(f"the judge gave {len(judgements)} judgements for {n} situations")
    for i, j in enumerate(judgements):
      preferred[i, r] = (j.choice == 0) == model_first[i, r]
      helpfulness[i, r], follow_up[i, r] = j.helpfulness, j.follow_up
  return Evaluation(model_first, preferred, helpfulness, follow_up)


def diagnostics(evaluation: Evaluation) -> dict[str, int]:
  """Counts of each `helpfulness/follow_up` answer over the judgements the model's advice lost."""
  lost = ~evaluation.model_preferred
  counts = dict.fromkeys(DIAGNOSTICS, 0)
  for h, f in zip(evaluation.helpfulness[lost], evaluation.follow_up[lost]):
    counts[f"{h}/{f}"] += 1
  return counts


def report(evaluation: Evaluation, seed: int = 0, n_boot: int = 1000) -> dict:
  """Score (%), its standard error and bootstrap 95% interval (%, fixed `seed`), the number of
  situations, and the diagnostics of the lost judgements."""
  s = winrate.summarize(evaluation.wins, np.random.default_rng(seed), n_boot)
  return {"score": s["win_rate"], "se": s["se"], "ci_low": s["ci_low"], "ci_high": s["ci_high"],
          "n": int(s["n"]), "diagnostics": diagnostics(evaluation)}


def mcnemar_exact(wins_a: np.ndarray, wins_b: np.ndarray) -> dict[str, float]:
  """Exact two-sided McNemar (sign) test that two models judged on the same situations have equal
  scores: `a_only` / `b_only` situations won by one model alone, and the p-value."""
  a, b = np.asarray(wins_a, bool), np.asarray(wins_b, bool)
  if a.shape != b.shape:
    raise ValueError(f"paired wins must have the same shape, got {a.shape} and {b.shape}")
  n01, n10 = int(np.sum(a & ~b)), int(np.sum(~a & b))
  m = n01 + n10
  tail = sum(math.comb(m, k) for k in range(min(n01, n10) + 1)) / 2 ** m
  return {"a_only": n01, "b_only": n10, "p_value": min(1.0, 2 * tail)}


def compare(a: Evaluation, b: Evaluation) -> dict[str, float]:
  """`mcnemar_exact` on the majority wins of two models, with the score difference (%, a − b)."""
  out = mcnemar_exact(a.wins, b.wins)
  out["difference"] = 100 * float(a.wins.mean() - b.wins.mean())
  return out


def _content_words(text: str) -> set[str]:
  return set(re.findall(r"[a-z]{4,}", text.lower()))


@dataclasses.dataclass(frozen=True)
class SimulatedJudge:
  """A stand-in judge for tests and demos, deterministic given the rng. An advice's helpfulness is
  the number of distinct content words (4+ letters) of the situation's title and text it uses; the
  judge prefers the first-shown with probability `sigmoid(diff / temperature + position_bias)` (at
  temperature 0: the more helpful, ties by a coin). The worse advice is slightly helpful when it uses
  any such word (a writing problem when it is at least half as helpful as the better, else a meaning
  problem), otherwise not helpful (possibly helpful when it has 8 words or more, else never). It
  never answers "dangerous": it has no notion of harm."""

  temperature: float = 0.0
  position_bias: float = 0.0

  def helpfulness(self, situation: Situation, advice: str) -> int:
    return len(_content_words(advice) & _content_words(f"{situation.title} {situation.selftext}"))

  def __call__(self, situations, first, second, rng: np.random.Generator) -> list[Judgement]:
    out = []
    for s, x, y in zip(situations, first, second):
      hx, hy = self.helpfulness(s, x), self.helpfulness(s, y)
      if self.temperature > 0:
        p_first = 1 / (1 + math.exp(-((hx - hy) / self.temperature + self.position_bias)))
      else:
        p_first = 1.0 if hx > hy else 0.0 if hx < hy else 1 / (1 + math.exp(-self.position_bias))
      choice = int(rng.random() >= p_first)
      worse, h_worse, h_better = (y, hy, hx) if choice == 0 else (x, hx, hy)
      if h_worse > 0:
        out.append(Judgement(choice, "slightly_helpful",
                             "writing" if 2 * h_worse >= h_better else "meaning"))
      else:
        out.append(Judgement(choice, "not_helpful",
                             "possibly_helpful" if len(worse.split()) >= 8 else "never_helpful"))
    return out


# Advice categories of the subreddits (the paper's release groups them the same way).
CATEGORIES = {"relationships": "relationship", "relationship_advice": "relationship",
              "dating_advice": "relationship", "dating": "relationship", "Marriage": "relationship",
              "love": "relationship", "legaladvice": "legal", "techsupport": "technology",
              "Advice": "life", "internetparents": "life", "needadvice": "life",
              "NoStupidQuestions": "life"}
OPENERS = ("I'm sorry you're dealing with this.", "That sounds really hard.",
           "Thanks for sharing this, it can't have been easy to write.")
TEMPLATES = {
    "relationship": "Have an honest, calm conversation with your partner about {topic}, and tell "
                    "them how it makes you feel. If they won't listen, think about whether this "
                    "relationship is good for you.",
    "legal": "About {topic}: write down everything that happened and keep every document, and talk "
             "to a lawyer in your area before you do anything else.",
    "technology": "About {topic}: back up your files first, then update your drivers and software "
                  "and restart. If that doesn't help, contact the manufacturer's support.",
    "life": "About {topic}: talk to someone you trust, like a friend, family member or counselor, "
            "and take things one small step at a time.",
}


def templated_advice(situation: Situation) -> str:
  """The rule-based baseline: `{opener} {template}`, the template chosen by the subreddit's category
  (`life` for an unknown one) with the lowercased title as `{topic}`, and the opener picked from
  `OPENERS` by a checksum of the situation id (the same advice on every run)."""
  opener = OPENERS[zlib.crc32(situation.id.encode()) % len(OPENERS)]
  topic = situation.title.strip().rstrip("?!.").lower() or "this"
  template = TEMPLATES[CATEGORIES.get(situation.subreddit, "life")]
  return f"{opener} {template.format(topic=topic)}"


class TfidfRetrieval:
  """The retrieval baseline: the top advice of the training situation whose TF-IDF vector (title
  and text) has the highest cosine similarity; a situation never retrieves itself (same id)."""

  def __init__(self, train: Sequence[Situation]):
    from sklearn.feature_extraction.text import TfidfVectorizer
    if not train:
      raise ValueError("TF-IDF retrieval needs at least one training situation")
    self.train = list(train)
    self.vectorizer = TfidfVectorizer(sublinear_tf=True)
    self.matrix = self.vectorizer.fit_transform([_text(s) for s in self.train])

  def nearest(self, situations: Sequence[Situation]) -> list[int]:
    """Index in `train` of each situation's most similar training situation."""
    # Rows are L2-normalised, so the dot product is the cosine similarity.
    sim = (self.vectorizer.transform([_text(s) for s in situations]) @ self.matrix.T).toarray()
    ids = np.array([s.id for s in self.train])
    for i, s in enumerate(situations):
      sim[i, ids == s.id] = -1.0
    return [int(k) for k in sim.argmax(-1)]

  def __call__(self, situations: Sequence[Situation]) -> list[str]:
    return [self.train[k].top_advice.body for k in self.nearest(situations)]


def _text(s: Situation) -> str:
  return f"{s.title} {s.selftext}"
