"""Command line: `python -m rlhfjax.main --config configs/NAME.py[:ARG] [--config.a.b=v] [--workdir DIR]`.

`config.task` picks the job. Configuration mistakes (an unknown key, a wrong type, a missing file)
and a workdir that cannot be written (read-only, full, no permission) end in one line naming the
culprit and exit status 2, not a traceback; what earlier stages wrote stays as it was. SIGTERM
saves a checkpoint and exits with status 75; the same command resumes. A non-finite loss or
gradient norm stops training with one line (step, metric, last good checkpoint) and exit status 3.
Every process of a multi-host run executes this same command (see launch/).
"""

from __future__ import annotations

import errno
import os
import re
import sys
from typing import Callable

from absl import app
from absl import flags
from absl import logging
import jax
from jax.experimental import multihost_utils
from ml_collections import config_flags

from rlhfjax.algorithms import best_of_n
from rlhfjax.algorithms import dpo
from rlhfjax.algorithms import expert_iteration
from rlhfjax.algorithms import feedme
from rlhfjax.algorithms import grpo
from rlhfjax.algorithms import kto
from rlhfjax.algorithms import online_dpo
from rlhfjax.algorithms import ppo
from rlhfjax.algorithms import quark
from rlhfjax.algorithms import reinforce_pp
from rlhfjax.algorithms import reward_conditioning
from rlhfjax.algorithms import reward_model
from rlhfjax.algorithms import rloo
from rlhfjax.algorithms import sft
from rlhfjax import config_check
from rlhfjax.errors import ConfigError, DataError, Diverged
from rlhfjax.evaluation import leaderboard
from rlhfjax.evaluation import pass_at_k
from rlhfjax.evaluation import rm_report
from rlhfjax.evaluation import sft_report
from rlhfjax import files
from rlhfjax.labeling import tasks as labeling
from rlhfjax.parallel import distributed
from rlhfjax.parallel import preemption
from rlhfjax import runtime
from rlhfjax.stages import compile as compile_task
from rlhfjax.stages import export
from rlhfjax.stages import label
from rlhfjax.stages import memory
from rlhfjax.stages import seeds



def _then(*stages: Callable) -> Callable:
  """One task made of stages run in order (training, then its report); returns the last result."""
  def task(config, workdir: str):
    for stage in stages:
      result = stage(config, workdir)
    return result
  return task


# Algorithms train and save; the evaluation modules report on what they saved (lower floors never
# import higher ones, so the composition lives here).
TASKS: dict[str, Callable] = {
    "sft": _then(sft.run, sft_report.run),
    "label": label.run,
    "label_load": labeling.load,
    "label_user": labeling.user,
    "label_server": labeling.serve,
    "label_export": labeling.export,
    "rm": _then(reward_model.run, rm_report.run),
    "ppo": ppo.run,
    "rloo": rloo.run,
    "grpo": grpo.run,
    "dapo": lambda config, workdir: grpo.run(config, workdir, "dapo"),  # grpo.py, config.dapo.
    "gspo": lambda config, workdir: grpo.run(config, workdir, "gspo"),  # grpo.py, config.gspo.
    "dr_grpo": lambda config, workdir: grpo.run(config, workdir, "dr_grpo"),  # config.dr_grpo.
    "reinforce_pp": reinforce_pp.run,
    "online_dpo": online_dpo.run,
    "best_of_n": best_of_n.run,
    "expert_iteration": expert_iteration.run,
    "dpo": dpo.run,
    "simpo": lambda config, workdir: dpo.run(config, workdir, "simpo"),  # dpo.py, config.simpo.
    "kto": kto.run,
    "feedme": feedme.run,
    "reward_conditioning": reward_conditioning.run,
    "quark": quark.run,
    "eval": leaderboard.run,
    "pass_at_k": pass_at_k.run,
    "memory": memory.run,
    "compile": compile_task.run,
    "export": export.run,
    "seeds": lambda config, workdir: seeds.run(config, workdir, run),  # `run` below, per seed.
}


