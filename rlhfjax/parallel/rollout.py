"""The rollout layout: where the policy's weights live, and in what dtype, while it samples.

Training wants FSDP: each chip holds a slice of every weight and gathers a layer's weights when it
uses them. Decoding must not: a decode step reads every weight once per sampled token, so under
FSDP every token would move the whole model over the interconnect. So once per rollout the
policy is copied (XLA's own resharding: `jax.device_put` to `NamedSharding`s of another Mesh over
the same devices) into a layout of its own — no fsdp, the model split `tensor` ways (heads, MLP
units, vocabulary, by the same rules table as training) and `data` replicas of that over the
remaining devices, the rows of a batch split among the replicas — in the compute dtype, and the
copy is dropped after the rollout (Tunix's reshard, verl's and NeMo-RL's refit do the same).

`rollout.mesh`:
  "auto"   on a CPU, every device a replica (`tensor` 1: the devices share one memory and its
           cores, tensor parallelism buys nothing); on accelerators, the `tensor` width within
           one fast domain (a GPU host's devices; a TPU slice, whose chips share the ICI) at
           which a device reads the fewest bytes per sampled token — its slice of the weights
           plus its rows' KV cache, which stops splitting once `tensor` exceeds the kv heads —
           among those that fit beside the training state, replicas over the rest; wider only
           when nothing narrower fits.
  "train"  the trainer's own mesh and dtype: sampling as training lays it out (for comparison).
  "data=D,tensor=T"  an explicit shape (one of them may be -1: the devices left).
`rollout.dtype`: "auto" is the model's compute dtype (`model.dtype`); or a dtype name. Only the
matmul weights are cast (norm scales and biases, and LoRA adapters, keep theirs: the model reads
norms in float32 and casts every matmul weight to the compute dtype itself), so a copy in the
compute dtype samples exactly what the trainer's weights would.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding

from rlhfjax.errors import ConfigError
from rlhfjax.models.config import ModelConfig
from rlhfjax.models import sharding_rules
from rlhfjax.parallel.mesh import AXES
from rlhfjax.parallel.mesh import mesh_shape

MODES = ("auto", "train")


@dataclasses.dataclass(frozen=True)
class Layout:
  """A rollout layout: the mesh shape over the training mesh's devices, the weights' dtype ('' as
  trained) and why it was chosen."""
  data: int
  fsdp: int
  tensor: int
  dtype: str
  reason: str = ""

  @property
  def shape(self) -> dict[str, int]:
    return {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}


def weight_bytes(cfg: ModelConfig, tensor: int, dtype: str, fsdp: int = 1) -> int:
  """Bytes of the policy's matmul weights on one device of a layout split `tensor` ways (the
  vocabulary, heads and MLP units split when they divide; the rest replicated) and `fsdp` ways
  (the embedding dimension, when it divides), in `dtype`."""
  d, h, kv, dh, f, v = (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.dim_per_head, cfg.d_ff,
                        cfg.vocab_size)
  split = lambda n: tensor if n % tensor == 0 else 1
  mlp = (3 if cfg.variant == "llama" else 2) * d * f / split(f)
  attn = (2 * h / split(h) + 2 * kv / split(kv)) * d * dh
  embed = v * d / split(v) * (1 if cfg.tie_embeddings else 2)
  total = (cfg.n_layers * (mlp + attn) + embed) * jnp.dtype(dtype or cfg.param_dtype).itemsize
  return int(total / (fsdp if d % fsdp == 0 else 1))


def cache_bytes(cfg: ModelConfig, rows: int, length: int, data: int, tensor: int) -> int:
  """Bytes of the KV cache of `rows` sequences of `length` slots on one device: rows split over
  the `data` replicas (when they divide), kv heads over `tensor` (when they divide)."""
  rows_here = rows // data if rows % data == 0 else rows
  kv_here = cfg.n_kv_heads // tensor if cfg.n_kv_heads % tensor == 0 else cfg.n_kv_heads
  return (2 * cfg.n_layers * rows_here * kv_here * length * cfg.dim_per_head
          * jnp.dtype(cfg.dtype).itemsize)


def _parse(spec: str, devices: int) -> dict[str, int]:
  """`data=D,tensor=T` (fsdp=F allowed too) as a mesh shape over `devices` devices."""
  sizes = {"data": 1, "fsdp": 1, "tensor": 1}
  for part in spec.split(","):
    name, _, value = part.partition("=")
    name = name.strip()
    if name not in sizes or not value.strip().lstrip("-").isdigit():
      raise ConfigError(f"rollout.mesh must be 'auto', 'train' or like 'data=-1,tensor=4' "
                        f"(axes {', '.join(AXES)}), got {spec!r}")
    sizes[name] = int(value)
  try:
    shape = dict(zip(AXES, mesh_shape(sizes, devices)))
  except ConfigError as e:
    raise ConfigError(f"rollout.mesh {spec!r}: {e}") from e
  if math.prod(shape.values()) != devices:
    raise ConfigError(f"rollout.mesh {spec!r} uses {math.prod(shape.values())} devices; the "
                      f"sampler has {devices} (the training mesh's, or its own with "
                      f"rollout.placement='split')")
  return shape


def _dtype(name: str, cfg: ModelConfig) -> str:
  if name == "auto":
    return cfg.dtype
  try:
    return jnp.dtype(name).name
  except TypeError as e:
    raise ConfigError(f"rollout.dtype must be 'auto' or a dtype name, got {name!r}") from e


def check(block: Mapping[str, Any], cfg: ModelConfig, devices: int) -> None:
  """Raises a ConfigError naming `rollout.mesh` or `rollout.dtype` when the block cannot work on
  `devices` devices: checked before any work, not at a run's first rollout."""
  spec = str(block["mesh"])
  if spec not in MODES:
    _parse(spec, devices)
  _dtype(str(block["dtype"]), cfg)


