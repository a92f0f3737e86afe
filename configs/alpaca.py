"""Alpaca instructions in AlpacaFarm's splits (Dubois et al., 2023): SFT -> RM on pairwise
preferences -> PPO, best-of-N, DPO -> eval, through the same pipeline as the simulated world.

Nothing is downloaded. Put Stanford Alpaca's alpaca_data.json in a directory (data.manual_dir),
and the pairwise preferences as JSON Lines in AlpacaFarm's layout (one object a line: instruction,
input, output_1, output_2, preference 1 or 2), split into a training and a validation file:

  python -m rlhfjax.main --config configs/alpaca.py --workdir runs/alpaca \
      --config.data.manual_dir=/data/alpaca --config.rm.train_file=/data/alpaca/pref_train.jsonl \
      --config.rm.valid_file=/data/alpaca/pref_valid.jsonl
  python -m rlhfjax.main --config configs/alpaca.py:tiny ...   # a few steps each, for tests

The first run builds the TFDS dataset `alpaca` into data.data_dir ('': TFDS's default): the file
cut by data.seed into sft / pref / unlabeled / validation of data.sft ... data.validation examples
(AlpacaFarm's 10k / 10k / 20k / 2k). Prompts are the Alpaca prompts (formats.alpaca_prompt; a
long input, or a long instruction without one, loses whole trailing sentences) and the reference is
Alpaca's `output`, written by text-davinci-003, which AlpacaFarm's win-rates are measured against.
AlpacaFarm evaluates on a separate set of 805 instructions; here the test split is the validation
split.

Alpaca has no latent situation, so nothing reports a gold reward and the simulated annotators
cannot judge: the leaderboard's judge (eval.annotator) is the reward model, which PPO and best-of-N
optimise, so its win-rates flatter them; `file:PATH` with human judgements gives a fair table.

Hyper-parameters are AlpacaFarm's (its examples/scripts/*.sh and rl/ppo_utils.py) where they carry
over; its learning rates were tuned for a pretrained LLaMA-7B and mean nothing for the small decoder
trained from scratch here, which keeps configs/tldr_sim.py's, and so do the sizes that would not
run on a laptop CPU (noted below).
"""

import ml_collections

from rlhfjax import config_file


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  if arg not in (None, "", "tiny"):
    raise ValueError(f"unknown config argument {arg!r}; expected '' or 'tiny'")
  c = config_file.sibling(__file__, "tldr_sim")
  c.stages = "sft,rm,ppo,best_of_n,dpo,eval"
  c.workdir = "runs/alpaca"

  # AlpacaFarm's splits of the 52k Alpaca instructions, in examples (see loading.TFDS_SPLITS).
  c.data = dict(source="tfds", tfds_name="alpaca", tfds_config="", data_dir="", manual_dir="",
                seed=0, sft=10_000, pref=10_000, unlabeled=20_000, validation=2_000)
  c.tokenizer.update(vocab_size=8000, train_examples=10_000)
  # AlpacaFarm's PPO reads 192 prompt tokens and writes up to 300: the prompt budget is kept (in
  # this tokenizer's tokens), responses are cut to 64 tokens for the CPU.
  c.format.update(prompt_len=192, response_len=64)
  c.model.update(max_len=256)

  # SFT (sft.sh): 3 epochs at batch 128 (1 per device x 16 accumulated x 8 GPUs), cosine with 3%
  # warm-up, no weight decay: 3 x 10,000 / 128 = 234 steps, 7 of warm-up.
  c.sft.update(batch_size=128, steps=234, warmup_steps=7, schedule="cosine", weight_decay=0.0,
               eval_every=50)

  # Reward model (reward_modeling.sh): one epoch at batch 16 (1 x 2 accumulated x 8 GPUs), cosine
  # with 3% warm-up (18 of the ~600 steps of 10k pairs). The comparisons come from rm.train_file /
  # rm.valid_file in AlpacaFarm's layout; `label` (sampling SFT pairs) is not a stage here, and its
  # simulated pools could not judge instructions anyway.
  c.rm.update(layout="alpaca", batch_size=16, epochs=1.0, warmup_steps=18, schedule="cosine",
              eval_every=100, normalize="reference", likelihood_weight=0.0,
              head_init_scale=1.0)
  c.label.update(annotator="rm")
  # People label pairs as AlpacaFarm's did (A / B / tie), exported in its layout for task=rm.
  c.labeling.update(protocol="alpacafarm", layout="alpaca")

  # PPO (rlhf_ppo.sh, ppo_utils.py): KL coefficient 0.02 fixed, 2 optimisation epochs per rollout
  # batch, optimiser steps on half a rollout batch (512 / 256), vf_coef 0.1, clip ranges 0.2,
  # γ = 1, λ = 1, Adam ε = 1e-5, sampling at T = 1, 5 warm-up steps, reward -1 for a response that
  # never ends, value model from the reward model; 10 passes over the 20k unlabeled prompts. For the
  # CPU: 64 rollouts a batch, 200 batches.
  c.ppo.update(kl_coef=0.02, adaptive_kl=False, epochs=2, rollout_batch=64, minibatch_size=32,
               vf_coef=0.1, cliprange=0.2, cliprange_value=0.2, gamma=1.0, lam=1.0, eps=1e-5,
               temperature=1.0, warmup_steps=5, penalize_no_eos=True, no_eos_score=-1.0,
               steps=200, eval_every=25, eval_examples=256)

  # DPO (dpo.sh): 2 epochs at batch 128, cosine with 3% warm-up (5 of the ~156 steps).
  c.dpo.update(epochs=2.0, batch_size=128, warmup_steps=5, schedule="cosine")

  # Best-of-N draws from the SFT policy at the evaluation temperature (AlpacaFarm's best_of_n.py
  # draws at 1.0; the tie keeps best-of-1 equal to the SFT row).
  c.best_of_n.update(n=16)

  # Judged by the reward model (see above) against Alpaca's text-davinci-003 outputs.
  c.eval.update(annotator="rm", methods="sft,ppo,best_of_n,dpo", num_examples=256)

  if arg == "tiny":  # A few steps of each stage on a handful of instructions, for tests.
    c.stages = "sft,rm,ppo,best_of_n,eval"  # DPO left out: one more compile, no new data path.
    c.data.update(sft=8, pref=4, unlabeled=8, validation=4)
    # The same sizes as the other real-data config's tiny variant, so that a test running both
    # compiles the shared jitted functions (sampler, reward scores) once.
    c.tokenizer.update(vocab_size=400, train_examples=64, split_by_unicode_script=True)
    c.format.update(prompt_len=128, response_len=8)
    c.model.update(d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32, max_len=136)
    c.sft.update(batch_size=4, steps=4, warmup_steps=1, log_every=2, eval_every=4, eval_batches=1)
    c.rm.update(batch_size=4, warmup_steps=1, log_every=1, eval_every=2, eval_batch_size=4,
                norm_examples=4, probe_examples=4, bootstrap=10)
    c.ppo.update(steps=2, rollout_batch=4, minibatch_size=2, epochs=1, warmup_steps=0,
                 eval_every=2, eval_examples=4)
    c.best_of_n.update(n=2, batch_size=4)
    c.dpo.update(epochs=1.0, batch_size=4, warmup_steps=1, log_every=1)
    c.eval.update(num_examples=4, batch_size=4, show=1, temperature=1.0,
                  methods="sft,ppo,best_of_n")
    c.checkpoint.update(every=2)
  return c
