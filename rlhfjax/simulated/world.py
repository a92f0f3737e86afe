"""The simulated TL;DR world: Reddit-style advice posts generated from latent situations.

A `Situation` holds the facts a good summary must carry — who posts (age, gender), the other party
(relation, age, gender), how long they have known each other, the main problem (the most severe of
the post's events; often a side complaint beside it), how the poster feels and what they ask — plus
distractor details (job, pet, city, hobby) that a summary should leave out. It is rendered as a
subreddit, a (usually vague) title, a post of 5–9 sentences whose first ones are background or
chatter, and a reference TL;DR as people write them (`HUMAN_NOISE`).

Example `i` of seed `s` is a pure function of `(s, i)`, so splits are disjoint index ranges and any
slice can be regenerated. Every word the world can write is listed by `vocabulary()`, which the gold
reward uses to spot broken text.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Mapping

import numpy as np

from rlhfjax.data import pipeline

# relation -> (category, gender of the other party or "" if either, subreddits)
RELATIONS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "girlfriend": ("romantic", "F", ("relationships", "relationship_advice")),
    "boyfriend": ("romantic", "M", ("relationships", "relationship_advice")),
    "wife": ("married", "F", ("relationships", "marriage")),
    "husband": ("married", "M", ("relationships", "marriage")),
    "best friend": ("friend", "", ("friendship", "relationship_advice")),
    "roommate": ("roommate", "", ("roommates", "offmychest")),
    "boss": ("work", "", ("jobs", "careerguidance")),
    "coworker": ("work", "", ("jobs", "work")),
    "mom": ("family", "F", ("family", "raisedbynarcissists")),
    "dad": ("family", "M", ("family", "raisedbynarcissists")),
    "sister": ("family", "F", ("family", "relationship_advice")),
    "brother": ("family", "M", ("family", "relationship_advice")),
}

# Events: id -> (categories, reference phrase, post phrasings, detection keyword groups).
# Phrases use {he} {him} {his} for the other party. An event is mentioned when every keyword group
# has a word in the summary.
_ALL = ("romantic", "married", "friend", "roommate", "work", "family")
_CLOSE = ("romantic", "married")
EVENTS: dict[str, tuple[tuple[str, ...], str, tuple[str, ...], tuple[tuple[str, ...], ...]]] = {
    "lied_money": (_ALL, "lied about money",
                   ("{he} lied to me about money again", "I found out {he} has been lying about money",
                    "{he} keeps lying to me about money"),
                   (("lied", "lying", "lies", "lie"), ("money",))),
    "forgot_birthday": (_ALL, "forgot my birthday",
                        ("{he} completely forgot my birthday last week",
                         "my birthday came and {he} forgot it", "{he} forgot my birthday this year"),
                        (("forgot", "forget", "forgotten", "forgets"), ("birthday",))),
    "reads_texts": (_CLOSE + ("family", "roommate"), "reads my texts",
                    ("I caught {him} reading my texts", "{he} goes through my phone and reads my texts",
                     "{he} reads my texts when I am asleep"),
                    (("read", "reads", "reading"), ("texts", "messages"))),
    "cheated": (_CLOSE, "cheated on me",
                ("I found out {he} cheated on me", "{he} admitted that {he} cheated on me",
                 "a friend told me {he} cheated on me"),
                (("cheated", "cheating", "cheat", "cheats"),)),
    "ignores_me": (_ALL, "ignores me",
                   ("{he} ignores me for days at a time", "lately {he} just ignores me",
                    "{he} has been ignoring me for weeks"),
                   (("ignores", "ignoring", "ignored", "ignore"),)),
    "yells": (_ALL, "yells at me",
              ("{he} yells at me over small things", "{he} yelled at me in front of everyone",
               "{he} keeps yelling at me"),
              (("yells", "yelled", "yelling", "yell"),)),
    "no_rent": (("roommate",), "won't pay rent",
                ("{he} refuses to pay {his} share of the rent", "{he} has not paid rent on time",
                 "{he} keeps making excuses about the rent"),
                (("rent",),)),
    "dishes": (("roommate", "married", "romantic"), "leaves dirty dishes everywhere",
               ("{he} leaves dirty dishes everywhere", "there are always dirty dishes {he} left",
                "{he} never washes {his} dishes"),
               (("dishes",),)),
    "loud_music": (("roommate",), "plays loud music at night",
                   ("{he} plays loud music at night", "{he} blasts music late at night",
                    "every night {he} plays music really loud"),
                   (("music",),)),
    "eats_food": (("roommate", "family"), "eats my food",
                  ("{he} eats my food without asking", "my food keeps going missing and {he} ate it",
                   "{he} keeps eating my food"),
                  (("eats", "eating", "ate", "eat"), ("food",))),
    "took_credit": (("work",), "took credit for my work",
                    ("{he} took credit for my work in a meeting",
                     "{he} presented my project and took the credit",
                     "{he} keeps taking credit for my work"),
                    (("credit",),)),
    "denied_raise": (("work",), "denied my raise",
                     ("{he} denied my raise again", "I asked for a raise and {he} said no",
                      "{he} refused to give me a raise"),
                     (("raise",),)),
    "overtime": (("work",), "makes me work overtime",
                 ("{he} makes me work overtime every week", "{he} keeps asking me to work overtime",
                  "I have to work overtime because of {him}"),
                 (("overtime",),)),
    "gossips": (("work", "friend", "family"), "gossips about me",
                ("{he} gossips about me behind my back", "I heard {he} was gossiping about me",
                 "{he} spreads gossip about me"),
                (("gossips", "gossiping", "gossip", "gossiped"),)),
    "borrowed": (("friend", "family", "roommate"), "borrowed money and never paid it back",
                 ("{he} borrowed money from me and never paid it back",
                  "{he} still owes me the money {he} borrowed", "{he} borrowed money and forgot about it"),
                 (("borrowed", "borrows", "borrowing", "borrow"),)),
    "cancels_plans": (("friend", "romantic"), "cancels plans last minute",
                      ("{he} always cancels our plans last minute", "{he} cancelled our plans again",
                       "{he} keeps cancelling plans at the last minute"),
                      (("cancels", "cancelled", "cancelling", "cancel"), ("plans",))),
    "weight": (("family", "romantic", "married"), "comments on my weight",
               ("{he} makes comments about my weight", "{he} keeps bringing up my weight",
                "{he} said something mean about my weight"),
               (("weight",),)),
    "wedding": (("family", "friend"), "did not invite me to the wedding",
                ("{he} did not invite me to the wedding", "I was not invited to the wedding by {him}",
                 "{he} left me out of the wedding"),
                (("wedding",),)),
    "secret": (("friend", "family", "work"), "told everyone my secret",
               ("{he} told everyone my secret", "{he} shared a secret I told {him}",
                "my secret got out because {he} told people"),
               (("secret",),)),
    "games": (_CLOSE, "plays video games all night",
              ("{he} plays video games all night", "{he} spends every night on video games",
               "{he} stays up playing games all night"),
              (("games",),)),
    "flirts": (_CLOSE, "flirts with other people",
               ("{he} flirts with other people in front of me", "I saw {him} flirting with other people",
                "{he} keeps flirting with other people"),
               (("flirts", "flirting", "flirted", "flirt"),)),
    "chores": (_CLOSE + ("roommate",), "never helps with chores",
               ("{he} never helps with chores", "I do all the chores and {he} does nothing",
                "{he} refuses to help with the chores"),
               (("chores",),)),
    "compares": (("family",), "compares me to my cousin",
                 ("{he} always compares me to my cousin", "{he} keeps comparing me to my cousin",
                  "{he} compared me to my cousin again"),
                 (("compares", "comparing", "compared", "compare"),)),
    "graduation": (("family", "friend"), "skipped my graduation",
                   ("{he} skipped my graduation", "{he} did not show up to my graduation",
                    "{he} missed my graduation for no reason"),
                   (("graduation",),)),
    "drinks": (_CLOSE + ("family",), "drinks too much",
               ("{he} drinks too much", "{he} has been drinking every night",
                "{he} gets drunk most weekends"),
               (("drinks", "drinking", "drunk", "drink"),)),
    "ex": (_CLOSE, "still talks to an ex",
           ("{he} still talks to an ex", "I found out {he} texts an ex every day",
            "{he} is still in contact with an ex"),
           (("ex",),)),
    "fire_threat": (("work",), "threatened to fire me",
                    ("{he} threatened to fire me", "{he} said {he} would fire me",
                     "{he} keeps threatening to fire me"),
                    (("fire", "fired", "firing"),)),
    "guests": (("roommate",), "brings guests over without asking",
               ("{he} brings guests over without asking", "{he} has guests over every night",
                "{he} invites guests over without telling me"),
               (("guests",),)),
}

# How much each event matters to the poster, mildest first: a fixed property a reader weighs. A
# post's main problem is its most severe event; the others are side complaints (`Situation.main_event`).
SEVERITY: tuple[str, ...] = (
    "dishes", "loud_music", "games", "chores", "guests", "eats_food", "overtime", "cancels_plans",
    "forgot_birthday", "compares", "weight", "ignores_me", "gossips", "no_rent", "borrowed",
    "denied_raise", "graduation", "wedding", "reads_texts", "drinks", "yells", "ex", "flirts",
    "took_credit", "secret", "lied_money", "fire_threat", "cheated")

FEELINGS = ("hurt", "angry", "confused", "betrayed", "anxious", "sad", "frustrated", "exhausted")
_FEELING_POST = ("I feel so {f} right now.", "Honestly I am really {f} about all of this.",
                 "I'm {f} and I don't know what to think.", "I have been feeling {f} all week.")

# Questions: id -> (reference question by category, detection keywords).
_END = {"romantic": "Should I break up with {him}?", "married": "Should I ask for a divorce?",
        "friend": "Should I cut {him} off?", "family": "Should I cut {him} off?",
        "roommate": "Should I move out?", "work": "Should I quit?"}
QUESTIONS: dict[str, tuple[dict[str, str] | str, tuple[str, ...]]] = {
    "end": (_END, ("break", "divorce", "cut", "move", "quit")),
    "confront": ("How do I confront {him}?", ("confront",)),
    "forgive": ("Should I forgive {him}?", ("forgive",)),
    "talk": ("How do I talk to {him} about it?", ("talk",)),
    "overreacting": ("Am I overreacting?", ("overreacting",)),
}
# What people ask when they do not restate the post's own question (no word of `QUESTIONS`).
GENERIC_QUESTIONS = ("What should I do?", "Any advice?", "What do I do now?")
# Sentences people open a TL;DR with that carry no fact.
FILLER = ("Long story short.", "It has been a rough few weeks.", "Not sure what to do anymore.")
TWO_EVENTS = 0.75  # The share of posts with a side complaint beside the main problem.
_QUESTION_POST = ("{q}", "What should I do? {q}", "{q} Any advice is welcome.",
                  "I need advice. {q}")

# Distractors: kind -> (post templates, values). Values are what the gold reward looks for.
DISTRACTORS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "job": (("I work as a {x} so my hours are long.", "For context I am a {x}."),
            ("nurse", "teacher", "cashier", "programmer", "waiter", "mechanic", "student")),
    "pet": (("We have a cat named {x}.", "My dog {x} is the only one keeping me sane."),
            ("milo", "luna", "bella", "max", "oscar", "daisy")),
    "city": (("We live in {x}.", "I moved to {x} last year."),
             ("denver", "chicago", "boston", "seattle", "austin", "toronto")),
    "hobby": (("I like {x} on weekends.", "My main hobby is {x}."),
              ("hiking", "painting", "cooking", "gaming", "running", "reading")),
}

_OPENINGS = ("Throwaway because people I know follow my main.", "Long time lurker, first post.",
             "Sorry for the formatting, I am on mobile.", "Not sure if this is the right place.")
_TITLES = ("Need advice about my {rel}", "Not sure what to do anymore", "Is this normal?",
           "Help please", "Am I in the wrong here?", "What would you do?",
           "My {rel} and I need help", "Feeling lost")
_PRONOUNS = {"M": {"he": "he", "him": "him", "his": "his", "He": "He"},
             "F": {"he": "she", "him": "her", "his": "her", "He": "She"}}
_WORD = re.compile(r"[a-z0-9']+")


@dataclasses.dataclass(frozen=True)
class Situation:
  poster_age: int
  poster_gender: str
  relation: str
  other_age: int
  other_gender: str
  duration: str  # "" for family, where it is not a fact worth stating.
  events: tuple[str, ...]
  feeling: str
  question: str
  distractors: tuple[tuple[str, str], ...]  # (kind, value)

  @property
  def category(self) -> str:
    return RELATIONS[self.relation][0]

  @property
  def main_event(self) -> str:
    """The post's main problem: its most severe event (`SEVERITY`)."""
    return max(self.events, key=SEVERITY.index)


