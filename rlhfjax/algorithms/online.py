"""The loop every online method shares (PPO, RLOO, GRPO, online DPO): sample, step, log, resume.

Each iteration draws `rollout_batch / k` prompts of the unlabeled split (the same prompt order for
every method and seed), samples `k` responses to each from the current policy through the rollout
engine at the method's temperature, and hands the batch to the method's jitted step
`step(state, ref_params, reward_params, batch, rng) -> (state, metrics)`. On the simulated world
the samples' gold reward is logged beside the step's metrics (`objective/gold`). Every `eval_every`
iterations the policy answers the same held-out posts and one point of the over-optimisation curve
(RM score, gold, win-rate, KL to the reference) is logged under `eval/`. Checkpoints, resumption
and metrics go through `training.loop` like every other task.

Asynchronous rollouts (`rollout.max_staleness` = s > 0; rlhfjax/parallel/placement.py): iteration t
first dispatches the samples of iterations up to t + s from the policy it is about to update
(version t), then trains on batch t, which the policy of version max(0, t − s) sampled; under
`rollout.placement='split'` the sampler's devices generate while the trainer's update. Each batch
logs its age (`rollout/version_lag`, never above s) and the sampler/trainer gap at that age
(`sampling/lag_<age>/...`); the ratio's π_old is the method's `old_policy`. DAPO's refill draws
come from the newest policy. The batches in flight are checkpointed with the state, so a resumed
run trains on the very batches an uninterrupted one does.

Every method's step reports TRL's `objective/scores` (the RM score after the truncation rule) and
`objective/kl` (the summed per-token KL estimate to the reference); the log line reads them.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlhfjax import rng_streams
from rlhfjax.data import pipeline
from rlhfjax.errors import ConfigError
from rlhfjax.models import lora
from rlhfjax.models import sampling
from rlhfjax.models import transformer
from rlhfjax.parallel import placement
from rlhfjax.parallel.sharding import to_host
from rlhfjax.rollout import engine
from rlhfjax.rollout import heldout
from rlhfjax.rollout import outputs
from rlhfjax.rollout import reward_functions
from rlhfjax.rollout import rewards
from rlhfjax.simulated import gold
from rlhfjax.training import checkpoint
from rlhfjax.training import experiment
from rlhfjax.training import loaders
from rlhfjax.training import loop
from rlhfjax.training import metrics as metrics_lib
from rlhfjax.training import optimizer
from rlhfjax.training import program as program_lib
from rlhfjax.training.state import TrainState

Step = Callable[[Any, Any, Any, pipeline.Batch, jax.Array], tuple[Any, dict[str, jax.Array]]]
# Host-side labels for a sampled batch (online DPO with an annotator pool): (its decoded responses,
# the examples of its rows, the step) -> extra batch arrays.
Annotate = Callable[[list[str], list, int], dict[str, np.ndarray]]
_NOT_IN_META = ("log_every", "eval_every", "eval_examples")
OLD_POLICIES = ("recompute", "sampler")


def check_sampling(task: str, c: Any, k: int, why_two: str = "") -> None:
  """Clear errors for sampling settings that cannot work: `k` samples per prompt (at least 2 when
  `why_two` says why), whole groups and whole minibatches per batch, a positive temperature."""
  if why_two and k < 2:
    raise ConfigError(f"{task}.k must be >= 2 ({why_two}), got {k}")
  if k < 1 or c.rollout_batch % k:
    raise ConfigError(f"{task}.rollout_batch ({c.rollout_batch}) must be a multiple of the "
                      f"samples per prompt ({k})")
  if "minibatch_size" in c and c.rollout_batch % c.minibatch_size:
    raise ConfigError(f"{task}.rollout_batch ({c.rollout_batch}) must be a multiple of "
                      f"{task}.minibatch_size ({c.minibatch_size})")
  if k > 1 and "minibatch_size" in c and c.share_prompt and c.minibatch_size % k:
    raise ConfigError(f"{task}.minibatch_size ({c.minibatch_size}) must be a multiple of the "
                      f"samples per prompt ({k}) with {task}.share_prompt: minibatches hold whole "
                      f"groups")
  if c.temperature <= 0:
    raise ConfigError(f"{task}.temperature must be > 0 (the method samples), got {c.temperature}")


def check_old_policy(task: str, c: Any) -> None:
  """Clear errors for `<task>.old_policy` (see `old_logprobs`) and its pairing with TIS."""
  if c.old_policy not in OLD_POLICIES:
    raise ConfigError(f"{task}.old_policy must be one of {OLD_POLICIES}, got {c.old_policy!r}")
  if c.old_policy == "sampler" and c.truncated_is:
    raise ConfigError(f"{task}.truncated_is weights by pi_old / pi_sampler, which is 1 with "
                      f"{task}.old_policy='sampler' (the sampler's log-probs are pi_old): set one "
                      f"of them back")


def minibatch_updates_per_step(c: Any) -> int:
  """Optimizer updates per iteration of `epochs` passes over minibatches of the rollout."""
  return c.epochs * (c.rollout_batch // c.minibatch_size)


def meta(exp: experiment.Experiment, task: str) -> dict:
  """What determines an online run; resuming under other values is refused."""
  return {"model": dataclasses.asdict(exp.model), "format": exp.config.format.to_dict(),
          task: {k: v for k, v in exp.config[task].items() if k not in _NOT_IN_META},
          "reward": exp.config.reward.to_dict(),
          **exp.lora_meta("policy"), **exp.remat_meta("policy")}


def group(c: Any, k: int) -> int:
  """Rows that share one computation of their prompt in a step's forwards: the k samples of a
  prompt with `share_prompt` (policy.hidden_states), else 1 (every row computes its own)."""
  return k if c.share_prompt else 1


def experience(state: TrainState, ref_params: Any, reward_params: Any, batch: pipeline.Batch,
               cfg: Any, c: Any, eos_id: sampling.EosIds, group: int = 1) -> dict[str, jax.Array]:
  """`engine.experience` of the current policy under the method's sampling and truncation knobs
  (`temperature`, `penalize_no_eos`, `no_eos_score`), each prompt computed once for its `group`
  adjacent samples (see `group`); `ref_params` None: the LoRA policy's base."""
  ref_params = lora.reference(state.params["policy"], ref_params)
  return engine.experience(state.params["policy"], ref_params, reward_params, batch, cfg=cfg,
                           temperature=c.temperature, eos_id=eos_id,
                           no_eos_score=c.no_eos_score if c.penalize_no_eos else None,
                           group=group)


