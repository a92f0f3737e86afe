"""Tokenizer round trip, special ids, prompt truncation at sentence boundaries, padding."""

import numpy as np
import pytest

from rlhfjax.data import formats
from rlhfjax.data import tokenizer as tokenizer_lib
from rlhfjax.errors import ConfigError

_CORPUS = [
    f"SUBREDDIT: r/relationships\nTITLE: Need advice {i}\nPOST: My boyfriend (2{i % 10}M) forgot my "
    f"birthday. I feel hurt. We have been together for {i % 7 + 1} years!\nTL;DR: He forgot."
    for i in range(300)
]


@pytest.fixture(scope="module")
def tok():
  return tokenizer_lib.train(_CORPUS, vocab_size=320)


def test_special_ids(tok):
  assert (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 1, 2)
  assert tok.pad_id != tok.eos_id
  assert tok.vocab_size == 320


@pytest.mark.parametrize("text", [
    _CORPUS[3],
    "  two  spaces,\ttabs\nand newlines\n\n",
    "Unseen: émigré 😀 [24F] ~~~",
    "",
])
def test_round_trip(tok, text):
  assert tok.decode(tok.encode(text)) == text


def test_decode_stops_at_eos_and_skips_pad(tok):
  ids = tok.encode(" He forgot.")
  assert tok.decode([tok.pad_id] * 3 + ids + [tok.eos_id] + tok.encode(" junk")) == " He forgot."


def test_save_load(tok, tmp_path):
  path = str(tmp_path / "t.model")
  tok.save(path)
  again = tokenizer_lib.load(path)
  assert again.encode(_CORPUS[0]) == tok.encode(_CORPUS[0])
  with pytest.raises(FileNotFoundError, match="nope.model"):
    tokenizer_lib.load(str(tmp_path / "nope.model"))


def test_prompt_fits_without_truncation(tok):
  ids = formats.tldr_prompt(tok, "relationships", "Help", "One. Two.", 512)
  assert tok.decode(ids) == "SUBREDDIT: r/relationships\nTITLE: Help\nPOST: One. Two.\nTL;DR:"


def test_prompt_truncates_whole_sentences(tok):
  post = "My boyfriend forgot my birthday. I feel hurt. We have been together for 3 years!"
  full = len(formats.tldr_prompt(tok, "relationships", "Help", post, 10_000))
  ids = formats.tldr_prompt(tok, "relationships", "Help", post, full - 1)
  text = tok.decode(ids)
  assert len(ids) <= full - 1
  assert text.endswith("POST: My boyfriend forgot my birthday. I feel hurt.\nTL;DR:")


def test_control_code_precedes_the_prompt_and_survives_truncation(tok):
  post = "My boyfriend forgot my birthday. I feel hurt. We have been together for 3 years!"
  plain = formats.tldr_prompt(tok, "relationships", "Help", post, 10_000)
  ids = formats.tldr_prompt(tok, "relationships", "Help", post, len(plain) - 1, "Quality: {good}")
  text = tok.decode(ids)
  assert text.startswith("Quality: {good}\nSUBREDDIT: r/relationships\nTITLE: Help\nPOST: ")
  assert text.endswith("\nTL;DR:") and len(ids) <= len(plain) - 1


def test_prompt_cuts_tokens_when_first_sentence_too_long(tok):
  post = "My boyfriend forgot my birthday and " * 10 + "I feel hurt."
  head = len(formats.tldr_prompt(tok, "r", "t", "", 10_000))
  ids = formats.tldr_prompt(tok, "r", "t", post, head + 5)
  assert len(ids) == head + 5
  assert tok.decode(ids).endswith("\nTL;DR:")
  with pytest.raises(ConfigError, match="prompt_len"):
    formats.tldr_prompt(tok, "r", "a very long title " * 20, post, 10)


def test_response_ends_with_eos_or_is_cut(tok):
  ids = formats.response_tokens(tok, "He forgot.", 20)
  assert ids[-1] == tok.eos_id and tok.decode(ids) == " He forgot."
  cut = formats.response_tokens(tok, "He forgot. " * 20, 8)
  assert len(cut) == 8 and tok.eos_id not in cut


def test_pad_left_and_right():
  toks, mask = formats.pad([[5, 6], [7]], 3, 0, "left")
  np.testing.assert_array_equal(toks, [[0, 5, 6], [0, 0, 7]])
  np.testing.assert_array_equal(mask, [[0, 1, 1], [0, 0, 1]])
  toks, mask = formats.pad([[5, 6], [7]], 3, 0, "right")
  np.testing.assert_array_equal(toks, [[5, 6, 0], [7, 0, 0]])
  np.testing.assert_array_equal(mask, [[1, 1, 0], [1, 0, 0]])


# --- Chat templates (rlhfjax/data/templates.py) -------------------------------------------------

def test_templates_render_as_transformers_does_and_compile_once():
  from rlhfjax.data import templates
  # Loop controls, a namespace, an unescaped tojson, whitespace control as transformers sets it.
  template = ("{% set ns = namespace(n=0) %}{% for m in messages %}"
              "{% if m['role'] == 'system' %}{% continue %}{% endif %}{% set ns.n = ns.n + 1 %}"
              "[{{ m['role'] }}] {{ m['content'] | tojson }}\n{% endfor %}"
              "{% if add_generation_prompt %}<{{ ns.n }}>{% endif %}")
  messages = [{"role": "system", "content": "x"}, {"role": "user", "content": "a<b & \"c\""}]
  templates._compiled.cache_clear()  # pylint: disable=protected-access
  for _ in range(3):
    assert templates.render(template, messages, True) == '[user] "a<b & \\"c\\""\n<1>'
  assert templates._compiled.cache_info().misses == 1  # pylint: disable=protected-access


def test_templates_fail_with_a_config_error_and_stay_in_the_sandbox():
  from rlhfjax.data import templates
  with pytest.raises(ConfigError, match="the chat template failed on 1 messages: roles must alt"):
    templates.render("{{ raise_exception('roles must alternate') }}", [{"role": "user"}], True)
  # A checkpoint's template is untrusted: no reaching Python's internals through its objects.
  with pytest.raises(ConfigError, match="the chat template failed"):
    templates.render("{{ messages.__class__.__mro__ }}", [], True)
  with pytest.raises(ConfigError, match="the chat template failed"):
    templates.render("{% set x = messages.append(1) %}", [], True)  # Immutable.
