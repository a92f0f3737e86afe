"""Reward functions (`reward.functions`): loaded from a file of the test's own, called as TRL calls
them, combined with or instead of the reward model, logged as TRL logs them, and stopping a run in
one line naming the function and the example when they fail."""

import os
import shutil

import numpy as np
import pytest

from conftest import load_config
from rlhfjax import main
from rlhfjax.data import pipeline
from rlhfjax.errors import ConfigError
from rlhfjax.rollout import reward_functions
from rlhfjax.simulated import arithmetic
from rlhfjax.training import checkpoint
from rlhfjax.training import metrics as metrics_lib

BLOCK = {"functions": "", "weights": "", "model_weight": 1.0}  # A `reward` block: all its keys.

FUNCTIONS = '''
def vowels(prompts, completions, completion_ids, **columns):
    """The share of vowels in a completion; None for an empty one."""
    return [sum(ch in "aeiou" for ch in c) / len(c) if c else None for c in completions]


def short(prompts, completions, completion_ids, **columns):
    return [-len(ids) / 10 for ids in completion_ids]


def by_column(prompts, completions, completion_ids, answer, **columns):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


def raising(prompts, completions, completion_ids, **columns):
    if any("boom" in c for c in completions):
        raise ValueError("no boom")
    return [0.0] * len(completions)


def broken(prompts, completions, completion_ids, **columns):
    return [1.0 / 0 for _ in completions]


def too_few(prompts, completions, completion_ids, **columns):
    return [0.0]


def nan(prompts, completions, completion_ids, **columns):
    return [float("nan")] * len(completions)


def as_arrays(prompts, completions, completion_ids, **columns):
    import jax.numpy as jnp
    import numpy as np
    return [jnp.float32(0.5), np.float64(1.5), True, jnp.asarray([2.0, 3.0])[1]]


def as_array(prompts, completions, completion_ids, **columns):
    import jax.numpy as jnp
    return jnp.asarray([c == "b" for c in completions])


def text(prompts, completions, completion_ids, **columns):
    return ["1.0"] * len(completions)
'''


@pytest.fixture(scope="module")
def functions_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("rewards") / "my_rewards.py"
  path.write_text(FUNCTIONS)
  return str(path)


def _examples(n):
  return [pipeline.Prompted(id=f"q{i}", prompt=f"question {i}", messages=None, reference="",
                            extra={"answer": str(i)}) for i in range(n)]


def test_weighted_sum_with_none_as_zero_and_columns(functions_file):
  fns = reward_functions.load({**BLOCK, "functions": f"{functions_file}:vowels,{functions_file}:short,"
                                            f"{functions_file}:by_column",
                               "weights": "2.0,1.0,0.5"})
  assert [f.name for f in fns] == ["vowels", "short", "by_column"]
  texts, ids = ["aab", "", "2"], [[5, 6, 7], [], [9]]
  total, values = reward_functions.evaluate(fns, _examples(3), texts, ids)
  np.testing.assert_allclose(values["vowels"], [2 / 3, np.nan, 0.0])
  np.testing.assert_allclose(values["short"], [-0.3, 0.0, -0.1])
  np.testing.assert_allclose(values["by_column"], [0.0, 0.0, 1.0])  # Example 2's answer is "2".
  np.testing.assert_allclose(total, [2 * 2 / 3 - 0.3, 0.0, -0.1 + 0.5], rtol=1e-6)
  stats = reward_functions.statistics(values)
  assert stats["rewards/vowels/mean"] == pytest.approx(1 / 3)  # Over the two it scored.
  assert stats["rewards/short/std"] == pytest.approx(np.std([-0.3, 0.0, -0.1]))


def test_conversational_prompts_and_completions_are_messages(functions_file):
  seen = {}

  def record(prompts, completions, completion_ids, **columns):
    seen.update(prompts=prompts, completions=completions, columns=columns)
    return [1.0] * len(completions)

  e = pipeline.Prompted(id="c", prompt="hi", messages=(("user", "hi"),), reference="",
                        extra={"topic": "greeting"})
  fn = reward_functions.RewardFunction("record", "test:record", 1.0, record)
  reward_functions.evaluate([fn], [e], ["hello"], [[1, 2]])
  assert seen["prompts"] == [[{"role": "user", "content": "hi"}]]
  assert seen["completions"] == [[{"role": "assistant", "content": "hello"}]]
  assert seen["columns"]["topic"] == ["greeting"] and seen["columns"]["id"] == ["c"]


