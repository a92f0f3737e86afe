"""Comparison records: both upstream layouts round-trip; a malformed line names its file and line."""

import json

import pytest

from rlhfjax.errors import DataError
from rlhfjax.feedback import records

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
