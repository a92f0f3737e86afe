"""task=seeds: the pipeline once per run seed, and its leaderboard as mean ± sd across the seeds.

  python -m rlhfjax.main --config configs/tldr_sim.py --workdir runs/tldr_sim_seeds \\
      --config.task=seeds --config.seeds.run_seeds=0,1,2

Each seed s of `seeds.run_seeds` runs `config.stages` in `<workdir>/seed_<s>` with `config.seed=s`,
which draws the model's initialisation, the batch order, every sample (SFT outputs, comparison
pairs, best-of-N candidates, PPO rollouts), the annotators' label draws and the judge's draws on
the leaderboard. The simulated world (test set included) and the annotator pool stay those of
`data.seed` and `annotators.seed`, so the methods of all seeds are judged on the same prompts;
`seeds.world` sets both to s as well. A rerun resumes each seed's pipeline as in a single workdir:
finished training runs and labels are reused; sampling the outputs, best-of-N and task=eval redo.

`<workdir>/seeds/summary.{md,json}`: per method, the mean, sample standard deviation and per-seed
values of its leaderboard numbers, and for every pair of methods and each of win-rate,
length-controlled win-rate (when the rows have it) and gold reward, in how many seeds the one ahead
more often is ahead: the orderings that hold in every seed and those that do not.
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any, Callable, Mapping, Sequence

import ml_collections
import numpy as np

from rlhfjax.errors import ConfigError, DataError
from rlhfjax.training import experiment
from rlhfjax.training import metrics as metrics_lib

# Leaderboard numbers averaged over seeds, each where every seed's row has it (the mean `se`, the
# judge's noise within a seed, is the yardstick for the sd between seeds).
METRICS = ("win_rate", "se", "lc_win_rate", "lc_se", "stiennon_lc", "stiennon_lc_se", "gold",
           "length_words", "kl")
# Numbers (higher is better) by which pairs of methods are ordered in each seed.
ORDERED_BY = {"win_rate": "win-rate", "lc_win_rate": "LC win-rate", "gold": "gold"}
# The summary table's columns: metric, heading, decimals.
COLUMNS = (("win_rate", "win-rate vs {against} (%)", 1), ("lc_win_rate", "LC win-rate (%)", 1),
           ("gold", "gold reward", 3), ("kl", "KL to SFT (nats)", 2))

Board = Sequence[Mapping[str, Any]]  # One seed's `eval/leaderboard.json`: a row per method.


def parse_seeds(text: str) -> list[int]:
  """The run seeds in `seeds.run_seeds` ('0,1,2'): distinct non-negative integers, at least two
  (a standard deviation needs two)."""
  seeds = []
  for value in text.split(","):
    try:
      seeds.append(int(value))
    except ValueError:
      raise ConfigError(f"seeds.run_seeds: {value.strip()!r} is not an integer") from None
    if seeds[-1] < 0:
      raise ConfigError(f"seeds.run_seeds: seed {seeds[-1]} is negative")
  if len(set(seeds)) < len(seeds):
    raise ConfigError(f"seeds.run_seeds: {text!r} repeats a seed")
  if len(seeds) < 2:
    raise ConfigError(f"seeds.run_seeds: {text!r} is one seed; a standard deviation needs two")
  return seeds


def seed_config(config: ml_collections.ConfigDict, seed: int,
                world: bool) -> ml_collections.ConfigDict:
  """`config` as the pipeline of run seed `seed` (with `world`: in that world and pool too)."""
  c = config.copy_and_resolve_references()
  c.task = "pipeline"
  c.seed = seed
  if world:
    c.data.seed = seed
    c.annotators.seed = seed
  return c


def seed_dir(workdir: str, seed: int) -> str:
  return os.path.join(workdir, f"seed_{seed}")


def read_board(path: str) -> list[dict[str, Any]]:
  """A seed's leaderboard rows; a missing file is named with the stage that writes it."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} is missing after that seed's pipeline; config.stages must "
                            "include eval")
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _by_key(boards: Mapping[int, Board]) -> dict[int, dict[str, Mapping[str, Any]]]:
  """Each seed's rows by method key; every seed must rank the same methods."""
  by_seed = {s: {r["key"]: r for r in rows} for s, rows in boards.items()}
  first, *rest = by_seed
  for s in rest:
    if set(by_seed[s]) != set(by_seed[first]):
      raise DataError(f"seed {s}'s leaderboard ranks {sorted(by_seed[s])}, seed {first}'s "
                      f"{sorted(by_seed[first])}")
  return by_seed


def aggregate(boards: Mapping[int, Board]) -> list[dict[str, Any]]:
  """Per method, by mean win-rate: its `key`, its label (`method`) and, for each of `METRICS` that
  every seed's row has, the mean, sample sd (ddof=1) and per-seed values (in `boards`' order)."""
  by_seed = _by_key(boards)
  entries = []
  for key, first in next(iter(by_seed.values())).items():
    rows = [seed_rows[key] for seed_rows in by_seed.values()]
    entry: dict[str, Any] = {"key": key, "method": first["method"]}
    for m in METRICS:
      if all(m in r for r in rows):
        values = [float(r[m]) for r in rows]
        entry[m] = {"mean": float(np.mean(values)), "sd": float(np.std(values, ddof=1)),
                    "values": values}
    entries.append(entry)
  return sorted(entries, key=lambda e: -e["win_rate"]["mean"])