def _fill(text: str, gender: str, **kw: str) -> str:
  return text.format(**_PRONOUNS[gender], **kw)


def _capitalise(s: str) -> str:
  return s[0].upper() + s[1:]


def _age(age: int, gender: str) -> str:
  return f"({age}{gender})"


def sample_situation(rng: np.random.Generator) -> Situation:
  relation = list(RELATIONS)[rng.integers(len(RELATIONS))]
  category, gender, _ = RELATIONS[relation]
  other_gender = gender or ("M", "F")[rng.integers(2)]
  poster_age = int(rng.integers(18, 46))
  offsets = {"family": (-8, 9) if relation in ("sister", "brother") else (20, 31),
             "work": (-3, 15)}
  lo, hi = offsets.get(category, (-4, 6))
  other_age = int(np.clip(poster_age + rng.integers(lo, hi), 16, 79))
  if relation in ("mom", "dad"):
    other_age = max(other_age, poster_age + 18)
  duration = ""
  if category != "family":
    n = int(rng.integers(2, 12))
    duration = f"{n} months" if rng.random() < 0.4 else f"{n} years"
  pool = [e for e, spec in EVENTS.items() if category in spec[0]]
  n_events = 1 + int(rng.random() < TWO_EVENTS)
  events = tuple(pool[i] for i in rng.choice(len(pool), n_events, replace=False))
  kinds = list(DISTRACTORS)
  picked = rng.choice(len(kinds), int(rng.integers(1, 4)), replace=False)
  distractors = tuple((kinds[i], DISTRACTORS[kinds[i]][1][rng.integers(len(DISTRACTORS[kinds[i]][1]))])
                      for i in sorted(picked))
  return Situation(poster_age, ("M", "F")[rng.integers(2)], relation, other_age, other_gender,
                   duration, events, FEELINGS[rng.integers(len(FEELINGS))],
                   list(QUESTIONS)[rng.integers(len(QUESTIONS))], distractors)


