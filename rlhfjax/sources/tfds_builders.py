"""TensorFlow Datasets builders for rlhfjax's data, built and read without TensorFlow.

Each builder writes `array_record` files (`FILE_FORMAT`) and is read back by random access with
`builder.as_data_source(split)`; the default `tfrecord` format and `as_dataset()` would need
TensorFlow. Nothing is downloaded: a builder reads the files its `MANUAL_DOWNLOAD_INSTRUCTIONS` name
from the `manual_dir` of its `tfds.download.DownloadConfig` (the simulated world reads nothing).

- `sim_tldr`: the simulated TL;DR world (`world.make_splits`), splits sft / pref / unlabeled /
  validation / test; each example also stores its latent `world.Situation` as JSON, so gold rewards
  work after the round trip.
- `openai_tldr`: OpenAI's `tldr_3_filtered/{train,valid,test}.jsonl` (read with `openai_tldr.read`).
- `openai_comparisons`: summarize-from-feedback's `comparisons/batch*.json` (read with
  `records.read(path, "openai")`), split by each record's `split` field: train / valid1 / valid2.
- `alpaca`: Stanford Alpaca's `alpaca_data.json` cut into AlpacaFarm's sft / pref / unlabeled /
  validation by `alpaca.make_splits`.
- `reddit_tldr`: (post, TL;DR) pairs mined from Pushshift dumps by `tldr_mining` (configs `full`,
  `hq`, `openai_filtered`), split train / validation / test by a hash of the id.
- `reddit_advice`: RedditAdvice situations with their advice (`reddit_advice`), configs `static`
  (train, and validation after a date cut) and `dynamic` (test).

Text features come back from a data source as bytes; `to_example`, `to_comparison`, `to_alpaca`
and `to_situation` turn a row back into the project's types. Examples keep their source ids and
their order: keys are positions and shuffling is disabled (the training pipeline shuffles by seed
and step). A malformed input line is logged as `file:line: reason` and skipped. TFDS cannot store
an empty split, so a split with no examples is left out of the dataset.

`reddit_tldr` also builds as an Apache Beam pipeline, for dumps at TLDR9+ scale: TFDS runs a
builder with Beam when a split generator is a Beam object, and `RedditTldr` returns Beam ones when
its `DownloadConfig` carries `beam_runner` or `beam_options` (`prepare(..., beam_options=...)`
sets them; the `tfds build` command would too, but it imports TensorFlow). Each dump file is one
element, mined on a worker; the selection and the split by id hash follow as further steps, and the
examples are the same, in the same order, as those of the build in this process (see `RedditTldr`).
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import itertools
import json
import logging
import math
import os
import re
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import tensorflow_datasets as tfds

from rlhfjax.data import pipeline
from rlhfjax.data import records
from rlhfjax.errors import ConfigError, DataError
from rlhfjax.simulated import world
from rlhfjax.sources import alpaca
from rlhfjax.sources import openai_tldr
from rlhfjax.sources import reddit
from rlhfjax.sources import reddit_advice
from rlhfjax.sources import tldr_mining

FILE_FORMAT = "array_record"
MAX_LISTED_PROBLEMS = 20  # Malformed lines logged one by one per file; the rest are counted.

SIM_SPLITS = ("sft", "pref", "unlabeled", "validation", "test")
POST_FIELDS = ("id", "subreddit", "title", "post", "reference")
COMPARISON_TEXT_FIELDS = ("id", "subreddit", "title", "prompt", "response_a", "response_b",
                          "policy_a", "policy_b", "note_a", "note_b", "annotator", "batch", "split")

_RELEASE_NOTES = {"1.0.0": "Initial release."}
# Each builder's `code_path`: TFDS looks for a checksums file next to a builder's code, and finding
# that code inside a package imports `importlib_resources`, which Python >= 3.9 does not need. These
# builders download nothing, so they have no checksums and no code path.
_NO_CODE_PATH = None


def _features(text: Sequence[str], **other: tfds.features.FeatureConnector
              ) -> tfds.features.FeaturesDict:
  return tfds.features.FeaturesDict({**{k: tfds.features.Text() for k in text}, **other})


def _info(builder: tfds.core.DatasetBuilder, description: str,
          features: tfds.features.FeaturesDict, homepage: str = "") -> tfds.core.DatasetInfo:
  # Built directly: `dataset_info_from_configs` wants a dataset package with metadata files.
  return tfds.core.DatasetInfo(builder=builder, description=description, features=features,
                               homepage=homepage, disable_shuffling=True)


def _manual_file(dl_manager: tfds.download.DownloadManager, builder: tfds.core.DatasetBuilder,
                 relative: str) -> str:
  """The path of `relative` inside the manual_dir; a `DataError` names it when it is missing."""
  try:
    root = dl_manager.manual_dir
  except AssertionError as e:  # TFDS's way of saying the manual_dir is missing or empty.
    raise DataError(f"{builder.name}: {relative} not found: {' '.join(str(e).split())}") from None
  path = os.path.join(os.fspath(root), relative)
  if not glob.glob(path):
    instructions = " ".join(builder.MANUAL_DOWNLOAD_INSTRUCTIONS.split())
    raise DataError(f"{path}: not found. {instructions}")
  return path


def _report(path: str, problems: Sequence[str], count: int | None = None) -> None:
  """Logs the malformed lines (`file:line: reason`) that were skipped; `count` of them in all when
  `problems` lists only the first ones."""
  count = len(problems) if count is None else count
  for problem in problems[:MAX_LISTED_PROBLEMS]:
    logging.warning("%s (skipped)", problem)
  if count > MAX_LISTED_PROBLEMS:
    logging.warning("%s: %d more malformed lines skipped", path, count - MAX_LISTED_PROBLEMS)


def _numbered(rows: Iterable[dict]) -> Iterator[tuple[int, dict]]:
  """Keys are positions: with shuffling disabled TFDS stores examples in key order."""
  return enumerate(rows)


def post_row(e: Any) -> dict[str, str]:
  """The TL;DR post features of anything with `id`, `subreddit`, `title`, `post`, `reference`."""
  return {k: getattr(e, k) for k in POST_FIELDS}


def situation_to_json(s: world.Situation) -> str:
  return json.dumps(dataclasses.asdict(s), sort_keys=True)


def situation_from_json(text: str) -> world.Situation:
  d = json.loads(text)
  return world.Situation(**{**d, "events": tuple(d["events"]),
                            "distractors": tuple(tuple(x) for x in d["distractors"])})


def decode(row: Mapping[str, Any]) -> dict[str, Any]:
  """A data-source row with its text as `str` and its numbers as Python scalars."""
  return {k: v.decode("utf-8") if isinstance(v, bytes) else
          v.item() if isinstance(v, np.generic) else v for k, v in row.items()}


def to_example(row: Mapping[str, Any]) -> pipeline.Tldr:
  """A post row as a `pipeline.Tldr`; `situation` is None outside the simulated world."""
  r = decode(row)
  situation = situation_from_json(r["situation"]) if r.get("situation") else None
  return pipeline.Tldr(*(r[k] for k in POST_FIELDS), situation=situation)


def to_comparison(row: Mapping[str, Any]) -> records.Comparison:
  r = decode(row)
  confidence = None if math.isnan(r["confidence"]) else r["confidence"]
  return records.Comparison(**{k: r[k] for k in COMPARISON_TEXT_FIELDS}, choice=int(r["choice"]),
                            confidence=confidence)


def to_alpaca(row: Mapping[str, Any]) -> tuple[str, alpaca.AlpacaExample]:
  """(id, example) of an `alpaca` row."""
  r = decode(row)
  return r["id"], alpaca.AlpacaExample(r["instruction"], r["input"], r["output"])


def _post_examples(examples: Sequence[Any]) -> Iterator[tuple[int, dict]]:
  return _numbered(post_row(e) for e in examples)


# --- The simulated world ---------------------------------------------------------------------


@dataclasses.dataclass
class SimTldrConfig(tfds.core.BuilderConfig):
  """The world's seed, the size of each split (in `SIM_SPLITS` order) and the reference noise."""

  seed: int = 0
  sft: int = 12000
  pref: int = 8000
  unlabeled: int = 8000
  validation: int = 512
  test: int = 512
  reference_noise: float = 1.0

  def sizes(self) -> dict[str, int]:
    return {k: int(getattr(self, k)) for k in SIM_SPLITS}