# One line per task for `--help`.
TASK_HELP = {
    "pipeline": "run config.stages in order (the default of most shipped configs)",
    "sft": "supervised fine-tuning on the reference answers, then its report",
    "label": "sample SFT pairs and label them with config.label.annotator (comparison files; "
             "label.protocol=binary: one sample each, thumbs up or down)",
    "label_load": "queue pairs for people to label (labeling.source)",
    "label_user": "create a labeler and print a one-time sign-in link",
    "label_server": "serve the labeling site",
    "label_export": "write the human labels as comparison files and the agreement report",
    "rm": "train the Bradley-Terry reward model, then its report",
    "ppo": "PPO against the reward model with a per-token KL penalty to the SFT policy",
    "rloo": "REINFORCE leave-one-out",
    "grpo": "group-relative policy optimisation",
    "dapo": "DAPO: GRPO with Clip-Higher, the token-level loss, overlong shaping, dynamic sampling",
    "gspo": "GSPO: GRPO with one length-normalised importance ratio per response",
    "dr_grpo": "Dr. GRPO: GRPO without the std scaling and with a constant loss normaliser",
    "reinforce_pp": "REINFORCE++: PPO's per-token rewards without a critic, globally whitened",
    "online_dpo": "DPO on pairs sampled and labelled during training",
    "best_of_n": "best-of-n sampling against the reward model",
    "expert_iteration": "fine-tune on the best of n samples",
    "dpo": "direct preference optimisation on the comparison files",
    "simpo": "SimPO: reference-free, length-normalised preference optimisation on those files",
    "kto": "KTO: binary feedback (desirable or not), the comparison files split or a binary file",
    "feedme": "binary FeedME: fine-tune on the preferred responses",
    "reward_conditioning": "binary reward conditioning: positive/negative control codes",
    "quark": "Quark: rounds of sampling, keeping the top reward quantile, fine-tuning on it",
    "eval": "the leaderboard of win-rates against the references, and the over-optimisation plot",
    "pass_at_k": "a verifiable task's pass@1 and pass@k per method, with intervals and p-values",
    "memory": "plan the bytes per device of every step for config.mesh (no compile)",
    "compile": "compile the steps for a TPU slice or a GPU and report memory, collectives, MFU",
    "export": "write a trained policy or reward model as a Hugging Face directory",
    "seeds": "the pipeline once per seed, and the leaderboard as mean ± sd across seeds",
}
EXAMPLES = """\
  python -m rlhfjax.main --config configs/tldr_sim.py --workdir runs/quickstart
  python -m rlhfjax.main --config configs/tldr_sim.py:tiny --workdir /tmp/tiny   # seconds
  python -m rlhfjax.main --config configs/tldr_sim.py --workdir runs/quickstart --config.task=rm \\
      --config.rm.epochs=2"""


def _help() -> str:
  """What `--help` prints: usage, examples, the flags, every task with a line, the shipped
  configs."""
  configs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
  shipped = sorted(f"configs/{f}" for f in os.listdir(configs) if f.endswith(".py")) if \
      os.path.isdir(configs) else []
  summary = __doc__.split("\n\n", 1)[1].strip()
  width = max(map(len, TASK_HELP))
  lines = ["usage: python -m rlhfjax.main --config PATH[:ARG] [--workdir DIR] "
           "[--config.KEY=VALUE ...]", "", summary, "", "Examples:", EXAMPLES, "", "Flags:",
           "  --config PATH[:ARG]   a config file (configs/*.py), required; ARG picks a variant",
           "  --workdir DIR         where checkpoints, metrics and outputs go (default: "
           "config.workdir);", "                        a rerun in the same workdir resumes",
           "  --config.KEY=VALUE    overrides any key of the config, e.g. --config.ppo.steps=10",
           "", "Tasks (--config.task=NAME):"]
  lines += [f"  {name:<{width}}  {text}" for name, text in TASK_HELP.items()]
  if shipped:
    lines += ["", "Shipped configs (PATH:tiny runs a few steps of each stage of those that take "
              "it):"] + [f"  {path}" for path in shipped]
  return "\n".join(lines) + "\n"


