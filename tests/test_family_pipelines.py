"""The whole pipeline from a pretrained Qwen3, GPT-NeoX, Gemma 2 and Gemma 3: `model.init_from`
names a tiny Hugging Face directory that transformers wrote (random weights, no download) with a
tokenizer in the family's style — Qwen3's ChatML template with its thinking switch (off by
default), Pythia's plain byte-level BPE whose bos, eos and unk are all `<|endoftext|>` (so
`<|padding|>` pads), no template, Gemma's turns (`<start_of_turn>user ... <end_of_turn>`, the
template writing `<bos>` itself). SFT -> labels -> RM -> PPO, GRPO and DPO run on each,
LoRA on every trained model, and the PPO policy exported by task=export loads back
into transformers with rlhfjax's logits. The Gemma models have a sliding window of 16 tokens on
their local layers, which the pipeline's prompts (up to 192 tokens) cross.

The tokenizers are checked against transformers' own (`AutoTokenizer`, `apply_chat_template`).
"""

import importlib.util
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import load_config
from test_hf_checkpoint import write_tokenizer
from rlhfjax import main
from rlhfjax.data import chat
from rlhfjax.data import formats
from rlhfjax.data import pretrained_tokenizer
from rlhfjax.errors import ConfigError
from rlhfjax.models import hf_checkpoint, transformer
from rlhfjax.training import metrics as metrics_lib

if any(importlib.util.find_spec(m) is None for m in ("torch", "transformers")):
  if os.environ.get("CI"):
    raise ImportError("CI installs torch and transformers (.ci/run): these tests must not skip")
  pytest.skip("needs torch and transformers (pip install -e '.[test]')", allow_module_level=True)

import torch  # noqa: E402  pylint: disable=g-import-not-at-top
import transformers  # noqa: E402  pylint: disable=g-import-not-at-top

# The part of Qwen3's hybrid template that decides whether the model thinks: with
# enable_thinking false the assistant turn opens with an empty think block.
QWEN3_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}")
# Gemma's chat template (Gemma 2's and 3's without their system-turn handling): the template opens
# with the bos token, the assistant's role is "model", each turn ends with <end_of_turn>.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}"
    "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")
VOCAB = 272  # The tokenizers' 265 (Gemma's 269) tokens, padded up as published vocabularies are.
STAGES = "sft,label,rm,ppo,grpo,dpo"



def add_special_tokens(directory, tokens: list[str], first_id: int) -> None:
  """Appends special tokens, numbered from `first_id`, to the directory's tokenizer.json."""
  tok_path = os.path.join(directory, "tokenizer.json")
  tok = json.load(open(tok_path))
  for i, content in enumerate(tokens, first_id):
    tok["added_tokens"].append({"id": i, "content": content, "single_word": False,
                                "lstrip": False, "rstrip": False, "normalized": False,
                                "special": True})
    tok["model"]["vocab"][content] = i
  json.dump(tok, open(tok_path, "w"))


def qwen3_tokenizer(directory) -> str:
  """Qwen3's special tokens: no bos, eos `<|im_end|>`, pad `<|endoftext|>`, no unk, and among the
  others `<|fim_pad|>`; generation stops at `<|im_end|>` or `<|endoftext|>`."""
  write_tokenizer(directory, template=QWEN3_TEMPLATE, eos_ids=[263, 261])
  add_special_tokens(directory, ["<|fim_pad|>"], 264)
  path = os.path.join(directory, "tokenizer_config.json")
  config = json.load(open(path))
  config.update(bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None,
                tokenizer_class="Qwen2Tokenizer")
  json.dump(config, open(path, "w"))
  return str(directory)


def pythia_tokenizer(directory) -> str:
  """GPT-NeoX-20B's special tokens: `<|endoftext|>` is bos, eos and unk, `<|padding|>` is an added
  special token that no key names, and there is no chat template."""
  write_tokenizer(directory, template=None, eos_ids=261)
  add_special_tokens(directory, ["<|padding|>"], 264)
  config = {"add_prefix_space": False, "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
            "unk_token": "<|endoftext|>", "tokenizer_class": "GPTNeoXTokenizer",
            "model_max_length": 2048}
  json.dump(config, open(os.path.join(directory, "tokenizer_config.json"), "w"))
  return str(directory)