def sim_tldr_config(seed: int, sizes: Mapping[str, int], reference_noise: float) -> SimTldrConfig:
  """The config of a world with these parameters, named after them (one dataset directory each)."""
  name = f"seed{seed}-noise{reference_noise:g}-" + "-".join(str(int(sizes[k])) for k in SIM_SPLITS)
  return SimTldrConfig(name=name, seed=int(seed), reference_noise=float(reference_noise),
                       **{k: int(sizes[k]) for k in SIM_SPLITS},
                       description=f"The simulated TL;DR world, seed {seed}, sizes "
                                   f"{dict(sizes)}, reference noise {reference_noise:g}.")


class SimTldr(tfds.core.GeneratorBasedBuilder):
  """The simulated TL;DR world: generated from the config, nothing is read from a manual_dir.

  Configs `default` and `tiny` have the sizes of configs/tldr_sim.py and its `tiny` variant; any
  other world is a `SimTldrConfig` (see `sim_tldr_config`)."""

  name = "sim_tldr"
  code_path = _NO_CODE_PATH
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = _RELEASE_NOTES
  BUILDER_CONFIGS = [
      SimTldrConfig(name="default", description="The quickstart world (configs/tldr_sim.py)."),
      SimTldrConfig(name="tiny", sft=256, pref=64, unlabeled=64, validation=32, test=32,
                    description="The world of configs/tldr_sim.py:tiny, for tests."),
  ]

  def _info(self) -> tfds.core.DatasetInfo:
    return _info(self, "Reddit-style advice posts generated from latent situations, with reference "
                 "TL;DRs; `situation` holds the latent facts (JSON) that the gold reward scores.",
                 _features(POST_FIELDS + ("situation",)))

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    c = self.builder_config
    splits = world.make_splits(c.seed, c.sizes(), c.reference_noise)
    return {name: self._generate_examples(rows) for name, rows in splits.items() if rows}

  def _generate_examples(self, examples: Sequence[pipeline.Tldr]):
    return _numbered({**post_row(e), "situation": situation_to_json(e.situation)} for e in examples)


