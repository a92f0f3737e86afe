"""Which examples a run reads: the `data` config block's source, cut into the pipeline's splits.

The simulated world is generated in memory; every other source (and the world too, if asked) is a
TFDS dataset built from local files (`sources/tfds_builders.py`).
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
from jax.experimental import multihost_utils

from rlhfjax.data import pipeline
from rlhfjax.errors import ConfigError
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
  source = cfg["source"]
  if source == "sim_tldr":
    sizes = {k: int(cfg[k]) for k in SPLITS}
    return world.make_splits(int(cfg["seed"]), sizes, float(cfg["reference_noise"]))
  if source == "tfds":
    return _tfds_splits(cfg)
  raise ConfigError(f"data.source: unknown source {source!r} (available: 'sim_tldr', 'tfds')")


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
