"""PyTorch/transformers side of the speed comparison: the same works, timed in eager PyTorch (CPU).

  .venv-peers/bin/python bench/peers/torch_side.py --work {sample,prefill,rm,ppo,rloo} [--json OUT]
      [--repeats 3] [--small]

Model: `transformers.GPT2Config(vocab_size=2000, n_positions=1024, n_embd=256, n_layer=4, n_head=4,
n_inner=1024, gelu_new, no dropout, tied embeddings)`, random init, float32, default attention
implementation (sdpa; reported in the JSON). Token ids are random in [4, 2000) from a seeded numpy
generator, pad id 0, no eos (every new token counts). Threads: $PEER_THREADS (default 2).

Works (one call of each is what gets timed; `--small` shrinks every shape for smoke tests):
  sample   `model.generate` on 64 left-padded prompts x 512 (real lengths in [128, 512]),
           do_sample, temperature 1, no top-k/top-p, exactly 48 new tokens, KV cache.
           Reports tokens/s = 64 * 48 / seconds.
  prefill  the same prompts, `generate` with exactly 1 new token (prefill + first token).
           Reports prompt tokens/s = 64 * 512 / seconds.
  rm       one Bradley-Terry reward-model step: GPT2Model + Linear(256, 1) read at the last real
           token (right padding, real lengths in [400, 560]); 16 pairs = 32 sequences x 560 in one
           forward, loss -logsigmoid(r_chosen - r_rejected).mean(), backward, clip_grad_norm 1.0,
           AdamW step (lr 3e-4, betas 0.9/0.95, eps 1e-8, wd 0), zero_grad.
           Reports tokens/s = 32 * 560 / seconds (padding included).
  ppo      one PPO update on 16 episodes of a 512-token left-padded prompt (real lengths in
           [128, 512]) + 48 random response tokens, the "old TRL" recipe (TRL PPOTrainer 0.4-0.7 /
           lm-human-preference-details) with a separate value network:
           (a) no-grad experience: policy and frozen reference log-probs of the response tokens,
               value model (GPT2Model + per-token Linear) at the response positions, frozen reward
               model (GPT2Model + Linear at the last token) score;
           (b) rewards -0.05 * (logp - ref_logp), score added at the last token; GAE (gamma 1,
               lam 0.95); returns = advantages + values; advantages whitened;
           (c) 4 epochs x 1 minibatch of all 16: clipped surrogate (0.2) + 0.1 * clipped value loss
               (0.2), backward, clip_grad_norm 1.0 over policy + value, one AdamW step, zero_grad.
           Reports episodes/s = 16 / seconds.
  rloo     TRL's RLOOTrainer (trl, installed by setup.sh): per iteration, 16 left-padded prompts
           as above x 2 completions of exactly 48 tokens by `generate`, a GPT-2 reward model
           (GPT2ForSequenceClassification, 1 label) on the decoded texts, then 2 epochs
           (`num_iterations`) of minibatches of 16; RLOOConfig's other defaults (beta 0.05).
           One warm-up iteration, then `--repeats` timed ones (TRL's own loop, logging off).
           Reports episodes/s = 32 / seconds.
Log-probs/values at response token t come from position t-1 (positions P-1 .. P+R-2); the LM head is
applied only there (`logits_to_keep`). Position ids follow the attention mask (left padding).

One untimed warm-up call, then `--repeats` timed calls; the best (minimum) is reported.
Prints one line; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import tempfile
import time
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
import transformers

PAD = 0


@dataclasses.dataclass(frozen=True)
class Shapes:
  n_layer: int = 4
  batch: int = 64          # sample / prefill prompts
  prompt: int = 512        # prompt length (left-padded)
  min_prompt: int = 128    # shortest real prompt
  new: int = 48            # new tokens (sample) / response tokens (ppo)
  rm_pairs: int = 16
  rm_len: int = 560
  rm_min_len: int = 400
  episodes: int = 16       # ppo


FULL = Shapes()
SMALL = Shapes(n_layer=2, batch=4, prompt=32, min_prompt=8, new=8, rm_pairs=2, rm_len=64,
               rm_min_len=40, episodes=4)


def gpt2_config(shapes: Shapes) -> transformers.GPT2Config:
  return transformers.GPT2Config(
      vocab_size=2000, n_positions=1024, n_embd=256, n_layer=shapes.n_layer, n_head=4, n_inner=1024,
      activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
      tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, pad_token_id=PAD)


def left_padded(rng: np.random.Generator, batch: int, length: int, min_len: int,
                vocab: int = 2000) -> tuple[torch.Tensor, torch.Tensor]:
  """Random prompts, real length in [min_len, length], padded on the left: (ids, mask) [batch, length]."""
  ids = torch.from_numpy(rng.integers(4, vocab, (batch, length))).long()
  real = rng.integers(min_len, length + 1, batch)
  mask = torch.from_numpy(np.arange(length)[None, :] >= (length - real)[:, None]).long()
  return ids * mask + PAD * (1 - mask), mask


def positions(mask: torch.Tensor) -> torch.Tensor:
  return (mask.cumsum(1) - 1).clamp(min=0)


class Scalar(torch.nn.Module):
  """A decoder backbone + Linear(width, 1): per-token values, or one score read at `index`."""

  def __init__(self, backbone: torch.nn.Module, width: int):
    super().__init__()
    self.backbone = backbone
    self.head = torch.nn.Linear(width, 1)

  def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    h = self.backbone(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).last_hidden_state
    return self.head(h).squeeze(-1)  # [B, T]

  def at(self, ids: torch.Tensor, mask: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    h = self.backbone(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).last_hidden_state
    return self.head(h[torch.arange(h.shape[0], device=h.device), index]).squeeze(-1)  # [B]


def gpt2_scalar(config: transformers.GPT2Config) -> Scalar:
  return Scalar(transformers.GPT2Model(config), config.n_embd)


def generate_work(shapes: Shapes, new: int) -> tuple[Callable[[], None], dict]:
  """`generate` on left-padded prompts with exactly `new` sampled tokens (new=1: prefill)."""
  model = transformers.GPT2LMHeadModel(gpt2_config(shapes)).eval()
  ids, mask = left_padded(np.random.default_rng(0), shapes.batch, shapes.prompt, shapes.min_prompt)

  def call() -> None:
    with torch.inference_mode():
      out = model.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                           top_p=1.0, max_new_tokens=new, min_new_tokens=new, use_cache=True,
                           pad_token_id=PAD, eos_token_id=None)
    assert out.shape == (shapes.batch, shapes.prompt + new), out.shape

  return call, {"batch": shapes.batch, "prompt_len": shapes.prompt, "new_tokens": new,
                "attn_implementation": model.config._attn_implementation}


def sample_work(shapes: Shapes) -> tuple[Callable[[], None], dict]:
  call, info = generate_work(shapes, shapes.new)
  return call, {**info, "rate_name": "tokens/s", "rate_numerator": shapes.batch * shapes.new}


def prefill_work(shapes: Shapes) -> tuple[Callable[[], None], dict]:
  call, info = generate_work(shapes, 1)
  return call, {**info, "rate_name": "prompt tokens/s",
                "rate_numerator": shapes.batch * shapes.prompt}


def rm_work(shapes: Shapes) -> tuple[Callable[[], None], dict]:
  """One Bradley-Terry step on `rm_pairs` pairs (chosen and rejected in one forward)."""
  config = gpt2_config(shapes)
  model = gpt2_scalar(config).train()
  opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
  rng = np.random.default_rng(0)
  n, length = 2 * shapes.rm_pairs, shapes.rm_len
  real = torch.from_numpy(rng.integers(shapes.rm_min_len, length + 1, n)).long()
  mask = (torch.arange(length)[None, :] < real[:, None]).long()
  ids = torch.from_numpy(rng.integers(4, 2000, (n, length))).long() * mask

  def call() -> None:
    r = model.at(ids, mask, real - 1)
    loss = -F.logsigmoid(r[:shapes.rm_pairs] - r[shapes.rm_pairs:]).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()

  return call, {"pairs": shapes.rm_pairs, "sequences": n, "seq_len": length,
                "attn_implementation": config._attn_implementation,
                "rate_name": "tokens/s", "rate_numerator": n * length}


def response_logprobs(policy: transformers.PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor,
                      resp_len: int) -> torch.Tensor:
  """log p(response token t) from the logits at positions P-1 .. P+R-2, in float32: [B, R]."""
  logits = policy(input_ids=ids, attention_mask=mask, position_ids=positions(mask),
                  logits_to_keep=resp_len + 1).logits[:, :-1]
  return torch.gather(F.log_softmax(logits.float(), -1), 2, ids[:, -resp_len:, None]).squeeze(-1)


def whiten(x: torch.Tensor) -> torch.Tensor:
  return (x - x.mean()) * torch.rsqrt(x.var() + 1e-8)


def response_values(value: Scalar, ids: torch.Tensor, mask: torch.Tensor,
                    resp_len: int) -> torch.Tensor:
  """The value of the state before each response token: [B, R]."""
  return value(ids, mask)[:, -resp_len - 1:-1]


def ppo_experience(policy: transformers.PreTrainedModel, ref: transformers.PreTrainedModel,
                   value: Scalar, reward: Scalar, ids: torch.Tensor, mask: torch.Tensor,
                   resp_len: int, kl_coef: float = 0.05, gamma: float = 1.0,
                   lam: float = 0.95) -> dict[str, torch.Tensor]:
  """Steps (a) and (b) of the `ppo` work: no-grad log-probs, values and score, then per-token KL
  rewards, GAE, returns and whitened advantages, each [B, R]."""
  with torch.no_grad():
    logp = response_logprobs(policy, ids, mask, resp_len)
    ref_logp = response_logprobs(ref, ids, mask, resp_len)
    values = response_values(value, ids, mask, resp_len)
    last_token = torch.full((ids.shape[0],), ids.shape[1] - 1, device=ids.device)
    score = reward.at(ids, mask, last_token)
    rewards = -kl_coef * (logp - ref_logp)
    rewards[:, -1] += score
    last, advs = torch.zeros_like(score), []
    for t in reversed(range(resp_len)):
      next_v = values[:, t + 1] if t + 1 < resp_len else torch.zeros_like(score)
      last = rewards[:, t] + gamma * next_v - values[:, t] + gamma * lam * last
      advs.append(last)
    advantages = torch.stack(advs[::-1], 1)
    return {"logp": logp, "values": values, "returns": advantages + values,
            "advantages": whiten(advantages)}


def ppo_minibatch_step(policy: transformers.PreTrainedModel, value: Scalar,
                       opt: torch.optim.Optimizer, params: list[torch.nn.Parameter],
                       ids: torch.Tensor, mask: torch.Tensor, resp_len: int,
                       exp: dict[str, torch.Tensor], cliprange: float = 0.2,
                       cliprange_value: float = 0.2, vf_coef: float = 0.1) -> None:
  """Step (c) of the `ppo` work on one minibatch (the rows of `ids` and `exp` given): clipped
  surrogate + vf_coef x clipped value loss, backward, clip_grad_norm 1.0, one AdamW step."""
  adv, old_values, returns = exp["advantages"], exp["values"], exp["returns"]
  ratio = torch.exp(response_logprobs(policy, ids, mask, resp_len) - exp["logp"])
  pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - cliprange, 1 + cliprange)).mean()
  vpred = response_values(value, ids, mask, resp_len)
  vclipped = old_values + (vpred - old_values).clamp(-cliprange_value, cliprange_value)
  vf_loss = 0.5 * torch.max((vpred - returns) ** 2, (vclipped - returns) ** 2).mean()
  (pg_loss + vf_coef * vf_loss).backward()
  torch.nn.utils.clip_grad_norm_(params, 1.0)
  opt.step()
  opt.zero_grad()


def ppo_work(shapes: Shapes, epochs: int = 4) -> tuple[Callable[[], None], dict]:
  """One PPO update (experience + `epochs` full-batch steps) on `episodes` fixed episodes."""
  config = gpt2_config(shapes)
  policy = transformers.GPT2LMHeadModel(config).train()
  ref = copy.deepcopy(policy).eval().requires_grad_(False)
  value = gpt2_scalar(config).train()
  reward = gpt2_scalar(config).eval().requires_grad_(False)
  params = [*policy.parameters(), *value.parameters()]
  opt = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
  rng = np.random.default_rng(0)
  R = shapes.new
  prompt, pmask = left_padded(rng, shapes.episodes, shapes.prompt, shapes.min_prompt)
  ids = torch.cat([prompt, torch.from_numpy(rng.integers(4, 2000, (shapes.episodes, R))).long()], 1)
  mask = torch.cat([pmask, torch.ones(shapes.episodes, R, dtype=torch.long)], 1)

  def call() -> None:
    exp = ppo_experience(policy, ref, value, reward, ids, mask, R)
    for _ in range(epochs):  # One minibatch of all episodes per epoch.
      ppo_minibatch_step(policy, value, opt, params, ids, mask, R, exp)

  return call, {"episodes": shapes.episodes, "prompt_len": shapes.prompt, "response_len": R,
                "epochs": epochs, "attn_implementation": config._attn_implementation,
                "rate_name": "episodes/s", "rate_numerator": shapes.episodes}

def word_tokenizer(vocab: int) -> transformers.PreTrainedTokenizerFast:
  """A whitespace word-level tokenizer over the ids 0..vocab-1 written "t<id>" (no download): a
  prompt of n such words is n tokens, and TRL's decode / re-encode round trip is exact."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  words = {f"t{i}": i for i in range(vocab)}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="t3"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  tok.decoder = tokenizers.decoders.WordPiece(prefix="##", cleanup=False)  # Joins with spaces.
  return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=f"t{PAD}",
                                               eos_token="t1", unk_token="t3", padding_side="left")


