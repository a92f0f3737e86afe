"""task=rm, dpo, kto and grpo run end to end on configs/hh_rlhf.py:tiny and configs/ultrafeedback.py:tiny
from JSON Lines, Parquet shards and a `save_to_disk` Arrow directory, all from one tiny SFT run."""

import json
import math
import os
import shutil

import pytest

import trl_fixtures as fx
from conftest import load_config
from rlhfjax import main
from rlhfjax.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  root = tmp_path_factory.mktemp("trl_data")
  hh = fx.hh_rows(20)
  uf = fx.uf_rows(20)
  out = {
      "jsonl": (fx.write_jsonl(str(root / "hh-rlhf/helpful-base/train.jsonl"), hh[:16] + [
                    {"chosen": "\n\nHuman: Hi"}]),
                fx.write_jsonl(str(root / "hh-rlhf/helpful-base/test.jsonl"), hh[16:])),
      "parquet": (fx.write_parquet(str(root / "uf/data/train_prefs-00000-of-00001.parquet"),
                                   uf[:16] + [dict(uf[0], rejected=None)], fx.UF_SCHEMA),
                  fx.write_parquet(str(root / "uf/data/test_prefs-00000-of-00001.parquet"),
                                   uf[16:], fx.UF_SCHEMA)),
      "arrow": (fx.write_save_to_disk(str(root / "uf_disk/train"), uf[:16], fx.UF_SCHEMA, 2),
                fx.write_save_to_disk(str(root / "uf_disk/test"), uf[16:], fx.UF_SCHEMA)),
  }
  out["kto"] = fx.write_parquet(str(root / "kto/data/train-00000-of-00001.parquet"),
                                fx.kto_rows(16), fx.KTO_SCHEMA)
  return out


def _config(kind, data, task):
  train, test = data[kind]
  c = load_config("hh_rlhf" if kind == "jsonl" else "ultrafeedback", "tiny")
  c.data.update(train_file=train, test_file=test)
  c.rm.update(train_file=train, valid_file=test)
  c.task = task
  return c


@pytest.fixture(scope="module")
def sft_workdir(data, tmp_path_factory):
  """One tiny SFT run (HH-RLHF's chosen replies) that every method below starts from."""
  workdir = str(tmp_path_factory.mktemp("trl_sft"))
  main.run(_config("jsonl", data, "sft"), workdir)
  return workdir


def _fork(sft_workdir, path):
  os.makedirs(path)
  shutil.copy(os.path.join(sft_workdir, "tokenizer.model"), path)
  shutil.copytree(os.path.join(sft_workdir, "sft"), os.path.join(path, "sft"))
  return str(path)


def _last_metrics(workdir, task):
  with open(os.path.join(workdir, task, "metrics.jsonl")) as f:
    return [json.loads(l) for l in f][-1]


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "arrow"])
def test_rm_grpo_dpo_kto(kind, data, sft_workdir, tmp_path):
  workdir = _fork(sft_workdir, tmp_path / kind)
  main.run(_config(kind, data, "rm"), workdir)
  assert os.path.isdir(os.path.join(workdir, "rm", "model"))
  main.run(_config(kind, data, "grpo"), workdir)
  if kind == "jsonl":  # The reward model -> PPO loop of the configs.
    main.run(_config(kind, data, "ppo"), workdir)
  dpo = _config(kind, data, "dpo")
  main.run(dpo, workdir)
  assert math.isfinite(_last_metrics(workdir, "dpo")["train/loss"])
  kto = _config(kind, data, "kto")
  if kind == "parquet":  # TRL's conversational unpaired rows (kto-mix-14k's layout).
    kto.kto.update(feedback="binary", train_file=data["kto"])
  main.run(kto, workdir)
  assert math.isfinite(_last_metrics(workdir, "kto")["train/loss"])


def test_conversations_without_a_template_are_refused_before_anything_runs(data, tmp_path):
  c = _config("parquet", data, "sft")
  c.format.chat_template = ""
  with pytest.raises(ConfigError, match="need a chat template") as e:
    main.run(c, str(tmp_path / "w"))
  assert "\n" not in str(e.value)
  assert not os.path.exists(tmp_path / "w" / "sft")


def test_unreadable_comparisons_are_refused_before_anything_is_written(data, tmp_path):
  cut = tmp_path / "cut.parquet"
  with open(data["parquet"][0], "rb") as f:
    cut.write_bytes(f.read()[:200])
  c = _config("parquet", data, "rm")
  c.rm.update(train_file=str(cut))
  with pytest.raises(DataError, match=r"rm.train_file: .*cut.parquet: not a readable parquet"):
    main.run(c, str(tmp_path / "w"))
  assert not os.path.exists(tmp_path / "w" / "config.json")


def test_sft_on_prompts_alone_is_refused(data, tmp_path):
  """A prompt-only file has no response to learn: task=sft says so (it used to train on empty
  targets, eos alone), before anything is written."""
  prompts = fx.write_jsonl(str(tmp_path / "prompts.jsonl"),
                           [{"prompt": r["chosen"]} for r in fx.hh_rows(20)])
  c = _config("jsonl", data, "sft")
  c.data.update(train_file=prompts, test_file="")
  with pytest.raises(DataError, match=r"task=sft: no training example has a response to learn "
                     r"\(data.source='files', data.train_file='.*prompts.jsonl'\)"):
    main.run(c, str(tmp_path / "w"))
  assert not os.path.exists(tmp_path / "w" / "sft" / "checkpoints")