# --- OpenAI's filtered TL;DR ---------------------------------------------------------------------


class OpenaiTldr(tfds.core.GeneratorBasedBuilder):
  """OpenAI's filtered Reddit TL;DR (Stiennon et al., 2020): splits train / valid / test."""

  name = "openai_tldr"
  code_path = _NO_CODE_PATH
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = _RELEASE_NOTES
  FILES = {"train": "train.jsonl", "valid": "valid.jsonl", "test": "test.jsonl"}
  MANUAL_DOWNLOAD_INSTRUCTIONS = """
  Put train.jsonl, valid.jsonl and test.jsonl of tldr_3_filtered
  (https://openaipublic.blob.core.windows.net/summarize-from-feedback/datasets/tldr_3_filtered/)
  directly in manual_dir.
  """

  def _info(self) -> tfds.core.DatasetInfo:
    return _info(self, "Reddit posts with their TL;DRs, filtered as in Stiennon et al. (2020), "
                 "Appendix A; `reference` is the file's `summary`.", _features(POST_FIELDS),
                 "https://github.com/openai/summarize-from-feedback")

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    paths = {split: _manual_file(dl_manager, self, f) for split, f in self.FILES.items()}
    out = {}
    for split, path in paths.items():
      examples, problems = openai_tldr.read(path)
      _report(path, problems)
      if examples:
        out[split] = self._generate_examples(examples)
    return out

  def _generate_examples(self, examples: Sequence[openai_tldr.TldrExample]):
    return _post_examples(examples)


# --- OpenAI's comparisons --------------------------------------------------------------------


def _natural_key(path: str) -> list:
  """batch2.json before batch10.json."""
  return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", os.path.basename(path))]


class OpenaiComparisons(tfds.core.GeneratorBasedBuilder):
  """Human comparisons of TL;DR summaries (Stiennon et al., 2020), split by their `split` field.

  Features are the fields of `records.Comparison` (`prompt` is the post); a missing `confidence`
  is stored as NaN. Records whose `split` is not train / valid1 / valid2 are logged and skipped."""

  name = "openai_comparisons"
  code_path = _NO_CODE_PATH
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = _RELEASE_NOTES
  SPLITS = ("train", "valid1", "valid2")
  PATTERN = os.path.join("comparisons", "batch*.json")
  MANUAL_DOWNLOAD_INSTRUCTIONS = """
  Put the comparisons/ directory of summarize-from-feedback's dataset
  (https://openaipublic.blob.core.windows.net/summarize-from-feedback/dataset/comparisons/, files
  batch*.json) in manual_dir, so that manual_dir/comparisons/batch*.json are its JSONL files.
  """

  def _info(self) -> tfds.core.DatasetInfo:
    return _info(self, "Pairwise human judgements between two TL;DR summaries of a Reddit post "
                 "(Stiennon et al., 2020); `choice` is 0 when `response_a` is preferred.",
                 _features(COMPARISON_TEXT_FIELDS, choice=tfds.features.Scalar(np.int32),
                           confidence=tfds.features.Scalar(np.float32)),
                 "https://github.com/openai/summarize-from-feedback")

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    pattern = _manual_file(dl_manager, self, self.PATTERN)
    by_split: dict[str, list[records.Comparison]] = {s: [] for s in self.SPLITS}
    for path in sorted(glob.glob(pattern), key=_natural_key):
      comparisons, problems = records.read(path, "openai")
      for i, c in enumerate(comparisons):
        if c.tie:  # The dataset's features hold a choice, not a tie.
          problems.append(f"{path}: record {i} (id {c.id!r}): a tie ('choice': null), left out")
        elif c.split in by_split:
          by_split[c.split].append(c)
        else:
          problems.append(f"{path}: record {i} (id {c.id!r}): unknown split {c.split!r}")
      _report(path, problems)
    return {s: self._generate_examples(cs) for s, cs in by_split.items() if cs}

  def _generate_examples(self, comparisons: Sequence[records.Comparison]):
    return _numbered(
        {**{k: getattr(c, k) for k in COMPARISON_TEXT_FIELDS}, "choice": c.choice,
         "confidence": math.nan if c.confidence is None else float(c.confidence)}
        for c in comparisons)


