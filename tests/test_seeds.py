"""task=seeds: the aggregation over seeds on hand-made leaderboards, its configuration errors, and
one tiny run of two seeds end to end (seed 0 resumed from the shared tiny pipeline's stages)."""

import json
import os
import shutil

import pytest

from conftest import load_config
from rlhfjax.errors import ConfigError
from rlhfjax import main
from rlhfjax.stages import seeds


def _row(key, method, win_rate, gold, kl, **more):
  return {"key": key, "method": method, "win_rate": win_rate, "se": 5.0, "gold": gold,
          "length_words": 10.0, "kl": kl, "p_vs_sft": float("nan"), **more}


# Three seeds, rows in each seed's own win-rate order. Win-rate: PPO > SFT and best-of-4 > SFT in
# every seed, PPO > best-of-4 in seeds 0 and 2 (tied in 1). Gold: PPO > SFT and best-of-4 > SFT in
# every seed, PPO > best-of-4 in seeds 0 and 1 only.
BOARDS = {
    0: [_row("ppo", "PPO", 60.0, 0.5, 2.0, lc_win_rate=55.0),
        _row("best_of_n", "best-of-4", 45.0, 0.2, 0.64, lc_win_rate=44.0),
        _row("sft", "SFT", 40.0, 0.1, 0.0, lc_win_rate=40.0)],
    1: [_row("best_of_n", "best-of-4", 50.0, 0.25, 0.64, lc_win_rate=48.0),
        _row("ppo", "PPO", 50.0, 0.3, 3.0, lc_win_rate=47.0),
        _row("sft", "SFT", 42.0, 0.2, 0.0, lc_win_rate=42.0)],
    2: [_row("ppo", "PPO", 70.0, 0.4, 4.0, lc_win_rate=51.0),
        _row("best_of_n", "best-of-4", 40.0, 0.45, 0.64, lc_win_rate=50.0),
        _row("sft", "SFT", 38.0, 0.3, 0.0, lc_win_rate=38.0)],
}


def test_aggregate_means_sds_and_per_seed_values():
  entries = seeds.aggregate(BOARDS)
  assert [e["method"] for e in entries] == ["PPO", "best-of-4", "SFT"]  # By mean win-rate.
  ppo, bon, sft = entries
  assert ppo["win_rate"]["values"] == [60.0, 50.0, 70.0]
  assert ppo["win_rate"]["mean"] == pytest.approx(60.0)
  assert ppo["win_rate"]["sd"] == pytest.approx(10.0)  # Sample sd (ddof=1).
  assert sft["win_rate"]["sd"] == pytest.approx(2.0)
  assert bon["win_rate"]["sd"] == pytest.approx(5.0)
  assert ppo["gold"]["mean"] == pytest.approx(0.4) and ppo["gold"]["sd"] == pytest.approx(0.1)
  assert ppo["kl"]["mean"] == pytest.approx(3.0) and ppo["kl"]["sd"] == pytest.approx(1.0)
  assert bon["kl"]["sd"] == 0.0
  assert ppo["lc_win_rate"]["mean"] == pytest.approx(51.0)
  assert ppo["lc_win_rate"]["sd"] == pytest.approx(4.0)
  assert ppo["length_words"]["mean"] == 10.0 and ppo["se"]["mean"] == 5.0
  assert "p_vs_sft" not in ppo and "stiennon_lc" not in ppo  # Not averaged; absent.


def test_orderings_count_seeds_each_way():
  entries = seeds.aggregate(BOARDS)
  orders = seeds.orderings(BOARDS, [e["key"] for e in entries])
  found = {(o["better_key"], o["worse_key"], o["metric"]): (o["seeds"], o["against"], o["ties"])
           for o in orders}
  assert all(o["of"] == 3 for o in orders)
  assert found == {
      ("ppo", "best_of_n", "win_rate"): (2, 0, 1),
      ("ppo", "best_of_n", "lc_win_rate"): (2, 1, 0),
      ("ppo", "best_of_n", "gold"): (2, 1, 0),
      ("ppo", "sft", "win_rate"): (3, 0, 0),
      ("ppo", "sft", "lc_win_rate"): (3, 0, 0),
      ("ppo", "sft", "gold"): (3, 0, 0),
      ("best_of_n", "sft", "win_rate"): (3, 0, 0),
      ("best_of_n", "sft", "lc_win_rate"): (3, 0, 0),
      ("best_of_n", "sft", "gold"): (3, 0, 0),
  }
  # The method ahead in more seeds comes first, whatever order the keys are given in.
  reverse = seeds.orderings(BOARDS, ["sft", "best_of_n", "ppo"])
  assert {(o["better_key"], o["worse_key"], o["metric"]) for o in reverse} == set(found)


def test_summary_markdown():
  entries = seeds.aggregate(BOARDS)
  orders = seeds.orderings(BOARDS, [e["key"] for e in entries])
  text = seeds.format_summary(entries, orders, [0, 1, 2], world=False)
  assert "| method | win-rate vs reference (%), mean ± sd | LC win-rate (%), mean ± sd | " \
         "gold reward, mean ± sd | KL to SFT (nats), mean ± sd | per-seed win-rates (%) |" in text
  assert ("| PPO | 60.0 ± 10.0 | 51.0 ± 4.0 | 0.400 ± 0.100 | 3.00 ± 1.00 | 60.0, 50.0, 70.0 |"
          in text)
  held, other = text.split("Orderings that do not:")
  assert "- PPO > SFT by win-rate in 3/3 seeds\n" in held
  assert "- best-of-4 > SFT by gold in 3/3 seeds\n" in held
  assert "- PPO > best-of-4 by win-rate in 2/3 seeds (0 reversed, 1 tied)" in other
  assert "- PPO > best-of-4 by gold in 2/3 seeds (1 reversed, 0 tied)" in other
  assert "PPO > SFT" not in other
  level = [dict(orders[0], seeds=0, against=0, ties=3)]  # Level in every seed: not an ordering.
  assert seeds.format_orderings(level).endswith("do not:\n- PPO = best-of-4 by win-rate in all 3 "
                                                "seeds")


