"""The command line: overrides work, configuration mistakes end in one clear line."""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, load_config
from rlhfjax import main
from rlhfjax.errors import ConfigError


def _main(*args, cwd=ROOT):
  return subprocess.run([sys.executable, "-m", "rlhfjax.main", *args], cwd=cwd, capture_output=True,
                        text=True, timeout=300)


def test_overrides_reach_the_run(tmp_path):
  r = _main("--config", "configs/tldr_sim.py:tiny", "--workdir", str(tmp_path), "--config.task=sft",
            "--config.sft.steps=3", "--config.eval.num_examples=0", "--config.model.d_model=16")
  assert r.returncode == 0, r.stderr
  with open(tmp_path / "config.json") as f:
    saved = json.load(f)
  assert saved["sft"]["steps"] == 3 and saved["model"]["d_model"] == 16
  assert os.path.isdir(tmp_path / "sft" / "checkpoints" / "3")
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path / "sft" / "tb" / "metrics"))
  with open(tmp_path / "sft" / "metrics.jsonl") as f:
    assert [json.loads(l)["step"] for l in f] == [2, 3]


def _one_line_error(r, *needles):
  assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
  lines = [l for l in r.stderr.strip().splitlines() if l.startswith("rlhfjax: error:")]
  assert len(lines) == 1, r.stderr
  assert "Traceback" not in r.stderr
  for n in needles:
    assert n in lines[0], lines[0]


def test_unknown_key(tmp_path):
  _one_line_error(_main("--config", "configs/tldr_sim.py:tiny", "--workdir", str(tmp_path),
                        "--config.sft.stepz=3"), "sft.stepz")


def test_wrong_type(tmp_path):
  _one_line_error(_main("--config", "configs/tldr_sim.py:tiny", "--workdir", str(tmp_path),
                        "--config.sft.steps=many"), "sft.steps")


def test_missing_config_flag(tmp_path):
  _one_line_error(_main("--workdir", str(tmp_path)), "--config")


def test_missing_config_file(tmp_path):
  _one_line_error(_main("--config", "configs/nope.py", "--workdir", str(tmp_path)), "configs/nope.py")


def test_invalid_value_names_key(tmp_path):
  _one_line_error(_main("--config", "configs/tldr_sim.py:tiny", "--workdir", str(tmp_path),
                        "--config.model.variant=bert"), "model.variant")
  _one_line_error(_main("--config", "configs/tldr_sim.py:tiny", "--workdir", str(tmp_path),
                        "--config.task=nope"), "config.task")
  _one_line_error(_main("--config", "configs/tldr_sim.py:tiny", "--workdir", str(tmp_path),
                        "--config.stages=sft,rn"), "config.stages", "'rn'")


def test_missing_stage_input_names_the_task(tmp_path):
  _one_line_error(_main("--config", "configs/tldr_sim.py:tiny", "--workdir", str(tmp_path),
                        "--config.task=label"), "task=sft")


def test_help_lists_tasks_and_configs_and_exits_0():
  r = _main("--help")
  assert r.returncode == 0, r.stderr
  assert r.stdout.startswith("usage: python -m rlhfjax.main --config PATH[:ARG] [--workdir DIR]")
  assert "Examples:\n  python -m rlhfjax.main --config configs/tldr_sim.py --workdir " in r.stdout
  for name in ("pipeline", *main.TASKS):  # One line per task, saying what it does.
    assert re.search(rf"^  {name} +\S.+$", r.stdout, re.M), name
  assert "configs/tldr_sim.py" in r.stdout and "configs/labeling.py" in r.stdout
  assert "None" not in r.stdout and "main.py:" not in r.stdout  # No absl flag dump.
  assert _main("-h").stdout == r.stdout


def test_every_task_has_a_help_line():
  assert set(main.TASK_HELP) == {"pipeline", *main.TASKS}


@pytest.mark.parametrize("key, value, says", [
    ("sft.batch_size", 0, "sft.batch_size must be > 0, got 0"),
    ("rm.lr", -1e-3, "rm.lr must be > 0, got -0.001"),
    ("ppo.lr", float("nan"), "ppo.lr must be finite, got nan"),
    ("eval.top_p", 0.0, "eval.top_p must be in (0, 1], got 0.0"),
    ("annotators.flip_rate", 1.5, "annotators.flip_rate must be in [0, 1], got 1.5"),
    ("dpo.beta", 0.0, "dpo.beta must be > 0, got 0.0"),
    ("sft.log_every", 0, "sft.log_every must be > 0, got 0"),
    ("checkpoint.keep", 0, "checkpoint.keep must be > 0, got 0"),
])
def test_out_of_range_values_name_the_key_before_any_work(tmp_path, key, value, says):
  config = load_config()
  block, name = key.split(".")
  config[block][name] = value
  with pytest.raises(ConfigError, match=re.escape(says)):
    main.run(config, str(tmp_path / "w"))
  assert not os.path.exists(tmp_path / "w")


def test_out_of_range_on_the_command_line(tmp_path):
  _one_line_error(_main("--config", "configs/tldr_sim.py:tiny", "--workdir", str(tmp_path),
                        "--config.ppo.minibatch_size=-4"), "ppo.minibatch_size must be > 0, got -4")


def test_the_cli_runs_without_the_label_extra():
  """`pip install -e .` (the README's first command) has no Starlette, uvicorn or markdown-it-py:
  the CLI must import without them (the labeling site imports them when it is served)."""
  code = ("import sys\nfor m in ('starlette', 'uvicorn', 'markdown_it'):\n  sys.modules[m] = None\n"
          "import rlhfjax.main\nprint('ok')")
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