def trl_rloo(policy: transformers.PreTrainedModel, reward: transformers.PreTrainedModel,
             ids: torch.Tensor, mask: torch.Tensor, new: int, k: int = 2, epochs: int = 2,
             minibatch: int = 16, repeats: int = 3) -> dict:
  """TRL's RLOOTrainer on `policy` against `reward` (a sequence classifier with 1 label):
  `repeats` + 1 iterations, each sampling k completions of exactly `new` tokens for the
  left-padded prompts `ids` with `generate`, scoring them, then `epochs` passes (TRL's
  `num_iterations`) of minibatches of `minibatch`; its own `RLOOConfig` settings otherwise (beta
  0.05, AdamW), on CUDA when there is one and in bfloat16 when the models are. The first
  iteration is the untimed warm-up; each later one is timed from its first optimizer step to the
  next iteration's (generation included). Returns those times and TRL's version."""
  import datasets  # pylint: disable=g-import-not-at-top
  import trl  # pylint: disable=g-import-not-at-top
  tokenizer = word_tokenizer(policy.config.vocab_size)
  # TRL builds the reference from the policy's path: both models go through a local directory.
  workdir = tempfile.mkdtemp()
  policy_dir, reward_dir = os.path.join(workdir, "policy"), os.path.join(workdir, "reward")
  policy.save_pretrained(policy_dir)
  reward.save_pretrained(reward_dir)
  texts = [" ".join(f"t{i}" for i in row[m.bool()].tolist()) for row, m in zip(ids, mask)]
  prompts = len(texts)
  steps_per_iteration = epochs * (prompts * k // minibatch)
  stamps: list[float] = []

  class Clock(transformers.TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
      if state.global_step % steps_per_iteration == 0:
        stamps.append(time.perf_counter())

    def on_train_end(self, args, state, control, **kwargs):
      stamps.append(time.perf_counter())

  args = trl.RLOOConfig(
      output_dir=os.path.join(workdir, "out"), per_device_train_batch_size=minibatch,
      steps_per_generation=prompts * k // minibatch, num_generations=k, num_iterations=epochs,
      max_completion_length=new, temperature=1.0, top_k=0, top_p=1.0,
      generation_kwargs={"min_new_tokens": new}, beta=0.05, learning_rate=1e-5,
      max_steps=(repeats + 1) * steps_per_iteration, logging_steps=1_000_000, save_strategy="no",
      report_to=[], use_cpu=not torch.cuda.is_available(), bf16=policy.dtype == torch.bfloat16,
      gradient_checkpointing=False,  # As rlhfjax: no remat.
      seed=0, shuffle_dataset=False,
      dataloader_num_workers=0)
  dataset = datasets.Dataset.from_dict({"prompt": texts * (repeats + 2)})
  trainer = trl.RLOOTrainer(model=policy_dir, reward_funcs=reward_dir, args=args,
                            train_dataset=dataset, processing_class=tokenizer,
                            reward_processing_classes=tokenizer, callbacks=[Clock()])
  trainer.train()
  return {"times": list(np.diff(stamps))[1:], "trl": trl.__version__}  # Iteration 0 warms up.


def rloo_work(shapes: Shapes, prompts: int = 16, k: int = 2, epochs: int = 2,
              minibatch: int = 16, repeats: int = 3) -> tuple[None, dict]:
  """`trl_rloo` with a GPT-2 policy and reward model (GPT2ForSequenceClassification) on `prompts`
  left-padded prompts."""
  config = gpt2_config(shapes)
  policy = transformers.GPT2LMHeadModel(config)
  reward = transformers.GPT2ForSequenceClassification(
      transformers.GPT2Config(**{**config.to_dict(), "num_labels": 1}))
  ids, mask = left_padded(np.random.default_rng(0), prompts, shapes.prompt, shapes.min_prompt)
  info = trl_rloo(policy, reward, ids, mask, shapes.new, k, epochs, minibatch, repeats)
  return None, {**info, "episodes": prompts * k, "prompts": prompts, "k": k, "epochs": epochs,
                "prompt_len": shapes.prompt, "response_len": shapes.new,
                "attn_implementation": config._attn_implementation,
                "rate_name": "episodes/s", "rate_numerator": prompts * k}


WORKS = {"sample": sample_work, "prefill": prefill_work, "rm": rm_work, "ppo": ppo_work,
         "rloo": rloo_work}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--work", required=True, choices=sorted(WORKS))
  ap.add_argument("--json", default="", help="also write the numbers here")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--small", action="store_true", help="tiny shapes, for smoke tests")
  args = ap.parse_args()

  torch.set_num_threads(int(os.environ.get("PEER_THREADS", "2")))
  torch.manual_seed(0)
  torch.set_default_dtype(torch.float32)
  shapes = SMALL if args.small else FULL
  if args.work == "rloo":  # TRL's trainer runs its own loop and times its iterations.
    _, info = rloo_work(shapes, repeats=args.repeats)
    times = info.pop("times")
  else:
    call, info = WORKS[args.work](shapes)
    call()  # warm-up, untimed
    times = []
    for _ in range(args.repeats):
      start = time.perf_counter()
      call()
      times.append(time.perf_counter() - start)
  best = min(times)
  rate = info["rate_numerator"] / best
  result = {"work": args.work, "seconds": best, "all": times, "rate": rate,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads(), "small": args.small, "n_layer": shapes.n_layer,
            **info}
  print(f"torch {args.work}: best {best:.4f} s/call over {args.repeats} "
        f"({rate:.1f} {info['rate_name']}; threads {result['threads']}, "
        f"{info['attn_implementation']}{', small' if args.small else ''})")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=2)


if __name__ == "__main__":
  main()
