"""The sampler/trainer log-prob gap and truncated importance sampling (TIS): the gap metrics, the
weights and the PPO, GRPO and RLOO losses they enter, against hand-worked numbers; the knob's
defaults and range; and each method's step, where with `truncated_is` off the sampler's log-probs
change nothing but the metrics (compared as programs, not run: no compile)."""

import functools
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from rlhfjax import config_check
from rlhfjax.algorithms import grpo
from rlhfjax.algorithms import online
from rlhfjax.algorithms import online_dpo
from rlhfjax.algorithms import ppo
from rlhfjax.algorithms import reinforce_pp
from rlhfjax.algorithms import rloo
from rlhfjax.errors import ConfigError
from rlhfjax.models import heads
from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig
from rlhfjax.parallel.sharding import Parallel
from rlhfjax.training import experiment
from rlhfjax.training.state import TrainState

GAP = ("sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max",
       "sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/mean",
       "sampling/importance_sampling_ratio/max")
TIS = ml_collections.ConfigDict(dict(truncated_is=True, tis_cap=2.0, old_policy="recompute"))

# One response of three real tokens and one pad. The trainer's old probabilities 0.8, 0.2, 0.3,
# the sampler's 0.2, 0.25, 0.6: ratios π_old / π_sampler = 4, 0.8, 0.5, so the TIS weights with
# cap 2 are 2, 0.8, 0.5. The pad holds junk (a sampler log-prob of −30, a ratio of e^30) that no
# statistic and no loss may read.
MASK = jnp.array([[True, True, True, False]])
OLD = jnp.log(jnp.array([[0.8, 0.2, 0.3, 1.0]]))
SAMPLER = jnp.concatenate([jnp.log(jnp.array([[0.2, 0.25, 0.6]])), jnp.array([[-30.0]])], 1)
BATCH = {"response_mask": MASK, "sampler_logprobs": SAMPLER}
WEIGHTS = [2.0, 0.8, 0.5]


def test_gap_metrics_by_hand_padding_ignored():
  m = online.sampler_gap(OLD, BATCH)
  assert sorted(m) == sorted(GAP)
  # |log ratio| = log 4, log 1.25, log 2: their sum is log 10.
  np.testing.assert_allclose(m[GAP[0]], math.log(10) / 3, rtol=1e-6)
  np.testing.assert_allclose(m[GAP[1]], math.log(4), rtol=1e-6)
  np.testing.assert_allclose(m[GAP[2]], 0.5, rtol=1e-6)
  np.testing.assert_allclose(m[GAP[3]], (4 + 0.8 + 0.5) / 3, rtol=1e-6)
  np.testing.assert_allclose(m[GAP[4]], 4.0, rtol=1e-6)
  assert online.sampler_gap(OLD, {"response_mask": MASK}) == {}  # No sampler log-probs.


def test_tis_weights_are_the_capped_ratio_without_gradient():
  w = online.tis_weights(OLD, BATCH, TIS, "grpo")
  np.testing.assert_allclose(w[:, :3], [WEIGHTS], rtol=1e-6)
  grad = jax.grad(lambda old: online.tis_weights(old, BATCH, TIS, "grpo").sum())(OLD)
  np.testing.assert_array_equal(grad, 0.0)
  with pytest.raises(AttributeError, match="truncated_is"):  # No default in the code: the config's.
    online.tis_weights(OLD, BATCH, ml_collections.ConfigDict({}), "grpo")
  assert online.tis_weights(OLD, BATCH, ml_collections.ConfigDict(
      dict(truncated_is=False, tis_cap=2.0, old_policy="recompute")), "grpo") is None
  with pytest.raises(ConfigError, match=r"rloo.truncated_is .*'sampler_logprobs'"):
    online.tis_weights(OLD, {"response_mask": MASK}, TIS, "rloo")


def test_ppo_policy_loss_by_hand():
  # Current/old ratios ρ = 1, 1.5, 1.1 and advantages 1, −2, 0.5 (cliprange 0.2):
  #   max(−Aρ, −A clip(ρ)) = −1, max(3, 2.4) = 3, −0.55;  token mean (−1 + 3 − 0.55) / 3.
  # With TIS × (2, 0.8, 0.5): −2, 2.4, −0.275;  token mean 0.125 / 3. The pad (ratio 9,
  # advantage 9) counts in neither. The value loss is not weighted.
  logp = OLD + jnp.log(jnp.array([[1.0, 1.5, 1.1, 9.0]]))
  batch = {"response_mask": MASK, "old_logprobs": OLD, "advantages": jnp.array([[1.0, -2.0, 0.5, 9.0]]),
           "values": jnp.zeros((1, 4)), "returns": jnp.array([[1.0, 2.0, 3.0, 4.0]])}
  values = jnp.array([[0.5, 0.5, 0.5, 0.5]])
  pg, vf, _ = ppo.ppo_losses(logp, values, batch, 0.2, 0.2)
  np.testing.assert_allclose(pg, 1.45 / 3, rtol=1e-6)
  weights = online.tis_weights(OLD, BATCH, TIS, "ppo")
  pg_tis, vf_tis, _ = ppo.ppo_losses(logp, values, {**batch, "tis_weights": weights}, 0.2, 0.2)
  np.testing.assert_allclose(pg_tis, 0.125 / 3, rtol=1e-5)
  assert float(vf_tis) == float(vf)


