"""TFDS builders (array_record, no TensorFlow) and `loading.load_splits` from a TFDS source.

Each dataset is built once per module from fixtures written here in the upstream layouts; the tests
read the built splits back."""

import json
import logging
import os

import ml_collections
import numpy as np
import pytest

from rlhfjax.data import pipeline
from rlhfjax.data import records
from rlhfjax.errors import ConfigError, DataError
from rlhfjax.simulated import gold, world
from rlhfjax.sources import alpaca, loading, openai_tldr, tfds_builders

SIZES = dict(sft=6, pref=3, unlabeled=3, validation=2, test=2)


class Warnings(logging.Handler):
  """Collects the warnings logged while the module's datasets are built."""

  def __init__(self):
    super().__init__(logging.WARNING)
    self.messages = []

  def emit(self, record):
    self.messages.append(record.getMessage())


def data_cfg(**kw):
  cfg = dict(source="sim_tldr", seed=3, reference_noise=1.0, tfds_name="sim_tldr", tfds_config="",
             data_dir="", manual_dir="", **SIZES)
  cfg.update(kw)
  return ml_collections.ConfigDict(cfg)


def tldr_row(i, split):
  return {"id": f"t3_{split}{i}", "subreddit": "relationships", "title": f"Title {i}",
          "post": f"Post {i} of {split}, héllo.", "summary": f"summary {i}"}


def write_lines(path, lines):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write("".join(line + "\n" for line in lines))


def write_tldr(root, skip=()):
  """tldr_3_filtered: train (3 good, a line that is not JSON, a blank one), valid (2), test (1)."""
  files = {"train": [json.dumps(tldr_row(0, "train")), json.dumps(tldr_row(1, "train")),
                     "{not json", "", json.dumps(tldr_row(2, "train"))],
           "valid": [json.dumps(tldr_row(i, "valid")) for i in range(2)],
           "test": [json.dumps(tldr_row(0, "test"))]}
  for split, lines in files.items():
    if split not in skip:
      write_lines(os.path.join(root, f"{split}.jsonl"), lines)


def comparison(i, split, choice=0, confidence=None):
  return records.Comparison(prompt=f"post {i}", response_a=f"a{i}", response_b=f"b{i}",
                            choice=choice, annotator=f"w{i}", confidence=confidence, split=split,
                            policy_a="ref", policy_b="sup2", id=f"t3_{i}", title=f"title {i}",
                            subreddit="tifu", batch=f"batch{i}", note_a="n", note_b="")


def comparison_line(c):
  return json.dumps(records.to_openai(c))


# batch3.json: 2 train, 1 valid1, a malformed line (choice 2); batch10.json: 1 valid2, 1 train, one
# record whose split is unknown. Natural order puts batch3 first.
BATCH3 = [comparison(1, "train", 1, 8), comparison(2, "valid1"), comparison(3, "train", 0, 2)]
BATCH10 = [comparison(4, "valid2", 1), comparison(5, "train")]


def write_comparisons(root):
  lines3 = [comparison_line(BATCH3[0]), comparison_line(BATCH3[1]),
            comparison_line(BATCH3[2]).replace('"choice": 0', '"choice": 2'),
            comparison_line(BATCH3[2])]
  lines10 = [comparison_line(BATCH10[0]), comparison_line(comparison(6, "test")),
             comparison_line(BATCH10[1])]
  write_lines(os.path.join(root, "comparisons", "batch3.json"), lines3)
  write_lines(os.path.join(root, "comparisons", "batch10.json"), lines10)


ALPACA_ROWS = [{"instruction": f"Do thing {i}.", "input": "" if i % 2 else f"input {i}",
                "output": f"Done {i}."} for i in range(11)]


def write_alpaca(root):
  rows = ALPACA_ROWS[:5] + [{"instruction": "no output"}] + ALPACA_ROWS[5:]
  with open(os.path.join(root, "alpaca_data.json"), "w", encoding="utf-8") as f:
    json.dump(rows, f, indent=4)


