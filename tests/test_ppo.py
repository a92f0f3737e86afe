"""PPO: GAE and returns by hand, the adaptive KL controller, both clipped losses, masked whitening,
padding after eos counting nowhere, the missing-eos penalty, a short run that raises the reward
while the KL stays bounded, and the value head on the policy trunk (`ppo.value_model`)."""

import functools
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from rlhfjax.algorithms import online
from rlhfjax.algorithms import ppo
from rlhfjax.errors import ConfigError
from rlhfjax.models import heads
from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig

CFG = ModelConfig(vocab_size=16, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=64, max_len=16)
EOS, PAD = 1, 0


def _ppo_config(**kw):
  c = dict(steps=20, rollout_batch=32, minibatch_size=8, epochs=2, temperature=1.0, kl_coef=0.05,
           adaptive_kl=False, kl_target=6.0, kl_horizon=10000.0, gamma=1.0, lam=0.95,
           whiten="batch", cliprange=0.2, cliprange_value=0.2, vf_coef=0.1, penalize_no_eos=True,
           no_eos_score=-1.0, lr=3e-3, warmup_steps=0, schedule="linear", end_lr_frac=0.0, b1=0.9,
           b2=0.95, eps=1e-5, weight_decay=0.0, grad_clip=1.0, skip_nonfinite=0,
           value_model="separate", truncated_is=False, tis_cap=2.0, old_policy="recompute")
  c.update(kw)
  return ml_collections.FrozenConfigDict(c)


def test_gae_and_returns_hand_worked():
  rewards = jnp.array([[0.0, 0.0, 1.0, 0.0]])
  values = jnp.array([[0.5, 0.2, 0.3, 9.0]])  # The 9 sits on padding: it must be ignored.
  mask = jnp.array([[True, True, True, False]])
  adv, ret = ppo.gae(rewards, values, mask, gamma=1.0, lam=0.95)
  # δ = (0 + .2 - .5, 0 + .3 - .2, 1 + 0 - .3) = (-.3, .1, .7); A_2 = .7, A_1 = .1 + .95 * .7,
  # A_0 = -.3 + .95 * A_1; returns = A + V.
  a1 = 0.1 + 0.95 * 0.7
  a0 = -0.3 + 0.95 * a1
  np.testing.assert_allclose(adv[0], [a0, a1, 0.7, 0.0], rtol=1e-6)
  np.testing.assert_allclose(ret[0], [a0 + 0.5, a1 + 0.2, 1.0, 0.0], rtol=1e-6)
  # With λ = 1 and γ = 1 the return is the sum of the rewards still to come.
  _, ret1 = ppo.gae(rewards, values, mask, gamma=1.0, lam=1.0)
  np.testing.assert_allclose(ret1[0], [1.0, 1.0, 1.0, 0.0], rtol=1e-6)


def test_token_rewards_put_the_score_on_the_last_real_token():
  kl = jnp.array([[0.1, 0.2, 0.3, 5.0], [0.4, 5.0, 5.0, 5.0]])
  mask = jnp.array([[True, True, True, False], [True, False, False, False]])
  r = ppo.token_rewards(jnp.array([2.0, -1.0]), kl, mask, jnp.asarray(0.5))
  np.testing.assert_allclose(r, [[-0.05, -0.1, 2.0 - 0.15, 0.0], [-1.0 - 0.2, 0, 0, 0]], rtol=1e-6)


def test_adaptive_kl_controller():
  # KL 9 against target 6: the error 0.5 is clipped to 0.2; β grows by 0.2 * 64 / 10000.
  up = ppo.adaptive_kl_coef(jnp.asarray(0.1), jnp.asarray(9.0), 6.0, 10000.0, 64)
  assert float(up) == pytest.approx(0.1 * (1 + 0.2 * 64 / 10000), rel=1e-6)
  # KL 4.5: error -0.25 -> clipped to -0.2; KL 6.6: error 0.1, not clipped.
  down = ppo.adaptive_kl_coef(jnp.asarray(0.1), jnp.asarray(4.5), 6.0, 1000.0, 100)
  assert float(down) == pytest.approx(0.1 * (1 - 0.2 * 0.1), rel=1e-6)
  mid = ppo.adaptive_kl_coef(jnp.asarray(0.1), jnp.asarray(6.6), 6.0, 1000.0, 100)
  assert float(mid) == pytest.approx(0.1 * (1 + 0.1 * 0.1), rel=1e-5)


def _loss_batch(**kw):
  b = {"old_logprobs": jnp.zeros((1, 2)), "values": jnp.zeros((1, 2)), "returns": jnp.ones((1, 2)),
       "advantages": jnp.ones((1, 2)), "response_mask": jnp.array([[True, False]])}
  b.update(kw)
  return b


