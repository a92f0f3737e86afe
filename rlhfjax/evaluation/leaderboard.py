"""task=eval: the leaderboard (AlpacaFarm Table 1 style) and the over-optimisation plot.

Every method in `eval.methods` has answered the same test prompts (`<workdir>/<method>/outputs.json`).
The judge `eval.annotator` (default: the evaluation pool, no label flips) compares each answer with
the reference summary (or, with `eval.against=<method>`, with that method's answer), in a random
order; the leaderboard gives the win-rate with its standard error and bootstrap 95% interval, the
length-controlled win-rates beside it (the judges favour longer answers): AlpacaEval 2's
(`lc_win_rate`, `lc_se`) and Stiennon et al.'s length-controlled preference (`stiennon_lc`,
`stiennon_lc_se`), each the win-rate a logistic regression on the length difference predicts for an
answer as long as the baseline's, with bootstrap standard errors over prompts (`length_control`),
the p-value of a paired test against SFT, the mean gold reward, the mean length and the KL to SFT.
Rows are sorted by the raw win-rate. It is written as `<workdir>/eval/leaderboard.{md,csv,json}`.
Real data has no gold reward and no simulated judge (`pipeline.has_gold`): there the rows have no
`gold` and `eval.annotator` is `rm` (the reward model, which the methods optimised, so a flattering
proxy) or `file:PATH` (judgements from a file).

`<workdir>/eval/overoptimization.png` plots RM score, gold reward and win-rate (those the curves
have) against KL for PPO
along training (its held-out evaluation points) and for best-of-N, N = 1, 2, 4, ..., for this
workdir and any in `eval.compare_runs` (a β sweep, the same pipeline with noiseless labels): the
reward model's score keeps rising with KL while the gold reward peaks and falls.
"""

from __future__ import annotations

import csv
import io
import json
import os
import zlib
from typing import Any

import numpy as np

from rlhfjax.data import pipeline
from rlhfjax.errors import ConfigError
from rlhfjax.evaluation import judges
from rlhfjax.evaluation import length_control
from rlhfjax.evaluation import winrate
from rlhfjax.feedback import annotators
from rlhfjax import files
from rlhfjax.rollout import outputs
from rlhfjax.simulated import gold
from rlhfjax.training import experiment
from rlhfjax.training import metrics as metrics_lib

NAMES = {"sft": "SFT", "ppo": "PPO", "best_of_n": "best-of-{n}", "expert_iteration": "expert iteration",
         "quark": "Quark", "feedme": "binary FeedME", "reward_conditioning": "binary reward conditioning",
         "dpo": "DPO", "simpo": "SimPO", "kto": "KTO", "rloo": "RLOO", "grpo": "GRPO",
         "dapo": "DAPO", "gspo": "GSPO", "dr_grpo": "Dr. GRPO", "reinforce_pp": "REINFORCE++", "online_dpo": "online DPO"}
# The online methods whose held-out points (`eval/*` in `<task>/metrics.jsonl`) make training curves,
# with the config key of each one's KL coefficient.
CURVES = {"ppo": "kl_coef", "rloo": "kl_coef", "grpo": "beta", "dapo": "beta", "gspo": "beta", "dr_grpo": "beta",
          "reinforce_pp": "kl_coef", "online_dpo": "beta"}
COLUMNS = ("method", "win_rate", "se", "ci_low", "ci_high", "lc_win_rate", "lc_se", "stiennon_lc",
           "stiennon_lc_se", "p_vs_sft", "gold", "length_words", "kl")
PANELS = (("rm_score", "reward model score"), ("gold", "gold reward"),
          ("win_rate", "win-rate vs reference (%)"))


def _label(method: str, stored: dict) -> str:
  return NAMES.get(method, method).format(**stored)


def _rng(exp: experiment.Experiment, method: str) -> np.random.Generator:
  """A method's own random stream: its row does not depend on which other methods are listed."""
  return np.random.default_rng([exp.config.seed, 13, zlib.crc32(method.encode())])


def baseline_texts(exp: experiment.Experiment) -> dict[str, str]:
  """What every method is compared with, by post id: the reference summaries
  (`eval.against='reference'`) or the answers of the method named by `eval.against`."""
  against = exp.config.eval.against
  if against == "reference":
    return {e.id: e.reference for e in exp.splits["test"]}
  return {o["id"]: o["output"] for o in outputs.load(exp.workdir, against)["outputs"]}


