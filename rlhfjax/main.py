"""Command line: `python -m rlhfjax.main --config configs/NAME.py[:ARG] [--config.a.b=v] [--workdir DIR]`.

`config.task` picks the job. Configuration mistakes (an unknown key, a wrong type, a missing file)
end in one line naming the culprit and exit status 2, not a traceback.
"""

from __future__ import annotations

import sys
from typing import Callable

from absl import app
from absl import flags
from ml_collections import config_flags

from rlhfjax.algorithms import sft
from rlhfjax.errors import ConfigError, DataError

TASKS: dict[str, Callable] = {
    "sft": sft.run,
}

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config file (configs/*.py).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints, metrics and outputs go "
                               "(default: config.workdir). A rerun in the same workdir resumes.")


def _fail(message: str) -> None:
  print(f"rlhfjax: error: {message}", file=sys.stderr)
  sys.exit(2)


def run(config, workdir: str):
  """Runs `config.task` in `workdir`; importable for notebooks and tests."""
  if config.task not in TASKS:
    raise ConfigError(f"config.task: unknown task {config.task!r} (available: {', '.join(TASKS)})")
  return TASKS[config.task](config, workdir)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    _fail(f"unexpected arguments: {' '.join(argv[1:])}")
  config = _CONFIG.value
  try:
    run(config, _WORKDIR.value or config.workdir)
  except (ConfigError, DataError, FileNotFoundError) as e:
    _fail(str(e))


def _flags_parser(argv: list[str]) -> list[str]:
  """Parses flags, turning absl's multi-line usage dump into one clear line."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    _fail(str(e))
  return argv


if __name__ == "__main__":
  app.run(main, flags_parser=_flags_parser)
