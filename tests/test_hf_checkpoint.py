"""Hugging Face checkpoints in and out: bit-exact round trips of both variants (tied and untied,
float32 and bfloat16), the logits of HF-layout GPT-2 and LLaMA fixtures against independent numpy
forwards written from the HF tensors, atomic saving, the errors, and the tokenizer of an HF
directory.
"""

import importlib.util
import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from rlhfjax.data import pretrained_tokenizer
from rlhfjax.errors import ConfigError, DataError
from rlhfjax.models import hf_checkpoint, transformer
from rlhfjax.models.config import ModelConfig

V, D, H, L, T = 40, 16, 4, 2, 7
IDS = [3, 17, 0, 39, 5, 5, 22]


def tiny(variant: str, tie: bool) -> ModelConfig:
  llama = variant == "llama"
  return ModelConfig(variant=variant, vocab_size=V, d_model=D, n_layers=L, n_heads=H,
                     n_kv_heads=2 if llama else H, d_ff=24, max_len=12, tie_embeddings=tie,
                     norm_eps=1e-6 if llama else 1e-5, rope_theta=500.0 if llama else 10000.0)


def write(directory, config: dict, tensors: dict, shards: int = 1) -> str:
  """An HF checkpoint: config.json and model.safetensors, or `shards` files plus the index."""
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config, f)
  if shards == 1:
    save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    return str(directory)
  names, weight_map = sorted(tensors), {}
  for s in range(shards):
    file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
    part = {n: tensors[n] for n in names[s::shards]}
    save_file(part, os.path.join(directory, file), metadata={"format": "pt"})
    weight_map.update({n: file for n in part})
  with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
  return str(directory)


def logits(params, cfg, ids=IDS) -> np.ndarray:
  p = jax.tree.map(jnp.asarray, params)
  return np.asarray(transformer.lm_logits(p, transformer.forward(p, jnp.array([ids]), cfg)[0],
                                          cfg)[0])


