"""REINFORCE++ against hand-worked numbers: the reward-to-go with the KL in the reward, the
whitening over every real token of the batch (not per prompt), the baseline variant's group mean of
the scores on 2 prompts x 2 samples; its config errors; one real step of each estimator."""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from rlhfjax.algorithms import reinforce_pp
from rlhfjax.errors import ConfigError
from rlhfjax.models import heads
from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig
from rlhfjax.training.state import TrainState


def _c(**kw) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(dict(advantage_estimator="reinforce_pp", kl_coef=0.0,
                                             gamma=1.0), **kw))


def _mask(lengths: list[int], width: int = 3) -> jax.Array:
  return jnp.arange(width)[None] < jnp.array(lengths)[:, None]


def test_returns_are_the_reward_to_go_with_the_kl_in_the_reward():
  # One response of 3 real tokens and a pad (whose junk KL counts nowhere). β = 0.1, KL per token
  # (0.5, 1, −0.5), score 2 on the last real token: rewards (−0.05, −0.1, 0.05 + 2 = 2.05).
  # γ = 1: G = (1.9, 1.95, 2.05). γ = 0.5: G_2 = 2.05, G_1 = −0.1 + 1.025 = 0.925,
  # G_0 = −0.05 + 0.4625 = 0.4125.
  kl = jnp.array([[0.5, 1.0, -0.5, 9.0]])
  mask = _mask([3], 4)
  scores = jnp.array([2.0])
  returns, adv = reinforce_pp.advantages(scores, kl, mask, _c(kl_coef=0.1), 1)
  np.testing.assert_allclose(returns, [[1.9, 1.95, 2.05, 0.0]], rtol=1e-6)
  returns, _ = reinforce_pp.advantages(scores, kl, mask, _c(kl_coef=0.1, gamma=0.5), 1)
  np.testing.assert_allclose(returns, [[0.4125, 0.925, 2.05, 0.0]], rtol=1e-6)
  # Whitened over the 3 real tokens of the batch; the pad stays 0.
  np.testing.assert_allclose(adv.sum(), 0.0, atol=1e-5)
  assert float(adv[0, 3]) == 0.0


def test_advantages_are_whitened_over_every_token_of_the_batch():
  # 2 prompts x 2 samples, no KL, scores (1, 3, 5, 7), lengths (2, 1, 1, 2): each token's return is
  # its score. The batch's tokens 1, 1, 3, 5, 7, 7: mean 4, variance (9 + 9 + 1 + 1 + 9 + 9) / 6
  # = 19/3. Each prompt's own normalisation (GRPO's) would give ±1 in both groups instead.
  scores = jnp.array([1.0, 3.0, 5.0, 7.0])
  mask = _mask([2, 1, 1, 2])
  _, adv = reinforce_pp.advantages(scores, jnp.zeros((4, 3)), mask, _c(), 2)
  s = np.sqrt(19 / 3)
  np.testing.assert_allclose(adv, [[-3 / s, -3 / s, 0], [-1 / s, 0, 0], [1 / s, 0, 0],
                                   [3 / s, 3 / s, 0]], rtol=1e-5)


def test_baseline_subtracts_each_prompts_mean_score_then_whitens_globally():
  # 2 prompts x 2 samples of 2 tokens each, scores (1, 3) and (5, 9): group means 2 and 7, centred
  # scores (−1, 1) and (−2, 2). β = 0.5 and row 0 has KL (2, 0): the group mean is of the scores
  # alone (OpenRLHF), the KL enters per token after it. Row 0's rewards (−1, 0 − 1), its returns
  # (−2, −1); the others' returns are their centred scores on both tokens.
  scores = jnp.array([1.0, 3.0, 5.0, 9.0])
  kl = jnp.zeros((4, 3)).at[0, 0].set(2.0)
  mask = _mask([2, 2, 2, 2])
  returns, adv = reinforce_pp.advantages(
      scores, kl, mask, _c(advantage_estimator="reinforce_pp_baseline", kl_coef=0.5), 2)
  np.testing.assert_allclose(returns, [[-2, -1, 0], [1, 1, 0], [-2, -2, 0], [2, 2, 0]], rtol=1e-6)
  # Whitened over the 8 real tokens: mean −1/8, variance 22.875 / 8.
  tokens = np.array([-2, -1, 1, 1, -2, -2, 2, 2])
  assert tokens.mean() == -0.125 and tokens.var() == pytest.approx(22.875 / 8)
  want = np.zeros((4, 3))
  want[:, :2] = ((tokens + 0.125) / np.sqrt(22.875 / 8)).reshape(4, 2)
  np.testing.assert_allclose(adv, want, rtol=1e-5)
  # Without KL the baseline's advantages are the centred scores over their global std √2.5: the
  # second prompt keeps its larger spread (per-group normalisation would give ±1 to both).
  _, adv = reinforce_pp.advantages(
      scores, jnp.zeros((4, 3)), mask, _c(advantage_estimator="reinforce_pp_baseline"), 2)
  np.testing.assert_allclose(adv[:, 0], np.array([-1, 1, -2, 2]) / np.sqrt(2.5), rtol=1e-5)