def test_failures_name_the_function_and_the_example(functions_file):
  load = lambda name: reward_functions.load({**BLOCK, "functions": f"{functions_file}:{name}"})
  with pytest.raises(reward_functions.RewardFunctionError,
                     match=r"reward function 'raising' .* raised ValueError: no boom on example "
                           r"1 \(id 'q1'\)"):
    reward_functions.evaluate(load("raising"), _examples(3), ["a", "boom", "c"], [[1]] * 3)
  with pytest.raises(reward_functions.RewardFunctionError, match="'too_few' .* returned 1 values "
                                                                 "for 2 completions"):
    reward_functions.evaluate(load("too_few"), _examples(2), ["a", "b"], [[1]] * 2)
  with pytest.raises(reward_functions.RewardFunctionError, match=r"'nan' .* returned nan for "
                                                                 r"example 0 \(id 'q0'\)"):
    reward_functions.evaluate(load("nan"), _examples(2), ["a", "b"], [[1]] * 2)
  with pytest.raises(reward_functions.RewardFunctionError, match=r"'text' .* returned '1.0' \(not "
                                                                 r"a number or None\)"):
    reward_functions.evaluate(load("text"), _examples(2), ["a", "b"], [[1]] * 2)


def test_numpy_and_jax_numbers_and_bools_are_numbers(functions_file):
  """What TRL's `torch.tensor` would read: NumPy and JAX scalars, 0-d arrays, bools, an array."""
  load = lambda name: reward_functions.load({**BLOCK, "functions": f"{functions_file}:{name}"})
  total, _ = reward_functions.evaluate(load("as_arrays"), _examples(4), list("abcd"), [[1]] * 4)
  np.testing.assert_allclose(total, [0.5, 1.5, 1.0, 3.0])
  total, _ = reward_functions.evaluate(load("as_array"), _examples(3), list("abc"), [[1]] * 3)
  np.testing.assert_allclose(total, [0.0, 1.0, 0.0])


def test_config_errors(functions_file):
  with pytest.raises(ConfigError, match="reward.functions: 'nocolon'"):
    reward_functions.load({**BLOCK, "functions": "nocolon"})
  with pytest.raises(ConfigError, match="has no function 'missing'"):
    reward_functions.load({**BLOCK, "functions": f"{functions_file}:missing"})
  with pytest.raises(ConfigError, match="cannot import no_such_module"):
    reward_functions.load({**BLOCK, "functions": "no_such_module:f"})
  with pytest.raises(ConfigError, match="2 weights for 1 functions"):
    reward_functions.load({**BLOCK, "functions": f"{functions_file}:short", "weights": "1,2"})
  with pytest.raises(ConfigError, match="model_weight=0 leaves no reward"):
    reward_functions.load({**BLOCK, "functions": "", "model_weight": 0.0})
  assert reward_functions.load({**BLOCK, "functions": "rlhfjax.rollout.reward_functions:load"})


@pytest.mark.parametrize("correct", ["", "a:right,b:right"])
def test_pass_at_k_without_one_correct_function_is_refused_before_training(tmp_path, correct):
  """eval.pass_k > 0 judges answers by eval.correct: without it (or with two) the run used to end
  in a bare StopIteration after training, when the answers were judged."""
  c = load_config()
  c.task, c.eval.pass_k, c.eval.correct = "sft", 4, correct
  with pytest.raises(ConfigError, match=r"eval.pass_k=4 needs eval.correct: one reward function"):
    main.run(c, str(tmp_path / "w"))
  assert not os.path.exists(tmp_path / "w" / "sft")


def _workdir(tiny_pipeline, tmp_path, name, parts=("tokenizer.model", "sft", "rm")):
  _, done = tiny_pipeline
  workdir = tmp_path / name
  workdir.mkdir()
  for part in parts:
    src = os.path.join(done, part)
    (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, str(workdir / part))
  return str(workdir)


