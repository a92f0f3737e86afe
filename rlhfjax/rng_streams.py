"""The random streams a run draws from its seed: `jax.random.fold_in(jax.random.key(seed), S)`
with one constant S per use, so two uses never share a stream by accident. The values are the ones
the code has always used (changing one changes every run that draws from it); a new stream takes
an unused value."""

from __future__ import annotations

RM_HEAD = 3  # The reward model's fresh scalar head (training/loaders.init_reward_model).
RM_LORA = 5  # The reward model's LoRA adapters (task=rm).
POLICY_LORA = 6  # The policy's LoRA adapters (and PPO's value model's) in the RL methods.
ONLINE = 7  # The online methods' loop: sampling, updates and held-out evaluation.
QUARK = 9  # Quark's sampling rounds.
LABEL_PAIRS = 11  # label: the two samples per post the annotator compares.
LABEL_BINARY = 13  # label.protocol=binary: the one sample per post the annotator judges.

# Keys made as `jax.random.key(seed + N)`, older than the table above and kept for their values
# (every leaderboard in the docs was drawn from them). Each also equals seed + N's own root key, so
# run s's stream N is run s + N's root: runs of neighbouring seeds are not fully independent there.
# A new use takes a `fold_in` stream above, never an offset.
OUTPUTS = 1  # Every method's test answers (rollout/outputs.save_policy), SFT's report's samples.
BEST_OF_N = 2  # best_of_n's candidates.
EXPERT_ITERATION = 3  # expert_iteration's candidates.
PASS_AT_K = 5  # eval.pass_k's samples of the test answers.
OFFSETS = {"outputs": OUTPUTS, "best_of_n": BEST_OF_N, "expert_iteration": EXPERT_ITERATION,
           "pass_at_k": PASS_AT_K}
assert len(set(OFFSETS.values())) == len(OFFSETS), "two offsets share a value"

STREAMS = {"rm_head": RM_HEAD, "rm_lora": RM_LORA, "policy_lora": POLICY_LORA, "online": ONLINE,
           "quark": QUARK, "label_pairs": LABEL_PAIRS, "label_binary": LABEL_BINARY}
assert len(set(STREAMS.values())) == len(STREAMS), "two streams share a value"
