"""What a stage reads that an earlier stage left: the finished policy of a supervised run, the
normalised reward model of task=rm, and the comparison files of task=label (or `rm.train_file`).

Every method starts from these, so they live below the algorithms: an algorithm imports another
only for shared math or a shared loop, never to load a file or a checkpoint (`.importlinter`'s
contract `algorithms`). The states a policy or a reward model is built in sit here too, as their
checkpoints restore into the same layout.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from rlhfjax import rng_streams
from rlhfjax.data import records
from rlhfjax.data import tables
from rlhfjax.errors import DataError
from rlhfjax.models import heads
from rlhfjax.models import lora
from rlhfjax.models import transformer
from rlhfjax.training import checkpoint
from rlhfjax.training import experiment
from rlhfjax.training import metrics as metrics_lib
from rlhfjax.training import optimizer
from rlhfjax.training.state import TrainState

# The policy: SFT's, and that of every method that trains it with `sft.train` or in its state.


def model_kind(task: str) -> str:
  """Which of lora.MODELS the run of `sft.train(exp, task)` trains: the SFT policy, or (expert
  iteration, FeedME, reward conditioning) a preference-tuned policy."""
  return "sft" if task == "sft" else "policy"


def policy_axes(exp: experiment.Experiment, task: str) -> dict:
  """Logical axes of the policy `sft.train(exp, task)` trains (with its adapters, if any)."""
  return lora.model_axes(transformer.param_axes(exp.model), exp.lora, model_kind(task))


def policy_init(exp: experiment.Experiment, tx: optax.GradientTransformation,
                model: str = "policy") -> Callable[[Any], TrainState]:
  """`make(init_params)`: the train state of a policy trained from `init_params` (a new buffer on
  the mesh when jitted, never aliasing them), with fresh adapters if `lora` applies to `model`."""
  key = jax.random.fold_in(jax.random.key(exp.config.seed), rng_streams.POLICY_LORA)
  return lambda p: TrainState.create(lora.adapt(key, p, exp.lora, model), tx)


def policy_template(exp: experiment.Experiment, tx: optax.GradientTransformation,
                    model: str = "policy") -> tuple[TrainState, Any]:
  """(abstract state, shardings) of `policy_init`'s state on this run's mesh: a method's
  program and restore target."""
  axes = lora.model_axes(transformer.param_axes(exp.model), exp.lora, model)
  shapes = jax.eval_shape(lambda: transformer.init(jax.random.key(0), exp.model))
  return exp.parallel.train_state(policy_init(exp, tx, model), axes, tx, shapes, abstract=True)


def _policy_template(exp: experiment.Experiment, task: str, steps: int) -> TrainState:
  """The train state's shapes with their shardings on this run's mesh (a restore target)."""
  tx = optimizer.adamw(exp.config[task], steps, exp.trainable(model_kind(task)))
  make = lambda k: TrainState.create(
      lora.adapt(k, transformer.init(k, exp.model), exp.lora, model_kind(task)), tx)
  return exp.parallel.train_state(make, policy_axes(exp, task), tx, jax.random.key(0),
                                  abstract=True)[0]


def load_policy(exp: experiment.Experiment, task: str = "sft", steps: int | None = None) -> Any:
  """The parameters of the finished run of `sft.train(exp, task)` in `<workdir>/<task>` (for
  "sft": what label, rm and ppo start from), adapters merged: a plain model. A policy trained in
  this state's layout by a loop of its own (DPO, SimPO) passes its number of `steps`; the others'
  is their block's `steps`."""
  steps = exp.config[task].steps if steps is None else steps
  state, _ = checkpoint.restore_finished(f"{exp.workdir}/{task}/checkpoints",
                                         _policy_template(exp, task, steps), steps, task)
  return lora.merged(state.params)


# The reward model of task=rm (`<workdir>/rm/model`).


def init_reward_model(exp: experiment.Experiment, sft_params: Any) -> dict:
  """SFT backbone with a fresh scalar head (kernel std `rm.head_init_scale` / sqrt(d_model + 1),
  bias 0), and the likelihood term's weight at `rm.likelihood_weight` unless that is 0."""
  key = jax.random.fold_in(jax.random.key(exp.config.seed), rng_streams.RM_HEAD)
  head = heads.init_scalar_head(key, exp.model.d_model)
  params = {"backbone": sft_params,
            "head": {**head, "kernel": head["kernel"] * exp.config.rm.head_init_scale}}
  if exp.config.rm.likelihood_weight:
    params[heads.LIKELIHOOD] = {"weight": jnp.asarray(exp.config.rm.likelihood_weight,
                                                      jnp.float32)}
  return params