def rollout_stats(e: dict[str, jax.Array], batch: pipeline.Batch,
                  eos_id: sampling.EosIds) -> dict[str, jax.Array]:
  """TRL's rollout metrics every critic-free method logs, from `experience`'s output: the summed
  per-token KL (log π − log π_ref) and entropy, the scores before and after the truncation rule,
  the eos count and the mean response length."""
  return {"objective/kl": (e["old_logprobs"] - e["ref_logprobs"]).sum(-1).mean(),
          "objective/entropy": e["entropy"].sum(-1).mean(),
          "objective/scores": e["scores"].mean(), "objective/raw_scores": e["raw_scores"].mean(),
          "val/num_eos_tokens": sampling.is_eos(batch["response"], eos_id).sum().astype(jnp.float32),
          "response/length": batch["response_mask"].astype(jnp.float32).sum(-1).mean()}


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean of `x` over the entries where `mask` is set (0 when none is)."""
  return (x * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def sampler_gap(old_logprobs: jax.Array, batch: pipeline.Batch) -> dict[str, jax.Array]:
  """TRL's sampler/trainer gap over the real response tokens: the mean and max of
  |log π − log π_sampler| and the min, mean and max of the ratio π / π_sampler (before any TIS
  cap), where `old_logprobs` [B, R] are the trainer's recomputation before the update and
  `batch['sampler_logprobs']` the sampler's. The sampler may differ in layout and precision;
  this says by how much. {} for a batch without sampler log-probs (a static check)."""
  if "sampler_logprobs" not in batch:
    return {}
  m = batch["response_mask"]
  diff = old_logprobs - batch["sampler_logprobs"]
  ratio = jnp.exp(diff)
  some = m.any()  # With no real token every statistic is 0, as in TRL.
  return {"sampling/sampling_logp_difference/mean": masked_mean(jnp.abs(diff), m),
          "sampling/sampling_logp_difference/max": jnp.where(m, jnp.abs(diff), 0.0).max(),
          "sampling/importance_sampling_ratio/min":
              jnp.where(some, jnp.where(m, ratio, jnp.inf).min(), 0.0),
          "sampling/importance_sampling_ratio/mean": masked_mean(ratio, m),
          "sampling/importance_sampling_ratio/max": jnp.where(m, ratio, 0.0).max()}


def old_logprobs(recomputed: jax.Array, batch: pipeline.Batch, c: Any) -> jax.Array:
  """log π_old [B, R], the policy-gradient ratio's anchor, as `c.old_policy` says: 'recompute',
  the trainer's log-probs of the policy before this iteration's updates (`recomputed`: TRL's and
  verl's default; with stale batches the ratio is then taken against the proximal policy and TIS
  corrects for the sampler, as AReaL's decoupled PPO); 'sampler', the sampler's own
  (`batch['sampler_logprobs']`: the behaviour policy, however many versions old)."""
  return batch["sampler_logprobs"] if c.old_policy == "sampler" else recomputed


def tis_weights(old_logprobs: jax.Array, batch: pipeline.Batch, c: Any,
                task: str) -> jax.Array | None:
  """Truncated importance sampling (Yao et al. 2025): w_t = min(π_old(y_t) / π_sampler(y_t),
  `tis_cap`) [B, R], without gradient, to multiply each token's policy-gradient loss term so the
  update corrects for the sampler's numerics differing from the trainer's. `old_logprobs` are the
  trainer's before the update (π_old). None with `truncated_is` off: the losses stay untouched."""
  if not c.truncated_is:
    return None
  if "sampler_logprobs" not in batch:
    raise ConfigError(f"{task}.truncated_is needs the sampler's log-probs, and this batch has no "
                      f"'sampler_logprobs'; set {task}.truncated_is=False")
  ratio = jnp.exp(old_logprobs - batch["sampler_logprobs"])
  return jax.lax.stop_gradient(jnp.minimum(ratio, c.tis_cap))


def shuffled_rows(key: jax.Array, n: int, group: int = 1) -> jax.Array:
  """A random order of `n` rows that moves whole groups of `group` adjacent rows and keeps each
  group's rows adjacent and in order (`group` 1: `jax.random.permutation(key, n)`)."""
  groups = jax.random.permutation(key, n // group)
  return (groups[:, None] * group + jnp.arange(group)).reshape(-1)


def minibatch_updates(state: TrainState, data: dict[str, jax.Array], rng: jax.Array,
                      loss_fn: Callable, epochs: int, minibatch_size: int,
                      tx: optax.GradientTransformation,
                      group: int = 1) -> tuple[TrainState, dict[str, jax.Array]]:
  """`epochs` passes over shuffled minibatches of the rows of `data` (`lax.scan` over both), one
  AdamW step on `loss_fn(params, minibatch) -> (loss, stats)` each; the stats averaged. With
  `group` > 1 whole groups of that many adjacent rows are shuffled, and stay adjacent in their
  minibatch (so its forwards can share each group's prompt). The state's `step` then counts this
  iteration once (iterations, not updates: what resuming reads)."""
  iteration = state.step
  n = jax.tree.leaves(data)[0].shape[0]
  k = n // minibatch_size

  def minibatch(state, idx):
    mb = jax.tree.map(lambda x: x[idx], data)
    (_, stats), grads = lora.value_and_grad(loss_fn, has_aux=True)(state.params, mb)
    stats["policy/grad_norm"] = optax.tree.norm(grads)
    return state.apply_gradients(grads, tx), stats

  def epoch(state, key):
    return jax.lax.scan(minibatch, state,
                        shuffled_rows(key, n, group)[:k * minibatch_size].reshape(k, -1))

  state, stats = jax.lax.scan(epoch, state, jax.random.split(rng, epochs))
  return state.replace(step=iteration + 1), jax.tree.map(jnp.mean, stats)


def adamw(c: Any, updates_per_step: int, trainable: Any = None) -> optax.GradientTransformation:
  """AdamW scheduled over every update of every iteration of an online run (of the leaves
  `trainable` marks, when given: see optimizer.adamw)."""
  return optimizer.adamw(c, c.steps * updates_per_step, trainable)


@dataclasses.dataclass(frozen=True)
class Refill:
  """Dynamic sampling with a refill (DAPO): `informative(state, ref_params, reward_params, batch,
  *, cfg, c, eos_id)` says which of a sampled batch's groups [B // k] carry a gradient; other
  prompts are sampled, up to `max_draws` batches in all, until `rollout_batch / k` groups do.
  `train_policy` binds the keywords and jits it in the step's layout; `train` takes it bound."""
  informative: Callable[..., jax.Array]
  max_draws: int


def refill_order(kept: list[np.ndarray], groups: int) -> list[tuple[int, int]]:
  """(draw, group) of the `groups` groups a refilled batch holds: the informative ones (`kept[j]`
  [G] for draw j) in draw order, then, if they are too few, the first draw's others in order
  (which the step's dynamic sampling leaves out of the loss)."""
  order = [(j, int(g)) for j, keep in enumerate(kept) for g in np.flatnonzero(keep)]
  order += [(0, int(g)) for g in np.flatnonzero(~kept[0])]
  return order[:groups]


def policy_init(exp: experiment.Experiment, tx: optax.GradientTransformation
                ) -> Callable[[Any], TrainState]:
  """`make(init_params)`: a critic-free method's state `{'policy'}` trained from `init_params`
  (with fresh adapters where LoRA applies to it)."""
  lora_key = jax.random.fold_in(jax.random.key(exp.config.seed), rng_streams.POLICY_LORA)
  # A copy: the trained tree must not alias the frozen reference.
  return lambda p: TrainState.create(
      {"policy": lora.adapt(lora_key, jax.tree.map(jnp.copy, p), exp.lora, "policy")}, tx)


def policy_template(exp: experiment.Experiment, tx: optax.GradientTransformation
                    ) -> tuple[TrainState, Any]:
  """(abstract state, shardings) of `policy_init`'s state: the program's and the restore target."""
  axes = {"policy": lora.model_axes(transformer.param_axes(exp.model), exp.lora, "policy")}
  shapes = jax.eval_shape(lambda: transformer.init(jax.random.key(0), exp.model))
  return exp.parallel.train_state(policy_init(exp, tx), axes, tx, shapes, abstract=True)


def load_policy(exp: experiment.Experiment, task: str) -> Any:
  """The policy of the finished run of the critic-free method `task` in `<workdir>/<task>`,
  adapters merged."""
  c = exp.config[task]
  # The schedule's length (updates per iteration) leaves the optimizer state's layout alone.
  template, _ = policy_template(exp, adamw(c, 1, exp.trainable("policy")))
  state, _ = checkpoint.restore_finished(f"{exp.workdir}/{task}/checkpoints", template, c.steps,
                                         task)
  return lora.merged(state.params["policy"])


def rollout_batch(exp: experiment.Experiment, rows: int,
                  extra: dict[str, jax.ShapeDtypeStruct] | None = None
                  ) -> dict[str, jax.ShapeDtypeStruct]:
  """The abstract batch `train` hands the step: `rows` sampled prompts and responses with the
  sampler's log-probs, the reward functions' sum and the model's weight where `reward.functions`
  names any, and `extra` (an annotator's labels)."""
  fmt, par = exp.config.format, exp.parallel
  row = lambda shape: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=par.batch)
  batch = {**program_lib.tokens(par, rows, {"prompt": fmt.prompt_len,
                                             "response": fmt.response_len}),
           "sampler_logprobs": row((rows, fmt.response_len))}
  if reward_functions.load(exp.config.reward):
    batch.update(function_rewards=row((rows,)), model_weight=row((rows,)))
  return {**batch, **(extra or {})}


def program(exp: experiment.Experiment, task: str, train_step: Callable, updates_per_step: int,
            extra: dict[str, jax.ShapeDtypeStruct] | None = None) -> program_lib.Program:
  """The update step a critic-free method `task` runs (`train_step(state, ref, reward, batch,
  rng, *, cfg, c, tx, eos_id)`): AdamW over every update of every iteration, the policy with its
  adapters and remat policy (dropout off: log-probs must be exact), the reference tree unless the
  policy is a LoRA policy (whose base is its reference), the run's eos ids; `extra`: batch keys
  an annotator adds."""
  c, par = exp.config[task], exp.parallel
  par.check_batch(f"{task}.rollout_batch", c.rollout_batch)
  cfg = dataclasses.replace(exp.model_for("policy"), dropout=0.0)
  tx = adamw(c, updates_per_step, exp.trainable("policy"))
  state, shardings = policy_template(exp, tx)
  ref = None if exp.lora.applies_to("policy") else state.params["policy"]
  reward = rewards.reward_template(exp)
  step = par.jit(functools.partial(train_step, cfg=cfg, c=c, tx=tx, eos_id=exp.eos_ids),
                 (shardings, program_lib.shardings_of(ref), program_lib.shardings_of(reward),
                  par.batch, par.replicated), (shardings, par.replicated), (0,))
  args = (state, ref, reward, rollout_batch(exp, c.rollout_batch, extra), program_lib.key(par))
  return program_lib.Program(step, args, state, shardings, tx)


def train_policy(exp: experiment.Experiment, task: str, prog: program_lib.Program, k: int,
                 annotate: Annotate | None = None, refill: Refill | None = None) -> TrainState:
  """Runs (or resumes) a critic-free online method in `<workdir>/<task>` with its program
  (`program`): the policy (params `{'policy'}`) starts from SFT and trains against the frozen SFT
  reference and reward model. With LoRA on the policy, `ref` is None and the step takes the
  policy's base as the reference: one backbone for both."""
  c, par = exp.config[task], exp.parallel
  ref_params = loaders.load_policy(exp)
  reward_params = (loaders.load_reward_model(exp)[0]
                   if reward_functions.uses_model(exp.config.reward) else None)
  # minibatch_size: optional (online_dpo has none: one update of the whole batch).
  groups = min(c.rollout_batch, c.get("minibatch_size", c.rollout_batch)) // k
  if group(c, k) > 1 and groups % par.data_parallel:
    metrics_lib.info(f"{task}: {groups} prompt groups per minibatch do not split over "
                     f"{par.data_parallel} data-parallel devices: the packed rows of "
                     f"{task}.share_prompt run replicated (raise {task}.minibatch_size or set "
                     f"share_prompt=False)")
  state = prog.init(policy_init(exp, prog.tx), ref_params)
  if exp.lora.applies_to("policy"):
    ref_params = None
  if refill is not None:  # The step's layout and shardings, less the rng.
    _, ref, reward, _, _ = prog.args
    cfg = dataclasses.replace(exp.model_for("policy"), dropout=0.0)
    refill = dataclasses.replace(refill, informative=par.jit(
        functools.partial(refill.informative, cfg=cfg, c=c, eos_id=exp.eos_ids),
        (prog.shardings, program_lib.shardings_of(ref), program_lib.shardings_of(reward),
         par.batch), par.replicated))
  return train(exp, task, state, prog.step, ref_params, reward_params, meta(exp, task), k=k,
               annotate=annotate, refill=refill)


def run_policy(config, workdir: str, task: str, program_of: Callable[..., program_lib.Program],
               k: int, annotate: Callable | None = None,
               refill: Refill | None = None) -> TrainState:
  """`train_policy` with the program `program_of(exp)`, then the policy answers the test prompts
  for task=eval."""
  exp = experiment.prepare(config, workdir)
  state = train_policy(exp, task, program_of(exp), k, annotate(exp) if annotate else None, refill)
  outputs.save_policy(exp, task, state.params["policy"], loaders.load_policy(exp))
  return state


def train(exp: experiment.Experiment, task: str, state: Any, step_fn: Step, ref_params: Any,
          reward_params: Any, meta: dict, *, k: int = 1, annotate: Annotate | None = None,
          refill: Refill | None = None) -> Any:
  """Runs (or resumes) `exp.config[task].steps` iterations of `step_fn` in `<workdir>/<task>`
  (`ref_params` None: the policy's LoRA base is the reference; `refill`: dynamic sampling's extra
  draws, each a pure function of (seed, step, draw) so that a resumed run draws the same)."""
  config, c = exp.config, exp.config[task]
  check_sampling(task, c, k)
  check_old_policy(task, c)
  examples = exp.splits["unlabeled"]
  with_gold = pipeline.has_gold(examples)  # Real data has no gold reward: no `objective/gold`.
  prompts = pipeline.encode_prompts(exp.tokenizer, examples, config.format.prompt_len)
  eval_examples = exp.splits["validation"][:c.eval_examples]
  functions = reward_functions.load(config.reward)
  reward_fn = rewards.reward_of_texts(exp, reward_params, functions)
  # Held-out points decode as every method does on the leaderboard (KL at that temperature too).
  curve_temperature = outputs.kl_temperature(exp)
  key, eval_key = jax.random.split(
      jax.random.fold_in(jax.random.key(config.seed), rng_streams.ONLINE))

  staleness = placement.check_staleness(config.rollout)
  # Resuming under another staleness would train on other batches (or drop those sampled ahead):
  # stored at 0 too, so that a resume from or to a synchronous run is refused as well.
  meta = {**meta, **placement.meta(staleness)}
  metrics_lib.info(placement.describe(np.asarray(exp.parallel.mesh.devices).reshape(-1),
                                      exp.sampler_devices, staleness))
  task_dir = exp.task_dir(task)
  ckpt = checkpoint.Checkpointer(f"{task_dir}/checkpoints", config.checkpoint.every,
                                 config.checkpoint.keep)
  writer = metrics_lib.MetricWriter(task_dir, "metrics")
  state, saved = loop.restore_with_extra(ckpt, state, meta, extra=bool(staleness))
  start = int(state.step)
  timing = {"generate": 0.0, "total": 0.0, "episodes": 0}
  # Batches sampled ahead of the iteration that trains on them (rollout.max_staleness > 0), by
  # that iteration: (the policy version that sampled them, their prompts' indices, the batch).
  # Checkpointed with the state, so a resumed run trains on the very batches it would have.
  ahead = _restore_ahead(exp, saved)

  def keys(step):
    """(sampling, update) keys of iteration `step`."""
    return jax.random.split(jax.random.fold_in(key, step))

  def push(state) -> tuple[Any, dict[str, float]]:
    """The policy in the rollout layout (on the sampler's own devices under a split placement),
    copied once an iteration for every draw it makes, with the bytes of the copy; and its time
    under a split placement while no draw is in flight (waiting on the copy then would hold the
    trainer until the sampler's queued draws finish, and undo the overlap)."""
    t = time.perf_counter()
    sampler = engine.rollout_params(exp, state.params["policy"], c.rollout_batch)
    if sampler is state.params["policy"]:  # Already in the layout: nothing moved.
      return sampler, {"perf/push_bytes": 0.0}
    stats = {"perf/push_bytes": float(placement.bytes_received(sampler))}
    if exp.sampler_devices and not ahead:
      jax.block_until_ready(sampler)
      stats["time/push_s"] = time.perf_counter() - t
    return sampler, stats

  def draw(sampler, step, k_sample, j):
    """Draw j of iteration `step` from `sampler` (the policy in the rollout layout): its prompts'
    indices and `k` samples of each (dispatched, not waited for)."""
    idx = pipeline.batch_indices(len(examples), c.rollout_batch // k, config.seed, step, stream=j)
    rng = k_sample if j == 0 else jax.random.fold_in(k_sample, j)
    timing["episodes"] += c.rollout_batch
    batch = engine.sample_batch(sampler, exp.parallel.put_batch(prompts, idx), rng, exp,
                                c.temperature, k=k)
    return idx, batch

  def scored(idx, batch):
    """A draw with the reward functions' values (when there are any)."""
    if not functions:
      return idx, batch, {}
    batch, values = engine.add_function_rewards(exp, functions, batch,
                                                [examples[i] for i in idx for _ in range(k)])
    return idx, batch, values

  def refilled(state, sampler, step, k_sample, first, rows):
    """The batch of `rollout_batch / k` groups, those that carry a gradient first, from as few
    draws as `refill` needs (at most `max_draws`; the first as given, the others from `sampler`),
    its examples (`rows` of the first draw alone) and its reward functions' values; with its
    metrics."""
    draws = [first]
    kept = [to_host(refill.informative(state, ref_params, reward_params, first[1]))]
    groups = c.rollout_batch // k
    while sum(int(x.sum()) for x in kept) < groups and len(draws) < refill.max_draws:
      draws.append(scored(*draw(sampler, step, k_sample, len(draws))))
      kept.append(to_host(refill.informative(state, ref_params, reward_params, draws[-1][1])))
    order = refill_order(kept, groups) if len(draws) > 1 else None
    m = {"dynamic_sampling/gen_batches": float(len(draws)),
         "dynamic_sampling/refilled_groups": float(sum(j > 0 for j, _ in order or ())),
         # The share of sampled groups whose rewards were all equal: of the first draw (what the
         # step would drop without a refill) and of every draw this iteration made.
         "dynamic_sampling/first_draw_dropped_fraction": float(1.0 - kept[0].mean()),
         "dynamic_sampling/drawn_dropped_fraction": float(
             1.0 - np.concatenate(kept).mean())}
    if order is None:
      return first[1], rows, first[2], m
    host = [to_host(b) for _, b, _ in draws]
    picked = [(j, g * k + i) for j, g in order for i in range(k)]
    batch = {name: np.stack([host[j][name][r] for j, r in picked]) for name in host[0]}
    rows = [examples[draws[j][0][r // k]] for j, r in picked]
    values = {name: np.array([draws[j][2][name][r] for j, r in picked]) for name in first[2]}
    return exp.parallel.put(batch, exp.parallel.batch), rows, values, m

  def one_step(state, step):
    t0 = time.perf_counter()
    k_sample, k_update = keys(step)
    # The iterations whose batches this one samples ahead, from the policy it is about to update:
    # each is then at most `staleness` versions old when it is trained on.
    later = [s for s in range(step + 1, min(step + staleness, c.steps - 1) + 1) if s not in ahead]
    sampler, stats = None, {}
    if step not in ahead or refill is not None or later:
      sampler, stats = push(state)
    version, idx, batch = ahead.pop(step) if step in ahead else (step, *draw(sampler, step,
                                                                              k_sample, 0))
    for s in later:  # Dispatched now: the sampler's devices work on them while this step trains.
      ahead[s] = (step, *draw(sampler, s, keys(s)[0], 0))
    idx, batch, values = scored(idx, batch)
    rows = [examples[i] for i in idx for _ in range(k)]
    if refill is not None:  # Refill draws come from the newest policy (version `step`).
      batch, rows, values, refill_stats = refilled(state, sampler, step, k_sample,
                                                   (idx, batch, values), rows)
      stats.update(refill_stats)
    del sampler
    # Decoded once, for the annotators, the gold reward and the completions' log alike.
    texts = (engine.decode(exp, batch["response"]) if annotate or with_gold or functions
             else None)
    if functions:
      stats.update(reward_functions.statistics(values))
      engine.log_completions(f"{task_dir}/completions.jsonl", step, rows, texts, values,
                             to_host(batch["function_rewards"]))
    if annotate is not None:
      batch.update(exp.parallel.put(annotate(texts, rows, step), exp.parallel.batch))
    jax.block_until_ready(batch)
    t1 = time.perf_counter()
    state, m = step_fn(state, ref_params, reward_params, batch, k_update)
    m = {**{name: float(v) for name, v in m.items()}, **stats}
    if staleness:  # Each batch's age, and the sampler/trainer gap at that age.
      lag = step - version
      m["rollout/version_lag"] = float(lag)  # The oldest rows': a refill's draws are of age 0.
      refilled_share = stats.get("dynamic_sampling/refilled_groups", 0.0) / (c.rollout_batch // k)
      m["rollout/version_lag_mean"] = lag * (1.0 - refilled_share)
      m.update({f"sampling/lag_{lag}/{name.removeprefix('sampling/')}": v
                for name, v in list(m.items()) if name.startswith("sampling/")})
    if with_gold:
      m["objective/gold"] = float(gold.gold_rewards(rows, texts).mean())
    t2 = time.perf_counter()
    timing["generate"] += t1 - t0
    timing["total"] += t2 - t0
    m["time/generation_share"] = timing["generate"] / timing["total"]
    m["time/episodes_per_s"] = timing["episodes"] / timing["total"]  # Every draw's samples.
    return state, m

  def held_out(params) -> dict[str, float]:
    """One point of the over-optimisation curve, on the same posts and rng every time."""
    return heldout.curve_point(exp, params, lora.reference(params, ref_params), eval_examples,
                               eval_key, curve_temperature, c.rollout_batch, reward_fn)

  def periodic(state, done, m) -> dict[str, float]:
    out = dict(m) if done % c.log_every == 0 or done == c.steps else {}
    if done % c.eval_every == 0 or done == c.steps:
      point = held_out(state.params["policy"])
      out.update({f"eval/{name}": v for name, v in point.items()})
      rollout = {"rm_score": m["objective/scores"], "kl": m["objective/kl"]}
      if with_gold:
        rollout["gold"] = m["objective/gold"]
      metrics_lib.info(f"{task} step {done}: {heldout.describe(rollout)} | held out: "
                       f"{heldout.describe(point)}")
    return out

  if start == 0:  # The curve's first point: the SFT policy itself.
    writer.write(0, {f"eval/{name}": v for name, v in held_out(state.params["policy"]).items()})
  state = loop.run(state, c.steps, one_step, periodic, ckpt, writer,
                   c.rollout_batch * (config.format.prompt_len + config.format.response_len),
                   task, meta, c.skip_nonfinite,
                   extra=(lambda: _ahead_to_save(ahead)) if staleness else None)
  writer.close()
  ckpt.close()
  return state


def _ahead_to_save(ahead: dict) -> dict | None:
  """The batches sampled ahead, as host arrays a checkpoint holds (by iteration, as text); None
  when there are none (the last iterations')."""
  return {str(s): {"version": np.int64(v), "idx": np.asarray(idx), "batch": to_host(batch)}
          for s, (v, idx, batch) in ahead.items()} or None


def _restore_ahead(exp: experiment.Experiment, saved: Any) -> dict:
  """The batches sampled ahead that a restored checkpoint held (`saved`: its extra tree, or None),
  back on the trainer's devices."""
  return {int(s): (int(v["version"]), np.asarray(v["idx"]),
                   exp.parallel.put(dict(v["batch"]), exp.parallel.batch))
          for s, v in (saved or {}).items()}