def test_columns_only_where_every_seed_has_them():
  # Real data has no gold; an older leaderboard has no length-controlled win-rate.
  boards = {s: [{k: v for k, v in r.items() if k != "gold" and (s or k != "lc_win_rate")}
                for r in rows] for s, rows in BOARDS.items()}
  entries = seeds.aggregate(boards)
  assert not any("gold" in e or "lc_win_rate" in e for e in entries)
  orders = seeds.orderings(boards, [e["key"] for e in entries])
  assert {o["metric"] for o in orders} == {"win_rate"}
  header = seeds.format_table(entries, "sft").splitlines()[0]
  assert header == ("| method | win-rate vs sft (%), mean ± sd | KL to SFT (nats), mean ± sd | "
                    "per-seed win-rates (%) |")


@pytest.mark.parametrize("text, message", [
    ("0,x", "'x' is not an integer"), ("0,1,", "'' is not an integer"),
    ("1.5,2", "'1.5' is not an integer"), ("3", "one seed; a standard deviation needs two"),
    ("0,1,0", "repeats a seed"), ("-1,2", "seed -1 is negative")])
def test_bad_seed_lists(text, message):
  with pytest.raises(ConfigError, match=f"seeds.run_seeds: .*{message}"):
    seeds.parse_seeds(text)


def _fake_pipeline(calls):
  """A pipeline that records the seeds it ran under and writes a leaderboard, without training."""
  def run(config, workdir):
    calls.append((config.task, config.seed, config.data.seed, config.annotators.seed, workdir))
    os.makedirs(f"{workdir}/eval")
    with open(f"{workdir}/eval/leaderboard.json", "w") as f:
      json.dump(BOARDS[config.seed], f)
  return run


@pytest.mark.parametrize("world", [False, True])
def test_run_sets_the_seeds_and_writes_the_summary(tmp_path, world):
  config = load_config()
  config.task = "seeds"
  config.seeds.update(run_seeds="2,0,1", world=world)
  calls = []
  summary = seeds.run(config, str(tmp_path), _fake_pipeline(calls))
  fixed = 0  # The tiny config's data and annotator seeds.
  assert calls == [("pipeline", s, s if world else fixed, s if world else fixed,
                    str(tmp_path / f"seed_{s}")) for s in (2, 0, 1)]
  assert config.seed == 0 and config.task == "seeds"  # The caller's config is left alone.
  assert summary["seeds"] == [2, 0, 1] and summary["world"] == world
  assert summary["methods"][0]["win_rate"]["values"] == [70.0, 60.0, 50.0]  # In seed order.
  with open(tmp_path / "seeds" / "summary.json") as f:
    assert json.load(f) == summary
  with open(tmp_path / "seeds" / "summary.md") as f:
    assert f.read().startswith("# Leaderboard over run seeds 2, 0, 1\n")


def test_run_names_a_missing_leaderboard_and_a_recursive_stage(tmp_path):
  config = load_config()
  with pytest.raises(FileNotFoundError, match=r"seed_0/eval/leaderboard.json is missing .* eval"):
    seeds.run(config, str(tmp_path), lambda config, workdir: None)
  config.stages = "sft,seeds"
  with pytest.raises(ConfigError, match="config.stages"):
    seeds.run(config, str(tmp_path), _fake_pipeline([]))


def _outputs(path):
  with open(path) as f:
    return {o["id"]: o["output"] for o in json.load(f)["outputs"]}


def test_two_tiny_seeds_end_to_end(tiny_pipeline, tmp_path):
  config, finished = tiny_pipeline
  # Seed 0 is the shared tiny run's seed: its trained stages are copied in and resumed.
  os.makedirs(tmp_path / "seed_0")
  for name in ("tokenizer.model", "sft", "label", "rm"):
    src, dst = os.path.join(finished, name), tmp_path / "seed_0" / name
    (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, dst)
  config = config.copy_and_resolve_references()
  config.task = "seeds"
  config.stages = "sft,label,rm,best_of_n,eval"
  config.eval.methods = "sft,best_of_n"
  config.seeds.run_seeds = "0,1"
  summary = main.run(config, str(tmp_path))
  for s in (0, 1):
    with open(tmp_path / f"seed_{s}" / "config.json") as f:
      stored = json.load(f)
    assert (stored["seed"], stored["data"]["seed"]) == (s, 0)
  outputs = {s: _outputs(tmp_path / f"seed_{s}" / "sft" / "outputs.json") for s in (0, 1)}
  assert outputs[0] == _outputs(os.path.join(finished, "sft", "outputs.json"))
  assert list(outputs[0]) == list(outputs[1])  # The same test prompts ...
  assert outputs[0] != outputs[1]  # ... answered by differently trained and sampled SFT models.
  assert {e["method"] for e in summary["methods"]} == {"SFT", "best-of-4"}
  assert all(len(e["win_rate"]["values"]) == 2 for e in summary["methods"])
  with open(tmp_path / "seeds" / "summary.md") as f:
    text = f.read()
  for method in ("SFT", "best-of-4"):
    assert f"\n| {method} | " in text
  assert "by gold in" in text
