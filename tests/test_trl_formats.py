"""TRL's dataset formats from JSONL, Parquet and Arrow, in the layouts of real datasets: every good
row kept, a malformed row named and skipped, token ids as worked out by hand (implicit prompts,
conversations through a chat template, multi-turn prompts, only the final assistant turn trained)."""

import json
import os
import re

import numpy as np
import pytest

import trl_fixtures as fx
from rlhfjax.data import chat
from rlhfjax.data import pipeline
from rlhfjax.data import records
from rlhfjax.data import tables
from rlhfjax.data import tokenizer as tokenizer_lib
from rlhfjax.data import trl
from rlhfjax.errors import ConfigError, DataError
from rlhfjax.sources import loading

PLEN, RLEN = 128, 32


@pytest.fixture(scope="module")
def tok():
  corpus = [json.dumps(r) for r in fx.hh_rows() + fx.tldr_rows()] + \
      [fx.TEMPLATE, "<|user|>\n<|assistant|>\n"] * 5
  t = tokenizer_lib.train(corpus, vocab_size=400)
  t.chat_template = fx.TEMPLATE
  return t


def _ids(batch, key, i):
  return batch[key][i][batch[f"{key}_mask"][i]].tolist()


def test_hh_rlhf_jsonl_implicit_prompt(tmp_path, tok):
  rows = fx.hh_rows()
  path = fx.write_jsonl(str(tmp_path / "hh" / "train.jsonl"), rows + [{"chosen": "x", "rejected": 3}],
                        raw_lines=[(4, b'{"chosen": "cut')])  # Line 5 is not JSON.
  comps, problems = records.read(path, "trl")
  assert len(comps) == len(rows)
  assert problems == [f"{path}:5: Invalid control character at: line 1 column 16 (char 15)",
                      f"{path}:14: field 'rejected' has type int"]
  first, multi = comps[0], comps[1]
  assert (first.prompt, first.response_a, first.response_b, first.style) == (
      "\n\nHuman: Hi there\n\nAssistant:", " Hello! How can I help?", " Go away.", "standard")
  assert multi.prompt == "\n\nHuman: Name a colour.\n\nAssistant: Blue?\n\nHuman: Another.\n\n" \
                         "Assistant:"
  assert (multi.response_a, multi.response_b) == (" Green.", " No.")
  batch = pipeline.encode_comparisons(tok, comps, PLEN, RLEN)
  assert _ids(batch, "prompt", 0) == tok.encode("\n\nHuman: Hi there\n\nAssistant:")
  assert _ids(batch, "chosen", 0) == tok.encode(" Hello! How can I help?") + [tok.eos_id]
  assert _ids(batch, "rejected", 0) == tok.encode(" Go away.") + [tok.eos_id]
  assert _ids(batch, "chosen", 1) == tok.encode(" Green.") + [tok.eos_id]


def test_extract_prompt_follows_trl():
  # Strings: split at the first differing character, the space before it going to the responses.
  assert trl.extract_prompt("The sky is blue.", "The sky is green.") == (
      "The sky is", " blue.", " green.")
  assert trl.extract_prompt("ab", "ac") == ("a", "b", "c")
  # Nothing differs before the shorter one ends: TRL's loop index stops at its length minus one.
  assert trl.extract_prompt("abc", "ab") == ("a", "bc", "b")
  # Message lists: the longest shared run of messages.
  c = [fx.user("Hi"), fx.assistant("Hello"), fx.user("Colour?"), fx.assistant("Blue")]
  r = c[:3] + [fx.assistant("Red")]
  assert trl.extract_prompt(c, r) == (c[:3], c[3:], r[3:])


def _uf_shards(tmp_path, rows):
  """UltraFeedback's Hub layout: data/train_prefs-0000N-of-00002.parquet."""
  half = len(rows) // 2
  d = tmp_path / "ultrafeedback_binarized" / "data"
  return [fx.write_parquet(str(d / f"train_prefs-0000{i}-of-00002.parquet"), part, fx.UF_SCHEMA)
          for i, part in enumerate((rows[:half], rows[half:]))]


