"""task=export: a trained policy or reward model of the workdir as a Hugging Face directory.

  python -m rlhfjax.main --config configs/smollm2_tldr_sim.py --workdir runs/smollm2 \\
      --config.task=export --config.export.model=ppo

writes `<workdir>/export/ppo/` (`config.json` + `model.safetensors`), which transformers loads as
`LlamaForCausalLM` / `GPT2LMHeadModel`. Every policy a finished run trained exports (`LOADERS`:
SFT, PPO, DPO, SimPO, the critic-free online methods, ...), its LoRA adapters merged;
`export.model=rm` writes the normalised reward model as
`*ForSequenceClassification` with one label and, for a model with a likelihood term, its weight in
`config.json` (see `hf_checkpoint.save`). The tokenizer is not
written: a pretrained run's is the source model's, the quickstart's is `<workdir>/tokenizer.model`.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable

import jax

from rlhfjax.algorithms import dpo
from rlhfjax.algorithms import online
from rlhfjax.algorithms import ppo
from rlhfjax.algorithms import reward_model
from rlhfjax.algorithms import sft
from rlhfjax.errors import ConfigError
from rlhfjax.models import hf_checkpoint
from rlhfjax.parallel.sharding import to_host
from rlhfjax.training import experiment
from rlhfjax.training import metrics as metrics_lib

# The finished runs that can be exported, and how each is read back.
LOADERS: dict[str, Callable[[experiment.Experiment], Any]] = {
    "sft": sft.load_policy,
    "expert_iteration": lambda exp: sft.load_policy(exp, "expert_iteration"),
    "feedme": lambda exp: sft.load_policy(exp, "feedme"),
    "reward_conditioning": lambda exp: sft.load_policy(exp, "reward_conditioning"),
    "ppo": ppo.load_policy,
    "dpo": dpo.load_policy,
    "simpo": lambda exp: dpo.load_policy(exp, "simpo"),
    **{task: functools.partial(online.load_policy, task=task)
       for task in ("rloo", "grpo", "dapo", "gspo", "reinforce_pp", "online_dpo")},
    "rm": lambda exp: reward_model.load(exp)[0],
}


def run(config, workdir: str) -> str:
  exp = experiment.prepare(config, workdir)
  c = config.export
  if c.model not in LOADERS:
    raise ConfigError(f"export.model must be one of {sorted(LOADERS)}, got {c.model!r}")
  params = to_host(LOADERS[c.model](exp))
  directory = c.directory or os.path.join(exp.workdir, "export", c.model)
  pad_id = exp.tokenizer.pad_id if c.model == "rm" else None
  if jax.process_index() == 0:
    hf_checkpoint.save(params, exp.model, directory, c.dtype or None, reward_pad_id=pad_id)
  metrics_lib.info(f"exported {c.model} to {directory}")
  return directory