_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config file (configs/*.py).",
                                          lock_config=True)
flags.mark_flag_as_required("config")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints, metrics and outputs go "
                               "(default: config.workdir). A rerun in the same workdir resumes.")


DIVERGED_EXIT_CODE = 3  # A non-finite loss or gradient norm stopped training (loop._Guard).


def _fail(message: str) -> None:
  print(f"rlhfjax: error: {message}", file=sys.stderr)
  sys.exit(2)


def _os_error(e: OSError) -> str:
  """One line for a failed file operation: the path and the reason, and what to do for a workdir
  that cannot be written."""
  if e.filename is None:  # Ours, e.g. "no checkpoint in W/sft/checkpoints: run task=sft first".
    return str(e)
  line = f"{e.filename}: {e.strerror}"
  if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
    line += "; free some space (or use another --workdir) and rerun: it resumes"
  elif e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
    line += "; the workdir must be writable: fix that (or use another --workdir) and rerun"
  return line


def run(config, workdir: str):
  """Runs `config.task` in `workdir`; importable for notebooks and tests.

  `task=pipeline` runs the comma-separated `config.stages` in order and returns the last result.
  With several processes (`config.distributed`) all of them run this; they meet after each stage,
  so files process 0 wrote are there for the next one.
  """
  try:
    return _run(config, workdir)
  except (AttributeError, KeyError) as e:  # A key the config lacks: one line naming it.
    missing = config_check.missing_key(e, config)
    if missing is None:
      raise
    raise missing from e


def _run(config, workdir: str):
  config_check.check(config)
  # Both before the first computation starts a backend: XLA reads its flags only then.
  runtime.apply(config.runtime, config.model.dtype)
  distributed.initialize(config.distributed)
  if jax.process_index() == 0:
    files.check_writable(workdir)
  stages = config.stages.split(",") if config.task == "pipeline" else [config.task]
  for stage in stages:
    if stage not in TASKS:
      key = "config.stages" if config.task == "pipeline" else "config.task"
      raise ConfigError(f"{key}: unknown task {stage!r} (available: pipeline, {', '.join(TASKS)})")
  result = None
  for stage in stages:
    result = TASKS[stage](config, workdir)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"rlhfjax stage {stage}")
  return result


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    _fail(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)  # Orbax and rouge-score are chatty at INFO.
  config = _CONFIG.value
  preemption.install()
  try:
    run(config, _WORKDIR.value or config.workdir)
  except (ConfigError, DataError) as e:
    _fail(str(e))
  except OSError as e:
    # Orbax's abandoned background writes report the same failure again as they wind down (logs,
    # their threads' and exit handlers' tracebacks); the line has said it, so the process ends at
    # once and the user's last line stays ours. What was written is complete or a .tmp.
    print(f"rlhfjax: error: {_os_error(e)}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(2)
  except preemption.Preempted as e:
    print(f"rlhfjax: {e}", file=sys.stderr)
    sys.exit(preemption.EXIT_CODE)
  except Diverged as e:
    print(f"rlhfjax: diverged: {e}", file=sys.stderr)
    sys.exit(DIVERGED_EXIT_CODE)


def _flags_parser(argv: list[str]) -> list[str]:
  """Parses flags and loads the config; a mistake becomes one line naming it, not a usage dump.
  `--help` prints `_help()` and exits 0 (absl's usage names this file and exits 1)."""
  if any(a in ("--help", "-h", "-?", "--helpshort", "--helpfull") for a in argv[1:]):
    sys.stdout.write(_help())
    sys.exit(0)
  try:
    rest = flags.FLAGS(argv)
    _ = _CONFIG.value.task  # Config files load lazily: touch one to surface a loading error.
    return rest
  except OSError:
    path = next((a.split("=", 1)[-1] for a in argv if a.startswith("--config=")), None)
    if path is None and "--config" in argv:
      path = argv[argv.index("--config") + 1]
    _fail(f"cannot load config file {path}: " + ("no such file" if path and not os.path.exists(
        path.split(":")[0]) else "see the error above"))
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
    message = " ".join(re.sub(r"[\\']", "", str(e)).replace("\\n", " ").split())
    if "Traceback" in message:  # An error inside get_config(): keep its last line.
      message = "config file: " + message.rsplit("Error: ", 1)[-1]
    hint = re.search(r'Did you mean "(\w+)"', message)
    bad = [a.split("=")[0][2:] for a in argv[1:] if a.startswith("--config.")
           and a.split("=")[0].split(".")[-1] in message]
    if isinstance(e, (AttributeError, KeyError)) and bad:
      _fail(f"{bad[0]}: unknown config key" + (f" (did you mean {hint.group(1)}?)" if hint else ""))
    _fail(message)
  return argv


if __name__ == "__main__":
  app.run(main, flags_parser=_flags_parser)
