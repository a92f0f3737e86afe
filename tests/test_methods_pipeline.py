"""The tiny pipeline's later stages: PPO's logs and resumption, best-of-N's curve, expert iteration's
winners, and task=eval's leaderboard and plot."""

import json
import os
import shutil
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import test_reward_functions
from rlhfjax.algorithms import best_of_n
from rlhfjax.algorithms import grpo
from rlhfjax.algorithms import ppo
from rlhfjax.data import formats
from rlhfjax import main
from rlhfjax.errors import ConfigError
from rlhfjax.parallel import rollout as parallel_rollout
from rlhfjax.rollout import engine
from rlhfjax.rollout import heldout
from rlhfjax.training import checkpoint
from rlhfjax.training import experiment
from rlhfjax.training import metrics as metrics_lib

TRL_NAMES = ("objective/kl", "objective/entropy", "objective/scores", "objective/rlhf_reward",
             "policy/approxkl_avg", "policy/clipfrac_avg", "loss/policy_avg", "loss/value_avg",
             "val/ratio", "val/num_eos_tokens", "objective/gold", "time/episodes_per_s",
             "time/generation_share")


def test_ppo_logs_what_practitioners_look_for(tiny_pipeline):
  config, workdir = tiny_pipeline
  logged = metrics_lib.read_jsonl(f"{workdir}/ppo/metrics.jsonl")
  assert sorted(logged) == list(range(config.ppo.steps + 1))
  for name in TRL_NAMES:
    assert name in logged[config.ppo.steps], name
  assert 0 < logged[1]["time/generation_share"] < 1
  # The held-out curve starts at the SFT policy itself: KL 0.
  assert logged[0]["eval/kl"] == pytest.approx(0.0, abs=1e-5)
  assert {"eval/rm_score", "eval/gold", "eval/win_rate"} <= set(logged[config.ppo.steps])


def _run_until_killed(config, workdir: str, saved_step: int) -> None:
  """Runs `config` in `workdir` and kills it (KeyboardInterrupt) once checkpoint `saved_step` is
  written: the asynchronous save completes, then the run dies before the next step."""
  original = checkpoint.Checkpointer.should_save

  def crash(self, step):
    if step == saved_step + 1:
      self.wait()
      raise KeyboardInterrupt
    return original(self, step)

  with mock.patch.object(checkpoint.Checkpointer, "should_save", crash):
    with pytest.raises(KeyboardInterrupt):
      main.run(config, workdir)