def test_ultrafeedback_parquet_shards_conversational_and_multi_turn(tmp_path, tok):
  rows = fx.uf_rows()
  bad = [dict(rows[2], rejected=None, prompt_id="bad1"),
         dict(rows[3], chosen=[fx.user("Only a question.")], prompt_id="bad2")]
  shards = _uf_shards(tmp_path, rows[:6] + bad + rows[6:])
  root = os.path.dirname(os.path.dirname(shards[0]))
  for path in (root, os.path.join(root, "data"), os.path.join(root, "data", "train_prefs-*.parquet")):
    comps, problems = records.read(path, "trl")
    assert [c.id for c in comps] == [r["prompt_id"] for r in rows]  # Every good row, in order.
    # The last row of shard 1 has a null `rejected`; the first of shard 2 a `chosen` with no answer.
    assert problems == [
        f"{shards[0]}: row 7 (index 6): field 'rejected' must be a non-empty list of messages",
        f"{shards[1]}: row 1 (index 0): field 'chosen' ends with a 'user' message, not an "
        "assistant turn to train"]
  first, multi = comps[0], comps[1]
  assert first.messages == (("user", "What is 0 times two?"),)
  assert (first.response_a, first.response_b) == ("0.", "0, I think.")
  assert first.extra == {"prompt_id": "p000", "messages": rows[0]["messages"],
                         "score_chosen": 9.0, "score_rejected": 3.0,
                         "prompt": "What is 0 times two?"}  # Extra columns kept.
  assert multi.messages == (("user", "Name a colour."), ("assistant", "Blue."),
                            ("user", "Another."))
  batch = pipeline.encode_comparisons(tok, comps, PLEN, RLEN)
  assert _ids(batch, "prompt", 0) == tok.encode(
      "<|user|>\nWhat is 0 times two?\n<|assistant|>\n")
  assert _ids(batch, "chosen", 0) == tok.encode("0.") + [tok.eos_id]
  assert _ids(batch, "rejected", 0) == tok.encode("0, I think.") + [tok.eos_id]
  # Multi-turn: the whole conversation before the last answer is the prompt; the response mask
  # covers the final assistant turn alone.
  assert _ids(batch, "prompt", 1) == tok.encode(
      "<|user|>\nName a colour.\n<|assistant|>\nBlue.\n<|user|>\nAnother.\n<|assistant|>\n")
  assert _ids(batch, "chosen", 1) == tok.encode("Green.") + [tok.eos_id]
  assert _ids(batch, "rejected", 1) == tok.encode("Blue again.") + [tok.eos_id]
  assert batch["chosen_mask"][1].sum() == len(tok.encode("Green.")) + 1


def test_loss_mask_covers_only_the_final_assistant_turn_in_sft_data(tmp_path, tok):
  """A multi-turn language-modelling conversation: earlier turns go to the prompt (mask false in
  the response), the final assistant turn is the response the loss covers."""
  path = fx.write_jsonl(str(tmp_path / "sft.jsonl"), [{"messages": [
      fx.user("Name a colour."), fx.assistant("Blue."), fx.user("Another."),
      fx.assistant("Green.")]}])
  (e,) = loading.read_examples(path)
  batch = pipeline.encode_sft(tok, [e], PLEN, RLEN)
  tokens = np.concatenate([batch["prompt"][0], batch["response"][0]])
  mask = np.concatenate([np.zeros(PLEN, bool), batch["response_mask"][0]])  # What the loss sees.
  assert tokens[mask].tolist() == tok.encode("Green.") + [tok.eos_id]
  assert tok.decode(_ids(batch, "prompt", 0)) == \
      "<|user|>\nName a colour.\n<|assistant|>\nBlue.\n<|user|>\nAnother.\n<|assistant|>\n"


