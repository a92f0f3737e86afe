"""TRL's dataset formats, standard and conversational, read into one row type from any file.

TRL (`trl/data_utils.py`, docs/source/dataset_formats.md) names a dataset's *type* by its columns:
- preference: `prompt`, `chosen`, `rejected`; or an *implicit prompt*, `chosen` and `rejected` only,
  each the whole text (or conversation) and sharing the prompt as a prefix;
- unpaired preference: `prompt`, `completion`, `label` (true: desirable);
- prompt-completion: `prompt`, `completion`;
- prompt-only: `prompt`;
- language modelling: `text` (standard) or `messages` (conversational).
Each is *standard* (strings) or *conversational* (lists of `{role, content}` messages).

`parse(row, columns)` turns one row (a dict, from JSON, Parquet or Arrow: `tables.read`) into a
`Row`: `columns` maps TRL's names to the file's (`{"chosen": "response_j"}`), every other column is
kept in `Row.extra` (they reach reward functions and reports). A row that is none of these types,
or whose fields have the wrong kind, is a ValueError (the readers name it and skip it).

An implicit prompt is split off as TRL's `extract_prompt` does: at the first index where chosen and
rejected differ (characters of a string, messages of a conversation); a string's space just
before that index goes to the responses, not the prompt. When neither differs before the shorter
one ends, TRL's loop leaves the index at the shorter length minus one, and so does this. (TRL
also looks at index -1, the text's last character, when the first characters differ; here that
prompt is empty.)

Conversational rows keep the whole conversation before the trained turn as the prompt: only the
final assistant turn is trained (its loss, reward and log-probs). A preference conversation must
therefore end, after the shared prompt, in exactly one assistant message per side; a prompt-
completion, unpaired or language-modelling conversation may have earlier turns in its completion
or messages, and those join the prompt. HuggingFaceH4/ultrafeedback_binarized's string `prompt`
beside message lists that already hold the user turn is kept as an extra column (`prompt`): the
messages are the record.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Mapping

PREFERENCE, UNPAIRED = "preference", "unpaired"
PROMPT_COMPLETION, PROMPT_ONLY, LANGUAGE_MODELING = "prompt_completion", "prompt_only", \
    "language_modeling"
TYPES = (PREFERENCE, UNPAIRED, PROMPT_COMPLETION, PROMPT_ONLY, LANGUAGE_MODELING)
FIELDS = ("prompt", "chosen", "rejected", "completion", "label", "text", "messages")
ASSISTANT = "assistant"

Message = tuple[str, str]  # (role, content)


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
  """One TRL row. Standard: `prompt` and the responses are the texts as given (TRL concatenates
  prompt and completion as they are). Conversational: `messages` is the prompt conversation (every
  turn before the trained one), `prompt` its last user message (for display), and each response
  is the content of the final assistant turn."""

  type: str
  prompt: str
  messages: tuple[Message, ...] | None = None  # None: standard.
  chosen: str = ""
  rejected: str = ""
  completion: str = ""  # Prompt-completion, unpaired, language modelling.
  label: bool | None = None  # Unpaired.
  extra: Mapping[str, Any] | None = None

  @property
  def conversational(self) -> bool:
    return self.messages is not None

  @property
  def reference(self) -> str:
    """The response a supervised step learns: chosen, or the completion if desirable ("" for
    prompt-only rows and undesirable completions)."""
    if self.type == PREFERENCE:
      return self.chosen
    return "" if self.label is False else self.completion


def is_messages(value: Any) -> bool:
  """Whether `value` is a conversation: a list of `{role, content}` dicts (TRL's test)."""
  return isinstance(value, (list, tuple)) and bool(value) and isinstance(value[0], dict) and \
      "role" in value[0] and "content" in value[0]


def _messages(value: Any, name: str) -> list[Message]:
  """A conversation's (role, content) pairs. A message with anything else set (`tool_calls`,
  `name`, `tool_call_id`, `reasoning_content`, ...) is refused rather than read without it: only
  role and content reach the chat template, so the model would see another conversation."""
  if not isinstance(value, (list, tuple)) or not value:
    raise ValueError(f"field {name!r} must be a non-empty list of messages")
  out = []
  for i, m in enumerate(value):
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
      raise ValueError(f"field {name!r}: message {i} is not a {{role, content}} pair of strings")
    other = sorted(str(k) for k, v in m.items()
                   if k not in ("role", "content") and v not in (None, "", [], {}))
    if other:
      raise ValueError(f"field {name!r}: message {i} ({m['role']}) has {', '.join(other)}, which "
                       "this reader does not pass to the chat template (only role and content): "
                       "tool calls and other message keys are not supported")
    if not isinstance(m.get("content"), str):
      raise ValueError(f"field {name!r}: message {i} ({m['role']}) has no text content (got "
                       f"{type(m.get('content')).__name__}): only string contents are read")
    out.append((sys.intern(str(m["role"])), m["content"]))  # One "user" string, not one a row.
  return out


def _string(row: Mapping[str, Any], name: str) -> str:
  value = row[name]
  if value is None:
    raise ValueError(f"field {name!r} is null")
  if not isinstance(value, str):
    raise ValueError(f"field {name!r} has type {type(value).__name__}"
                     + (" (a conversation, where the other fields are strings)"
                        if is_messages(value) else ""))
  return value


def extract_prompt(chosen, rejected):
  """TRL's `extract_prompt`: (prompt, chosen, rejected) split at the longest shared prefix."""
  idx = 0
  for idx in range(min(len(chosen), len(rejected))):
    if chosen[idx] != rejected[idx]:
      if idx > 0 and chosen[idx - 1] == " ":  # The space before the responses is theirs.
        idx -= 1
      break
  return chosen[:idx], chosen[idx:], rejected[idx:]


def _last_user(messages) -> str:
  return next((c for r, c in reversed(messages) if r == "user"), messages[-1][1] if messages
              else "")


def _final_turn(prompt: list[Message], completion: list[Message], name: str,
                one: bool) -> tuple[tuple[Message, ...], str]:
  """The prompt conversation and the content of the final assistant turn: earlier turns of the
  completion join the prompt (refused when `one`: a pair must share its prompt)."""
  if not completion:
    raise ValueError(f"field {name!r} has no message after the prompt")
  if completion[-1][0] != ASSISTANT:
    raise ValueError(f"field {name!r} ends with a {completion[-1][0]!r} message, not an "
                     "assistant turn to train")
  if one and len(completion) > 1:
    raise ValueError(f"field {name!r} has {len(completion)} messages after the prompt shared with "
                     "the other response; one final assistant turn is trained per side")
  prompt = prompt + completion[:-1]
  if not prompt:
    raise ValueError(f"field {name!r}: the conversation has no prompt before its assistant turn")
  if prompt[-1][0] == ASSISTANT:
    raise ValueError(f"field {name!r}: the prompt ends with an assistant turn")
  return tuple(prompt), completion[-1][1]


def rename(row: Mapping[str, Any], columns: Mapping[str, str] | None) -> Mapping[str, Any]:
  """`row` with the file's columns renamed to TRL's names (`columns`: TRL name -> file column), all
  at once (a swap, {"chosen": "rejected", "rejected": "chosen"}, swaps). A column of the file that
  already has a mapped field's name, and is not itself mapped away, is an error: it would be
  overwritten."""
  if not columns:
    return row  # Only read, never changed.
  moves = {}
  for field, column in columns.items():
    if field not in FIELDS:
      raise ValueError(f"data.columns.{field}: not a field of TRL's formats ({', '.join(FIELDS)})")
    if column and column != field:
      if column not in row:
        raise ValueError(f"missing column {column!r} (data.columns.{field})")
      moves[field] = column
  sources = set(moves.values())
  for field, column in moves.items():
    if field in row and field not in sources:
      raise ValueError(f"data.columns.{field}={column!r}, but the file has a column {field!r} "
                       f"too, which the mapping would overwrite (rename one of the two in the "
                       "file)")
  out = {k: v for k, v in row.items() if k not in sources}
  out.update({field: row[column] for field, column in moves.items()})
  return out


# The fields that make each type (a preference row's prompt may be implicit).
REQUIRED = {PREFERENCE: ("chosen", "rejected"), UNPAIRED: ("prompt", "completion", "label"),
            PROMPT_COMPLETION: ("prompt", "completion"), PROMPT_ONLY: ("prompt",),
            LANGUAGE_MODELING: ("messages", "text")}


def same_type(first: str, row: Row, raw: Mapping[str, Any], columns: Mapping[str, str] | None
              ) -> Row:
  """`row`, when it is of the type `first` of the file's first row; else a ValueError naming the
  fields it lacks. A file (a `datasets` table) has one type: a row missing a key reads as null
  there, so TRL would fail on it, where here it would quietly be read as another type (a
  preference row without `rejected` as a prompt-only one)."""
  if row.type == first:
    return row
  have = rename(raw, columns)
  lacks = [f for f in REQUIRED[first] if f not in have]
  if first == LANGUAGE_MODELING:
    lacks = [] if {"messages", "text"} & set(have) else ["messages or text"]
  said = f"it has no {', '.join(map(repr, lacks))}" if lacks else "its fields differ"
  raise ValueError(f"a {row.type.replace('_', '-')} row where the first row read is a "
                   f"{first.replace('_', '-')} row ({said}): a file holds one TRL type")


def kind_of(keys) -> str:
  """The TRL type of a row with these (TRL-named) keys, or "" for none."""
  keys = set(keys)
  if {"chosen", "rejected"} <= keys:
    return PREFERENCE
  if {"prompt", "completion", "label"} <= keys:
    return UNPAIRED
  if {"prompt", "completion"} <= keys:
    return PROMPT_COMPLETION
  if "prompt" in keys:
    return PROMPT_ONLY
  if "messages" in keys or "text" in keys:
    return LANGUAGE_MODELING
  return ""


def parse(row: Mapping[str, Any], columns: Mapping[str, str] | None = None) -> Row:
  """The `Row` of one file row; a ValueError saying what is wrong with it."""
  if not isinstance(row, Mapping):
    raise ValueError("not a JSON object")
  row = rename(row, columns)
  kind = kind_of(k for k, v in row.items() if k in FIELDS)
  if not kind:
    present = [k for k in FIELDS if k in row]
    raise ValueError("not a TRL record: " + (
        f"{', '.join(present)} alone make no TRL type" if present else
        f"it has none of {', '.join(FIELDS)}") + f" (its columns: "
        f"{', '.join(sorted(map(str, row))) or 'none'}; a preference row needs chosen and "
        "rejected; map other names with data.columns)")
  used = {PREFERENCE: ("prompt", "chosen", "rejected"), UNPAIRED: ("prompt", "completion", "label"),
          PROMPT_COMPLETION: ("prompt", "completion"), PROMPT_ONLY: ("prompt",),
          LANGUAGE_MODELING: ("messages",) if "messages" in row else ("text",)}[kind]
  extra = {k: v for k, v in row.items() if k not in used} or None
  if kind == PREFERENCE:
    return _preference(row, extra)
  if kind == LANGUAGE_MODELING:
    if "messages" in row:
      messages, content = _final_turn([], _messages(row["messages"], "messages"), "messages",
                                      False)
      return Row(kind, _last_user(messages), messages, completion=content, extra=extra)
    return Row(kind, "", completion=_string(row, "text"), extra=extra)
  label = None
  if kind == UNPAIRED:
    label = row["label"]
    if not isinstance(label, bool):
      raise ValueError(f"'label' must be true or false, got {label!r}")
  if is_messages(row["prompt"]):
    prompt = _messages(row["prompt"], "prompt")
    if kind == PROMPT_ONLY:
      if prompt[-1][0] == ASSISTANT:
        raise ValueError("field 'prompt' ends with an assistant turn")
      return Row(kind, _last_user(prompt), tuple(prompt), extra=extra)
    messages, content = _final_turn(prompt, _messages(row["completion"], "completion"),
                                    "completion", False)
    return Row(kind, _last_user(messages), messages, completion=content, label=label, extra=extra)
  prompt = _string(row, "prompt")
  completion = _string(row, "completion") if kind != PROMPT_ONLY else ""
  return Row(kind, prompt, completion=completion, label=label, extra=extra)


def _preference(row: Mapping[str, Any], extra: dict | None) -> Row:
  chosen, rejected = row["chosen"], row["rejected"]
  if is_messages(chosen) or is_messages(rejected):
    chosen, rejected = _messages(chosen, "chosen"), _messages(rejected, "rejected")
    prompt = row.get("prompt")
    if is_messages(prompt):
      prompt = _messages(prompt, "prompt")
    else:  # Implicit; a string prompt beside message lists (UltraFeedback) stays an extra column.
      if prompt is not None:
        extra = {**(extra or {}), "prompt": prompt}
      prompt, chosen, rejected = extract_prompt(chosen, rejected)
    messages, chosen_text = _final_turn(list(prompt), list(chosen), "chosen", True)
    _, rejected_text = _final_turn(list(prompt), list(rejected), "rejected", True)
    return Row(PREFERENCE, _last_user(messages), messages, chosen_text, rejected_text,
               extra=extra)
  chosen, rejected = _string(row, "chosen"), _string(row, "rejected")
  if row.get("prompt") is None:
    prompt, chosen, rejected = extract_prompt(chosen, rejected)
  else:
    prompt = _string(row, "prompt")
  return Row(PREFERENCE, prompt, None, chosen, rejected, extra=extra)
