"""Real data end to end: OpenAI's TL;DR files with their human comparisons, and Alpaca with
AlpacaFarm-layout preferences, through SFT -> (label ->) RM -> PPO -> best-of-N -> eval.

The fixtures are written here in the upstream layouts. Real examples have no latent situation, so
the gold metrics must be absent (not NaN, not zero-filled) and the simulated annotators refused by
config key; Alpaca prompts must reach the model in the exact Alpaca format.
"""

import json
import os

import numpy as np
import pytest

from conftest import load_config
from rlhfjax.data import pipeline
from rlhfjax.data import records
from rlhfjax.errors import ConfigError
from rlhfjax import main
from rlhfjax.sources import loading
from rlhfjax.training import experiment
from rlhfjax.training import metrics

SUBREDDITS = ("relationships", "personalfinance", "tifu", "dogs")
THINGS = ("car", "dog", "laptop", "apartment", "job", "bike")


def tldr_row(i, split):
  thing = THINGS[i % len(THINGS)]
  return {"id": f"t3_{split}{i}", "subreddit": SUBREDDITS[i % len(SUBREDDITS)],
          "title": f"My {20 + i}F roommate broke my {thing}",
          "post": (f"We have lived together for {i + 2} years. Last week she borrowed my {thing} "
                   f"without asking. Now it is broken and she says it was already like that. "
                   f"What should I do?"),
          "summary": f"roommate broke my {thing} and denies it, what do I do?"}


def write_jsonl(path, rows):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write("".join(json.dumps(r) + "\n" for r in rows))


def openai_comparison(row, split, choice):
  """One line of summarize-from-feedback's comparisons/batch*.json."""
  return {"info": {"id": row["id"], "post": row["post"], "title": row["title"],
                   "subreddit": row["subreddit"]},
          "summaries": [{"text": row["summary"], "policy": "ref", "note": ""},
                        {"text": f"my {row['id']} thing", "policy": "sup2", "note": ""}],
          "choice": choice, "worker": "w1", "batch": "batch3", "split": split,
          "extra": {"confidence": 7}}


TLDR = {split: [tldr_row(i, split) for i in range(n)]
        for split, n in (("train", 12), ("valid", 4), ("test", 4))}
# batch3.json: 10 train comparisons (8 are copied), 5 valid1 (4 are copied), a valid2 one, and a
# CNN/DM record (an `article`, no `post`), which is malformed for the TL;DR layout and skipped.
BATCH3 = ([openai_comparison(TLDR["train"][i], "train", i % 2) for i in range(10)]
          + [openai_comparison(TLDR["valid"][i % 4], "valid1", (i + 1) % 2) for i in range(5)]
          + [openai_comparison(TLDR["test"][0], "valid2", 0)])
CNNDM = {"info": {"id": "cnn1", "article": "News."}, "summaries": [{"text": "a"}, {"text": "b"}],
         "choice": 0, "split": "valid2"}

# Alpaca: 24 entries (8 sft, 4 pref, 8 unlabeled, 4 validation), every third without an input.
ALPACA = [{"instruction": f"Translate sentence {i} into French.",
           "input": f"Good morning, {THINGS[i % 6]}.", "output": f"Bonjour, numéro {i}."} if i % 3
          else {"instruction": f"Name {i % 5 + 2} colours.", "input": "",
                "output": "Red, blue and green."}
          for i in range(24)]


def alpaca_pair(i, preference):
  e = ALPACA[i]
  return {"instruction": e["instruction"], "input": e["input"], "output_1": e["output"],
          "output_2": "I do not know.", "preference": preference}


@pytest.fixture(scope="module")
def openai_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("openai")
  manual = str(root / "manual")
  for split, rows in TLDR.items():
    write_jsonl(os.path.join(manual, f"{split}.jsonl"), rows)
  write_jsonl(os.path.join(manual, "comparisons", "batch3.json"), BATCH3 + [CNNDM])
  config = load_config("openai_tldr")
  config.data.update(manual_dir=manual, data_dir=str(root / "tfds"))
  workdir = str(root / "work")
  rows = main.run(config, workdir)
  return config, workdir, rows