def test_check_config_errors():
  online = dict(rollout_batch=8, minibatch_size=4, temperature=1.0, share_prompt=True)
  with pytest.raises(ConfigError, match="advantage_estimator must be one of"):
    reinforce_pp.check_config(_c(**online, k=2, advantage_estimator="grpo"))
  with pytest.raises(ConfigError, match=r"reinforce_pp.k must be >= 2 \(the baseline"):
    reinforce_pp.check_config(_c(**online, k=1, advantage_estimator="reinforce_pp_baseline"))
  with pytest.raises(ConfigError, match="reinforce_pp.gamma must be 1 with the baseline"):
    reinforce_pp.check_config(_c(**online, k=2, advantage_estimator="reinforce_pp_baseline",
                                 gamma=0.9))
  reinforce_pp.check_config(_c(**online, k=1))  # One sample per prompt: REINFORCE++ proper.


EOS = 2
CFG = ModelConfig(variant="gpt2", vocab_size=48, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2,
                  d_ff=64, max_len=32)


@pytest.mark.parametrize("estimator,k", [("reinforce_pp", 1), ("reinforce_pp_baseline", 2)])
def test_one_step_trains_the_policy_against_whitened_advantages(estimator, k):
  keys = jax.random.split(jax.random.key(0), 3)
  ref = transformer.init(keys[0], CFG)
  rm = {"backbone": transformer.init(keys[1], CFG), "head": heads.init_scalar_head(keys[2], 32)}
  rng = np.random.default_rng(0)
  lengths = np.array([5, 3, 2, 4, 5, 2, 3, 4])
  response = rng.integers(3, CFG.vocab_size, (8, 5))
  response[np.arange(8), lengths - 1] = EOS
  mask = np.arange(5)[None] < lengths[:, None]
  batch = {"prompt": jnp.asarray(np.repeat(rng.integers(3, CFG.vocab_size, (4, 6)), 2, 0)),
           "prompt_mask": jnp.ones((8, 6), bool),
           "response": jnp.asarray(np.where(mask, response, 0)), "response_mask": jnp.asarray(mask)}
  c = ml_collections.ConfigDict(dict(
      temperature=1.0, penalize_no_eos=True, no_eos_score=-1.0, share_prompt=True, k=k,
      advantage_estimator=estimator, kl_coef=0.01, gamma=1.0, cliprange=0.2, epochs=2,
      minibatch_size=4, truncated_is=False, tis_cap=2.0, old_policy="recompute"))
  tx = optax.adam(1e-3)
  state = TrainState.create({"policy": jax.tree.map(jnp.copy, ref)}, tx)
  step = jax.jit(functools.partial(reinforce_pp.train_step, cfg=CFG, c=c, tx=tx, eos_id=EOS))
  new, m = step(state, ref, rm, batch, jax.random.key(1))
  assert all(np.isfinite(float(v)) for v in m.values()), m
  for name in ("loss/policy_avg", "policy/clipfrac_avg", "val/ratio", "returns/mean",
               "objective/kl", "objective/rlhf_reward"):
    assert name in m, name
  np.testing.assert_allclose(m["objective/kl"], 0.0, atol=1e-5)  # The policy starts as the ref.
  moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), new.params["policy"], ref)
  assert max(jax.tree.leaves(moved)) > 0
