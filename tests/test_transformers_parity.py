"""Parity with transformers itself, family by family: transformers builds a tiny random model of
each (from its config class, no download), its weights scaled up so that norms, biases and the
attention pattern matter, and writes it with `save_pretrained`. Then

- `hf_checkpoint.load` and rlhfjax's forward give transformers' float32 logits on a 40-token input
  within 1e-4, with the same argmax at every position;
- rlhfjax's export (`hf_checkpoint.save`) loads back into transformers as the very same model
  (every tensor equal, so its logits are the original's), and back into rlhfjax as the same config;
- the KV-cache sampler's greedy tokens are `generate`'s (greedy, 32 new tokens), left padding
  included;
- a reward model exports as the family's `*ForSequenceClassification` with rlhfjax's score.

Families: Qwen3 (q/k norms, head_dim unlike hidden / heads), GPT-NeoX (fused per-head
query_key_value, partial rotary, parallel residual; and its sequential form), LLaMA with Llama 3.1's
RoPE scaling, Mistral (head_dim unlike hidden / heads), Qwen2 (q/k/v biases), Gemma 2 and Gemma 3
(text): a sliding window of 8 on local layers (so the 40-token input and the 12 + 32 tokens of
`generate` cross it), soft-caps small enough to bite, `query_pre_attn_scalar` unlike head_dim,
Gemma 3 with RoPE bases of its own on local and global layers and linear scaling on the global
ones. transformers runs Gemma eagerly (`attn_implementation="eager"`: soft-capping needs it).
torch and transformers are test dependencies: CI installs them (.ci/run), so there these tests run,
never skip.
"""

import functools
import importlib.util
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlhfjax.models import hf_checkpoint, sampling, transformer

if any(importlib.util.find_spec(m) is None for m in ("torch", "transformers")):
  if os.environ.get("CI"):
    raise ImportError("CI installs torch and transformers (.ci/run): these tests must not skip")
  pytest.skip("needs torch and transformers (pip install -e '.[test]')", allow_module_level=True)

import torch  # noqa: E402  pylint: disable=g-import-not-at-top
import transformers  # noqa: E402  pylint: disable=g-import-not-at-top

V, T, NEW = 96, 40, 32
SMALL = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=128)
# model_type: (config class, its arguments, the ModelConfig fields it must load as).
FAMILIES = {
    "qwen3": ("Qwen3Config", dict(SMALL, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                                  tie_word_embeddings=False,
                                  rope_parameters={"rope_type": "default", "rope_theta": 1000.0}),
              dict(variant="llama", qk_norm=True, head_dim=16, n_kv_heads=2, qkv_bias=False,
                   tie_embeddings=False)),
    "gpt_neox": ("GPTNeoXConfig", dict(SMALL, hidden_size=64, layer_norm_eps=1e-5,
                                       use_parallel_residual=True,
                                       rope_parameters={"rope_type": "default", "rope_theta": 1000.0,
                                                        "partial_rotary_factor": 0.25}),
                 dict(variant="neox", rotary_dim=4, parallel_residual=True, tie_embeddings=False)),
    "gpt_neox_sequential": ("GPTNeoXConfig", dict(SMALL, use_parallel_residual=False,
                                                  rope_parameters={"rope_type": "default",
                                                                   "rope_theta": 1000.0,
                                                                   "partial_rotary_factor": 0.5}),
                            dict(variant="neox", rotary_dim=4, parallel_residual=False)),
    "llama": ("LlamaConfig", dict(SMALL, num_key_value_heads=2, tie_word_embeddings=False,
                                  rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                                   "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 64}),
              dict(variant="llama", rope_scaling_factor=8.0, rope_original_max_len=64)),
    "mistral": ("MistralConfig", dict(SMALL, num_key_value_heads=1, head_dim=12, sliding_window=None,
                                      tie_word_embeddings=True),
                dict(variant="llama", head_dim=12, n_kv_heads=1, tie_embeddings=True)),
    "qwen2": ("Qwen2Config", dict(SMALL, num_key_value_heads=2, tie_word_embeddings=True,
                                  rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
              dict(variant="llama", qkv_bias=True, tie_embeddings=True)),
    # Layers 0 and 2 local, 1 global (transformers' default alternation).
    "gemma2": ("Gemma2Config", dict(SMALL, num_hidden_layers=3, num_key_value_heads=2, head_dim=16,
                                    query_pre_attn_scalar=24, sliding_window=8,
                                    attn_logit_softcapping=2.0, final_logit_softcapping=8.0,
                                    rope_parameters={"rope_type": "default", "rope_theta": 100.0}),
               dict(variant="llama", norm_plus_one=True, sandwich_norm=True,
                    mlp_activation="gelu_tanh", embed_scale=True, query_pre_attn_scalar=24.0,
                    attn_softcap=2.0, final_softcap=8.0, sliding_window=8,
                    sliding_window_pattern=2, tie_embeddings=True, head_dim=16)),
    # Layers 0 and 1 local, 2 global.
    "gemma3_text": ("Gemma3TextConfig", dict(
        SMALL, num_hidden_layers=3, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=8,
        sliding_window=8, final_logit_softcapping=8.0,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0,
                                            "rope_theta": 1000.0}}),
                    dict(variant="llama", qk_norm=True, norm_plus_one=True, sandwich_norm=True,
                         attn_softcap=0.0, final_softcap=8.0, sliding_window=8,
                         sliding_window_pattern=3, rope_theta=1000.0, rope_local_theta=10.0,
                         rope_scaling_type="linear", rope_scaling_factor=8.0, n_kv_heads=1)),
}
# The model_type each exports as (the sequential GPT-NeoX is still gpt_neox).
EXPORTED = {"qwen3": "qwen3", "gpt_neox": "gpt_neox", "gpt_neox_sequential": "gpt_neox",
            "llama": "llama", "mistral": "llama", "qwen2": "qwen2", "gemma2": "gemma2",
            "gemma3_text": "gemma3_text"}