def reward_model_axes(exp: experiment.Experiment) -> dict:
  """Logical axes of the reward model's parameters (`init_reward_model`'s tree)."""
  axes = heads.param_axes(exp.model)
  return {**axes, heads.LIKELIHOOD: {"weight": ()}} if exp.config.rm.likelihood_weight else axes


def reward_model_template(exp: experiment.Experiment) -> dict:
  """The abstract reward-model parameters, sharded on this run's mesh (a restore target)."""
  shapes = jax.eval_shape(lambda: init_reward_model(
      exp, transformer.init(jax.random.key(0), exp.model)))
  par = exp.parallel
  return par.abstract(shapes, par.shardings(reward_model_axes(exp), shapes))


def load_reward_model(exp: experiment.Experiment) -> tuple[dict, dict]:
  """The normalised reward model of `<workdir>/rm/model` and its metadata."""
  return checkpoint.restore_finished(f"{exp.workdir}/rm/model", reward_model_template(exp), 1,
                                     "rm")


# Comparison files: task=label's, or `rm.train_file` / `rm.valid_file`.


def comparison_files(exp: experiment.Experiment) -> dict[str, str]:
  """The train and validation comparison files: `rm.train_file`/`rm.valid_file`, or task=label's."""
  c = exp.config.rm
  return {"train": c.train_file or os.path.join(exp.workdir, "label", "train.jsonl"),
          "valid": c.valid_file or os.path.join(exp.workdir, "label", "valid.jsonl")}


def files_meta(exp: experiment.Experiment, files: dict[str, str]) -> dict[str, str]:
  """`files` as recorded in checkpoint metadata: relative to the workdir when inside it, so a
  copied or moved workdir still matches its checkpoints."""
  root = os.path.abspath(exp.workdir)
  out = {}
  for k, path in files.items():
    full = os.path.abspath(path)
    out[k] = os.path.relpath(full, root) if full.startswith(root + os.sep) else full
  return out


def columns(exp: experiment.Experiment) -> dict[str, str] | None:
  """`data.columns`: TRL's field names mapped to a file's columns (layout `trl`), or None."""
  return dict(exp.config.data.get("columns") or {}) or None  # Optional: file sources only.


def load_comparisons(path: str, layout: str, key: str = "", report: bool = True,
                     columns: dict[str, str] | None = None) -> list[records.Comparison]:
  """The usable comparisons of `path` (any file `records.read` takes: JSON Lines, JSON, Parquet,
  Arrow; a file, a directory of shards or a glob): malformed records are skipped, ties left out,
  and with `report` (off for a second read of the same file) one line says how many records were
  read and kept, followed by the malformed ones (file:line or file: row N). `key` names the config
  key that chose the file, for the error when nothing decisive is left; `columns` maps TRL's
  names to the file's (layout `trl`)."""
  if not os.path.exists(path) and not tables.is_pattern(path):
    raise FileNotFoundError(f"comparisons file not found: {path} (run task=label, or set "
                            "rm.train_file / rm.valid_file)")
  needs = f"{key} needs at least one pair with a preferred side" if key else ""
  comps, problems = records.read(path, layout, columns if layout == records.TRL else None)
  if not comps:
    first = f": {problems[0]} (and {len(problems) - 1} more; is the layout {layout!r} right?)" \
        if problems else ": the file is empty" + (f" ({needs})" if needs else "")
    raise DataError(f"{path} holds no comparisons{first}")
  ties = sum(c.tie for c in comps)  # Human labels may say "neither"; Bradley–Terry needs a side.
  if report:
    read = len(comps) + len(problems)
    left_out = [f"{n} {what}" for n, what in ((len(problems), "malformed"), (ties, "ties")) if n]
    metrics_lib.info(f"{path}: read {read} records, kept {len(comps) - ties}" +
                     (f" ({', '.join(left_out)} left out)" if left_out else ""))
    for p in problems[:5]:
      metrics_lib.info(f"  malformed: {p}")
    if len(problems) > 5:
      metrics_lib.info(f"  ... and {len(problems) - 5} more malformed records in {path}")
  comps = [c for c in comps if not c.tie]
  if not comps:
    raise DataError(f"{path} holds only ties ({ties}): {needs or 'no pair has a preferred side'}")
  return comps
