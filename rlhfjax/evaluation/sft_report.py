"""The SFT policy's report (the second half of task=sft): its test answers against the reference
and the extractive baselines on gold reward (simulated world) and ROUGE-L, in
`<workdir>/sft/eval.json` and `eval.md`."""

from __future__ import annotations

from typing import Any

from rlhfjax.evaluation import summaries
from rlhfjax.rollout import outputs
from rlhfjax.training import experiment
from rlhfjax.training import metrics as metrics_lib


def run(config, workdir: str) -> dict[str, Any]:
  """Reports on `<workdir>/sft/outputs.json` (written by `sft.run`)."""
  exp = experiment.prepare(config, workdir)
  e = exp.config.eval
  if e.num_examples <= 0:
    return {}
  stored = outputs.load(exp.workdir, "sft")
  examples = outputs.test_examples(exp)
  texts = [o["output"] for o in stored["outputs"]]
  rows = summaries.summary_table(examples, {"sft": texts, **summaries.baseline_summaries(examples)})
  table = summaries.format_table(rows)
  for ex, text in list(zip(examples, texts))[:e.show]:
    metrics_lib.info(f"\nPOST: {ex.post}\nSFT SAMPLE: {text}\nREFERENCE: {ex.reference}")
  metrics_lib.info(f"\nSFT samples on {len(examples)} test prompts "
                   f"(sampling temperature {stored['temperature']}):\n{table}")
  report = {"rows": rows, "ended_with_eos": stored["ended_with_eos"],
            "samples": [{"id": ex.id, "sample": t, "reference": ex.reference}
                        for ex, t in zip(examples, texts)]}
  task_dir = exp.task_dir("sft")
  experiment.write_json(f"{task_dir}/eval.json", report)
  experiment.write_text(f"{task_dir}/eval.md", table + "\n")
  return report
