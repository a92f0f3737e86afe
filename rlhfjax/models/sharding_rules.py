"""The one table of sharding rules: logical axis name -> mesh axes.

Models name every parameter dimension (`transformer.param_axes`, `heads.param_axes`); batches have
a leading `batch` axis. A dimension whose size the mesh axes do not divide is replicated instead
(e.g. 4 heads on tensor=8), so any mesh runs any model; `memory.plan` shows the cost.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
from jax.sharding import Mesh, PartitionSpec

# Data parallel over both data axes; fsdp shards the embedding dimension of every weight (ZeRO-3:
# gathered per layer as it is used); tensor shards heads, the MLP's hidden units and the vocabulary.
LOGICAL_RULES: dict[str, tuple[str, ...]] = {
    "batch": ("data", "fsdp"),
    "embed": ("fsdp",),
    "vocab": ("tensor",),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "mlp": ("tensor",),
    "head_dim": (),
    "layers": (),
    "length": (),
}


def spec(axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
         rules: dict[str, tuple[str, ...]] = LOGICAL_RULES) -> PartitionSpec:
  """The PartitionSpec of an array with logical `axes` and `shape` on `mesh`."""
  if len(axes) != len(shape):
    raise ValueError(f"logical axes {tuple(axes)} do not match shape {tuple(shape)}")
  used: set[str] = set()
  out = []
  for name, size in zip(axes, shape):
    mesh_axes = tuple(a for a in (rules[name] if name else ()) if mesh.shape[a] > 1 and a not in used)
    if not mesh_axes or size % math.prod(mesh.shape[a] for a in mesh_axes):
      out.append(None)
      continue
    used.update(mesh_axes)
    out.append(mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
  return PartitionSpec(*out)


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
  """Pins an activation's sharding inside a step traced under a mesh (`Parallel.jit` sets one);
  a no-op otherwise. Keeping the residual stream split by batch makes fsdp gather weights layer by
  layer (ZeRO-3) instead of letting XLA split activations along `embed` and build full-batch
  intermediates."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  return jax.lax.with_sharding_constraint(x, spec(axes, x.shape, mesh))
