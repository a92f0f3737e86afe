"""Pairs (or single responses) to label, from files the pipeline already writes (`labeling.source`,
`;`-separated):

- `methods:A,B`: two methods' answers to the same test prompts (`<workdir>/<method>/outputs.json`,
  e.g. `methods:sft,ppo`), paired by prompt id; the prompts come from the config's data;
- `outputs:PATH_A,PATH_B`: two outputs files from anywhere, either rlhfjax's `outputs.json`
  (prompts from the config's data) or AlpacaEval's model outputs (a JSON array of `instruction`,
  `input`, `output`, `generator`), paired by prompt;
- `comparisons:PATH`: the pairs of a comparison file in `labeling.layout` (its labels are not
  shown or used).

`labeling.gold_file`, a comparison file in the same layout, adds gold pairs: their recorded choice
(or tie) is the known answer labelers are checked against. A pair's A is the first system's
response. Pairs whose two responses are equal are left out (nothing to compare). Each pair has a
stable id, so loading the same files again adds nothing twice. Pairs without a split of their own
are given one when queued (`queue`): `labeling.valid_fraction` of them go to `valid`; valid pairs,
given or their own, are spread evenly through the queue, so every served prefix, and so a round of
any size, holds train and valid pairs in proportion.

A one-response protocol (`binary`) queues every response of the same sources as an item of its
own (its B empty; an empty response is left out): `methods:` and `outputs:` take one or more
methods or files, `comparisons:PATH` gives both responses of each pair, and `binary:PATH` the
responses of a binary-layout file (its labels neither shown nor used). Its `labeling.gold_file` is
in the binary layout, each record's label the known answer (1: thumbs up).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from typing import Any, Callable, Iterable, Mapping, Sequence

from rlhfjax.data import pipeline
from rlhfjax.data import records
from rlhfjax.errors import ConfigError, DataError
from rlhfjax.sources import loading


def _uid(prompt_key: str, a: str, b: str) -> str:
  return hashlib.sha256(json.dumps([prompt_key, a, b]).encode("utf-8")).hexdigest()[:24]


def _nth_is_valid(j: int, fraction: float) -> bool:
  """Whether the j-th of a run holding `fraction` valid is valid: round((j + 1) f) > round(j f),
  so the first n hold round(n f) (f = 0.1: the 5th, 15th, 25th, ...)."""
  return math.floor((j + 1) * fraction + 0.5) > math.floor(j * fraction + 0.5)


def queue(pairs: Sequence[dict[str, Any]], valid_fraction: float) -> list[dict[str, Any]]:
  """The pairs in the order they will be served, each with a split: pairs without one of their own
  get `valid_fraction` valid, and valid pairs (their own or given) are spread evenly among the
  train pairs, so every served prefix, and so a round of any size, holds both in proportion.
  Gold pairs (served at random, never exported) keep their place at the end."""
  free = [p for p in pairs if not p["split"]]
  for j, p in enumerate(free):
    p["split"] = "valid" if _nth_is_valid(j, valid_fraction) else "train"
  served = [p for p in pairs if p["gold"] is None]
  valid = [p for p in served if p["split"] == "valid"]
  train = [p for p in served if p["split"] != "valid"]
  fraction = len(valid) / max(len(served), 1)
  order = [(valid if _nth_is_valid(i, fraction) else train) for i in range(len(served))]
  picks = {id(valid): iter(valid), id(train): iter(train)}
  return [next(picks[id(side)]) for side in order] + [p for p in pairs if p["gold"] is not None]


def item(prompt: Mapping[str, str], a: str, b: str, policy_a: str, policy_b: str,
         split: str = "", gold: float | None = None) -> dict[str, Any]:
  """A pair as `store.add_items` takes it once it has a split (`queue`); `prompt` holds
  `comparison_prompt`'s fields."""
  key = prompt.get("id") or json.dumps([prompt.get("prompt"), prompt.get("input", "")])
  uid = _uid(key + ("#gold" if gold is not None else ""), a, b)
  return {"uid": uid, "prompt": prompt["prompt"], "title": prompt.get("title", ""),
          "subreddit": prompt.get("subreddit", ""), "input": prompt.get("input", ""),
          "response_a": a, "response_b": b, "policy_a": policy_a, "policy_b": policy_b,
          "prompt_id": prompt.get("id", ""), "split": split, "gold": gold}


def _read_json(path: str) -> Any:
  if not os.path.exists(path):
    raise FileNotFoundError(f"labeling.source: {path} does not exist")
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise DataError(f"{path}: not a JSON file ({e})") from None


def _outputs(path: str, prompts: Callable[[], Mapping[str, Mapping[str, str]]]
             ) -> tuple[str, dict[str, tuple[Mapping[str, str], str]]]:
  """(system name, {prompt key: (prompt fields, output)}) of an outputs file."""
  data = _read_json(path)
  out = {}
  if isinstance(data, dict) and isinstance(data.get("outputs"), list):  # rlhfjax's outputs.json
    known = prompts()
    for n, row in enumerate(data["outputs"]):
      if not isinstance(row, dict) or not isinstance(row.get("output"), str):
        raise DataError(f"{path}: outputs[{n}] has no text 'output'")
      if row.get("id") not in known:
        raise DataError(f"{path}: outputs[{n}] answers prompt {row.get('id')!r}, which the "
                        "config's data does not hold (use the config the outputs came from)")
      out[row["id"]] = (known[row["id"]], row["output"])
    return str(data.get("method") or os.path.basename(os.path.dirname(path))), out
  if isinstance(data, list):  # AlpacaEval's model outputs
    name = ""
    for n, row in enumerate(data):
      if not isinstance(row, dict) or not isinstance(row.get("instruction"), str) or \
          not isinstance(row.get("output"), str):
        raise DataError(f"{path}: record {n + 1} (index {n}) needs text 'instruction' and 'output'")
      prompt = {"prompt": row["instruction"], "input": str(row.get("input") or "")}
      out[json.dumps([prompt["prompt"], prompt["input"]])] = (prompt, row["output"])
      name = name or str(row.get("generator") or "")
    return name or os.path.splitext(os.path.basename(path))[0], out
  raise DataError(f"{path}: neither rlhfjax's outputs.json (an object with 'outputs') nor "
                  "AlpacaEval's model outputs (an array of objects)")