ALPACA_CONFIG = dict(name="small", seed=1, sft=4, pref=3, unlabeled=2, validation=1)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  """Every dataset built once: (data_dir, manual dirs, warnings logged while building)."""
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  manual = {name: str(tmp_path_factory.mktemp(name)) for name in ("tldr", "cmp", "alpaca")}
  write_tldr(manual["tldr"])
  write_comparisons(manual["cmp"])
  write_alpaca(manual["alpaca"])
  handler = Warnings()
  logging.getLogger().addHandler(handler)
  try:
    tfds_builders.prepare("openai_tldr", None, data_dir, manual["tldr"])
    tfds_builders.prepare("openai_comparisons", None, data_dir, manual["cmp"])
    tfds_builders.prepare("alpaca", tfds_builders.AlpacaConfig(**ALPACA_CONFIG), data_dir,
                          manual["alpaca"])
    sim = loading.load_splits(data_cfg(source="tfds", data_dir=data_dir))
  finally:
    logging.getLogger().removeHandler(handler)
  return data_dir, manual, handler.messages, sim


def test_sim_tldr_round_trip_equals_the_in_memory_world(built):
  data_dir, _, _, sim = built
  memory = loading.load_splits(data_cfg())
  assert {k: len(v) for k, v in sim.items()} == SIZES
  assert sim == memory  # Same ids, text and latent situations, in the same order.
  assert sim["sft"][0].id == "sim-3-0" and sim["test"][-1].id == "sim-3-15"
  refs = [e.reference for e in memory["test"]]
  np.testing.assert_array_equal(gold.gold_rewards(sim["test"], refs),
                                gold.gold_rewards(memory["test"], refs))
  b = tfds_builders.builder("sim_tldr", tfds_builders.sim_tldr_config(3, SIZES, 1.0), data_dir)
  assert b.info.splits["pref"].num_examples == 3
  assert b.data_dir.endswith(os.path.join("sim_tldr", "seed3-noise1-6-3-3-2-2", "1.0.0"))


def test_load_splits_reuses_a_built_dataset(built):
  data_dir = built[0]
  info = os.path.join(tfds_builders.builder(
      "sim_tldr", tfds_builders.sim_tldr_config(3, SIZES, 1.0), data_dir).data_dir,
      "dataset_info.json")
  before = os.stat(info).st_mtime_ns
  assert loading.load_splits(data_cfg(source="tfds", data_dir=data_dir)) == built[3]
  assert os.stat(info).st_mtime_ns == before


def test_situation_json_round_trip():
  e = world.generate(5, 7, 1)[0]
  assert tfds_builders.situation_from_json(tfds_builders.situation_to_json(e.situation)) == \
      e.situation


def test_openai_tldr_counts_ids_and_malformed_line(built):
  data_dir, manual, warnings, _ = built
  b = tfds_builders.builder("openai_tldr", data_dir=data_dir)
  assert {s: b.info.splits[s].num_examples for s in ("train", "valid", "test")} == \
      {"train": 3, "valid": 2, "test": 1}
  train = tfds_builders.read_examples(b, "train")
  assert [e.id for e in train] == ["t3_train0", "t3_train1", "t3_train2"]
  assert train[0].post == "Post 0 of train, héllo." and train[0].reference == "summary 0"
  assert train[0].situation is None
  train_file = os.path.join(manual["tldr"], "train.jsonl")
  bad = [m for m in warnings if m.startswith(f"{train_file}:")]
  assert len(bad) == 1 and bad[0].startswith(f"{train_file}:3: ") and "(skipped)" in bad[0]


