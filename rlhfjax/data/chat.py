"""TRL records as token ids: standard ones as their texts are, conversational ones through the
model's chat template, with only the final assistant turn as the response.

Standard (strings): the prompt's ids are `encode(prompt)`, a response's `encode(text)` then eos, the
texts as the file has them (TRL concatenates prompt and completion as they are: HH-RLHF's
responses start with their own space).

Conversational (messages): the prompt is the template applied to every turn before the trained one
with the generation prompt (`add_generation_prompt=True`); the response is what the template adds
for the final assistant turn, as TRL's `apply_chat_template` takes it: the template of prompt +
turn, less the template of the prompt, its trailing whitespace dropped, then eos unless the
template's turn already ends with one of the tokenizer's eos ids (its turn end: Gemma's
`<end_of_turn>`, ChatML's `<|im_end|>`). A tokenizer with no template (a SentencePiece model trained
here, or a base model) refuses conversational records, unless `format.chat_template` gives one.

A prompt longer than its budget keeps its last tokens (TRL's `keep_end`): the latest turns, and the
generation prompt the response follows; a response keeps its first tokens and no eos.
"""

from __future__ import annotations

from typing import Any, Sequence

from rlhfjax.errors import ConfigError

ASSISTANT = "assistant"


def has_template(tok: Any) -> bool:
  return bool(getattr(tok, "chat_template", ""))


def require_template(tok: Any, where: str = "data") -> None:
  """A ConfigError, in one line, when `tok` has no chat template for conversational records."""
  if not has_template(tok):
    raise ConfigError(f"{where}: conversational records (lists of {{role, content}} messages) "
                      "need a chat template, and this tokenizer has none: use a chat model "
                      "(model.init_from) or give one in format.chat_template")


def render(tok: Any, messages: Sequence[tuple[str, str]], add_generation_prompt: bool) -> str:
  require_template(tok)
  return tok.chat([{"role": r, "content": c} for r, c in messages],
                  add_generation_prompt=add_generation_prompt)


def prompt_string(tok: Any, prompt: str, messages: Sequence[tuple[str, str]] | None) -> str:
  """What the model reads before the response."""
  return prompt if messages is None else render(tok, messages, True)


def response_string(tok: Any, messages: Sequence[tuple[str, str]] | None, text: str) -> str:
  """The response's text as the model reads it after the prompt (before eos)."""
  if messages is None:
    return text
  head = render(tok, messages, True)
  full = render(tok, list(messages) + [(ASSISTANT, text)], False)
  if not full.startswith(head):
    raise ConfigError("the chat template applied to the prompt and the assistant turn does not "
                      "start with the template applied to the prompt alone, so the turn cannot be "
                      f"told apart (prompt: {head[-80:]!r}; whole: {full[-120:]!r})")
  return full[len(head):].rstrip()


def prompt_ids(tok: Any, prompt: str, messages: Sequence[tuple[str, str]] | None,
               max_tokens: int) -> list[int]:
  """The prompt's token ids, its last `max_tokens` when longer (the turn nearest the response)."""
  ids = tok.encode(prompt_string(tok, prompt, messages))
  return ids[len(ids) - max_tokens:] if len(ids) > max_tokens else ids


def response_ids(tok: Any, messages: Sequence[tuple[str, str]] | None, text: str,
                 max_tokens: int) -> list[int]:
  """The response's token ids then eos (once, when the template's turn end is not eos already); a
  response too long keeps its first `max_tokens` and no eos, as `formats.response_tokens` does."""
  ids = tok.encode(response_string(tok, messages, text))
  if not ids or ids[-1] not in tok.eos_ids:
    ids = ids + [tok.eos_id]
  return ids if len(ids) <= max_tokens else ids[:max_tokens]
