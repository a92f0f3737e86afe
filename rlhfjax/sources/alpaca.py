"""Alpaca-format instruction data, and AlpacaFarm's four splits of it.

Stanford Alpaca's file (`alpaca_data.json`) is one JSON array of `{instruction, input, output}`
objects; the same objects one per line (JSON Lines) are accepted too (`jsonl.read_any` tells them
apart). `input` may be empty, null or absent. A malformed entry is reported as `file:line: reason`
(JSON Lines) or `file: record N (index N-1): reason` (an array, N counted from 1); an array that
does not parse at all is a `DataError` naming the file, line and column.

AlpacaFarm (Dubois et al., 2023) splits the Alpaca instructions into SFT (10k), PREF
(10k, for pairwise preferences), unlabeled (20k, for PPO and the other methods) and validation (2k).
Here the split is a seeded permutation cut in that order, so it is deterministic and disjoint; the
sizes are the `data` config keys of the same names.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from rlhfjax.data import jsonl
from rlhfjax.errors import ConfigError

SPLIT_SIZES = {"sft": 10_000, "pref": 10_000, "unlabeled": 20_000, "validation": 2_000}


@dataclasses.dataclass(frozen=True)
class AlpacaExample:
  instruction: str
  input: str
  output: str


def from_row(row: object) -> AlpacaExample:
  """One Alpaca object; `ValueError` names a missing or mistyped key."""
  if not isinstance(row, dict):
    raise ValueError("not a JSON object")
  for key in ("instruction", "output"):
    if key not in row:
      raise ValueError(f"missing key {key!r}")
  for key in ("instruction", "input", "output"):
    if not isinstance(row.get(key, ""), str) and not (key == "input" and row[key] is None):
      raise ValueError(f"key {key!r} has type {type(row[key]).__name__}")
  return AlpacaExample(row["instruction"], row.get("input") or "", row["output"])


def read(path: str) -> tuple[list[AlpacaExample], list[str]]:
  """All good examples of an Alpaca JSON array or JSON Lines file, and one problem per bad entry.

  An array that does not parse at all is a `DataError` naming the file, line and column."""
  return jsonl.read_any(path, from_row)


def read_strict(path: str) -> list[AlpacaExample]:
  """Like `read`, but a bad entry is a `DataError` naming the file and the first bad entry."""
  return jsonl.strict(*read(path))


def make_splits(examples: Sequence[AlpacaExample], seed: int,
                sizes: Mapping[str, int] = SPLIT_SIZES,
                config_prefix: str = "data") -> dict[str, list[AlpacaExample]]:
  """Disjoint splits of the given sizes, taken in order from a permutation seeded by `seed`.

  Too few examples is a `ConfigError` naming the config key (`{config_prefix}.{split}`) of the first
  split that does not fit."""
  perm = np.random.default_rng(seed).permutation(len(examples))
  splits, start = {}, 0
  for name, size in sizes.items():
    key = f"{config_prefix}.{name}"
    if int(size) != size or size < 0:
      raise ConfigError(f"{key}: a split size must be a whole number >= 0, got {size!r}")
    if start + size > len(examples):
      taken = f", of which the splits before it take {start}" if start else ""
      raise ConfigError(
          f"{key}: {size} examples do not fit: the data has {len(examples)}{taken}; "
          f"lower {key} or give a larger file")
    splits[name] = [examples[i] for i in perm[start:start + int(size)]]
    start += int(size)
  return splits
