"""OpenAI TL;DR filters, split and files; Alpaca prompts, files and AlpacaFarm splits."""

import json
import os
import random
import types

import pytest

from rlhfjax.data import formats
from rlhfjax.errors import ConfigError, DataError
from rlhfjax.sources import alpaca, openai_tldr


def words(n, word="word"):
  return " ".join(f"{word}{i}" for i in range(n))


def count_words(text):
  return len(text.split())


def record(i, **kw):
  row = {"id": f"t3_{i}", "subreddit": "relationships", "title": f"Question number {i}",
         "post": f"post {i}: " + words(20), "summary": words(30)}
  row.update(kw)
  return row


# One edge case a record; the comment names the filter that should remove it ("-" when kept).
RECORDS = [
    record(1),  # -
    record(2, post=record(1)["post"]),  # duplicate_body
    record(3, parent_id="t3_1"),  # not_top_level
    record(4, id="t1_4"),  # not_top_level
    record(5, top_level=False),  # not_top_level
    record(6, subreddit="politics"),  # subreddit
    record(7, subreddit="ASKREDDIT"),  # - (subreddits match case-insensitively)
    record(8, title="Edit: I forgot to mention my age"),  # title
    record(9, title="UPDATE - my boss and the parking spot"),  # title
    record(10, title="[Update] Girlfriend [24F] and the dog"),  # title
    record(11, title="Editing my resume, any advice?"),  # -
    record(12, post=words(513)),  # post_length
    record(13, post=words(512, "w")),  # -
    record(14, summary=words(23)),  # summary_length
    record(15, summary=words(24)),  # -
    record(16, summary=words(48)),  # -
    record(17, summary=words(49)),  # summary_length
    record(18, summary="P.S. " + words(29)),  # summary_prefix
    record(19, summary="EDIT: " + words(29)),  # summary_prefix
    record(20, summary=" ps: " + words(29)),  # summary_prefix
    types.SimpleNamespace(**record(21, summary="Psychology " + words(29))),  # - (an object)
    record(22, post=record(6)["post"]),  # duplicate_body (of a post removed later)
]


def test_each_filter_removes_its_cases():
  f = openai_tldr.filter_posts(RECORDS, count_words)
  assert f.total == 22
  assert f.removed == {"duplicate_body": 2, "not_top_level": 3, "subreddit": 1, "title": 3,
                       "post_length": 1, "summary_prefix": 3, "summary_length": 2}
  assert [e.id for e in f.posts] == [f"t3_{i}" for i in (1, 7, 11, 13, 14, 15, 16, 17, 18, 19,
                                                          20, 21)]
  assert [e.id for e in f.sft] == [f"t3_{i}" for i in (1, 7, 11, 13, 15, 16, 21)]
  first = f.sft[0]
  assert first == openai_tldr.TldrExample("t3_1", "relationships", "Question number 1",
                                          RECORDS[0]["post"], RECORDS[0]["summary"])


def test_filter_bounds_are_parameters():
  f = openai_tldr.filter_posts(RECORDS, count_words, subreddits=("politics",), max_post_tokens=600,
                               min_summary_tokens=23, max_summary_tokens=49)
  assert f.removed["subreddit"] == 16  # Every top-level, non-duplicate post but r/politics.
  assert [e.id for e in f.posts] == ["t3_6"]
  assert openai_tldr.filter_posts(RECORDS[13:17], count_words, min_summary_tokens=23,
                                  max_summary_tokens=49).removed["summary_length"] == 0


def test_removed_table():
  table = openai_tldr.removed_table(openai_tldr.filter_posts(RECORDS, count_words))
  assert table.splitlines() == [
      "| filter | removed | remaining |", "|---|---:|---:|", "| (input) | | 22 |",
      "| duplicate_body | 2 | 20 |", "| not_top_level | 3 | 17 |", "| subreddit | 1 | 16 |",
      "| title | 3 | 13 |", "| post_length | 1 | 12 |", "| summary_prefix | 3 | 9 |",
      "| summary_length | 2 | 7 |"]


@pytest.mark.parametrize("title,update", [
    ("Edit: more info", True), ("EDIT 2 - it got worse", True), ("UPDATE", True),
    ("[Update] my landlord", True), ("(updated) still broke", True),
    ("**Updates** on the cat", True),
    ("Edits to my essay?", True), ("Editing my resume", False), ("My editor hates me", False),
    ("Updating my phone broke it", False), ("Need advice, update inside", False)])
def test_title_filter(title, update):
  assert openai_tldr.title_is_update(title) is update


@pytest.mark.parametrize("summary,aside", [
    ("P.S. I love you", True), (" PS: thanks", True), ("p.s thanks", True),
    ("P.P.S. and more", True),
    ("Update: she said yes", True), ("edit - typo", True), ("PS4 broke", False),
    ("Psychology major", False), ("People suck", False), ("I edited it", False)])
