"""PPO's rollout steps for task=compile (rlhfjax/stages/compile.py): the prefill of the prompts,
one decode step with its KV cache (that of the last cache block, which reads the most slots) and
the copy of the policy into the rollout layout (parallel/rollout.py), each with abstract sharded
arguments in the layout a run on the slice would choose, beside what stays resident in HBM while
they run (PPO's training state and frozen models)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from rlhfjax.models import flops
from rlhfjax.models import lora
from rlhfjax.models import sampling
from rlhfjax.models import sharding_rules
from rlhfjax.models import transformer
from rlhfjax.parallel import rollout as parallel_rollout
from rlhfjax.parallel.sharding import Parallel
from rlhfjax.stages import costs
from rlhfjax.stages import memory
from rlhfjax.training import experiment
from rlhfjax.training.program import Program, key, shardings_of, tokens

RESHARD = "rollout_reshard"  # With the rollout steps where the rollout's layout is another.


def steps(exp: experiment.Experiment, prog: Program, names: set[str], fast_domain: int,
             hbm_usable: float | None) -> list[costs.Step]:
  """PPO's rollout steps (those of `names`: prefill, decode; and the copy into the rollout layout)
  beside what stays resident: PPO's training state and frozen models (`prog`'s arguments)."""
  config, cfg, par = exp.config, exp.model, exp.parallel
  p_len, r_len = config.format.prompt_len, config.format.response_len
  seq, b, out = p_len + r_len, config.ppo.rollout_batch, []
  everything = costs.per_chip(prog.args[:3])
  plan = lambda batch, logit_tokens, length=seq: memory.plan(cfg, par.mesh, batch, length,
                                                             logit_tokens=logit_tokens)
  # The rollout layout, chosen beside what stays resident: the training state, the frozen models.
  layout = parallel_rollout.choose(config.rollout, cfg, dict(par.mesh.shape), platform="tpu",
                                   fast_domain=fast_domain, rows=b, length=seq,
                                   free_bytes=(None if hbm_usable is None
                                               else hbm_usable - everything))
  rpar = Parallel(parallel_rollout.mesh(layout, par.mesh.devices))
  trainer = prog.args[0].params["policy"]
  cast = functools.partial(parallel_rollout.cast, dtype=layout.dtype)
  policy_axes = lora.model_axes(transformer.param_axes(cfg), exp.lora, "policy")
  policy = rpar.abstract(jax.eval_shape(cast, trainer),
                         parallel_rollout.shardings(policy_axes, trainer, rpar.mesh))
  policy_sh = shardings_of(policy)
  # The trainer's own layout (rollout.mesh='train') samples from its weights: no copy.
  same = all(a.dtype == r.dtype and a.sharding == r.sharding
             for a, r in zip(jax.tree.leaves(trainer), jax.tree.leaves(policy)))
  resident = everything - (costs.per_chip(trainer) if same else 0)
  where = {**layout.shape, "dtype": layout.dtype, "reason": layout.reason}
  cache = jax.eval_shape(lambda: transformer.init_cache(cfg, b, seq))
  cache_sh = _cache_shardings(rpar, cache)
  logits_sh = NamedSharding(rpar.mesh, sharding_rules.spec(("batch", "vocab"),
                                                           (b, cfg.vocab_size), rpar.mesh))
  if not same:  # Once per rollout: cast where the weights lie, then XLA's resharding.
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
    fn = rpar.jit(functools.partial(sampling.decode_step, cfg=cfg, scfg=scfg, prompt_len=p_len,
                                    cache_read=read),
                  (policy_sh, cache_sh, logits_sh, rows, rpar.replicated, rpar.replicated, rows),
                  (cache_sh, logits_sh, rows, (rows, rows, rows)), (1,))
    abstract = lambda shape, dtype, s: jax.ShapeDtypeStruct(shape, dtype, sharding=s)
    kv = rpar.abstract(cache, cache_sh)
    logits = abstract((b, cfg.vocab_size), jnp.float32, logits_sh)
    args = (policy, kv, logits, abstract((b,), jnp.bool_, rows),
            abstract((), jnp.int32, rpar.replicated), key(rpar),
            abstract((b,), jnp.int32, rows))
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


def _cache_shardings(par: Parallel, cache: Any) -> Any:
  """KV cache: [B, kv_heads, length, Dh] per layer split by batch and kv heads; mask by batch."""
  def one(x):
    axes = ("batch", "kv_heads", "length", "head_dim") if x.ndim == 4 else ("batch", "length")
    return NamedSharding(par.mesh, sharding_rules.spec(axes, x.shape, par.mesh))
  return jax.tree.map(one, cache)