def test_load_splits_maps_openai_tldr_splits(built):
  data_dir, manual, _, _ = built
  splits = loading.load_splits(data_cfg(source="tfds", tfds_name="openai_tldr",
                                         data_dir=data_dir, manual_dir=manual["tldr"]))
  want = {name: [openai_tldr.TldrExample(**{**{k: r[k] for k in ("id", "subreddit", "title",
                                                                  "post")},
                                            "reference": r["summary"]})
                 for r in rows]
          for name, rows in (("train", [tldr_row(i, "train") for i in range(3)]),
                             ("valid", [tldr_row(i, "valid") for i in range(2)]),
                             ("test", [tldr_row(0, "test")]))}
  mapping = {"sft": "train", "pref": "train", "unlabeled": "train", "validation": "valid",
             "test": "test"}
  assert set(splits) == set(mapping)
  for ours, theirs in mapping.items():
    assert [tfds_builders.post_row(e) for e in splits[ours]] == \
        [tfds_builders.post_row(e) for e in want[theirs]]
    assert all(e.situation is None for e in splits[ours])
  with pytest.raises(ConfigError, match="data.source"):
    gold.gold_rewards(splits["test"], ["a summary"])


def test_openai_comparisons_split_by_field(built):
  data_dir, manual, warnings, _ = built
  b = tfds_builders.builder("openai_comparisons", data_dir=data_dir)
  got = {s: [tfds_builders.to_comparison(r) for r in tfds_builders.read(b, s)]
         for s in b.info.splits}
  assert got == {"train": [BATCH3[0], BATCH3[2], BATCH10[1]], "valid1": [BATCH3[1]],
                 "valid2": [BATCH10[0]]}
  assert got["train"][0].confidence == 8.0 and got["valid1"][0].confidence is None
  batch3 = os.path.join(manual["cmp"], "comparisons", "batch3.json")
  batch10 = os.path.join(manual["cmp"], "comparisons", "batch10.json")
  assert [m for m in warnings if m.startswith(batch3)] == \
      [f"{batch3}:3: 'choice' must be 0 or 1 (null: a tie), got 2 (skipped)"]
  assert [m for m in warnings if m.startswith(batch10)] == \
      [f"{batch10}: record 1 (id 't3_6'): unknown split 'test' (skipped)"]


def test_alpaca_splits(built):
  data_dir, manual, warnings, _ = built
  b = tfds_builders.builder("alpaca", tfds_builders.AlpacaConfig(**ALPACA_CONFIG), data_dir)
  got = {s: [tfds_builders.to_alpaca(r) for r in tfds_builders.read(b, s)] for s in b.info.splits}
  assert {s: len(v) for s, v in got.items()} == {"sft": 4, "pref": 3, "unlabeled": 2,
                                                 "validation": 1}
  examples = [alpaca.from_row(r) for r in ALPACA_ROWS]
  sizes = {k: ALPACA_CONFIG[k] for k in alpaca.SPLIT_SIZES}
  want = alpaca.make_splits(examples, ALPACA_CONFIG["seed"], sizes)
  assert {s: [e for _, e in v] for s, v in got.items()} == want
  ids = [i for v in got.values() for i, _ in v]
  assert len(set(ids)) == 10 and all(examples[int(i.split("-")[1])] == e
                                     for v in got.values() for i, e in v)
  path = os.path.join(manual["alpaca"], "alpaca_data.json")
  assert f"{path}: record 6 (index 5): missing key 'output' (skipped)" in warnings


def test_alpaca_default_sizes_too_large(built, tmp_path):
  with pytest.raises(ConfigError, match=r"alpaca/alpaca_farm\.sft: 10000 examples do not fit"):
    tfds_builders.prepare("alpaca", None, str(tmp_path), built[1]["alpaca"])


def test_missing_manual_file_is_named(tmp_path):
  manual = str(tmp_path / "manual")
  write_tldr(manual, skip=("test",))
  with pytest.raises(DataError, match=r"manual[/\\]test\.jsonl: not found\. .*tldr_3_filtered"):
    tfds_builders.prepare("openai_tldr", None, str(tmp_path / "data"), manual)
  with pytest.raises(DataError, match=r"openai_comparisons: comparisons/batch\*\.json not found"):
    tfds_builders.prepare("openai_comparisons", None, str(tmp_path / "data"),
                          str(tmp_path / "empty"))