def test_policy_loss_is_clipped():
  b = _loss_batch()
  # Ratio e^0.4 ≈ 1.49 with a positive advantage: the clipped term (1.2) wins, and has no gradient.
  loss_fn = lambda lp: ppo.ppo_losses(lp, jnp.zeros((1, 2)), b, 0.2, 0.2)[0]
  lp = jnp.array([[0.4, 3.0]])
  assert float(loss_fn(lp)) == pytest.approx(-1.2, rel=1e-6)
  np.testing.assert_allclose(jax.grad(loss_fn)(lp), 0.0)
  assert float(ppo.ppo_losses(lp, jnp.zeros((1, 2)), b, 0.2, 0.2)[2]["policy/clipfrac_avg"]) == 1.0
  # Ratio e^-0.4 with a positive advantage: unclipped (pessimistic) term, gradient flows.
  lp = jnp.array([[-0.4, 0.0]])
  assert float(loss_fn(lp)) == pytest.approx(-np.exp(-0.4), rel=1e-6)
  assert abs(float(jax.grad(loss_fn)(lp)[0, 0])) > 0.1


def test_value_loss_is_clipped():
  b = _loss_batch()
  # Old value 0, new value 1, return 1: the clipped prediction 0.2 gives the larger error 0.64.
  vf = ppo.ppo_losses(jnp.zeros((1, 2)), jnp.array([[1.0, 7.0]]), b, 0.2, 0.2)[1]
  assert float(vf) == pytest.approx(0.5 * 0.64, rel=1e-6)
  # New value 0.1 is inside the clip range: plain squared error 0.81.
  vf = ppo.ppo_losses(jnp.zeros((1, 2)), jnp.array([[0.1, 7.0]]), b, 0.2, 0.2)[1]
  assert float(vf) == pytest.approx(0.5 * 0.81, rel=1e-6)


def test_whitening_ignores_padding():
  x = jnp.array([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, -50.0, -50.0]])
  mask = jnp.array([[True, True, True, False], [True, True, False, False]])
  w = ppo.whiten(x, mask)
  real = np.asarray(w)[np.asarray(mask)]
  np.testing.assert_allclose(real, (np.arange(1, 6) - 3) / np.std(np.arange(1, 6)), rtol=1e-4)
  assert np.all(np.asarray(w)[~np.asarray(mask)] == 0)
  kept = ppo.whiten(x, mask, shift_mean=False)
  assert float(online.masked_mean(kept, mask)) == pytest.approx(3.0, rel=1e-4)


def _models(seed=0):
  k = jax.random.split(jax.random.key(seed), 3)
  policy = transformer.init(k[0], CFG)
  reward = {"backbone": transformer.init(k[1], CFG), "head": heads.init_scalar_head(k[2], 32)}
  return policy, reward


def _rollout_inputs(n=32, plen=4, rlen=6, seed=1):
  rng = np.random.default_rng(seed)
  prompt = rng.integers(2, 16, (n, plen)).astype(np.int32)
  return {"prompt": jnp.asarray(prompt), "prompt_mask": jnp.ones((n, plen), bool)}, rlen


def _sample(policy, prompts, rlen, key):
  from rlhfjax.models import sampling
  out = sampling.sample(policy, prompts["prompt"], prompts["prompt_mask"], key, CFG,
                        sampling.SamplingConfig(max_new_tokens=rlen, eos_id=EOS, pad_id=PAD))
  mask = jnp.arange(rlen)[None] < out.lengths[:, None]
  return {**prompts, "response": out.tokens, "response_mask": mask}


def test_nothing_after_eos_counts():
  policy, reward = _models()
  prompts, rlen = _rollout_inputs(n=4)
  batch = _sample(policy, prompts, rlen, jax.random.key(3))
  c = _ppo_config()
  params = {"policy": policy, "value": reward}
  fn = jax.jit(functools.partial(ppo.experience, cfg=CFG, c=c, eos_id=EOS))
  clean, stats = fn(params, policy, reward, batch, jnp.asarray(0.05))
  # Garbage tokens after the eos (where the mask is False) change nothing.
  junk = jnp.where(batch["response_mask"], batch["response"], 9)
  dirty, stats2 = fn(params, policy, reward, {**batch, "response": junk}, jnp.asarray(0.05))
  for k in ("old_logprobs", "values", "advantages", "returns"):
    np.testing.assert_allclose(clean[k], dirty[k], atol=1e-5, err_msg=k)
  for k in ("objective/kl", "objective/scores", "objective/entropy"):
    assert float(stats[k]) == pytest.approx(float(stats2[k]), abs=1e-5), k
  m = np.asarray(batch["response_mask"])
  assert np.all(np.asarray(clean["advantages"])[~m] == 0)
  # At the start the policy is the reference: zero KL, so the rewards are the scores alone.
  assert float(stats["objective/kl"]) == pytest.approx(0.0, abs=1e-5)


