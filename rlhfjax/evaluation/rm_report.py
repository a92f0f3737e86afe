"""The reward model's report (the second half of task=rm): how well it learned the preferences.

Reported: where its labels came from (`label_source`: the simulated training pool, a round of human
labels, or a file), train/val accuracy on those labels, accuracy against the noiseless evaluation
pool and against the gold argmax (gold ties excluded), the mean margin, the length-only heuristic
beside it, that agreement split by the gold component that decides each pair (an omission, a wrong
fact, ...), the probe table (Stiennon et al. Table 18) and the agreement table between labelers and
heuristics (their Table 20). Written to `<workdir>/rm/eval.json` and `eval.md`.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from rlhfjax.data import pipeline
from rlhfjax.data import records
from rlhfjax.evaluation import agreement
from rlhfjax.evaluation import rm_probes
from rlhfjax.evaluation import summaries
from rlhfjax.feedback import annotators
from rlhfjax.models import policy
from rlhfjax.parallel.sharding import to_host
from rlhfjax.rollout import rewards
from rlhfjax.training import experiment
from rlhfjax.training import loaders
from rlhfjax.training import metrics as metrics_lib


def _examples_of(exp: experiment.Experiment,
                 comps: Sequence[records.Comparison]) -> list[pipeline.Tldr] | None:
  """The simulated examples behind the comparisons, or None when any is not from this world (or
  the data has no latent situations: real posts share ids with their comparisons)."""
  by_id = {e.id: e for split in exp.splits.values() for e in split}
  found = [by_id.get(c.id) for c in comps]
  return None if any(e is None for e in found) or not pipeline.has_gold(found) else found


def _judge(params: dict, exp: experiment.Experiment,
           comps: Sequence[records.Comparison]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The reward model's preference (0 prefers response_a, 1 response_b, 0.5 tie) on `comps`, and
  its margin for each comparison's labelled choice."""
  posts = pipeline.posts_of(comps)
  sa = rewards.score_texts(params, exp, posts, [x.response_a for x in comps])
  sb = rewards.score_texts(params, exp, posts, [x.response_b for x in comps])
  labels = np.array([x.choice for x in comps])
  return agreement.prefer_higher(sa, sb), labels, np.where(labels == 1, sb - sa, sa - sb)


def _from_training_pool(comps: Sequence[records.Comparison]) -> bool:
  """Whether task=label's simulated training pool made these comparisons."""
  return all(c.annotator == "train_pool" for c in comps)


def label_source(exp: experiment.Experiment, path: str,
                 comps: Sequence[records.Comparison]) -> str:
  """Where the comparisons of `path` came from, in words for the report: the simulated training
  pool (its flip rate), a round of the labeling site (its labelers and protocol), or the file."""
  if _from_training_pool(comps):
    return f"training pool, {100 * exp.config.annotators.flip_rate:g}% flipped"
  prefix = records.LABELING_ROUND + ": "
  batches = {c.batch for c in comps}
  if comps and all(b.startswith(prefix) for b in batches):  # The labeling site's export.
    protocols = sorted(b[len(prefix):] for b in batches)
    n = len({c.annotator for c in comps})
    return (f"human labels from a labeling round: {n} labeler{'s' * (n != 1)}, "
            f"{', '.join(protocols)} protocol{'s' * (len(protocols) != 1)}, {path}")
  return f"labels of {path}"


def evaluate(exp: experiment.Experiment, params: dict, files: dict[str, str],
             sft_params: Any) -> dict[str, Any]:
  """Accuracies, the probe table and the agreement table on the validation pairs."""
  c = exp.config.rm
  cols = loaders.columns(exp)
  val_comps = loaders.load_comparisons(files["valid"], c.layout, report=False, columns=cols)
  train_comps = loaders.load_comparisons(files["train"], c.layout, report=False, columns=cols)
  # Training accuracy on as many training pairs as there are held-out ones.
  train_pref, train_labels, _ = _judge(params, exp, train_comps[:len(val_comps)])
  rm_pref, labels, margin = _judge(params, exp, val_comps)
  a = [x.response_a for x in val_comps]
  b = [x.response_b for x in val_comps]
  report: dict[str, Any] = {"pairs": len(val_comps),
                            "label_source": label_source(exp, files["train"], train_comps),
                            "train_accuracy": agreement.agreement(train_pref, train_labels),
                            "accuracy": agreement.agreement(rm_pref, labels),
                            "margin": float(margin.mean())}
  examples = _examples_of(exp, val_comps)
  if examples is None:
    metrics_lib.info("validation pairs are not from the simulated world: gold metrics skipped")
    return report
  rng = np.random.default_rng([exp.config.seed, 5])
  pools = annotators.pools(exp.config.annotators)
  gold_pref = agreement.gold_preference(examples, a, b)
  eval_labels = pools["eval_pool"].annotate(examples, a, b, rng)
  report.update({
      "accuracy_eval_pool": agreement.agreement(rm_pref, eval_labels),
      "accuracy_gold": agreement.accuracy_against(rm_pref, gold_pref),
      "gold_ties": float(np.mean(gold_pref == 0.5)),
      "length_accuracy_gold": agreement.accuracy_against(agreement.length_preference(a, b),
                                                         gold_pref),
      "labels_accuracy_gold": agreement.accuracy_against(labels, gold_pref)})

  heuristics = heuristic_preferences(exp, sft_params, examples, a, b)
  report["likelihood_accuracy_gold"] = agreement.accuracy_against(heuristics["SFT mean log p"],
                                                                 gold_pref)
  prefs = {"train pool" if _from_training_pool(val_comps) else "labels": labels,
           "eval pool": eval_labels,
           "single": pools["single"].annotate(examples, a, b, rng), "gold": gold_pref,
           "RM": rm_pref, **heuristics}
  mean, se = agreement.agreement_matrix(prefs, rng, c.bootstrap)
  report["agreement"] = {"names": list(prefs), "mean": mean.tolist(), "se": se.tolist()}
  report["by_component"] = agreement.by_component(
      {"RM": rm_pref, "length": heuristics["length"], "SFT mean log p": heuristics["SFT mean log p"],
       "training labels": labels}, gold_pref, agreement.deciding_component(examples, a, b))

  probe_examples = exp.splits["test"][:c.probe_examples]
  report["probes"] = rm_probes.probe_table(
      lambda ex, texts: rewards.score_texts(params, exp, ex, texts), probe_examples, rng)
  return report


