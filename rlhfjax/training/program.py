"""A method's update step as its run trains it, built in one place (DESIGN.md, "Compile what
trains"): each method's `program(exp)` returns a `Program`, and its training loop, task=compile,
task=memory and its checkpoint restore all take the step, its arguments and its state from there,
so a figure for a TPU slice is one for the program a user runs (LoRA, eos, schedule and all)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from rlhfjax.parallel.sharding import Parallel


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
