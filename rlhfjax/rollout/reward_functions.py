"""Reward functions beside or instead of the reward model, as TRL's `reward_funcs` take them.

`reward.functions` names each as `module:function` (an importable module, or a `.py` file's path)
and `reward.weights` weights them (all 1.0 when empty). A function is called once per sampled
batch with keywords, as TRL calls its reward functions:

  fn(prompts=[...], completions=[...], completion_ids=[[...], ...], **columns) -> [float | None]

`prompts` are the prompts as the examples hold them (the text, or the messages of a conversational
record); `completions` the decoded responses (text; `[{"role": "assistant", "content": ...}]` after
a conversational prompt); `completion_ids` the response tokens before eos; `columns` every other
field of the examples as lists (a TRL file's extra columns: an answer, a test; the simulated
world's post fields). It returns one number per completion (a float, an int or a bool, NumPy's
or JAX's too, or an array of them), or None where it has nothing to say. Where the completions
were decoded from samples kept only as text (best-of-N, expert iteration, pass@k, the held-out
score), `completion_ids` are that text encoded again.

The reward of a completion is the weighted sum of the functions' values, None counting 0 (TRL's
`nansum`), plus `reward.model_weight` times the reward model's score (0: no reward model at all,
and no labels or reward-model stage before the method). An exception, a result of the wrong length,
a value that is neither a number nor None, or a NaN stops the run with a `RewardFunctionError`
naming the function and the example, before the step that would have used it: nothing is written
for that iteration.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import os
import sys
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from rlhfjax.errors import ConfigError

# The example fields that are the prompt or the response, not columns a function receives.
_NOT_COLUMNS = ("messages", "reference", "extra")


class RewardFunctionError(RuntimeError):
  """A reward function failed on an example: the run stops before using its batch."""


@dataclasses.dataclass(frozen=True)
class RewardFunction:
  name: str  # The function's __name__, as TRL logs `rewards/<name>/mean`.
  ref: str  # `module:function` as the config gives it.
  weight: float
  fn: Callable[..., Sequence[float | None]]


def _import(ref: str) -> Callable[..., Any]:
  """The function `ref` names: `package.module:function` or `path/to/file.py:function`."""
  if ":" not in ref:
    raise ConfigError(f"reward.functions: {ref!r} is not 'module:function' or 'file.py:function'")
  where, name = ref.rsplit(":", 1)
  if where.endswith(".py"):
    if not os.path.exists(where):
      raise ConfigError(f"reward.functions: {ref!r}: no file {where}")
    module_name = "rlhfjax_reward_" + os.path.splitext(os.path.basename(where))[0]
    spec = importlib.util.spec_from_file_location(module_name, where)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # Pickling and dataclasses need the module registered.
    spec.loader.exec_module(module)
  else:
    try:
      module = importlib.import_module(where)
    except ImportError as e:
      raise ConfigError(f"reward.functions: {ref!r}: cannot import {where}: {e}") from e
  fn = getattr(module, name, None)
  if not callable(fn):
    raise ConfigError(f"reward.functions: {ref!r}: {where} has no function {name!r}")
  return fn


def _split(value: Any) -> list[str]:
  """A comma-separated string or a sequence, as a list of non-empty stripped strings."""
  items = value.split(",") if isinstance(value, str) else list(value or ())
  return [str(s).strip() for s in items if str(s).strip()]


def load(reward: Mapping[str, Any]) -> tuple[RewardFunction, ...]:
  """The functions of the config block `reward` (`functions`, `weights`), checked."""
  refs = _split(reward["functions"])
  weights = [float(w) for w in _split(reward["weights"])] or [1.0] * len(refs)
  if len(weights) != len(refs):
    raise ConfigError(f"reward.weights has {len(weights)} weights for {len(refs)} functions "
                      "(reward.functions)")
  out = tuple(RewardFunction(getattr(fn, "__name__", ref), ref, w, fn)
              for ref, w, fn in ((r, w, _import(r)) for r, w in zip(refs, weights)))
  names = [f.name for f in out]
  if len(set(names)) != len(names):
    raise ConfigError(f"reward.functions: two functions share a name ({', '.join(names)}): their "
                      "logs would collide")
  if float(reward["model_weight"]) == 0.0 and not out:
    raise ConfigError("reward.model_weight=0 leaves no reward: name reward.functions")
  return out


def uses_model(reward: Mapping[str, Any]) -> bool:
  """Whether the reward model's score is part of the reward (`reward.model_weight` not 0)."""
  return float(reward["model_weight"]) != 0.0


def _example_id(example: Any, i: int) -> str:
  return f"example {i} (id {getattr(example, 'id', '?')!r})"