def heuristic_preferences(exp: experiment.Experiment, sft_params: Any,
                          examples: Sequence[pipeline.Tldr], a: Sequence[str],
                          b: Sequence[str]) -> dict[str, np.ndarray]:
  """Preferences of the heuristics in Stiennon et al.'s Table 20: the longer summary, the one that
  copies more of the post, the higher ROUGE-L against the reference, the higher SFT log-probability;
  and the higher mean log-probability per token (the likelihood term alone, with no labels)."""
  logp, mean_logp = sft_log_probs(sft_params, exp, examples, list(a) + list(b))
  refs = [e.reference for e in examples]
  return {"length": agreement.length_preference(a, b),
          "copying": agreement.prefer_higher(*([agreement.copying(t, e.post) for t, e in
                                                zip(texts, examples)] for texts in (a, b))),
          "ROUGE-L": agreement.prefer_higher(summaries.rouge_l(a, refs), summaries.rouge_l(b, refs)),
          "SFT log p": agreement.prefer_higher(logp[:len(a)], logp[len(a):]),
          "SFT mean log p": agreement.prefer_higher(mean_logp[:len(a)], mean_logp[len(a):])}


_logp_fn = jax.jit(policy.response_logprobs, static_argnames="cfg")


def sft_log_probs(params: Any, exp: experiment.Experiment,
                  posts: Sequence[pipeline.Post | pipeline.Tldr],
                  texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
  """Total and mean per-token log-probability of each of `texts` under the SFT policy; `texts`
  holds one or more responses per post, in blocks of `len(posts)`."""
  fmt = exp.config.format
  posts = list(posts) * (len(texts) // len(posts))
  data = {**pipeline.encode_prompts(exp.tokenizer, posts, fmt.prompt_len),
          **pipeline.encode_responses(exp.tokenizer, texts, fmt.response_len, posts=posts)}
  total, count = [], []
  for b, k in pipeline.fixed_batches(data, exp.config.rm.eval_batch_size):
    total.append(to_host(_logp_fn(params, b, exp.model)).sum(-1)[:k])
    count.append(np.asarray(b["response_mask"]).sum(-1)[:k])
  total, count = np.concatenate(total), np.concatenate(count)
  return total, total / np.maximum(count, 1)


def format_report(report: dict[str, Any]) -> str:
  """The report as text (`eval.md`)."""
  lines = [f"Reward model on {report['pairs']} held-out pairs:",
           f"- accuracy on the labels it learns from ({report['label_source']}): "
           f"{100 * report['accuracy']:.1f}% held out, {100 * report['train_accuracy']:.1f}% on "
           "training pairs"]
  if "accuracy_gold" in report:
    lines += [
        f"- accuracy on the evaluation pool's (noiseless) labels: "
        f"{100 * report['accuracy_eval_pool']:.1f}%",
        f"- agreement with the gold argmax: {100 * report['accuracy_gold']:.1f}% (length-only "
        f"heuristic: {100 * report['length_accuracy_gold']:.1f}%; the SFT policy's mean token "
        f"log-probability alone: {100 * report['likelihood_accuracy_gold']:.1f}%; the training "
        f"labels themselves: "
        f"{100 * report['labels_accuracy_gold']:.1f}%; gold ties excluded, "
        f"{100 * report['gold_ties']:.0f}% of pairs)"]
  lines.append(f"- mean margin (chosen - rejected): {report['margin']:.3f}")
  if "by_component" in report:
    lines += ["", "Agreement with gold by what decides the pair (gold ties left out):",
              agreement.format_by_component(report["by_component"])]
  if "probes" in report:
    lines += ["", "Probes (Stiennon et al. Table 18):", rm_probes.format_table(report["probes"])]
  if "agreement" in report:
    a = report["agreement"]
    lines += ["", "Agreement between labelers in % ± bootstrap s.e. (Stiennon et al. Table 20):",
              agreement.format_matrix(a["names"], np.array(a["mean"]), np.array(a["se"]))]
  return "\n".join(lines)


def run(config, workdir: str) -> dict[str, Any]:
  """Reports on the trained reward model of `<workdir>/rm/model` (after `reward_model.run`)."""
  exp = experiment.prepare(config, workdir)
  files = loaders.comparison_files(exp)
  params, meta = loaders.load_reward_model(exp)
  report = evaluate(exp, params, files, loaders.load_policy(exp))
  report["normalization"] = meta["normalization"]
  text = format_report(report)
  metrics_lib.info("\n" + text)
  task_dir = exp.task_dir("rm")
  experiment.write_json(f"{task_dir}/eval.json", report)
  experiment.write_text(f"{task_dir}/eval.md", text + "\n")
  return report
