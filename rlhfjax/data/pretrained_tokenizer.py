"""The tokenizer of a pretrained model, with the same interface as `tokenizer.Tokenizer`.

Built with Hugging Face's `tokenizers` library from a GGUF file's metadata (byte-level BPE: the
`tokenizer.ggml.tokens` vocabulary and `tokenizer.ggml.merges`; control tokens such as
`<|im_start|>` are special and never split). The chat template stored with an instruct model is
rendered with Jinja2, as transformers does.

rlhfjax needs a pad id distinct from eos (a response that ended must differ from padding): when the
file pads with eos, as SmolLM2 does, padding uses the unknown/end-of-text token instead.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from rlhfjax.data.tokenizer import before_eos
from rlhfjax.errors import ConfigError

CONTROL = 3  # llama.cpp's token type of control tokens.


class PretrainedTokenizer:
  """encode/decode/vocab_size/pad_id/eos_id/bos_id, plus `chat` for instruct models."""

  def __init__(self, meta: dict[str, Any]):
    try:
      from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ConfigError("pretrained tokenizers need `tokenizers`: pip install tokenizers") from e
    if meta.get("tokenizer.ggml.model") != "gpt2":
      raise ConfigError(f"tokenizer model {meta.get('tokenizer.ggml.model')!r} is not supported "
                        "(byte-level BPE, 'gpt2', only)")
    tokens = list(meta["tokenizer.ggml.tokens"])
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    self._tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    self._tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    self._tok.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type", [])
    self._tok.add_special_tokens([t for t, kind in zip(tokens, types) if kind == CONTROL])
    self.eos_id = int(meta["tokenizer.ggml.eos_token_id"])
    self.bos_id = int(meta.get("tokenizer.ggml.bos_token_id", self.eos_id))
    pad = int(meta.get("tokenizer.ggml.padding_token_id", self.eos_id))
    self.pad_id = int(meta.get("tokenizer.ggml.unknown_token_id", 0)) if pad == self.eos_id else pad
    if self.pad_id == self.eos_id:
      raise ConfigError("the tokenizer has no pad id distinct from eos")
    self.chat_template = meta.get("tokenizer.chat_template", "")
    self.vocab_size = len(tokens)

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

  def decode(self, ids: Iterable[int]) -> str:
    """Decodes up to the first eos, skipping pad and other special tokens."""
    return self._tok.decode(before_eos(ids, self.eos_id), skip_special_tokens=True)

  def chat(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """`messages` ([{'role': 'user', 'content': ...}, ...]) in the model's chat template."""
    if not self.chat_template:
      raise ConfigError("this model has no chat template")
    try:
      import jinja2  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ConfigError("chat templates need `jinja2`: pip install jinja2") from e
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)  # As transformers renders.
    return env.from_string(self.chat_template).render(
        messages=list(messages), add_generation_prompt=add_generation_prompt)
