"""Pushshift dump reading and TL;DR mining: counts kept and dropped by each rule, bad input, resume
after a truncated dump, the TLDRHQ threshold and the statistics, all checked against hand counts."""

from __future__ import annotations

import bz2
import json
import lzma
import os
import re

import pytest
import zstandard

from rlhfjax.errors import DataError
from rlhfjax.sources import reddit
from rlhfjax.sources import tldr_mining as tm

POST = "My girlfriend and I have been together for two years and we keep fighting about chores."


def submission(id_: str, selftext: str, title: str = "Chores",
               subreddit: str = "relationships") -> dict:
  """A Pushshift submission (RS_*) with the dump's usual fields."""
  return {"archived": False, "author": "throwaway", "created_utc": 1546300800,
          "domain": f"self.{subreddit}", "id": id_, "is_self": True, "num_comments": 3,
          "over_18": False, "permalink": f"/r/{subreddit}/comments/{id_}/chores/",
          "retrieved_on": 1546400000, "score": 12, "selftext": selftext, "stickied": False,
          "subreddit": subreddit, "subreddit_id": "t5_2qjvn", "title": title,
          "url": f"https://www.reddit.com/r/{subreddit}/comments/{id_}/chores/"}


def comment(id_: str, body: str, link: str = "abc", parent: str | None = None) -> dict:
  """A Pushshift comment (RC_*) with the dump's usual fields."""
  return {"author": "helper", "body": body, "controversiality": 0, "created_utc": 1546300900,
          "distinguished": None, "edited": False, "gilded": 0, "id": id_, "link_id": f"t3_{link}",
          "parent_id": parent or f"t3_{link}", "retrieved_on": 1546400000, "score": 5,
          "stickied": False, "subreddit": "relationships", "subreddit_id": "t5_2qjvn"}


