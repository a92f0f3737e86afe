"""Finished human labels as comparison files that task=rm reads unchanged (and the binary
protocol's as binary feedback files that task=kto reads).

One record per label (a pair labelled by three people is three records, each naming its
`worker`, as in OpenAI's released comparisons); gold pairs and unfinished assignments are left
out. The pair keeps its A/B order, whatever side each labeler saw it on; a tie is kept
(`choice: null`; AlpacaEval's `preference: 1.5`) and so are the Likert ratings and the protocol's
other answers (`records`).
`<dir>/train.jsonl` and `<dir>/valid.jsonl` (AlpacaFarm's layout: `.json` arrays) by each pair's
split, plus `agreement.md`: the labeler report and Stiennon et al.'s agreement table. Gold pairs
qualify labelers: the labels of one who answered enough of them and agrees with too few are left
out (`unqualified`). In the binary layout each label is one `records.Feedback` (a thumbs up is
`label: true`), in `train.jsonl` and `valid.jsonl`.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

from rlhfjax.data import records
from rlhfjax.labeling import report
from rlhfjax.training import experiment


def to_record(row: Mapping, protocol: str) -> records.Comparison:
  """A `Store.labels()` row as a comparison record; its `batch` says a labeling round under
  `protocol` made it (what task=rm's report reads)."""
  answers = json.loads(row["answers"])
  extra = dict(answers.get("extra") or {})
  confidence = extra.pop("confidence", None)
  return records.Comparison(
      prompt=row["prompt"], response_a=row["response_a"], response_b=row["response_b"],
      choice=int(row["preference"] == 1.0), tie=row["preference"] == 0.5,
      annotator=row["labeler"], confidence=confidence,
      split="valid1" if row["split"] == "valid" else "train", policy_a=row["policy_a"],
      policy_b=row["policy_b"], id=row["prompt_id"], title=row["title"],
      subreddit=row["subreddit"], input=row["input"], batch=f"{records.LABELING_ROUND}: {protocol}",
      axes_a=answers.get("axes_a"), axes_b=answers.get("axes_b"),
      extra={**extra, "pair": row["uid"]})


def to_feedback(row: Mapping, protocol: str) -> records.Feedback:
  """A `Store.labels()` row of a one-response protocol as a binary feedback record (as
  `to_record`)."""
  return records.Feedback(
      prompt=row["prompt"], completion=row["response_a"], label=row["preference"] == 1.0,
      annotator=row["labeler"], split="valid1" if row["split"] == "valid" else "train",
      policy=row["policy_a"], id=row["prompt_id"], title=row["title"], subreddit=row["subreddit"],
      input=row["input"], batch=f"{records.LABELING_ROUND}: {protocol}",
      extra={**(json.loads(row["answers"]).get("extra") or {}), "item": row["uid"]})


def unqualified(stats: Mapping[str, Mapping[str, float]], min_agreement: float,
                min_gold_labels: int) -> list[str]:
  """Labelers who answered at least `min_gold_labels` gold pairs that have a right answer (gold
  ties do not count) and agree with fewer than `min_agreement` of them (`report.labelers` stats);
  labelers with fewer such answers are not judged yet."""
  return [name for name, s in stats.items() if s["gold_judged"] >= min_gold_labels
          and s["agreement_with_gold"] < min_agreement]


def export(rows: Sequence[Mapping], out_dir: str, layout: str, batch: str,
           min_gold_agreement: float = 0.0, min_gold_labels: int = 1) -> dict[str, Any]:
  """Writes the comparison files (binary feedback files for `layout` 'binary') and `agreement.md`
  atomically, leaving out the labels of `unqualified` labelers; returns the file paths and who was
  left out."""
  single = layout == records.BINARY
  js = report.judgements(rows, single)
  stats = report.labelers(js)
  left_out = unqualified(stats, min_gold_agreement, min_gold_labels)
  by_split: dict[str, list] = {"train": [], "valid": []}
  for r in rows:
    if r["gold"] is None and r["labeler"] not in left_out:
      c = (to_feedback if single else to_record)(r, batch)
      by_split["train" if c.split == "train" else "valid"].append(c)
  ext = ".json" if layout == "alpaca" else ".jsonl"
  paths = {split: os.path.join(out_dir, split + ext) for split in by_split}
  os.makedirs(out_dir, exist_ok=True)
  for split, labels in by_split.items():
    if single:
      records.write_binary(paths[split], labels)
    else:
      records.write(paths[split], labels, layout)
  dropped = (f"Left out of the export (agreement with gold below {100 * min_gold_agreement:.0f}% "
             f"on {min_gold_labels} or more gold pairs): {', '.join(left_out)}.\n\n"
             if left_out else "")
  text = ("# Human labels\n\n" + dropped + report.format_labelers(stats, single) +
          "\n\n## Agreement (Stiennon et al., Table 20): % ± standard error (pairs)\n\n" +
          report.format_table(*report.table(js)) + "\n")
  paths["agreement"] = os.path.join(out_dir, "agreement.md")
  experiment.write_text(paths["agreement"], text)
  return {**paths, "left_out": left_out,
          "labels": {split: len(labels) for split, labels in by_split.items()},
          "decisive": {split: sum(single or not c.tie for c in labels)
                       for split, labels in by_split.items()}}
