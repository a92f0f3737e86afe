"""LoRA: a hand-worked adapted projection; zero adapters equal the full model (forward, KV-cache
sampling); a merged model equals the adapted one; training steps move only the adapters and keep
AdamW moments only for them; PPO's reference is the policy's base (one backbone, KL 0 at the start);
`task=memory` shows what a LoRA PPO run holds; config errors name the key."""

import functools
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from rlhfjax.algorithms import ppo
from rlhfjax.algorithms import sft
from rlhfjax.errors import ConfigError
from rlhfjax.models.config import ModelConfig
from rlhfjax.models import heads
from rlhfjax.models import lora
from rlhfjax.models import sampling
from rlhfjax.models import transformer
from rlhfjax.training import optimizer
from rlhfjax.training.state import TrainState

GPT2 = ModelConfig(variant="gpt2", vocab_size=32, d_model=16, n_layers=2, n_heads=2, n_kv_heads=2,
                   d_ff=32, max_len=24)
LLAMA = ModelConfig(variant="llama", vocab_size=32, d_model=16, n_layers=2, n_heads=4,
                    n_kv_heads=2, d_ff=32, max_len=24, scan_layers=False)
RANK = lora.LoraConfig(rank=4, alpha=8.0)
BLOCK = dict(rank=0, alpha=16.0, targets="q,k,v,o,wi,wg,wo", models="sft,rm,policy,value")
OPT = dict(lr=1e-2, warmup_steps=0, schedule="constant", end_lr_frac=0.0, b1=0.9, b2=0.95, eps=1e-8,
           weight_decay=0.1, grad_clip=1.0, skip_nonfinite=0)


@functools.lru_cache(maxsize=None)
def _forward(cfg):
  return jax.jit(lambda p, t: transformer.forward(p, t, cfg)[0])


def _tokens(b=2, t=7, seed=0):
  return jax.random.randint(jax.random.key(seed), (b, t), 3, 32)


def _random_adapters(params, seed=1):
  """Adapters with every A and B non-zero (a fresh B is zero)."""
  keys = iter(jax.random.split(jax.random.key(seed), 64))
  noisy = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(next(keys), x.shape) if x.ndim else x,
                       params[lora.KEY])
  return {**params, lora.KEY: noisy}


def test_adapted_projection_by_hand():
  # One layer's q projection: W [D=2, H=1, Dh=2], A [2, r=1], B [1, 1, 2], s = alpha / r = 3.
  x = jnp.array([[[1.0, 2.0]]])  # [B, T, D]
  a = jnp.array([[0.5], [-1.0]])
  b = jnp.array([[[2.0, 1.0]]])
  got = lora.delta(x, {"q_a": a, "q_b": b}, "q", jnp.asarray(3.0))
  # x A = 1 * 0.5 + 2 * -1 = -1.5; s * (x A) B = 3 * -1.5 * [2, 1] = [-9, -4.5].
  np.testing.assert_allclose(got, [[[[-9.0, -4.5]]]])
  assert lora.delta(x, {"q_a": a, "q_b": b}, "k", jnp.asarray(3.0)) == 0  # Not a target here.


@pytest.mark.parametrize("cfg", [GPT2, LLAMA], ids=["gpt2", "llama_unrolled"])
def test_zero_adapters_equal_the_full_model(cfg):
  params = transformer.init(jax.random.key(0), cfg)
  adapted = lora.init(jax.random.key(1), params, RANK)
  assert all(float(jnp.abs(b).max()) == 0 for name, b in
             jax.tree_util.tree_flatten_with_path(adapted[lora.KEY])[0]
             if str(name[-1]).endswith("_b']"))
  tokens = _tokens()
  np.testing.assert_array_equal(_forward(cfg)(adapted, tokens), _forward(cfg)(params, tokens))
  # Adapters off is the base itself (the same arrays, no copy).
  assert all(a is b for a, b in zip(jax.tree.leaves(lora.strip(adapted)), jax.tree.leaves(params)))


def test_zero_adapters_sample_what_the_full_model_samples():
  cfg = GPT2
  params = transformer.init(jax.random.key(0), cfg)
  adapted = lora.init(jax.random.key(1), params, RANK)
  tokens = _tokens()
  scfg = sampling.SamplingConfig(max_new_tokens=5, eos_id=2, pad_id=0)
  mask = jnp.ones(tokens.shape, bool)
  full = sampling.sample(params, tokens, mask, jax.random.key(2), cfg, scfg)
  with_adapters = sampling.sample(adapted, tokens, mask, jax.random.key(2), cfg, scfg)
  np.testing.assert_array_equal(full.tokens, with_adapters.tokens)


