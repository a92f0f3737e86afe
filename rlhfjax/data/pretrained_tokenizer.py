"""The tokenizer of a pretrained model, with the same interface as `tokenizer.Tokenizer`.

Built with Hugging Face's `tokenizers` library, from either of two sources:
- a GGUF file's metadata (`PretrainedTokenizer(meta)`): byte-level BPE from the
  `tokenizer.ggml.tokens` vocabulary and `tokenizer.ggml.merges`; control tokens such as
  `<|im_start|>` are special and never split;
- a Hugging Face model directory (`from_directory`): its `tokenizer.json` as it is, with the special
  tokens and chat template of `tokenizer_config.json` (or the template in `chat_template.jinja`).
The chat template stored with an instruct model is rendered with Jinja2, as transformers does.

rlhfjax needs a pad id distinct from every eos id (a response that ended must differ from padding):
when the model pads with an eos, as SmolLM2 does, padding uses the unknown/end-of-text token
instead, and where that is an eos too (Pythia's `<|endoftext|>` is bos, eos and unk; Qwen3 stops
at its pad `<|endoftext|>`) the first special token named for padding (Pythia's `<|padding|>`,
Qwen3's `<|fim_pad|>`).

A response ends at any of `eos_ids`: the tokenizer's eos, the special token that ends an assistant
turn of the chat template (Gemma's `<end_of_turn>`, ChatML's `<|im_end|>`), and the ids a model
directory's `generation_config.json` lists as `eos_token_id`, as transformers' `generate` stops.
With `chat=True` the turn end is `eos_id`, the id a training response ends with, so an instruct
model learns to close its turn as it was post-trained to.

Templates with a thinking switch (Qwen3's reads `enable_thinking`) render with thinking off unless
`thinking=True`: the prompt then ends with an empty `<think></think>` block and the model answers
directly, as an RLHF policy's response should.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Sequence

from rlhfjax.data import templates
from rlhfjax.data.tokenizer import before_eos
from rlhfjax.errors import ConfigError

CONTROL = 3  # llama.cpp's token type of control tokens.


def _tokenizers():
  try:
    import tokenizers  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ConfigError("pretrained tokenizers need `tokenizers`: pip install tokenizers") from e
  return tokenizers


class PretrainedTokenizer:
  """encode/decode/vocab_size/pad_id/eos_id/bos_id/prompt_text, plus `chat` for instruct models.

  `chat=True` makes `prompt_text` wrap a prompt as a user turn of the chat template.
  """

  def __init__(self, meta: dict[str, Any], chat: bool = False, thinking: bool = False):
    """From a GGUF file's metadata."""
    tk = _tokenizers()
    if meta.get("tokenizer.ggml.model") != "gpt2":
      raise ConfigError(f"tokenizer model {meta.get('tokenizer.ggml.model')!r} is not supported "
                        "(byte-level BPE, 'gpt2', only)")
    tokens = list(meta["tokenizer.ggml.tokens"])
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = tk.decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type", [])
    tok.add_special_tokens([t for t, kind in zip(tokens, types) if kind == CONTROL])
    eos = int(meta["tokenizer.ggml.eos_token_id"])
    self._setup(tok, eos_id=eos, bos_id=int(meta.get("tokenizer.ggml.bos_token_id", eos)),
                pad_id=int(meta.get("tokenizer.ggml.padding_token_id", eos)),
                unk_id=int(meta.get("tokenizer.ggml.unknown_token_id", 0)),
                chat_template=meta.get("tokenizer.chat_template", ""), vocab_size=len(tokens),
                chat=chat, thinking=thinking)

  def _setup(self, tok, *, eos_id: int, bos_id: int, pad_id: int | None, unk_id: int | None,
             chat_template: str, vocab_size: int, chat: bool, thinking: bool = False,
             stop_ids: Sequence[int] = ()) -> None:
    """The state both sources share; pad falls back to unk when it is missing or an eos, then to
    a special token named for padding. `stop_ids`: more ids that end a response."""
    self._tok = tok
    self._eos_token = tok.id_to_token(eos_id)  # What templates render as `eos_token`.
    self.bos_id = bos_id
    self.thinking = thinking
    self.chat_template = chat_template or ""
    self.vocab_size = vocab_size
    if chat and not self.chat_template:
      raise ConfigError("format.chat needs a chat template, and this model has none")
    self._chat_prompts = chat
    turn_end = self._turn_end()
    self.eos_id = turn_end if chat and turn_end is not None else eos_id
    self.eos_ids = tuple(dict.fromkeys(
        i for i in (self.eos_id, eos_id, turn_end, *stop_ids) if i is not None))
    padding = sorted(i for i, t in tok.get_added_tokens_decoder().items()
                     if t.special and "pad" in t.content.lower())
    self.pad_id = next((i for i in (pad_id, unk_id, *padding)
                        if i is not None and i not in self.eos_ids), None)
    if self.pad_id is None:
      raise ConfigError(f"the tokenizer has no pad id distinct from its eos ids {self.eos_ids}")
    self.pad_token = tok.id_to_token(self.pad_id)  # Named as the pad of an exported reward model.

  def _turn_end(self) -> int | None:
    """The special token the chat template closes an assistant turn with, if it has one."""
    if not self.chat_template:
      return None
    user, reply = [{"role": "user", "content": "?"}], "reply"
    try:
      head = self.chat(user)
      whole = self.chat(user + [{"role": "assistant", "content": reply}], False)
    except ConfigError:  # No jinja2, or a template that refuses this conversation.
      return None
    if not whole.startswith(head) or reply not in whole[len(head):]:
      return None
    after = whole[len(head):].split(reply, 1)[1]
    special = {i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
    return next((i for i in self.encode(after) if i in special), None)

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

  def decode(self, ids: Iterable[int]) -> str:
    """Decodes up to the first eos, skipping pad and other special tokens."""
    return self._tok.decode(before_eos(ids, self.eos_ids), skip_special_tokens=True)

  def prompt_text(self, text: str) -> str:
    """What the model reads for the prompt `text`: a user turn of the chat template if `chat`."""
    return self.chat([{"role": "user", "content": text}]) if self._chat_prompts else text

  def response_text(self, text: str) -> str:
    """How a response follows its prompt: the assistant turn's text as is (the template ends the
    prompt with the turn header), or after a space without a chat template."""
    return text if self._chat_prompts else " " + text

  def chat(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """`messages` ([{'role': 'user', 'content': ...}, ...]) in the model's chat template."""
    if not self.chat_template:
      raise ConfigError("this model has no chat template")
    return templates.render(self.chat_template, list(messages), add_generation_prompt,
                            enable_thinking=self.thinking,
                            bos_token=self._tok.id_to_token(self.bos_id),
                            eos_token=self._eos_token)


def from_directory(directory: str, chat: bool = False, thinking: bool = False
                   ) -> PretrainedTokenizer:
  """The tokenizer of a Hugging Face model directory (`tokenizer.json`, `tokenizer_config.json`);
  `thinking` is what a template's `enable_thinking` switch gets (Qwen3's)."""
  tk = _tokenizers()
  tok_path = os.path.join(directory, "tokenizer.json")
  config_path = os.path.join(directory, "tokenizer_config.json")
  for path in (tok_path, config_path):
    if not os.path.exists(path):
      raise FileNotFoundError(f"not found: {path}")
  tok = tk.Tokenizer.from_file(tok_path)
  with open(config_path, encoding="utf-8") as f:
    config = json.load(f)

  def token_id(key: str) -> int | None:
    """The id of the special token `key` names (a string, or an AddedToken dict), if any."""
    token = config.get(key)
    if isinstance(token, dict):
      token = token.get("content")
    if token is None:
      return None
    found = tok.token_to_id(token)
    if found is None:
      raise ConfigError(f"{config_path}: {key}={token!r} is not in {tok_path}")
    return found

  eos = token_id("eos_token")
  if eos is None:
    raise ConfigError(f"{config_path}: missing key 'eos_token'")
  bos = token_id("bos_token")
  generation_path = os.path.join(directory, "generation_config.json")
  stop_ids = []
  if os.path.exists(generation_path):
    with open(generation_path, encoding="utf-8") as f:
      listed = json.load(f).get("eos_token_id")
    stop_ids = [listed] if isinstance(listed, int) else list(listed or [])
    special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    if not all(isinstance(i, int) and i in special for i in stop_ids):
      raise ConfigError(f"{generation_path}: eos_token_id={listed!r} names tokens that are not "
                        f"special tokens of {tok_path} (special: {sorted(special)})")
  out = PretrainedTokenizer.__new__(PretrainedTokenizer)  # Bypasses the GGUF constructor.
  out._setup(  # pylint: disable=protected-access
      tok, eos_id=eos, bos_id=eos if bos is None else bos, pad_id=token_id("pad_token"),
      unk_id=token_id("unk_token"), chat_template=_chat_template(config, config_path, directory),
      vocab_size=tok.get_vocab_size(with_added_tokens=True), chat=chat, thinking=thinking,
      stop_ids=stop_ids)
  return out


def _chat_template(config: dict[str, Any], config_path: str, directory: str) -> str:
  """`chat_template` of tokenizer_config.json (a string, or named templates: the default one), or
  the `chat_template.jinja` file newer transformers write beside it; "" if there is none."""
  template = config.get("chat_template")
  if isinstance(template, list):
    named = {t.get("name"): t.get("template") for t in template}
    if "default" not in named:
      raise ConfigError(f"{config_path}: chat_template has no 'default' among {sorted(named)}")
    template = named["default"]
  jinja_path = os.path.join(directory, "chat_template.jinja")
  if not template and os.path.exists(jinja_path):
    with open(jinja_path, encoding="utf-8") as f:
      template = f.read()
  return template or ""
