"""The packages of rlhfjax import in one direction (docs/design.md, "Layers"; .importlinter)."""

import ast
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Imports that stay inside a function because they need an optional extra, not to dodge a cycle.
OPTIONAL = {("rlhfjax/labeling/tasks.py", "rlhfjax.labeling.guidelines"),  # The label extra.
            ("rlhfjax/labeling/tasks.py", "rlhfjax.labeling.server")}


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
  assert "1 kept, 0 broken" in out.stdout