def test_summary_filter(summary, aside):
  assert openai_tldr.summary_is_aside(summary) is aside


def test_missing_field_names_record():
  with pytest.raises(DataError, match=r"record 1 \(id 't3_2'\): missing field 'post'"):
    openai_tldr.filter_posts([record(1), {k: v for k, v in record(2).items() if k != "post"}],
                             count_words)
  with pytest.raises(DataError, match="field 'title' has type int"):
    openai_tldr.filter_posts([record(1, title=3)], count_words)


def test_validation_split_deterministic_and_about_five_percent():
  examples = [openai_tldr.TldrExample(f"t3_{i:x}", "relationships", "t", f"p{i}", "r")
              for i in range(2000)]
  train, valid = openai_tldr.split_validation(examples)
  assert len(train) + len(valid) == 2000
  assert {e.id for e in train}.isdisjoint(e.id for e in valid)
  assert 70 < len(valid) < 130  # 5% of 2,000 is 100, binomial sd 9.7.
  # Pinned: the hash of the id decides, so this count is the same on every machine and run.
  assert len(valid) == 86
  shuffled = examples[:]
  random.Random(0).shuffle(shuffled)
  assert {e.id for e in openai_tldr.split_validation(shuffled)[1]} == {e.id for e in valid}
  # A larger fraction keeps every post already held out.
  wider = {e.id for e in openai_tldr.split_validation(examples, 0.10)[1]}
  assert {e.id for e in valid} < wider and 160 < len(wider) < 240
  assert openai_tldr.split_validation(examples, 0.0) == (examples, [])
  with pytest.raises(ValueError):
    openai_tldr.split_validation(examples, 1.5)


def _write_lines(path, lines):
  path.write_bytes(b"\n".join(l if isinstance(l, bytes) else l.encode() for l in lines) + b"\n")


def test_tldr_file_round_trip(tmp_path):
  # The layout of tldr_3_filtered/{train,valid,test}.jsonl.
  rows = [{"id": "t3_1fi3ar", "subreddit": "relationships", "title": "Me [21F] with my BF [22M]",
           "post": "We met at university.\n\nNow he ignores me.", "summary": " He ignores me now."},
          {"id": "t3_2", "subreddit": "tifu", "title": "TIFU by ünïcode", "post": "Ok.",
           "summary": "Ü."}]
  path = tmp_path / "train.jsonl"
  _write_lines(path, [json.dumps(r) for r in rows])
  examples = openai_tldr.read_strict(str(path))
  assert examples[0] == openai_tldr.TldrExample("t3_1fi3ar", "relationships",
                                                "Me [21F] with my BF [22M]",
                                                "We met at university.\n\nNow he ignores me.",
                                                " He ignores me now.")
  out = tmp_path / "out.jsonl"
  openai_tldr.write(str(out), examples)
  assert [json.loads(line) for line in out.read_text("utf-8").splitlines()] == rows
  assert openai_tldr.read_strict(str(out)) == examples
  assert not os.path.exists(f"{out}.tmp")


def test_tldr_malformed_lines_named(tmp_path):
  good = json.dumps(record(1))
  path = tmp_path / "valid.jsonl"
  _write_lines(path, [good, "{not json", json.dumps({k: v for k, v in record(2).items()
                                                     if k != "summary"}),
                      "", "[1, 2]", json.dumps(record(5, post=7)), b"\xff\xfe", good])
  examples, problems = openai_tldr.read(str(path))
  assert len(examples) == 2
  assert [p.split(": ", 1)[0] for p in problems] == [f"{path}:{n}" for n in (2, 3, 5, 6, 7)]
  assert problems[1] == f"{path}:3: missing field 'summary'"
  assert problems[2] == f"{path}:5: not a JSON object"
  assert problems[3] == f"{path}:6: field 'post' has type int"
  with pytest.raises(DataError, match=rf"^{path}:2: .*\(and 4 more\)$"):
    openai_tldr.read_strict(str(path))


# Alpaca.

def test_alpaca_prompts_exact():
  assert formats.alpaca_prompt("Name a colour.") == (
      "Below is an instruction that describes a task. Write a response that appropriately "
      "completes the request.\n\n### Instruction:\nName a colour.\n\n### Response:")
  assert formats.alpaca_prompt("Translate to French.", "Good morning") == (
      "Below is an instruction that describes a task, paired with an input that provides further "
      "context. Write a response that appropriately completes the request.\n\n"
      "### Instruction:\nTranslate to French.\n\n### Input:\nGood morning\n\n### Response:")
  assert formats.alpaca_prompt("Name a colour.", None) == formats.alpaca_prompt("Name a colour.")
  # Braces in the text are kept as they are.
  assert formats.alpaca_prompt("Fill {x}", "{y}").count("{x}") == 1