def orderings(boards: Mapping[int, Board], keys: Sequence[str]) -> list[dict[str, Any]]:
  """For every pair of `keys` and each of `ORDERED_BY` that both rows have in every seed: the method
  ahead in more seeds (`better`; on a draw the higher mean), in how many seeds it is ahead
  (`seeds`), behind (`against`) or level (`ties`), of how many (`of`)."""
  by_seed = _by_key(boards)
  label = {k: r["method"] for k, r in next(iter(by_seed.values())).items()}
  out = []
  for a, b in itertools.combinations(keys, 2):
    for m in ORDERED_BY:
      if not all(m in rows[k] for rows in by_seed.values() for k in (a, b)):
        continue
      diff = np.array([rows[a][m] - rows[b][m] for rows in by_seed.values()], np.float64)
      ahead, behind = int(np.sum(diff > 0)), int(np.sum(diff < 0))
      flip = behind > ahead or (behind == ahead and diff.mean() < 0)
      better, worse = (b, a) if flip else (a, b)
      out.append({"metric": m, "better": label[better], "worse": label[worse],
                  "better_key": better, "worse_key": worse, "seeds": max(ahead, behind),
                  "against": min(ahead, behind), "ties": len(diff) - ahead - behind,
                  "of": len(diff)})
  return out


def format_table(entries: Sequence[Mapping[str, Any]], against: str = "reference") -> str:
  """The methods as a Markdown table of mean ± sd (the `COLUMNS` every entry has) and the per-seed
  win-rates."""
  shown = [(m, head.format(against=against), d) for m, head, d in COLUMNS
           if all(m in e for e in entries)]
  lines = ["| method | " + " | ".join(f"{head}, mean ± sd" for _, head, _ in shown)
           + " | per-seed win-rates (%) |", "|---|" + "---|" * (len(shown) + 1)]
  for e in entries:
    cells = [f"{e[m]['mean']:.{d}f} ± {e[m]['sd']:.{d}f}" for m, _, d in shown]
    per_seed = ", ".join(f"{v:.1f}" for v in e["win_rate"]["values"])
    lines.append(f"| {e['method']} | " + " | ".join(cells) + f" | {per_seed} |")
  return "\n".join(lines)


def format_orderings(orders: Sequence[Mapping[str, Any]]) -> str:
  """The orderings as two Markdown lists: those that hold in every seed, then the others (a pair
  level in every seed among them)."""
  def line(o: Mapping[str, Any]) -> str:
    by = ORDERED_BY[o["metric"]]
    if o["ties"] == o["of"]:
      return f"- {o['better']} = {o['worse']} by {by} in all {o['of']} seeds"
    text = f"- {o['better']} > {o['worse']} by {by} in {o['seeds']}/{o['of']} seeds"
    return text if o["seeds"] == o["of"] else f"{text} ({o['against']} reversed, {o['ties']} tied)"

  held = [line(o) for o in orders if o["seeds"] == o["of"]]
  other = [line(o) for o in orders if o["seeds"] < o["of"]]
  return "\n".join(["Orderings that hold in every seed:", *(held or ["- none"]), "",
                    "Orderings that do not:", *(other or ["- none"])])


def format_summary(entries: Sequence[Mapping[str, Any]], orders: Sequence[Mapping[str, Any]],
                   seeds: Sequence[int], world: bool, against: str = "reference") -> str:
  """summary.md: what was varied, the table and the orderings."""
  fixed = ("the simulated world and annotator pool drawn with each seed too" if world else
           "the same simulated world, test prompts and annotator pool in every seed")
  return (f"# Leaderboard over run seeds {', '.join(map(str, seeds))}\n\n"
          f"Mean ± sample standard deviation over {len(seeds)} seeds; {fixed}.\n\n"
          f"{format_table(entries, against)}\n\n{format_orderings(orders)}\n")


def run(config: ml_collections.ConfigDict, workdir: str,
        run_pipeline: Callable[[ml_collections.ConfigDict, str], Any]) -> dict[str, Any]:
  """Runs the pipeline (`run_pipeline`: main.run) for each seed; writes and logs the summary."""
  seeds = parse_seeds(config.seeds.run_seeds)
  if "seeds" in config.stages.split(","):
    raise ConfigError("config.stages: task=seeds runs the stages once per seed; it cannot be one")
  boards = {}
  for i, seed in enumerate(seeds):
    directory = seed_dir(workdir, seed)
    metrics_lib.info(f"seed {seed} ({i + 1}/{len(seeds)}): {config.stages} in {directory}")
    run_pipeline(seed_config(config, seed, config.seeds.world), directory)
    boards[seed] = read_board(os.path.join(directory, "eval", "leaderboard.json"))
  entries = aggregate(boards)
  orders = orderings(boards, [e["key"] for e in entries])
  summary = {"seeds": seeds, "world": config.seeds.world, "against": config.eval.against,
             "methods": entries, "orderings": orders}
  out = os.path.join(workdir, "seeds")
  os.makedirs(out, exist_ok=True)
  text = format_summary(entries, orders, seeds, config.seeds.world, config.eval.against)
  experiment.write_text(os.path.join(out, "summary.md"), text)
  experiment.write_json(os.path.join(out, "summary.json"), summary)
  metrics_lib.info(f"\n{text}Summary: {out}/summary.md")
  return summary