def test_tldr_preference_same_records_from_jsonl_parquet_and_arrow(tmp_path, tok):
  rows = fx.tldr_rows()
  bad = {"prompt": "p", "chosen": None, "rejected": " r"}
  paths = {
      "jsonl": fx.write_jsonl(str(tmp_path / "tldr.jsonl"), rows[:5] + [bad] + rows[5:]),
      "json": str(tmp_path / "tldr.json"),
      "parquet": fx.write_parquet(str(tmp_path / "tldr" / "train-00000-of-00001.parquet"),
                                  rows[:5] + [bad] + rows[5:], fx.TLDR_SCHEMA),
      "arrow": fx.write_save_to_disk(str(tmp_path / "tldr_disk"), rows[:5] + [bad] + rows[5:],
                                     fx.TLDR_SCHEMA, shards=2)}
  with open(paths["json"], "w") as f:
    json.dump(rows[:5] + [bad] + rows[5:], f)
  got = {k: records.read(p, "trl") for k, p in paths.items()}
  for kind, (comps, problems) in got.items():
    assert comps == got["jsonl"][0] and len(comps) == len(rows), kind
    assert len(problems) == 1 and "field 'chosen' is null" in problems[0], kind
  assert got["jsonl"][1] == [f"{paths['jsonl']}:6: field 'chosen' is null"]
  assert got["parquet"][1] == [f"{paths['parquet']}: row 6 (index 5): field 'chosen' is null"]
  assert got["arrow"][1][0].startswith(os.path.join(paths["arrow"], "data-00000-of-00002.arrow"))
  c = got["parquet"][0][3]
  batch = pipeline.encode_comparisons(tok, [c], PLEN, RLEN)
  assert _ids(batch, "prompt", 0) == tok.encode(rows[3]["prompt"])
  assert _ids(batch, "chosen", 0) == tok.encode(" friend forgot my birthday 3 times") + \
      [tok.eos_id]
  assert _ids(batch, "rejected", 0) == tok.encode(" birthday") + [tok.eos_id]


def test_openai_summarize_from_feedback_as_the_hub_stores_it(tmp_path):
  rows = fx.openai_rows()
  rows[2] = dict(rows[2], choice=2)
  rows[5] = dict(rows[5], info=dict(rows[5]["info"], post=None, article="A news article."))
  path = fx.write_parquet(str(tmp_path / "comparisons" / "train-00000-of-00001.parquet"), rows,
                          fx.OPENAI_SCHEMA)
  comps, problems = records.read(path, "openai")
  assert [c.id for c in comps] == [f"t3_{i}" for i in (0, 1, 3, 4, 6, 7)]
  assert problems == [f"{path}: row 3 (index 2): 'choice' must be 0 or 1 (null: a tie), got 2",
                      f"{path}: row 6 (index 5): field 'post' has type NoneType"]
  c = comps[1]
  assert (c.prompt, c.title, c.subreddit, c.choice, c.confidence, c.policy_a) == (
      "My cat ate my homework 1.", "Cat", "pets", 1, 7, "sup2")
  assert records.preferred([c]) == [(" Homework.", " Cat ate homework.")]


def test_unpaired_conversational_parquet_for_kto(tmp_path, tok):
  rows = fx.kto_rows()
  rows.insert(3, {"prompt": [fx.user("Q")], "completion": [fx.assistant("A")], "label": None})
  path = fx.write_parquet(str(tmp_path / "kto" / "train-00000-of-00001.parquet"), rows,
                          fx.KTO_SCHEMA)
  for layout in ("trl", "binary"):
    items, problems = records.read_binary(path, layout)
    assert len(items) == len(rows) - 1
    assert problems == [f"{path}: row 4 (index 3): 'label' must be true or false, got None"]
  f = items[2]
  assert (f.messages, f.completion, f.label, f.style) == (
      (("user", "What is 2 times two?"),), "4.", True, "conversational")
  batch = pipeline.encode_feedback(tok, items, PLEN, RLEN)
  assert _ids(batch, "prompt", 2) == tok.encode("<|user|>\nWhat is 2 times two?\n<|assistant|>\n")
  assert _ids(batch, "response", 2) == tok.encode("4.") + [tok.eos_id]
  assert batch["label"].tolist()[:4] == [True, False, True, False]


