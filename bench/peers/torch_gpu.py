"""The PyTorch side of the GPU comparison (bench/gpu.py): jax_gpu.py's works in eager PyTorch.

  python bench/peers/torch_gpu.py --work {sft,rm,sample,sample_static,ppo,ppo_static,rloo}
      --model JSON [--preset gpu-1b|tiny] [--repeats 3] [--iterations 3] [--json OUT]

`--model` holds the rlhfjax ModelConfig's fields (bench/gpu.py passes them): the model is a
`transformers.LlamaConfig` of that shape (Llama 3 RoPE scaling included), random init, built
directly on the device in the preset's dtype, sdpa attention; nothing is downloaded. It runs on
CUDA when torch sees a GPU, else on the CPU with $PEER_THREADS threads. Token ids are random,
pad id 0, no eos. Each timed call ends with a CUDA synchronize.

- sft: forward + backward + AdamW (fused on CUDA), clip 1.0, cross-entropy over the response tokens
  (logits only there, as rlhfjax's SFT step), seq_batch x (seq_prompt + seq_response).
- rm: the Bradley-Terry step of torch_side.py's `rm` (LlamaModel + Linear read at the last token)
  on seq_batch / 2 pairs of the same length.
- sample, sample_static: `generate` on sample_batch prompts, sample_new new tokens at temperature
  1, with the default dynamic cache or `cache_implementation="static"` (which transformers
  compiles with torch.compile on CUDA).
- ppo, ppo_static: torch_side.py's PPO (experience with policy, reference, value and reward models,
  GAE, clipped losses, separate value network) at the preset's shapes, after `generate` (either
  cache) samples the responses of the left-padded prompts: epochs x (episodes / minibatch) AdamW
  steps, minibatches shuffled. One warm-up iteration, then `--iterations` timed ones (mean).
- rloo: TRL's RLOOTrainer (torch_side.py's `trl_rloo`) at the preset's RLOO shapes, when trl is
  installed in this interpreter; otherwise the report says why not.

The compiling calls (one, two for the static cache) are untimed; sft, rm and sample report the
best of `--repeats` calls. Asserts nothing.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import sys
import time
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import presets  # noqa: E402
from torch_side import PAD, Scalar, left_padded, ppo_experience  # noqa: E402
from torch_side import ppo_minibatch_step, trl_rloo  # noqa: E402


def llama_config(m: dict[str, Any]) -> transformers.LlamaConfig:
  """The Llama of the rlhfjax ModelConfig fields `m`."""
  rope = {"rope_type": "default", "rope_theta": m["rope_theta"]}
  if m["rope_scaling_factor"] != 1:
    rope.update(rope_type="llama3", factor=m["rope_scaling_factor"],
                low_freq_factor=m["rope_low_freq_factor"],
                high_freq_factor=m["rope_high_freq_factor"],
                original_max_position_embeddings=m["rope_original_max_len"])
  return transformers.LlamaConfig(
      vocab_size=m["vocab_size"], hidden_size=m["d_model"], intermediate_size=m["d_ff"],
      num_hidden_layers=m["n_layers"], num_attention_heads=m["n_heads"],
      num_key_value_heads=m["n_kv_heads"], head_dim=m["head_dim"] or m["d_model"] // m["n_heads"],
      max_position_embeddings=m["max_len"], rms_norm_eps=m["norm_eps"],
      tie_word_embeddings=m["tie_embeddings"], attention_bias=m["qkv_bias"],
      rope_parameters=rope, bos_token_id=None, eos_token_id=None, pad_token_id=PAD,
      attn_implementation="sdpa")


class Stack:
  """Where and how the models are built: the device, the dtype, and the Llama config."""

  def __init__(self, preset: presets.Preset, model: dict[str, Any]):
    self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    self.dtype = getattr(torch, preset.dtype)
    self.config = llama_config(model)
    self.vocab = model["vocab_size"]

  def build(self, cls: type, **overrides: Any) -> torch.nn.Module:
    """A randomly initialised `cls` of the config (with `overrides`), made on the device."""
    config = transformers.LlamaConfig(**{**self.config.to_dict(), **overrides})
    with torch.device(self.device):
      return cls._from_config(config, dtype=self.dtype)

  def scalar(self) -> Scalar:
    """LlamaModel + Linear(d_model, 1): a value or reward model."""
    with torch.device(self.device):
      head = Scalar(self.build(transformers.LlamaModel), self.config.hidden_size)
    return head.to(self.dtype)

  def tokens(self, rng: np.random.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.from_numpy(rng.integers(4, self.vocab, shape)).long().to(self.device)

  def sync(self) -> None:
    if self.device.type == "cuda":
      torch.cuda.synchronize()

  def adamw(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                             fused=self.device.type == "cuda")


def sft_work(p: presets.Preset, s: Stack) -> Callable[[], None]:
  model = s.build(transformers.LlamaForCausalLM).train()
  opt = s.adamw(list(model.parameters()))
  ids = s.tokens(np.random.default_rng(0), (p.seq_batch, p.seq_prompt + p.seq_response))
  mask = torch.ones_like(ids)
  r = p.seq_response

  def call() -> None:
    logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=r + 1).logits[:, :-1]
    F.cross_entropy(logits.float().flatten(0, 1), ids[:, -r:].flatten()).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()

  return call


def rm_work(p: presets.Preset, s: Stack) -> Callable[[], None]:
  model = s.scalar().train()
  opt = s.adamw(list(model.parameters()))
  ids = s.tokens(np.random.default_rng(0), (p.seq_batch, p.seq_prompt + p.seq_response))
  mask = torch.ones_like(ids)
  last = torch.full((p.seq_batch,), ids.shape[1] - 1, device=s.device)

  def call() -> None:
    r = model.at(ids, mask, last).float()
    (-F.logsigmoid(r[:p.rm_pairs] - r[p.rm_pairs:]).mean()).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()

  return call


def generate(model: transformers.PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor,
             new: int) -> torch.Tensor:
  """Exactly `new` tokens sampled at temperature 1 after the left-padded `ids`."""
  with torch.inference_mode():
    return model.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                          top_p=1.0, max_new_tokens=new, min_new_tokens=new, use_cache=True,
                          pad_token_id=PAD, eos_token_id=None)


def causal_lm(s: Stack, static: bool) -> transformers.PreTrainedModel:
  model = s.build(transformers.LlamaForCausalLM)
  if static:
    model.generation_config.cache_implementation = "static"
  return model


def sample_work(p: presets.Preset, s: Stack, static: bool) -> Callable[[], None]:
  model = causal_lm(s, static).eval()
  ids = s.tokens(np.random.default_rng(0), (p.sample_batch, p.sample_prompt))
  mask = torch.ones_like(ids)
  return lambda: generate(model, ids, mask, p.sample_new)


def ppo_work(p: presets.Preset, s: Stack, static: bool) -> Callable[[], dict[str, float]]:
  """One PPO iteration per call: generate, experience, then the minibatch updates; returns the
  seconds of each part."""
  policy = causal_lm(s, static).train()
  ref = copy.deepcopy(policy).eval().requires_grad_(False)
  value, reward = s.scalar().train(), s.scalar().eval().requires_grad_(False)
  params = [*policy.parameters(), *value.parameters()]
  opt = s.adamw(params)
  rng = np.random.default_rng(0)
  prompt, pmask = (x.to(s.device) for x in left_padded(rng, p.episodes, p.rl_prompt,
                                                        p.rl_min_prompt, s.vocab))
  r = p.rl_response
  mask = torch.cat([pmask, torch.ones_like(pmask[:, :r])], 1)

  def call() -> dict[str, float]:
    stamps = [time.perf_counter()]
    ids = generate(policy, prompt, pmask, r).clone()  # Out of inference mode, for autograd.
    s.sync()
    stamps.append(time.perf_counter())
    exp = ppo_experience(policy, ref, value, reward, ids, mask, r)
    s.sync()
    stamps.append(time.perf_counter())
    for _ in range(p.epochs):
      for rows in torch.randperm(p.episodes, device=s.device).split(p.minibatch):
        ppo_minibatch_step(policy, value, opt, params, ids[rows], mask[rows], r,
                           {k: v[rows] for k, v in exp.items()})
    s.sync()
    stamps.append(time.perf_counter())
    return dict(zip(("generate", "experience", "update"), np.diff(stamps).tolist()))

  return call


def rloo_work(p: presets.Preset, s: Stack, repeats: int) -> dict:
  """TRL's RLOO iterations at the preset's shapes, or why they cannot run here."""
  if importlib.util.find_spec("trl") is None:
    return {"skipped": f"trl is not installed in {sys.executable}"}
  ids, mask = left_padded(np.random.default_rng(0), p.episodes // p.rloo_k, p.rl_prompt,
                          p.rl_min_prompt, s.vocab)
  policy = s.build(transformers.LlamaForCausalLM)
  reward = s.build(transformers.LlamaForSequenceClassification, num_labels=1)
  out = trl_rloo(policy, reward, ids, mask, p.rl_response, p.rloo_k, p.epochs, p.minibatch,
                 repeats)
  times = out.pop("times")
  return {**out, "seconds": float(np.mean(times)), "all": times}


def timed(call: Callable[[], Any], s: Stack, warmups: int, repeats: int) -> list[float]:
  """Seconds of `repeats` calls after `warmups` untimed ones."""
  for _ in range(warmups):
    call()
  s.sync()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    call()
    s.sync()
    times.append(time.perf_counter() - start)
  return times


def iterations(call: Callable[[], dict[str, float]], warmups: int, n: int) -> dict:
  """Mean seconds of `n` iterations, whole and by part, after `warmups` untimed ones."""
  for _ in range(warmups):
    call()
  parts = [call() for _ in range(n)]
  mean = {k: float(np.mean([x[k] for x in parts])) for k in parts[0]}
  return {"seconds": sum(mean.values()), "parts": mean, "all": [sum(x.values()) for x in parts]}


def run(work: str, p: presets.Preset, s: Stack, args: argparse.Namespace) -> dict:
  static = work.endswith("_static")
  warmups = 2 if static else 1  # The static cache compiles, then records CUDA graphs.
  if work == "rloo":
    return rloo_work(p, s, args.iterations)
  if work.startswith("ppo"):
    return iterations(ppo_work(p, s, static), warmups, args.iterations)
  call = {"sft": lambda: sft_work(p, s), "rm": lambda: rm_work(p, s),
          "sample": lambda: sample_work(p, s, False),
          "sample_static": lambda: sample_work(p, s, True)}[work]()
  times = timed(call, s, warmups, args.repeats)
  return {"seconds": min(times), "all": times}


WORKS = ("sft", "rm", "sample", "sample_static", "ppo", "ppo_static", "rloo")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--work", required=True, choices=WORKS)
  ap.add_argument("--model", required=True, help="the rlhfjax ModelConfig's fields, as JSON")
  ap.add_argument("--preset", default="gpu-1b", choices=sorted(presets.PRESETS))
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--iterations", type=int, default=3, help="timed PPO / RLOO iterations")
  ap.add_argument("--json", default="")
  args = ap.parse_args()
  torch.set_num_threads(int(os.environ.get("PEER_THREADS", str(os.cpu_count()))))
  torch.manual_seed(0)
  p = presets.PRESETS[args.preset]
  s = Stack(p, json.loads(args.model))
  out = run(args.work, p, s, args)
  out = {"work": args.work, "side": "pytorch", "torch": torch.__version__,
         "transformers": transformers.__version__, "device": str(s.device),
         "device_name": torch.cuda.get_device_name() if s.device.type == "cuda" else "cpu",
         "attn_implementation": s.config._attn_implementation, **out}
  print(f"torch {args.work}: " + (out["skipped"] if "skipped" in out else
                                  f"{out['seconds'] * 1e3:.1f} ms"))
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(out, f, indent=2)


if __name__ == "__main__":
  main()
