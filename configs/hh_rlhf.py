"""Anthropic's HH-RLHF (Bai et al., 2022) from a local copy: SFT on the chosen transcripts, then DPO
and the reward model -> PPO loop, all on TRL's implicit-prompt preference format.

Nothing is downloaded. Copy the dataset repository (huggingface.co/datasets/Anthropic/hh-rlhf) and
unzip its JSON Lines files, so that data/hh-rlhf/<subset>/{train,test}.jsonl exist:

  huggingface-cli download Anthropic/hh-rlhf --repo-type dataset --local-dir data/hh-rlhf
  gunzip -k data/hh-rlhf/*/*.jsonl.gz
  python -m rlhfjax.main --config configs/hh_rlhf.py --workdir runs/hh_rlhf
  python -m rlhfjax.main --config configs/hh_rlhf.py:tiny ...   # a few steps each, for tests

Each row is `{"chosen": "\\n\\nHuman: ... \\n\\nAssistant: ...", "rejected": ...}`: two whole
transcripts. The prompt is split off where they first differ (TRL's `extract_prompt`, docs/data.md),
so every earlier turn is prompt and only the final assistant reply is trained and scored. The glob
reads the four preference subsets (harmless-base, helpful-base, helpful-online,
helpful-rejection-sampled; red-team-attempts has other files and another layout); a narrower glob,
e.g. data/hh-rlhf/helpful-*/train.jsonl, picks some.

SFT learns the chosen replies; the reward model learns the pairs (rm.layout='trl'); PPO samples
replies to the training prompts against it; DPO learns the same pairs; task=kto learns them
unpaired (kto.feedback='pairs'). Evaluation answers the test prompts, judged by the reward model.
Sizes are the CPU quickstart's (configs/tldr_sim.py) with the budgets of a chat turn; a real run
starts from a pretrained model (model.init_from).
"""

import ml_collections

from rlhfjax import config_file

TRL_COLUMNS = dict(prompt="", chosen="", rejected="", completion="", label="", text="",
                   messages="")  # data.columns: TRL's name -> the file's column ('' the same).


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  if arg not in (None, "", "tiny"):
    raise ValueError(f"unknown config argument {arg!r}; expected '' or 'tiny'")
  c = config_file.sibling(__file__, "tldr_sim")
  c.stages = "sft,rm,ppo,dpo,eval"
  c.workdir = "runs/hh_rlhf"
  train, test = "data/hh-rlhf/*/train.jsonl", "data/hh-rlhf/*/test.jsonl"
  # data.source='files': the training rows serve SFT (their chosen replies), the preference prompts
  # and the RL prompts; the test rows are the validation and test prompts.
  c.data = dict(source="files", train_file=train, test_file=test, columns=TRL_COLUMNS, seed=0,
                validation=512, test=512)
  c.tokenizer.update(vocab_size=8000, train_examples=20000)
  c.format.update(prompt_len=256, response_len=64)
  c.model.update(max_len=320)
  c.sft.update(batch_size=64, steps=2000, eval_every=200)
  c.rm.update(train_file=train, valid_file=test, layout="trl", batch_size=64, eval_every=200,
              normalize="reference")
  c.kto.update(feedback="pairs")
  c.kto.layout = "trl"  # For kto.feedback='binary': TRL's unpaired rows.
  c.eval.update(annotator="rm", methods="sft,ppo,dpo", num_examples=256)
  if arg == "tiny":
    tiny(c)
  return c


def tiny(c: ml_collections.ConfigDict) -> None:
  """A few steps of each stage on a handful of rows (the tests write the files and set the
  paths), shared with configs/ultrafeedback.py:tiny so that one SFT checkpoint serves both."""
  c.data.update(validation=4, test=4)
  c.tokenizer.update(vocab_size=400, train_examples=64, split_by_unicode_script=True)
  c.format.update(prompt_len=64, response_len=16)
  c.model.update(d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32, max_len=80)
  c.sft.update(batch_size=4, steps=2, warmup_steps=1, log_every=1, eval_every=2, eval_batches=1)
  c.rm.update(batch_size=4, warmup_steps=1, log_every=1, eval_every=2, eval_batch_size=4,
              norm_examples=4, probe_examples=2, bootstrap=10)
  c.ppo.update(steps=1, rollout_batch=4, minibatch_size=2, epochs=1, eval_every=1,
               eval_examples=4)
  c.grpo.update(steps=1, rollout_batch=4, k=2, minibatch_size=2, eval_every=1, eval_examples=4)
  for block in (c.dpo, c.kto):
    block.update(batch_size=4, warmup_steps=1, log_every=1)
  c.eval.update(num_examples=4, batch_size=4, show=1)
  c.checkpoint.update(every=2)