def test_standard_unpaired_prompt_is_verbatim_in_trl_layout(tmp_path, tok):
  path = fx.write_jsonl(str(tmp_path / "u.jsonl"), [
      {"prompt": "The sky is", "completion": " blue.", "label": True}])
  (f,), _ = records.read_binary(path, "trl")
  batch = pipeline.encode_feedback(tok, [f], PLEN, RLEN)
  assert _ids(batch, "prompt", 0) == tok.encode("The sky is")
  assert _ids(batch, "response", 0) == tok.encode(" blue.") + [tok.eos_id]
  (legacy,), _ = records.read_binary(path)  # The binary layout frames the prompt as a post.
  assert legacy.style == ""


def test_prompt_only_and_prompt_completion(tmp_path, tok):
  chat_path = fx.write_parquet(str(tmp_path / "p" / "train-00000-of-00001.parquet"),
                               [{"prompt": [fx.user(f"Question {i}?")]} for i in range(4)]
                               + [{"prompt": [fx.assistant("No user turn.")]}],
                               fx.CHAT_PROMPT_SCHEMA)
  examples = loading.read_examples(chat_path)
  assert [e.reference for e in examples] == [""] * 4
  batch = pipeline.encode_prompts(tok, examples, PLEN)
  assert _ids(batch, "prompt", 1) == tok.encode("<|user|>\nQuestion 1?\n<|assistant|>\n")
  std = loading.read_examples(fx.write_parquet(str(tmp_path / "s.parquet"), fx.prompt_rows(3),
                                               fx.PROMPT_SCHEMA))
  assert [e.prompt for e in std] == [r["prompt"] for r in fx.prompt_rows(3)]
  pc = loading.read_examples(fx.write_jsonl(str(tmp_path / "pc.jsonl"), [
      {"prompt": "The sky is", "completion": " blue.", "source": "x"}]))
  assert (pc[0].prompt, pc[0].reference, pc[0].extra) == ("The sky is", " blue.", {"source": "x"})


def test_column_mapping(tmp_path, tok):
  """lvwerra/stack-exchange-paired's names: question, response_j (chosen), response_k."""
  path = fx.write_jsonl(str(tmp_path / "se.jsonl"), [
      {"qid": 1, "question": "Q: How?\nA:", "response_j": " Like this.", "response_k": " No."},
      {"qid": 2, "question": "Q: Why?\nA:", "response_k": " No."}])
  cols = {"prompt": "question", "chosen": "response_j", "rejected": "response_k"}
  comps, problems = records.read(path, "trl", cols)
  assert [(c.prompt, c.response_a, c.response_b, c.extra) for c in comps] == [
      ("Q: How?\nA:", " Like this.", " No.", {"qid": 1})]
  assert problems == [f"{path}:2: missing column 'response_j' (data.columns.chosen)"]
  with pytest.raises(ValueError, match="column mapping is for the 'trl' layout"):
    records.read(path, "openai", cols)


