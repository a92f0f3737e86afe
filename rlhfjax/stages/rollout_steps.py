"""PPO's rollout steps for task=compile (rlhfjax/stages/compile.py): the prefill of the prompts,
one decode step with its KV cache (that of the last cache block, which reads the most slots) and
the copy of the policy into the rollout layout (parallel/rollout.py), each with abstract sharded
arguments in the layout a run on the slice would choose, beside what stays resident in HBM while
they run (PPO's training state and frozen models).

Under rollout.placement='split' (parallel/placement.py) the sampler has chips of its own: the
layout is chosen over them with nothing else resident, and the copy is the push from the
trainer's chips (`PUSH`). One jit cannot span two disjoint device sets (JAX: "incompatible
devices"; a run's `jax.device_put` copies the shards outside any XLA program), so the push
compiles over the union of the two: the trainer's chips and the sampler's stacked along a
leading `side` axis, the policy in the trainer's shardings on side 0 and, cast to the rollout
dtype, in the rollout shardings on every sampler side (`push_step`). Its collective-permutes are
the bytes that cross from the trainer's chips to the sampler's."""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from rlhfjax.errors import ConfigError
from rlhfjax.models import flops
from rlhfjax.models import lora
from rlhfjax.models import sampling
from rlhfjax.models import sharding_rules
from rlhfjax.models import transformer
from rlhfjax.parallel import rollout as parallel_rollout
from rlhfjax.parallel.mesh import AXES
from rlhfjax.parallel.sharding import Parallel
from rlhfjax.stages import costs
from rlhfjax.stages import memory
from rlhfjax.training import experiment
from rlhfjax.training.program import Program, key, shardings_of, tokens

RESHARD = "rollout_reshard"  # With the rollout steps where the rollout's layout is another.
PUSH = "rollout_push"  # rollout.placement='split': the trainer's policy to the sampler's chips.
SIDE = "side"  # The union mesh's leading axis: the trainer's chips, then the sampler's.


