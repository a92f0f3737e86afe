"""task=pass_at_k: the verifiable task's leaderboard, pass@1 and pass@k with confidence intervals.

Each method of `eval.methods` answered every test prompt `eval.pass_k` times (`outputs.pass_counts`,
when it finished), and `eval.correct` marked each answer. Per prompt with c right of n samples,
pass@k is the unbiased estimate 1 - C(n - c, k) / C(n, k) of Chen et al. (2021, "Evaluating Large
Language Models Trained on Code"); pass@1 is c / n. A method's figure is the mean over prompts, with
a 95% interval of ± 1.96 standard errors across prompts (the prompts are the independent units;
the samples of one prompt are not). Against the first method (SFT), a paired one-sided t-test over
prompts gives the p-value that the method's pass@1 is not higher.

Writes `<workdir>/pass_at_k/leaderboard.{md,json}`.
"""

from __future__ import annotations

import math
import os
from typing import Any, Sequence

import numpy as np

from rlhfjax.errors import ConfigError
from rlhfjax.rollout import outputs
from rlhfjax.training import experiment
from rlhfjax.training import metrics as metrics_lib


def pass_at_k(n: int, c: np.ndarray, k: int) -> np.ndarray:
  """Per prompt, the unbiased pass@k of c right answers among n samples (k <= n)."""
  if not 1 <= k <= n:
    raise ValueError(f"pass@{k} needs 1 <= k <= n = {n}")
  return np.array([1.0 - (math.comb(n - int(ci), k) / math.comb(n, k)) for ci in c])


def summarize(counts: dict[str, tuple[int, Sequence[int]]]) -> list[dict[str, Any]]:
  """A row per method ({method: (n, right counts per prompt)}, the baseline first): pass@1 and
  pass@k for k = n with their 95% half-widths, and pass@1's one-sided paired p-value against the baseline."""
  rows, base = [], None
  for method, (n, c) in counts.items():
    c = np.asarray(c)
    p1, pk = pass_at_k(n, c, 1), pass_at_k(n, c, n)
    half = lambda x: 1.96 * float(x.std(ddof=1)) / math.sqrt(len(x)) if len(x) > 1 else float("nan")
    row = {"method": method, "prompts": len(c), "n": n, "pass@1": float(p1.mean()),
           "pass@1_ci": half(p1), "pass@k": float(pk.mean()), "pass@k_ci": half(pk), "k": n}
    if base is None:
      base = p1
    else:
      if len(base) != len(p1):
        raise ConfigError(f"{method} answered {len(p1)} prompts, the baseline {len(base)}")
      diff = p1 - base
      # scipy.stats is imported here, not with the module: it adds a second and a half to every
      # start of `python -m rlhfjax.main`, and only this leaderboard uses it.
      from scipy import stats  # pylint: disable=g-import-not-at-top
      row["p_vs_first"] = (float(stats.ttest_rel(p1, base, alternative="greater").pvalue)
                           if diff.std() > 0 else (0.0 if diff.mean() > 0 else 1.0))
    rows.append(row)
  return rows


def markdown(rows: Sequence[dict[str, Any]]) -> str:
  first = rows[0]["method"] if rows else ""
  lines = ["| method | pass@1 (%) | pass@k (%) | k | p (pass@1 > " + first + ") |",
           "|---|---:|---:|---:|---:|"]
  for r in rows:
    p = r.get("p_vs_first")
    lines.append(f"| {r['method']} | {100 * r['pass@1']:.1f} ± {100 * r['pass@1_ci']:.1f} | "
                 f"{100 * r['pass@k']:.1f} ± {100 * r['pass@k_ci']:.1f} | {r['k']} | "
                 + ("" if p is None else f"{p:.2g}") + " |")
  return "\n".join(lines) + "\n"


def run(config, workdir: str) -> list[dict[str, Any]]:
  exp = experiment.prepare(config, workdir)
  methods = [m.strip() for m in config.eval.methods.split(",") if m.strip()]
  counts = {}
  for method in methods:
    saved = outputs.load(exp.workdir, method)
    if "pass" not in saved:
      raise ConfigError(f"{outputs.path(exp.workdir, method)} has no pass counts: rerun "
                        f"task={method} with eval.pass_k > 0 and eval.correct set")
    counts[method] = (int(saved["pass"]["n"]), saved["pass"]["correct"])
  rows = summarize(counts)
  out_dir = exp.task_dir("pass_at_k")
  experiment.write_json(os.path.join(out_dir, "leaderboard.json"), rows)
  table = markdown(rows)
  experiment.write_text(os.path.join(out_dir, "leaderboard.md"), table)
  metrics_lib.info("pass@k leaderboard:\n" + table)
  return rows