def _single_outputs(paths: Sequence[str], prompts) -> list[dict]:
  """Each answer of each outputs file as an item of its own."""
  out = []
  for path in paths:
    name, answers = _outputs(path, prompts)
    out += [item(prompt, text, "", name, "") for prompt, text in answers.values()]
  return out


def _pair_outputs(path_a: str, path_b: str, prompts) -> list[dict]:
  (name_a, a), (name_b, b) = _outputs(path_a, prompts), _outputs(path_b, prompts)
  common = [key for key in a if key in b]
  if not common:
    raise DataError(f"{path_a} and {path_b} answer no prompt in common")
  return [item(a[key][0], a[key][1], b[key][1], name_a, name_b) for key in common]


SPLITS = {"train": "train", "valid1": "valid", "valid2": "valid", "valid": "valid"}


def from_comparisons(comps: Iterable[records.Comparison], gold: bool = False) -> list[dict]:
  """Pairs of comparison records (in their own split, if it has one); with `gold`, their choices
  are the known answers."""
  out = []
  for c in comps:
    prompt = {"id": c.id, "prompt": c.prompt, "title": c.title, "subreddit": c.subreddit,
              "input": c.input}
    known = (0.5 if c.tie else float(c.choice)) if gold else None
    out.append(item(prompt, c.response_a, c.response_b, c.policy_a, c.policy_b,
                    SPLITS.get(c.split, ""), known))
  return out


def from_feedback(feedback: Iterable[records.Feedback], gold: bool = False) -> list[dict]:
  """One-response items of binary feedback records (in their own split); with `gold`, their labels
  are the known answers."""
  return [item({"id": f.id, "prompt": f.prompt, "title": f.title, "subreddit": f.subreddit,
                "input": f.input}, f.completion, "", f.policy, "", SPLITS.get(f.split, ""),
               float(f.label) if gold else None) for f in feedback]


def _singles(pairs: Iterable[dict]) -> list[dict]:
  """Each response of `pairs` as a one-response item."""
  prompt = lambda p: {"id": p["prompt_id"], **{k: p[k] for k in ("prompt", "title", "subreddit",
                                                                  "input")}}
  return [item(prompt(p), p[f"response_{x}"], "", p[f"policy_{x}"], "", p["split"])
          for p in pairs for x in "ab"]


def load(config, workdir: str, single: bool = False) -> list[dict]:
  """Every pair named by `labeling.source` and `labeling.gold_file`, in order (splits not yet
  assigned); with `single` (a one-response protocol), every response as an item of its own."""
  c = config.labeling
  cache: dict[str, Any] = {}

  def prompts() -> Mapping[str, Mapping[str, str]]:
    if "prompts" not in cache:
      splits = loading.load_splits(config.data)
      cache["prompts"] = {e.id: pipeline.comparison_prompt(e)
                          for split in splits.values() for e in split}
    return cache["prompts"]

  pairs: list[dict] = []
  for source in filter(None, (s.strip() for s in c.source.split(";"))):
    kind, _, arg = source.partition(":")
    parts = [p.strip() for p in arg.split(",")]
    if kind == "methods" and (len(parts) == 2 or single and all(parts)):
      paths = [os.path.join(workdir, m, "outputs.json") for m in parts]
      pairs += _single_outputs(paths, prompts) if single else _pair_outputs(*paths, prompts)
    elif kind == "outputs" and (len(parts) == 2 or single and all(parts)):
      pairs += _single_outputs(parts, prompts) if single else _pair_outputs(*parts, prompts)
    elif kind == "comparisons" and arg:
      found = from_comparisons(_comparisons(arg, c.layout))
      pairs += _singles(found) if single else found
    elif kind == "binary" and arg and single:
      pairs += from_feedback(_feedback(arg))
    else:
      expected = ("methods:A[,B...], outputs:PATH[,PATH...], comparisons:PATH or binary:PATH"
                  if single else "methods:A,B, outputs:PATH_A,PATH_B or comparisons:PATH")
      raise ConfigError(f"labeling.source: cannot read {source!r} under the {c.protocol} "
                        f"protocol (expected {expected})")
  if c.gold_file:
    pairs += (from_feedback(_feedback(c.gold_file), gold=True) if single else
              from_comparisons(_comparisons(c.gold_file, c.layout), gold=True))
  kept = [p for p in pairs if p["response_a"].strip() != p["response_b"].strip()]
  if not kept:
    what = "non-empty response" if single else "pair with two different responses"
    raise ConfigError(f"labeling.source: no {what} to load")
  return kept


def _comparisons(path: str, layout: str) -> Sequence[records.Comparison]:
  if not os.path.exists(path):
    raise FileNotFoundError(f"comparisons file not found: {path}")
  return records.read_strict(path, layout)


def _feedback(path: str) -> Sequence[records.Feedback]:
  if not os.path.exists(path):
    raise FileNotFoundError(f"binary feedback file not found: {path}")
  return records.read_binary_strict(path)