N_LAYERS = {"gemma2": 3, "gemma3_text": 3}  # The others have 2.


def tiny_hf_model(family: str, seed: int = 0):
  """A transformers model of `family`, float32, with random weights: matrices N(0, 0.3²) (fan-in 32
  to 64, so activations are O(1) and logits O(10)), norm scales 1 + N(0, 0.3²) (Gemma stores the
  scale minus 1), biases N(0, 0.3²). Gemma runs eagerly (transformers' soft-capping needs it)."""
  name, kwargs, _ = FAMILIES[family]
  config = getattr(transformers, name)(**kwargs)
  gemma = family.startswith("gemma")
  model = transformers.AutoModelForCausalLM.from_config(
      config, dtype=torch.float32, **({"attn_implementation": "eager"} if gemma else {})).eval()
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for n, p in model.named_parameters():
      noise = 0.3 * torch.randn(p.shape, generator=gen)
      p.copy_(1 + noise if "norm" in n and n.endswith("weight") and not gemma else noise)
  return model


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
  """(family, transformers model, its save_pretrained directory, rlhfjax params and config)."""
  name = request.param
  model = tiny_hf_model(name)
  directory = str(tmp_path_factory.mktemp(name))
  model.save_pretrained(directory)
  params, cfg = hf_checkpoint.load(directory)
  return name, model, directory, jax.tree.map(jnp.asarray, params), cfg


IDS = np.random.default_rng(0).integers(0, V, (1, T))


def hf_logits(model, ids=IDS) -> np.ndarray:
  with torch.no_grad():
    return model(torch.tensor(ids)).logits[0].numpy()


@functools.partial(jax.jit, static_argnames="cfg")
def _logits(params, ids, cfg):
  return transformer.lm_logits(params, transformer.forward(params, ids, cfg)[0], cfg)


def our_logits(params, cfg, ids=IDS) -> np.ndarray:
  """rlhfjax's logits, compiled once per config (the tests of a family share the program)."""
  return np.asarray(_logits(params, jnp.asarray(ids), cfg)[0])


def test_config_json_loads_as_the_family(family):
  name, _, _, _, cfg = family
  for field, want in FAMILIES[name][2].items():
    assert getattr(cfg, field) == want, field
  assert (cfg.n_layers, cfg.vocab_size, cfg.max_len) == (N_LAYERS.get(name, 2), V, 128)