def steps(exp: experiment.Experiment, prog: Program, names: set[str], fast_domain: int,
          hbm_usable: float | None, sampler: Sequence[Any] = ()) -> list[costs.Step]:
  """PPO's rollout steps (those of `names`: prefill, decode; and the copy into the rollout layout)
  beside what stays resident: PPO's training state and frozen models (`prog`'s arguments). With
  `sampler` (the sampler's own chips, rollout.placement='split'), they run there with nothing
  else resident, and the copy is the push from the trainer's chips (`push_step`)."""
  config, cfg, par = exp.config, exp.model, exp.parallel
  p_len, r_len = config.format.prompt_len, config.format.response_len
  seq, b, out = p_len + r_len, config.ppo.rollout_batch, []
  everything = costs.per_chip(prog.args[:3])
  held = 0 if sampler else everything  # What the sampler's chips hold beside the rollout.
  plan = lambda batch, logit_tokens, length=seq: memory.plan(cfg, par.mesh, batch, length,
                                                             logit_tokens=logit_tokens)
  # The rollout layout, chosen beside what stays resident: the training state, the frozen models
  # (as engine.rollout_layout chooses it: over the sampler's own chips, as replicas, when split).
  devices = list(sampler) or list(par.mesh.devices.reshape(-1))
  shape = {"data": len(devices), "fsdp": 1, "tensor": 1} if sampler else dict(par.mesh.shape)
  layout = parallel_rollout.choose(config.rollout, cfg, shape, platform="tpu",
                                   fast_domain=fast_domain, rows=b, length=seq,
                                   free_bytes=(None if hbm_usable is None
                                               else hbm_usable - held))
  rpar = Parallel(parallel_rollout.mesh(layout, devices))
  # The prompts and the cache split over the replicas (48 sampler chips at tensor 8: 6 replicas
  # cannot share 64 rows), said before anything compiles.
  rpar.check_batch("ppo.rollout_batch", b)
  trainer = prog.args[0].params["policy"]
  cast = functools.partial(parallel_rollout.cast, dtype=layout.dtype)
  policy_axes = lora.model_axes(transformer.param_axes(cfg), exp.lora, "policy")
  policy = rpar.abstract(jax.eval_shape(cast, trainer),
                         parallel_rollout.shardings(policy_axes, trainer, rpar.mesh))
  policy_sh = shardings_of(policy)
  # The trainer's own layout (rollout.mesh='train') samples from its weights: no copy.
  same = all(a.dtype == r.dtype and a.sharding == r.sharding
             for a, r in zip(jax.tree.leaves(trainer), jax.tree.leaves(policy)))
  resident = held - (costs.per_chip(trainer) if same else 0)
  where = {**layout.shape, "dtype": layout.dtype, "reason": layout.reason}
  cache = jax.eval_shape(lambda: transformer.init_cache(cfg, b, seq))
  cache_sh = _cache_shardings(rpar, cache)
  logits_sh = NamedSharding(rpar.mesh, sharding_rules.spec(("batch", "vocab"),
                                                           (b, cfg.vocab_size), rpar.mesh))
  if sampler:  # Once per update: the trainer's policy pushed to the sampler's chips.
    out.append(push_step(trainer, policy, layout.dtype, everything, where))
  elif not same:  # Once per rollout: cast where the weights lie, then XLA's resharding.
    fn = jax.jit(cast, in_shardings=(prog.shardings.params["policy"],), out_shardings=policy_sh)
    out.append(costs.Step(RESHARD, fn, (trainer,), 0.0, 0.0, 0, {}, costs.per_chip(policy), everything,
                    rpar.mesh, where))
  if "ppo_prefill" in names:
    fn = rpar.jit(functools.partial(sampling.prefill, cfg=cfg, max_new_tokens=r_len),
                  (policy_sh, rpar.batch, rpar.batch), (cache_sh, logits_sh))
    prompts = tokens(rpar, b, {"prompt": p_len})
    f = flops.forward(cfg, b, p_len, logit_tokens=1)
    # The prompt's keys and values of every layer, then the padded cache built from them.
    planned = plan(b, 1, p_len)["forward_step"] + 2 * plan(b, 1)["kv_cache"]
    out.append(costs.Step("ppo_prefill", fn, (policy, prompts["prompt"], prompts["prompt_mask"]), f, f,
                    b * p_len, {"policy": (1, False)}, planned, resident, rpar.mesh, where))
  if "ppo_decode" in names:
    # The run's eos ids (pad ids only enter as values: any compiles to the same program). The
    # step of the last cache block: it reads the most slots (the worst case; `whole_ppo` scales the others).
    scfg = sampling.SamplingConfig(max_new_tokens=r_len, eos_id=exp.eos_ids, pad_id=0,
                                   temperature=config.ppo.temperature)
    read = 0  # The last block reads every slot (sampling.blocks).
    rows = NamedSharding(rpar.mesh, sharding_rules.spec(("batch",), (b,), rpar.mesh))
    fn = rpar.jit(functools.partial(sampling.decode_step, cfg=cfg, scfg=scfg.program(),
                                    prompt_len=p_len, cache_read=read),
                  (policy_sh, cache_sh, logits_sh, rows, rpar.replicated, rpar.replicated, rows,
                   rpar.replicated),
                  (cache_sh, logits_sh, rows, (rows, rows, rows)), (1,))
    abstract = lambda shape, dtype, s: jax.ShapeDtypeStruct(shape, dtype, sharding=s)
    kv = rpar.abstract(cache, cache_sh)
    logits = abstract((b, cfg.vocab_size), jnp.float32, logits_sh)
    args = (policy, kv, logits, abstract((b,), jnp.bool_, rows),
            abstract((), jnp.int32, rpar.replicated), key(rpar),
            abstract((b,), jnp.int32, rows),
            sampling.Knobs(*(abstract((), jnp.float32, rpar.replicated) for _ in range(2))))
    f = flops.forward(cfg, b, 1, keys=read or seq)
    planned = plan(b, 1)
    # Weights as the matmuls read them; under fsdp they are gathered, written and read again.
    weights = parallel_rollout.weight_bytes(cfg, layout.tensor, cfg.dtype)
    kv_slot = costs.per_chip({"k": kv["k"], "v": kv["v"]}) / seq
    hbm = (costs.per_chip(policy) + (2 * weights if layout.fsdp > 1 else 0)
           + kv_slot * ((read or seq) + 1) + 2 * costs.per_chip(logits))
    out.append(costs.Step("ppo_decode", fn, args, f, f, b, {"policy": (1, False)},
                    planned["params"] + planned["kv_cache"], resident, rpar.mesh, where,
                    weights, kv_slot, read or seq, hbm))
  return out


