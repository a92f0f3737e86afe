"""SentencePiece tokenizer: trained in-process on the training text, or loaded from a `.model` file.

Ids are fixed so every model agrees on them: pad 0, eos 1, bos 2, unk 3. Pad is never eos, so a
response that ends is distinguishable from padding. Normalisation is the identity and whitespace is
kept, so `decode(encode(text)) == text` for any text (bytes outside the vocabulary fall back to
byte pieces).
"""

from __future__ import annotations

import io
import os
from typing import Iterable, Sequence

import sentencepiece as spm

from rlhfjax import files
from rlhfjax.data import templates
from rlhfjax.errors import DataError

PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3


def before_eos(ids: Iterable[int], eos_id: int | Sequence[int],
               skip: Sequence[int] = ()) -> list[int]:
  """The ids before the first eos (any of them, given several), without those in `skip`: what a
  response says."""
  ends = {eos_id} if isinstance(eos_id, int) else set(eos_id)
  out = []
  for i in ids:
    i = int(i)
    if i in ends:
      break
    if i not in skip:
      out.append(i)
  return out


class Tokenizer:
  """A thin wrapper over SentencePieceProcessor that names the special ids."""

  def __init__(self, model_proto: bytes):
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    self.model_proto = model_proto
    self.pad_id = self._sp.pad_id()
    self.eos_id = self._sp.eos_id()
    self.bos_id = self._sp.bos_id()
    if self.pad_id < 0 or self.pad_id == self.eos_id:
      raise ValueError("tokenizer must define a pad id distinct from eos")
    self.eos_ids = (self.eos_id,)  # Every id that ends a response: here eos alone.
    # A Jinja chat template (`format.chat_template`); none by default: a model trained here has
    # no chat format of its own.
    self.chat_template = ""

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return self._sp.encode(list(texts))

  def decode(self, ids: Iterable[int]) -> str:
    """Decodes up to the first eos, skipping pad and bos."""
    return self._sp.decode(before_eos(ids, self.eos_id, (self.pad_id, self.bos_id)))

  def prompt_text(self, text: str) -> str:
    """What the model reads for the prompt `text`: the text itself (no chat template here)."""
    return text

  def response_text(self, text: str) -> str:
    """How a response follows its prompt: after a space, as a TL;DR follows "TL;DR:"."""
    return " " + text

  def chat(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """`messages` in `chat_template`, rendered as transformers renders templates."""
    if not self.chat_template:
      raise ValueError("this tokenizer has no chat template (set format.chat_template)")
    return templates.render(self.chat_template, list(messages), add_generation_prompt,
                            bos_token=self._sp.id_to_piece(self.bos_id),
                            eos_token=self._sp.id_to_piece(self.eos_id))

  def save(self, path: str) -> None:
    """Writes the `.model` file atomically."""
    with files.atomic_open(path, "wb") as f:
      f.write(self.model_proto)


def train(texts: Iterable[str], vocab_size: int, model_type: str = "bpe",
          split_by_unicode_script: bool = True) -> Tokenizer:
  """Trains a SentencePiece model on `texts` in memory.

  `split_by_unicode_script=False` lets a piece mix digits and letters, so tags such as "(24F)"
  become single pieces and a model copies them in one step.
  """
  proto = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(texts),
      model_writer=proto,
      vocab_size=vocab_size,
      model_type=model_type,
      pad_id=PAD_ID, eos_id=EOS_ID, bos_id=BOS_ID, unk_id=UNK_ID,
      normalization_rule_name="identity",
      remove_extra_whitespaces=False,
      add_dummy_prefix=False,
      allow_whitespace_only_pieces=True,
      byte_fallback=True,
      character_coverage=1.0,
      user_defined_symbols=["\n"],
      split_by_unicode_script=split_by_unicode_script,
      max_sentence_length=1 << 16,
      num_threads=os.cpu_count() or 1,
      minloglevel=2,
  )
  return Tokenizer(proto.getvalue())


def load(path: str) -> Tokenizer:
  """The SentencePiece model at `path`; a DataError naming it when it is not one (empty, truncated,
  another format) or lacks the special pieces."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"tokenizer model not found: {path}")
  with open(path, "rb") as f:
    proto = f.read()
  try:
    return Tokenizer(proto)
  except (RuntimeError, ValueError) as e:
    reason = " ".join(str(e).split())[:200]
    raise DataError(f"{path}: not a usable SentencePiece model ({len(proto)} bytes; "
                    f"{reason})") from None


def load_or_train(path: str, texts: Iterable[str], vocab_size: int, model_type: str = "bpe",
                  split_by_unicode_script: bool = True) -> Tokenizer:
  """Loads `path` if it exists, otherwise trains on `texts` and saves there (so reruns agree)."""
  if os.path.exists(path):
    return load(path)
  tok = train(texts, vocab_size, model_type, split_by_unicode_script)
  tok.save(path)
  return tok
