"""The rollout engine's rules and the online methods' losses and advantages, against hand-worked
numbers: RLOO's leave-one-out baseline, GRPO's group normalisation, k3 KL and loss aggregation,
online DPO's pairs; and one real step of each on a tiny model."""

import functools
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from rlhfjax.algorithms import grpo
from rlhfjax.algorithms import online
from rlhfjax.algorithms import online_dpo
from rlhfjax.algorithms import rloo
from rlhfjax.errors import ConfigError
from rlhfjax.models import heads
from rlhfjax.models import transformer
from rlhfjax.models.config import ModelConfig
from rlhfjax.rollout import engine
from rlhfjax.training.state import TrainState

EOS, PAD = 2, 0
CFG = ModelConfig(variant="gpt2", vocab_size=48, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2,
                  d_ff=64, max_len=32)


def test_missing_eos_penalty():
  response = jnp.array([[5, EOS, PAD], [5, 6, 7]])
  out = engine.penalize_missing_eos(jnp.array([0.3, 0.9]), response, EOS, -1.0)
  np.testing.assert_allclose(out, [0.3, -1.0])


def test_k_samples_of_a_prompt_are_adjacent_rows():
  prompts = {"prompt": jnp.array([[1, 2], [3, 4]]), "prompt_mask": jnp.ones((2, 2), bool)}
  out = engine.repeat_prompts(prompts, 3)
  np.testing.assert_array_equal(out["prompt"][:, 0], [1, 1, 1, 3, 3, 3])


def test_leave_one_out_baseline():
  # k = 2: each sample's baseline is the other's reward.
  np.testing.assert_allclose(rloo.leave_one_out(jnp.array([1.0, 3.0, 2.0, 6.0]), 2),
                             [-2.0, 2.0, -4.0, 4.0])
  # k = 3, rewards 1, 2, 6: baselines (2 + 6) / 2 = 4, (1 + 6) / 2 = 3.5, (1 + 2) / 2 = 1.5.
  np.testing.assert_allclose(rloo.leave_one_out(jnp.array([1.0, 2.0, 6.0]), 3), [-3.0, -1.5, 4.5])


def test_rloo_reward_subtracts_the_summed_kl():
  kl = jnp.array([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]])  # Summed: 1.0 and 0.0.
  rewards, adv = rloo.advantages(jnp.array([2.0, 1.0]), kl, 2, 0.1, False)
  np.testing.assert_allclose(rewards, [1.9, 1.0])
  np.testing.assert_allclose(adv, [0.9, -0.9], rtol=1e-6)


def test_sequence_ratio_is_clipped():
  # Σ_t (log π − log π_old) = log 1.5: ratio 1.5 > 1.2; A = 1: max(−1.5, −1.2) = −1.2, clipped.
  logp = jnp.array([[math.log(1.5), 0.0, 7.0]])
  mask = jnp.array([[1.0, 1.0, 0.0]])  # The 7.0 is padding and must not count.
  loss, stats = rloo.sequence_clipped_loss(logp, jnp.zeros((1, 3)), jnp.array([1.0]), mask, 0.2)
  np.testing.assert_allclose(loss, -1.2, rtol=1e-6)
  np.testing.assert_allclose(stats["policy/clipfrac_avg"], 1.0)
  np.testing.assert_allclose(stats["val/ratio"], 1.5, rtol=1e-6)


def test_group_normalisation():
  # Group (1, 3): mean 2, unbiased std sqrt(2). Group (5, 5): no spread, advantages 0.
  adv, std = grpo.group_advantages(jnp.array([1.0, 3.0, 5.0, 5.0]), 2, "group")
  s = math.sqrt(2.0) + grpo.STD_EPS
  np.testing.assert_allclose(adv, [-1 / s, 1 / s, 0.0, 0.0], rtol=1e-6)
  np.testing.assert_allclose(std, [math.sqrt(2.0), 0.0], rtol=1e-6)
  adv, _ = grpo.group_advantages(jnp.array([1.0, 3.0, 5.0, 5.0]), 2, "none")  # Dr. GRPO.
  np.testing.assert_allclose(adv, [-1.0, 1.0, 0.0, 0.0])
  # 'batch': the same centring, over the batch's std (of 1, 3, 5, 5: sqrt(11/3)).
  adv, _ = grpo.group_advantages(jnp.array([1.0, 3.0, 5.0, 5.0]), 2, "batch")
  np.testing.assert_allclose(adv, np.array([-1.0, 1.0, 0.0, 0.0]) / (math.sqrt(11 / 3) + 1e-4),
                             rtol=1e-6)