@pytest.mark.parametrize("cfg", [GPT2, LLAMA], ids=["gpt2", "llama_unrolled"])
def test_merged_model_equals_the_adapted_one(cfg):
  adapted = _random_adapters(lora.init(jax.random.key(1), transformer.init(jax.random.key(0), cfg),
                                       RANK))
  tokens = _tokens()
  base_out = _forward(cfg)(lora.strip(adapted), tokens)
  out = _forward(cfg)(adapted, tokens)
  assert float(jnp.abs(out - base_out).max()) > 1e-2  # The adapters matter...
  merged = lora.merge(adapted)
  assert lora.KEY not in merged and not lora.has_adapters(merged)
  np.testing.assert_allclose(_forward(cfg)(merged, tokens), out, atol=2e-5)


def test_targets_and_axes():
  cfg = GPT2  # No wg on gpt2: skipped.
  only_qv = lora.LoraConfig(rank=2, targets=("q", "v", "wg"))
  params = lora.init(jax.random.key(0), transformer.init(jax.random.key(0), cfg), only_qv)
  assert set(params[lora.KEY]) == {"scale", "attn"}
  assert set(params[lora.KEY]["attn"]) == {"q_a", "q_b", "v_a", "v_b"}
  assert params[lora.KEY]["attn"]["q_a"].shape == (2, 16, 2)
  assert params[lora.KEY]["attn"]["q_b"].shape == (2, 2, 2, 8)
  axes = lora.axes(transformer.param_axes(cfg), only_qv)
  assert axes[lora.KEY]["attn"]["q_b"] == ("layers", None, "heads", "head_dim")
  full = lora.init(jax.random.key(0), transformer.init(jax.random.key(0), LLAMA), RANK)
  full_axes = lora.axes(transformer.param_axes(LLAMA), RANK)
  assert full_axes[lora.KEY]["attn"]["o_a"] == ("layers", "heads", "head_dim", None)
  # Every leaf has an axis name per dimension.
  jax.tree.map(lambda ax, x: None if len(ax) == x.ndim else pytest.fail(f"{ax} vs {x.shape}"),
               full_axes, full, is_leaf=lambda x: isinstance(x, tuple))


def _sft_batch(seed=0):
  rng = np.random.default_rng(seed)
  return {"prompt": jnp.asarray(rng.integers(3, 32, (4, 5)), jnp.int32),
          "prompt_mask": jnp.ones((4, 5), bool),
          "response": jnp.asarray(rng.integers(3, 32, (4, 6)), jnp.int32),
          "response_mask": jnp.ones((4, 6), bool)}


def test_training_moves_only_the_adapters():
  params = lora.init(jax.random.key(1), transformer.init(jax.random.key(0), GPT2), RANK)
  tx = optimizer.adamw(ml_collections.ConfigDict(OPT), 10, lora.trainable)
  state = TrainState.create(params, tx)
  # AdamW moments only for the adapters (the frozen base holds no optimizer state).
  adapter_bytes = sum(x.nbytes for x in jax.tree.leaves(params[lora.KEY])) - 4  # Less the scale.
  moments = sum(x.nbytes for x in jax.tree.leaves(state.opt_state) if x.ndim)
  assert moments == 2 * adapter_bytes
  step = jax.jit(functools.partial(sft.train_step, cfg=GPT2, tx=tx))
  new = state
  for i in range(2):  # A's gradient is zero while B is: the second step moves A too.
    new, m = step(new, _sft_batch(i), jax.random.key(0))
  assert float(m["train/grad_norm"]) > 0
  moved = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), new.params, state.params)
  trainable = lora.trainable(state.params)
  assert jax.tree.leaves(moved) == jax.tree.leaves(trainable)  # Exactly the adapters moved.
  assert float(new.params[lora.KEY]["scale"]) == RANK.scale


def test_gradients_skip_the_frozen_base():
  params = lora.init(jax.random.key(1), transformer.init(jax.random.key(0), GPT2), RANK)
  grads = jax.jit(lora.value_and_grad(lambda p: sft.response_nll(p, _sft_batch(), GPT2)[0]))(
      _random_adapters(params))[1]
  assert float(optax.tree.norm(lora.strip(grads))) == 0.0
  assert float(optax.tree.norm(grads[lora.KEY])) > 0.0
  trained, total = lora.count(params)
  assert trained == sum(x.size for x in jax.tree.leaves(params[lora.KEY])) - 1
  assert total == trained + sum(x.size for x in jax.tree.leaves(lora.strip(params))) + 1