def assert_same_tree(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    x = np.asarray(x)
    assert x.dtype == y.dtype and x.shape == y.shape
    assert x.tobytes() == y.tobytes()  # Bit-exact (NaN payloads and -0.0 included).


# --- Round trips --------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["llama", "gpt2"])
@pytest.mark.parametrize("tie", [True, False])
def test_save_load_round_trip_is_bit_exact(tmp_path, variant, tie):
  cfg = tiny(variant, tie)
  params = transformer.init(jax.random.PRNGKey(1), cfg)
  path = hf_checkpoint.save(params, cfg, str(tmp_path / "ckpt"))
  loaded, cfg2 = hf_checkpoint.load(path)
  assert cfg2 == cfg
  assert_same_tree(params, loaded)
  assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # No .tmp left behind.
  assert sorted(os.listdir(path)) == ["config.json", "model.safetensors"]
  config = json.load(open(os.path.join(path, "config.json")))
  names = load_file(os.path.join(path, "model.safetensors"))
  assert config["tie_word_embeddings"] is tie and ("lm_head.weight" in names) is not tie
  if variant == "llama":
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_key_value_heads"] == 2 and "head_dim" not in config
    # PyTorch [out, in]: q_proj row r is head r // Dh, its dimension r % Dh.
    q = names["model.layers.1.self_attn.q_proj.weight"]
    assert q.shape == (H * 4, D)
    np.testing.assert_array_equal(q[5], np.asarray(params["layers"]["attn"]["q"][1, :, 1, 1]))
    assert names["model.layers.0.mlp.down_proj.weight"].shape == (D, 24)
    assert len(names) == 2 + 9 * L + (not tie)
  else:
    assert config["model_type"] == "gpt2" and config["architectures"] == ["GPT2LMHeadModel"]
    assert config["activation_function"] == "gelu_new" and config["n_inner"] == 24
    # Conv1D [in, out] with q, k, v side by side: column D + 4 is k's head 1, dimension 0.
    c_attn = names["transformer.h.0.attn.c_attn.weight"]
    assert c_attn.shape == (D, 3 * D)
    np.testing.assert_array_equal(c_attn[:, D + 4],
                                  np.asarray(params["layers"]["attn"]["k"][0, :, 1, 0]))
    assert len(names) == 4 + 12 * L + (not tie)


def test_bfloat16_save_and_load(tmp_path):
  cfg = tiny("llama", False)
  params = transformer.init(jax.random.PRNGKey(2), cfg)
  path = hf_checkpoint.save(params, cfg, str(tmp_path / "bf16"), dtype="bfloat16")
  assert json.load(open(os.path.join(path, "config.json")))["torch_dtype"] == "bfloat16"
  loaded, cfg2 = hf_checkpoint.load(path)  # As stored.
  assert (cfg2.param_dtype, cfg2.dtype) == ("bfloat16", "bfloat16")
  assert_same_tree(jax.tree.map(lambda x: np.asarray(x).astype(ml_dtypes.bfloat16), params), loaded)
  loaded_again, _ = hf_checkpoint.load(hf_checkpoint.save(loaded, cfg2, str(tmp_path / "again")))
  assert_same_tree(loaded, loaded_again)
  up, cfg32 = hf_checkpoint.load(path, dtype="float32")  # Exact upcast.
  assert cfg32.param_dtype == "float32"
  np.testing.assert_array_equal(up["lm_head"]["kernel"],
                                loaded["lm_head"]["kernel"].astype(np.float32))


def test_save_replaces_an_existing_directory_only_when_complete(tmp_path, monkeypatch):
  cfg = tiny("gpt2", True)
  params = transformer.init(jax.random.PRNGKey(3), cfg)
  path = str(tmp_path / "ckpt")
  os.makedirs(path)
  open(os.path.join(path, "stale.txt"), "w").close()
  hf_checkpoint.save(params, cfg, path)
  assert sorted(os.listdir(path)) == ["config.json", "model.safetensors"]
  assert sorted(os.listdir(tmp_path)) == ["ckpt"]

  import safetensors.numpy  # pylint: disable=g-import-not-at-top
  def broken(*args, **kwargs):
    raise OSError("disk full")
  monkeypatch.setattr(safetensors.numpy, "save_file", broken)
  other = transformer.init(jax.random.PRNGKey(4), cfg)
  with pytest.raises(OSError, match="disk full"):
    hf_checkpoint.save(other, cfg, path)
  monkeypatch.undo()
  assert_same_tree(params, hf_checkpoint.load(path)[0])  # The old checkpoint is intact.


def test_save_refuses_params_that_do_not_match_the_config(tmp_path):
  cfg = tiny("llama", True)
  params = transformer.init(jax.random.PRNGKey(5), cfg.replace(tie_embeddings=False))
  with pytest.raises(ConfigError, match=r"unexpected \['lm_head/kernel'\]"):
    hf_checkpoint.save(params, cfg, str(tmp_path / "x"))
  assert not os.path.exists(tmp_path / "x")


# --- Fixtures in the exact HF layout against independent numpy forwards ------------------------

def gpt2_hf(rng: np.random.Generator, prefix: str):
  """A tiny GPT-2 as transformers saves it: HF's gpt2 config.json, Conv1D weights [in, out], the
  fused c_attn, and the causal-mask buffers `attn.bias` of the original checkpoints."""
  config = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
            "attn_pdrop": 0.1, "bos_token_id": V - 1, "embd_pdrop": 0.1, "eos_token_id": V - 1,
            "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
            "n_ctx": 12, "n_embd": D, "n_head": H, "n_inner": None, "n_layer": L,
            "n_positions": 12, "resid_pdrop": 0.1, "scale_attn_weights": True,
            "summary_activation": None, "summary_first_dropout": 0.1,
            "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True,
            "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
            "vocab_size": V}
  w = lambda *shape: (0.3 * rng.standard_normal(shape)).astype(np.float32)
  t = {prefix + "wte.weight": w(V, D), prefix + "wpe.weight": w(12, D),
       prefix + "ln_f.weight": 1 + w(D), prefix + "ln_f.bias": w(D)}
  for i in range(L):
    p = f"{prefix}h.{i}."
    t.update({p + "ln_1.weight": 1 + w(D), p + "ln_1.bias": w(D),
              p + "attn.bias": np.tril(np.ones((1, 1, 12, 12), np.float32)),
              p + "attn.c_attn.weight": w(D, 3 * D), p + "attn.c_attn.bias": w(3 * D),
              p + "attn.c_proj.weight": w(D, D), p + "attn.c_proj.bias": w(D),
              p + "ln_2.weight": 1 + w(D), p + "ln_2.bias": w(D),
              p + "mlp.c_fc.weight": w(D, 4 * D), p + "mlp.c_fc.bias": w(4 * D),
              p + "mlp.c_proj.weight": w(4 * D, D), p + "mlp.c_proj.bias": w(D)})
  return config, t


