"""LoRA (Hu et al. 2021): low-rank adapters on the decoder's projections, as pure tree functions.

A projection W (d_in → d_out) with an adapter computes `x W + s · (x A) B`, A [d_in, r], B [r, d_out],
s = alpha / r. A starts uniform in ±1/sqrt(d_in) (PEFT's Kaiming-uniform default) and B at zero, so
a fresh adapter leaves the model unchanged. Adapters sit beside the base weights in the same tree:

  params = {...the transformer's own tree..., 'lora': {'scale': s,
            'attn': {'q_a': [L, D, r], 'q_b': [L, r, H, Dh], ...}, 'mlp': {'wi_a': ..., ...}}}

so everything that takes a parameter tree (forward, sampling, log-probs, checkpoints, shardings)
takes an adapted one unchanged; `transformer.forward` adds the adapters it finds. The tree is self-
describing (the rank is A's last dimension, the scale a leaf), which is what export needs to merge.

`strip` is the model with adapters off: the frozen base, i.e. RLHF's reference policy, held in the
same buffers as the trained policy. `trainable` marks what an optimizer may move when a tree holds
adapters: the adapters and everything outside an adapted transformer (reward and value heads), never
the base weights nor the scale. `freeze` stops gradients at the frozen leaves, so a step computes
no weight gradient for them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from rlhfjax.errors import ConfigError

KEY = "lora"
# Every projection an adapter may target: its group in the layer tree, and how many leading
# dimensions of the base weight are inputs (the attention output projection reads heads × head_dim).
TARGETS = {"q": ("attn", 1), "k": ("attn", 1), "v": ("attn", 1), "o": ("attn", 2),
           "wi": ("mlp", 1), "wg": ("mlp", 1), "wo": ("mlp", 1)}
# Which trained models take adapters (config `lora.models`): the SFT policy, the reward model, the
# policy every preference/RL method trains (PPO, RLOO, GRPO, online DPO, DPO, Quark, expert
# iteration, FeedME, reward conditioning) and PPO's value model.
MODELS = ("sft", "rm", "policy", "value")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """rank 0 means no adapters. `targets`: the projections adapted (those the variant lacks, e.g. wg
  on gpt2, are skipped)."""

  rank: int = 0
  alpha: float = 16.0
  targets: tuple[str, ...] = tuple(TARGETS)
  models: tuple[str, ...] = MODELS

  @property
  def scale(self) -> float:
    return self.alpha / self.rank

  def applies_to(self, model: str) -> bool:
    return self.rank > 0 and model in self.models


def _names(value: Any, key: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
  names = tuple(s.strip() for s in value.split(",") if s.strip()) if isinstance(value, str) \
      else tuple(value)
  unknown = [n for n in names if n not in allowed]
  if unknown or not names:
    raise ConfigError(f"lora.{key} must be a comma-separated list of {allowed}, got {value!r}")
  return names


def from_config(block: Mapping[str, Any] | None) -> LoraConfig:
  """A LoraConfig from the config's `lora` block (absent: no adapters), naming any bad key."""
  if not block:
    return LoraConfig()
  known = {f.name for f in dataclasses.fields(LoraConfig)}
  unknown = sorted(set(block) - known)
  if unknown:
    raise ConfigError(f"unknown lora config key(s): {', '.join('lora.' + k for k in unknown)}")
  rank, alpha = block["rank"], block["alpha"]
  if not isinstance(rank, int) or rank < 0:
    raise ConfigError(f"lora.rank must be an integer >= 0 (0: no adapters), got {rank!r}")
  if not alpha > 0:
    raise ConfigError(f"lora.alpha must be > 0, got {alpha!r}")
  return LoraConfig(rank, float(alpha), _names(block["targets"], "targets",
                                               tuple(TARGETS)),
                    _names(block["models"], "models", MODELS))


def _targets(layers: Mapping[str, Any], lcfg: LoraConfig) -> list[tuple[str, str, int]]:
  """(group, target, input dims) of the configured targets this layer tree has (e.g. not wg on
  gpt2)."""
  return [(TARGETS[t][0], t, TARGETS[t][1]) for t in lcfg.targets
          if t in layers.get(TARGETS[t][0], {})]


def axes(base_axes: Mapping[str, Any], lcfg: LoraConfig) -> dict:
  """`base_axes` (transformer.param_axes) with the adapters' axes: A keeps W's input axes, B its
  output axes; the rank dimension is never split."""
  out = dict(base_axes)
  if lcfg.rank == 0:
    return out
  tree: dict = {"scale": ()}
  for group, t, n_in in _targets(base_axes["layers"], lcfg):
    layer, rest = base_axes["layers"][group][t][:1], base_axes["layers"][group][t][1:]
    tree.setdefault(group, {})[f"{t}_a"] = layer + rest[:n_in] + (None,)
    tree[group][f"{t}_b"] = layer + (None,) + rest[n_in:]
  out[KEY] = tree
  return out


def init(rng: jax.Array, params: Mapping[str, Any], lcfg: LoraConfig) -> dict:
  """`params` (a transformer tree without adapters) with fresh adapters in its dtype: A uniform in
  ±1/sqrt(fan_in), B zero, so the adapted model equals `params` until B moves."""
  if KEY in params:
    raise ValueError("these parameters already carry LoRA adapters (merge them first)")
  out = dict(params)
  if lcfg.rank == 0:
    return out
  targets = _targets(params["layers"], lcfg)
  keys = jax.random.split(rng, len(targets))
  tree: dict = {"scale": jnp.asarray(lcfg.scale, jnp.float32)}
  for key, (group, t, n_in) in zip(keys, targets):
    base = params["layers"][group][t]
    n_layers, w, dtype = base.shape[0], base.shape[1:], base.dtype
    fan_in = math.prod(w[:n_in])
    bound = 1.0 / math.sqrt(fan_in)
    tree.setdefault(group, {})[f"{t}_a"] = jax.random.uniform(
        key, (n_layers,) + w[:n_in] + (lcfg.rank,), dtype, -bound, bound)
    tree[group][f"{t}_b"] = jnp.zeros((n_layers, lcfg.rank) + w[n_in:], dtype)
  out[KEY] = tree
  return out