def gemma_tokenizer(directory) -> str:
  """Gemma's special tokens (`<bos>`, `<eos>`, `<pad>`, `<start_of_turn>`, `<end_of_turn>`) and its
  turn template; eos is `<eos>`, as Gemma's tokenizer_config.json says, and generation stops at
  `<eos>` or `<end_of_turn>`, as the instruction-tuned models' generation_config.json says."""
  write_tokenizer(directory, template=GEMMA_TEMPLATE, eos_ids=[265, 268])
  add_special_tokens(directory, ["<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>"],
                     264)
  path = os.path.join(directory, "tokenizer_config.json")
  config = json.load(open(path))
  # The byte-level BPE stays GPT-2's class: transformers' GemmaTokenizer would rebuild Gemma's own
  # SentencePiece-style pipeline around this vocabulary.
  config.update(bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<|endoftext|>",
                vocab_size=269)
  json.dump(config, open(path, "w"))
  return str(directory)


TOKENIZERS = {"qwen3": lambda d: qwen3_tokenizer(d), "gpt_neox": lambda d: pythia_tokenizer(d),
              "gemma2": lambda d: gemma_tokenizer(d), "gemma3_text": lambda d: gemma_tokenizer(d)}


def hf_checkpoint_dir(directory, family: str) -> str:
  """A tiny model of `family` written by transformers, with its family's tokenizer beside it."""
  common = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, max_position_embeddings=256)
  gemma = dict(num_key_value_heads=2, head_dim=16, sliding_window=16)
  if family == "qwen3":
    config = transformers.Qwen3Config(**common, num_key_value_heads=2, head_dim=16,
                                      tie_word_embeddings=True)
  elif family == "gemma2":  # Layer 0 local, 1 global; transformers' soft-caps 50 and 30.
    config = transformers.Gemma2Config(**common, **gemma)
  elif family == "gemma3_text":  # Layer 0 local (RoPE base 10k), 1 global (1M, scaled by 8).
    config = transformers.Gemma3TextConfig(
        **common, **gemma, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0,
                                            "rope_theta": 1000000.0}})
  else:
    config = transformers.GPTNeoXConfig(**common, use_parallel_residual=True,
                                        rope_parameters={"rope_type": "default",
                                                         "rope_theta": 10000.0,
                                                         "partial_rotary_factor": 0.25})
  torch.manual_seed(0)
  transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(
      str(directory))
  TOKENIZERS[family](directory)
  return str(directory)


# --- The two tokenizers, against transformers' ---------------------------------------------------

def test_qwen3_chat_template_thinks_only_when_asked(tmp_path):
  path = qwen3_tokenizer(tmp_path)
  ours = pretrained_tokenizer.from_directory(path, chat=True)
  # No bos: eos stands in. `<|endoftext|>`, the pad in the file, ends a response too, so pads are
  # `<|fim_pad|>`.
  assert (ours.eos_id, ours.eos_ids, ours.pad_id, ours.bos_id) == (263, (263, 261), 264, 263)
  theirs = transformers.AutoTokenizer.from_pretrained(path)
  messages = [{"role": "user", "content": "hello world"}]
  for thinking in (False, True):
    tok = pretrained_tokenizer.from_directory(path, chat=True, thinking=thinking)
    want = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                      enable_thinking=thinking)
    assert tok.prompt_text("hello world") == want
    assert tok.encode(want) == theirs(want, add_special_tokens=False)["input_ids"]
  assert ours.prompt_text("hi").endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_gemma_chat_template_opens_with_one_bos_and_marks_turns(tmp_path):
  path = gemma_tokenizer(tmp_path)
  tok = pretrained_tokenizer.from_directory(path, chat=True)
  # A chat response ends with the turn's end, `<end_of_turn>`; `<eos>` ends one too.
  assert (tok.bos_id, tok.eos_id, tok.eos_ids, tok.pad_id, tok.vocab_size) == (
      264, 268, (268, 265), 266, 269)
  assert pretrained_tokenizer.from_directory(path).eos_ids[0] == 265  # Without chat: `<eos>`.
  theirs = transformers.AutoTokenizer.from_pretrained(path)
  messages = [{"role": "user", "content": "hello world"}]
  want = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
  assert tok.prompt_text("hello world") == want
  assert want == "<bos><start_of_turn>user\nhello world<end_of_turn>\n<start_of_turn>model\n"
  ids = tok.encode(want)
  assert ids == theirs(want, add_special_tokens=False)["input_ids"]
  assert ids.count(264) == 1 and ids[0] == 264 and ids.count(267) == ids.count(268) + 1
  assert tok.response_text("x") == "x"  # The answer follows the model turn's header.
  # A response, standard or the last turn of a conversation, closes its turn and stops there.
  assert formats.response_tokens(tok, "x", 8) == tok.encode("x") + [268]
  assert chat.response_ids(tok, [("user", "hi")], "x", 8) == tok.encode("x") + [268]
  assert tok.decode(tok.encode("x") + [268, 265] + tok.encode("y")) == "x"


