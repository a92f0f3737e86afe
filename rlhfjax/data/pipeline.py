"""From examples to fixed-shape token arrays and resumable batches.

Layout shared by every algorithm: prompts left-padded to `prompt_len` (so all prompts end at the same
column and generation appends at `prompt_len`), responses right-padded to `response_len` and ended by
eos. Batch `step` is a pure function of (seed, step), so a resumed run sees exactly the batches an
uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlhfjax.data import chat
from rlhfjax.data import formats
from rlhfjax.data import records
from rlhfjax.data import tokenizer as tokenizer_lib
from rlhfjax.errors import ConfigError

Batch = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Tldr:
  """A Reddit post with its reference TL;DR, from any TL;DR source. `situation` is the simulated
  world's latent truth about the post (`simulated.world.Situation`), which its gold reward and
  simulated annotators judge by; None for real posts."""
  id: str
  subreddit: str
  title: str
  post: str
  reference: str
  situation: Any  # simulated.world.Situation | None


@dataclasses.dataclass(frozen=True)
class Instruction:
  """An instruction-following example (Alpaca): its prompt is `formats.alpaca_prompt(instruction,
  input)` and its reference Alpaca's `output`. It has no latent situation, hence no gold reward.

  `post` is the instruction, as a comparison record's `prompt` holds it (`records.Comparison`), so
  code that shows prompts or looks them up by their post (logs, `annotators.FileAnnotator`) serves
  both kinds of example."""
  id: str
  instruction: str
  input: str
  reference: str
  situation: None = None

  @property
  def post(self) -> str:
    return self.instruction


@dataclasses.dataclass(frozen=True)
class Prompted:
  """A TRL record's prompt (`data/trl.py`) with its reference response: standard (`messages`
  None: `prompt` is the text the model reads, as the file has it) or conversational (`messages`,
  every turn before the trained one, go through the chat template; `prompt` is the last user
  message, for display). `extra` holds the file's other columns (reward functions and reports
  see them)."""
  id: str
  prompt: str
  messages: tuple[tuple[str, str], ...] | None
  reference: str
  extra: Mapping[str, Any] | None = None
  situation: None = None

  @property
  def post(self) -> str:
    return self.prompt


Example = Tldr | Instruction | Prompted  # What a split holds.


def has_gold(examples: Sequence[object]) -> bool:
  """Whether every example has a latent situation, so that the gold reward and the simulated
  annotators can judge responses to it: true of the simulated world's examples, false of real data
  (whose `situation` is None, or which has no such field). Every module that reports gold metrics or
  uses a simulated annotator asks this once, and leaves them out on real data."""
  return all(getattr(e, "situation", None) is not None for e in examples)


def prompt_text(e: Post | Example) -> str:
  """An example's whole prompt as text (no truncation, no chat frame)."""
  if isinstance(e, Instruction):
    return formats.alpaca_prompt(e.instruction, e.input)
  if isinstance(e, Prompted):
    return e.prompt if e.messages is None else "\n".join(c for _, c in e.messages)
  return formats.TLDR_FORMAT.format(subreddit=e.subreddit, title=e.title, post=e.post)


def tokenizer_corpus(examples: Sequence[Example]) -> list[str]:
  """Text a tokenizer is trained on: each example's prompt and reference."""
  return [prompt_text(e) + " " + e.reference for e in examples]


class Post(NamedTuple):
  """What a TL;DR prompt is made of (a `Tldr` has the same fields)."""
  id: str
  subreddit: str
  title: str
  post: str


def posts_of(comparisons: Sequence[records.Comparison | records.Feedback]
             ) -> list[Post | Instruction | Prompted]:
  """The prompt of each comparison (or binary feedback record): a `Prompted` for a TRL record
  (its `style` set), an `Instruction` when it has neither subreddit nor title (AlpacaFarm's layout
  has no such fields, while every TL;DR record names its subreddit), else a TL;DR `Post`."""
  return [Prompted(c.id, c.prompt, c.messages, "", c.extra) if c.style
          else Post(c.id, c.subreddit, c.title, c.prompt) if c.subreddit or c.title
          else Instruction(c.id, c.prompt, c.input, "") for c in comparisons]


