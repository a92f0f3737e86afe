"""DAPO's and GSPO's parts of the GRPO step against hand-worked numbers: the decoupled clip range,
the overlong penalty and the missing-eos rule, dynamic sampling's dropped groups, GSPO's sequence
ratio and GSPO-token's gradient; the defaults (GRPO's settings); one real step of each
variant under the tiny config's grpo block; the four GRPO blocks, each complete and independent."""

import functools
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from absl import flags
from ml_collections import config_flags

from conftest import ROOT
from conftest import load_config
from rlhfjax.algorithms import grpo
from rlhfjax.algorithms import online
from rlhfjax.data import pipeline
from rlhfjax.errors import ConfigError
from rlhfjax.models import heads
from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig
from rlhfjax.training.state import TrainState

NEW_KEYS = ("cliprange_high", "overlong_buffer", "overlong_penalty_factor", "dynamic_sampling",
            "importance_sampling_level", "max_num_gen_batches", "dynamic_sampling_metric")


def _c(**kw) -> ml_collections.ConfigDict:
  """A loss-only block: no KL (β 0), GRPO's symmetric clip and token ratio, no overlong shaping,
  unless `kw` says otherwise."""
  return ml_collections.ConfigDict(dict(dict(cliprange=0.2, cliprange_high=0.2, beta=0.0,
                                             kl_estimator="k3", kl_in="loss",
                                             importance_sampling_level="token",
                                             overlong_buffer=0, overlong_penalty_factor=1.0),
                                        **kw))


def test_dapo_clip_range_is_decoupled():
  # ε_low 0.2, ε_high 0.28: ρ is clipped to [0.8, 1.28]. Ratios 1.25, 1.3, 0.75, 0.85.
  # A = +1: min(ρ, clip ρ) = 1.25 (inside: not clipped; GRPO's 1.2 would clip it), 1.28 (clipped),
  #   0.75 (min(0.75, 0.8): the lower bound never binds for A > 0), 0.85.
  # A = −1: min(−ρ, −clip ρ) = −1.25, −1.3 (the upper bound never binds for A < 0), −0.8
  #   (below 1 − ε_low: clipped), −0.85. The loss is minus these.
  ratios = jnp.array([[1.25, 1.3, 0.75, 0.85]] * 2)
  logp = jnp.log(ratios)
  old = jnp.zeros_like(logp)
  adv = jnp.array([1.0, -1.0])
  loss, _, clipped = grpo.token_losses(logp, old, logp, adv, _c(cliprange_high=0.28))
  np.testing.assert_allclose(loss, [[-1.25, -1.28, -0.75, -0.85], [1.25, 1.3, 0.8, 0.85]],
                             rtol=1e-6)
  np.testing.assert_array_equal(clipped, [[False, True, False, False], [False, False, True, False]])
  # With cliprange_high = cliprange the clip is GRPO's symmetric 1 ± 0.2: 1.25 and 1.3 both clip
  # to 1.2.
  loss, _, clipped = grpo.token_losses(logp, old, logp, adv, _c())
  np.testing.assert_allclose(loss[0], [-1.2, -1.2, -0.75, -0.85], rtol=1e-6)
  np.testing.assert_array_equal(clipped[0], [True, True, False, False])


def test_overlong_penalty_by_hand():
  # L_max 10, L_cache 4: free up to 6 tokens, then −(|y| − 6) / 4: 7 → −0.25, 9 → −0.75,
  # 10 → −1; −1 beyond L_max.
  lengths = jnp.array([3.0, 6.0, 7.0, 9.0, 10.0, 12.0])
  np.testing.assert_allclose(grpo.overlong_penalty(lengths, 10, 4, 1.0),
                             [0.0, 0.0, -0.25, -0.75, -1.0, -1.0])
  np.testing.assert_allclose(grpo.overlong_penalty(lengths, 10, 4, 0.5),
                             [0.0, 0.0, -0.125, -0.375, -0.5, -0.5])


