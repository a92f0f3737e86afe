"""Llama-3.1-8B on the TL;DR pipeline at real size: configs/tldr_scale.py with that architecture.

  python -m rlhfjax.main --config configs/llama3_8b_tldr.py --config.task=compile \
      --config.compile.topology=v5p:2x2x2
"""

from rlhfjax import config_file


def get_config(arg: str | None = None):
  del arg
  return config_file.sibling(__file__, "tldr_scale", "llama3.1-8b")