def gpt2_reference(t: dict, prefix: str, ids) -> np.ndarray:
  """GPT-2 (Radford et al. 2019) in float64 from the HF tensors: pre-LayerNorm blocks, tanh-GELU,
  causal attention scaled by 1/sqrt(Dh), logits through the tied wte."""
  g = lambda n: t[prefix + n].astype(np.float64)
  n, dh = len(ids), D // H

  def ln(x, name):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * g(name + ".weight") + g(name + ".bias")

  x = g("wte.weight")[ids] + g("wpe.weight")[:n]
  for i in range(L):
    p = f"h.{i}."
    qkv = ln(x, p + "ln_1") @ g(p + "attn.c_attn.weight") + g(p + "attn.c_attn.bias")
    q, k, v = (m.reshape(n, H, dh).transpose(1, 0, 2) for m in np.split(qkv, 3, -1))
    x = x + attention(q, k, v) @ g(p + "attn.c_proj.weight") + g(p + "attn.c_proj.bias")
    m = ln(x, p + "ln_2") @ g(p + "mlp.c_fc.weight") + g(p + "mlp.c_fc.bias")
    m = 0.5 * m * (1 + np.tanh(np.sqrt(2 / np.pi) * (m + 0.044715 * m ** 3)))
    x = x + m @ g(p + "mlp.c_proj.weight") + g(p + "mlp.c_proj.bias")
  return ln(x, "ln_f") @ g("wte.weight").T


def attention(q, k, v):
  """Causal softmax attention of [heads, T, Dh] arrays; returns [T, heads * Dh]."""
  n, dh = q.shape[1], q.shape[2]
  scores = np.where(np.tril(np.ones((n, n), bool)), q @ k.transpose(0, 2, 1) / np.sqrt(dh), -np.inf)
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  return (probs @ v).transpose(1, 0, 2).reshape(n, -1)


@pytest.mark.parametrize("prefix", ["transformer.", ""])
def test_gpt2_logits_match_a_numpy_gpt2_from_the_hf_tensors(tmp_path, prefix):
  config, tensors = gpt2_hf(np.random.default_rng(0), prefix)
  params, cfg = hf_checkpoint.load(write(tmp_path, config, tensors))
  assert (cfg.variant, cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.max_len) == ("gpt2", D, H, 4 * D, 12)
  assert cfg.tie_embeddings and cfg.dropout == 0.0
  want = gpt2_reference(tensors, prefix, IDS)
  assert np.abs(want).max() > 1.0  # Logits far from zero: the comparison means something.
  np.testing.assert_allclose(logits(params, cfg), want, atol=1e-4, rtol=0)