# --- Alpaca ----------------------------------------------------------------------------------


@dataclasses.dataclass
class AlpacaConfig(tfds.core.BuilderConfig):
  """The seed of the split permutation and the size of each split (AlpacaFarm's by default)."""

  seed: int = 0
  sft: int = alpaca.SPLIT_SIZES["sft"]
  pref: int = alpaca.SPLIT_SIZES["pref"]
  unlabeled: int = alpaca.SPLIT_SIZES["unlabeled"]
  validation: int = alpaca.SPLIT_SIZES["validation"]

  def sizes(self) -> dict[str, int]:
    return {k: int(getattr(self, k)) for k in alpaca.SPLIT_SIZES}


class Alpaca(tfds.core.GeneratorBasedBuilder):
  """Alpaca instructions in AlpacaFarm's splits (Dubois et al., 2023): sft / pref / unlabeled /
  validation. Alpaca has no ids: `id` is `alpaca-N`, N the entry's position among the file's
  well-formed entries."""

  name = "alpaca"
  code_path = _NO_CODE_PATH
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = _RELEASE_NOTES
  FILE = "alpaca_data.json"
  BUILDER_CONFIGS = [AlpacaConfig(name="alpaca_farm", description="AlpacaFarm's split sizes.")]
  MANUAL_DOWNLOAD_INSTRUCTIONS = """
  Put Stanford Alpaca's alpaca_data.json
  (https://github.com/tatsu-lab/stanford_alpaca/blob/main/alpaca_data.json) directly in manual_dir.
  """

  def _info(self) -> tfds.core.DatasetInfo:
    return _info(self, "Instruction-following demonstrations (Taori et al., 2023) in the splits of "
                 "AlpacaFarm (Dubois et al., 2023).", _features(("id", "instruction", "input",
                                                                 "output")),
                 "https://github.com/tatsu-lab/alpaca_farm")

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    path = _manual_file(dl_manager, self, self.FILE)
    examples, problems = alpaca.read(path)
    _report(path, problems)
    numbered = [(f"alpaca-{i}", e) for i, e in enumerate(examples)]
    c = self.builder_config
    splits = alpaca.make_splits(numbered, c.seed, c.sizes(), config_prefix=f"alpaca/{c.name}")
    return {name: self._generate_examples(rows) for name, rows in splits.items() if rows}

  def _generate_examples(self, rows: Sequence[tuple[str, alpaca.AlpacaExample]]):
    return _numbered({"id": i, "instruction": e.instruction, "input": e.input, "output": e.output}
                     for i, e in rows)


# --- Reddit dumps: TL;DR pairs and advice situations --------------------------------------------


def _dump_files(dl_manager: tfds.download.DownloadManager, builder: tfds.core.DatasetBuilder,
                pattern: str) -> list[str]:
  """The manual_dir's dump files matching `pattern`, sorted (months in order); one dump twice
  (compressed and not) is refused."""
  found = sorted(glob.glob(_manual_file(dl_manager, builder, pattern)))
  try:
    reddit.check_distinct(found)
  except ValueError as e:
    raise DataError(f"{builder.name}: {pattern} in the manual_dir: {e}") from None
  return found


def split_by_id(examples: Iterable[Any], validation_fraction: float, test_fraction: float
                ) -> dict[str, list[Any]]:
  """train / validation / test by the hash of each example's `id` (`openai_tldr.in_validation`):
  an id below `validation_fraction` is validation, below the sum of both fractions test."""
  out: dict[str, list[Any]] = {"train": [], "validation": [], "test": []}
  for e in examples:
    if openai_tldr.in_validation(e.id, validation_fraction):
      out["validation"].append(e)
    elif openai_tldr.in_validation(e.id, validation_fraction + test_fraction):
      out["test"].append(e)
    else:
      out["train"].append(e)
  return out