def test_ppo_resume_equals_uninterrupted(tiny_pipeline, tmp_path):
  config, workdir = tiny_pipeline
  exp = experiment.prepare(config, workdir)
  straight = ppo.load_policy(exp)
  other = str(tmp_path / "resumed")
  os.makedirs(other)
  for name in ("tokenizer.model", "sft", "rm"):
    src = os.path.join(workdir, name)
    (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, os.path.join(other, name))
  resumed_config = config.copy_and_resolve_references()
  resumed_config.checkpoint.update(every=2)
  resumed_config.stages = "ppo"
  _run_until_killed(resumed_config, other, saved_step=2)
  assert checkpoint.latest_step(f"{other}/ppo/checkpoints") == 2
  main.run(resumed_config, other)
  resumed = ppo.load_policy(experiment.prepare(resumed_config, other))
  for a, b in zip(jax.tree.leaves(straight), jax.tree.leaves(resumed)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_best_of_n_curve(tiny_pipeline):
  config, workdir = tiny_pipeline
  with open(f"{workdir}/best_of_n/curve.json") as f:
    curve = json.load(f)
  assert [p["n"] for p in curve] == [1, 2, 4]
  assert [p["kl"] for p in curve] == [best_of_n.analytic_kl(n) for n in (1, 2, 4)]
  rm = [p["rm_score"] for p in curve]
  assert rm == sorted(rm)  # The best of more samples never scores lower under the RM.
  with open(f"{workdir}/best_of_n/outputs.json") as f:
    stored = json.load(f)
  assert stored["n"] == 4 and len(stored["outputs"]) == config.eval.num_examples


@pytest.mark.parametrize("task", ["best_of_n", "expert_iteration"])
def test_best_of_n_refuses_greedy_sampling(tiny_pipeline, tmp_path, task):
  """At temperature 0 the n samples are one answer n times, yet the curve would report best-of-n's
  KL: refused before anything runs (the config ties these temperatures to eval.temperature)."""
  changed = tiny_pipeline[0].copy_and_resolve_references()
  changed.task, changed[task].temperature = task, 0.0
  with pytest.raises(ConfigError, match=f"{task}.temperature must be > 0, got 0.0"):
    main.run(changed, str(tmp_path / "w"))
  assert not os.path.exists(tmp_path / "w" / task)


def test_expert_iteration_trains_on_the_winners(tiny_pipeline):
  config, workdir = tiny_pipeline
  with open(f"{workdir}/expert_iteration/winners.json") as f:
    stored = json.load(f)
  assert stored["n"] == config.expert_iteration.n
  assert stored["temperature"] == config.expert_iteration.temperature  # Stale winners are redrawn.
  assert len(stored["winners"]) == config.expert_iteration.num_prompts
  logged = metrics_lib.read_jsonl(f"{workdir}/expert_iteration/metrics.jsonl")
  assert max(logged) == config.expert_iteration.steps


def test_leaderboard_and_plot(tiny_pipeline):
  config, workdir = tiny_pipeline
  with open(f"{workdir}/eval/leaderboard.json") as f:
    rows = json.load(f)
  assert {r["method"] for r in rows} == {"SFT", "PPO", "best-of-4", "expert iteration"}
  assert [r["win_rate"] for r in rows] == sorted((r["win_rate"] for r in rows), reverse=True)
  for r in rows:
    assert r["ci_low"] <= r["win_rate"] <= r["ci_high"]
    assert (r["method"] == "SFT") == np.isnan(r["p_vs_sft"])
  sft_row = next(r for r in rows if r["method"] == "SFT")
  assert sft_row["kl"] == 0.0
  with open(f"{workdir}/eval/leaderboard.csv") as f:
    assert len(f.read().splitlines()) == 1 + len(rows)
  with open(f"{workdir}/eval/overoptimization.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  # Other workdirs' curves join the plot under their names.
  from rlhfjax.evaluation import leaderboard
  changed = config.copy_and_resolve_references()
  changed.eval.compare_runs = workdir
  lines = leaderboard.curves(experiment.prepare(changed, workdir))
  name = os.path.basename(workdir)
  assert list(lines) == ["PPO (β=0.05)", "best-of-N", f"PPO · {name} (β=0.05)", f"best-of-N · {name}"]
  assert len(lines["PPO (β=0.05)"]) == config.ppo.steps // config.ppo.eval_every + 1


def test_eval_against_another_method(tiny_pipeline):
  config, workdir = tiny_pipeline
  changed = config.copy_and_resolve_references()
  changed.stages = "eval"
  changed.eval.against = "sft"
  changed.eval.methods = "sft,best_of_n"
  rows = main.run(changed, workdir)
  assert {r["method"] for r in rows} == {"SFT", "best-of-4"}
  from rlhfjax.evaluation import leaderboard
  with open(f"{workdir}/sft/outputs.json") as f:
    sft_answers = {o["id"]: o["output"] for o in json.load(f)["outputs"]}
  assert leaderboard.baseline_texts(experiment.prepare(changed, workdir)) == sft_answers
  with open(f"{workdir}/eval/leaderboard.md") as f:
    assert "win-rate vs sft (%)" in f.read()
  changed.eval.against = "reference"
  changed.eval.methods = config.eval.methods
  main.run(changed, workdir)  # Restore the default leaderboard.


def test_eval_names_a_missing_method(tiny_pipeline, tmp_path):
  config, workdir = tiny_pipeline
  changed = config.copy_and_resolve_references()
  changed.stages = "eval"
  changed.eval.methods = "sft,nonexistent"
  with pytest.raises(FileNotFoundError, match="task=nonexistent"):
    main.run(changed, workdir)


def test_feedme_and_reward_conditioning(tiny_pipeline):
  from rlhfjax.algorithms import reward_conditioning
  from rlhfjax.data import records
  from rlhfjax.training import loaders
  config, workdir = tiny_pipeline
  changed = config.copy_and_resolve_references()
  changed.stages = "feedme,reward_conditioning"
  main.run(changed, workdir)
  for method in ("feedme", "reward_conditioning"):
    with open(f"{workdir}/{method}/outputs.json") as f:
      assert len(json.load(f)["outputs"]) == config.eval.num_examples
  # Reward conditioning trains on chosen after the positive code and rejected after the negative.
  exp = experiment.prepare(config, workdir)
  comps = loaders.load_comparisons(f"{workdir}/label/train.jsonl", "openai")[:3]
  data = reward_conditioning.conditioned_data(exp, comps, "Quality: good", "Quality: bad")
  tok = exp.tokenizer
  chosen, rejected = zip(*records.preferred(comps))
  for i in range(3):
    assert tok.decode(data["prompt"][i][data["prompt_mask"][i]]).startswith("Quality: good\n")
    assert tok.decode(data["prompt"][3 + i][data["prompt_mask"][3 + i]]).startswith("Quality: bad\n")
    for row, text in ((i, chosen[i]), (3 + i, rejected[i])):
      expected = formats.response_tokens(tok, text, config.format.response_len)
      assert data["response"][row][data["response_mask"][row]].tolist() == expected
  # The KL a conditioned method reports is to SFT answering the plain post: SFT itself after the
  # control line is not SFT's sampler, so its KL is not 0 (it was, with the reference reading the
  # control line too).
  sft = loaders.load_policy(exp)
  posts = exp.splits["test"][:8]
  for control, zero in (("", True), ("Quality: good", False)):
    _, kl = engine.sample_texts(exp, sft, posts, jax.random.key(0), 1.0, 8, sft, control=control)
    assert (abs(float(kl.mean())) < 1e-6) == zero, (control, kl)
  # A finished FeedME run is not resumed on other data (a relabelled comparisons file): its
  # checkpoints record the data's digest, which no config key names.
  from rlhfjax.algorithms import sft as sft_lib  # pylint: disable=g-import-not-at-top
  other = {k: v[::-1].copy() for k, v in data.items()}
  with pytest.raises(ConfigError, match=r"another configuration \(training_data\)"):
    sft_lib.train(exp, "feedme", other, sft)


def test_quark_pool_and_loss(tiny_pipeline):
  import jax.numpy as jnp
  from rlhfjax.algorithms import quark
  from rlhfjax.models import transformer
  from rlhfjax.models.config import ModelConfig
  np.testing.assert_array_equal(quark.top_quantile(np.array([0.1, 0.9, 0.5, 0.7, 0.2]), 2),
                                [1, 3])
  # At the start (policy = reference, same prompt) the KL term is exactly 0.
  cfg = ModelConfig(vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32,
                    max_len=16)
  params = transformer.init(jax.random.key(0), cfg)
  prompt = jnp.array([[3, 4, 5]])
  batch = {"prompt": prompt, "prompt_mask": jnp.ones((1, 3), bool), "ref_prompt": prompt,
           "ref_prompt_mask": jnp.ones((1, 3), bool), "response": jnp.array([[6, 7, 0]]),
           "response_mask": jnp.array([[True, True, False]])}
  loss, m = quark.quark_loss(params, params, batch, cfg, kl_coef=0.5)
  assert float(m["train/kl"]) == pytest.approx(0.0, abs=1e-6)
  assert float(loss) == pytest.approx(float(m["train/nll"]), rel=1e-6)
  # A different reference prompt makes the KL positive.
  other = {**batch, "ref_prompt": jnp.array([[9, 9, 9]])}
  assert float(quark.quark_loss(params, params, other, cfg, kl_coef=0.5)[1]["train/kl"]) > 0

  config, workdir = tiny_pipeline
  changed = config.copy_and_resolve_references()
  changed.stages = "quark"
  main.run(changed, workdir)
  logged = metrics_lib.read_jsonl(f"{workdir}/quark/metrics.jsonl")
  assert sorted(logged) == [1, 2]
  assert all(m["quark/pool_score"] >= m["quark/score"] for m in logged.values())
  with open(f"{workdir}/quark/outputs.json") as f:
    assert len(json.load(f)["outputs"]) == config.eval.num_examples


ONLINE_NAMES = {
    "rloo": ("objective/kl", "objective/scores", "objective/rlhf_reward", "policy/approxkl_avg",
             "policy/clipfrac_avg", "loss/policy_avg", "val/ratio"),
    "grpo": ("objective/kl", "objective/scores", "reward", "reward_std", "frac_reward_zero_std",
             "kl", "policy/clipfrac_avg", "loss/policy_avg"),
    "reinforce_pp": ("objective/kl", "objective/scores", "objective/rlhf_reward",
                     "policy/approxkl_avg", "policy/clipfrac_avg", "loss/policy_avg", "val/ratio",
                     "returns/mean"),
    "online_dpo": ("objective/kl", "objective/scores", "objective/scores_margin",
                   "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
                   "logps/chosen", "logps/rejected", "loss/dpo"),
}


def _online_workdir(tiny_pipeline, tmp_path, name: str) -> str:
  """A copy of the tiny pipeline's tokenizer, SFT policy and reward model."""
  _, workdir = tiny_pipeline
  other = str(tmp_path / name)
  os.makedirs(other)
  for part in ("tokenizer.model", "sft", "rm"):
    src = os.path.join(workdir, part)
    (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, os.path.join(other, part))
  return other


def test_online_methods_log_answer_and_join_the_leaderboard(tiny_pipeline, tmp_path,
                                                            monkeypatch):
  config, _ = tiny_pipeline
  workdir = _online_workdir(tiny_pipeline, tmp_path, "online")
  changed = config.copy_and_resolve_references()
  changed.stages = "rloo,grpo,dapo,gspo,reinforce_pp,online_dpo,eval"
  changed.online_dpo.judge = "train_pool"  # Labelled on the host by the flipped training pool.
  changed.eval.methods = "rloo,grpo,dapo,gspo,reinforce_pp,online_dpo"
  # Each trains on batches one policy version old (docs/scaling.md: asynchronous rollouts): the
  # second iteration's batch is sampled by the first, before the first updates.
  changed.rollout.max_staleness = 1
  # A reward function of the test's own beside the reward model, in every method.
  functions = tmp_path / "my_rewards.py"
  functions.write_text(test_reward_functions.FUNCTIONS)
  changed.reward.update(functions=f"{functions}:vowels", weights="0.5")
  # DAPO's refill, made to happen: on top of grpo.informative's own test a group counts only when
  # its prompt's token ids sum to an even number, so most first draws fall short. Every row
  # trained on must then have such a prompt.
  trained_prompts = []
  real = grpo.informative
  informative = lambda state, ref, reward, batch, *, cfg, c, eos_id: (
      real(state, ref, reward, batch, cfg=cfg, c=c, eos_id=eos_id)
      & (batch["prompt"][::c.k].sum(-1) % 2 == 0))
  monkeypatch.setattr(grpo, "informative", informative)
  step = grpo.train_step

  def recording_step(state, ref, reward, batch, rng, **kw):
    if kw["c"].max_num_gen_batches > 1:
      jax.debug.callback(lambda p: trained_prompts.append(np.asarray(p)),
                         batch["prompt"].sum(-1))
    return step(state, ref, reward, batch, rng, **kw)
  monkeypatch.setattr(grpo, "train_step", recording_step)
  rows = main.run(changed, workdir)
  assert {r["method"] for r in rows} == {"RLOO", "GRPO", "DAPO", "GSPO", "REINFORCE++",
                                         "online DPO"}
  dapo = metrics_lib.read_jsonl(f"{workdir}/dapo/metrics.jsonl")
  draws = [dapo[s]["dynamic_sampling/gen_batches"] for s in (1, 2)]
  assert max(draws) > 1 and max(dapo[s]["dynamic_sampling/refilled_groups"] for s in (1, 2)) > 0
  assert len(trained_prompts) == 2 and all((p % 2 == 0).all() for p in trained_prompts)
  # A refill's groups come from the newest policy: of age 0, below the first draw's 1.
  assert dapo[2]["rollout/version_lag_mean"] == 1.0 - dapo[2][
      "dynamic_sampling/refilled_groups"] / (changed.dapo.rollout_batch // changed.dapo.k)
  for task in ("rloo", "grpo", "dapo", "gspo", "reinforce_pp", "online_dpo"):
    test_reward_functions.check_logged_means(workdir, task, changed[task].steps, ("vowels",),
                                             str(functions))
  for task, names in ONLINE_NAMES.items():
    c = changed[task]
    logged = metrics_lib.read_jsonl(f"{workdir}/{task}/metrics.jsonl")
    assert sorted(logged) == list(range(c.steps + 1))
    for name in names + ("objective/gold", "time/episodes_per_s"):
      assert name in logged[c.steps], (task, name)
    assert logged[0]["eval/kl"] == pytest.approx(0.0, abs=1e-5)
    assert [logged[s]["rollout/version_lag"] for s in (1, 2)] == [0.0, 1.0], task
    with open(f"{workdir}/{task}/outputs.json") as f:
      assert len(json.load(f)["outputs"]) == config.eval.num_examples
  from rlhfjax.evaluation import leaderboard
  lines = leaderboard.curves(experiment.prepare(changed, workdir))
  assert list(lines) == ["RLOO (β=0.05)", "GRPO (β=0.04)", "DAPO (β=0.0)", "GSPO (β=0.0)",
                         "REINFORCE++ (β=0.01)", "online DPO (β=0.1)"]


def test_a_dapo_iteration_copies_the_policy_once_for_all_its_draws(tiny_pipeline, tmp_path,
                                                                   monkeypatch):
  """DAPO's refill samples up to max_num_gen_batches batches in an iteration, all from the same
  weights: the policy goes into the rollout layout once per iteration, not once per draw. No group
  counts as informative here, so the iteration makes all 3 draws. The rollout layout is made
  another than the trainer's (as on an accelerator: bf16, tensor parallel) by a reshard that
  copies whatever is not already its own copy, counting the copies."""
  config, _ = tiny_pipeline
  workdir = _online_workdir(tiny_pipeline, tmp_path, "copies")
  changed = config.copy_and_resolve_references()
  changed.stages = "dapo"
  changed.dapo.update(steps=1, max_num_gen_batches=3)
  monkeypatch.setattr(grpo, "informative", lambda state, ref, reward, batch, *, cfg, c, eos_id:
                      jnp.zeros(batch["prompt"].shape[0] // c.k, bool))
  copies, made = [0], {}  # The copies' leaves by id, kept alive so that no id is reused.

  def reshard(params, *args):
    if all(id(x) in made for x in jax.tree.leaves(params)):
      return params  # Already in the layout: no copy.
    copies[0] += 1
    out = jax.tree.map(jnp.copy, params)
    made.update({id(x): x for x in jax.tree.leaves(out)})
    return out
  monkeypatch.setattr(parallel_rollout, "reshard", reshard)
  # The iteration runs between the held-out points of steps 0 and 1: after each of its draws, the
  # copies made since the first point.
  points, after_first, per_draw = [], [0], []
  real_curve_point, real_sample_batch = heldout.curve_point, engine.sample_batch

  def curve_point(*args, **kw):
    points.append("started")
    out = real_curve_point(*args, **kw)
    points[-1], after_first[0] = "done", (copies[0] if len(points) == 1 else after_first[0])
    return out

  def sample_batch(*args, **kw):
    out = real_sample_batch(*args, **kw)
    if points == ["done"]:
      per_draw.append(copies[0] - after_first[0])
    return out
  monkeypatch.setattr(heldout, "curve_point", curve_point)
  monkeypatch.setattr(engine, "sample_batch", sample_batch)
  main.run(changed, workdir)
  logged = metrics_lib.read_jsonl(f"{workdir}/dapo/metrics.jsonl")
  assert logged[1]["dynamic_sampling/gen_batches"] == 3.0
  assert per_draw == [1, 1, 1]


def test_online_resume_equals_uninterrupted(tiny_pipeline, tmp_path):
  """RLOO with a LoRA policy: adapters, their AdamW state and the masked base restore exactly."""
  config, _ = tiny_pipeline
  answers = {}
  for run_name in ("straight", "resumed"):
    workdir = _online_workdir(tiny_pipeline, tmp_path, run_name)
    changed = config.copy_and_resolve_references()
    changed.stages = "rloo"
    changed.checkpoint.update(every=1)
    changed.lora.update(rank=4, models="policy")
    changed.rloo.update(lr=3e-3)
    if run_name == "resumed":
      _run_until_killed(changed, workdir, saved_step=1)
      assert checkpoint.latest_step(f"{workdir}/rloo/checkpoints") == 1
    seen = []
    original = checkpoint.Checkpointer.should_save

    def record(self, step):
      seen.append(step)
      return original(self, step)

    checkpoint.Checkpointer.should_save = record
    try:
      main.run(changed, workdir)
    finally:
      checkpoint.Checkpointer.should_save = original
    # The resumed run starts after its checkpoint, not from scratch.
    assert seen[0] == (2 if run_name == "resumed" else 1), seen
    with open(f"{workdir}/rloo/outputs.json") as f:
      answers[run_name] = json.load(f)
  assert answers["resumed"] == answers["straight"]