def comparison_prompt(e: Post | Example) -> dict[str, str]:
  """The fields of a `records.Comparison` (or `Feedback`) that hold an example's prompt
  (`posts_of` reads them back)."""
  if isinstance(e, Instruction):
    return {"id": e.id, "prompt": e.instruction, "input": e.input}
  if isinstance(e, Prompted):
    return {"id": e.id, "prompt": e.prompt, "messages": e.messages,
            "style": records.STANDARD if e.messages is None else records.CONVERSATIONAL}
  return {"id": e.id, "prompt": e.post, "title": e.title, "subreddit": e.subreddit}


# The Alpaca prompts over the fields of `formats.tldr_prompt`, which keeps the frame and cuts its
# `post` at sentence boundaries: the input is cut (the instruction beside it is the `title`), or the
# instruction when there is no input.
_ALPACA = formats.ALPACA_FORMAT.format(instruction="{post}")
_ALPACA_INPUT = formats.ALPACA_INPUT_FORMAT.format(instruction="{title}", input="{post}")


def prompt_ids(tok: tokenizer_lib.Tokenizer, e: Post | Example, prompt_len: int,
               control: str = "") -> list[int]:
  """An example's prompt in at most `prompt_len` tokens, after `control` if given: the Alpaca prompt
  (`formats.alpaca_prompt`) of an `Instruction`, else the TL;DR prompt, each truncated at sentence
  boundaries and framed by `tok.prompt_text` (`formats.tldr_prompt`); a TRL record's prompt as it
  is or through the chat template, keeping its last tokens (`chat.prompt_ids`; no control code)."""
  if isinstance(e, Prompted):
    if control:
      raise ConfigError("control codes (reward conditioning, Quark) need TL;DR or Alpaca prompts, "
                        "not TRL records")
    return _naming(e, chat.prompt_ids, tok, e.prompt, e.messages, prompt_len)
  if isinstance(e, Instruction):
    if e.input:
      return formats.tldr_prompt(tok, "", e.instruction, e.input, prompt_len, control,
                                 _ALPACA_INPUT)
    return formats.tldr_prompt(tok, "", "", e.instruction, prompt_len, control, _ALPACA)
  return formats.tldr_prompt(tok, e.subreddit, e.title, e.post, prompt_len, control)


def _naming(e: Prompted, fn: Callable[..., list[int]], *args: Any) -> list[int]:
  """`fn(*args)` for the TRL record `e`, whose id (or prompt) a chat template's error then names."""
  try:
    return fn(*args)
  except ConfigError as err:
    where = f"example {e.id}" if e.id else f"the example whose prompt ends {e.prompt[-60:]!r}"
    raise ConfigError(f"{where}: {err}") from err


def encode_prompts(tok: tokenizer_lib.Tokenizer, posts: Sequence[Post | Example],
                   prompt_len: int, controls: Sequence[str] | None = None) -> Batch:
  """Left-padded prompts (`prompt_ids`), each after its control code if `controls` are given."""
  controls = [""] * len(posts) if controls is None else controls
  ids = [prompt_ids(tok, e, prompt_len, c) for e, c in zip(posts, controls, strict=True)]
  prompt, prompt_mask = formats.pad(ids, prompt_len, tok.pad_id, "left")
  return {"prompt": prompt, "prompt_mask": prompt_mask}


def encode_responses(tok: tokenizer_lib.Tokenizer, texts: Sequence[str], response_len: int,
                     name: str = "response", posts: Sequence[Any] | None = None) -> Batch:
  """Right-padded responses ending in eos (`formats.response_tokens`); given the `posts` they
  answer, a TRL record's response is its text as it is or its chat template's final assistant
  turn (`chat.response_ids`)."""
  posts = [None] * len(texts) if posts is None else posts
  ids = [_naming(p, chat.response_ids, tok, p.messages, t, response_len) if isinstance(p, Prompted)
         else formats.response_tokens(tok, t, response_len)
         for p, t in zip(posts, texts, strict=True)]
  response, response_mask = formats.pad(ids, response_len, tok.pad_id, "right")
  return {name: response, f"{name}_mask": response_mask}