@dataclasses.dataclass
class RedditTldrConfig(tfds.core.BuilderConfig):
  """Which pairs are kept (`selection`: full | hq | openai_filtered), the dump files (a glob in
  manual_dir) and the share of ids held out for validation and for test."""

  selection: str = "full"
  dumps: str = "R[SC]_*"
  validation_fraction: float = openai_tldr.VALIDATION_FRACTION
  test_fraction: float = openai_tldr.VALIDATION_FRACTION


class RedditTldr(tfds.core.GeneratorBasedBuilder):
  """(post, TL;DR) pairs mined from Pushshift dumps (`tldr_mining.mine`), split by id hash.

  Configs: `full` keeps every mined pair (TLDR9+), `hq` the pairs that pass the TLDRHQ oracle filter
  (`tldr_mining.high_quality`), `openai_filtered` those that pass OpenAI's post and summary filters
  (`openai_tldr.filter_posts`, Stiennon et al. 2020 App. A; tokens counted by
  `reddit_advice.count_tokens`, a stand-in for the paper's GPT-2 tokens). Mining caches one part
  per dump under the download_dir, so a failed build resumes. The held-out fractions default to the
  5% of Stiennon et al. (App. A) each; `reference` is the TL;DR, `title` is empty for comments.

  Given a Beam runner or options, the build is a Beam pipeline instead (`beam_examples`): the same
  examples in the same order (keys: `KEY_STRIDE`), nothing cached, and the counts of each stage in
  `beam_counts` (also logged) once it is done. TFDS's Beam writer refuses an empty split, so every
  split must get an example (at TLDR9+ scale 5% is ~450k posts; build a handful without Beam)."""

  name = "reddit_tldr"
  code_path = _NO_CODE_PATH
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = _RELEASE_NOTES
  BUILDER_CONFIGS = [
      RedditTldrConfig(name="full", selection="full", description="Every mined pair (TLDR9+)."),
      RedditTldrConfig(name="hq", selection="hq",
                       description=f"TLDRHQ: oracle score >= {tldr_mining.HQ_THRESHOLD}."),
      RedditTldrConfig(name="openai_filtered", selection="openai_filtered",
                       description="OpenAI's TL;DR filters (Stiennon et al. 2020, App. A)."),
  ]
  MANUAL_DOWNLOAD_INSTRUCTIONS = """
  Put Pushshift dumps of submissions and/or comments (RS_YYYY-MM.zst, RC_YYYY-MM.zst; .zst, .bz2,
  .xz or plain NDJSON) directly in manual_dir; the config's `dumps` glob (default R[SC]_*) picks
  them.
  """

  def _info(self) -> tfds.core.DatasetInfo:
    return _info(self, "Reddit posts and comments with the TL;DR their author wrote (Sotudeh et "
                 "al., 2021, TLDR9+ / TLDRHQ), split by a hash of the id.", _features(POST_FIELDS),
                 "https://github.com/sajastu/reddit_collector")

  def __init__(self, **kwargs: Any):
    super().__init__(**kwargs)
    self._use_beam = False
    self.beam_counts: dict[str, int] = {}

  def _download_and_prepare(self, dl_manager: tfds.download.DownloadManager,
                            download_config: tfds.download.DownloadConfig) -> None:
    self._use_beam = (download_config.beam_runner is not None
                      or download_config.beam_options is not None)
    self.beam_counts = {}
    try:
      super()._download_and_prepare(dl_manager, download_config)
    except ValueError as e:
      if not (self._use_beam and "generated examples is 0 for split" in str(e)):
        raise
      raise DataError(f"reddit_tldr/{self.builder_config.name}: {e} TFDS's Beam writer cannot "
                      "store an empty split: give more dumps or larger held-out fractions, or "
                      "build without Beam (which leaves an empty split out).") from e

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    c = self.builder_config
    if c.selection not in ("full", "hq", "openai_filtered"):
      raise ConfigError(f"reddit_tldr/{c.name}.selection: {c.selection!r} is not one of full, hq, "
                        "openai_filtered")
    dumps = _dump_files(dl_manager, self, c.dumps)
    if self._use_beam:
      return _beam_split_generators(dumps, c)
    work = os.path.join(os.fspath(dl_manager.download_dir), "reddit_tldr")
    os.makedirs(work, exist_ok=True)
    pairs_path = os.path.join(work, "pairs.jsonl")
    summary = tldr_mining.mine(dumps, pairs_path)
    for f in summary["files"]:
      _report(f["input"], f["bad_lines"], f["bad_count"])
    pairs: Iterable[dict] = tldr_mining.read_pairs(pairs_path)
    if c.selection == "hq":
      pairs = tldr_mining.high_quality(pairs)
    if c.selection == "openai_filtered":
      kept = openai_tldr.filter_posts(({**p, "summary": p["tldr"]} for p in pairs),
                                      reddit_advice.count_tokens).sft
    else:
      kept = [openai_tldr.TldrExample(p["id"], p["subreddit"], p["title"], p["post"], p["tldr"])
              for p in pairs]
    splits = split_by_id(kept, c.validation_fraction, c.test_fraction)
    return {name: self._generate_examples(rows) for name, rows in splits.items() if rows}

  def _generate_examples(self, examples: Sequence[openai_tldr.TldrExample]):
    return _post_examples(examples)

  def _process_pipeline_result(self, pipeline_result: Any) -> None:
    """Keeps and logs the counters of a Beam build (`beam_counts`)."""
    self.beam_counts = beam_counts(pipeline_result)
    for name, value in self.beam_counts.items():
      logging.info("reddit_tldr/%s: %s = %d", self.builder_config.name, name, value)


