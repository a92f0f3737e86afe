"""A method's update step as its run trains it, built in one place (DESIGN.md, "Compile what
trains"): each method's `program(exp)` returns a `Program`, and its training loop, task=compile,
task=memory and its checkpoint restore all take the step, its arguments and its state from there,
so a figure for a TPU slice is one for the program a user runs (LoRA, eos, schedule and all)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from rlhfjax.parallel.sharding import Parallel
from rlhfjax.training import experiment
from rlhfjax.training import loaders
from rlhfjax.training import optimizer


@dataclasses.dataclass(frozen=True)
class Program:
  """One method's jitted update step with the abstract sharded arguments its run passes
  (`step.lower(*args)` compiles the run's program), its abstract train state (a restore target),
  the state's shardings and its optimizer."""
  step: Callable  # Parallel.jit(...): called by the loop; `.lower(*args)` by compile and memory.
  args: tuple
  state: Any
  shardings: Any
  tx: optax.GradientTransformation

  def lower(self) -> Any:
    """The step lowered for its abstract arguments: the run's program, nothing allocated."""
    return self.step.lower(*self.args)

  def init(self, make: Callable[..., Any], *args: Any) -> Any:
    """The train state `make(*args)` built directly on the mesh in the step's layout."""
    return jax.jit(make, out_shardings=self.shardings)(*args)


def tokens(par: Parallel, batch: int, names: dict[str, int]) -> dict[str, jax.ShapeDtypeStruct]:
  """Abstract token batches `name: [batch, length]` with their masks, split over the data axes."""
  out = {}
  for name, length in names.items():
    out[name] = jax.ShapeDtypeStruct((batch, length), jnp.int32, sharding=par.batch)
    out[f"{name}_mask"] = jax.ShapeDtypeStruct((batch, length), jnp.bool_, sharding=par.batch)
  return out


def key(par: Parallel) -> jax.ShapeDtypeStruct:
  """An abstract rng key, replicated."""
  k = jax.eval_shape(lambda: jax.random.key(0))
  return jax.ShapeDtypeStruct(k.shape, k.dtype, sharding=par.replicated)


def shardings_of(tree: Any) -> Any:
  """The shardings of an abstract sharded tree (None stays None)."""
  return None if tree is None else jax.tree.map(lambda x: x.sharding, tree)


def against_reference(exp: experiment.Experiment, task: str, steps: int, train_step: Callable,
                      batch: dict[str, jax.ShapeDtypeStruct], with_ref: bool = True) -> Program:
  """The program of an offline policy method (DPO, SimPO, KTO, Quark) that trains the policy
  against a frozen reference on batches of `<task>.batch_size` rows: AdamW over `steps` steps, the
  policy with its adapters and remat policy and dropout off, and the reference tree where
  `with_ref` (the loss reads one) unless the policy is a LoRA policy (whose base is its reference).
  `train_step(state, ref, batch, *, cfg, tx)` carries its method's own settings bound."""
  c, par = exp.config[task], exp.parallel
  par.check_batch(f"{task}.batch_size", c.batch_size)
  tx = optimizer.adamw(c, steps, exp.trainable("policy"))
  state, shardings = loaders.policy_template(exp, tx)
  ref = state.params if with_ref and not exp.lora.applies_to("policy") else None
  cfg = dataclasses.replace(exp.model_for("policy"), dropout=0.0)
  step = par.jit(functools.partial(train_step, cfg=cfg, tx=tx),
                 (shardings, shardings_of(ref), par.batch), (shardings, par.replicated), (0,))
  return Program(step, (state, ref, batch), state, shardings, tx)