def encode_comparisons(tok: tokenizer_lib.Tokenizer, comparisons: Sequence[records.Comparison],
                       prompt_len: int, response_len: int) -> Batch:
  """Prompts with the `chosen` and `rejected` responses of each comparison."""
  chosen, rejected = zip(*records.preferred(comparisons)) if comparisons else ((), ())
  posts = posts_of(comparisons)
  return {**encode_prompts(tok, posts, prompt_len),
          **encode_responses(tok, chosen, response_len, "chosen", posts),
          **encode_responses(tok, rejected, response_len, "rejected", posts)}


def encode_feedback(tok: tokenizer_lib.Tokenizer, feedback: Sequence[records.Feedback],
                    prompt_len: int, response_len: int) -> Batch:
  """Prompts with each binary feedback record's `response` and `label` (True: desirable)."""
  posts = posts_of(feedback)
  return {**encode_prompts(tok, posts, prompt_len),
          **encode_responses(tok, [f.completion for f in feedback], response_len, posts=posts),
          "label": np.array([f.label for f in feedback], bool)}


def encode_targets(tok: tokenizer_lib.Tokenizer, posts: Sequence[Post | Example],
                   texts: Sequence[str], prompt_len: int, response_len: int,
                   controls: Sequence[str] | None = None) -> Batch:
  """Prompts (after their control codes, if given) with target responses, for supervised steps."""
  return {**encode_prompts(tok, posts, prompt_len, controls),
          **encode_responses(tok, texts, response_len, posts=posts)}


def encode_sft(tok: tokenizer_lib.Tokenizer, examples: Sequence[Example], prompt_len: int,
               response_len: int) -> Batch:
  """Prompts with their reference summaries as responses."""
  return encode_targets(tok, examples, [e.reference for e in examples], prompt_len, response_len)


def prompt_and(batch: Mapping[str, Any], response: str = "response") -> tuple[jax.Array, jax.Array]:
  """Tokens and mask of the left-padded prompt followed by the right-padded `response` field
  (traceable, for use inside jitted steps)."""
  tokens = jnp.concatenate([batch["prompt"], batch[response]], axis=1)
  mask = jnp.concatenate([batch["prompt_mask"], batch[f"{response}_mask"]], axis=1)
  return tokens, mask


def batch_indices(num_examples: int, batch_size: int, seed: int, step: int,
                  stream: int = 0) -> np.ndarray:
  """Example indices of batch `step`: each epoch is a fresh permutation; the remainder is dropped.
  `stream` j > 0: another order of the same examples, as pure a function of (seed, step, j) (the
  extra draws of DAPO's dynamic sampling)."""
  per_epoch = num_examples // batch_size
  if per_epoch == 0:
    raise ValueError(f"batch size {batch_size} exceeds the {num_examples} examples")
  epoch, i = divmod(int(step), per_epoch)
  perm = np.random.default_rng([seed, epoch] if stream == 0 else [seed, epoch, stream]
                               ).permutation(num_examples)
  return perm[i * batch_size:(i + 1) * batch_size]


def take(data: Batch, idx: np.ndarray) -> Batch:
  return {k: v[idx] for k, v in data.items()}


def fixed_batches(data: Batch, batch_size: int):
  """Yields (batch, n_real) in order; the last batch is padded by repeating rows so shapes stay fixed."""
  n = len(next(iter(data.values())))
  for start in range(0, n, batch_size):
    idx = np.arange(start, min(start + batch_size, n))
    n_real = len(idx)
    idx = np.concatenate([idx, np.full(batch_size - n_real, idx[-1])])
    yield take(data, idx), n_real