def test_logits_match_transformers(family):
  name, model, _, params, cfg = family
  want, got = hf_logits(model), our_logits(params, cfg)
  diff = float(np.abs(got - want).max())
  print(f"{name}: max |logit difference| {diff:.2g} (logits up to {np.abs(want).max():.1f})")
  assert np.abs(want).max() > 3.0  # Logits far from zero: the comparison means something.
  assert diff <= 1e-4
  assert (got.argmax(-1) == want.argmax(-1)).all()


def test_export_is_the_same_transformers_model(family, tmp_path):
  name, model, _, params, cfg = family
  out = hf_checkpoint.save(params, cfg, str(tmp_path / "export"))
  again = transformers.AutoModelForCausalLM.from_pretrained(
      out, dtype=torch.float32, attn_implementation=model.config._attn_implementation).eval()
  assert again.config.model_type == EXPORTED[name]  # Mistral without its window is LLaMA.
  want, got = model.state_dict(), again.state_dict()
  assert sorted(got) == sorted(want)
  for key, value in want.items():
    assert torch.equal(got[key], value), key
  np.testing.assert_array_equal(hf_logits(again), hf_logits(model))
  assert hf_checkpoint.load(out)[1] == cfg


def test_greedy_sampler_matches_generate(family):
  """Two prompts, the second left-padded by 6: transformers' `generate` (greedy, its own KV cache,
  positions from the attention mask) and rlhfjax's sampler give the same 32 tokens."""
  _, model, _, params, cfg = family
  rng = np.random.default_rng(1)
  prompts = rng.integers(3, V, (2, 12))
  mask = np.ones((2, 12), bool)
  mask[1, :6] = False
  prompts[1, :6] = 0
  with torch.no_grad():
    want = model.generate(torch.tensor(prompts), attention_mask=torch.tensor(mask.astype(np.int64)),
                          max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                          eos_token_id=None, pad_token_id=0)[:, 12:].numpy()
  scfg = sampling.SamplingConfig(max_new_tokens=NEW, eos_id=V, pad_id=0, temperature=0.0)
  got = sampling.sample(params, jnp.asarray(prompts), jnp.asarray(mask), jax.random.key(0), cfg,
                        scfg)
  np.testing.assert_array_equal(np.asarray(got.tokens), want)


def _with(params, **attn):
  """`params` with the attention leaves `attn` names replaced by `value(old leaf)`."""
  layers = {**params["layers"], "attn": {**params["layers"]["attn"],
                                         **{k: f(params["layers"]["attn"][k]) for k, f in attn.items()}}}
  return {**params, "layers": layers}


def test_each_detail_of_the_new_families_moves_the_logits(family):
  """The 1e-4 agreement is not loose: leaving out any one detail of Qwen3, GPT-NeoX, Gemma 2 or
  Gemma 3 moves the logits by far more (and the other families' details are covered by the same
  comparison)."""
  name, _, _, params, cfg = family
  ones, zeros = jnp.ones_like, jnp.zeros_like
  variants = {
      "qwen3": lambda: {"q/k norm scales": (_with(params, q_norm=ones, k_norm=ones), cfg)},
      "gpt_neox": lambda: {
          "full rotary": (params, cfg.replace(rotary_dim=0)),
          "sequential residual": (params, cfg.replace(parallel_residual=False)),
          "qkv biases": (_with(params, q_bias=zeros, k_bias=zeros, v_bias=zeros), cfg),
          "dense bias": (_with(params, o_bias=zeros), cfg)},
      "gemma2": lambda: {
          "no window": (params, cfg.replace(sliding_window=0)),
          "window on every layer": (params, cfg.replace(sliding_window_pattern=0)),
          "no attention soft-cap": (params, cfg.replace(attn_softcap=0.0)),
          "no final soft-cap": (params, cfg.replace(final_softcap=0.0)),
          "scores by head_dim": (params, cfg.replace(query_pre_attn_scalar=0.0)),
          "unscaled embeddings": (params, cfg.replace(embed_scale=False)),
          "SwiGLU": (params, cfg.replace(mlp_activation="silu")),
          "no post norms": (params, cfg.replace(sandwich_norm=False))},
      "gemma3_text": lambda: {
          "no window": (params, cfg.replace(sliding_window=1000)),  # Wider than the input.
          "q/k norm scales": (_with(params, q_norm=zeros, k_norm=zeros), cfg),
          "one RoPE base": (params, cfg.replace(rope_local_theta=0.0)),
          "no linear RoPE scaling": (params, cfg.replace(rope_scaling_factor=1.0)),
          "no final soft-cap": (params, cfg.replace(final_softcap=0.0))},
  }.get(name, dict)()
  base = our_logits(params, cfg)
  for detail, (p, c) in variants.items():
    assert np.abs(our_logits(p, c) - base).max() > 0.05, detail


