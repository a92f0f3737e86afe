"""Comparison records: both upstream layouts round-trip, as JSON Lines or as one JSON array; a
malformed record names its file and line (JSON Lines) or its record number (an array)."""

import dataclasses
import json
import os
import re

import pytest

from rlhfjax.data import records
from rlhfjax.errors import DataError

OPENAI_ROW = {"info": {"id": "t3_abc", "post": "My boyfriend forgot my birthday.", "title": "Help",
                       "subreddit": "relationships"},
              "summaries": [{"text": " He forgot my birthday.", "policy": "sup2", "note": None},
                            {"text": " Birthday.", "policy": "ref", "note": "too short"}],
              "choice": 1, "worker": "w7", "batch": "batch3", "split": "valid1",
              "extra": {"confidence": 8}}
ALPACA_ROW = {"instruction": "Name a colour.", "input": "", "output_1": "Blue.", "output_2": "7",
              "preference": 1}


def _write_lines(path, lines):
  path.write_bytes(b"\n".join(l if isinstance(l, bytes) else l.encode() for l in lines) + b"\n")


def test_openai_fields():
  c = records.from_openai(OPENAI_ROW)
  assert (c.prompt, c.title, c.subreddit, c.id) == ("My boyfriend forgot my birthday.", "Help",
                                                    "relationships", "t3_abc")
  assert (c.choice, c.annotator, c.split, c.confidence) == (1, "w7", "valid1", 8)
  assert (c.policy_a, c.policy_b, c.note_b) == ("sup2", "ref", "too short")
  assert records.preferred([c]) == [(" Birthday.", " He forgot my birthday.")]


def test_alpaca_fields():
  c = records.from_alpaca(ALPACA_ROW)
  assert (c.prompt, c.response_a, c.response_b, c.choice) == ("Name a colour.", "Blue.", "7", 0)
  assert records.to_alpaca(c) == ALPACA_ROW


@pytest.mark.parametrize("layout,row", [("openai", OPENAI_ROW), ("alpaca", ALPACA_ROW)])
def test_file_round_trip(tmp_path, layout, row):
  path = tmp_path / "c.jsonl"
  _write_lines(path, [json.dumps(row)] * 3)
  got, problems = records.read(str(path), layout)
  assert problems == [] and len(got) == 3
  out = tmp_path / "out.jsonl"
  records.write(str(out), got, layout)
  again, _ = records.read(str(out), layout)
  assert again == got
  if layout == "alpaca":
    assert json.loads(out.read_text().splitlines()[0]) == row
  else:
    back = json.loads(out.read_text().splitlines()[0])
    assert back["info"] == row["info"] and back["choice"] == 1 and back["extra"] == row["extra"]
    assert [s["text"] for s in back["summaries"]] == [s["text"] for s in row["summaries"]]


def test_malformed_lines_are_named_and_the_rest_kept(tmp_path):
  path = tmp_path / "bad.jsonl"
  bad_choice = dict(OPENAI_ROW, choice=2)
  one_summary = dict(OPENAI_ROW, summaries=OPENAI_ROW["summaries"][:1])
  _write_lines(path, [json.dumps(OPENAI_ROW), "{not json", json.dumps(bad_choice), b"\xff\xfe",
                      json.dumps(one_summary), "", json.dumps(OPENAI_ROW)])
  got, problems = records.read(str(path), "openai")
  assert len(got) == 2
  assert [p.split(": ")[0] for p in problems] == [f"{path}:{n}" for n in (2, 3, 4, 5)]
  assert "choice" in problems[1] and "summaries" in problems[3]
  with pytest.raises(DataError, match=rf"{path}:2: .*\(and 3 more\)"):
    records.read_strict(str(path), "openai")


def test_unknown_layout(tmp_path):
  with pytest.raises(ValueError, match="layout"):
    records.write(str(tmp_path / "x"), [], "csv")


def _alpaca(prompt, a, b, choice, input_=""):
  return records.Comparison(prompt=prompt, input=input_, response_a=a, response_b=b, choice=choice)


