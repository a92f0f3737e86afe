"""What every task starts from: the workdir, the data splits, the tokenizer and the model config.

One workdir holds a whole pipeline: `tokenizer.model` at its root and one sub-directory per task
(`sft/`, later `rm/`, `ppo/`, ...), so later tasks find earlier checkpoints without extra flags.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import ml_collections

from rlhfjax.data import chat
from rlhfjax.data import pipeline
from rlhfjax.data import tables
from rlhfjax.data import tokenizer as tokenizer_lib
from rlhfjax.errors import ConfigError, DataError
from rlhfjax import files
from rlhfjax.models.config import ModelConfig
from rlhfjax.models.config import REMAT
from rlhfjax.models import lora
from rlhfjax.models import pretrained
from rlhfjax.parallel import placement
from rlhfjax.parallel import rollout as parallel_rollout
from rlhfjax.parallel.mesh import make_mesh
from rlhfjax.parallel.sharding import Parallel
from rlhfjax.sources import loading


@dataclasses.dataclass
class Experiment:
  config: ml_collections.ConfigDict
  workdir: str
  splits: dict[str, list[pipeline.Tldr]]
  tokenizer: tokenizer_lib.Tokenizer
  model: ModelConfig
  parallel: Parallel  # The Mesh every array of this run lives on (config.mesh).
  init_from: str = ""  # The pretrained checkpoint SFT starts from (`model.init_from`, resolved).
  lora: lora.LoraConfig = lora.LoraConfig()  # Adapters of the trained models (config `lora`).
  # The devices the sampler has to itself under rollout.placement='split' (parallel/placement.py);
  # empty: it shares the trainer's.
  sampler_devices: tuple = ()
  # The rollout layouts chosen so far, by batch rows (rollout/engine.py: rollout_layout).
  rollouts: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

  @property
  def eos_ids(self) -> Any:
    """The ids that end a response: the run's tokenizer's, or, where a task builds no tokenizer
    (task=compile, task=memory), those `eos_ids` reads from the config as a run would find them."""
    return eos_ids(self.config) if self.tokenizer is None else self.tokenizer.eos_ids

  def task_dir(self, task: str) -> str:
    path = os.path.join(self.workdir, task)
    os.makedirs(path, exist_ok=True)
    return path

  def trainable(self, *models: str):
    """What the optimizer of `models` (of lora.MODELS) may move: `lora.trainable` when one of them
    takes adapters, else None (everything)."""
    return lora.trainable if any(self.lora.applies_to(m) for m in models) else None

  def model_for(self, role: str) -> ModelConfig:
    """`model` as the train step of `role` (of lora.MODELS) runs it: with the rematerialisation
    policy of config block `remat` for that role ('': `model.remat`). Sampling,
    scoring and reference forwards have no backward pass, where the policy changes nothing."""
    if role not in lora.MODELS:
      raise ValueError(f"unknown model role {role!r}; the roles are {lora.MODELS}")
    return self.model.replace(remat=remat_policies(self.config).get(role) or self.model.remat)

  def remat_meta(self, *roles: str) -> dict:
    """The rematerialisation policy of each of `roles` (the models a run trains) for its meta: a
    resumed run may switch them (loop.MAY_CHANGE_ON_RESUME), and says so."""
    return {"remat": {role: self.model_for(role).remat for role in roles}}

  def lora_meta(self, model: str) -> dict:
    """The adapter settings of `model` for a run's meta (resuming under others is refused)."""
    if not self.lora.applies_to(model):
      return {}
    # As JSON stores it (lists, not tuples), so a resumed run compares equal.
    return {"lora": json.loads(json.dumps(dataclasses.asdict(self.lora)))}


def check_pass_at_k(e: Any) -> None:
  """`eval.pass_k` > 0 counts right answers by one function, `eval.correct`: named before any
  training, not after it when the answers are judged."""
  if int(e.pass_k) <= 0:
    return
  refs = [r.strip() for r in str(e.correct).split(",") if r.strip()]
  if len(refs) != 1:
    raise ConfigError(f"eval.pass_k={e.pass_k} needs eval.correct: one reward function "
                      "('module:function') that returns 1.0 for a right answer; got "
                      f"{len(refs)} ({e.correct!r})")


