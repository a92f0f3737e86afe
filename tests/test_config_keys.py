"""One place for each default: the config (#56). Every shipped config (configs/*.py with each of its
documented options) defines the keys the code reads; the code reads those plainly, with no `.get`
default of its own that a reader would have to weigh against the config's; and a key a config
lacks ends the run in one line naming it. Static: no JAX computation."""

from __future__ import annotations

import ast
import functools
import itertools
import pathlib

import ml_collections
import pytest

from rlhfjax import config_check, config_file, main
from rlhfjax.errors import ConfigError
from rlhfjax.models import architectures

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Each config file's documented arguments (its docstring and get_config(arg)).
OPTIONS = {
    "tldr_sim": ["", "tiny"], "labeling": ["", "tiny"], "alpaca": ["", "tiny"],
    "hh_rlhf": ["", "tiny"], "ultrafeedback": ["", "tiny"], "openai_tldr": ["", "tiny"],
    "llama3_8b_tldr": [""],
    "smollm2_tldr_sim": [",".join(s) for n in range(4)
                         for s in itertools.combinations(("bf16", "remat", "tiny"), n)],
    "verifiable": ["", "tiny", "smollm2", "tiny,smollm2"],
    "tldr_scale": list(architectures.ARCHITECTURES),
}

# Names the code gives a config block (or the whole config).
CONFIG_NAMES = {"c", "cfg", "config", "block", "mcfg", "model_block", "reward", "rm", "r", "e"}
# ConfigDict methods, not keys.
METHODS = {"get", "items", "keys", "values", "to_dict", "update", "get_ref", "lock", "unlock",
           "to_json", "to_json_best_effort", "copy_and_resolve_references", "ignore_type",
           "unlocked", "is_locked", "is_type_safe"}

# The `.get` reads kept on purpose, each for a key some shipped config lacks, or that is a key of
# a block every config defines but whose reader also serves a block without it:
KEPT = {
    # data.*: the block's keys depend on data.source (each source's own optional keys).
    ("rlhfjax/sources/loading.py", "train_file"),
    # minibatch_size: online_dpo's block has none (one update of the whole batch).
    ("rlhfjax/algorithms/online.py", "minibatch_size"),
    # kto.layout: only the configs of TRL-layout files set it; the kto block is in the run's meta, so
    # a new key in tldr_sim.py would refuse resuming a kto run started before.
    ("rlhfjax/algorithms/kto.py", "layout"),
    # Not a config: a row of the compile report.
    ("rlhfjax/stages/compile_report.py", "layout"),
}


def _leaves(config, prefix=""):
  for key, value in config.items():
    yield prefix + key
    if isinstance(value, (dict, ml_collections.ConfigDict)):
      yield from _leaves(value, f"{prefix}{key}.")


@functools.cache
def shipped() -> dict[str, set[str]]:
  """Every shipped config's key paths, by 'file:option'."""
  return {f"{name}:{option}": set(_leaves(config_file.load(str(ROOT / "configs" / f"{name}.py"),
                                                          option or None)))
          for name, options in OPTIONS.items() for option in options}


@functools.cache
def common() -> frozenset[str]:
  """The key paths every shipped config defines."""
  return frozenset(set.intersection(*shipped().values()))