ALPACA_ROWS = [{"instruction": "Give three tips for staying healthy.", "input": "",
                "output": "1. Eat well.\n2. Exercise.\n3. Sleep."},
               {"instruction": "Translate to French.", "input": "Good morning",
                "output": "Bonjour"},
               {"instruction": "Name a colour.", "output": "Blue."}]


def test_alpaca_json_list_and_lines(tmp_path):
  listed = tmp_path / "alpaca_data.json"
  listed.write_text(json.dumps(ALPACA_ROWS, indent=4), "utf-8")  # As alpaca_data.json is laid out.
  lines = tmp_path / "alpaca.jsonl"
  _write_lines(lines, [json.dumps(r) for r in ALPACA_ROWS])
  expected = [alpaca.AlpacaExample("Give three tips for staying healthy.", "",
                                   "1. Eat well.\n2. Exercise.\n3. Sleep."),
              alpaca.AlpacaExample("Translate to French.", "Good morning", "Bonjour"),
              alpaca.AlpacaExample("Name a colour.", "", "Blue.")]
  assert alpaca.read_strict(str(listed)) == expected
  assert alpaca.read_strict(str(lines)) == expected


def test_alpaca_malformed_entries_named(tmp_path):
  listed = tmp_path / "bad.json"
  listed.write_text(json.dumps([ALPACA_ROWS[0], {"instruction": "No output."}, "text",
                                {"instruction": 3, "output": "x"}, ALPACA_ROWS[1]]), "utf-8")
  examples, problems = alpaca.read(str(listed))
  assert len(examples) == 2
  assert problems == [f"{listed}: record 2 (index 1): missing key 'output'",
                      f"{listed}: record 3 (index 2): not a JSON object",
                      f"{listed}: record 4 (index 3): key 'instruction' has type int"]
  with pytest.raises(DataError,
                     match=r"record 2 \(index 1\): missing key 'output' \(and 2 more\)"):
    alpaca.read_strict(str(listed))

  lines = tmp_path / "bad.jsonl"
  _write_lines(lines, [json.dumps(ALPACA_ROWS[0]), json.dumps({"input": "x", "output": "y"}),
                       "{oops"])
  examples, problems = alpaca.read(str(lines))
  assert len(examples) == 1
  assert problems[0] == f"{lines}:2: missing key 'instruction'"
  assert problems[1].startswith(f"{lines}:3: ")

  broken = tmp_path / "broken.json"
  broken.write_text('[\n  {"instruction": "a", "output": "b"},\n  {"instruction": \n]', "utf-8")
  with pytest.raises(DataError, match=rf"^{broken}:4:1: invalid JSON: Expecting value"):
    alpaca.read(str(broken))


def _examples(n):
  return [alpaca.AlpacaExample(f"instruction {i}", "", f"output {i}") for i in range(n)]


def test_alpaca_splits_sizes_disjoint_deterministic():
  assert alpaca.SPLIT_SIZES == {"sft": 10_000, "pref": 10_000, "unlabeled": 20_000,
                                "validation": 2_000}
  data = _examples(100)
  sizes = {"sft": 10, "pref": 10, "unlabeled": 20, "validation": 2}
  splits = alpaca.make_splits(data, seed=3, sizes=sizes)
  assert {k: len(v) for k, v in splits.items()} == sizes
  ids = [e.instruction for v in splits.values() for e in v]
  assert len(set(ids)) == 42
  assert alpaca.make_splits(data, seed=3, sizes=sizes) == splits
  assert alpaca.make_splits(data, seed=4, sizes=sizes) != splits
  # The default sizes take exactly 42,000 examples.
  default = alpaca.make_splits(_examples(42_000), seed=0)
  assert {k: len(v) for k, v in default.items()} == alpaca.SPLIT_SIZES


def test_alpaca_too_few_examples_names_key():
  sizes = {"sft": 10, "pref": 10, "unlabeled": 20, "validation": 2}
  with pytest.raises(ConfigError, match=r"^data\.unlabeled: 20 examples do not fit: the data "
                                        r"has 30, of which the splits before it take 20; lower"):
    alpaca.make_splits(_examples(30), seed=0, sizes=sizes)
  with pytest.raises(ConfigError, match=r"^data\.validation: "):
    alpaca.make_splits(_examples(41_999), seed=0)
  with pytest.raises(ConfigError, match=r"^alpaca\.pref: .*got -1"):
    alpaca.make_splits(_examples(30), seed=0, sizes={"sft": 1, "pref": -1},
                       config_prefix="alpaca")