def test_alpacafarm_array_keeps_good_records_and_names_bad_ones(tmp_path):
  path = tmp_path / "alpaca_human_preference.json"
  good = dict(ALPACA_ROW, input="Any colour.")
  accented = {"instruction": "Nomme un café.", "input": "", "output_1": "Le Procope.",
              "output_2": "Du thé.", "preference": 2}
  no_output_2 = {k: v for k, v in ALPACA_ROW.items() if k != "output_2"}
  rows = [good, dict(ALPACA_ROW, preference=3), no_output_2, "not a record", accented]
  path.write_text(json.dumps(rows, indent=4), "utf-8")  # As AlpacaFarm's files are laid out.
  got, problems = records.read(str(path), "alpaca")
  assert got == [_alpaca("Name a colour.", "Blue.", "7", 0, "Any colour."),
                 _alpaca("Nomme un café.", "Le Procope.", "Du thé.", 1)]
  assert problems == [f"{path}: record 2 (index 1): 'preference' must be 1 or 2 (1.5: a tie), got 3",
                      f"{path}: record 3 (index 2): missing field 'output_2'",
                      f"{path}: record 4 (index 3): not a JSON object"]
  with pytest.raises(DataError, match=re.escape(
      f"{path}: record 2 (index 1): 'preference' must be 1 or 2 (1.5: a tie), got 3 (and 2 more)")):
    records.read_strict(str(path), "alpaca")


def test_openai_layout_in_an_array(tmp_path):
  path = tmp_path / "comparisons.json"
  path.write_text("\n  " + json.dumps([OPENAI_ROW, dict(OPENAI_ROW, choice=2), OPENAI_ROW]))
  got, problems = records.read(str(path), "openai")
  assert got == [records.from_openai(OPENAI_ROW)] * 2
  assert problems == [f"{path}: record 2 (index 1): 'choice' must be 0 or 1 (null: a tie), got 2"]


def test_truncated_array_is_an_error_naming_file_line_and_column(tmp_path):
  path = tmp_path / "truncated.json"
  path.write_text('[\n    {"instruction": "a", "output_1": "b", "output_2": "c", "preference": 1},'
                  '\n    {"instruction": "d", "outp', "utf-8")
  for read in (records.read, records.read_strict):
    with pytest.raises(DataError, match=re.escape(
        f"{path}:3:26: invalid JSON: Unterminated string starting at (the file starts with '[', "
        "so it is read as one JSON array; none of it was read)")):
      read(str(path), "alpaca")


def test_array_that_is_not_utf8_is_an_error_naming_the_line(tmp_path):
  path = tmp_path / "latin1.json"
  path.write_bytes(b'[\n  {"instruction": "caf\xe9"}\n]')
  with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:2: not UTF-8 "):
    records.read(str(path), "alpaca")



def test_alpaca_json_lines_unchanged(tmp_path):
  path = tmp_path / "pref.jsonl"
  _write_lines(path, ["", json.dumps(ALPACA_ROW), json.dumps([ALPACA_ROW]),
                      json.dumps(dict(ALPACA_ROW, preference=0)), json.dumps(ALPACA_ROW)])
  got, problems = records.read(str(path), "alpaca")
  assert got == [_alpaca("Name a colour.", "Blue.", "7", 0)] * 2
  assert problems == [f"{path}:3: not a JSON object",
                      f"{path}:4: 'preference' must be 1 or 2 (1.5: a tie), got 0"]

ROUND_TRIP = [_alpaca("Name a colour.", "Blue.", "7", 0, "Any colour."),
              _alpaca("Nomme un café.", "Le Procope.", "Du thé.", 1)]


@pytest.mark.parametrize("layout", ["openai", "alpaca"])
@pytest.mark.parametrize("name,as_array,expect_array", [
    ("c.json", None, True), ("c.jsonl", None, False), ("c.jsonl", True, True),
    ("c.json", False, False)])
def test_write_read_round_trip_array_and_lines(tmp_path, layout, name, as_array, expect_array):
  path = str(tmp_path / name)
  records.write(path, ROUND_TRIP, layout, as_array=as_array)
  assert os.listdir(tmp_path) == [name]  # No temporary file left behind.
  with open(path, encoding="utf-8") as f:
    text = f.read()
  assert "Nomme un café." in text  # ensure_ascii=False.
  dump = records.to_alpaca if layout == "alpaca" else records.to_openai
  if expect_array:
    assert text.startswith("[\n    {\n        ") and text.endswith("\n]\n")
    assert json.loads(text) == [dump(c) for c in ROUND_TRIP]
  else:
    assert [json.loads(l) for l in text.splitlines()] == [dump(c) for c in ROUND_TRIP]
  got, problems = records.read(path, layout)
  assert problems == []
  if layout == "alpaca":
    assert got == ROUND_TRIP
  else:  # OpenAI's layout has no `input`; the rest comes back.
    assert got == [dataclasses.replace(c, input="") for c in ROUND_TRIP]


