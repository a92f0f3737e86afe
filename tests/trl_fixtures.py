"""Small files in the column layout, nesting and file type of real datasets, for the TRL-format
tests (tests/test_trl_formats.py, tests/test_trl_methods.py)."""

import json
import os

import pyarrow as pa
import pyarrow.ipc  # noqa: F401
import pyarrow.parquet as pq

# A tiny chat template (Zephyr's turn headers without an end-of-turn token): a SentencePiece model
# trained here has no template of its own.
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def user(text):
  return {"role": "user", "content": text}


def assistant(text):
  return {"role": "assistant", "content": text}


MESSAGE = pa.struct([("content", pa.string()), ("role", pa.string())])
MESSAGES = pa.list_(MESSAGE)


def write_jsonl(path, rows, raw_lines=()):
  """`rows` as JSON Lines, then `raw_lines` (bytes, malformed on purpose) at their positions."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  lines = [json.dumps(r).encode() for r in rows]
  for index, raw in raw_lines:
    lines.insert(index, raw)
  with open(path, "wb") as f:
    f.write(b"\n".join(lines) + b"\n")
  return path


def write_parquet(path, rows, schema, row_group_size=3):
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  pq.write_table(pa.Table.from_pylist(rows, schema), path, row_group_size=row_group_size)
  return path


def write_save_to_disk(directory, rows, schema, shards=1):
  """What `datasets.Dataset.save_to_disk` leaves: Arrow IPC streams, dataset_info.json, state.json."""
  os.makedirs(directory, exist_ok=True)
  table = pa.Table.from_pylist(rows, schema)
  names = []
  per = -(-len(rows) // shards)
  for i in range(shards):
    name = f"data-{i:05d}-of-{shards:05d}.arrow"
    with pa.OSFile(os.path.join(directory, name), "wb") as sink:
      with pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.slice(i * per, per).to_batches(max_chunksize=2):
          writer.write_batch(batch)
    names.append(name)
  with open(os.path.join(directory, "dataset_info.json"), "w") as f:
    json.dump({"citation": "", "description": "", "features": {}, "homepage": "",
               "license": ""}, f)
  with open(os.path.join(directory, "state.json"), "w") as f:
    json.dump({"_data_files": [{"filename": n} for n in names], "_fingerprint": "0",
               "_format_columns": None, "_format_kwargs": {}, "_format_type": None,
               "_output_all_columns": False, "_split": "train"}, f)
  return directory


# Anthropic/hh-rlhf: JSON Lines of whole transcripts, `chosen` and `rejected`, implicit prompt.
def hh_rows(n=12):
  rows = [{"chosen": "\n\nHuman: Hi there\n\nAssistant: Hello! How can I help?",
           "rejected": "\n\nHuman: Hi there\n\nAssistant: Go away."},
          {"chosen": "\n\nHuman: Name a colour.\n\nAssistant: Blue?\n\nHuman: Another.\n\n"
                     "Assistant: Green.",
           "rejected": "\n\nHuman: Name a colour.\n\nAssistant: Blue?\n\nHuman: Another.\n\n"
                       "Assistant: No."}]
  for i in range(n - len(rows)):
    rows.append({"chosen": f"\n\nHuman: What is {i} plus {i}?\n\nAssistant: It is {2 * i}.",
                 "rejected": f"\n\nHuman: What is {i} plus {i}?\n\nAssistant: Maybe {i}."})
  return rows


# HuggingFaceH4/ultrafeedback_binarized (train_prefs): Parquet; `prompt` a string; `chosen`,
# `rejected` and `messages` message lists holding the user turn; scores.
UF_SCHEMA = pa.schema([("prompt", pa.string()), ("prompt_id", pa.string()),
                       ("chosen", MESSAGES), ("rejected", MESSAGES), ("messages", MESSAGES),
                       ("score_chosen", pa.float64()), ("score_rejected", pa.float64())])


def uf_rows(n=12):
  rows = []
  for i in range(n):
    q = f"What is {i} times two?"
    chosen = [user(q), assistant(f"{2 * i}.")]
    rows.append({"prompt": q, "prompt_id": f"p{i:03d}", "chosen": chosen,
                 "rejected": [user(q), assistant(f"{i}, I think.")], "messages": chosen,
                 "score_chosen": 9.0, "score_rejected": 3.0 + i % 3})
  # A multi-turn conversation: the earlier turns are the prompt, the last assistant turn trained.
  rows[1] = {"prompt": "Name a colour.", "prompt_id": "p-multi",
             "chosen": [user("Name a colour."), assistant("Blue."), user("Another."),
                        assistant("Green.")],
             "rejected": [user("Name a colour."), assistant("Blue."), user("Another."),
                          assistant("Blue again.")],
             "messages": [], "score_chosen": 8.0, "score_rejected": 2.0}
  return rows


# trl-lib/tldr-preference: Parquet, standard, explicit prompt.
TLDR_SCHEMA = pa.schema([("prompt", pa.string()), ("chosen", pa.string()),
                         ("rejected", pa.string())])


def tldr_rows(n=12):
  return [{"prompt": f"SUBREDDIT: r/relationships\n\nTITLE: Help {i}\n\nPOST: My friend forgot "
                     f"my birthday {i} times.\n\nTL;DR:",
           "chosen": f" friend forgot my birthday {i} times", "rejected": " birthday"}
          for i in range(n)]


# openai/summarize_from_feedback (comparisons) as the Hub stores it: Parquet with nested columns.
OPENAI_SCHEMA = pa.schema([
    ("info", pa.struct([("id", pa.string()), ("post", pa.string()), ("title", pa.string()),
                        ("subreddit", pa.string()), ("site", pa.string()),
                        ("article", pa.string())])),
    ("summaries", pa.list_(pa.struct([("text", pa.string()), ("policy", pa.string()),
                                      ("note", pa.string())]))),
    ("choice", pa.int32()), ("worker", pa.string()), ("batch", pa.string()),
    ("split", pa.string()), ("extra", pa.struct([("confidence", pa.int32())]))])


def openai_rows(n=8):
  return [{"info": {"id": f"t3_{i}", "post": f"My cat ate my homework {i}.", "title": "Cat",
                    "subreddit": "pets", "site": None, "article": None},
           "summaries": [{"text": " Cat ate homework.", "policy": "sup2", "note": None},
                         {"text": " Homework.", "policy": "ref", "note": "short"}],
           "choice": i % 2, "worker": "w1", "batch": "batch3", "split": "train",
           "extra": {"confidence": 7}} for i in range(n)]


# trl-lib/kto-mix-14k: Parquet, conversational unpaired preference.
KTO_SCHEMA = pa.schema([("prompt", MESSAGES), ("completion", MESSAGES), ("label", pa.bool_())])


def kto_rows(n=12):
  return [{"prompt": [user(f"What is {i} times two?")],
           "completion": [assistant(f"{2 * i}." if i % 2 == 0 else "No idea.")],
           "label": i % 2 == 0} for i in range(n)]


# Prompt-only, standard (TL;DR prompts) and conversational (trl-lib/ultrafeedback-prompt).
PROMPT_SCHEMA = pa.schema([("prompt", pa.string())])
CHAT_PROMPT_SCHEMA = pa.schema([("prompt", MESSAGES)])


def prompt_rows(n=12):
  return [{"prompt": r["prompt"]} for r in tldr_rows(n)]
