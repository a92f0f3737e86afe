"""The packages of rlhfjax import in one direction (docs/design.md, "Layers"; .importlinter)."""

import ast
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Imports that stay inside a function because they need an optional extra, not to dodge a cycle.
OPTIONAL = {("rlhfjax/labeling/tasks.py", "rlhfjax.labeling.guidelines"),  # The label extra.
            ("rlhfjax/labeling/tasks.py", "rlhfjax.labeling.server"),
            ("rlhfjax/labeling/tasks.py", "rlhfjax.labeling.site")}


def _function_level_imports() -> set[tuple[str, str]]:
  found = set()
  for folder, _, names in os.walk(os.path.join(ROOT, "rlhfjax")):
    for name in names:
      if not name.endswith(".py"):
        continue
      path = os.path.join(folder, name)
      tree = ast.parse(open(path, encoding="utf-8").read(), path)
      for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
          continue
        for node in ast.walk(fn):
          modules = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) and node.module else [])
          found.update((os.path.relpath(path, ROOT), m) for m in modules
                       if m.startswith("rlhfjax"))
  return found


def test_no_import_of_rlhfjax_inside_a_function_but_optional_extras():
  assert _function_level_imports() - OPTIONAL == set()


def test_the_layers_contract_is_kept():
  exe = shutil.which("lint-imports")
  if exe is None:
    pytest.fail("lint-imports is missing: pip install -e '.[test]' installs import-linter")
  out = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
  assert "2 kept, 0 broken" in out.stdout  # The layers, and algorithms apart but for shared math.


# What loading looks like by name: a loader (training/loaders.py, rollout/rewards.py) or a
# restore target. A method reaches another only for its math or its loop (.importlinter).
IO = re.compile(r"^_?(load|restore|read|save|write)|_(files?|template|checkpoints?)$")


PACKAGE = "rlhfjax.algorithms."


def _names_read_across_algorithms() -> set[tuple[str, str]]:
  """(file, "other.name") for each name an algorithm module reads from another."""
  found = set()
  folder = os.path.join(ROOT, "rlhfjax", "algorithms")
  for name in sorted(os.listdir(folder)):
    if not name.endswith(".py"):
      continue
    path = os.path.join(folder, name)
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    aliases = {}
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and node.module == "rlhfjax.algorithms":
        aliases.update({a.asname or a.name: a.name for a in node.names})
      elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
        found.update((name, f"{node.module[len(PACKAGE):]}.{a.name}") for a in node.names)
      elif isinstance(node, ast.Import):
        aliases.update({a.asname: a.name[len(PACKAGE):] for a in node.names
                        if a.asname and a.name.startswith(PACKAGE)})
    found.update((name, f"{aliases[node.value.id]}.{node.attr}") for node in ast.walk(tree)
                 if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                 and node.value.id in aliases)
  return found


def test_no_algorithm_loads_through_another():
  """The import-linter contract bounds which algorithm imports which; this keeps the allowed
  imports to math and loops: nothing an algorithm reads from another is named like a loader."""
  uses = _names_read_across_algorithms()
  assert {"sft.train", "dpo.dpo_loss", "ppo.whiten"} <= {u for _, u in uses}  # The walk sees them.
  assert {(f, u) for f, u in uses if IO.search(u.split(".", 1)[1])} == set()