# --- reddit_tldr as an Apache Beam pipeline ------------------------------------------------------

BEAM_NAMESPACE = "reddit_tldr"  # Of the Beam counters (`beam_counts`).
BEAM_SPLITS = ("train", "validation", "test")  # The order of `split_by_id`.
# A Beam example's key: its dump's index times this, plus its record's index in the dump. TFDS
# stores examples in key order, so the Beam build keeps the order of the build in this process.
KEY_STRIDE = 2**40


def _beam():
  return tfds.core.lazy_imports.apache_beam


def _count(counts: Mapping[str, int]) -> None:
  """Adds to the Beam counters of `BEAM_NAMESPACE`."""
  for name, value in counts.items():
    if value:
      _beam().metrics.Metrics.counter(BEAM_NAMESPACE, name).inc(value)


def mine_dump(indexed_path: tuple[int, str],
              config: tldr_mining.MiningConfig = tldr_mining.MiningConfig()
              ) -> Iterator[tuple[int, dict]]:
  """The Beam path's per-file step: (key, pair) of each pair `tldr_mining.extract` finds in dump
  number `index` (`KEY_STRIDE`). Malformed lines are logged as in `tldr_mining.mine`; the reasons
  and the read report are counted as `mined/<reason>` and `read/<field>`."""
  index, path = indexed_path
  report = reddit.ReadReport(path)
  reasons: collections.Counter = collections.Counter()
  for number, record in enumerate(reddit.iter_records(path, report)):
    pair, reason = tldr_mining.extract(record, config)
    reasons[reason] += 1
    if pair is not None:
      yield index * KEY_STRIDE + number, pair
  _report(path, report.bad_lines, report.bad_count)
  _count({**{f"mined/{k}": v for k, v in reasons.items()},
          **{f"read/{k}": getattr(report, k) for k in ("lines", "bad_count", "replaced_bytes")}})


def _tldr_example(pair: dict) -> openai_tldr.TldrExample:
  return openai_tldr.TldrExample(pair["id"], pair["subreddit"], pair["title"], pair["post"],
                                 pair["tldr"])


def _keep_all(keyed: tuple[int, dict]) -> tuple[int, openai_tldr.TldrExample]:
  return keyed[0], _tldr_example(keyed[1])


def _keep_high_quality(keyed: tuple[int, dict]) -> Iterator[tuple[int, openai_tldr.TldrExample]]:
  key, pair = keyed
  kept = [_tldr_example(p) for p in tldr_mining.high_quality([pair])]
  _count({"hq/kept" if kept else "hq/dropped": 1})
  yield from ((key, e) for e in kept)


def _by_body(keyed: tuple[int, dict]) -> tuple[str, tuple[int, dict]]:
  _count({"openai/input": 1})
  return keyed[1]["post"], keyed


def _keep_openai_filtered(keyed: tuple[int, dict]
                          ) -> Iterator[tuple[int, openai_tldr.TldrExample]]:
  """OpenAI's post and summary filters on one pair already de-duplicated by body."""
  key, pair = keyed
  filtered = openai_tldr.filter_posts([{**pair, "summary": pair["tldr"]}],
                                      reddit_advice.count_tokens)
  _count({"openai/deduplicated": 1, "openai/kept": len(filtered.sft),
          **{f"openai/{k}": v for k, v in filtered.removed.items()}})
  yield from ((key, e) for e in filtered.sft)


def _split_index(keyed: tuple[int, openai_tldr.TldrExample], num_partitions: int,
                 validation_fraction: float, test_fraction: float) -> int:
  """Beam's `Partition` function: the index in `BEAM_SPLITS` of the example's split."""
  split = split_by_id([keyed[1]], validation_fraction, test_fraction)
  return BEAM_SPLITS.index(next(name for name, rows in split.items() if rows))


def _keyed_post_row(keyed: tuple[int, openai_tldr.TldrExample]) -> tuple[int, dict[str, str]]:
  return keyed[0], post_row(keyed[1])