def _block_path(node: ast.AST) -> str | None:
  """'' for an expression that is the config (`config`, `exp.config`, `self.config`), 'X.Y' for
  `config.X.Y`; None for anything else."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if isinstance(node, ast.Name) and node.id == "config":
    pass
  elif parts and parts[-1] == "config":
    parts.pop()
  else:
    return None
  if any(p in METHODS for p in parts):
    return None
  return ".".join(reversed(parts))


def fallbacks(source: str, module: str = "<snippet>") -> list[str]:
  """The `.get("key", ...)` / `getattr(block, "key", ...)` reads in `source` on a config block for
  a key every shipped config defines, as 'module:line: expression'."""
  keys = common()
  leaf_names = {k.rsplit(".", 1)[-1] for k in keys}
  out = []
  for node in ast.walk(ast.parse(source)):
    if not isinstance(node, ast.Call) or not node.args:
      continue
    if isinstance(node.func, ast.Attribute) and node.func.attr == "get":
      receiver, key = node.func.value, node.args[0]
    elif isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) == 3:
      receiver, key = node.args[0], node.args[1]
    else:
      continue
    if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
      continue
    path = _block_path(receiver)
    if path is not None:
      found = (f"{path}.{key.value}" if path else key.value) in keys
    else:
      found = (isinstance(receiver, ast.Name) and receiver.id in CONFIG_NAMES
               and key.value in leaf_names)
    if found and (module, key.value) not in KEPT:
      out.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
  return out


def _modules():
  for path in sorted((ROOT / "rlhfjax").rglob("*.py")):
    yield path.relative_to(ROOT).as_posix(), path.read_text()


def test_every_shipped_config_loads_with_each_option():
  assert len(shipped()) == sum(map(len, OPTIONS.values()))
  for block in ("sft", "rm", "ppo", "grpo", "dpo", "kto", "quark", "rollout", "lora", "remat",
                "runtime", "reward"):
    assert block in common(), block
  assert {"sft.skip_nonfinite", "ppo.truncated_is", "rollout.cache_block"} <= common()


def test_no_code_default_for_a_key_every_config_defines():
  found = [f for module, text in _modules() for f in fallbacks(text, module)]
  assert not found, "read these plainly (every shipped config defines them):\n" + "\n".join(found)


def test_the_walker_finds_a_reintroduced_fallback():
  assert fallbacks('c.get("skip_nonfinite", 0)')
  assert fallbacks('exp.config.get("rollout", {})')
  assert fallbacks('config.model.get("dtype", "float32")')
  assert fallbacks('getattr(c, "truncated_is", False)')
  assert not fallbacks('config.model.get("init_from")')  # Optional: some configs lack it.
  assert not fallbacks('row.get("skip_nonfinite", 0)')  # Not a config block.


def _function_blocks(tree: ast.AST):
  """(name, block path, function) for each `name = <config>.X...` in a function."""
  for fn in ast.walk(tree):
    if not isinstance(fn, (ast.FunctionDef, ast.Lambda)) or isinstance(fn, ast.Lambda):
      continue
    for node in ast.walk(fn):
      if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
          isinstance(node.targets[0], ast.Name):
        path = _block_path(node.value)
        if path:
          yield node.targets[0].id, path, fn


def plain_reads(source: str) -> set[str]:
  """The key paths `source` reads as `config.X.Y`, `exp.config.X.Y`, or `c.Y` after
  `c = config.X` in the same function."""
  tree = ast.parse(source)
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Store):
      path = _block_path(node)
      if path:
        out.add(path)
  for name, block, fn in _function_blocks(tree):
    for node in ast.walk(fn):
      if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
          node.value.id == name and node.attr not in METHODS and isinstance(node.ctx, ast.Load):
        out.add(f"{block}.{node.attr}")
  return out


def test_every_plain_config_read_is_in_every_shipped_config():
  keys, missing = common(), {}
  unions = set.union(*shipped().values())
  for module, text in _modules():
    for path in plain_reads(text):
      # Only paths into a block: a leaf value's attributes (a string's .split) are not keys.
      parent = path.rsplit(".", 1)[0] if "." in path else ""
      if parent and parent not in unions:
        continue
      if path in unions and path not in keys:
        missing.setdefault(path, []).append(module)
  assert not missing, f"read plainly but some shipped config lacks them: {missing}"


def test_a_missing_key_is_one_config_error_naming_it(tmp_path):
  config = config_file.load(str(ROOT / "configs" / "tldr_sim.py"), "tiny")
  del config.model["dtype"]
  with pytest.raises(ConfigError, match=r"^config key model\.dtype is missing"):
    main.run(config, str(tmp_path))
  config = config_file.load(str(ROOT / "configs" / "tldr_sim.py"), "tiny")
  with pytest.raises(AttributeError) as raised:
    _ = config.sft.skip_nonfinit
  assert str(config_check.missing_key(raised.value, config)).startswith(
      "config key sft.skip_nonfinit is missing")
