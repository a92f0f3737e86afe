"""The rollout engine: prompts in; k responses per prompt, their masks, the policy's and the
reference's per-token log-probabilities and the reward at eos out. Every online method (PPO, RLOO,
GRPO, online DPO), every sampling method (best-of-N, expert iteration, Quark) and the evaluation
draw their samples here.

Truncation (Huang et al., "The N+ implementation details of RLHF with PPO"): a response ends at its
first eos, which it keeps; every position after it is padding, masked out of log-probs, KL and
losses. The reward model reads its score at the eos (the last real token). A response that reaches
`format.response_len` without an eos gets `no_eos_score` in place of its score when
`penalize_no_eos` is set (lm-human-preferences' rule; TRL's `missing_eos_penalty` subtracts instead).

The k samples of a prompt are adjacent rows: rows g·k … g·k + k − 1 answer prompt g, so group
statistics (RLOO's leave-one-out baseline, GRPO's group normalisation, online DPO's pairs) reshape
to [prompts, k].

KL(π ‖ π_ref) is estimated on the policy's own samples at temperature T as the mean over samples of
Σ_t log π(y_t | ·) − log π_ref(y_t | ·), both at T (the quantity PPO penalises).

Sampling runs in the rollout layout (parallel/rollout.py, config block `rollout`): once per rollout
the policy is copied into it (`rollout_params`: compute dtype, tensor parallel, no FSDP), sampled,
and dropped; the KV cache lives there too. Batches come back to the trainer's layout when a step
takes them. Each batch carries the sampler's own log-probs (`sampler_logprobs`), so the trainer can
report how far its recomputation is from them and correct for it (truncated importance sampling).
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from rlhfjax.data import pipeline
from rlhfjax.data.tokenizer import before_eos
from rlhfjax.models.config import ModelConfig
from rlhfjax.models import lora
from rlhfjax.models import policy
from rlhfjax.models import reward
from rlhfjax.models import sampling
from rlhfjax.models import sharding_rules
from rlhfjax.models import transformer
from rlhfjax.parallel import rollout as parallel_rollout
from rlhfjax.parallel.sharding import Parallel
from rlhfjax.parallel.sharding import to_host
from rlhfjax.rollout import generate
from rlhfjax.rollout import reward_functions
from rlhfjax.training import experiment
from rlhfjax.training import metrics


def sampling_config(exp: experiment.Experiment, temperature: float, top_k: int = 0,
                    top_p: float = 1.0) -> sampling.SamplingConfig:
  """The sampler's settings for a response of `format.response_len` tokens, with the rollout's
  early stop and cache blocks (config block `rollout`)."""
  r = exp.config.rollout
  return sampling.SamplingConfig(max_new_tokens=exp.config.format.response_len,
                                 temperature=temperature, top_k=top_k, top_p=top_p,
                                 eos_id=exp.tokenizer.eos_ids, pad_id=exp.tokenizer.pad_id,
                                 early_stop=bool(r.early_stop),
                                 cache_block=int(r.cache_block))


def _free_bytes(devices: list) -> float | None:
  """Bytes free on the first of `devices` this process holds beside what it holds now (90% of its
  limit, leaving XLA's temporaries room), or None where the backend does not say (CPU). Process
  0's figure on every process, so that all of them choose the same layout."""
  local = [d for d in devices if d.process_index == jax.process_index()]
  stats = (local or jax.local_devices())[0].memory_stats()
  if not stats or "bytes_limit" not in stats:
    return None
  free = np.float64(0.9 * stats["bytes_limit"] - stats.get("bytes_in_use", 0))
  if jax.process_count() > 1:
    free = multihost_utils.broadcast_one_to_all(free)
  return float(free)


def rollout_layout(exp: experiment.Experiment,
                   rows: int) -> tuple[parallel_rollout.Layout, Parallel]:
  """The rollout layout for batches of `rows` rows and the Parallel of its mesh: chosen the first
  time a run samples batches of that size (with `mesh='auto'`, beside what the devices then hold:
  the training state), said in one line, and kept for the rest of the run."""
  if rows not in exp.rollouts:
    length = exp.config.format.prompt_len + exp.config.format.response_len
    # The sampler's own devices (rollout.placement='split'), else the trainer's.
    devices = list(exp.sampler_devices or np.asarray(exp.parallel.mesh.devices).reshape(-1))
    # One fast interconnect: a TPU slice's chips (ICI), else one process's devices (a GPU host).
    domain = ((lambda d: getattr(d, "slice_index", 0)) if devices[0].platform == "tpu"
              else (lambda d: d.process_index))
    local = sum(domain(d) == domain(devices[0]) for d in devices)
    train_shape = (dict(exp.parallel.mesh.shape) if not exp.sampler_devices
                   else {"data": len(devices), "fsdp": 1, "tensor": 1})
    layout = parallel_rollout.choose(exp.config.rollout, exp.model, train_shape,
                                     platform=devices[0].platform, fast_domain=local, rows=rows,
                                     length=length, free_bytes=_free_bytes(devices))
    exp.rollouts[rows] = (layout, Parallel(parallel_rollout.mesh(layout, devices)))
    metrics.info(parallel_rollout.describe(layout, exp.model, rows, length))
  return exp.rollouts[rows]


def _axes(exp: experiment.Experiment, params: Any) -> Any:
  """The logical axes of a policy tree (with its LoRA adapters, if it carries them)."""
  base = transformer.param_axes(exp.model)
  return lora.axes(base, exp.lora) if lora.has_adapters(params) else base


def rollout_params(exp: experiment.Experiment, params: Any, rows: int) -> Any:
  """The policy's weights in the rollout layout for batches of `rows` rows: a copy in the
  layout's dtype and shardings (made once per rollout; a tree already there is returned as it
  is). Drop it after the rollout."""
  layout, par = rollout_layout(exp, rows)
  return parallel_rollout.reshard(params, _axes(exp, params), layout, par.mesh)


def _rows(par: Parallel, x: Any) -> Any:
  """Token rows split over the rollout's replicas (replicated where they do not divide)."""
  spec = sharding_rules.spec(("batch",) + (None,) * (np.ndim(x) - 1), np.shape(x), par.mesh)
  return par.put(x, jax.sharding.NamedSharding(par.mesh, spec))


def _sample(exp: experiment.Experiment, params: Any, prompt: Any, prompt_mask: Any,
            rng: jax.Array, scfg: sampling.SamplingConfig, k: int) -> sampling.SampleOutput:
  """`sampling.sample` in the rollout layout of `len(prompt) * k` rows."""
  _, par = rollout_layout(exp, len(prompt) * k)
  params = rollout_params(exp, params, len(prompt) * k)
  with jax.set_mesh(par.mesh):
    return sampling.sample(params, _rows(par, prompt), _rows(par, prompt_mask), rng, exp.model,
                           scfg, k=k)


def repeat_prompts(prompts: pipeline.Batch, k: int) -> pipeline.Batch:
  """Each prompt row `k` times, the copies adjacent (rows g·k … g·k + k − 1 are prompt g)."""
  return prompts if k == 1 else {key: jnp.repeat(v, k, axis=0) for key, v in prompts.items()}


def sample_batch(params: Any, prompts: pipeline.Batch, rng: jax.Array, exp: experiment.Experiment,
                 temperature: float, top_k: int = 0, top_p: float = 1.0,
                 k: int = 1) -> pipeline.Batch:
  """`k` sampled responses per prompt (padding after the first eos), with their prompts, the
  response mask and the sampler's per-token log-probs (`sampler_logprobs`, 0 at padding): a batch
  of `k` × prompts rows, each prompt's samples adjacent. `params` may be the trainer's (copied
  into the rollout layout here) or `rollout_params`' copy."""
  out = _sample(exp, params, prompts["prompt"], prompts["prompt_mask"], rng,
                sampling_config(exp, temperature, top_k, top_p), k)
  prompts = repeat_prompts({"prompt": prompts["prompt"], "prompt_mask": prompts["prompt_mask"]}, k)
  mask = jnp.arange(out.tokens.shape[1])[None] < out.lengths[:, None]
  return {"prompt": prompts["prompt"], "prompt_mask": prompts["prompt_mask"],
          "response": out.tokens, "response_mask": mask, "sampler_logprobs": out.logprobs}


def generate_split(exp: experiment.Experiment, params: Any, prompts: pipeline.Batch,
                   rng: jax.Array, batch_size: int, temperature: float, top_k: int = 0,
                   top_p: float = 1.0) -> dict[str, np.ndarray]:
  """`generate.generate` (a response to every prompt, in fixed batches) in the rollout layout,
  the policy copied into it once."""
  scfg = sampling_config(exp, temperature, top_k, top_p)
  _, par = rollout_layout(exp, batch_size)
  params = rollout_params(exp, params, batch_size)
  with jax.set_mesh(par.mesh):
    return generate.generate(params, exp.model, scfg, prompts, rng, batch_size,
                             place=functools.partial(_rows, par))


def decode(exp: experiment.Experiment, response: Any) -> list[str]:
  return [exp.tokenizer.decode(r).strip() for r in to_host(response)]


def add_function_rewards(exp: experiment.Experiment,
                         functions: Sequence[reward_functions.RewardFunction],
                         batch: pipeline.Batch, examples: Sequence[Any]
                         ) -> tuple[pipeline.Batch, dict[str, np.ndarray]]:
  """`batch` with the reward functions' weighted sum (`function_rewards`) and the reward model's
  weight (`model_weight`) per row, which `rewards_at_eos` adds up; and each function's values
  [B] (NaN for None). `examples[i]` is the example of row i."""
  response = to_host(batch["response"])
  tok = exp.tokenizer
  ids = [before_eos(r, tok.eos_ids, (tok.pad_id,)) for r in response]
  texts = [tok.decode(r).strip() for r in response]
  total, values = reward_functions.evaluate(functions, examples, texts, ids)
  weight = float(exp.config.reward.model_weight)
  added = exp.parallel.put({"function_rewards": total,
                            "model_weight": np.full(total.shape, weight, np.float32)},
                           exp.parallel.batch)
  return {**batch, **added}, values


def log_completions(path: str, step: int, examples: Sequence[Any], texts: Sequence[str],
                    values: dict[str, np.ndarray], total: np.ndarray) -> None:
  """One line per completion of iteration `step` in `path` (as TRL's `log_completions`): its
  example's id, the completion, each function's reward (null for None) and their weighted sum."""
  metrics.append_rows(path, step, [
      {"id": getattr(e, "id", None), "completion": t,
       "rewards": {name: None if np.isnan(v[i]) else float(v[i]) for name, v in values.items()},
       "function_reward": float(total[i])}
      for i, (e, t) in enumerate(zip(examples, texts, strict=True))])


def _kl(params: Any, ref_params: Any, batch: pipeline.Batch, ref_prompt: pipeline.Batch,
        cfg: ModelConfig, temperature: float) -> jax.Array:
  """Σ_t log π(y_t) − log π_ref(y_t) [B] of the sampled `batch`, the reference reading the
  responses after `ref_prompt` (its `prompt`, `prompt_mask`)."""
  return (policy.response_logprobs(params, batch, cfg, temperature=temperature)
          - policy.response_logprobs(ref_params, {**batch, **ref_prompt}, cfg,
                                     temperature=temperature)).sum(-1)


_kl_fn = jax.jit(_kl, static_argnames=("cfg", "temperature"))


def sample_texts(exp: experiment.Experiment, params: Any, examples: Sequence[pipeline.Tldr],
                 rng: jax.Array, temperature: float, batch_size: int, ref_params: Any = None,
                 top_k: int = 0, top_p: float = 1.0,
                 control: str = "") -> tuple[list[str], np.ndarray | None]:
  """One response per example, and (with `ref_params`) each sample's KL estimate to the reference
  (only meaningful without top-k/top-p truncation). A `control` code goes before each prompt the
  policy reads; the reference reads the plain prompt, so the KL is to the reference's own sampler
  (SFT answering the post), as best-of-N's analytic KL is."""
  plen = exp.config.format.prompt_len
  prompts = pipeline.encode_prompts(exp.tokenizer, examples, plen, [control] * len(examples))
  plain = pipeline.encode_prompts(exp.tokenizer, examples, plen) if control else prompts
  texts, kls = [], []
  batches = metrics.progress(pipeline.fixed_batches(prompts, batch_size),
                             -(-len(examples) // batch_size), "sampling", "batch")
  sampler = rollout_params(exp, params, batch_size)  # One copy for every batch.
  for i, ((b, n), (p, _)) in enumerate(zip(batches, pipeline.fixed_batches(plain, batch_size))):
    batch = sample_batch(sampler, b, jax.random.fold_in(rng, i), exp, temperature, top_k, top_p)
    texts += decode(exp, batch["response"])[:n]
    if ref_params is not None:
      batch = {key: to_host(v) for key, v in batch.items() if key != "sampler_logprobs"}
      ref_prompt = {"prompt": p["prompt"], "prompt_mask": p["prompt_mask"]}
      kls.append(to_host(_kl_fn(params, ref_params, batch, ref_prompt, exp.model,
                                temperature))[:n])
  return texts, (np.concatenate(kls) if kls else None)


def penalize_missing_eos(scores: jax.Array, response: jax.Array, eos_id: sampling.EosIds,
                         penalty_score: float) -> jax.Array:
  """Scores with `penalty_score` in place of the reward of every response that has no eos."""
  return jnp.where(sampling.is_eos(response, eos_id).any(-1), scores, penalty_score)


def rewards_at_eos(reward_params: Any, batch: pipeline.Batch, cfg: ModelConfig, eos_id: sampling.EosIds,
                   no_eos_score: float | None, group: int = 1) -> tuple[jax.Array, jax.Array]:
  """(scores, raw scores) [B]: the reward model read at each response's last real token, and the
  scores after the truncation rule (`no_eos_score` for a response without eos; None: no rule).
  `group` k > 1: each prompt's k adjacent samples share one computation of it.

  A batch with reward functions' values (`function_rewards` [B], their weighted sum, and
  `model_weight` [B], the reward model's weight: reward_functions.py) has the reward model's score
  times its weight plus theirs; `reward_params` None: the functions' alone."""
  raw = None if reward_params is None else reward.score(reward_params, batch, cfg, group=group)
  if "function_rewards" in batch:
    raw = batch["function_rewards"] + (0.0 if raw is None else batch["model_weight"] * raw)
  if no_eos_score is None:
    return raw, raw
  return penalize_missing_eos(raw, batch["response"], eos_id, no_eos_score), raw


def experience(params: Any, ref_params: Any, reward_params: Any, batch: pipeline.Batch, *,
               cfg: ModelConfig, temperature: float, eos_id: sampling.EosIds,
               no_eos_score: float | None, group: int = 1) -> dict[str, jax.Array]:
  """What every critic-free online method needs of a sampled batch, in one pure function: per-token
  log-probs of the policy (`old_logprobs`, log π_old: the policy before the step's updates; TRL's
  PPO/RLOO trainers and lm-human-preference-details call them `logprobs`, TRL's GRPO
  `old_per_token_logps`) and the reference at the sampling temperature and the policy's entropy
  [B, R] (0 at padding), and the reward model's scores at eos [B] (raw and after truncation).
  `group` k > 1: the three models compute each prompt once for its k adjacent samples
  (policy.hidden_states)."""
  logp, entropy = policy.response_token_stats(params, batch, cfg, temperature=temperature,
                                              group=group)
  ref_logp = policy.response_logprobs(ref_params, batch, cfg, temperature=temperature, group=group)
  scores, raw = rewards_at_eos(reward_params, batch, cfg, eos_id, no_eos_score, group)
  return {"old_logprobs": logp, "ref_logprobs": ref_logp, "entropy": entropy, "scores": scores,
          "raw_scores": raw}