def choose(block: Mapping[str, Any], cfg: ModelConfig, train_shape: Mapping[str, int], *,
           platform: str, fast_domain: int, rows: int, length: int,
           free_bytes: float | None) -> Layout:
  """The layout config block `rollout` (`mesh`, `dtype`) asks for on a training mesh of
  `train_shape`, for batches of `rows` sequences of `length` cache slots. `fast_domain`: devices
  on one fast interconnect (a GPU host's, a TPU slice's); `free_bytes`: per-device bytes left
  beside the training state (None: unknown, take everything as fitting)."""
  spec, devices = str(block["mesh"]), math.prod(train_shape.values())
  dtype = _dtype(str(block["dtype"]), cfg)
  if spec == "train":
    return Layout(**dict(train_shape), dtype=cfg.param_dtype if dtype == cfg.dtype else dtype,
                  reason="rollout.mesh='train': the trainer's layout and weights")
  if spec != "auto":
    return Layout(**_parse(spec, devices), dtype=dtype, reason=f"rollout.mesh={spec!r}")
  if platform == "cpu":
    return Layout(devices, 1, 1, dtype, "CPU devices share one memory: every device a replica")
  widths = [t for t in (2**i for i in range(int(math.log2(devices)) + 1))
            if devices % t == 0 and cfg.n_heads % t == 0]
  # What one device reads per sampled token: its slice of the weights and of the KV cache.
  read = lambda t: weight_bytes(cfg, t, dtype) + cache_bytes(cfg, rows, length, devices // t, t)
  fits = lambda t: free_bytes is None or read(t) <= free_bytes
  near = [t for t in widths if t <= max(fast_domain, 1) and fits(t)]
  if near:
    t = min(near, key=lambda t: (read(t), t))
    return Layout(devices // t, 1, t, dtype,
                  f"the fewest bytes read per device and token ({_size(read(t))}) of the widths "
                  f"within one fast domain of {fast_domain} devices")
  wider = [t for t in widths if t > fast_domain and fits(t)]
  if wider:
    return Layout(devices // wider[0], 1, wider[0], dtype,
                  f"nothing within one fast domain of {fast_domain} devices fits beside the "
                  f"training state: widened to tensor={wider[0]}")
  t = min(widths, key=read)
  return Layout(devices // t, 1, t, dtype,
                f"does not fit beside the training state at any width ({_size(read(t))} per "
                f"device at tensor={t}, {_size(free_bytes)} free)")


def mesh(layout: Layout, devices: Any) -> Mesh:
  """The layout's Mesh over `devices` (the training mesh's, or the sampler's own under
  rollout.placement='split') in their order: `tensor` innermost, so a tensor group is adjacent
  devices (one host: `jax.devices()` groups each process's devices)."""
  devices = np.asarray(devices, dtype=object).reshape(-1)
  return Mesh(devices.reshape(layout.data, layout.fsdp, layout.tensor), AXES,
              axis_types=(AxisType.Auto,) * len(AXES))


def _is_axes(x: Any) -> bool:
  return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def _keeps_dtype(path: tuple) -> bool:
  """Leaves the copy keeps in their own dtype: norms (read in float32) and LoRA adapters."""
  names = [str(getattr(k, "key", k)) for k in path]
  return any("norm" in n or n == "lora" for n in names)


def shardings(axes: Any, params: Any, rollout_mesh: Mesh) -> Any:
  """NamedShardings of a parameter tree with logical `axes` on the rollout mesh."""
  return jax.tree.map(lambda ax, x: NamedSharding(rollout_mesh, sharding_rules.spec(ax, x.shape,
                                                                           rollout_mesh)),
                      axes, params, is_leaf=_is_axes)


def cast(params: Any, dtype: str) -> Any:
  """The matmul weights of `params` in `dtype` (norms, LoRA adapters and integers as they are)."""
  def one(path, x):
    if _keeps_dtype(path) or not jnp.issubdtype(x.dtype, jnp.floating):
      return x
    return x.astype(dtype)
  return jax.tree_util.tree_map_with_path(one, params)


def reshard(params: Any, axes: Any, layout: Layout, rollout_mesh: Mesh) -> Any:
  """The weights in the rollout layout: cast where they lie (each device its own slice, so the
  transfer moves the compute dtype's bytes), then moved by XLA's resharding. A tree already in
  the layout comes back as it is (no copy)."""
  target = shardings(axes, params, rollout_mesh)
  dtype = layout.dtype
  same = all(x.sharding == s and (_keeps_dtype(p) or x.dtype == dtype
                                  or not jnp.issubdtype(x.dtype, jnp.floating))
             for (p, x), s in zip(jax.tree_util.tree_leaves_with_path(params),
                                  jax.tree.leaves(target)))
  if same:
    return params
  if any(jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype
         for x in jax.tree.leaves(params)):
    params = jax.jit(cast, static_argnums=1)(params, dtype)
  return jax.device_put(params, target)


def _size(n: float) -> str:
  return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def describe(layout: Layout, cfg: ModelConfig, rows: int, length: int) -> str:
  """One line: the shape, the dtype, the bytes per device, and why."""
  w = weight_bytes(cfg, layout.tensor, layout.dtype, layout.fsdp)
  c = cache_bytes(cfg, rows, length, layout.data * layout.fsdp, layout.tensor)
  return (f"rollout layout: data={layout.data} fsdp={layout.fsdp} tensor={layout.tensor}, "
          f"weights in {layout.dtype} {_size(w)} + KV cache of {rows} rows x {length} slots "
          f"{_size(c)} per device ({layout.reason})")