@pytest.mark.parametrize("kw, key", [
    (dict(source="huggingface"), "data.source"),
    (dict(source="tfds", tfds_name="reddit_advice"), "data.tfds_name"),
    (dict(source="tfds", tfds_config="huge"), "data.tfds_config"),
])
def test_config_errors_name_the_key(kw, key, tmp_path):
  with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
    loading.load_splits(data_cfg(data_dir=str(tmp_path), **kw))


def test_missing_split_is_a_config_error(tmp_path):
  # TFDS stores no empty split, so a world with test=0 has no 'test' split to map.
  with pytest.raises(ConfigError, match=r"data\.tfds_name: .*no split 'test'"):
    loading.load_splits(data_cfg(source="tfds", data_dir=str(tmp_path),
                                  **{**SIZES, "sft": 2, "pref": 1, "unlabeled": 1,
                                     "validation": 1, "test": 0}))


# --- Reddit dumps ------------------------------------------------------------------------------

def write_dump(path, records, extra_lines=()):
  """A Pushshift dump: NDJSON, zstd-compressed."""
  import zstandard
  text = "".join(json.dumps(r) + "\n" for r in records) + "".join(f"{x}\n" for x in extra_lines)
  with open(path, "wb") as f:
    f.write(zstandard.ZstdCompressor().compress(text.encode("utf-8")))


def sentence(topic, n=26):
  return " ".join(f"{topic}{i}" for i in range(n - 1)) + " end."


# Posts of 3 sentences; a TL;DR that copies a sentence of its post passes TLDRHQ, one of unrelated
# words does not. 26 words and a period are 27 tokens: inside OpenAI's 24..48.
POST_A = " ".join(sentence(t) for t in ("alpha", "beta", "gamma"))
POST_B = " ".join(sentence(t) for t in ("delta", "eps", "zeta"))
POST_C = " ".join(sentence(t) for t in ("eta", "theta", "iota"))
POST_D = " ".join(sentence(t) for t in ("kappa", "lam", "mu"))
SUBMISSIONS = [
    {"id": "s1", "subreddit": "relationships", "title": "My boyfriend and me",
     "selftext": f"{POST_A}\n\nTL;DR: {sentence('beta')}"},  # full, hq, openai
    {"id": "s2", "subreddit": "politics", "title": "Taxes",
     "selftext": f"{POST_B} tl;dr - {sentence('eps')}"},  # full, hq (subreddit not OpenAI's)
    {"id": "s3", "subreddit": "relationships", "title": "Roommate",
     "selftext": f"{POST_C} TLDR: {sentence('unrelated')}"},  # full, openai (oracle score 0)
    {"id": "s4", "subreddit": "relationships", "title": "No keyword", "selftext": POST_A},
    {"id": "s5", "subreddit": "relationships", "title": "Gone", "selftext": "[deleted]"},
    {"id": "s6", "subreddit": "relationships", "title": "Short", "selftext": f"{POST_B} TL;DR: ok"},
]
COMMENTS = [{"id": "c1", "subreddit": "relationships", "link_id": "t3_s1", "parent_id": "t3_s1",
             "body": f"{POST_D} tl dr: {sentence('lam')}"}]  # full, hq (a comment: not OpenAI's)
TLDR_IDS = {"full": {"t3_s1", "t3_s2", "t3_s3", "t1_c1"}, "hq": {"t3_s1", "t3_s2", "t1_c1"},
            "openai_filtered": {"t3_s1", "t3_s3"}}


@pytest.fixture(scope="module")
def reddit_tldr(tmp_path_factory):
  manual = tmp_path_factory.mktemp("dumps")
  data_dir = str(tmp_path_factory.mktemp("tfds_reddit"))
  write_dump(manual / "RS_2019-01.zst", SUBMISSIONS, ["[1, 2]"])
  write_dump(manual / "RC_2019-01.zst", COMMENTS)
  handler = Warnings()
  logging.getLogger().addHandler(handler)
  try:
    builders = {c: tfds_builders.prepare("reddit_tldr", c, data_dir, str(manual))
                for c in TLDR_IDS}
  finally:
    logging.getLogger().removeHandler(handler)
  return builders, str(manual), handler.messages, data_dir