def length_controlled(wins: np.ndarray, texts: list[str], baseline: list[str],
                      rng: np.random.Generator) -> dict[str, float]:
  """The row's length-controlled win-rates (%) and their bootstrap standard errors, lengths in
  words."""
  lengths = [len(t.split()) for t in texts]
  ref_lengths = [len(t.split()) for t in baseline]
  lc = length_control.bootstrap(length_control.lc_win_rate, wins, lengths, ref_lengths, rng)
  st = length_control.bootstrap(length_control.stiennon_lc, wins, lengths, ref_lengths, rng)
  return {"lc_win_rate": lc["value"], "lc_se": lc["se"], "stiennon_lc": st["value"],
          "stiennon_lc_se": st["se"]}


def table(exp: experiment.Experiment, methods: list[str]) -> list[dict[str, Any]]:
  """One leaderboard row per method, sorted by raw win-rate; `gold` only where the test examples
  have it."""
  by_id = {e.id: e for e in exp.splits["test"]}
  baseline = baseline_texts(exp)
  name = exp.config.eval.annotator
  judge = judges.build(exp, "eval.annotator", name, exp.splits["test"])
  wins, rows, ids = {}, [], None
  for method in methods:
    rng = _rng(exp, method)
    stored = outputs.load(exp.workdir, method)
    these = [o["id"] for o in stored["outputs"]]
    if ids is None:
      ids = these
    elif these != ids:
      raise ConfigError(f"{outputs.path(exp.workdir, method)} answers other prompts than "
                        f"{outputs.path(exp.workdir, methods[0])}; rerun both with the same "
                        "eval.num_examples")
    missing = [i for i in these if i not in by_id or i not in baseline]
    if missing:
      raise ConfigError(f"{outputs.path(exp.workdir, method)}: prompt {missing[0]!r} is not in the "
                        f"test split of this configuration or has no answer from "
                        f"eval.against={exp.config.eval.against!r}")
    examples = [by_id[i] for i in these]
    texts = [o["output"] for o in stored["outputs"]]
    base_texts = [baseline[i] for i in these]
    wins[method] = annotators.wins_against(judge, examples, texts, base_texts, rng)
    row = {"method": _label(method, stored), **winrate.summarize(wins[method], rng),
           **length_controlled(wins[method], texts, base_texts, rng)}
    if pipeline.has_gold(examples):
      row["gold"] = float(gold.gold_rewards(examples, texts).mean())
    rows.append({**row, "length_words": float(np.mean([len(t.split()) for t in texts])),
                 "kl": float(stored["kl"]), "key": method})
  for row in rows:
    row["p_vs_sft"] = (winrate.paired_p_value(wins[row["key"]], wins["sft"], _rng(exp, row["key"]))
                       if "sft" in wins and row["key"] != "sft" else float("nan"))
  return sorted(rows, key=lambda r: -r["win_rate"])


def format_markdown(rows: list[dict[str, Any]], against: str = "reference") -> str:
  """The leaderboard as a Markdown table (with the gold column when the rows have gold): raw and
  length-controlled win-rates side by side, then the raw win-rate's 95% interval."""
  with_gold = all("gold" in r for r in rows)
  gold_head, gold_rule = ("gold reward | ", "---|") if with_gold else ("", "")
  lines = [f"| method | win-rate vs {against} (%) | LC win-rate (%) | Stiennon LC preference (%) | "
           f"95% interval (raw) | p vs SFT | {gold_head}length (words) | KL to SFT (nats) |",
           f"|---|---|---|---|---|---|{gold_rule}---|---|"]
  for r in rows:
    p = "" if np.isnan(r["p_vs_sft"]) else f"{r['p_vs_sft']:.3f}"
    g = f"{r['gold']:.3f} | " if with_gold else ""
    lines.append(f"| {r['method']} | {r['win_rate']:.1f} ± {r['se']:.1f} | "
                 f"{r['lc_win_rate']:.1f} ± {r['lc_se']:.1f} | "
                 f"{r['stiennon_lc']:.1f} ± {r['stiennon_lc_se']:.1f} | "
                 f"{r['ci_low']:.1f}–{r['ci_high']:.1f} | {p} | {g}"
                 f"{r['length_words']:.1f} | {r['kl']:.2f} |")
  return "\n".join(lines)


