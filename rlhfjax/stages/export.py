"""task=export: a trained policy or reward model of the workdir as a Hugging Face directory.

  python -m rlhfjax.main --config configs/smollm2_tldr_sim.py --workdir runs/smollm2 \\
      --config.task=export --config.export.model=ppo

writes `<workdir>/export/ppo/` (`config.json` + `model.safetensors`), which transformers loads as
`LlamaForCausalLM` / `GPT2LMHeadModel`. Every policy a finished run trained exports (`LOADERS`:
SFT, PPO, DPO, SimPO, the critic-free online methods, ...), its LoRA adapters merged;
`export.model=rm` writes the normalised reward model as
`*ForSequenceClassification` with one label and, for a model with a likelihood term, its weight in
`config.json` (see `hf_checkpoint.save`). A run from a Hugging Face directory (`model.init_from`)
gets that directory's tokenizer and generation files beside the weights, so the export loads as a
whole model (`AutoTokenizer` included); the quickstart's tokenizer is `<workdir>/tokenizer.model`.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable

import jax

from rlhfjax.algorithms import dpo
from rlhfjax.algorithms import online
from rlhfjax.algorithms import ppo
from rlhfjax.errors import ConfigError
from rlhfjax.models import hf_checkpoint
from rlhfjax.parallel.sharding import to_host
from rlhfjax.training import experiment
from rlhfjax.training import loaders
from rlhfjax.training import metrics as metrics_lib

# A Hugging Face directory's files that describe its tokenizer and generation, not its weights.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja", "tokenizer.model", "vocab.json",
                   "merges.txt", "generation_config.json")

# The finished runs that can be exported, and how each is read back.
LOADERS: dict[str, Callable[[experiment.Experiment], Any]] = {
    "sft": loaders.load_policy,
    "expert_iteration": lambda exp: loaders.load_policy(exp, "expert_iteration"),
    "feedme": lambda exp: loaders.load_policy(exp, "feedme"),
    "reward_conditioning": lambda exp: loaders.load_policy(exp, "reward_conditioning"),
    "ppo": ppo.load_policy,
    "dpo": dpo.load_policy,
    "simpo": lambda exp: dpo.load_policy(exp, "simpo"),
    **{task: functools.partial(online.load_policy, task=task)
       for task in ("rloo", "grpo", "dapo", "gspo", "dr_grpo", "reinforce_pp", "online_dpo")},
    "rm": lambda exp: loaders.load_reward_model(exp)[0],
}


def run(config, workdir: str) -> str:
  exp = experiment.prepare(config, workdir)
  c = config.export
  if c.model not in LOADERS:
    raise ConfigError(f"export.model must be one of {sorted(LOADERS)}, got {c.model!r}")
  params = to_host(LOADERS[c.model](exp))
  directory = c.directory or os.path.join(exp.workdir, "export", c.model)
  pad_id = exp.tokenizer.pad_id if c.model == "rm" else None
  source = config.model.get("init_from", "")  # Optional: pretrained models only.
  extra = [os.path.join(source, name) for name in TOKENIZER_FILES
           if os.path.isdir(source) and os.path.exists(os.path.join(source, name))]
  if jax.process_index() == 0:
    hf_checkpoint.save(params, exp.model, directory, c.dtype or None, reward_pad_id=pad_id,
                       extra_files=extra,
                       pad_token=getattr(exp.tokenizer, "pad_token", None) if extra else None)
  metrics_lib.info(f"exported {c.model} to {directory}")
  return directory