def question_text(s: Situation) -> str:
  q = QUESTIONS[s.question][0]
  q = q[s.category] if isinstance(q, dict) else q
  return _fill(q, s.other_gender)


def _background(s: Situation, rng: np.random.Generator) -> str:
  me, them = _age(s.poster_age, s.poster_gender), _age(s.other_age, s.other_gender)
  rel = s.relation
  if s.category == "family":
    forms = (f"I {me} have always been close to my {rel} {them}.",
             f"My {rel} {them} and I {me} used to get along fine.",
             f"I {me} still talk to my {rel} {them} most days.")
  else:
    together = {"romantic": "been together", "married": "been married", "friend": "been friends",
                "roommate": "lived together", "work": "worked together"}[s.category]
    forms = (f"I {me} and my {rel} {them} have {together} for {s.duration}.",
             f"My {rel} {them} and I {me} have {together} for {s.duration}.",
             f"I {me} have known my {rel} {them} for {s.duration}.")
  return forms[rng.integers(len(forms))]


# How people's TL;DRs differ from the ideal one, at `reference_noise=1` (each probability is scaled by
# it). They are good summaries but not gold-optimal on every axis, and not in a way that makes the
# better choice the likelier one: a side complaint is mentioned beside the main problem (`both`) or
# instead of it (`side_only`), the specific question becomes a generic one, a filler sentence or a
# distractor is added, the feeling or the poster's age left out. What the gold reward weighs is then
# not what the supervised model's likelihood prefers, and length is not coverage: it is what
# comparisons teach beyond imitation (Stiennon et al. 2020, Table 20).
HUMAN_NOISE = {"both": 0.45, "side_only": 0.2, "generic_question": 0.55, "filler": 0.4,
               "distractor": 0.5, "feeling": 0.5, "poster_age": 0.4}