def test_pythia_tokenizer_pads_with_its_padding_token(tmp_path):
  path = pythia_tokenizer(tmp_path)
  tok = pretrained_tokenizer.from_directory(path)
  assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (261, 261, 264, 265)
  text = "hello world"
  theirs = transformers.AutoTokenizer.from_pretrained(path)
  assert tok.encode(text) == theirs(text, add_special_tokens=False)["input_ids"]
  assert tok.prompt_text(text) == text and tok.response_text("x") == " x"  # Plain, no template.
  with pytest.raises(ConfigError, match="format.chat needs a chat template"):
    pretrained_tokenizer.from_directory(path, chat=True)


# --- The pipeline --------------------------------------------------------------------------------

def pipeline_config(init_from: str, chat: bool, stages: str = STAGES):
  config = load_config("smollm2_tldr_sim", "tiny")
  config.stages = stages
  config.model.init_from = init_from
  config.format.update(prompt_len=192, response_len=8, chat=chat)
  config.lora.update(rank=4, models="sft,rm,policy,value")
  config.label.update(num_pairs=8, num_val_pairs=4, batch_size=8)
  config.grpo.update(steps=1, rollout_batch=4, k=2, minibatch_size=4, eval_every=1,
                     eval_examples=2)
  config.dpo.update(batch_size=4, warmup_steps=1, log_every=1)
  return config


@pytest.mark.parametrize("family", ["qwen3", "gpt_neox", "gemma2", "gemma3_text"])
def test_pipeline_from_a_pretrained_checkpoint(tmp_path, family):
  init_from = hf_checkpoint_dir(tmp_path / "hf", family)
  config = pipeline_config(init_from, chat=family != "gpt_neox")
  workdir = str(tmp_path / "run")
  main.run(config, workdir)
  for stage in set(STAGES.split(",")) - {"label"}:
    logged = metrics_lib.read_jsonl(f"{workdir}/{stage}/metrics.jsonl")
    assert logged and all(np.isfinite(v) for m in logged.values() for v in m.values()
                          if isinstance(v, float)), stage
  with open(f"{workdir}/label/train.jsonl") as f:
    assert len(f.read().splitlines()) == config.label.num_pairs
  # The PPO policy (LoRA merged) back in transformers, with rlhfjax's logits.
  export = config.copy_and_resolve_references()
  export.task = "export"
  export.export.model = "ppo"
  directory = main.run(export, workdir)
  params, cfg = hf_checkpoint.load(directory)
  assert cfg == hf_checkpoint.model_config(init_from)
  # The source's tokenizer and generation files travel with the weights.
  exported = pretrained_tokenizer.from_directory(directory, chat=family != "gpt_neox")
  source = pretrained_tokenizer.from_directory(init_from, chat=family != "gpt_neox")
  assert (exported.eos_ids, exported.pad_id, exported.chat_template) == (
      source.eos_ids, source.pad_id, source.chat_template)
  model = transformers.AutoModelForCausalLM.from_pretrained(
      directory, dtype=torch.float32, attn_implementation="eager").eval()
  ids = np.random.default_rng(0).integers(0, 265, (1, 24))
  with torch.no_grad():
    want = model(torch.tensor(ids)).logits[0].numpy()
  p = jax.tree.map(jnp.asarray, params)
  got = np.asarray(transformer.lm_logits(p, transformer.forward(p, jnp.asarray(ids), cfg)[0],
                                         cfg)[0])
  assert np.abs(got - want).max() <= 1e-4
  # Training moved the weights: the export is not the starting checkpoint.
  start, _ = hf_checkpoint.load(init_from)
  assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(start),
                                                     jax.tree.leaves(params)))