def test_ppo_with_lora_keeps_one_backbone():
  """The reference is the policy with adapters off: the step takes no reference tree, the KL
  starts at 0, and the update moves only adapters and heads."""
  cfg = GPT2
  k = jax.random.split(jax.random.key(0), 3)
  policy = transformer.init(k[0], cfg)
  reward = {"backbone": transformer.init(k[1], cfg), "head": heads.init_scalar_head(k[2], 16)}
  c = ml_collections.FrozenConfigDict(dict(
      steps=2, rollout_batch=8, minibatch_size=4, epochs=1, temperature=1.0, kl_coef=0.05,
      adaptive_kl=False, kl_target=6.0, kl_horizon=10000.0, gamma=1.0, lam=0.95, whiten="batch",
      cliprange=0.2, cliprange_value=0.2, vf_coef=0.1, penalize_no_eos=True, no_eos_score=-1.0,
      value_model="separate", truncated_is=False, tis_cap=2.0, old_policy="recompute", **OPT))
  exp = types.SimpleNamespace(config=types.SimpleNamespace(ppo=c, seed=0))
  state = ppo.init_state(exp, policy, reward, lcfg=RANK)
  assert lora.has_adapters(state.params["policy"])
  assert lora.has_adapters(state.params["value"]["backbone"])
  tokens = _tokens(8, 5)
  scfg = sampling.SamplingConfig(max_new_tokens=6, eos_id=2, pad_id=0)
  out = sampling.sample(state.params["policy"], tokens, jnp.ones(tokens.shape, bool),
                        jax.random.key(3), cfg, scfg)
  batch = {"prompt": tokens, "prompt_mask": jnp.ones(tokens.shape, bool), "response": out.tokens,
           "response_mask": jnp.arange(6)[None] < out.lengths[:, None]}
  tx = ppo.adamw(c, lora.trainable)
  step = jax.jit(functools.partial(ppo.train_step, cfg=cfg, c=c, tx=tx, eos_id=2))
  new, m = step(state, None, reward, batch, jax.random.key(0))
  assert float(m["objective/kl"]) == pytest.approx(0.0, abs=1e-6)
  moved = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), new.params, state.params)
  assert not any(jax.tree.leaves(lora.strip(moved["policy"])))  # The reference never moves.
  assert any(jax.tree.leaves(moved["policy"][lora.KEY]))
  assert moved["value"]["head"]["kernel"]
  # Adapters on neither PPO model: the plain optimizer state, as `ppo.train` builds its optimizer.
  plain = ppo.init_state(exp, policy, reward, lcfg=lora.LoraConfig(rank=4, models=("sft", "rm")))
  assert not lora.has_adapters(plain.params)
  assert (jax.tree.structure(plain.opt_state)
          == jax.tree.structure(ppo.adamw(c).init(plain.params)))


def test_memory_task_shows_a_lora_ppo_run_holds_one_backbone(tiny_config):
  from rlhfjax.stages import memory
  from rlhfjax.parallel.sharding import Parallel
  cfg = ModelConfig.from_mapping(tiny_config.model.to_dict())
  par = Parallel.from_config(tiny_config.mesh)
  full = memory.ppo_held(tiny_config, par, cfg, 0)
  adapted = memory.ppo_held(tiny_config, par, cfg, 4)
  policy_bytes = memory.per_device_bytes(
      jax.eval_shape(lambda: transformer.init(jax.random.key(0), cfg)))
  assert full["reference"] == policy_bytes and adapted["reference"] == 0
  assert adapted["optimizer"] < full["optimizer"] / 4
  assert adapted["held"] < full["held"] - policy_bytes
  # XLA's arguments of the PPO step agree: no second backbone, no full-size moments.
  assert adapted["xla_ppo_step"]["arguments"] < full["xla_ppo_step"]["arguments"] - policy_bytes


@pytest.mark.parametrize("block,message", [
    ({"rank": -1}, "lora.rank"),
    ({"rank": 4, "alpha": 0.0}, "lora.alpha"),
    ({"rank": 4, "targets": "q,x"}, "lora.targets"),
    ({"rank": 4, "models": "sft,critic"}, "lora.models"),
    ({"rank": 4, "dropout": 0.1}, "lora.dropout"),
])
def test_config_errors_name_the_key(block, message):
  with pytest.raises(ConfigError, match=message):
    lora.from_config({**BLOCK, **block})


def test_config_parses_comma_lists():
  lcfg = lora.from_config({"rank": 8, "alpha": 16.0, "targets": "q, v", "models": "policy"})
  assert lcfg.targets == ("q", "v") and lcfg.scale == 2.0
  assert lcfg.applies_to("policy") and not lcfg.applies_to("sft")
  assert not lora.from_config({**BLOCK, "rank": 0}).applies_to("policy")