# The departures drawn independently of each other and of which events are kept.
_DEPARTURES = ("generic_question", "filler", "distractor", "feeling", "poster_age")


def _reference(s: Situation, rng: np.random.Generator, noise: float) -> str:
  """A TL;DR in one of a few templates; with `noise` > 0 it departs from the ideal as people do."""
  u, *draws = rng.random(1 + len(_DEPARTURES))
  main = s.main_event
  side = [e for e in s.events if e != main]
  if side and u < noise * HUMAN_NOISE["side_only"]:
    kept = side
  elif side and u < noise * (HUMAN_NOISE["side_only"] + HUMAN_NOISE["both"]):
    kept = list(s.events)
  else:
    kept = [main]
  departs = {k: x < noise * HUMAN_NOISE[k] for k, x in zip(_DEPARTURES, draws)}
  events = " and ".join(_fill(EVENTS[e][1], s.other_gender) for e in kept)
  me = "" if departs["poster_age"] else " " + _age(s.poster_age, s.poster_gender)
  them = _age(s.other_age, s.other_gender)
  of = f" of {s.duration}" if s.duration else ""
  if departs["feeling"]:
    forms = (f"My{me} {s.relation} {them}{of} {events}.",)
  else:
    forms = (f"My{me} {s.relation} {them}{of} {events}. I feel {s.feeling}.",
             f"I{me} feel {s.feeling} because my {s.relation} {them}{of} {events}.",
             f"My {s.relation} {them}{of} {events} and I{me} feel {s.feeling}.")
  parts = [FILLER[rng.integers(len(FILLER))]] if departs["filler"] else []
  parts.append(forms[rng.integers(len(forms))])
  if departs["distractor"]:
    kind, value = s.distractors[0]
    parts.append(_DISTRACTOR_REF[kind].format(x=value))
  parts.append(GENERIC_QUESTIONS[rng.integers(len(GENERIC_QUESTIONS))]
               if departs["generic_question"] else question_text(s))
  return " ".join(parts)