def test_overlong_shaping_leaves_the_missing_eos_rule_alone():
  # response_len 4, L_cache 2: free up to 2 tokens. Lengths count the eos: 2 → 0, 3 → −0.5, an eos
  # at the last position 4 → −1. The last row never ends (4 tokens, no eos): with
  # penalize_no_eos its score is already no_eos_score and it gets no penalty; without, −1.
  eos = 1
  response = jnp.array([[5, eos, 0, 0], [5, 6, eos, 0], [5, 6, 7, eos], [5, 6, 7, 8]])
  batch = {"response": response, "response_mask": response > 0}
  c = _c(overlong_buffer=2, overlong_penalty_factor=1.0, penalize_no_eos=True)
  np.testing.assert_allclose(grpo.length_shaping(batch, eos, c), [0.0, -0.5, -1.0, 0.0])
  c.penalize_no_eos = False
  np.testing.assert_allclose(grpo.length_shaping(batch, eos, c), [0.0, -0.5, -1.0, -1.0])
  assert grpo.length_shaping(batch, eos, _c(penalize_no_eos=True)) is None  # Off by default.


def test_dynamic_sampling_drops_groups_of_equal_rewards():
  # k 4: rewards (1, 1, 1, 1) and (5, 5, 5, 5) have std 0, advantage 0 everywhere: dropped;
  # (0, 2, 1, 1) is kept.
  rewards = jnp.array([1.0, 1, 1, 1, 0, 2, 1, 1, 5, 5, 5, 5])
  adv, std = grpo.group_advantages(rewards, 4, "group")
  kept = grpo.informative_groups(std)
  np.testing.assert_array_equal(kept, [False, True, False])
  assert int((~kept).sum()) == 2
  np.testing.assert_array_equal(adv[:4], 0.0)


def test_dynamic_sampling_tests_the_score_before_the_length_shaping():
  """DAPO drops a group that is all right, however its lengths differ (verl's metric=acc): four
  right answers (score 1) of 10, 12, 17 and 20 tokens, L_max 20 and L_cache 4, are penalised
  0, 0, −0.25 and −1. On the shaped rewards the group would stay, and its std scaling would turn
  the length penalty alone into full-size advantages (0.66, 0.66, 0.13, −1.45)."""
  scores = jnp.array([1.0, 1, 1, 1, 0, 1, 0, 1])
  penalty = grpo.overlong_penalty(jnp.array([10.0, 12, 17, 20, 10, 10, 10, 10]), 20, 4, 1.0)
  np.testing.assert_allclose(penalty[:4], [0.0, 0.0, -0.25, -1.0])
  rewards = scores + penalty
  adv, _ = grpo.group_advantages(rewards, 4, "group")
  np.testing.assert_allclose(adv[:4], [0.66, 0.66, 0.13, -1.45], atol=0.01)
  kept = {m: grpo.informative_groups(grpo.filter_std(scores, rewards, _c(
      k=4, dynamic_sampling_metric=m))) for m in grpo.FILTER_METRICS}
  np.testing.assert_array_equal(kept["score"], [False, True])
  np.testing.assert_array_equal(kept["reward"], [True, True])


def test_dropped_rows_leave_the_loss_and_its_normaliser():
  # Rows 0, 1 (a dropped group) hold junk losses; rows 2, 3 are test_online's aggregation example:
  # losses (1, 2, 3) and (4, ·, ·). grpo: (6/3 + 4/1) / 2 kept sequences; bnpo: 10 / 4 kept
  # tokens; dr_grpo: 10 / (2 kept sequences × 3).
  losses = jnp.array([[100.0, 100, 100], [100, 100, 100], [1, 2, 3], [4, 9, 9]])
  mask = jnp.array([[1.0, 1, 1], [1, 0, 0], [1, 1, 1], [1, 0, 0]])
  rows = jnp.array([0.0, 0, 1, 1])
  np.testing.assert_allclose(grpo.aggregate(losses, mask, "grpo", rows), 3.0)
  np.testing.assert_allclose(grpo.aggregate(losses, mask, "bnpo", rows), 2.5)
  np.testing.assert_allclose(grpo.aggregate(losses, mask, "dr_grpo", rows), 10 / 6)
  for loss_type in grpo.LOSS_TYPES:  # Every group dropped: a zero loss, not 0 / 0.
    assert float(grpo.aggregate(losses, mask, loss_type, jnp.zeros(4))) == 0.0


