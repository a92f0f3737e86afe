"""One program per method (DESIGN.md, "Compile what trains"): each method's update step is jitted
in one place, its builder, and task=compile takes it from there, LoRA adapters and all."""

import pathlib
import re

import jax

from conftest import ROOT
from rlhfjax.data import tokenizer
from rlhfjax.models import lora
from rlhfjax.parallel.sharding import Parallel
from rlhfjax.stages import compile as compile_task
from rlhfjax.training import experiment

# A jit of an update step: `.jit(functools.partial(train_step, ...` (a module's own step or the
# one a shared builder is handed).
_JIT_STEP = re.compile(r"\.jit\(\s*functools\.partial\(\s*(?:\w+\.)?train_step\b")
# The one builder of each method's update step (online.py's builds every critic-free method's;
# program.py's `against_reference` DPO's, SimPO's, KTO's and Quark's).
BUILDERS = {"algorithms/sft.py", "algorithms/reward_model.py", "training/program.py",
            "algorithms/ppo.py", "algorithms/online.py"}


def test_each_update_step_is_jitted_in_one_place():
  package = pathlib.Path(ROOT) / "rlhfjax"
  found = {}
  for path in package.rglob("*.py"):
    n = len(_JIT_STEP.findall(path.read_text()))
    if n:
      found[str(path.relative_to(package))] = n
  assert found == dict.fromkeys(BUILDERS, 1)


def test_compile_lowers_the_adapters_of_a_lora_config(tiny_config):
  """task=compile's steps of a config with a `lora` block are the builders' programs: their
  lowered arguments hold the adapters (and no reference tree: the LoRA policy's base is it)."""
  c = tiny_config
  c.lora.update(rank=4)
  cfg = compile_task.model_config(c)
  par = Parallel.from_config(c.mesh)
  steps = {s.name: s for s in compile_task.steps(c, cfg, par, ("sft", "dpo", "ppo_update",
                                                               "grpo_update"))}
  for name, step in steps.items():
    lowered = step.fn.lower(*step.args)
    paths = [jax.tree_util.keystr(p) for p, _ in
             jax.tree_util.tree_flatten_with_path(lowered.args_info)[0]]
    assert any(f"'{lora.KEY}'" in p for p in paths), name
  assert steps["ppo_update"].args[1] is None and steps["dpo"].args[1] is None
  # No tokenizer here: the eos ids the run's would have (the project's own tokenizer's).
  exp = experiment.Experiment(c, "", {}, None, cfg, par)
  assert exp.eos_ids == experiment.eos_ids(c) == (tokenizer.EOS_ID,)
