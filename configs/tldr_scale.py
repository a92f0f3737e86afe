"""Published architectures at real size on the TL;DR pipeline: TPU slices and GPU clusters.

  python -m rlhfjax.main --config configs/tldr_scale.py:llama3.1-8b --config.task=compile \
      --config.compile.topology=v5p:2x2x2            # no TPU needed: pip install -e '.[tpu]'
  python -m rlhfjax.main --config configs/tldr_scale.py:qwen2.5-7b --config.model.init_from=DIR ...

The argument names an architecture of rlhfjax/models/architectures.py (smollm2-135m, smollm2-360m,
smollm2-1.7b, llama3.2-1b, llama3.2-3b, llama3.1-8b, llama3.1-70b, qwen2.5-0.5b, qwen2.5-7b,
qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b, pythia-1b, pythia-2.8b, pythia-6.9b, gemma-2-2b,
gemma-2-9b, gemma-3-1b, gemma-3-4b, gemma-3-12b).
Random weights are enough to compile and size a run; `model.init_from` (a Hugging Face directory
of that model) loads the real ones and its tokenizer. Mixed precision as on TPU pods: float32
master weights and AdamW moments, bfloat16 compute, rematerialised layers, attention without the
S x S score matrix ('chunked'; 'splash' is the Pallas TPU kernel). PPO keeps its frozen reference
and reward models in bfloat16. Sequences of 2048 tokens (a 1536-token prompt, 512 sampled).
"""

import ml_collections

from rlhfjax import config_file
from rlhfjax.models import architectures


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  name = arg or "llama3.1-8b"
  if name not in architectures.ARCHITECTURES:
    raise ValueError(f"unknown architecture {name!r}; known: "
                     f"{', '.join(architectures.ARCHITECTURES)}")
  c = config_file.sibling(__file__, "tldr_sim")
  c.workdir = f"runs/{name}"
  c.stages = "sft,label,rm,ppo,eval"
  c.model = dict({"head_dim": 0, **architectures.ARCHITECTURES[name]}, init_from="", dropout=0.0,
                 dtype="bfloat16", param_dtype="float32", remat="full", scan_layers=True,
                 attention="chunked", attention_chunk=512)
  c.format.update(prompt_len=1536, response_len=512)
  # FSDP over the whole slice; task=compile with --config.mesh.auto=True tries the other shapes.
  c.mesh.update(data=1, fsdp=-1, tensor=1)
  # Global batches (sequences; rm, dpo and simpo count pairs, kto responses).
  c.sft.update(batch_size=64, steps=800, lr=1e-5, warmup_steps=50)
  c.rm.update(batch_size=32, eval_batch_size=64, lr=5e-6, likelihood_weight=0.0,
              head_init_scale=1.0)
  c.dpo.update(batch_size=32, lr=5e-7)
  c.simpo.update(batch_size=32, lr=5e-7)  # In the 3e-7 to 1e-6 the SimPO authors grid at 7-8B.
  c.kto.update(batch_size=64, lr=1e-6)  # TRL's KTOConfig default: its ceiling for beta 0.1.
  c.ppo.update(rollout_batch=64, minibatch_size=16, epochs=2, lr=1e-6, frozen_dtype="bfloat16")
  c.best_of_n.update(batch_size=64)
  c.compile.topology = "v5p:2x2x2"
  return c