def write_dump(path, lines: list[bytes | dict], frames: int = 1) -> str:
  """NDJSON, plain or compressed after the file's extension (`.zst` in `frames` frames)."""
  data = [line if isinstance(line, bytes) else json.dumps(line).encode() for line in lines]
  blob = b"".join(line + b"\n" for line in data)
  path = str(path)
  if path.endswith(".zst"):
    cut = [len(blob) * i // frames for i in range(frames + 1)]
    blob = b"".join(zstandard.ZstdCompressor().compress(blob[a:b]) for a, b in zip(cut, cut[1:]))
  elif path.endswith(".bz2"):
    blob = bz2.compress(blob, compresslevel=1)  # 100 kB blocks: a cut file still yields some.
  elif path.endswith(".xz"):
    blob = lzma.compress(blob)
  with open(path, "wb") as f:
    f.write(blob)
  return path


def bad_bytes(record: dict, marker: str, raw: bytes) -> bytes:
  """The record's JSON line with `marker` (inside a string) replaced by raw, invalid UTF-8 bytes."""
  return json.dumps(record).encode().replace(marker.encode(), raw)


# --- reader ------------------------------------------------------------------------------------


@pytest.mark.parametrize("ext", ["", ".zst", ".bz2", ".xz"])
def test_reader_keeps_every_good_line_and_names_bad_ones(tmp_path, ext):
  lines = [submission("a1", "first"), b"", b'{"id": "a2", "selftext": "cut', b"[1, 2]",
           bad_bytes(submission("a3", "caf@ ok"), "@", b"\xe9\xff"), comment("c1", "second")]
  path = write_dump(tmp_path / f"RS_2019-01{ext}", lines, frames=2 if ext == ".zst" else 1)
  report = reddit.ReadReport(path)
  records = list(reddit.iter_records(path, report))
  assert [r["id"] for r in records] == ["a1", "a3", "c1"]
  assert records[1]["selftext"] == "caf\ufffd\ufffd ok"  # One U+FFFD per invalid sequence.
  assert (report.lines, report.records, report.bad_count) == (6, 3, 2)
  assert report.bad_lines[0].startswith(f"{path}:3: Unterminated string")
  assert report.bad_lines[1] == f"{path}:4: not a JSON object (list)"
  assert (report.replaced_bytes, report.replaced_lines) == (2, 1)


def test_reader_without_report_logs_bad_lines(tmp_path, caplog):
  path = write_dump(tmp_path / "RC_2019-01", [comment("c1", "x"), b"not json"])
  assert [r["id"] for r in reddit.iter_records(path)] == ["c1"]
  assert f"{path}:2:" in caplog.text


@pytest.mark.parametrize("ext", [".zst", ".bz2", ".xz"])
def test_truncated_file_is_an_error_naming_it(tmp_path, ext):
  records = [submission(f"s{i}", f"word{i} " * 400) for i in range(200)]  # Several blocks.
  path = write_dump(tmp_path / f"RS_2019-02{ext}", records)
  with open(path, "rb") as f:
    blob = f.read()
  with open(path, "wb") as f:
    f.write(blob[:len(blob) * 2 // 3])
  seen = []
  expected = rf"{re.escape(path)}: truncated or corrupt {ext[1:]} file .*complete lines"
  with pytest.raises(DataError, match=expected):
    for record in reddit.iter_records(path):
      seen.append(record["id"])
  assert 0 < len(seen) < 200
  assert seen == [f"s{i}" for i in range(len(seen))]  # Whatever came before is intact and in order.


def test_zst_reports_how_far_it_got(tmp_path):
  path = write_dump(tmp_path / "RS_2019-03.zst", [submission("s1", "x")])
  with open(path, "rb") as f:
    blob = f.read()
  with open(path, "wb") as f:
    f.write(blob[:-4])
  size = len(blob) - 4
  with pytest.raises(DataError, match=rf"after {size} of {size} compressed bytes, 0 complete"):
    list(reddit.iter_records(path))


def test_pushshift_field_helpers():
  assert reddit.is_deleted("[deleted]") and reddit.is_deleted(" [removed] ")
  assert reddit.is_deleted("") and reddit.is_deleted(None) and not reddit.is_deleted("[deleted] me")
  top, reply = comment("c1", "x", link="p1"), comment("c2", "y", link="p1", parent="t1_c1")
  assert reddit.is_top_level(top) and not reddit.is_top_level(reply)
  assert reddit.submission_id(reply) == "p1"
  assert reddit.is_comment(top) and not reddit.is_comment(submission("s1", "z"))
  assert reddit.text_of(top) == "x" and reddit.text_of(submission("s1", "z")) == "z"


# --- mining ------------------------------------------------------------------------------------


def test_keyword_rule():
  found = {text: tm.split_tldr(text) for text in [
      "a b. tl;dr c", "a b. TL;DR: c", "a b tl dr c", "a b TLDR c", "a b Tl,dr c", "a b tl/dr c",
      "a b (tl;dr - c)", "TL;DR c", "a bottle;dr c", "a untldr c", "a tldrs c", "a tl dr. c",
      "a tl;;;;dr c"]}
  assert found == {
      "a b. tl;dr c": ("a b.", "c"), "a b. TL;DR: c": ("a b.", "c"), "a b tl dr c": ("a b", "c"),
      "a b TLDR c": ("a b", "c"), "a b Tl,dr c": ("a b", "c"), "a b tl/dr c": ("a b", "c"),
      "a b (tl;dr - c)": ("a b", "c)"), "TL;DR c": ("", "c"), "a bottle;dr c": None,
      "a untldr c": None, "a tldrs c": None, "a tl dr. c": ("a", "c"), "a tl;;;;dr c": None}


def test_keyword_rule_for_links_doubles_and_several_keywords():
  """No keyword in a subreddit link, a hashtag or a domain; "tldr;dr" is one; the last of several
  keywords splits (an earlier one points to it)."""
  assert [tm.split_tldr(t) for t in ("a on r/tldr is b", "a #tldr is b", "a tldr.tech is b")] == \
      [None] * 3
  assert tm.split_tldr("a b TLDR;DR c") == ("a b", "c")
  assert tm.split_tldr("a b tldr:dr c") == ("a b", "c")
  assert tm.split_tldr("a (tl;dr at the bottom). b. TL;DR: c") == (
      "a (tl;dr at the bottom). b.", "c")


def test_extract_finds_keywords_that_cleaning_reveals():
  tail = "we fight about chores and I need advice"
  for text in [f"{POST} _tldr_: {tail}", f"{POST} **TL;DR** {tail}", f"{POST}\n&gt;tl;dr {tail}",
               f"{POST} ~~tl~~dr {tail}"]:
    pair, reason = tm.extract(submission("s1", text))
    assert reason == "kept" and (pair["post"], pair["tldr"]) == (POST, tail), text
  assert tm.extract(submission("s2", f"{POST} atl;dr {tail}")) == (None, "no_keyword")


def test_clean_text():
  raw = ("&gt; quoted **bold** [link text](http://x.com/a_b) see https://t.co/x and_so _it_ ~~s~~ "
         "`code` ^sup\n\n* item\n1. first\n\n---\n# Head &amp;#x200B;\u200b \ud83d end")
  assert tm.clean_text(raw) == ("quoted bold link text see and_so it s code sup item first Head "
                                "\ufffd end")
  # Reddit's backslash escapes keep their character; Pushshift escapes an entity's "&" too; a
  # lone asterisk is arithmetic, not emphasis.
  assert tm.clean_text(r"he said \*not\* so, 5 * 3 \# a&amp;nbsp;b \\o/") == (
      "he said *not* so, 5 * 3 # a b \\o/")


def mining_fixture(tmp_path) -> tuple[str, str]:
  tail = " and now I need advice on what to do."  # 9 words, so the TL;DR is long enough.
  submissions = [
      submission("s01", f"{POST}\n\n**TL;DR:** we fight about chores{tail}"),  # kept
      submission("s02", f"TL;DR: chores{tail}\n\n{POST}"),  # keyword first: empty post
      submission("s03", "[deleted]"),
      submission("s04", "[removed]"),
      submission("s05", ""),  # A link post.
      submission("s06", f"{POST} I drank from the bottle;dr, it was untldr of me."),  # no keyword
      submission("s07", f"{POST}\nTLDR we fight{tail}"),  # kept
      submission("s08", f"{POST} Tl,dr: fights{tail}"),  # kept
      submission("s09", f"{POST} tl;dr: too short"),  # 2 words
      submission("s10", f"Chores. tl;dr: we fight{tail}"),  # TL;DR longer than post
      b'{"id": "s11", "selftext": ',  # Malformed: line 11.
      bad_bytes(submission("s12", f"{POST} Caf@ talk. TL;DR we fight{tail}"), "@", b"\xe9"),  # kept
  ]
  comments = [
      comment("c1", f"{POST} tl dr we fight about it{tail}"),  # kept
      comment("c2", f"{POST} tl/dr we fight{tail} https://example.com/x"),  # kept, URL cleaned
      comment("c3", "[deleted]"),
      comment("c4", f"{POST} No summary here at all, see https://tldr.sh for one."),  # URL only
      comment("c5", f"{POST}\n\n&gt; TL;DR: [we fight](https://x.com) about chores{tail}",
              parent="t1_c1"),  # kept (a reply)
  ]
  return (write_dump(tmp_path / "RS_2019-01", submissions),
          write_dump(tmp_path / "RC_2019-01.zst", comments))


def test_mine_counts_every_rule(tmp_path):
  rs, rc = mining_fixture(tmp_path)
  out = str(tmp_path / "pairs.jsonl")
  result = tm.mine([rs, rc], out)
  by_file = {os.path.basename(f["input"]): f for f in result["files"]}
  assert by_file["RS_2019-01"]["counts"] == {
      "deleted": 3, "no_keyword": 1, "short_post": 1, "short_tldr": 1, "tldr_not_shorter": 1,
      "kept": 4}
  assert by_file["RS_2019-01"]["bad_count"] == 1
  assert by_file["RS_2019-01"]["bad_lines"][0].startswith(f"{rs}:11: ")
  assert by_file["RS_2019-01"]["replaced_bytes"] == 1
  assert by_file["RC_2019-01.zst"]["counts"] == {
      "deleted": 1, "no_keyword": 1, "short_post": 0, "short_tldr": 0, "tldr_not_shorter": 0,
      "kept": 3}
  assert result["counts"]["kept"] == 7 and result["counts"]["bad_count"] == 1
  pairs = list(tm.read_pairs(out))
  assert [p["id"] for p in pairs] == ["t3_s01", "t3_s07", "t3_s08", "t3_s12",
                                      "t1_c1", "t1_c2", "t1_c5"]
  assert pairs[0] == {"id": "t3_s01", "kind": "submission", "subreddit": "relationships",
                      "title": "Chores", "post": POST,
                      "tldr": "we fight about chores and now I need advice on what to do.",
                      "created_utc": 1546300800, "source": "RS_2019-01"}
  assert pairs[3]["post"] == f"{POST} Caf\ufffd talk."
  assert pairs[5]["tldr"] == "we fight and now I need advice on what to do."
  assert pairs[6]["kind"] == "comment" and pairs[6]["title"] == ""
  assert pairs[6]["tldr"] == "we fight about chores and now I need advice on what to do."


def test_mine_thresholds_are_configurable(tmp_path):
  rs, _ = mining_fixture(tmp_path)
  config = tm.MiningConfig(min_post_words=0, min_tldr_words=2, tldr_shorter_than_post=False)
  counts = tm.mine([rs], str(tmp_path / "loose.jsonl"), config)["counts"]
  dropped = (counts["short_post"], counts["short_tldr"], counts["tldr_not_shorter"])
  assert dropped == (0, 0, 0) and counts["kept"] == 7


def test_truncated_dump_keeps_finished_pairs_and_resumes(tmp_path):
  rs, rc = mining_fixture(tmp_path)
  late = [comment(f"d{i}", f"{POST} tl;dr we fight every single day now {i}") for i in range(400)]
  good = write_dump(tmp_path / "RC_2019-02.zst", late)
  with open(good, "rb") as f:
    blob = f.read()
  broken = str(tmp_path / "broken" / "RC_2019-02.zst")
  os.makedirs(os.path.dirname(broken))
  with open(broken, "wb") as f:
    f.write(blob[:len(blob) // 2])
  out = str(tmp_path / "pairs.jsonl")
  with pytest.raises(DataError, match=rf"{re.escape(broken)}: truncated or corrupt zst file") as e:
    tm.mine([rs, rc, broken], out)
  assert "rerun" in str(e.value)
  assert not os.path.exists(out)
  parts = out + ".parts"
  assert sorted(os.listdir(parts)) == ["RC_2019-01.zst.json", "RC_2019-01.zst.jsonl",
                                       "RC_2019-02.zst.jsonl.partial", "RS_2019-01.json",
                                       "RS_2019-01.jsonl"]
  assert len(list(tm.read_pairs(os.path.join(parts, "RS_2019-01.jsonl")))) == 4
  assert len(list(tm.read_pairs(os.path.join(parts, "RC_2019-01.zst.jsonl")))) == 3

  result = tm.mine([rs, rc, good], out)  # The whole file again: only it is mined.
  assert [f["resumed"] for f in result["files"]] == [True, True, False]
  assert result["counts"]["kept"] == 4 + 3 + 400
  ids = [p["id"] for p in tm.read_pairs(out)]
  assert len(ids) == len(set(ids)) == 407 and ids[-1] == "t1_d399"

  changed = tm.mine([rs], out, tm.MiningConfig(min_tldr_words=1))  # Other settings: mined again.
  assert changed["files"][0]["resumed"] is False and changed["counts"]["kept"] == 5


def test_a_stop_between_a_part_and_its_note_mines_the_input_again(tmp_path, monkeypatch):
  """The part is committed before its note: a run stopped between the two leaves the old note,
  which does not match the new settings, so the next run mines the input again (it used to reuse
  the old part under the new note)."""
  rs, _ = mining_fixture(tmp_path)
  out = str(tmp_path / "pairs.jsonl")
  tm.mine([rs], out)
  new = tm.MiningConfig(min_tldr_words=1)

  # Stop at whichever of the two writes comes second: the part's rename or the note.
  writes, write_note, rename = [], tm._write_json, os.replace

  def second(what):
    writes.append(what)
    if len(writes) == 2:
      raise KeyboardInterrupt

  def note(path, obj):
    second("note")
    write_note(path, obj)

  def replace(src, dst):
    if str(dst).endswith(".jsonl") and ".parts" in str(dst):
      second("part")
    rename(src, dst)
  with monkeypatch.context() as m:
    m.setattr(tm, "_write_json", note)
    m.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
      tm.mine([rs], out, new)
  assert writes == ["part", "note"]
  again = tm.mine([rs], out, new)
  assert again["files"][0]["resumed"] is False and again["counts"]["kept"] == 5
  assert len(list(tm.read_pairs(out))) == 5


def test_duplicate_input_names_are_refused(tmp_path):
  a = write_dump(tmp_path / "RS_2019-01", [])
  os.makedirs(tmp_path / "b")
  b = write_dump(tmp_path / "b" / "RS_2019-01", [])
  with pytest.raises(ValueError, match="distinct file names"):
    tm.mine([a, b], str(tmp_path / "out.jsonl"))
  # One month twice, decompressed beside its .zst (as the authors' pipeline leaves it): each pair
  # would be mined twice.
  c = write_dump(tmp_path / "RS_2019-01.zst", [])
  with pytest.raises(ValueError, match=r"the same dump more than once \(RS_2019-01, "
                                       r"RS_2019-01.zst\)"):
    tm.mine([a, c], str(tmp_path / "out.jsonl"))


# --- TLDRHQ and statistics ---------------------------------------------------------------------

# The TL;DR has 6 tokens and 5 bigrams, none longer than 3 letters (so stemming does not apply). A
# sentence of m tokens sharing only "red hat" with it has ROUGE-2 F1 = 2*1/((m-1)+5) and ROUGE-L
# F1 = 2*2/(m+6); their mean is 1/12 + 2/14 = 0.22619 for m = 8 and 1/13 + 2/15 = 0.21026 for m = 9.
TLDR = "my cat ate the red hat"
ABOVE = {"post": "We went out. You saw his red hat at one bar.", "tldr": TLDR}  # 2nd, m=8.
BELOW = {"post": "So you saw his red hat at one bar. We went out.", "tldr": TLDR}  # 1st, m=9.


def test_oracle_and_hq_threshold():
  index, score = tm.oracle(["We went out.", "You saw his red hat at one bar."], TLDR)
  assert index == 1 and score == pytest.approx(1 / 12 + 2 / 14)
  index, score = tm.oracle(["So you saw his red hat at one bar.", "We went out."], TLDR)
  assert index == 0 and score == pytest.approx(1 / 13 + 2 / 15)
  kept = list(tm.high_quality([ABOVE, BELOW]))
  assert kept == [{**ABOVE, "oracle_index": 1, "oracle_score": pytest.approx(0.2261905)}]
  assert len(list(tm.high_quality([ABOVE, BELOW], threshold=0.21))) == 2
  assert tm.oracle([], TLDR) == (-1, 0.0)


def test_write_high_quality(tmp_path):
  src, dst = str(tmp_path / "pairs.jsonl"), str(tmp_path / "hq.jsonl")
  with open(src, "w", encoding="utf-8") as f:
    f.write(json.dumps(ABOVE) + "\n" + json.dumps(BELOW) + "\n")
  assert tm.write_high_quality(src, dst) == {"pairs": 2, "kept": 1, "dropped": 1}
  assert [p["post"] for p in tm.read_pairs(dst)] == [ABOVE["post"]]


def test_statistics_by_hand():
  stats = tm.statistics([ABOVE, BELOW], lead_k=(1, 2))
  # Words: 11 and 12 per post, 6 per TL;DR; 2 sentences per post, 1 per TL;DR.
  assert stats["instances"] == 2
  assert stats["post_words"] == 11.5 and stats["tldr_words"] == 6
  assert stats["post_sentences"] == 2 and stats["tldr_sentences"] == 1
  assert stats["compression_ratio"] == pytest.approx(11.5 / 6)
  assert stats["vocabulary"] == 16  # 12 words of the posts + my, cat, ate, the.
  # Novel: 4 of 6 unigrams, 4 of 5 bigrams ("red hat" is in the post), every 3- and 4-gram.
  assert stats["novel_ngrams"] == pytest.approx({"1": 400 / 6, "2": 80.0, "3": 100.0, "4": 100.0})
  assert stats["oracle_position"] == {"1": 50.0, "2": 50.0, "3": 0.0, "4": 0.0, "5": 0.0, "6+": 0.0}
  # ROUGE F1 with o overlapping n-grams between m and n of them is 2o / (m + n).
  base = stats["baselines"]
  assert base["ORACLE-EXT"] == pytest.approx({"rouge1": 50 * (4 / 14 + 4 / 15),
                                              "rouge2": 50 * (2 / 12 + 2 / 13),
                                              "rougeL": 50 * (4 / 14 + 4 / 15)})
  assert base["LEAD-1"] == pytest.approx({"rouge1": 50 * 4 / 15, "rouge2": 50 * 2 / 13,
                                          "rougeL": 50 * 4 / 15})
  assert base["LEAD-2"] == pytest.approx({"rouge1": 50 * (4 / 17 + 4 / 18),
                                          "rouge2": 50 * (2 / 15 + 2 / 16),
                                          "rougeL": 50 * (4 / 17 + 4 / 18)})
  table = tm.markdown({"mini": stats, "hq": tm.statistics([ABOVE], lead_k=(1, 2))})
  assert "| | mini | hq |" in table and "| Instances | 2 | 1 |" in table
  assert "| Compression ratio | 1.92 | 1.83 |" in table
  assert "| Novel 2-grams (%) | 80.00 | 80.00 |" in table
  assert f"| mini | ORACLE-EXT | {50 * (4 / 14 + 4 / 15):.2f} |" in table
  with pytest.raises(ValueError):
    tm.statistics([])
