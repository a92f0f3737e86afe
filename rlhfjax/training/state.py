"""The train state: step, parameters and optimizer state, as one pytree."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any

  @classmethod
  def create(cls, params: Any, tx: optax.GradientTransformation) -> "TrainState":
    return cls(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

  def apply_gradients(self, grads: Any, tx: optax.GradientTransformation) -> "TrainState":
    updates, opt_state = tx.update(grads, self.opt_state, self.params)
    return self.replace(step=self.step + 1, params=optax.apply_updates(self.params, updates),
                        opt_state=opt_state)