def test_short_ppo_run_raises_the_reward_with_bounded_kl():
  policy, reward = _models()
  prompts, rlen = _rollout_inputs(n=32)
  c = _ppo_config(kl_coef=0.05, lr=3e-3, steps=25, no_eos_score=-5.0)
  tx = ppo.adamw(c)
  params = jax.tree.map(jnp.copy, {"policy": policy, "value": reward})
  state = ppo.PPOState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                       kl_coef=jnp.asarray(c.kl_coef))
  step = jax.jit(functools.partial(ppo.train_step, cfg=CFG, c=c, tx=tx, eos_id=EOS))
  scores, kls = [], []
  for i in range(c.steps):
    batch = _sample(state.params["policy"], prompts, rlen, jax.random.key(100 + i))
    state, m = step(state, policy, reward, batch, jax.random.key(i))
    scores.append(float(m["objective/scores"]))
    kls.append(float(m["objective/kl"]))
  assert np.mean(scores[-5:]) > np.mean(scores[:5]) + 1.0, scores
  assert max(kls) < 10.0, kls
  assert int(state.step) == c.steps  # PPO iterations, not minibatch updates.


def _init(c, policy, reward):
  return ppo.init_state(types.SimpleNamespace(config=types.SimpleNamespace(ppo=c)), policy, reward)


def _nbytes(tree):
  return sum(x.nbytes for x in jax.tree.leaves(tree))


def test_policy_trunk_values_are_the_head_on_the_policy_hidden_states():
  policy, reward = _models()
  reward["head"]["bias"] = jnp.asarray(0.3)  # A non-zero bias must show up in every real value.
  prompts, rlen = _rollout_inputs(n=4)
  batch = _sample(policy, prompts, rlen, jax.random.key(3))
  c = _ppo_config(value_model="policy_trunk")
  params = _init(c, policy, reward).params
  assert set(params) == {"policy", "value_head"}
  fn = functools.partial(ppo.experience, cfg=CFG, c=c, eos_id=EOS)
  rollout, _ = fn(params, policy, reward, batch, jnp.asarray(0.05))
  # By hand: the RM's head on the policy's hidden state at the column before each response token.
  tokens = jnp.concatenate([batch["prompt"], batch["response"]], 1)
  mask = jnp.concatenate([batch["prompt_mask"], batch["response_mask"]], 1)
  hidden = np.asarray(transformer.forward(policy, tokens, CFG, mask=mask)[0])
  kernel, bias = np.asarray(reward["head"]["kernel"]), float(reward["head"]["bias"])
  m, plen = np.asarray(batch["response_mask"]), batch["prompt"].shape[1]
  want = np.zeros(m.shape, np.float32)
  for b, j in zip(*np.nonzero(m)):
    want[b, j] = hidden[b, plen - 1 + j] @ kernel + bias
  np.testing.assert_allclose(rollout["values"], want, atol=1e-5)
  # The log-probs from that same forward are the separate layout's.
  separate, _ = fn({"policy": policy, "value": reward}, policy, reward, batch, jnp.asarray(0.05))
  np.testing.assert_allclose(rollout["old_logprobs"], separate["old_logprobs"], atol=1e-5)


def test_policy_trunk_train_step_trains_one_backbone():
  policy, reward = _models()
  prompts, rlen = _rollout_inputs(n=8)
  c = _ppo_config(value_model="policy_trunk", rollout_batch=8, minibatch_size=4, epochs=1)
  state = _init(c, policy, reward)
  separate = _init(_ppo_config(rollout_batch=8, minibatch_size=4, epochs=1), policy, reward)
  # One backbone: the policy's leaves plus the head's two, and no second set of AdamW moments.
  n_policy = len(jax.tree.leaves(policy))
  assert len(jax.tree.leaves(state.params)) == n_policy + 2
  assert len(jax.tree.leaves(separate.params)) == 2 * n_policy + 2
  assert _nbytes(state.params) == _nbytes(policy) + _nbytes(reward["head"])
  assert _nbytes(separate.opt_state) - _nbytes(state.opt_state) == 2 * _nbytes(reward["backbone"])
  # The values depend on the trunk: the value loss trains it too.
  batch = _sample(policy, prompts, rlen, jax.random.key(5))
  value_grad = jax.grad(lambda p: ppo._policy_and_values(p, batch, CFG, 1.0)[2].sum())(state.params)
  assert float(optax.tree.norm(value_grad["policy"])) > 0
  tx = ppo.adamw(c)
  step = jax.jit(functools.partial(ppo.train_step, cfg=CFG, c=c, tx=tx, eos_id=EOS))
  new, m = step(state, policy, reward, batch, jax.random.key(0))
  for k in ("loss/policy_avg", "loss/value_avg", "loss/total"):
    assert np.isfinite(float(m[k])), k
  for name in ("policy", "value_head"):
    moved = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), new.params[name], state.params[name])
    assert any(jax.tree.leaves(moved)), name


def test_check_config_refuses_an_unknown_value_model():
  ppo.check_config(_ppo_config(value_model="policy_trunk"))
  with pytest.raises(ConfigError, match="ppo.value_model.*separate.*policy_trunk"):
    ppo.check_config(_ppo_config(value_model="shared"))