def test_sequence_ratio_is_the_token_ratio_for_one_token_responses():
  # One real token per response, junk log-probs at the pad: s_i = exp(log ρ_i / 1) = ρ_i.
  logp = jnp.array([[math.log(1.5), 7.0], [math.log(0.7), -3.0]])
  old = jnp.zeros_like(logp)
  mask = jnp.array([[1.0, 0.0], [1.0, 0.0]])
  adv = jnp.array([1.0, -1.0])
  np.testing.assert_allclose(grpo.importance_ratio(logp, old, mask, "sequence")[:, 0], [1.5, 0.7],
                             rtol=1e-6)
  token, _, _ = grpo.token_losses(logp, old, logp, adv, _c(), mask=mask)
  for level in ("sequence", "sequence_token"):
    seq, _, _ = grpo.token_losses(logp, old, logp, adv, _c(importance_sampling_level=level),
                                  mask=mask)
    np.testing.assert_allclose(seq[:, 0], token[:, 0], rtol=1e-6)  # −1.2 (clipped) and 0.8.
    np.testing.assert_allclose(seq[:, 0], [-1.2, 0.8], rtol=1e-6)


# Two real tokens with ratios 4 and 1 and a pad with a junk log-prob: GSPO's s = √(4 · 1) = 2.
GSPO_LOGP = jnp.array([[math.log(4.0), 0.0, 9.0]])
GSPO_MASK = jnp.array([[1.0, 1.0, 0.0]])


def test_sequence_ratio_is_clipped_as_a_whole():
  # GSPO's clip range 3e-4 / 4e-4: for A = +1, min(2, 1.0004) on both real tokens, both clipped;
  # for A = −1, min(−2, −0.9997) = −2, not clipped: ℓ = 2 on both.
  old = jnp.zeros_like(GSPO_LOGP)
  c = _c(cliprange=3e-4, cliprange_high=4e-4, importance_sampling_level="sequence")
  np.testing.assert_allclose(grpo.importance_ratio(GSPO_LOGP, old, GSPO_MASK, "sequence"),
                             [[2.0, 2.0, 2.0]], rtol=1e-6)
  for a, want, was_clipped in ((1.0, -1.0004, True), (-1.0, 2.0, False)):
    loss, _, clipped = grpo.token_losses(GSPO_LOGP, old, GSPO_LOGP, jnp.array([a]), c,
                                         mask=GSPO_MASK)
    np.testing.assert_allclose(loss[0, :2], [want, want], rtol=1e-6)
    np.testing.assert_array_equal(clipped[0, :2], [was_clipped] * 2)


def test_gspo_token_has_gspo_value_and_a_gradient_per_token():
  # A = −1 (unclipped): ℓ_t = s = 2 on each real token at both levels. GSPO: s = exp(mean of the
  # two log-ratios), so ∂ℓ_t/∂log π_u = s / 2 = 1 for both real u, every t. GSPO-token:
  # s · π_t / sg[π_t], so ∂ℓ_t/∂log π_u = s = 2 where u = t, else 0. After the sequence's token
  # mean ('grpo') both give ∂L/∂log π_u = 1 on each real token, 0 at the pad.
  old = jnp.zeros_like(GSPO_LOGP)
  adv = jnp.array([-1.0])

  def token_loss(level):
    c = _c(importance_sampling_level=level)
    return lambda logp: grpo.token_losses(logp, old, logp, adv, c, mask=GSPO_MASK)[0]

  for level in ("sequence", "sequence_token"):
    np.testing.assert_allclose(token_loss(level)(GSPO_LOGP)[0, :2], [2.0, 2.0], rtol=1e-6)
  jac_seq = jax.jacobian(token_loss("sequence"))(GSPO_LOGP)[0, :2, 0, :2]
  jac_tok = jax.jacobian(token_loss("sequence_token"))(GSPO_LOGP)[0, :2, 0, :2]
  np.testing.assert_allclose(jac_seq, [[1.0, 1.0], [1.0, 1.0]], rtol=1e-6)
  np.testing.assert_allclose(jac_tok, [[2.0, 0.0], [0.0, 2.0]], rtol=1e-6)
  for level in ("sequence", "sequence_token"):
    grad = jax.grad(lambda lp: grpo.aggregate(token_loss(level)(lp), GSPO_MASK, "grpo"))(GSPO_LOGP)
    np.testing.assert_allclose(grad, [[1.0, 1.0, 0.0]], rtol=1e-6, atol=1e-7)


