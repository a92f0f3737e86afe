"""Text shown on the labeling site: the Markdown guidelines (each protocol's default loads, renders,
and raw HTML or javascript: links in it cannot reach the page; a bad path is a ConfigError) and the
word-level differences between two responses (a worked example, exact reconstruction of random
texts, nothing marked for identical or unrelated texts)."""

import random
import re

import pytest

from rlhfjax.errors import ConfigError
from rlhfjax.labeling import diff
from rlhfjax.labeling import guidelines
from rlhfjax.labeling import protocols


@pytest.mark.parametrize("protocol", sorted(protocols.PROTOCOLS))
def test_default_guidelines_load_and_render(protocol):
  text = guidelines.load(protocol)
  assert 40 <= len(text.splitlines()) <= 90
  html = guidelines.render(text)
  assert html.startswith("<h1>") and "<h2>" in html and "<li>" in html
  assert "Skip" in html and "Flag" in html


def test_tables_render():
  assert "<td>1</td>" in guidelines.render("| key | answer |\n|---|---|\n| 1 | left |\n")


def test_guidelines_from_a_file(tmp_path):
  path = tmp_path / "mine.md"
  path.write_text("# Ours\n\n- one\n- two\n", encoding="utf-8")
  assert guidelines.load("alpacafarm", str(path)) == "# Ours\n\n- one\n- two\n"


def test_unreadable_guidelines_are_a_config_error(tmp_path):
  missing = str(tmp_path / "missing.md")
  with pytest.raises(ConfigError, match=f"labeling.guidelines.*{re.escape(missing)}"):
    guidelines.load("stiennon", missing)
  binary = tmp_path / "binary.md"
  binary.write_bytes(b"\xff\xfe\x00")
  with pytest.raises(ConfigError, match="labeling.guidelines"):
    guidelines.load("stiennon", str(binary))
  with pytest.raises(ValueError, match="unknown protocol"):
    guidelines.load("nope")


def test_raw_html_is_escaped():
  html = guidelines.render("<script>alert(1)</script>\n\nText <img src=x onerror=alert(1)> more\n")
  assert "<script" not in html and "<img" not in html
  assert "&lt;script&gt;" in html and "&lt;img src=x onerror=alert(1)&gt;" in html


@pytest.mark.parametrize("link", ["[x](javascript:alert(1))", "[x](JaVaScRiPt:alert(1))",
                                  "[x](&#106;avascript:alert(1))", "<javascript:alert(1)>"])
def test_javascript_links_are_not_made(link):
  html = guidelines.render(f"See {link} and [ok](https://example.org).")
  assert html.count("<a ") == 1
  assert re.findall(r'href="([^"]*)"', html) == ["https://example.org"]


def test_worked_example():
  a, b = diff.words("the cat sat on the mat", "the dog sat on a mat")
  assert a == [("the ", False), ("cat", True), (" sat on ", False), ("the", True), (" mat", False)]
  assert b == [("the ", False), ("dog", True), (" sat on ", False), ("a", True), (" mat", False)]


def test_a_changed_run_covers_the_spaces_inside_it_and_punctuation():
  a, b = diff.words("  a big red dog.\n\nIt ran.", "a small blue dog\n\nIt ran.")
  assert a == [("  a ", False), ("big red dog.", True), ("\n\nIt ran.", False)]
  assert b == [("a ", False), ("small blue dog", True), ("\n\nIt ran.", False)]


def test_identical_and_unrelated_texts_mark_nothing():
  text = "Same words,\n  same\tspacing. "
  assert diff.words(text, text) == ([(text, False)], [(text, False)])
  assert diff.words("alpha beta gamma", "one two three four") == (
      [("alpha beta gamma", False)], [("one two three four", False)])
  # One shared word out of twelve: below diff.MIN_RATIO.
  assert diff.words("a b c d e shared", "f g h i j shared")[0] == [("a b c d e shared", False)]
  assert diff.words("", "") == ([], [])
  assert diff.words("", "x y") == ([], [("x y", False)])


VOCAB = ["the", "cat", "mat.", "Hello,", "(yes)", "naïve", "日本語", "emoji😀", "don't", "—", "x"]
SPACES = [" ", " ", " ", "  ", "\n", "\n\n", "\t", "\u00a0", "\u3000", " \n "]


def _text(rng: random.Random) -> str:
  n = rng.randint(0, 30)
  parts = [rng.choice(["", " ", "\n"])]
  for _ in range(n):
    parts += [rng.choice(VOCAB), rng.choice(SPACES)]
  return "".join(parts[:-1] if n and rng.random() < 0.5 else parts)


def _edit(rng: random.Random, text: str) -> str:
  words = text.split(" ")
  for _ in range(rng.randint(0, 4)):
    i = rng.randrange(len(words) + 1)
    op = rng.choice(["insert", "delete", "replace"])
    if op == "insert":
      words.insert(i, rng.choice(VOCAB))
    elif i < len(words):
      if op == "delete":
        del words[i]
      else:
        words[i] = rng.choice(VOCAB)
  return " ".join(words)


def test_random_texts_reconstruct_exactly():
  rng = random.Random(0)
  for _ in range(300):
    a = _text(rng)
    b = _edit(rng, a) if rng.random() < 0.8 else _text(rng)
    both = diff.words(a, b)
    for text, segments in zip((a, b), both):
      assert "".join(s for s, _ in segments) == text
      assert all(s for s, _ in segments)
      assert all(c1 != c2 for (_, c1), (_, c2) in zip(segments, segments[1:]))
      assert all(s == s.strip() for s, c in segments if c)
    # The unmarked words are the common subsequence, unless nothing is marked (unrelated texts).
    kept_a, kept_b = ([w for s, c in segments if not c for w in s.split()] for segments in both)
    assert kept_a == kept_b or not any(c for segments in both for _, c in segments)