def test_reward_model_exports_as_the_family_sequence_classifier(family, tmp_path):
  """A reward model (this backbone and a scalar head) exports as the family's
  `*ForSequenceClassification`, whose score at the last token is rlhfjax's reward before its bias,
  and loads back as the same config."""
  name, model, _, params, cfg = family
  head = {"kernel": jnp.asarray(np.random.default_rng(2).normal(size=cfg.d_model), jnp.float32),
          "bias": jnp.asarray(0.5)}
  out = hf_checkpoint.save({"backbone": params, "head": head}, cfg, str(tmp_path / "rm"),
                           reward_pad_id=0)
  scorer = transformers.AutoModelForSequenceClassification.from_pretrained(
      out, dtype=torch.float32, attn_implementation=model.config._attn_implementation).eval()
  ids = IDS[:, :20] % (V - 1) + 1  # No padding id: the score is read at the last token.
  with torch.no_grad():
    want = scorer(torch.tensor(ids)).logits[0, 0].item()
  hidden = _hidden(params, jnp.asarray(ids), cfg)
  assert abs(float(hidden[0, -1] @ head["kernel"]) - want) <= 1e-4
  assert hf_checkpoint.load(out, reward=True)[1] == cfg


@functools.partial(jax.jit, static_argnames="cfg")
def _hidden(params, ids, cfg):
  return transformer.forward(params, ids, cfg)[0]


def test_gemma3_with_one_rope_base_exports_its_global_rope_on_local_layers(tmp_path):
  """rope_local_theta 0: the local layers use the global RoPE, its linear scaling included; the
  export must say so (it used to write base 10,000 for them)."""
  model = tiny_hf_model("gemma3_text")
  model.save_pretrained(str(tmp_path / "src"))
  params, cfg = hf_checkpoint.load(str(tmp_path / "src"))
  cfg = cfg.replace(rope_local_theta=0.0)
  params = jax.tree.map(jnp.asarray, params)
  out = hf_checkpoint.save(params, cfg, str(tmp_path / "export"))
  again = transformers.AutoModelForCausalLM.from_pretrained(
      out, dtype=torch.float32, attn_implementation="eager").eval()
  assert np.abs(hf_logits(again) - our_logits(params, cfg)).max() <= 1e-4


def test_an_exported_reward_model_names_its_pad_in_the_tokenizer_files(tmp_path):
  """transformers' sequence classifier scores the token before the first `pad_token_id`: the
  copied tokenizer files must pad with that token, not with their own (often the eos)."""
  model = tiny_hf_model("llama")
  model.save_pretrained(str(tmp_path / "src"))
  params, cfg = hf_checkpoint.load(str(tmp_path / "src"))
  extra = []
  for name, meta in (("tokenizer_config.json", {"pad_token": "<|im_end|>", "eos_token":
                                                "<|im_end|>", "model_max_length": 128}),
                     ("special_tokens_map.json", {"pad_token": {"content": "<|im_end|>"}})):
    (tmp_path / name).write_text(json.dumps(meta))
    extra.append(str(tmp_path / name))
  head = {"kernel": jnp.zeros(cfg.d_model), "bias": jnp.asarray(0.0)}
  out = hf_checkpoint.save({"backbone": params, "head": head}, cfg, str(tmp_path / "rm"),
                           reward_pad_id=0, extra_files=extra, pad_token="<|endoftext|>")
  written = {n: json.loads((tmp_path / "rm" / n).read_text()) for n in
             ("tokenizer_config.json", "special_tokens_map.json", "config.json")}
  assert written["tokenizer_config.json"] == {"pad_token": "<|endoftext|>", "eos_token":
                                              "<|im_end|>", "model_max_length": 128}
  assert written["special_tokens_map.json"]["pad_token"] == "<|endoftext|>"
  assert written["config.json"]["pad_token_id"] == 0
  assert os.path.isdir(out)