def format_csv(rows: list[dict[str, Any]]) -> str:
  """The leaderboard as CSV (`COLUMNS`, without `gold` when the rows have none)."""
  columns = [k for k in COLUMNS if k != "gold" or all("gold" in r for r in rows)]
  buf = io.StringIO()
  writer = csv.DictWriter(buf, columns, extrasaction="ignore", lineterminator="\n")
  writer.writeheader()
  writer.writerows(rows)
  return buf.getvalue()


def training_curve(workdir: str, task: str) -> list[dict[str, float]]:
  """The held-out evaluation points an online method logged in `<workdir>/<task>/metrics.jsonl`."""
  path = os.path.join(workdir, task, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  points = [{k[len("eval/"):]: v for k, v in m.items() if k.startswith("eval/")}
            for _, m in sorted(metrics_lib.read_jsonl(path).items())]
  return [p for p in points if "kl" in p]


def _kl_coef(workdir: str, task: str) -> str:
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    return str(json.load(f)[task][CURVES[task]])


def curves(exp: experiment.Experiment) -> dict[str, list[dict[str, float]]]:
  """The online methods' training curves (PPO, RLOO, GRPO, REINFORCE++, online DPO: those the
  workdir holds) and best-of-N's, of this workdir and of each workdir in `eval.compare_runs`."""
  out = {}
  for i, d in enumerate([exp.workdir] + [d for d in exp.config.eval.compare_runs.split(",") if d]):
    name = "" if i == 0 else f" · {os.path.basename(os.path.normpath(d))}"
    for task in CURVES:
      points = training_curve(d, task)
      if points:
        out[f"{NAMES[task]}{name} (β={_kl_coef(d, task)})"] = points
    bon_path = os.path.join(d, "best_of_n", "curve.json")
    if os.path.exists(bon_path):
      with open(bon_path, encoding="utf-8") as f:
        out[f"best-of-N{name}"] = json.load(f)
  return out


def plot(exp: experiment.Experiment, path: str) -> None:
  """RM score, gold reward and win-rate against KL for the online methods along training and
  best-of-N: one panel for each of them that the curves have (all three when there are none)."""
  lines = curves(exp)
  panels = [(k, t) for k, t in PANELS if any(k in p for ps in lines.values() for p in ps)]
  panels = panels or list(PANELS)
  # Imported here, not with the module: half a second at every start of the CLI.
  from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel
  fig = Figure(figsize=(13 * len(panels) / 3, 3.8))  # No pyplot: no global state, no backend.
  axes = np.atleast_1d(fig.subplots(1, len(panels)))
  for ax, (key, title) in zip(axes, panels):
    for name, points in lines.items():
      shown = [p for p in points if key in p]
      ax.plot([p["kl"] for p in shown], [p[key] for p in shown], "o-", ms=3, label=name)
    ax.set_xlabel("KL to SFT (nats)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  with files.atomic_open(path, "wb") as f:
    fig.savefig(f, format="png", dpi=120)


def run(config, workdir: str) -> list[dict[str, Any]]:
  exp = experiment.prepare(config, workdir)
  methods = [m.strip() for m in config.eval.methods.split(",") if m.strip()]
  if not methods:
    raise ConfigError("eval.methods is empty")
  rows = table(exp, methods)
  out = exp.task_dir("eval")
  md = format_markdown(rows, config.eval.against)
  experiment.write_text(f"{out}/leaderboard.md", md + "\n")
  experiment.write_text(f"{out}/leaderboard.csv", format_csv(rows))
  experiment.write_json(f"{out}/leaderboard.json", rows)
  plot(exp, f"{out}/overoptimization.png")
  metrics_lib.info(f"\nLeaderboard ({len(outputs.load(workdir, methods[0])['outputs'])} test "
                   f"prompts, judged by the evaluation pool against {config.eval.against}):\n"
                   f"{md}\n"
                   f"Over-optimisation plot: {out}/overoptimization.png")
  return rows