def beam_examples(pipeline: Any, dumps: Sequence[str], config: RedditTldrConfig) -> list:
  """The (key, `TldrExample`) PCollections of `BEAM_SPLITS`, in that order, mined from `dumps`.

  One element per dump file (`mine_dump`); then `full` keeps every pair, `hq` spreads the pairs
  over the workers (`Reshuffle`) and keeps those that pass `tldr_mining.high_quality`, and
  `openai_filtered` keeps, of the pairs that share a body, the first (the smallest key, as
  `openai_tldr.filter_posts` does in file order; `CombinePerKey(min)` on the body), then applies
  `openai_tldr.filter_posts` to each. The split is `split_by_id`'s."""
  beam = _beam()
  pairs = (pipeline | "Dumps" >> beam.Create(list(enumerate(dumps)))
           | "Mine" >> beam.FlatMap(mine_dump))
  if config.selection == "full":
    examples = pairs | "Full" >> beam.Map(_keep_all)
  elif config.selection == "hq":
    examples = pairs | "Spread" >> beam.Reshuffle() | "TLDRHQ" >> beam.FlatMap(_keep_high_quality)
  else:
    examples = (pairs | "ByBody" >> beam.Map(_by_body)
                | "FirstOfEachBody" >> beam.CombinePerKey(min)
                | "Deduplicated" >> beam.Values()
                | "OpenAIFilters" >> beam.FlatMap(_keep_openai_filtered))
  return list(examples | "Split" >> beam.Partition(_split_index, len(BEAM_SPLITS),
                                                    config.validation_fraction,
                                                    config.test_fraction))


def _beam_split_generators(dumps: Sequence[str], config: RedditTldrConfig) -> dict[str, Any]:
  """One Beam PTransform per split. TFDS applies each to the same pipeline; the first one applied
  builds the mining and filtering (`beam_examples`) that all of them read their split from."""
  beam = _beam()
  shared: dict[str, Any] = {}

  def split(pbegin: Any, name: str) -> Any:
    if not shared:
      shared.update(zip(BEAM_SPLITS, beam_examples(pbegin.pipeline, dumps, config)))
    return shared[name] | "Features" >> beam.Map(_keyed_post_row)

  return {name: beam.ptransform_fn(split)(name) for name in BEAM_SPLITS}


def beam_counts(pipeline_result: Any) -> dict[str, int]:
  """The `BEAM_NAMESPACE` counters of a finished pipeline, by name (summed over steps), sorted,
  with `openai/duplicate_body`: the pairs that `openai_filtered`'s de-duplication removed."""
  beam = _beam()
  query = pipeline_result.metrics().query(
      beam.metrics.MetricsFilter().with_namespace(BEAM_NAMESPACE))
  counts: collections.Counter = collections.Counter()
  for c in query["counters"]:
    counts[c.key.metric.name] += c.committed if c.committed is not None else c.attempted
  if "openai/input" in counts:
    counts["openai/duplicate_body"] = counts["openai/input"] - counts["openai/deduplicated"]
  return dict(sorted(counts.items()))


@dataclasses.dataclass
class RedditAdviceConfig(tfds.core.BuilderConfig):
  """RedditAdvice `criteria` (static | dynamic), the date `cut` of the static train / validation
  split ('': everything is train) and the dump files (globs in manual_dir)."""

  criteria: str = "static"
  cut: str = ""
  submissions: str = "RS_*"
  comments: str = "RC_*"


ADVICE_FEATURES = ("id", "subreddit", "title", "selftext")