def adapt(rng: jax.Array, params: Mapping[str, Any], lcfg: LoraConfig, model: str) -> dict:
  """`params` with fresh adapters if `lcfg` applies to `model` (one of MODELS), else unchanged."""
  return init(rng, params, lcfg) if lcfg.applies_to(model) else dict(params)


def model_axes(base_axes: Mapping[str, Any], lcfg: LoraConfig, model: str) -> dict:
  """`axes` if `lcfg` applies to `model`, else `base_axes`."""
  return axes(base_axes, lcfg) if lcfg.applies_to(model) else dict(base_axes)


def reference(policy: Mapping[str, Any], ref: Any) -> Any:
  """The reference policy: `ref` when the run holds one, else (None: a LoRA policy) the policy
  with its adapters off — the same buffers, so RLHF keeps one backbone."""
  return strip(policy) if ref is None else ref


def value_and_grad(fn, **kwargs):
  """`jax.value_and_grad` of `fn(params, ...)` with the frozen leaves' gradients stopped
  (`freeze`); the same as jax's for a tree without adapters."""
  return jax.value_and_grad(lambda params, *args: fn(freeze(params), *args), **kwargs)


def delta(x: jax.Array, adapters: Mapping[str, Any] | None, target: str,
          scale: jax.Array) -> jax.Array | int:
  """s · (x A) B for one layer's adapter of `target` (0 when there is none). x's trailing
  dimensions are the projection's inputs."""
  if adapters is None or f"{target}_a" not in adapters:
    return 0
  a, b = adapters[f"{target}_a"].astype(x.dtype), adapters[f"{target}_b"].astype(x.dtype)
  n_in = a.ndim - 1
  low = jnp.tensordot(x, a, axes=(tuple(range(x.ndim - n_in, x.ndim)), tuple(range(n_in))))
  # The scale multiplies the rank-r activations: the smallest tensor of the three.
  return jnp.tensordot(low * scale.astype(x.dtype), b, axes=1)


def _is_transformer(tree: Any) -> bool:
  return isinstance(tree, Mapping) and "layers" in tree and "embed" in tree


def has_adapters(tree: Any) -> bool:
  """Whether any transformer in `tree` carries adapters."""
  if _is_transformer(tree):
    return KEY in tree
  if isinstance(tree, Mapping):
    return any(has_adapters(v) for v in tree.values())
  return False


def strip(tree: Any) -> Any:
  """`tree` with every transformer's adapters removed: the base model (no copy)."""
  if _is_transformer(tree):
    return {k: v for k, v in tree.items() if k != KEY}
  if isinstance(tree, Mapping):
    return {k: strip(v) for k, v in tree.items()}
  return tree


def merge(tree: Any) -> Any:
  """`tree` with every adapter folded into its base weight, W + s · A B: a plain model that
  computes what the adapted one did (for export, and for later stages that start from it)."""
  if isinstance(tree, Mapping) and not _is_transformer(tree):
    return {k: merge(v) for k, v in tree.items()}
  if not _is_transformer(tree) or KEY not in tree:
    return tree
  adapters = tree[KEY]
  layers = {g: dict(p) for g, p in tree["layers"].items()}
  for group, names in adapters.items():
    if group == "scale":
      continue
    for t in {n[:-2] for n in names}:
      a, b = names[f"{t}_a"], names[f"{t}_b"]
      w = layers[group][t]
      update = jax.vmap(lambda a, b: jnp.tensordot(a, b, axes=1))(  # Per layer: [in.., out..].
          a.astype(jnp.float32), b.astype(jnp.float32))
      layers[group][t] = (w.astype(jnp.float32) + adapters["scale"] * update).astype(w.dtype)
  return {**{k: v for k, v in tree.items() if k != KEY}, "layers": layers}


def merged(tree: Any) -> Any:
  """`merge` compiled, on the devices and with the shardings where `tree` lies (a no-op without
  adapters): what a later stage loads from an adapted checkpoint."""
  return jax.jit(merge)(tree) if has_adapters(tree) else tree


def trainable(tree: Any) -> Any:
  """Bools in the structure of `tree`: True where an optimizer may move the leaf."""
  if _is_transformer(tree) and KEY in tree:
    out = jax.tree.map(lambda _: False, {k: v for k, v in tree.items() if k != KEY})
    out[KEY] = jax.tree.map(lambda _: True, tree[KEY])
    out[KEY]["scale"] = False
    return out
  if isinstance(tree, Mapping):
    return {k: trainable(v) for k, v in tree.items()}
  return jax.tree.map(lambda _: True, tree)


def freeze(tree: Any) -> Any:
  """`tree` with gradients stopped at the leaves `trainable` marks False (a no-op without
  adapters), so a loss's gradient skips the frozen base weights' matmuls altogether."""
  if not has_adapters(tree):
    return tree
  return jax.tree.map(lambda x, t: x if t else jax.lax.stop_gradient(x), tree, trainable(tree))


def count(tree: Any) -> tuple[int, int]:
  """(trainable, total) parameter counts of `tree`."""
  sizes = jax.tree.map(lambda x, t: (x.size, x.size if t else 0), tree, trainable(tree))
  pairs = jax.tree.leaves(sizes, is_leaf=lambda x: isinstance(x, tuple))
  return sum(t for _, t in pairs), sum(n for n, _ in pairs)