def llama_hf(rng: np.random.Generator):
  """A tiny LLaMA as transformers saves it: GQA (4 query heads, 2 kv heads), head_dim 8 with a
  hidden size of 24 (so head_dim is not hidden/heads), untied lm_head, PyTorch [out, in] weights."""
  d, dh, kv, f = 24, 8, 2, 40
  config = {"architectures": ["LlamaForCausalLM"], "attention_bias": False,
            "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "head_dim": dh,
            "hidden_act": "silu", "hidden_size": d, "initializer_range": 0.02,
            "intermediate_size": f, "max_position_embeddings": 32, "mlp_bias": False,
            "model_type": "llama", "num_attention_heads": H, "num_hidden_layers": L,
            "num_key_value_heads": kv, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
            "rope_scaling": None, "rope_theta": 500.0, "tie_word_embeddings": False,
            "torch_dtype": "float32", "use_cache": True, "vocab_size": V}
  w = lambda *shape: (0.3 * rng.standard_normal(shape)).astype(np.float32)
  t = {"model.embed_tokens.weight": w(V, d), "model.norm.weight": 1 + w(d),
       "lm_head.weight": w(V, d)}
  for i in range(L):
    p = f"model.layers.{i}."
    t.update({p + "input_layernorm.weight": 1 + w(d),
              p + "post_attention_layernorm.weight": 1 + w(d),
              p + "self_attn.q_proj.weight": w(H * dh, d),
              p + "self_attn.k_proj.weight": w(kv * dh, d),
              p + "self_attn.v_proj.weight": w(kv * dh, d),
              p + "self_attn.o_proj.weight": w(d, H * dh),
              p + "mlp.gate_proj.weight": w(f, d), p + "mlp.up_proj.weight": w(f, d),
              p + "mlp.down_proj.weight": w(d, f)})
  return config, t