def test_reddit_tldr_configs(reddit_tldr):
  builders, manual, warnings, _ = reddit_tldr
  for config, ids in TLDR_IDS.items():
    b = builders[config]
    got = [e for s in b.info.splits for e in tfds_builders.read_examples(b, s)]
    assert {e.id for e in got} == ids, config
    assert sum(b.info.splits[s].num_examples for s in b.info.splits) == len(ids)
  s1 = next(e for e in tfds_builders.read_examples(builders["full"], "train") if e.id == "t3_s1")
  assert (s1.subreddit, s1.title, s1.post, s1.reference) == \
      ("relationships", "My boyfriend and me", POST_A, sentence("beta"))
  rs = os.path.join(manual, "RS_2019-01.zst")
  # Each config's build reports it.
  assert {m for m in warnings if m.startswith(rs)} == \
      {f"{rs}:7: not a JSON object (list) (skipped)"}


def test_load_splits_needs_every_mapped_split(reddit_tldr):
  # Four pairs hold out 5% each by id hash: none lands in validation, which load_splits needs.
  want = (r"data\.tfds_name: reddit_tldr/full/1\.0\.0 has no split 'validation' for the "
          r"'validation' split \(it has: train\)")
  with pytest.raises(ConfigError, match=want):
    loading.load_splits(data_cfg(source="tfds", tfds_name="reddit_tldr", tfds_config="full",
                                  data_dir=reddit_tldr[3], manual_dir=reddit_tldr[1]))


def test_split_by_id():
  ids = [types_id(i) for i in range(40)]
  assert tfds_builders.split_by_id(ids, 0.0, 0.0)["train"] == ids
  assert tfds_builders.split_by_id(ids, 1.0, 0.0)["validation"] == ids
  assert tfds_builders.split_by_id(ids, 0.0, 1.0)["test"] == ids
  split = tfds_builders.split_by_id(ids, 0.25, 0.25)
  assert split["validation"] == [e for e in ids if openai_tldr.in_validation(e.id, 0.25)]
  assert split["test"] == [e for e in ids if not openai_tldr.in_validation(e.id, 0.25)
                           and openai_tldr.in_validation(e.id, 0.5)]
  assert sorted(sum(split.values(), []), key=ids.index) == ids
  assert all(split[k] for k in split)  # 40 ids: each split gets some.


def types_id(i):
  return openai_tldr.TldrExample(f"t3_{i}", "", "", "", "")


JULY_1_2019 = 1561939200
ADVICE = "You should talk to them calmly about it and explain how you feel, then listen."


def advice_post(pid, subreddit, score, created):
  return {"id": pid, "subreddit": subreddit, "title": f"Question {pid}?", "is_self": True,
          "selftext": "My roommate never cleans up and I do not know how to bring it up with them "
                      "without a fight.", "score": score, "created_utc": created}


def advice_comment(cid, pid, score, parent=None):
  return {"id": cid, "link_id": f"t3_{pid}", "parent_id": parent or f"t3_{pid}",
          "body": f"{ADVICE} ({cid})", "score": score, "author": f"user_{cid}"}


