"""What the labels say about the labelers: agreement with each other and with gold pairs, position
and length bias, speed, and the pairwise agreement table of Stiennon et al. (Table 20) computed from
the real labels.

For admins only, `disagreements` lists the pairs whose labelers split, with their answers.

Preferences are in {0, 0.5, 1} (0: A, 1: B, 0.5: a tie) and two of them agree with probability
`1 - |p - q|`, as in `evaluation.agreement`. Labelers seldom share all pairs, so each cell of the
table is measured on the pairs both judges labelled, and says how many those were. One-response
labels (the binary protocol: 1 thumbs up, 0 down) agree the same way; position and length bias mean
nothing there, so those figures (and the judge that prefers the longer response) are left out and
each labeler's share of thumbs up is given instead.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import time
from typing import Mapping, Sequence

import numpy as np

from rlhfjax.evaluation import agreement
from rlhfjax.labeling import protocols

# Judges beside the labelers; labeler names have no spaces (`tasks.user`), so these never clash.
LONGER, GOLD = "longer response", "gold answer"


@dataclasses.dataclass(frozen=True)
class Judgement:
  """One finished label, as the reports need it."""

  labeler: str
  item: int
  preference: float  # In A/B order.
  swapped: bool  # A was shown on the right.
  gold: float | None
  words_a: int
  words_b: int
  created: float
  seconds: float | None = None
  single: bool = False  # One response judged alone (thumbs up 1, down 0), not a pair.


def judgements(rows: Sequence[Mapping], single: bool = False) -> list[Judgement]:
  """From `Store.labels()` rows (of a one-response protocol with `single`)."""
  return [Judgement(r["labeler"], r["item_id"], r["preference"],
                    bool(r["swapped"]) and not single, r["gold"], len(r["response_a"].split()),
                    len(r["response_b"].split()), r["created"], r["seconds"], single)
          for r in rows]


def _longer(j: Judgement) -> float:
  return float(agreement.prefer_higher(np.array([j.words_a]), np.array([j.words_b]))[0])


def labelers(js: Sequence[Judgement]) -> dict[str, dict[str, float]]:
  """Per labeler: labels, gold labels, agreement with the other labels of the same pairs and with
  gold (gold ties left out), how often a decisive label picks the left-shown response (0.5: no
  position bias) and the longer one (equal lengths left out), the share of one-response labels
  that are a thumbs up, and median seconds per label. A figure without data is NaN."""
  by_item = collections.defaultdict(list)
  for j in js:
    by_item[j.item].append(j)
  out = {}
  for name in sorted({j.labeler for j in js}):
    mine = [j for j in js if j.labeler == name]
    pairs, golds = [j for j in mine if j.gold is None], [j for j in mine if j.gold is not None]
    with_others = [np.mean([1 - abs(j.preference - o.preference) for o in by_item[j.item]
                            if o.labeler != name]) for j in pairs
                   if any(o.labeler != name for o in by_item[j.item])]
    shown_two = [j for j in mine if not j.single]
    decisive = [j for j in shown_two if j.preference != 0.5]
    left = [(j.preference == 1.0) == j.swapped for j in decisive]
    ups = [j.preference == 1.0 for j in mine if j.single]
    seconds = [j.seconds for j in mine if j.seconds is not None]
    out[name] = {
        "labels": float(len(pairs)), "gold_labels": float(len(golds)),
        # The gold answers agreement with gold is measured on: a gold tie has no right answer.
        "gold_judged": float(sum(j.gold != 0.5 for j in golds)),
        "agreement_with_others": float(np.mean(with_others)) if with_others else float("nan"),
        "agreement_with_gold": agreement.accuracy_against(
            np.array([j.preference for j in golds]), np.array([j.gold for j in golds]))
        if golds else float("nan"),
        "prefers_left": float(np.mean(left)) if left else float("nan"),
        "prefers_longer": agreement.accuracy_against(
            np.array([j.preference for j in shown_two]), np.array([_longer(j) for j in shown_two]))
        if shown_two else float("nan"),
        "thumbs_up": float(np.mean(ups)) if ups else float("nan"),
        "median_seconds": float(np.median(seconds)) if seconds else float("nan"),
    }
  return out


def table(js: Sequence[Judgement]) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
  """Stiennon et al.'s Table 20 from real labels: judges (the labelers, gold, and a heuristic that
  prefers the longer response) x judges -> mean agreement, its standard error and the number of
  pairs both judged. Gold judges only gold pairs; a pair's gold tie is left out; the longer-response
  judge judges pairs only."""
  prefs: dict[str, dict[int, float]] = collections.defaultdict(dict)
  for j in js:
    prefs[j.labeler][j.item] = j.preference
    if not j.single:
      prefs[LONGER][j.item] = _longer(j)
    if j.gold is not None and j.gold != 0.5:
      prefs[GOLD][j.item] = j.gold
  names = sorted(k for k in prefs if k not in (GOLD, LONGER)) + [
      k for k in (GOLD, LONGER) if k in prefs]
  n = len(names)
  mean, se, count = np.full((n, n), np.nan), np.full((n, n), np.nan), np.zeros((n, n), int)
  for a in range(n):
    for b in range(n):
      shared = prefs[names[a]].keys() & prefs[names[b]].keys()
      agree = np.array([1 - abs(prefs[names[a]][i] - prefs[names[b]][i]) for i in shared])
      count[a, b] = len(agree)
      if len(agree):
        mean[a, b] = agree.mean()
        se[a, b] = agree.std(ddof=1) / np.sqrt(len(agree)) if len(agree) > 1 else np.nan
  return names, mean, se, count


def format_table(names: Sequence[str], mean: np.ndarray, se: np.ndarray, count: np.ndarray) -> str:
  """Markdown: agreement in % ± standard error (pairs), '—' where two judges share no pair."""
  def cell(a: int, b: int) -> str:
    if count[a, b] == 0:
      return "—"
    err = f" ± {100 * se[a, b]:.1f}" if np.isfinite(se[a, b]) else ""
    return f"{100 * mean[a, b]:.0f}{err} ({count[a, b]})"
  lines = ["| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
  lines += [f"| {name} | " + " | ".join(cell(a, b) for b in range(len(names))) + " |"
            for a, name in enumerate(names)]
  return "\n".join(lines)


# The share columns of `labelers` (key, heading) for pairs and for one-response labels.
SHARES = {False: (("agreement_with_others", "agreement with others"),
                  ("agreement_with_gold", "agreement with gold"), ("prefers_left", "prefers left"),
                  ("prefers_longer", "prefers longer")),
          True: (("agreement_with_others", "agreement with others"),
                 ("agreement_with_gold", "agreement with gold"), ("thumbs_up", "thumbs up"))}


def format_labelers(stats: Mapping[str, Mapping[str, float]], single: bool = False) -> str:
  """Markdown of `labelers` (of one-response labels with `single`)."""
  pct = lambda v: "—" if np.isnan(v) else f"{100 * v:.1f}%"
  shares = SHARES[single]
  lines = ["| labeler | labels | gold labels | " + " | ".join(h for _, h in shares) +
           " | median s/label |", "|---" * (len(shares) + 4) + "|"]
  for name, s in stats.items():
    sec = "—" if np.isnan(s["median_seconds"]) else f"{s['median_seconds']:.1f}"
    lines.append(f"| {name} | {int(s['labels'])} | {int(s['gold_labels'])} | " +
                 " | ".join(pct(s[k]) for k, _ in shares) + f" | {sec} |")
  return "\n".join(lines)


def throughput(js: Sequence[Judgement], now: float | None = None) -> dict[str, float]:
  """Labels in the last minute and the last hour, and labels per hour since the first one."""
  now = time.time() if now is None else now
  created = np.array([j.created for j in js])
  hours = (now - created.min()) / 3600 if len(created) else 0.0
  return {"last_minute": float((created > now - 60).sum()),
          "last_hour": float((created > now - 3600).sum()),
          "per_hour": float(len(created) / hours) if hours > 0 else float("nan")}


def in_pair_order(preference: float, extra: Mapping[str, object], single: bool = False) -> str:
  """A label's answer in the pair's own A/B terms (what the admin compares across labelers): the
  9-point rating when there is one (`confidence`, 1: A definitely better), else A, B or tie; a
  one-response label's thumbs up or down."""
  if single:
    return "thumbs up" if preference == 1.0 else "thumbs down"
  rating = extra.get("confidence")
  if isinstance(rating, int) and 1 <= rating <= 9:  # The scale's words, left/right read as A/B.
    words = protocols.NINE[rating - 1][1]
    return f"{rating}: " + words.replace("left", "A").replace("right", "B")
  return {0.0: "A better", 0.5: "tie", 1.0: "B better"}[preference]