@pytest.fixture(scope="module")
def alpaca_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("alpaca")
  manual = root / "manual"
  manual.mkdir()
  (manual / "alpaca_data.json").write_text(json.dumps(ALPACA, indent=2), encoding="utf-8")
  write_jsonl(str(manual / "pref_train.jsonl"), [alpaca_pair(i, 1 + i % 2) for i in range(8)])
  write_jsonl(str(manual / "pref_valid.jsonl"), [alpaca_pair(i, 1) for i in range(8, 12)])
  config = load_config("alpaca")
  config.data.update(manual_dir=str(manual), data_dir=str(root / "tfds"))
  config.rm.update(train_file=str(manual / "pref_train.jsonl"),
                   valid_file=str(manual / "pref_valid.jsonl"))
  workdir = str(root / "work")
  rows = main.run(config, workdir)
  return config, workdir, rows


def read_json(*parts):
  with open(os.path.join(*parts), encoding="utf-8") as f:
    return json.load(f)


def gold_keys(obj):
  """Every key of a nested report that mentions gold."""
  if isinstance(obj, dict):
    return [k for k in obj if "gold" in k] + [k for v in obj.values() for k in gold_keys(v)]
  if isinstance(obj, list):
    return [k for v in obj for k in gold_keys(v)]
  return []


# --- OpenAI TL;DR ---------------------------------------------------------------------------------

def test_openai_label_copies_the_human_comparisons(openai_run):
  _, workdir, _ = openai_run
  train, problems = records.read(os.path.join(workdir, "label", "train.jsonl"), "openai")
  valid, _ = records.read(os.path.join(workdir, "label", "valid.jsonl"), "openai")
  assert problems == []
  # The first label.num_pairs = 8 train records and label.num_val_pairs = 4 valid1 ones, in order.
  assert [c.id for c in train] == [f"t3_train{i}" for i in range(8)]
  assert [c.choice for c in train] == [i % 2 for i in range(8)]
  assert [c.id for c in valid] == [f"t3_valid{i}" for i in range(4)]
  assert {c.split for c in valid} == {"valid1"} and valid[0].confidence == 7
  assert not os.path.exists(os.path.join(workdir, "label", "annotators.md"))


def test_openai_stages_report_without_gold(openai_run):
  _, workdir, rows = openai_run
  sft_report = read_json(workdir, "sft", "eval.json")
  assert {r["name"] for r in sft_report["rows"]} == {"sft", "reference", "title", "lead1", "lead2"}
  assert all(set(r) == {"name", "rougeL", "words"} for r in sft_report["rows"])
  rm_report = read_json(workdir, "rm", "eval.json")
  assert rm_report["pairs"] == 4 and 0.0 <= rm_report["accuracy"] <= 1.0
  assert gold_keys(rm_report) == [] and "probes" not in rm_report
  logged = metrics.read_jsonl(os.path.join(workdir, "ppo", "metrics.jsonl"))
  assert sorted(logged) == [0, 1, 2]
  assert all(gold_keys(m) == [] and "eval/win_rate" not in m for m in logged.values())
  assert {"eval/rm_score", "eval/kl", "eval/length_words"} <= set(logged[2])
  curve = read_json(workdir, "best_of_n", "curve.json")
  assert [p["n"] for p in curve] == [1, 2]
  assert all(set(p) == {"n", "kl", "rm_score", "length_words"} for p in curve)
  np.testing.assert_allclose(curve[1]["kl"], np.log(2) - 0.5)
  # The leaderboard: judged by the reward model (eval.annotator='rm'), no gold anywhere.
  assert {r["key"] for r in rows} == {"sft", "ppo", "best_of_n"}
  assert all(gold_keys(r) == [] and 0 <= r["win_rate"] <= 100 for r in rows)
  md = open(os.path.join(workdir, "eval", "leaderboard.md"), encoding="utf-8").read()
  assert "gold" not in md and md.startswith("| method | win-rate vs reference (%) |")
  csv_head = open(os.path.join(workdir, "eval", "leaderboard.csv"), encoding="utf-8").readline()
  assert csv_head == ("method,win_rate,se,ci_low,ci_high,lc_win_rate,lc_se,stiennon_lc,"
                      "stiennon_lc_se,p_vs_sft,length_words,kl\n")
  outputs = read_json(workdir, "ppo", "outputs.json")
  assert [o["id"] for o in outputs["outputs"]] == [f"t3_test{i}" for i in range(4)]
  assert os.path.exists(os.path.join(workdir, "eval", "overoptimization.png"))