def test_unreadable_files_are_one_error(tmp_path):
  good = fx.write_parquet(str(tmp_path / "d" / "train-00000-of-00002.parquet"), fx.tldr_rows(4),
                          fx.TLDR_SCHEMA)
  cut = str(tmp_path / "d" / "train-00001-of-00002.parquet")
  with open(good, "rb") as f:
    data = f.read()
  with open(cut, "wb") as f:
    f.write(data[:len(data) // 2])  # A download cut in half: no footer.
  with pytest.raises(DataError, match=re.escape(cut) + r": not a readable parquet file .*none of "
                     "it was used"):
    records.read(str(tmp_path / "d"), "trl")
  with pytest.raises(DataError, match="no file matches"):
    records.read(str(tmp_path / "nothing-*.parquet"), "trl")
  with pytest.raises(FileNotFoundError):
    tables.files(str(tmp_path / "missing.parquet"))
  os.makedirs(tmp_path / "empty")
  with pytest.raises(DataError, match="a directory with no"):
    tables.files(str(tmp_path / "empty"))


def test_conversations_need_a_chat_template(tmp_path, tok):
  plain = tokenizer_lib.Tokenizer(tok.model_proto)  # The same model, no template.
  path = fx.write_jsonl(str(tmp_path / "c.jsonl"), fx.kto_rows(2))
  items, _ = records.read_binary(path, "trl")
  with pytest.raises(ConfigError) as e:
    pipeline.encode_feedback(plain, items, PLEN, RLEN)
  assert "\n" not in str(e.value) and "need a chat template" in str(e.value)
  assert "format.chat_template" in str(e.value)


def test_trl_layout_round_trip(tmp_path):
  path = str(tmp_path / "out.jsonl")
  comps, _ = records.read(_uf_shards(tmp_path, fx.uf_rows(4))[0], "trl")
  records.write(path, comps, "trl")
  again, problems = records.read(path, "trl")
  assert problems == [] and [(c.messages, c.response_a, c.response_b) for c in again] == \
      [(c.messages, c.response_a, c.response_b) for c in comps]


def test_chat_response_refuses_a_template_that_rewrites_the_prompt(tok):
  odd = tokenizer_lib.Tokenizer(tok.model_proto)
  odd.chat_template = ("{% if add_generation_prompt %}GEN {% endif %}"
                       "{% for m in messages %}{{ m['content'] }}{% endfor %}")
  with pytest.raises(ConfigError, match="does not start with the template"):
    chat.response_string(odd, [("user", "Hi")], "Hello")


def test_file_splits_hold_out_and_sft_learns_only_responses(tmp_path):
  rows = [{"prompt": f"Q{i}", "completion": f" A{i}", "label": i % 2 == 0} for i in range(6)]
  path = fx.write_jsonl(str(tmp_path / "u.jsonl"), rows)
  splits = loading.load_splits({"source": "files", "train_file": path, "validation": 2, "test": 1,
                                "columns": {"prompt": "", "completion": ""}})
  assert [e.prompt for e in splits["unlabeled"]] == ["Q0", "Q1", "Q2", "Q3"]
  assert [e.reference for e in splits["sft"]] == [" A0", " A2"]  # Desirable completions only.
  assert [e.prompt for e in splits["validation"]] == ["Q4", "Q5"]
  assert [e.prompt for e in splits["test"]] == ["Q4"]


def test_arrow_file_format_and_a_single_arrow_file(tmp_path):
  """An Arrow IPC *file* (not a stream) and one `.arrow` shard named directly read the same."""
  import pyarrow as pa
  table = pa.Table.from_pylist(fx.tldr_rows(5), fx.TLDR_SCHEMA)
  path = str(tmp_path / "tldr.arrow")
  with pa.ipc.new_file(path, table.schema) as w:
    w.write_table(table, max_chunksize=2)
  disk = fx.write_save_to_disk(str(tmp_path / "disk"), fx.tldr_rows(5), fx.TLDR_SCHEMA)
  shard = os.path.join(disk, "data-00000-of-00001.arrow")
  assert records.read(path, "trl") == records.read(shard, "trl") == records.read(disk, "trl")
  assert len(records.read(path, "trl")[0]) == 5


def test_a_dataset_dict_directory_names_its_splits(tmp_path):
  root = tmp_path / "dd"
  fx.write_save_to_disk(str(root / "train"), fx.tldr_rows(3), fx.TLDR_SCHEMA)
  fx.write_save_to_disk(str(root / "test"), fx.tldr_rows(2), fx.TLDR_SCHEMA)
  (root / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
  with pytest.raises(DataError, match=r"a DatasetDict saved to disk; name one of its splits' "
                     r"directories \(test, train\)"):
    records.read(str(root), "trl")
  assert len(records.read(str(root / "train"), "trl")[0]) == 3


def test_a_row_missing_a_field_is_named_not_read_as_another_type(tmp_path):
  """A file holds one TRL type: a preference row without `rejected` is refused with its line, not
  read as a prompt-only row (that SFT would then silently leave out)."""
  path = fx.write_jsonl(str(tmp_path / "p.jsonl"), [
      {"prompt": "q0", "chosen": " a", "rejected": " b"}, {"prompt": "q1", "chosen": " a"},
      {"prompt": "q2", "chosen": " c", "rejected": " d", "completion": " e"}])
  examples = loading.read_examples(path)
  assert [(e.prompt, e.reference, e.extra) for e in examples] == [
      ("q0", " a", None), ("q2", " c", {"completion": " e"})]  # A stray column stays an extra.
  rows, problems = tables.read(path, lambda r: trl.same_type(
      trl.PREFERENCE, trl.parse(r), r, None))
  assert problems == [f"{path}:2: a prompt-only row where the first row read is a preference row "
                      "(it has no 'rejected'): a file holds one TRL type"]


def test_messages_with_tool_calls_or_no_text_are_refused():
  call = {"role": "assistant", "content": "", "tool_calls": [{"name": "add", "arguments": "{}"}]}
  with pytest.raises(ValueError, match=r"message 1 \(assistant\) has tool_calls, which this reader "
                     r"does not pass to the chat template"):
    trl.parse({"prompt": [fx.user("2 + 40?"), call, {"role": "tool", "content": "42"}],
               "completion": [fx.assistant("42.")]})
  with pytest.raises(ValueError, match=r"message 0 \(assistant\) has no text content \(got "
                     r"NoneType\)"):
    trl.parse({"prompt": [fx.user("Hi")], "completion": [{"role": "assistant", "content": None}]})
  # Keys a Parquet struct column holds for every message, null where unused, are fine.
  row = trl.parse({"prompt": [dict(fx.user("Hi"), tool_calls=None, name=None)],
                   "completion": [fx.assistant("Hello.")]})
  assert (row.messages, row.completion) == ((("user", "Hi"),), "Hello.")


def test_column_mapping_renames_at_once_and_never_overwrites():
  swapped = trl.parse({"prompt": "q", "chosen": " worse", "rejected": " better"},
                      {"chosen": "rejected", "rejected": "chosen"})
  assert (swapped.chosen, swapped.rejected, swapped.extra) == (" better", " worse", None)
  with pytest.raises(ValueError, match=r"data.columns.prompt='question', but the file has a "
                     r"column 'prompt' too, which the mapping would overwrite"):
    trl.parse({"prompt": "old", "question": "q", "chosen": " a", "rejected": " b"},
              {"prompt": "question"})


def test_a_failing_chat_template_names_the_example(tmp_path, tok):
  strict = tokenizer_lib.Tokenizer(tok.model_proto)
  strict.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' %}"
                          "{{ raise_exception('System role not supported') }}{% endif %}"
                          "{{ m['content'] }}{% endfor %}")
  path = fx.write_jsonl(str(tmp_path / "sys.jsonl"), [
      {"prompt": [{"role": "system", "content": "Be brief."}, fx.user("Hi")],
       "completion": [fx.assistant("Hello.")]}])
  examples = loading.read_examples(path)
  with pytest.raises(ConfigError, match=re.escape(f"example {path}#0: the chat template failed "
                                                  "on 2 messages: System role not supported")):
    pipeline.encode_sft(strict, examples, PLEN, RLEN)