def columns(examples: Sequence[Any]) -> dict[str, list[Any]]:
  """Every field of the examples other than their prompt and response, as lists: a TRL record's
  extra columns, a dataclass example's fields (the simulated world's post, title, ...)."""
  rows = []
  for e in examples:
    row = dict(getattr(e, "extra", None) or {})
    if dataclasses.is_dataclass(e):
      row.update({f.name: getattr(e, f.name) for f in dataclasses.fields(e)
                  if f.name not in _NOT_COLUMNS and f.name not in row})
    rows.append(row)
  names = sorted({k for row in rows for k in row} - {"prompts", "completions", "completion_ids"})
  return {k: [row.get(k) for row in rows] for k in names}


def _prompt(example: Any) -> Any:
  messages = getattr(example, "messages", None)
  if messages is not None:
    return [{"role": r, "content": c} for r, c in messages]
  return getattr(example, "prompt", None) or getattr(example, "post", "")


def _call(f: RewardFunction, kwargs: dict[str, list[Any]], examples: Sequence[Any],
          offset: int = 0) -> list[Any]:
  """`f` on the batch; on an exception, on each example alone to name the one that raises."""
  try:
    return list(f.fn(**kwargs))
  except Exception as e:  # pylint: disable=broad-except
    for i in range(len(examples)):
      try:
        f.fn(**{k: v[i:i + 1] for k, v in kwargs.items()})
      except Exception as each:  # pylint: disable=broad-except
        raise RewardFunctionError(
            f"reward function {f.name!r} ({f.ref}) raised {type(each).__name__}: {each} on "
            f"{_example_id(examples[i], offset + i)}") from each
    raise RewardFunctionError(f"reward function {f.name!r} ({f.ref}) raised "
                              f"{type(e).__name__}: {e} on a batch of {len(examples)} examples "
                              "(on none of them alone)") from e


def evaluate(functions: Sequence[RewardFunction], examples: Sequence[Any],
             completions: Sequence[str], completion_ids: Sequence[Sequence[int]]
             ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
  """(the weighted sum [B] float32, each function's values [B] with NaN for None)."""
  n = len(completions)
  conversational = [getattr(e, "messages", None) is not None for e in examples]
  kwargs = {"prompts": [_prompt(e) for e in examples],
            "completions": [[{"role": "assistant", "content": t}] if conv else t
                            for t, conv in zip(completions, conversational, strict=True)],
            "completion_ids": [list(map(int, ids)) for ids in completion_ids],
            **columns(examples)}
  total = np.zeros((n,), np.float64)
  values = {}
  for f in functions:
    got = _call(f, kwargs, examples)
    if len(got) != n:
      raise RewardFunctionError(f"reward function {f.name!r} ({f.ref}) returned {len(got)} values "
                                f"for {n} completions")
    out = np.full((n,), np.nan)
    for i, v in enumerate(got):
      if v is None:
        continue
      if not _is_number(v):
        raise RewardFunctionError(f"reward function {f.name!r} ({f.ref}) returned {v!r} (not a "
                                  f"number or None) for {_example_id(examples[i], i)}")
      if not math.isfinite(float(v)):
        raise RewardFunctionError(f"reward function {f.name!r} ({f.ref}) returned {v} for "
                                  f"{_example_id(examples[i], i)}")
      out[i] = float(v)
    values[f.name] = out
    total += f.weight * np.nan_to_num(out, nan=0.0)
  return total.astype(np.float32), values


def _is_number(v: Any) -> bool:
  """A Python, NumPy or JAX real number or bool (True 1, False 0: TRL's `torch.tensor` reads
  them so), or a 0-d array of one: what a function may return per completion, an array of them
  included (each element is a 0-d array)."""
  if isinstance(v, (bool, int, float, np.bool_, np.integer, np.floating)):
    return True
  dtype = getattr(v, "dtype", None)
  return (dtype is not None and getattr(v, "ndim", None) == 0 and
          (np.issubdtype(dtype, np.number) or np.issubdtype(dtype, np.bool_)) and
          not np.issubdtype(dtype, np.complexfloating))


def statistics(values: Mapping[str, np.ndarray]) -> dict[str, float]:
  """`rewards/<name>/mean` and `/std` of each function over the completions it scored (TRL's
  names); NaN where it scored none."""
  out = {}
  for name, v in values.items():
    scored = v[~np.isnan(v)]
    out[f"rewards/{name}/mean"] = float(scored.mean()) if scored.size else float("nan")
    out[f"rewards/{name}/std"] = float(scored.std()) if scored.size else float("nan")
  return out