@pytest.mark.parametrize("task, key, value", [("label", "label.annotator", "train_pool"),
                                              ("eval", "eval.annotator", "eval_pool")])
def test_simulated_annotators_refused_on_real_data(openai_run, task, key, value, tmp_path):
  config = openai_run[0].copy_and_resolve_references()
  config.task = task
  config.label.comparisons = ""  # Sample SFT pairs and judge them: the simulated pool cannot.
  block, field = key.split(".")
  config[block][field] = value
  # Refused before anything is loaded: a fresh workdir holds no SFT policy or outputs.
  with pytest.raises(ConfigError, match=rf"^{key.replace('.', r'[.]')}: '{value}' is a simulated"):
    main.run(config, str(tmp_path))


# --- Alpaca ---------------------------------------------------------------------------------------

def test_alpaca_splits_and_prompts(alpaca_run):
  config, workdir, _ = alpaca_run
  exp = experiment.prepare(config, workdir)
  sizes = {k: len(v) for k, v in exp.splits.items()}
  assert sizes == {"sft": 8, "pref": 4, "unlabeled": 8, "validation": 4, "test": 4}
  assert exp.splits["test"] == exp.splits["validation"]
  ids = [e.id for split in ("sft", "pref", "unlabeled", "validation") for e in exp.splits[split]]
  assert sorted(ids, key=lambda i: int(i.split("-")[1])) == [f"alpaca-{i}" for i in range(24)]
  with_input = next(e for e in exp.splits["sft"] if e.input)
  without = next(e for e in exp.splits["sft"] if not e.input)
  i, j = int(with_input.id.split("-")[1]), int(without.id.split("-")[1])
  assert (with_input.instruction, with_input.input, with_input.reference) == (
      ALPACA[i]["instruction"], ALPACA[i]["input"], ALPACA[i]["output"])
  tok = exp.tokenizer
  batch = pipeline.encode_prompts(tok, [with_input, without], 128)
  decoded = [tok.decode(row[mask]) for row, mask in zip(batch["prompt"], batch["prompt_mask"])]
  assert decoded[0] == (
      "Below is an instruction that describes a task, paired with an input that provides further "
      "context. Write a response that appropriately completes the request.\n\n"
      f"### Instruction:\nTranslate sentence {i} into French.\n\n"
      f"### Input:\nGood morning, {THINGS[i % 6]}.\n\n### Response:")
  assert decoded[1] == (
      "Below is an instruction that describes a task. Write a response that appropriately "
      f"completes the request.\n\n### Instruction:\nName {j % 5 + 2} colours.\n\n### Response:")
  # SFT targets are Alpaca's outputs (here cut to their first 8 tokens).
  target = tok.decode(pipeline.encode_sft(tok, [with_input], 128, 8)["response"][0])
  assert len(target.strip()) > 3 and f" {ALPACA[i]['output']}".startswith(target)