class RedditAdvice(tfds.core.GeneratorBasedBuilder):
  """RedditAdvice situations with their advice, best first (Zellers et al., 2021).

  `static` (the RedditAdvice2019 training criteria) gives `train`, and `validation` for the posts
  created at or after the config's `cut` (`reddit_advice.split_by_date`); `dynamic` (the evaluation
  criteria, without the age window) gives `test`."""

  name = "reddit_advice"
  code_path = _NO_CODE_PATH
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = _RELEASE_NOTES
  BUILDER_CONFIGS = [
      RedditAdviceConfig(name="static", criteria="static",
                         description="RedditAdvice2019's training criteria; all in train."),
      RedditAdviceConfig(name="dynamic", criteria="dynamic",
                         description="The dynamic evaluation criteria; all in test."),
  ]
  MANUAL_DOWNLOAD_INSTRUCTIONS = """
  Put Pushshift dumps directly in manual_dir: submissions matching RS_* and comments matching RC_*
  (e.g. RS_2019-07.zst and RC_2019-07.zst; .zst, .bz2, .xz or plain NDJSON), or other names given
  by the config's `submissions` / `comments` globs.
  """

  def _info(self) -> tfds.core.DatasetInfo:
    advice = tfds.features.Sequence({"id": tfds.features.Text(), "body": tfds.features.Text(),
                                     "score": tfds.features.Scalar(np.int64)})
    return _info(self, "Advice-seeking Reddit posts with their top-level advice comments, best "
                 "first (TuringAdvice, Zellers et al., 2021).",
                 _features(ADVICE_FEATURES, created_utc=tfds.features.Scalar(np.int64),
                           advices=advice),
                 "https://rowanzellers.com/advice/")

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    c = self.builder_config
    if c.criteria not in reddit_advice.FILTERS:
      raise ConfigError(f"reddit_advice/{c.name}.criteria: {c.criteria!r} is not one of "
                        f"{', '.join(reddit_advice.FILTERS)}")
    submissions = _dump_files(dl_manager, self, c.submissions)
    comments = _dump_files(dl_manager, self, c.comments)
    situations, _ = reddit_advice.FILTERS[c.criteria](
        itertools.chain.from_iterable(reddit.iter_records(p) for p in submissions),
        itertools.chain.from_iterable(reddit.iter_records(p) for p in comments))
    if c.criteria == "dynamic":
      splits = {"test": situations}
    elif c.cut:
      splits = dict(zip(("train", "validation"), reddit_advice.split_by_date(situations, c.cut)))
    else:
      splits = {"train": situations}
    return {name: self._generate_examples(rows) for name, rows in splits.items() if rows}

  def _generate_examples(self, situations: Sequence[reddit_advice.Situation]):
    return _numbered(
        {**{k: getattr(s, k) for k in ADVICE_FEATURES}, "created_utc": s.created_utc,
         "advices": [dataclasses.asdict(a) for a in s.advices]} for s in situations)


def to_situation(row: Mapping[str, Any]) -> reddit_advice.Situation:
  """A `reddit_advice` row as a `reddit_advice.Situation`."""
  r = decode(row)
  a = r["advices"]
  advices = tuple(reddit_advice.Advice(i.decode("utf-8"), b.decode("utf-8"), int(n))
                  for i, b, n in zip(a["id"], a["body"], a["score"]))
  return reddit_advice.Situation(*(r[k] for k in ADVICE_FEATURES), int(r["created_utc"]), advices)


# --- Building and reading --------------------------------------------------------------------

BUILDERS: dict[str, type[tfds.core.GeneratorBasedBuilder]] = {
    b.name: b for b in (SimTldr, OpenaiTldr, OpenaiComparisons, Alpaca, RedditTldr, RedditAdvice)}


def builder(name: str, config: str | tfds.core.BuilderConfig | None = None,
            data_dir: str | None = None) -> tfds.core.GeneratorBasedBuilder:
  """The builder of dataset `name` (a key of `BUILDERS`) writing `FILE_FORMAT` under `data_dir`
  (None: TFDS's default, `~/tensorflow_datasets` or `$TFDS_DATA_DIR`)."""
  if name not in BUILDERS:
    raise ValueError(f"unknown dataset {name!r} (available: {', '.join(BUILDERS)})")
  return BUILDERS[name](config=config, data_dir=data_dir, file_format=FILE_FORMAT)


def prepare(name: str, config: str | tfds.core.BuilderConfig | None = None,
            data_dir: str | None = None, manual_dir: str | None = None,
            beam_options: Sequence[str] | None = None) -> tfds.core.GeneratorBasedBuilder:
  """The builder of `name`, its dataset built from `manual_dir` first unless `data_dir` holds it.

  `beam_options`, Beam pipeline flags (`["--runner=DirectRunner"]`; `[]` is Beam's default, the
  DirectRunner), build `reddit_tldr` as a Beam pipeline; the command line is not read for them."""
  options = None
  if beam_options is not None:
    if name != RedditTldr.name:
      raise ValueError(f"{name} has no Beam build (only {RedditTldr.name} has one)")
    options = _beam().options.pipeline_options.PipelineOptions(flags=list(beam_options))
  b = builder(name, config, data_dir)
  b.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=manual_dir,
                                                                      beam_options=options))
  return b


def read(b: tfds.core.DatasetBuilder, split: str) -> list[dict[str, Any]]:
  """Every row of a built split, in order, decoded (`decode`)."""
  source = b.as_data_source(split)
  return [decode(row) for row in source.__getitems__(range(len(source)))]


def read_examples(b: tfds.core.DatasetBuilder, split: str) -> list[pipeline.Tldr]:
  """A split of a post dataset (`sim_tldr`, `openai_tldr`, `reddit_tldr`) as `pipeline.Tldr`s."""
  return [to_example(row) for row in read(b, split)]