def llama_reference(t: dict, config: dict, ids) -> np.ndarray:
  """LLaMA (Touvron et al. 2023) in float64 from the HF tensors: RMSNorm, RoPE in HF's rotate-half
  form (frequencies theta^(-2i/Dh), cos/sin repeated over both halves), kv head j // groups for
  query head j, SwiGLU; q/k/v biases added before RoPE where the tensors have them (Qwen2), logits
  through `lm_head` or the tied embedding."""
  g = lambda n: t[n].astype(np.float64)
  h_count, kv = config["num_attention_heads"], config["num_key_value_heads"]
  n, dh = len(ids), config.get("head_dim", config["hidden_size"] // h_count)

  def rms(x, name):
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + config["rms_norm_eps"]) * g(name)

  def proj(x, p, name):
    b = t.get(f"{p}self_attn.{name}_proj.bias")
    return x @ g(f"{p}self_attn.{name}_proj.weight").T + (0 if b is None else b.astype(np.float64))

  angle = np.arange(n)[:, None] * config["rope_theta"] ** (-np.arange(0, dh, 2) / dh)
  cos, sin = np.cos(np.concatenate([angle] * 2, -1)), np.sin(np.concatenate([angle] * 2, -1))
  rope = lambda x: x * cos + np.concatenate([-x[..., dh // 2:], x[..., :dh // 2]], -1) * sin
  heads = lambda x, k: x.reshape(n, k, dh).transpose(1, 0, 2)
  x = g("model.embed_tokens.weight")[ids]
  for i in range(config["num_hidden_layers"]):
    p = f"model.layers.{i}."
    h = rms(x, p + "input_layernorm.weight")
    q = rope(heads(proj(h, p, "q"), h_count))
    k = rope(heads(proj(h, p, "k"), kv)).repeat(h_count // kv, 0)
    v = heads(proj(h, p, "v"), kv).repeat(h_count // kv, 0)
    x = x + attention(q, k, v) @ g(p + "self_attn.o_proj.weight").T
    h = rms(x, p + "post_attention_layernorm.weight")
    gate = h @ g(p + "mlp.gate_proj.weight").T
    x = x + (gate / (1 + np.exp(-gate)) * (h @ g(p + "mlp.up_proj.weight").T)) @ \
        g(p + "mlp.down_proj.weight").T
  head = "lm_head.weight" if "lm_head.weight" in t else "model.embed_tokens.weight"
  return rms(x, "model.norm.weight") @ g(head).T


def test_sharded_llama_logits_match_a_numpy_llama_from_the_hf_tensors(tmp_path):
  config, tensors = llama_hf(np.random.default_rng(1))
  path = write(tmp_path, config, tensors, shards=2)
  assert not os.path.exists(os.path.join(path, "model.safetensors"))
  params, cfg = hf_checkpoint.load(path)
  assert (cfg.n_heads, cfg.n_kv_heads, cfg.dim_per_head, cfg.d_model) == (H, 2, 8, 24)
  assert not cfg.tie_embeddings and cfg.rope_theta == 500.0 and cfg.max_len == 32
  assert hf_checkpoint.model_config(path) == cfg
  want = llama_reference(tensors, config, IDS)
  assert np.abs(want).max() > 1.0
  np.testing.assert_allclose(logits(params, cfg), want, atol=1e-4, rtol=0)
  # Export writes the same tensors back (one file now).
  again = load_file(os.path.join(hf_checkpoint.save(params, cfg, str(tmp_path / "out")),
                                 "model.safetensors"))
  assert sorted(again) == sorted(tensors)
  for name, value in tensors.items():
    np.testing.assert_array_equal(again[name], value)


def test_bfloat16_files_load_as_bfloat16(tmp_path):
  config, tensors = llama_hf(np.random.default_rng(2))
  config["torch_dtype"] = "bfloat16"
  bf16 = {n: a.astype(ml_dtypes.bfloat16) for n, a in tensors.items()}
  params, cfg = hf_checkpoint.load(write(tmp_path, config, bf16))
  assert cfg.param_dtype == "bfloat16"
  q = params["layers"]["attn"]["q"]
  assert q.dtype == ml_dtypes.bfloat16
  np.testing.assert_array_equal(q[1].reshape(24, -1).T,
                                bf16["model.layers.1.self_attn.q_proj.weight"])


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("torch", "transformers")),
                    reason="loading the export in transformers needs torch and transformers")
@pytest.mark.parametrize("variant", ["llama", "gpt2"])
def test_transformers_reads_the_export(tmp_path, variant):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(9)
  config, tensors = llama_hf(rng) if variant == "llama" else gpt2_hf(rng, "transformer.")
  params, cfg = hf_checkpoint.load(write(tmp_path / "in", config, tensors))
  path = hf_checkpoint.save(params, cfg, str(tmp_path / "out"))
  model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
  assert type(model).__name__ == ("LlamaForCausalLM" if variant == "llama" else "GPT2LMHeadModel")
  with torch.no_grad():
    want = model(torch.tensor([IDS])).logits[0].numpy()
  np.testing.assert_allclose(logits(params, cfg), want, atol=1e-4, rtol=0)


# --- Errors -------------------------------------------------------------------------------------

def test_missing_tensor_names_the_tensor_and_the_file(tmp_path):
  config, tensors = llama_hf(np.random.default_rng(3))
  del tensors["model.layers.1.mlp.up_proj.weight"]
  path = write(tmp_path, config, tensors)
  with pytest.raises(ConfigError, match=r"model\.safetensors: missing tensor "
                                        r"'model\.layers\.1\.mlp\.up_proj\.weight'"):
    hf_checkpoint.load(path)


@pytest.mark.parametrize("cut", [0, 5, 0.5])
def test_empty_or_truncated_weights_name_the_file(tmp_path, cut):
  config, tensors = llama_hf(np.random.default_rng(3))
  path = write(tmp_path, config, tensors)
  weights = os.path.join(path, "model.safetensors")
  os.truncate(weights, int(cut * os.path.getsize(weights)) if isinstance(cut, float) else cut)
  with pytest.raises(DataError, match=r"model\.safetensors: not a readable safetensors file \("
                                      r"Error while deserializing header"):
    hf_checkpoint.load(path)


def test_index_entry_without_its_tensor_names_the_shard(tmp_path):
  config, tensors = llama_hf(np.random.default_rng(3))
  path = write(tmp_path, config, tensors, shards=2)
  index = json.load(open(os.path.join(path, "model.safetensors.index.json")))
  index["weight_map"]["model.layers.9.mlp.up_proj.weight"] = "model-00002-of-00002.safetensors"
  json.dump(index, open(os.path.join(path, "model.safetensors.index.json"), "w"))
  with pytest.raises(ConfigError, match=r"model-00002-of-00002\.safetensors: no tensor "
                                        r"'model\.layers\.9\.mlp\.up_proj\.weight'"):
    hf_checkpoint.load(path)


def test_unexpected_and_misshapen_tensors_are_refused(tmp_path):
  config, tensors = llama_hf(np.random.default_rng(4))
  write(tmp_path / "extra", config, {**tensors, "model.layers.0.self_attn.q_proj.bias":
                                     np.zeros(32, np.float32)})
  with pytest.raises(ConfigError, match=r"unexpected tensor\(s\) model\.layers\.0\.self_attn"):
    hf_checkpoint.load(str(tmp_path / "extra"))
  k = "model.layers.0.self_attn.k_proj.weight"
  tensors[k] = tensors[k].T
  write(tmp_path / "shape", config, tensors)
  with pytest.raises(ConfigError, match=r"k_proj\.weight' has shape \(24, 16\), .*config\.json "
                                        r"implies \(16, 24\)"):
    hf_checkpoint.load(str(tmp_path / "shape"))


def test_tied_duplicate_head_must_equal_the_embedding(tmp_path):
  config, tensors = gpt2_hf(np.random.default_rng(5), "")
  tensors["lm_head.weight"] = tensors["wte.weight"].copy()
  params, _ = hf_checkpoint.load(write(tmp_path / "same", config, tensors))
  assert "lm_head" not in params
  tensors["lm_head.weight"][0, 0] += 1
  with pytest.raises(ConfigError, match="differs from the embedding"):
    hf_checkpoint.load(write(tmp_path / "differs", config, tensors))


@pytest.mark.parametrize("change, message", [
    ({"model_type": "gemma"}, r"config\.json: model_type 'gemma' is not supported"),
    ({"architectures": ["LlamaForTokenClassification"]}, r"config\.json: architectures"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 8.0}},
     r"config\.json: rope_scaling of type 'linear' is not supported"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}},
     r"config\.json: rope_parameters of type 'yarn'"),
    ({"hidden_act": "gelu"}, r"config\.json: hidden_act='gelu' is not supported"),
    ({"attention_bias": True}, r"config\.json: attention_bias=True"),
    ({"model_type": "mistral", "sliding_window": 16}, r"config\.json: sliding_window=16"),
    ({"hidden_size": None}, r"config\.json: missing key 'hidden_size'"),
])
def test_unsupported_llama_configs_name_the_key(tmp_path, change, message):
  config, tensors = llama_hf(np.random.default_rng(6))
  path = write(tmp_path, {**config, **change}, tensors)
  with pytest.raises(ConfigError, match=message):
    hf_checkpoint.load(path)