def test_defaults_are_grpo_and_bad_settings_are_refused(tiny_config):
  c = tiny_config.grpo
  assert [c[k] for k in NEW_KEYS] == [c.cliprange, 0, 1.0, False, "token", 1, "score"]
  grpo.check_config(c, tiny_config.format.response_len)
  for key, value, match in (("loss_type", "dapo", "'bnpo' here"),
                            ("importance_sampling_level", "seq", "importance_sampling_level"),
                            ("overlong_buffer", 33, r"overlong_buffer must be in \[0, "
                                                    r"format.response_len \(32\)\]"),
                            ("cliprange_high", 0.0, "cliprange_high must be > 0"),
                            ("max_num_gen_batches", 0, "max_num_gen_batches must be an integer"),
                            ("max_num_gen_batches", 3, "set grpo.dynamic_sampling=True"),
                            ("dynamic_sampling_metric", "acc", "dynamic_sampling_metric must be "
                                                               "one of")):
    bad = ml_collections.ConfigDict(c.to_dict())
    bad[key] = value
    with pytest.raises(ConfigError, match=match):
      grpo.check_config(bad, tiny_config.format.response_len)


def test_k1_in_the_loss_is_refused_in_every_grpo_block(tiny_config):
  """k1's gradient in the loss is ∇ log π, zero in expectation over π's samples: with β > 0 each
  GRPO block refuses it in one line naming its keys; k1 in the reward, or with β 0, passes."""
  for task in ("grpo", "dapo", "gspo", "dr_grpo"):
    bad = ml_collections.ConfigDict(tiny_config[task].to_dict())
    bad.update(kl_estimator="k1", kl_in="loss", beta=0.04)
    with pytest.raises(ConfigError, match=f"{task}.kl_estimator='k1' with {task}.kl_in='loss' "
                                          f"has a zero gradient in expectation"):
      grpo.check_config(bad, tiny_config.format.response_len, task)
    for ok in (dict(kl_in="reward"), dict(beta=0.0)):
      fine = ml_collections.ConfigDict(bad.to_dict())
      fine.update(ok)
      grpo.check_config(fine, tiny_config.format.response_len, task)


def test_the_papers_blocks_pass_their_checks(tiny_config):
  """task=dapo and task=gspo: the grpo block under DAPO's and GSPO's settings, refill included."""
  d, g = tiny_config.dapo, tiny_config.gspo
  assert (d.cliprange, d.cliprange_high, d.loss_type, d.beta) == (0.2, 0.28, "bnpo", 0.0)
  assert (d.dynamic_sampling, d.max_num_gen_batches) == (True, 10)
  assert d.overlong_buffer == tiny_config.format.response_len // 5
  assert (g.importance_sampling_level, g.cliprange, g.cliprange_high, g.beta,
          g.loss_type) == ("sequence", 3e-4, 4e-4, 0.0, "grpo")
  r = tiny_config.dr_grpo  # The authors' runs: no KL term.
  assert (r.loss_type, r.scale_rewards, r.beta) == ("dr_grpo", "none", 0.0)
  for task in ("dapo", "gspo"):
    grpo.check_config(tiny_config[task], tiny_config.format.response_len, task)
  bad = ml_collections.ConfigDict(d.to_dict())
  bad.loss_type = "dapo"
  with pytest.raises(ConfigError, match="dapo.loss_type 'dapo'.*task=dapo"):
    grpo.check_config(bad, 32, "dapo")