def test_k3_kl_estimator():
  # π = 0.5, π_ref = 0.25: k1 = log 2; k3 = 0.5 − log 0.5 − 1 = log 2 − 0.5.
  logp, ref = jnp.log(jnp.array([0.5])), jnp.log(jnp.array([0.25]))
  np.testing.assert_allclose(grpo.kl_estimate(logp, ref, "k1"), [math.log(2)], rtol=1e-6)
  np.testing.assert_allclose(grpo.kl_estimate(logp, ref, "k3"), [math.log(2) - 0.5], rtol=1e-6)
  np.testing.assert_allclose(grpo.kl_estimate(ref, ref, "k3"), [0.0], atol=1e-7)
  # k3 never goes negative, even where π_ref > π (k1 does).
  np.testing.assert_array_less(-1e-7, grpo.kl_estimate(ref, logp, "k3"))
  assert float(grpo.kl_estimate(ref, logp, "k1")[0]) < 0


def test_grpo_loss_aggregation():
  losses = jnp.array([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
  mask = jnp.array([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
  np.testing.assert_allclose(grpo.aggregate(losses, mask, "grpo"), (6 / 3 + 4 / 1) / 2)
  np.testing.assert_allclose(grpo.aggregate(losses, mask, "bnpo"), 10 / 4)
  np.testing.assert_allclose(grpo.aggregate(losses, mask, "dr_grpo"), 10 / 6)


def test_grpo_token_loss_with_kl_in_the_loss():
  c = ml_collections.ConfigDict(dict(cliprange=0.2, cliprange_high=0.2, beta=0.1,
                                     kl_estimator="k3", kl_in="loss",
                                     importance_sampling_level="token"))
  logp = jnp.log(jnp.array([[0.5, 0.5]]))
  old = jnp.log(jnp.array([[0.5, 0.25]]))  # ratios 1 and 2 (the second clipped to 1.2 for A > 0).
  ref = jnp.log(jnp.array([[0.25, 0.5]]))  # k3: log 2 − 0.5, then 0.
  loss, kl, clipped = grpo.token_losses(logp, old, ref, jnp.array([2.0]), c)
  np.testing.assert_allclose(kl, [[math.log(2) - 0.5, 0.0]], rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(loss, [[-2.0 + 0.1 * (math.log(2) - 0.5), -2.4]], rtol=1e-6)
  np.testing.assert_array_equal(clipped, [[False, True]])


def test_online_dpo_pairs():
  x = jnp.array([10.0, 11.0, 20.0, 21.0])  # Pairs (10, 11) and (20, 21).
  chosen, rejected = online_dpo.pairs(x, jnp.array([False, True]))
  np.testing.assert_allclose(chosen, [10.0, 21.0])
  np.testing.assert_allclose(rejected, [11.0, 20.0])
  rows = jnp.arange(8).reshape(4, 2)  # Rows of a [2P, R] array move whole.
  chosen, _ = online_dpo.pairs(rows, jnp.array([True, False]))
  np.testing.assert_array_equal(chosen, [[2, 3], [4, 5]])


def _batch(n: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  # Rows come in groups of 4 (of 2 for n = 2) with one prompt, as the rollout engine lays them out.
  group = min(n, 4)
  prompt = np.repeat(rng.integers(3, CFG.vocab_size, (n // group, 6)), group, 0)
  response = rng.integers(3, CFG.vocab_size, (n, 5))
  lengths = rng.integers(2, 6, n)
  lengths[0] = 5
  response[np.arange(n), lengths - 1] = EOS
  response[0, -1] = 7  # Row 0 never ends: the truncation rule applies.
  mask = np.arange(5)[None] < lengths[:, None]
  return {"prompt": jnp.asarray(prompt), "prompt_mask": jnp.ones((n, 6), bool),
          "response": jnp.asarray(np.where(mask, response, PAD)), "response_mask": jnp.asarray(mask)}


@pytest.fixture(scope="module")
def models():
  k = jax.random.split(jax.random.key(0), 3)
  ref = transformer.init(k[0], CFG)
  rm = {"backbone": transformer.init(k[1], CFG), "head": heads.init_scalar_head(k[2], 32)}
  return ref, rm


ONLINE = dict(temperature=1.0, penalize_no_eos=True, no_eos_score=-1.0, share_prompt=True,
              truncated_is=False, tis_cap=2.0, old_policy="recompute")
CONFIGS = {
    "rloo": (rloo, dict(k=2, kl_coef=0.05, cliprange=0.2, epochs=2, minibatch_size=4,
                        normalize_advantages=False), "loss/policy_avg"),
    "grpo": (grpo, dict(k=4, beta=0.04, kl_estimator="k3", kl_in="loss", cliprange=0.2,
                        cliprange_high=0.2, scale_rewards="group", loss_type="grpo", epochs=1,
                        minibatch_size=8, overlong_buffer=0, dynamic_sampling=False,
                        importance_sampling_level="token"),
             "loss/policy_avg"),
    "online_dpo": (online_dpo, dict(beta=0.1, loss_type="sigmoid", label_smoothing=0.0),
                   "loss/dpo"),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_one_step_trains_the_policy_only(models, name):
  ref, rm = models
  module, extra, loss_key = CONFIGS[name]
  c = ml_collections.ConfigDict({**ONLINE, **extra})
  tx = optax.adam(1e-3)
  state = TrainState.create({"policy": jax.tree.map(jnp.copy, ref)}, tx)
  step = jax.jit(functools.partial(module.train_step, cfg=CFG, c=c, tx=tx, eos_id=EOS))
  batch = _batch(8)
  new, m = step(state, ref, rm, batch, jax.random.key(1))
  assert all(np.isfinite(float(v)) for v in m.values()), m
  assert loss_key in m and "objective/scores" in m and "objective/kl" in m
  # The policy moved; at the first step it equals the reference, so the KL estimate is 0.
  moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), new.params["policy"], ref)
  assert max(jax.tree.leaves(moved)) > 0
  np.testing.assert_allclose(m["objective/kl"], 0.0, atol=1e-5)
  # Row 0 has no eos: its score is the penalty, so the mean score includes one -1.
  scores, raw = engine.rewards_at_eos(rm, batch, CFG, EOS, -1.0)
  np.testing.assert_allclose(scores[0], -1.0)
  np.testing.assert_allclose(m["objective/scores"], float(scores.mean()), rtol=1e-5)


def test_shuffled_rows_move_whole_groups():
  key = jax.random.key(3)
  np.testing.assert_array_equal(online.shuffled_rows(key, 12), jax.random.permutation(key, 12))
  order = np.asarray(online.shuffled_rows(key, 12, 4)).reshape(3, 4)
  np.testing.assert_array_equal(order - order[:, :1], np.tile(np.arange(4), (3, 1)))
  assert sorted(order[:, 0]) == [0, 4, 8]


def test_shared_prompt_needs_whole_groups_per_minibatch():
  c = ml_collections.ConfigDict(dict(rollout_batch=16, minibatch_size=4, temperature=1.0,
                                     share_prompt=True))
  with pytest.raises(ConfigError, match=r"grpo.minibatch_size \(4\) must be a multiple of the "
                                        r"samples per prompt \(8\) with grpo.share_prompt"):
    online.check_sampling("grpo", c, 8)
  c.share_prompt = False
  online.check_sampling("grpo", c, 8)


def test_shared_prompt_step_equals_the_unshared_one(models):
  """GRPO's step (one minibatch of the whole batch) with each prompt computed once per group: the
  same metrics and the same updated policy as with every row computed alone."""
  ref, rm = models
  module, extra, _ = CONFIGS["grpo"]
  tx = optax.adam(1e-3)
  state = TrainState.create({"policy": jax.tree.map(jnp.copy, ref)}, tx)
  out = []
  for share in (False, True):
    c = ml_collections.ConfigDict({**ONLINE, **extra, "share_prompt": share})
    step = jax.jit(functools.partial(module.train_step, cfg=CFG, c=c, tx=tx, eos_id=EOS))
    out.append(step(state, ref, rm, _batch(8), jax.random.key(1)))
  (plain, m_plain), (shared, m_shared) = out
  for name in m_plain:
    np.testing.assert_allclose(m_shared[name], m_plain[name], atol=1e-5, err_msg=name)
  for a, b in zip(jax.tree.leaves(plain.params), jax.tree.leaves(shared.params)):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_online_dpo_uses_the_annotator_labels(models):
  ref, rm = models
  c = ml_collections.ConfigDict({**ONLINE, **CONFIGS["online_dpo"][1]})
  tx = optax.sgd(0.0)  # Only the metrics matter here.
  state = TrainState.create({"policy": ref}, tx)
  batch = _batch(4)
  step = functools.partial(online_dpo.train_step, cfg=CFG, c=c, tx=tx, eos_id=EOS)
  scores, _ = engine.rewards_at_eos(rm, batch, CFG, EOS, -1.0)
  by_rm = np.asarray(scores[1::2] > scores[0::2])
  _, m_rm = step(state, ref, rm, batch, jax.random.key(0))
  flipped = {**batch, online_dpo.PREFERENCE: jnp.asarray(~by_rm, jnp.int32)}
  _, m_flip = step(state, ref, rm, flipped, jax.random.key(0))
  # The RM's own choice has a margin >= 0; the opposite labels give its negative.
  assert float(m_rm["objective/scores_margin"]) >= 0
  np.testing.assert_allclose(m_flip["objective/scores_margin"], -m_rm["objective/scores_margin"],
                             rtol=1e-6)


def _imports(package: str) -> dict[str, set[str]]:
  """The rlhfjax modules each file of `package` imports."""
  import ast
  import pathlib
  root = pathlib.Path(__file__).resolve().parents[1] / "rlhfjax" / package
  out = {}
  for path in root.glob("*.py"):
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlhfjax"):
        names.update(f"{node.module}.{a.name}" for a in node.names)
      elif isinstance(node, ast.Import):
        names.update(a.name for a in node.names if a.name.startswith("rlhfjax"))
    out[path.name] = names
  return out


@pytest.mark.parametrize("package,higher", [("algorithms", ("evaluation",)),
                                            ("rollout", ("evaluation", "algorithms"))])
def test_lower_floors_never_import_higher_ones(package, higher):
  for name, imported in _imports(package).items():
    bad = [m for m in imported if m.split(".")[1] in higher]
    assert not bad, f"rlhfjax/{package}/{name} imports {bad}"