def test_supported_variants_of_the_config(tmp_path):
  config, tensors = llama_hf(np.random.default_rng(7))
  mistral = {"model_type": "mistral", "architectures": ["MistralForCausalLM"],
             "sliding_window": None, "rope_theta": None,
             "rope_parameters": {"rope_type": "default", "rope_theta": 321.0}}
  path = write(tmp_path, {**config, **mistral}, tensors)
  assert hf_checkpoint.model_config(path).rope_theta == 321.0


@pytest.mark.parametrize("change, message", [
    ({"activation_function": "gelu"}, r"activation_function='gelu' is not supported: rlhfjax's "
                                      r"GPT-2 MLP is the tanh approximation"),
    ({"scale_attn_by_inverse_layer_idx": True}, r"scale_attn_by_inverse_layer_idx=True"),
])
def test_unsupported_gpt2_configs_name_the_key(tmp_path, change, message):
  config, tensors = gpt2_hf(np.random.default_rng(8), "")
  with pytest.raises(ConfigError, match=message):
    hf_checkpoint.load(write(tmp_path, {**config, **change}, tensors))


def test_gpt2_with_grouped_query_attention_cannot_be_saved(tmp_path):
  cfg = tiny("gpt2", True).replace(n_kv_heads=2)
  with pytest.raises(ConfigError, match="n_kv_heads == model.n_heads"):
    hf_checkpoint.save(transformer.init(jax.random.PRNGKey(0), cfg), cfg, str(tmp_path / "x"))


