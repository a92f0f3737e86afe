"""Which examples a run reads: the `data` config block's source, cut into the pipeline's splits.

The simulated world is generated in memory; every other source (and the world too, if asked) is a
TFDS dataset built from local files (`sources/tfds_builders.py`).
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import jax
from jax.experimental import multihost_utils

from rlhfjax.data import pipeline
from rlhfjax.data import tables
from rlhfjax.data import trl
from rlhfjax.errors import ConfigError, DataError
from rlhfjax.simulated import arithmetic
from rlhfjax.simulated import world
from rlhfjax.sources import tfds_builders

SPLITS = ("sft", "pref", "unlabeled", "validation", "test")

# Where each of the pipeline's splits comes from in a TFDS dataset (`data.tfds_name`). The Reddit
# TL;DR datasets have one training split; as in Stiennon et al. (2020), its posts serve supervised
# fine-tuning, the preference prompts and the RL prompts alike. Alpaca comes in AlpacaFarm's four
# splits (Dubois et al., 2023) and has no test split: AlpacaFarm evaluates on a separate set of 805
# instructions that `alpaca_data.json` does not hold, so here the validation split is also the test.
TFDS_SPLITS: dict[str, dict[str, str]] = {
    "sim_tldr": {s: s for s in SPLITS},
    "openai_tldr": {"sft": "train", "pref": "train", "unlabeled": "train", "validation": "valid",
                    "test": "test"},
    "reddit_tldr": {"sft": "train", "pref": "train", "unlabeled": "train",
                    "validation": "validation", "test": "test"},
    "alpaca": {"sft": "sft", "pref": "pref", "unlabeled": "unlabeled", "validation": "validation",
               "test": "validation"},
}
ALPACA_SPLITS = ("sft", "pref", "unlabeled", "validation")  # The `data` sizes Alpaca is cut into.

def load_splits(cfg: Mapping[str, Any]) -> dict[str, list[pipeline.Example]]:
  """The data splits (`SPLITS`) named by the `data` config block.

  `data.source`:
  - `sim_tldr`: the simulated world generated in memory from `seed`, the split sizes and
    `reference_noise`.
  - `arithmetic`: the verifiable task's word problems (`simulated/arithmetic.py`) generated in
    memory from `seed`, the split sizes, `slip` (the SFT solutions' error rate) and `chat`
    (conversational records, for an instruct model's chat template).
  - `tfds`: the TFDS dataset `data.tfds_name` (see `TFDS_SPLITS` for how its splits map to ours) in
    config `data.tfds_config`, read from `data.data_dir` ('': TFDS's default directory) and first
    built from the files in `data.manual_dir` ('': `<data_dir>/downloads/manual`) if it is not there
    yet. With several processes, process 0 builds first and the others then reuse its files (or
    build their own on a host-local data_dir). For `sim_tldr` an empty `tfds_config` means the
    world of this block's seed, sizes and reference_noise, so the examples equal the in-memory
    source's; for `alpaca` it means `alpaca_data.json` cut by this block's seed into its sft, pref,
    unlabeled and validation sizes (`alpaca_config`; test is the validation split), its examples
    being `pipeline.Instruction`s; for other datasets it means the dataset's default config, and
    the size keys are not used. The four `tfds_*` / `*_dir` keys may be absent (read as ''). Only the
    simulated world has a latent `situation`; elsewhere it is None (`pipeline.has_gold` is false):
    stages leave out their gold metrics, and the simulated annotators cannot be used.

  The examples are returned in their stored order; nothing here batches or shuffles. Batches come
  from `batch_indices`, a pure function of (seed, step): a deterministic shuffle that a resumed run
  repeats exactly, and `sharding.Parallel.put_batch` gives each host only its own rows of it.
  """
  # The block's keys depend on its source (each shipped config replaces it): a source's own
  # optional keys are read with `.get` and their defaults.
  source = cfg["source"]
  if source == "sim_tldr":
    sizes = {k: int(cfg[k]) for k in SPLITS}
    return world.make_splits(int(cfg["seed"]), sizes, float(cfg["reference_noise"]))
  if source == "tfds":
    return _tfds_splits(cfg)
  if source == FILES:
    return file_splits(cfg)
  if source == "arithmetic":
    sizes = {k: int(cfg[k]) for k in ("sft", "unlabeled", "validation", "test")}
    return arithmetic.splits(int(cfg["seed"]), sizes, float(cfg.get("slip", 0.5)),
                             bool(cfg.get("chat", False)))
  raise ConfigError(f"data.source: unknown source {source!r} (available: 'sim_tldr', 'tfds', "
                    f"{FILES!r}, 'arithmetic')")


FILES = "files"  # data.source of TRL-format files (`data/trl.py`).


def columns_of(cfg: Mapping[str, Any]) -> dict[str, str] | None:
  """`data.columns` with its empty entries left out (TRL's name is the file's), or None."""
  cols = {k: str(v) for k, v in dict(cfg.get("columns") or {}).items() if v}
  return cols or None


def read_examples(path: str, columns: Mapping[str, str] | None = None
                  ) -> list[pipeline.Prompted]:
  """The rows of a TRL-format file (any type: its prompt, and its chosen response or completion as
  the reference) as `pipeline.Prompted` examples; a malformed row is logged (file, row, reason)
  and skipped, and a file with no good row is a DataError."""
  first: list[str] = []  # The type of the first good row: the file's.

  def parse(raw: dict) -> trl.Row:
    row = trl.parse(raw, columns)
    if not first:
      first.append(row.type)
    return trl.same_type(first[0], row, raw, columns)

  rows, problems = tables.read(path, parse)
  for p in problems[:20]:
    logging.warning("%s (skipped)", p)
  if len(problems) > 20:
    logging.warning("... and %d more malformed rows in %s", len(problems) - 20, path)
  if not rows:
    raise DataError(f"{path} holds no usable rows" + (
        f": {problems[0]} (and {len(problems) - 1} more)" if problems else ": it is empty"))
  ids = [str((r.extra or {}).get("id") or (r.extra or {}).get("prompt_id") or "") for r in rows]
  return [pipeline.Prompted(i or f"{path}#{n}", r.prompt, r.messages, r.reference, r.extra)
          for n, (i, r) in enumerate(zip(ids, rows))]


def file_splits(cfg: Mapping[str, Any]) -> dict[str, list[pipeline.Example]]:
  """`data.source='files'`: the rows of `data.train_file` serve SFT (those with a response to
  learn), the preference prompts and the RL prompts alike (as the Reddit TL;DR datasets do); `data.test_file` (or, without one, the last
  `data.validation` rows of the training file, held out) is the validation and the test split,
  cut to `data.validation` and `data.test` rows."""
  path = str(cfg.get("train_file", ""))
  if not path:
    raise ConfigError("data.train_file: data.source='files' needs a file, a directory of shards "
                      "or a glob of TRL-format rows")
  columns = columns_of(cfg)
  train = read_examples(path, columns)
  n_val, n_test = int(cfg.get("validation", 0)), int(cfg.get("test", 0))
  if cfg.get("test_file"):
    held = read_examples(str(cfg["test_file"]), columns)
  else:
    if n_val >= len(train):
      raise ConfigError(f"data.validation ({n_val}) leaves none of the {len(train)} rows of "
                        f"{path} to train on; lower it or give data.test_file")
    held, train = train[len(train) - n_val:], train[:len(train) - n_val]
  # SFT learns the rows with a response to learn (chosen, a completion, a desirable completion);
  # with none (prompt-only data, for the RL tasks) its split is empty and task=sft says so.
  return {"sft": [e for e in train if e.reference], "pref": train, "unlabeled": train,
          "validation": held[:n_val or None], "test": held[:n_test or None]}


def alpaca_config(seed: int, sizes: Mapping[str, int]) -> Any:
  """The `alpaca` builder config that cuts Alpaca by `seed` into these `ALPACA_SPLITS` sizes, named
  after them (one dataset directory each)."""
  name = f"seed{seed}-" + "-".join(str(int(sizes[k])) for k in ALPACA_SPLITS)
  return tfds_builders.AlpacaConfig(name=name, seed=int(seed),
                                    **{k: int(sizes[k]) for k in ALPACA_SPLITS},
                                    description=f"Alpaca cut by seed {seed} into {dict(sizes)}.")


def prepare_tfds(cfg: Mapping[str, Any], name: str, config: Any = None) -> Any:
  """The builder of TFDS dataset `name` in `config`, built first from the `data` block's manual_dir
  into its data_dir unless it is there. With several processes, process 0 builds first and the
  others then reuse its files (or build their own on a host-local data_dir)."""
  args = (name, config, str(cfg.get("data_dir", "")) or None,
          str(cfg.get("manual_dir", "")) or None)
  first = jax.process_index() == 0
  if first:
    builder = _prepare(args)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(f"rlhfjax tfds build {name}")
  if not first:
    builder = _prepare(args)
  return builder


def _prepare(args: tuple) -> Any:
  """`tfds_builders.prepare(*args)`; a split size of `alpaca_config` that does not fit names its
  `data` key."""
  name, config = args[:2]
  try:
    return tfds_builders.prepare(*args)
  except ConfigError as e:
    if name != "alpaca" or not isinstance(config, tfds_builders.AlpacaConfig):
      raise
    raise ConfigError(str(e).replace(f"alpaca/{config.name}.", "data.")) from None


def _read_instructions(builder: Any, split: str) -> list[pipeline.Instruction]:
  return [pipeline.Instruction(i, e.instruction, e.input, e.output)
          for i, e in map(tfds_builders.to_alpaca, tfds_builders.read(builder, split))]


def _tfds_splits(cfg: Mapping[str, Any]) -> dict[str, list[pipeline.Example]]:

  name = str(cfg.get("tfds_name", ""))
  if name not in TFDS_SPLITS:
    raise ConfigError(f"data.tfds_name: {name!r} is not a dataset of prompts with references "
                      f"(available: {', '.join(repr(n) for n in TFDS_SPLITS)})")
  config: Any = str(cfg.get("tfds_config", "")) or None
  known = tfds_builders.BUILDERS[name].builder_configs
  if config is not None and config not in known:
    raise ConfigError(f"data.tfds_config: {name} has no config {config!r} (available: "
                      f"{', '.join(repr(k) for k in known) or 'none'})")
  if config is None and name == "sim_tldr":
    config = tfds_builders.sim_tldr_config(int(cfg["seed"]), {k: int(cfg[k]) for k in SPLITS},
                                           float(cfg["reference_noise"]))
  if config is None and name == "alpaca":
    config = alpaca_config(int(cfg["seed"]), {k: int(cfg[k]) for k in ALPACA_SPLITS})
  builder = prepare_tfds(cfg, name, config)
  reader = _read_instructions if name == "alpaca" else tfds_builders.read_examples
  stored = set(builder.info.splits)
  read: dict[str, list[pipeline.Example]] = {}
  for ours, theirs in TFDS_SPLITS[name].items():
    if theirs not in stored:
      raise ConfigError(f"data.tfds_name: {builder.info.full_name} has no split {theirs!r} for the "
                        f"{ours!r} split (it has: {', '.join(sorted(stored))})")
    if theirs not in read:
      read[theirs] = reader(builder, theirs)
  return {ours: list(read[theirs]) for ours, theirs in TFDS_SPLITS[name].items()}