def test_refill_order_by_hand():
  """Two groups wanted. Draw 0 keeps group 1, draw 1 none, draw 2 groups 0 and 1: the batch is
  (0, 1) then (2, 0). Short of informative groups, the first draw's others fill it, in order."""
  no, yes = False, True
  assert online.refill_order([np.array([no, yes]), np.array([no, no]), np.array([yes, yes])],
                             2) == [(0, 1), (2, 0)]
  assert online.refill_order([np.array([yes, no, no]), np.array([no, no, no])],
                             3) == [(0, 0), (0, 1), (0, 2)]
  assert online.refill_order([np.array([yes, yes])], 2) == [(0, 0), (0, 1)]


def test_refill_draws_other_prompts_as_a_pure_function():
  """Draw j > 0 of a step is another order of the prompts, the same on every call (resume);
  draw 0 is the order GRPO always had."""
  first = pipeline.batch_indices(64, 8, 3, 5)
  again = pipeline.batch_indices(64, 8, 3, 5, stream=0)
  np.testing.assert_array_equal(first, again)
  one = pipeline.batch_indices(64, 8, 3, 5, stream=1)
  np.testing.assert_array_equal(one, pipeline.batch_indices(64, 8, 3, 5, stream=1))
  assert not np.array_equal(one, first)
  assert not np.array_equal(one, pipeline.batch_indices(64, 8, 3, 5, stream=2))


EOS, PAD = 2, 0
CFG = ModelConfig(variant="gpt2", vocab_size=48, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2,
                  d_ff=64, max_len=32)


@pytest.fixture(scope="module")
def models():
  k = jax.random.split(jax.random.key(0), 3)
  ref = transformer.init(k[0], CFG)
  rm = {"backbone": transformer.init(k[1], CFG), "head": heads.init_scalar_head(k[2], 32)}
  return ref, rm


def _batch() -> dict[str, jax.Array]:
  """2 prompts × 4 responses of at most 6 tokens. The first group ends with eos at 2, 4, 5 and 6
  tokens; no response of the second has an eos, so all four score no_eos_score: std 0."""
  rng = np.random.default_rng(0)
  prompt = np.repeat(rng.integers(3, CFG.vocab_size, (2, 6)), 4, 0)
  response = rng.integers(3, CFG.vocab_size, (8, 6))
  lengths = np.array([2, 4, 5, 6, 6, 6, 6, 6])
  response[np.arange(4), lengths[:4] - 1] = EOS
  mask = np.arange(6)[None] < lengths[:, None]
  return {"prompt": jnp.asarray(prompt), "prompt_mask": jnp.ones((8, 6), bool),
          "response": jnp.asarray(np.where(mask, response, PAD)),
          "response_mask": jnp.asarray(mask)}


VARIANTS = {
    "dapo": dict(cliprange_high=0.28, loss_type="bnpo", overlong_buffer=3, dynamic_sampling=True,
                 beta=0.0),
    "gspo_token": dict(importance_sampling_level="sequence_token", cliprange=3e-4,
                       cliprange_high=4e-4, beta=0.0, dynamic_sampling=True),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_one_step_of_each_variant_on_the_tiny_block(tiny_config, models, name):
  """The tiny config's grpo block (k 4, 2 epochs of minibatches of 4) with the variant's settings:
  one jitted step trains the policy, every metric finite, the second group dropped and counted."""
  ref, rm = models
  c = ml_collections.ConfigDict(tiny_config.grpo.to_dict())
  c.update(VARIANTS[name])
  grpo.check_config(c, 6)
  tx = optax.adam(1e-3)
  state = TrainState.create({"policy": jax.tree.map(jnp.copy, ref)}, tx)
  step = jax.jit(functools.partial(grpo.train_step, cfg=CFG, c=c, tx=tx, eos_id=EOS))
  new, m = step(state, ref, rm, _batch(), jax.random.key(1))
  assert all(np.isfinite(float(v)) for v in m.values()), m
  assert float(m["dynamic_sampling/dropped_groups"]) == 1.0
  assert float(m["dynamic_sampling/kept_fraction"]) == 0.5
  assert float(m["frac_reward_zero_std"]) == 0.5
  if name == "dapo":  # Lengths 2, 4, 5, 6 with eos; L_cache 3 over 6: 0, −1/3, −2/3, −1.
    np.testing.assert_allclose(m["overlong/penalty"], -2.0 / 8, rtol=1e-6)
    np.testing.assert_allclose(m["overlong/frac_penalized"], 3 / 8)
  moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), new.params["policy"], ref)
  assert max(jax.tree.leaves(moved)) > 0