# --- Tokenizer of an HF directory ---------------------------------------------------------------

def byte_chars() -> list[str]:
  """GPT-2's byte-to-unicode table, byte b -> chars[b] (printable bytes stand for themselves)."""
  keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
  out, extra = {}, 0
  for b in range(256):
    if b in keep:
      out[b] = chr(b)
    else:
      out[b] = chr(256 + extra)
      extra += 1
  return [out[b] for b in range(256)]


TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
            "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def write_tokenizer(directory, template=TEMPLATE, eos_ids=263):
  """tokenizer.json, tokenizer_config.json and generation_config.json as a SmolLM2-style model
  ships them: byte-level BPE (vocab ids 0-255 the bytes), five merges, and three special tokens;
  pad is eos; generation stops at `eos_ids`."""
  chars = byte_chars()
  vocab = {c: b for b, c in enumerate(chars)}
  merges = ["h e", "l l", "he ll", "hell o", "Ġ w"]
  for i, m in enumerate(merges):
    vocab[m.replace(" ", "")] = 256 + i
  specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
  added = [{"id": 261 + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True} for i, s in enumerate(specials)]
  vocab.update({s: 261 + i for i, s in enumerate(specials)})
  byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                "use_regex": True}
  tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
               "normalizer": None, "pre_tokenizer": byte_level, "post_processor": byte_level,
               "decoder": byte_level,
               "model": {"type": "BPE", "dropout": None, "unk_token": None,
                         "continuing_subword_prefix": None, "end_of_word_suffix": None,
                         "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                         "merges": merges}}
  config = {"add_prefix_space": False, "bos_token": "<|im_start|>",
            "clean_up_tokenization_spaces": False,
            "eos_token": {"__type": "AddedToken", "content": "<|im_end|>", "lstrip": False,
                          "normalized": False, "rstrip": False, "single_word": False},
            "model_max_length": 8192, "pad_token": "<|im_end|>", "tokenizer_class": "GPT2Tokenizer",
            "unk_token": "<|endoftext|>", "vocab_size": 264}
  if template is not None:
    config["chat_template"] = template
  os.makedirs(directory, exist_ok=True)
  json.dump(tokenizer, open(os.path.join(directory, "tokenizer.json"), "w"))
  json.dump(config, open(os.path.join(directory, "tokenizer_config.json"), "w"))
  # As a release's generation_config.json lists its eos (transformers' save_pretrained wrote the
  # model config's default ids, which name bytes of this vocabulary).
  json.dump({"eos_token_id": eos_ids}, open(os.path.join(directory, "generation_config.json"), "w"))
  return str(directory)


def test_tokenizer_from_an_hf_directory(tmp_path):
  tok = pretrained_tokenizer.from_directory(write_tokenizer(tmp_path))
  assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (262, 263, 261, 264)
  assert tok.encode("hello world") == [259, 260, ord("o"), ord("r"), ord("l"), ord("d")]
  prompt = tok.chat([{"role": "user", "content": "hello world"}])
  assert prompt == "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
  assert tok.encode(prompt) == ([262, *map(ord, "user"), 10, 259, 260, *map(ord, "orld"), 263, 10,
                                 262, *map(ord, "assistant"), 10])
  assert tok.decode(tok.encode(prompt)) == "user\nhello world"  # Stops at eos, drops specials.
  assert tok.prompt_text("hi") == "hi"
  chat = pretrained_tokenizer.from_directory(str(tmp_path), chat=True)
  assert chat.prompt_text("hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_chat_template_file_and_special_tokens_in_the_template(tmp_path):
  path = write_tokenizer(tmp_path, template=None)
  with pytest.raises(ConfigError, match="needs a chat template"):
    pretrained_tokenizer.from_directory(path, chat=True)
  with open(os.path.join(path, "chat_template.jinja"), "w") as f:
    f.write("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{{ eos_token }}{% endfor %}")
  tok = pretrained_tokenizer.from_directory(path, chat=True)
  assert tok.prompt_text("hello") == "<|im_start|>hello<|im_end|>"