def disagreements(rows: Sequence[Mapping], single: bool = False) -> list[dict]:
  """Pairs (gold pairs aside; responses of a one-response protocol with `single`) whose labelers
  split: at least two labels whose preferences differ, the widest splits first. Each holds the
  pair's row and its `answers`: (labeler, the answer in A/B terms, the protocol's other answers)
  per label, and `labels`: every answer of each label (`label_answers`)."""
  by_item: dict[int, list[Mapping]] = collections.defaultdict(list)
  for r in rows:
    if r["gold"] is None:
      by_item[r["item_id"]].append(r)
  out = []
  for labels in by_item.values():
    prefs = [r["preference"] for r in labels]
    if len(set(prefs)) < 2:
      continue
    answers = []
    for r in labels:
      stored = json.loads(r["answers"])
      extra = {k: v for k, v in (stored.get("extra") or {}).items() if k != "confidence"}
      answers.append((r["labeler"],
                      in_pair_order(r["preference"], stored.get("extra") or {}, single), extra))
    out.append({"pair": labels[0], "answers": answers, "spread": max(prefs) - min(prefs),
                "labels": [label_answers(r, single) for r in labels]})
  out.sort(key=lambda d: (-d["spread"], d["pair"]["item_id"]))
  return out


def label_answers(row: Mapping, single: bool = False) -> dict:
  """Every answer of one stored label (a `Store.labels()` row) in the pair's A/B terms, for the
  admin: `labeler`; `answer` (`in_pair_order`); `preferred` (A, B or tie; thumbs up or down);
  `rating` (the 9-point rating in A/B order, None without one); `axes`: (question, answer for A,
  answer for B) per per-response question; `extra`: the protocol's other answers; `left`: the
  response the labeler saw on the left (A or B; None for one response, or a row without
  `swapped`)."""
  stored = json.loads(row["answers"])
  extra = stored.get("extra") or {}
  axes_a, axes_b = stored.get("axes_a") or {}, stored.get("axes_b") or {}
  rating = extra.get("confidence")
  if single:
    preferred = "thumbs up" if row["preference"] == 1.0 else "thumbs down"
  else:
    preferred = {0.0: "A", 0.5: "tie", 1.0: "B"}[row["preference"]]
  return {"labeler": row["labeler"], "answer": in_pair_order(row["preference"], extra, single),
          "preferred": preferred, "rating": rating if isinstance(rating, int) else None,
          "axes": [(q, axes_a.get(q), axes_b.get(q))
                   for q in sorted(axes_a.keys() | axes_b.keys(), key=_axis_order)],
          "extra": {k: v for k, v in extra.items() if k != "confidence"},
          "left": None if single or "swapped" not in row.keys() else (
              "B" if row["swapped"] else "A")}


def _axis_order(name: str) -> tuple[int, str]:
  """Per-response questions in the order the protocols ask them, others after, by name."""
  order = [q.name for p in protocols.PROTOCOLS.values() for q in p.per_response]
  return (order.index(name) if name in order else len(order), name)