def test_reddit_advice_static_with_date_cut(tmp_path):
  posts = [advice_post("p1", "relationship_advice", 50, JULY_1_2019 - 86400),
           advice_post("p2", "Advice", 15, JULY_1_2019 + 86400),
           advice_post("p3", "politics", 50, JULY_1_2019),  # Not an advice subreddit.
           advice_post("p4", "relationship_advice", 40, JULY_1_2019)]  # Best advice scores < 20.
  comments = [advice_comment("c1", "p1", 30), advice_comment("c2", "p1", 12),
              advice_comment("c3", "p1", 5),  # Score <= 10.
              advice_comment("c4", "p1", 90, parent="t1_c1"),  # A reply, not advice.
              advice_comment("c5", "p2", 25), advice_comment("c6", "p4", 15),
              advice_comment("c7", "p3", 40)]
  write_dump(tmp_path / "RS_2019-07.zst", posts)
  write_dump(tmp_path / "RC_2019-07.zst", comments)
  config = tfds_builders.RedditAdviceConfig(name="cut", criteria="static", cut="2019-07-01")
  b = tfds_builders.prepare("reddit_advice", config, str(tmp_path / "data"), str(tmp_path))
  got = {s: [tfds_builders.to_situation(r) for r in tfds_builders.read(b, s)]
         for s in b.info.splits}
  assert {s: [x.id for x in v] for s, v in got.items()} == {"train": ["p1"], "validation": ["p2"]}
  p1 = got["train"][0]
  assert [(a.id, a.score) for a in p1.advices] == [("c1", 30), ("c2", 12)]
  assert p1.advices[0].body == f"{ADVICE} (c1)" and p1.created_utc == JULY_1_2019 - 86400
  assert p1.title == "Question p1?" and p1.subreddit == "relationship_advice"


# --- reddit_tldr as an Apache Beam pipeline (DirectRunner) --------------------------------------

def has_beam():
  import importlib.util
  return importlib.util.find_spec("apache_beam") is not None


needs_beam = pytest.mark.skipif(not has_beam(), reason="apache_beam is not installed (the Beam "
                                "build of reddit_tldr needs `pip install apache-beam`)")

GOOD = [{"id": f"e{k}", "subreddit": "relationships", "title": f"Flatmate {k}",
         "selftext": " ".join(sentence(f"w{k}{t}") for t in "abc")
                     + f" TL;DR: {sentence(f'w{k}b')}"} for k in range(6)]
FEBRUARY = [
    {**SUBMISSIONS[0], "id": "s7", "title": "Same body, next month"},  # OpenAI: duplicate_body.
    *GOOD,  # Pass every selection; by id hash at 1/3 + 1/3: e0-e2 train, e3-e4 test, e5 validation.
    {"id": "u1", "subreddit": "relationships", "title": "Update: my boyfriend",  # OpenAI: title.
     "selftext": " ".join(sentence(t) for t in ("nu", "xi", "omi")) + f" TL;DR: {sentence('xi')}"},
    {"id": "u2", "subreddit": "relationships", "title": "Short summary",  # OpenAI: summary_length.
     "selftext": " ".join(sentence(t) for t in ("pi", "rho", "sig"))
                 + f" TL;DR: {sentence('rho', 11)}"},
]
# Every split gets examples in every selection: TFDS's Beam writer refuses an empty split.
THIRDS = dict(validation_fraction=1 / 3, test_fraction=1 / 3)
BEAM_IDS = {
    "full": TLDR_IDS["full"] | {"t3_s7", "t3_u1", "t3_u2"} | {f"t3_e{k}" for k in range(6)},
    "hq": TLDR_IDS["hq"] | {"t3_s7", "t3_u1", "t3_u2"} | {f"t3_e{k}" for k in range(6)},
    "openai_filtered": TLDR_IDS["openai_filtered"] | {f"t3_e{k}" for k in range(6)},
}


