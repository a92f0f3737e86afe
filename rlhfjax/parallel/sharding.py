"""`Parallel`: where every array of a run lives on the Mesh, and the jitted steps that keep it there.

Parameters and optimizer states are sharded by the logical-axis rules; batches are split along
their leading axis over `data` × `fsdp`; everything else (step counters, rng keys, metrics) is
replicated. Host data enters through `put`/`put_batch` (with several processes, each one builds
only its own rows) and leaves through `to_host` (all-gathered when another process holds a part).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from rlhfjax.errors import ConfigError
from rlhfjax.models import sharding_rules
from rlhfjax.parallel.mesh import make_mesh


def _is_axes(x: Any) -> bool:
  return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


class Parallel:
  """A Mesh and the shardings of everything placed on it."""

  def __init__(self, mesh: Mesh):
    self.mesh = mesh

  @classmethod
  def from_config(cls, cfg: Mapping[str, int]) -> "Parallel":
    return cls(make_mesh(cfg))

  @property
  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, PartitionSpec())

  @property
  def data_parallel(self) -> int:
    """How many ways a batch is split (the product of the mesh axes of `batch`)."""
    return math.prod(self.mesh.shape[a] for a in sharding_rules.LOGICAL_RULES["batch"])

  @property
  def batch(self) -> NamedSharding:
    """Leading (batch) axis split over the data axes; applies to any rank >= 1."""
    return NamedSharding(self.mesh, PartitionSpec(sharding_rules.LOGICAL_RULES["batch"]))

  def check_batch(self, key: str, size: int) -> None:
    """Training batches must split evenly over the data axes."""
    if size % self.data_parallel:
      raise ConfigError(f"{key}={size} does not divide over the mesh's data x fsdp = "
                        f"{self.data_parallel} devices")

  def shardings(self, axes: Any, shapes: Any) -> Any:
    """NamedShardings for a tree of arrays (or ShapeDtypeStructs) with logical `axes`."""
    spec = lambda ax, x: NamedSharding(self.mesh, sharding_rules.spec(ax, x.shape, self.mesh))
    return jax.tree.map(spec, axes, shapes, is_leaf=_is_axes)

  def state_shardings(self, state: Any, params: Any, tx: optax.GradientTransformation) -> Any:
    """Shardings of a train state (a flax struct with `params` and `opt_state`): parameters as
    given, optimizer moments like their parameters, every other leaf replicated."""
    # Leaves an optimizer holds no state for (optax.MaskedNode: frozen LoRA bases) stay empty.
    masked = lambda x: isinstance(x, optax.MaskedNode)
    opt = optax.tree_map_params(tx, lambda x, s: x if masked(x) else s, state.opt_state, params,
                                transform_non_params=lambda _: self.replicated, is_leaf=masked)
    rest = jax.tree.map(lambda _: self.replicated, state)
    return rest.replace(params=params, opt_state=opt)

  def train_state(self, make: Callable[..., Any], param_axes: Any, tx: optax.GradientTransformation,
                  *args: Any, abstract: bool = False) -> tuple[Any, Any]:
    """(state, shardings) for the train state `make(*args)` (a flax struct with `params` and
    `opt_state`), built directly on the mesh; with `abstract`, a sharded restore target instead."""
    shapes = jax.eval_shape(make, *args)
    shardings = self.state_shardings(shapes, self.shardings(param_axes, shapes.params), tx)
    if abstract:
      return self.abstract(shapes, shardings), shardings
    return jax.jit(make, out_shardings=shardings)(*args), shardings

  def abstract(self, shapes: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs carrying shardings: a restore target that lands on the mesh."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        shapes, shardings)

  def put(self, tree: Any, shardings: Any) -> Any:
    """Host (numpy) or device arrays placed with `shardings` (a matching tree or one Sharding).
    Every process must hold the same host values; each transfers only its devices' parts."""
    if isinstance(shardings, Sharding):
      shardings = jax.tree.map(lambda _: shardings, tree)
    return jax.tree.map(self._place, tree, shardings)

  def _place(self, x: Any, s: Sharding) -> Any:
    if isinstance(x, jax.Array):
      if x.sharding == s:
        return x
      if not x.is_fully_addressable or s.is_fully_addressable:
        return jax.device_put(x, s)  # Resharding a global array, or one process.
    x = np.asarray(x)  # Host data (or a process-local array), the same on every process.
    if s.is_fully_addressable:
      return jax.device_put(x, s)
    return jax.make_array_from_callback(x.shape, s, lambda idx: x[idx])

  def local_rows(self, rows: int) -> slice:
    """The rows of a `rows`-long batch that this process's devices hold."""
    index = self.batch.addressable_devices_indices_map((rows,))
    starts = [i[0].start or 0 for i in index.values()]
    stops = [rows if i[0].stop is None else i[0].stop for i in index.values()]
    return slice(min(starts), max(stops))

  def put_batch(self, data: Mapping[str, np.ndarray], idx: np.ndarray) -> dict[str, jax.Array]:
    """The global batch `data[idx]`, split over the data axes; this process reads only its rows."""
    self.check_batch("batch", len(idx))
    mine = idx[self.local_rows(len(idx))]
    return {k: jax.make_array_from_process_local_data(self.batch, np.asarray(v)[mine],
                                                      (len(idx),) + np.shape(v)[1:])
            for k, v in data.items()}

  def jit(self, fn: Callable, in_shardings: Sequence[Any], out_shardings: Any,
          donate_argnums: Sequence[int] = ()) -> Callable:
    """`jax.jit` with in/out shardings; arguments are first placed where the step wants them."""
    jitted = jax.jit(fn, in_shardings=tuple(in_shardings), out_shardings=out_shardings,
                     donate_argnums=tuple(donate_argnums))

    def call(*args):
      if len(args) != len(in_shardings):
        raise TypeError(f"expected {len(in_shardings)} arguments, got {len(args)}")
      with jax.set_mesh(self.mesh):  # Activation constraints (sharding_rules.constrain) see it.
        return jitted(*(self.put(a, s) if not _is_key(a) else a
                        for a, s in zip(args, in_shardings)))

    def lower(*args):  # For memory analysis and benchmarks.
      with jax.set_mesh(self.mesh):
        return jitted.lower(*args)

    call.lower = lower
    return call


def _is_key(x: Any) -> bool:
  """Rng keys stay as they are: identical on every process, and jit replicates them."""
  return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def to_host(tree: Any) -> Any:
  """Numpy copies of device arrays, all-gathered when another process holds a part."""
  def one(x):
    if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
      return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return jax.tree.map(one, tree)


def bytes_per_device(tree: Any) -> int:
  """Bytes of `tree`'s shards on the first local device (what one device holds)."""
  device = jax.local_devices()[0]
  return sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards
             if s.device == device)