_DISTRACTOR_REF = {"job": "I am a {x}.", "pet": "I have a pet named {x}.", "city": "We live in {x}.",
                   "hobby": "I like {x}."}


def ideal_reference(example: pipeline.Tldr) -> str:
  """The reference a careful writer would give: every key fact of the main problem, its own
  question, nothing else (gold 1.0)."""
  return _reference(example.situation, np.random.default_rng(0), 0.0)


def render(s: Situation, rng: np.random.Generator,
           reference_noise: float = 1.0) -> tuple[str, str, str, str]:
  """(subreddit, title, post, reference) for a situation."""
  subs = RELATIONS[s.relation][2]
  subreddit = subs[rng.integers(len(subs))]
  if rng.random() < 0.2:
    title = _capitalise(f"my {s.relation} " + _fill(EVENTS[s.events[0]][1], s.other_gender))
  else:
    title = _TITLES[rng.integers(len(_TITLES))].format(rel=s.relation)
  names = ("pet", "city")  # Proper nouns are capitalised in the post.
  distract = [DISTRACTORS[k][0][rng.integers(2)].format(x=v.capitalize() if k in names else v)
              for k, v in s.distractors]
  events = []
  for e in s.events:
    forms = EVENTS[e][2]
    events.append(_capitalise(_fill(forms[rng.integers(len(forms))], s.other_gender)) + ".")
  head = [_OPENINGS[rng.integers(len(_OPENINGS))]] if rng.random() < 0.5 else []
  body = [_background(s, rng)]
  # Distractors go early (as chatter does on Reddit), with at most one among the events.
  early = distract[: max(1, len(distract) - 1)]
  late = distract[len(early):]
  body += early + events[:1] + late + events[1:]
  feeling = _FEELING_POST[rng.integers(len(_FEELING_POST))].format(f=s.feeling)
  ask = _QUESTION_POST[rng.integers(len(_QUESTION_POST))].format(q=question_text(s))
  post = " ".join(head + body + [feeling, ask])
  return subreddit, title, post, _reference(s, rng, reference_noise)


def generate(seed: int, start: int, count: int,
             reference_noise: float = 1.0) -> list[pipeline.Tldr]:
  """Examples `start .. start + count - 1` of the world with this seed; `reference_noise` scales
  how often the human references miss or add details (0: ideal references)."""
  out = []
  for i in range(start, start + count):
    rng = np.random.default_rng([seed, i])
    s = sample_situation(rng)
    subreddit, title, post, reference = render(s, rng, reference_noise)
    out.append(pipeline.Tldr(f"sim-{seed}-{i}", subreddit, title, post, reference, s))
  return out


