"""Ranges of the numeric config keys, checked before any work so that a value out of range ends in
one line naming the key instead of a crash (a division by zero) or a silently odd run.

ml_collections already refuses a value of the wrong type. Here each numeric leaf is matched by its
name (the same name means the same thing in every block: `lr`, `batch_size`, `temperature`, ...) or
by its full path, and must be finite.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

import ml_collections

from rlhfjax.errors import ConfigError

Rule = tuple[Callable[[float], bool], str]

_POSITIVE: Rule = (lambda v: v > 0, "> 0")
_NON_NEGATIVE: Rule = (lambda v: v >= 0, ">= 0")
_UNIT: Rule = (lambda v: 0 <= v <= 1, "in [0, 1]")
_BELOW_ONE: Rule = (lambda v: 0 <= v < 1, "in [0, 1)")

_BY_NAME: dict[str, Rule] = {
    **dict.fromkeys(("steps", "batch_size", "rollout_batch", "minibatch_size", "eval_batch_size",
                     "sample_batch_size", "n", "k", "rounds", "prompts_per_round",
                     "steps_per_round", "num_bins", "num_pairs", "log_every", "eval_every",
                     "epochs", "lr", "eps", "cliprange", "cliprange_value",
                     "prompt_len", "response_len", "d_model", "n_layers", "n_heads", "n_kv_heads",
                     "d_ff", "max_len", "vocab_size", "rope_theta", "norm_eps", "keep",
                     "max_num_gen_batches"),
                    _POSITIVE),
    **dict.fromkeys(("warmup_steps", "weight_decay", "grad_clip", "skip_nonfinite", "top_k",
                     "temperature", "kl_coef", "contrast_batch_size", "num_examples",
                     "num_val_pairs", "norm_examples", "probe_examples", "bootstrap",
                     "likelihood_weight", "head_dim", "rank", "every", "vf_coef", "sft",
                     "pref", "unlabeled", "validation", "test", "eval_batches", "beta",
                     "gamma_beta_ratio", "desirable_weight", "undesirable_weight"),
                    _NON_NEGATIVE),
    **dict.fromkeys(("end_lr_frac", "flip_rate", "gamma", "lam", "top_p"), _UNIT),
    **dict.fromkeys(("b1", "b2", "dropout"), _BELOW_ONE),
    "label_smoothing": (lambda v: 0 <= v < 0.5, "in [0, 0.5)"),
    # TIS's cap: below 1 it would shrink even the tokens where sampler and trainer agree.
    "tis_cap": (lambda v: v >= 1, ">= 1"),
}
# Full paths whose meaning differs from the leaf name's elsewhere.
_BY_PATH: dict[str, Rule] = {
    "top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "dpo.beta": _POSITIVE,  # IPO divides by it; GRPO's beta (a KL weight) may be 0.
    "simpo.beta": _POSITIVE,
    "kto.beta": _POSITIVE,
    "online_dpo.beta": _POSITIVE,
    "distributed.num_processes": _POSITIVE,
    "distributed.process_id": _NON_NEGATIVE,
    "rollout.cache_block": _NON_NEGATIVE,
    "rollout.sampler_share": (lambda v: 0 < v < 1, "in (0, 1)"),
    "rollout.max_staleness": _NON_NEGATIVE,
}
_NOT_CHECKED = ("mesh", "seed", "data.seed", "annotators.seed", "labeling.seed", "no_eos_score",
                "head_init_scale", "reference_noise")


def _leaves(config: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
  for key, value in config.items():
    path = f"{prefix}{key}"
    if isinstance(value, (dict, ml_collections.ConfigDict)):
      yield from _leaves(value, f"{path}.")
    else:
      yield path, value


def check(config: ml_collections.ConfigDict) -> None:
  """Raises a ConfigError naming the first numeric key out of its range (or not finite)."""
  for path, value in _leaves(config):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      continue
    name = path.rsplit(".", 1)[-1]
    if path.split(".")[0] in _NOT_CHECKED or path in _NOT_CHECKED or name in _NOT_CHECKED:
      continue
    if not math.isfinite(value):
      raise ConfigError(f"{path} must be finite, got {value!r}")
    rule = _BY_PATH.get(path) or _BY_PATH.get(name) or _BY_NAME.get(name)
    if rule is not None and not rule[0](value):
      raise ConfigError(f"{path} must be {rule[1]}, got {value!r}")


def _path_of(config: Any, block: Any, prefix: str = "") -> str | None:
  """The dotted path of `block` (by identity) inside `config`, '' for `config` itself."""
  if config is block:
    return prefix.rstrip(".")
  if isinstance(config, ml_collections.ConfigDict):
    for key, value in config.items():
      if isinstance(value, ml_collections.ConfigDict):
        found = _path_of(value, block, f"{prefix}{key}.")
        if found is not None:
          return found
  return None


def missing_key(error: BaseException, config: ml_collections.ConfigDict) -> ConfigError | None:
  """The one-line ConfigError for `error` when a ConfigDict raised it reading a key the config
  lacks (the code reads every key plainly: configs/tldr_sim.py sets each with its default), naming
  the key by its path in `config`; None for any other error."""
  found, tb = None, error.__traceback__
  while tb is not None:
    local = tb.tb_frame.f_locals
    if tb.tb_frame.f_code.co_name in ("__getattr__", "__getitem__") and isinstance(
        local.get("self"), ml_collections.ConfigDict):
      found = (local["self"], local.get("attribute", local.get("key")))
    tb = tb.tb_next
  if found is None or not isinstance(found[1], str):
    return None
  path = _path_of(config, found[0])
  name = f"{path}.{found[1]}" if path else found[1]
  return ConfigError(f"config key {name} is missing: set it (configs/tldr_sim.py lists every key "
                     "with its default)")