def push_step(trainer: Any, policy: Any, dtype: str, resident: int, where: dict) -> costs.Step:
  """The push as one program over the union of the trainer's chips (`trainer`'s mesh, first) and
  the sampler's (`policy`'s rollout mesh), stacked along `SIDE`: side 0 holds the policy in the
  trainer's shardings, the program casts it to `dtype` and puts it, in the rollout shardings, on
  every sampler side (the trainer's side gets zeros: computed where they lie, nothing moved).
  The sides are as many chips as the trainer has, so the trainer's chips must divide the slice
  and a rollout replica (its fsdp x tensor chips) the trainer's chips (ConfigError otherwise)."""
  t_mesh = jax.tree.leaves(trainer)[0].sharding.mesh
  r_mesh = jax.tree.leaves(policy)[0].sharding.mesh
  t_dev, r_dev = t_mesh.devices.reshape(-1), r_mesh.devices.reshape(-1)
  per_side, fsdp, tensor = t_dev.size, r_mesh.shape["fsdp"], r_mesh.shape["tensor"]
  if r_dev.size % per_side or per_side % (fsdp * tensor):
    raise ConfigError(f"rollout.sampler_share: the push compiles over sides of the trainer's "
                      f"{per_side} chips; the sampler's {r_dev.size} chips (replicas of "
                      f"fsdp x tensor = {fsdp * tensor}) do not divide into them")
  sides = 1 + r_dev.size // per_side
  union = np.concatenate([t_dev, r_dev])
  axes = (SIDE, *AXES)
  mesh = lambda shape: Mesh(union.reshape(sides, *shape), axes,
                            axis_types=(AxisType.Auto,) * len(axes))
  m_in, m_out = mesh(t_mesh.devices.shape), mesh((per_side // (fsdp * tensor), fsdp, tensor))
  stacked = lambda x, m: jax.ShapeDtypeStruct(
      (sides, *x.shape), x.dtype,
      sharding=NamedSharding(m, PartitionSpec(SIDE, *x.sharding.spec)))
  args = jax.tree.map(lambda x: stacked(x, m_in), trainer)
  out_sh = jax.tree.map(lambda x: stacked(x, m_out).sharding, policy)

  def push(params: Any) -> Any:
    cast = parallel_rollout.cast(jax.tree.map(lambda x: x[0], params), dtype)
    return jax.tree.map(lambda x: jnp.concatenate(
        [jnp.zeros((1, *x.shape), x.dtype), jnp.broadcast_to(x, (sides - 1, *x.shape))]), cast)

  fn = jax.jit(push, out_shardings=out_sh)
  return costs.Step(PUSH, fn, (args,), 0.0, 0.0, 0, {}, costs.per_chip(policy), resident, m_in,
                    where)


def _cache_shardings(par: Parallel, cache: Any) -> Any:
  """KV cache: [B, kv_heads, length, Dh] per layer split by batch and kv heads; mask by batch."""
  def one(x):
    axes = ("batch", "kv_heads", "length", "head_dim") if x.ndim == 4 else ("batch", "length")
    return NamedSharding(par.mesh, sharding_rules.spec(axes, x.shape, par.mesh))
  return jax.tree.map(one, cache)