def make_splits(seed: int, sizes: Mapping[str, int],
                reference_noise: float = 1.0) -> dict[str, list[pipeline.Tldr]]:
  """Consecutive, disjoint index ranges in the order of `sizes`. The last world made is kept for
  the process (every stage of a run prepares the same one; the examples are frozen), and each call
  returns new lists."""
  splits = _splits(int(seed), tuple((name, int(n)) for name, n in sizes.items()),
                   float(reference_noise))
  return {name: list(examples) for name, examples in splits.items()}


@functools.lru_cache(maxsize=1)
def _splits(seed: int, sizes: tuple[tuple[str, int], ...],
            reference_noise: float) -> dict[str, tuple[pipeline.Tldr, ...]]:
  out, start = {}, 0
  for name, n in sizes:
    out[name] = tuple(generate(seed, start, n, reference_noise))
    start += n
  return out


def sentences(text: str) -> list[str]:
  """Splits after . ! or ? followed by a space (how posts and references are written)."""
  return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


def extractive_baselines(example: pipeline.Tldr) -> dict[str, str]:
  sents = sentences(example.post)
  return {"title": example.title, "lead1": sents[0], "lead2": " ".join(sents[:2])}


def _replace_word(text: str, old: str, new: str) -> str:
  return re.sub(rf"\b{re.escape(old)}\b", new, text, count=1)


def reverse_roles(example: pipeline.Tldr) -> str:
  """The reference with the two parties' age/gender tags swapped."""
  s = example.situation
  a, b = _age(s.poster_age, s.poster_gender), _age(s.other_age, s.other_gender)
  return example.reference.replace(a, "\0").replace(b, a).replace("\0", b)


def shuffle_facts(example: pipeline.Tldr, rng: np.random.Generator) -> str:
  """The reference with facts mixed up: the two parties' ages swapped and an event replaced."""
  s = example.situation
  ref = reverse_roles(example)
  pool = [e for e, spec in EVENTS.items() if s.category in spec[0] and e not in s.events]
  other = _fill(EVENTS[pool[rng.integers(len(pool))]][1], s.other_gender)
  for e in reversed(s.events):  # The last event the reference mentions.
    old = _fill(EVENTS[e][1], s.other_gender)
    if old in ref:
      return ref.replace(old, other, 1)
  return ref


def wrong_relation(example: pipeline.Tldr, rng: np.random.Generator) -> str:
  s = example.situation
  others = [r for r in RELATIONS if r != s.relation]
  return _replace_word(example.reference, s.relation, others[rng.integers(len(others))])


def repeat_text(example: pipeline.Tldr) -> str:
  first = sentences(example.reference)[0]
  return f"{example.reference} {first} {first}"


def _texts() -> list[str]:
  """Every template and value the world draws words from."""
  out = list(_OPENINGS) + list(_TITLES) + list(_FEELING_POST) + list(_QUESTION_POST) + list(FEELINGS)
  out += list(_DISTRACTOR_REF.values()) + list(GENERIC_QUESTIONS) + list(FILLER)
  out += list(RELATIONS) + [s for spec in RELATIONS.values() for s in spec[2]]
  for cats, ref, posts, _ in EVENTS.values():
    out += [ref, *posts]
  for q, _ in QUESTIONS.values():
    out += list(q.values()) if isinstance(q, dict) else [q]
  for forms, values in DISTRACTORS.values():
    out += list(forms) + list(values)
  out += [w for p in _PRONOUNS.values() for w in p.values()]
  out += ["i have always been close to my still talk most days used to get along fine and",
          "been together married friends lived worked known for months years of because feel",
          "my i"]
  return out


@functools.lru_cache(maxsize=1)
def vocabulary() -> frozenset[str]:
  """All lowercased words the world can write (numbers and age tokens included)."""
  words = set()
  for t in _texts():
    words.update(_WORD.findall(re.sub(r"\{[a-z]+\}", " ", t).lower()))
  words.update(str(n) for n in range(1, 80))
  words.update(f"{n}{g}" for n in range(16, 80) for g in "mf")
  return frozenset(words)