@pytest.fixture(scope="module")
def beam_builds(tmp_path_factory):
  """Each selection built in this process and with Beam's DirectRunner from three dumps:
  {selection: (builder, Beam builder)}, the manual_dir and the warnings of the Beam builds."""
  manual = tmp_path_factory.mktemp("beam_dumps")
  write_dump(manual / "RS_2019-01.zst", SUBMISSIONS, ["[1, 2]"])
  write_dump(manual / "RC_2019-01.zst", COMMENTS)
  write_dump(manual / "RS_2019-02.zst", FEBRUARY)
  built = {}
  handler = Warnings()
  for selection in BEAM_IDS:
    config = tfds_builders.RedditTldrConfig(name=f"{selection}_thirds", selection=selection,
                                            **THIRDS)
    plain = tfds_builders.prepare("reddit_tldr", config, str(tmp_path_factory.mktemp("plain")),
                                  str(manual))
    logging.getLogger().addHandler(handler)
    try:
      beam = tfds_builders.prepare("reddit_tldr", config, str(tmp_path_factory.mktemp("beam")),
                                   str(manual), beam_options=["--runner=DirectRunner"])
    finally:
      logging.getLogger().removeHandler(handler)
    built[selection] = (plain, beam)
  return built, str(manual), handler.messages


@needs_beam
def test_reddit_tldr_beam_build_equals_the_build_in_process(beam_builds):
  built, _, _ = beam_builds
  for selection, ids in BEAM_IDS.items():
    plain, beam = built[selection]
    assert list(beam.info.splits) == list(plain.info.splits) == ["train", "validation", "test"]
    got = {s: tfds_builders.read_examples(beam, s) for s in beam.info.splits}
    assert got == {s: tfds_builders.read_examples(plain, s) for s in plain.info.splits}, selection
    assert {e.id for rows in got.values() for e in rows} == ids, selection
  full = {s: [e.id for e in tfds_builders.read_examples(built["full"][1], s)]
          for s in ("train", "validation", "test")}
  # In file order (RC_2019-01, RS_2019-01, RS_2019-02; records in order), split by id hash.
  assert full == {"train": ["t1_c1", "t3_s1", "t3_e0", "t3_e1", "t3_e2", "t3_u1"],
                  "validation": ["t3_s2", "t3_s7", "t3_e5", "t3_u2"],
                  "test": ["t3_s3", "t3_e3", "t3_e4"]}


@needs_beam
def test_reddit_tldr_beam_counts(beam_builds):
  built, manual, warnings = beam_builds
  mined = {"mined/kept": 13, "mined/no_keyword": 1, "mined/deleted": 1, "mined/short_tldr": 1,
           "read/lines": 17, "read/bad_count": 1}
  for selection in BEAM_IDS:
    counts = built[selection][1].beam_counts
    assert {k: v for k, v in counts.items() if k.startswith(("mined/", "read/"))} == mined
  assert {k: v for k, v in built["hq"][1].beam_counts.items() if k.startswith("hq/")} == \
      {"hq/kept": 12, "hq/dropped": 1}
  # s7 repeats s1's body in the next month's dump: the first (s1) is kept, as in file order.
  assert {k: v for k, v in built["openai_filtered"][1].beam_counts.items()
          if k.startswith("openai/")} == \
      {"openai/input": 13, "openai/duplicate_body": 1, "openai/deduplicated": 12,
       "openai/not_top_level": 1, "openai/subreddit": 1, "openai/title": 1,
       "openai/summary_length": 1, "openai/kept": 8}
  assert built["full"][0].beam_counts == {}  # The build in this process counts nothing.
  rs = os.path.join(manual, "RS_2019-01.zst")
  assert [m for m in warnings if m.startswith(rs)] == \
      [f"{rs}:7: not a JSON object (list) (skipped)"] * len(BEAM_IDS)


@needs_beam
def test_reddit_tldr_beam_refuses_an_empty_split(reddit_tldr, tmp_path):
  # The four pairs of the first fixture put none in validation (5% each by id hash).
  with pytest.raises(DataError, match=r"reddit_tldr/full: .* is 0 for split (validation|test)\b.*"
                                      r"cannot store an empty split"):
    tfds_builders.prepare("reddit_tldr", "full", str(tmp_path), reddit_tldr[1], beam_options=[])


def test_only_reddit_tldr_builds_with_beam(tmp_path):
  with pytest.raises(ValueError, match="alpaca has no Beam build"):
    tfds_builders.prepare("alpaca", None, str(tmp_path), str(tmp_path), beam_options=[])