def test_alpaca_prompt_truncates_input_then_instruction_at_sentences(alpaca_run):
  config, workdir, _ = alpaca_run
  tok = experiment.prepare(config, workdir).tokenizer
  head = pipeline.Instruction("x", "Summarise the text.", "", "")
  long_input = pipeline.Instruction("y", "Summarise the text.",
                                    "Good morning. The car is red. The dog is old.", "")
  cut_input = pipeline.Instruction("y", "Summarise the text.", "Good morning. The car is red.", "")
  budget = len(tok.encode(pipeline.prompt_text(cut_input)))
  ids = pipeline.prompt_ids(tok, long_input, budget)
  assert tok.decode(ids) == pipeline.prompt_text(cut_input)
  assert tok.decode(ids).endswith("### Input:\nGood morning. The car is red.\n\n### Response:")
  long_instruction = pipeline.Instruction("z", "Name a colour. Then name a dog. Then stop.", "", "")
  first = pipeline.Instruction("z", "Name a colour.", "", "")
  budget = len(tok.encode(pipeline.prompt_text(first)))
  assert tok.decode(pipeline.prompt_ids(tok, long_instruction, budget)).endswith(
      "### Instruction:\nName a colour.\n\n### Response:")
  assert pipeline.prompt_ids(tok, head, 200) == tok.encode(pipeline.prompt_text(head))


def test_alpaca_comparisons_become_instructions(alpaca_run):
  config, _, _ = alpaca_run
  comps, problems = records.read(config.rm.train_file, "alpaca")
  assert problems == [] and len(comps) == 8
  posts = pipeline.posts_of(comps)
  assert all(isinstance(p, pipeline.Instruction) for p in posts)
  assert [(p.instruction, p.input) for p in posts] == [
      (ALPACA[i]["instruction"], ALPACA[i]["input"]) for i in range(8)]
  assert pipeline.comparison_prompt(posts[1]) == {"id": "", "prompt": ALPACA[1]["instruction"],
                                                  "input": ALPACA[1]["input"]}


def test_alpaca_stages_report_without_gold(alpaca_run):
  _, workdir, rows = alpaca_run
  sft_report = read_json(workdir, "sft", "eval.json")
  # Instructions get no extractive baselines: the reference (Alpaca's output) and SFT only.
  assert {r["name"] for r in sft_report["rows"]} == {"sft", "reference"}
  assert all(set(r) == {"name", "rougeL", "words"} for r in sft_report["rows"])
  rm_report = read_json(workdir, "rm", "eval.json")
  assert rm_report["pairs"] == 4 and gold_keys(rm_report) == []
  for method in ("ppo", "best_of_n"):
    out = read_json(workdir, method, "outputs.json")
    assert [o["id"] for o in out["outputs"]] == [e["id"] for e in read_json(
        workdir, "sft", "outputs.json")["outputs"]]
  assert {r["key"] for r in rows} == {"sft", "ppo", "best_of_n"}
  assert all(gold_keys(r) == [] for r in rows)
  logged = metrics.read_jsonl(os.path.join(workdir, "ppo", "metrics.jsonl"))
  assert all(gold_keys(m) == [] for m in logged.values())


def test_alpaca_label_refuses_the_simulated_pool(alpaca_run, tmp_path):
  config = alpaca_run[0].copy_and_resolve_references()
  config.task = "label"
  config.label.annotator = "train_pool"
  with pytest.raises(ConfigError, match=r"^label[.]annotator: 'train_pool' is a simulated"):
    main.run(config, str(tmp_path))
  config.rm.layout = "openai"  # Instructions need AlpacaFarm's layout (the input has a field).
  with pytest.raises(ConfigError, match=r"^rm[.]layout: .*'alpaca' layout"):
    main.run(config, str(tmp_path))


def test_alpaca_split_too_large_names_the_data_key(alpaca_run, tmp_path):
  config, _, _ = alpaca_run
  config = config.copy_and_resolve_references()
  config.data.update(unlabeled=100, data_dir=str(tmp_path / "tfds"))
  with pytest.raises(ConfigError, match=r"^data[.]unlabeled: 100 examples do not fit: the data "
                                        r"has 24, of which the splits before it take 12"):
    loading.load_splits(config.data)