def test_grpo_token_loss_by_hand():
  # On-policy (ρ = 1), A = 2: −surrogate = −2 on every token. TIS × (2, 0.8, 0.5): −4, −1.6, −1.
  # β KL (β 0.1; k3 with π_ref 0.4 against π 0.8 on the first token: log 2 − 0.5) is added
  # after, unweighted. 'grpo' aggregation: the sequence's token mean.
  c = ml_collections.ConfigDict(dict(cliprange=0.2, cliprange_high=0.2, beta=0.1,
                                     kl_estimator="k3", kl_in="loss",
                                     importance_sampling_level="token"))
  ref = OLD.at[0, 0].set(math.log(0.4))
  adv = jnp.array([2.0])
  kl = 0.1 * (math.log(2) - 0.5)
  loss, _, _ = grpo.token_losses(OLD, OLD, ref, adv, c)
  np.testing.assert_allclose(loss[:, :3], [[-2 + kl, -2, -2]], rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(grpo.aggregate(loss, MASK, "grpo"), (-6 + kl) / 3, rtol=1e-6)
  weights = online.tis_weights(OLD, BATCH, TIS, "grpo")
  loss, _, _ = grpo.token_losses(OLD, OLD, ref, adv, c, weights)
  np.testing.assert_allclose(loss[:, :3], [[-4 + kl, -1.6, -1.0]], rtol=1e-6)
  np.testing.assert_allclose(grpo.aggregate(loss, MASK, "grpo"), (-6.6 + kl) / 3, rtol=1e-6)


def test_rloo_weights_each_token_term_of_the_gradient():
  # ρ = 1, A = 2, one sequence: loss −Aρ = −2 with or without TIS (the ratio keeps its value);
  # ∂loss/∂log π_t = −A ρ w_t: −2 per real token, and −4, −1.6, −1 with TIS; the pad gets 0.
  def loss(logp, weights):
    return rloo.sequence_clipped_loss(logp, OLD, jnp.array([2.0]), MASK.astype(jnp.float32), 0.2,
                                      weights)[0]

  weights = online.tis_weights(OLD, BATCH, TIS, "rloo")
  for w, want in ((None, [-2.0, -2.0, -2.0, 0.0]), (weights, [-4.0, -1.6, -1.0, 0.0])):
    np.testing.assert_allclose(loss(OLD, w), -2.0, rtol=1e-6)
    np.testing.assert_allclose(jax.grad(loss)(OLD, w), [want], rtol=1e-6)


def test_the_knob_is_off_by_default_and_its_cap_at_least_one(tiny_config):
  for task in ("ppo", "rloo", "grpo", "reinforce_pp"):
    assert (tiny_config[task].truncated_is, tiny_config[task].tis_cap) == (False, 2.0), task
  config_check.check(tiny_config)
  tiny_config.grpo.tis_cap = 1.0  # min(r, 1): only down-weights, a valid choice.
  config_check.check(tiny_config)
  tiny_config.grpo.tis_cap = 0.5
  with pytest.raises(ConfigError, match=r"grpo.tis_cap must be >= 1, got 0.5"):
    config_check.check(tiny_config)
  tiny_config.online_dpo.truncated_is = True  # Its loss has no policy-gradient term to weight.
  with pytest.raises(ConfigError, match="online_dpo.truncated_is"):
    online_dpo.check_config(tiny_config.online_dpo)


CFG = ModelConfig(vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32,
                  max_len=12)
EOS = 1
ONLINE = dict(temperature=1.0, penalize_no_eos=True, no_eos_score=-1.0, share_prompt=False, k=2,
              cliprange=0.2, epochs=1, minibatch_size=4)
METHODS = {
    "ppo": (ppo, dict(temperature=1.0, kl_coef=0.05, adaptive_kl=False, gamma=1.0, lam=0.95,
                      whiten="batch", cliprange=0.2, cliprange_value=0.2, vf_coef=0.1,
                      penalize_no_eos=True, no_eos_score=-1.0, epochs=1, minibatch_size=4)),
    "rloo": (rloo, dict(ONLINE, kl_coef=0.05, normalize_advantages=False)),
    "grpo": (grpo, dict(ONLINE, beta=0.04, kl_estimator="k3", kl_in="loss",
                        scale_rewards="group", loss_type="grpo", cliprange_high=0.2,
                        overlong_buffer=0, dynamic_sampling=False,
                        importance_sampling_level="token")),
    "reinforce_pp": (reinforce_pp, dict(ONLINE, advantage_estimator="reinforce_pp_baseline",
                                        kl_coef=0.01, gamma=1.0)),
}


@pytest.fixture(scope="module")
def tiny():
  """Shapes of a tiny policy (= reference), reward model and batch of 2 prompts x 2 responses,
  without and with sampler log-probs: the programs below are compared, never run."""
  ref = jax.eval_shape(lambda: transformer.init(jax.random.key(0), CFG))
  rm = {"backbone": ref, "head": jax.eval_shape(lambda: heads.init_scalar_head(
      jax.random.key(0), 16))}
  b, r = 4, 4
  batch = {"prompt": jax.ShapeDtypeStruct((b, 3), jnp.int32),
           "prompt_mask": jax.ShapeDtypeStruct((b, 3), jnp.bool_),
           "response": jax.ShapeDtypeStruct((b, r), jnp.int32),
           "response_mask": jax.ShapeDtypeStruct((b, r), jnp.bool_)}
  sampled = {**batch, "sampler_logprobs": jax.ShapeDtypeStruct((b, r), jnp.float32)}
  return ref, rm, batch, sampled


@pytest.mark.parametrize("name", list(METHODS))
def test_with_tis_off_the_sampler_logprobs_change_no_update(tiny, name):
  """With `truncated_is` off, the state update and every earlier metric of a batch that carries
  sampler log-probs are the very program of a batch without them (jit drops an input nothing
  reads): the same bits, no weight applied, not even 1. They add only the gap metrics. With the
  knob on the program differs, and a batch without them stops with the config key."""
  ref, rm, batch, sampled = tiny
  module, extra = METHODS[name]
  tx = optax.adam(1e-2)
  params = {"policy": ref, "value": rm} if name == "ppo" else {"policy": ref}
  state = jax.eval_shape(lambda: TrainState.create(params, tx))
  if name == "ppo":
    state = ppo.PPOState(step=state.step, params=params, opt_state=state.opt_state,
                         kl_coef=jax.ShapeDtypeStruct((), jnp.float32))
  key = jax.eval_shape(lambda: jax.random.key(1))

  def step(truncated_is, gap=False):
    c = ml_collections.ConfigDict(dict(extra, truncated_is=truncated_is, tis_cap=2.0,
                                       old_policy="recompute"))
    fn = functools.partial(module.train_step, cfg=CFG, c=c, tx=tx, eos_id=EOS)

    def update(state, ref, rm, b, key):
      new, m = fn(state, ref, rm, b, key)
      return new, {k: v for k, v in m.items() if gap or not k.startswith("sampling/")}
    return update

  def program(truncated_is, b):
    return jax.jit(step(truncated_is)).lower(state, ref, rm, b, key).as_text()

  assert program(False, batch) == program(False, sampled)
  assert program(False, sampled) != program(True, sampled)
  plain = jax.eval_shape(step(False, True), state, ref, rm, batch, key)[1]
  off = jax.eval_shape(step(False, True), state, ref, rm, sampled, key)[1]
  assert set(off) - set(plain) == set(GAP) and set(plain) <= set(off)
  with pytest.raises(ConfigError, match=f"{name}.truncated_is"):
    jax.eval_shape(step(True), state, ref, rm, batch, key)


def test_the_grpo_blocks_name_their_own_tis_key(tiny_config, monkeypatch):
  """task=dapo, gspo and dr_grpo run the GRPO step under their own blocks: a batch without the
  sampler's log-probs stops with the key of the block the run reads (dapo.truncated_is, ...), not
  grpo's. The program grpo.run hands to the loop (its builder's), traced, not run."""
  programs = {}
  monkeypatch.setattr(online, "run_policy", lambda config, workdir, task, program_of, *a, **kw:
                      programs.setdefault(task, program_of))
  cfg = ModelConfig.from_mapping(tiny_config.model.to_dict())
  for task in ("grpo", "dapo", "gspo", "dr_grpo"):
    tiny_config[task].truncated_is = True
    grpo.run(tiny_config, "unused", task)
    exp = experiment.Experiment(tiny_config, "", {}, None, cfg,
                                Parallel.from_config(tiny_config.mesh))
    prog = programs[task](exp)
    state, ref, rm, batch, key = prog.args
    batch = {k: v for k, v in batch.items() if k != "sampler_logprobs"}
    with pytest.raises(ConfigError, match=rf"^{task}\.truncated_is needs the sampler's log-probs"):
      prog.step.lower(state, ref, rm, batch, key)