def prepare(config: ml_collections.ConfigDict, workdir: str) -> Experiment:
  """Builds the splits, loads or trains the tokenizer, and checks the model config against it.

  With `model.init_from` the architecture and the tokenizer come from that pretrained checkpoint.
  """
  os.makedirs(workdir, exist_ok=True)
  splits = loading.load_splits(config.data)
  tcfg, mcfg = config.tokenizer, config.model.to_dict()
  # model.init_from, format.chat, format.thinking, format.chat_template: optional (pretrained models
  # only); kept out of tldr_sim.py, whose blocks the runs' meta records (a new key there refuses a
  # resume of a run started without it).
  init_from = pretrained.resolve(mcfg["init_from"]) if mcfg.get("init_from") else ""
  if init_from:
    model = pretrained.model_config(init_from, mcfg)
    tok = pretrained.tokenizer(init_from, chat=bool(config.format.get("chat", False)),
                               thinking=bool(config.format.get("thinking", False)))
  else:
    model = ModelConfig.from_mapping({k: v for k, v in mcfg.items() if k != "init_from"})
    if tcfg.path:
      tok = tokenizer_lib.load(tcfg.path)
    else:
      corpus = pipeline.tokenizer_corpus((splits["sft"] or splits["unlabeled"])
                                         [:tcfg.train_examples])
      tok = tokenizer_lib.load_or_train(os.path.join(workdir, "tokenizer.model"), corpus,
                                        tcfg.vocab_size, tcfg.model_type,
                                        tcfg.split_by_unicode_script)
  if template := config.format.get("chat_template"):
    tok.chat_template = str(template)
  check_files(config)
  if any(getattr(e, "messages", None) is not None for split in splits.values() for e in split):
    chat.require_template(tok, "data.train_file")
  if model.vocab_size < tok.vocab_size:  # Larger is fine: rows no token uses (padded vocabularies).
    raise ConfigError(f"model.vocab_size is {model.vocab_size} but the tokenizer has "
                     f"{tok.vocab_size} pieces; set --config.model.vocab_size={tok.vocab_size}")
  remat_policies(config)  # A bad `remat` block is named before any work.
  check_pass_at_k(config.eval)
  # So is a bad `rollout` block.
  trainer, sampler = placement.split(config.rollout)
  placement.check_staleness(config.rollout)
  parallel = Parallel(make_mesh(config.mesh, trainer))
  parallel_rollout.check(config.rollout, model, len(sampler) or parallel.mesh.size)
  needed = config.format.prompt_len + config.format.response_len
  if model.variant == "gpt2" and model.max_len < needed:
    raise ConfigError(f"model.max_len ({model.max_len}) < format.prompt_len + format.response_len "
                     f"({needed})")
  write_json(os.path.join(workdir, "config.json"), json.loads(config.to_json_best_effort()))
  return Experiment(config, workdir, splits, tok, model, parallel, init_from,
                    lora.from_config(config.lora), tuple(sampler))


def eos_ids(config: ml_collections.ConfigDict) -> tuple[int, ...]:
  """The eos ids of the tokenizer `prepare` would load for `config`, without its data: a
  pretrained `init_from`'s, `tokenizer.path`'s, or the id the project's own tokenizer is trained
  with (tokenizer.EOS_ID)."""
  init_from = config.model.get("init_from")  # Optional, as in prepare().
  if init_from:
    return tuple(pretrained.tokenizer(pretrained.resolve(init_from),
                                      chat=bool(config.format.get("chat", False))).eos_ids)
  if config.tokenizer.path:
    return tuple(tokenizer_lib.load(config.tokenizer.path).eos_ids)
  return (tokenizer_lib.EOS_ID,)


def check_files(config: ml_collections.ConfigDict) -> None:
  """Every data file the config names explicitly opens (Parquet footers and Arrow schemas read, a
  glob matches): a file that cannot be read at all is one error before anything is written."""
  named = [("rm.train_file", config.rm.train_file),
           ("rm.valid_file", config.rm.valid_file),
           ("kto.train_file", config.kto.train_file)]
  for key, path in named:
    if path:
      try:
        tables.check(str(path))
      except (FileNotFoundError, DataError) as e:
        raise DataError(f"{key}: {e}") from None


def remat_policies(config: ml_collections.ConfigDict) -> dict[str, str]:
  """The `remat` block's policy per model role ('' entries left out), naming a bad role or value
  as `remat.<role>`."""
  out = {}
  for role, value in config.remat.items():
    if role not in lora.MODELS:
      raise ConfigError(f"remat.{role}: unknown model role; the roles are {', '.join(lora.MODELS)}")
    if value not in ("",) + REMAT:
      raise ConfigError(f"remat.{role} must be '' (model.remat) or one of {REMAT}, got {value!r}")
    if value:
      out[role] = value
  return out


def write_json(path: str, obj: Any) -> None:
  """Writes JSON atomically (temp file, then rename); only process 0 writes."""
  if jax.process_index() != 0:
    return
  with files.atomic_open(path) as f:
    json.dump(obj, f, indent=2)


def write_text(path: str, text: str) -> None:
  """Writes text atomically; only process 0 writes."""
  if jax.process_index() != 0:
    return
  with files.atomic_open(path) as f:
    f.write(text)
