"""What every launcher shares: its own flags before `--`, rlhfjax.main's arguments after."""

from __future__ import annotations

import argparse
import sys
from typing import Callable


def parse(parser: argparse.ArgumentParser, argv: list[str] | None,
          needs_main: Callable[[argparse.Namespace], bool] = lambda ns: True
          ) -> tuple[argparse.Namespace, list[str]]:
  """(launcher flags, rlhfjax.main arguments); when `needs_main(flags)` the latter must name a
  config."""
  argv = sys.argv[1:] if argv is None else list(argv)
  cut = argv.index("--") if "--" in argv else len(argv)
  ns, args = parser.parse_args(argv[:cut]), argv[cut + 1:]
  if needs_main(ns) and not any(a.startswith("--config") for a in args):
    parser.error("pass rlhfjax.main's arguments after --, e.g. -- --config configs/tldr_sim.py")
  return ns, args