@pytest.mark.parametrize("as_array", [True, False])
def test_failed_write_keeps_the_old_file(tmp_path, as_array):
  path = tmp_path / "c.json"
  records.write(str(path), ROUND_TRIP, "openai", as_array=as_array)
  before = path.read_bytes()
  unwritable = dataclasses.replace(ROUND_TRIP[0], confidence=object())
  with pytest.raises(TypeError, match="not JSON serializable"):
    records.write(str(path), [ROUND_TRIP[1], unwritable], "openai", as_array=as_array)
  assert path.read_bytes() == before
  assert os.listdir(tmp_path) == ["c.json"]


# Binary feedback: TRL's unpaired preference layout.

BINARY_ROW = {"prompt": "My boyfriend forgot my birthday.", "completion": " He forgot.",
              "label": True}


@pytest.mark.parametrize("name", ["b.jsonl", "b.json"])
def test_binary_layout_round_trip_and_trl_rows(tmp_path, name):
  full = records.Feedback(prompt="Name a colour.", completion="7", label=False, annotator="w7",
                          split="valid1", policy="sft", id="p1", input="Any colour.",
                          batch="label", extra={"item": "abc"})
  plain = records.from_binary(BINARY_ROW)
  assert plain == records.Feedback(prompt=BINARY_ROW["prompt"], completion=" He forgot.",
                                   label=True)
  path = str(tmp_path / name)
  records.write_binary(path, [full, plain])
  text = open(path, encoding="utf-8").read()
  rows = json.loads(text) if name.endswith(".json") else [json.loads(l) for l in text.splitlines()]
  assert rows[1] == BINARY_ROW  # Nothing but TRL's three fields when nothing else is known.
  assert rows[0]["label"] is False and rows[0]["split"] == "valid1"
  assert records.read_binary_strict(path) == [full, plain]


@pytest.mark.parametrize("row, reason", [
    ({**BINARY_ROW, "label": 1}, "'label' must be true or false, got 1"),
    ({**BINARY_ROW, "label": "true"}, "'label' must be true or false, got \"true\""),
    ({**BINARY_ROW, "label": None}, "'label' must be true or false, got null"),
    ({"prompt": "p", "completion": "c"}, "missing field 'label'"),
    ({"prompt": "p", "label": False}, "missing field 'completion'"),
    # TRL's conversational format is read (tests/test_trl_formats.py), but not half of it.
    ({**BINARY_ROW, "prompt": [{"role": "user", "content": "Hi"}]},
     "field 'completion' must be a non-empty list of messages"),
    ({**BINARY_ROW, "completion": 3}, "field 'completion' has type int"),
])
def test_binary_layout_is_strict_and_names_the_line(tmp_path, row, reason):
  path = tmp_path / "feedback.jsonl"
  _write_lines(path, [json.dumps(BINARY_ROW), json.dumps(row), json.dumps(BINARY_ROW)])
  got, problems = records.read_binary(str(path))
  assert len(got) == 2 and problems == [f"{path}:2: {reason}"]
  with pytest.raises(DataError, match=re.escape(f"{path}:2: {reason}")):
    records.read_binary_strict(str(path))


def test_unpaired_makes_the_chosen_desirable_and_the_rejected_not():
  c = records.from_openai(OPENAI_ROW)  # choice 1: " Birthday." (policy ref) preferred.
  chosen, rejected = records.unpaired([c])
  assert (chosen.completion, chosen.label, chosen.policy) == (" Birthday.", True, "ref")
  assert (rejected.completion, rejected.label, rejected.policy) == (
      " He forgot my birthday.", False, "sup2")
  for f in (chosen, rejected):
    assert (f.prompt, f.id, f.title, f.subreddit, f.split, f.annotator) == (
        c.prompt, "t3_abc", "Help", "relationships", "valid1", "w7")
  with pytest.raises(ValueError, match="ties"):
    records.unpaired([dataclasses.replace(c, tie=True)])