def test_informative_groups_of_a_sampled_batch(tiny_config, models):
  """The refill's test, as the step applies it: the group whose four responses all lack an eos
  (each scored no_eos_score) is dropped; with kl_in='reward' the KL makes its rewards differ, so
  it counts only when the test is on the rewards (dynamic_sampling_metric='reward')."""
  ref, rm = models
  c = ml_collections.ConfigDict(tiny_config.grpo.to_dict())
  c.update(VARIANTS["dapo"])
  state = TrainState.create({"policy": jax.tree.map(jnp.copy, ref)}, optax.adam(1e-3))
  tweaked = jax.tree.map(lambda x: x * 1.1, ref)  # A policy away from the reference.
  fn = functools.partial(grpo.informative, cfg=CFG, c=c, eos_id=EOS)
  np.testing.assert_array_equal(fn(state, ref, rm, _batch()), [True, False])
  c.update(kl_in="reward", beta=0.1)
  moved = TrainState.create({"policy": tweaked}, optax.adam(1e-3))
  np.testing.assert_array_equal(fn(moved, ref, rm, _batch()), [True, False])
  c.update(dynamic_sampling_metric="reward")
  np.testing.assert_array_equal(fn(moved, ref, rm, _batch()), [True, True])


def test_every_grpo_block_holds_every_knob(tiny_config):
  """No knob has a default in code: each of the four GRPO blocks holds every one the step reads
  (the same keys as grpo's), and a block without one is refused in one line naming it."""
  for task in ("grpo", "dapo", "gspo", "dr_grpo"):
    assert set(tiny_config[task]) == set(tiny_config.grpo), task
    assert set(grpo.KNOBS) <= set(tiny_config[task]), task
  for key in NEW_KEYS:
    block = {k: v for k, v in tiny_config.dapo.to_dict().items() if k != key}
    with pytest.raises(ConfigError, match=f"dapo has no {key}: every GRPO block"):
      grpo.check_config(ml_collections.ConfigDict(block), tiny_config.format.response_len, "dapo")


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")  # config_flags' loader.
def test_grpo_overrides_change_the_grpo_block_alone():
  """--config.grpo.X is GRPO's alone: dapo, gspo and dr_grpo are blocks of their own (copies of
  grpo's values made by the config file), each overridden by its own key."""
  argv = ["rlhfjax", f"--config={ROOT}/configs/tldr_sim.py", "--config.grpo.lr=1e-4",
          "--config.grpo.steps=7", "--config.dapo.lr=2e-4"]  # As main.py parses them.
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True,
                                  sys_argv=argv)
  fv(argv)
  c, default = fv.config, load_config(arg=None)
  assert (c.grpo.lr, c.grpo.steps, c.dapo.lr) == (1e-4, 7, 2e-4)
  for task in ("gspo", "dr_grpo"):
    assert c[task].lr == default[task].lr == 3e-4, task
  for task in ("dapo", "gspo", "dr_grpo"):
    assert c[task].steps == default[task].steps == 60, task
    assert c[task].to_dict() == dict(default[task].to_dict(), lr=c[task].lr), task
  # The tiny config shrinks every block alike.
  tiny = load_config()
  for task in ("dapo", "gspo", "dr_grpo"):
    for key in ("steps", "rollout_batch", "k", "minibatch_size", "eval_every", "eval_examples"):
      assert tiny[task][key] == tiny.grpo[key], (task, key)