def check_logged_means(workdir, task, steps, fn_names, functions_file, columns=lambda rows: {}):
  """The logged `rewards/<name>/mean` of each step is the function on that step's logged
  completions (completions.jsonl), recomputed here from the texts (and `columns(rows)`)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location("again", functions_file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  logged = metrics_lib.read_jsonl(f"{workdir}/{task}/metrics.jsonl")
  completions = metrics_lib.read_rows(f"{workdir}/{task}/completions.jsonl")
  assert sorted(completions) == list(range(steps))
  for step, rows in completions.items():
    texts = [r["completion"] for r in rows]
    for name in fn_names:
      if name == "short":  # Reads completion_ids: compare with what was logged per row.
        got = [r["rewards"][name] for r in rows]
      else:
        got = getattr(module, name)([""] * len(texts), texts, [[]] * len(texts), **columns(rows))
      scored = [v for v in got if v is not None]
      assert logged[step + 1][f"rewards/{name}/mean"] == pytest.approx(np.mean(scored), abs=1e-6)


def test_ppo_best_of_n_and_expert_iteration_train_on_reward_functions(
    tiny_pipeline, tmp_path, functions_file):
  """PPO, best-of-N and expert iteration with two functions beside the reward model (the
  critic-free methods: test_methods_pipeline.py's online test)."""
  config, _ = tiny_pipeline
  workdir = _workdir(tiny_pipeline, tmp_path, "beside")
  changed = config.copy_and_resolve_references()
  changed.stages = "ppo,best_of_n,expert_iteration"
  changed.reward.update(functions=f"{functions_file}:vowels,{functions_file}:short",
                        weights="1.0,0.5", model_weight=0.5)
  changed.ppo.steps = 2
  main.run(changed, workdir)
  check_logged_means(workdir, "ppo", 2, ("vowels", "short"), functions_file)
  rows = metrics_lib.read_rows(f"{workdir}/ppo/completions.jsonl")[1]
  for r in rows:
    want = r["rewards"]["short"] * 0.5 + (r["rewards"]["vowels"] or 0.0)
    assert r["function_reward"] == pytest.approx(want, abs=1e-6)
  assert os.path.exists(f"{workdir}/best_of_n/curve.json")
  assert os.path.exists(f"{workdir}/expert_iteration/winners.json")


def test_verifiable_task_needs_no_reward_model(tmp_path, functions_file):
  """configs/verifiable.py:tiny: SFT, then GRPO and DAPO on the rule-based reward alone (no labels,
  no reward model), then task=pass_at_k; DAPO logs the groups its dynamic sampling drops. A
  function that raises stops a run in one line naming it and the example, before any step."""
  config = load_config("verifiable", "tiny")
  config.stages = "sft,grpo,dapo,pass_at_k"
  config.eval.methods = "sft,grpo,dapo"
  workdir = str(tmp_path / "run")
  rows = main.run(config, workdir)
  assert not os.path.exists(f"{workdir}/rm") and not os.path.exists(f"{workdir}/label")
  assert [r["method"] for r in rows] == ["sft", "grpo", "dapo"]
  assert all(0.0 <= r["pass@1"] <= r["pass@k"] <= 1.0 for r in rows)
  d = config.data
  examples = arithmetic.splits(d.seed, {k: d[k] for k in ("sft", "unlabeled", "validation", "test")},
                               d.slip)["unlabeled"]
  answer = {e.id: e.extra["answer"] for e in examples}
  check_logged_means(workdir, "grpo", config.grpo.steps, ("correct",), arithmetic.__file__,
                      lambda rows: {"answer": [answer[r["id"]] for r in rows]})
  dapo = metrics_lib.read_jsonl(f"{workdir}/dapo/metrics.jsonl")
  for step in range(1, config.dapo.steps + 1):
    assert 0.0 <= dapo[step]["dynamic_sampling/first_draw_dropped_fraction"] <= 1.0
  # The scores the method trained on (before the truncation rule) are the function's alone.
  logged = metrics_lib.read_jsonl(f"{workdir}/grpo/metrics.jsonl")
  rows = metrics_lib.read_rows(f"{workdir}/grpo/completions.jsonl")[0]
  assert logged[1]["objective/raw_scores"] == pytest.approx(
      np.mean([r["function_reward"] for r in rows]), abs=1e-5)
  broken = config.copy_and_resolve_references()
  broken.stages = "grpo"
  broken.reward.functions = f"{functions_file}:broken"
  other = str(tmp_path / "broken")
  os.makedirs(other)
  for part in ("tokenizer.model", "sft"):
    src = os.path.join(workdir, part)
    (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, os.path.join(other, part))
  with pytest.raises(reward_functions.RewardFunctionError,
                     match=r"^reward function 'broken' \(.*:broken\) raised ZeroDivisionError: "
                           r"float division by zero on example 0 \(id '[\w-]+'\)$"):
    main.run(broken, other)
  assert checkpoint.latest_step(f"{other}/grpo/checkpoints") is None  # Nothing trained or kept.
