"""UltraFeedback binarized (HuggingFaceH4/ultrafeedback_binarized) from a local copy: conversations
through the model's chat template; DPO, and the reward model -> PPO loop.

Nothing is downloaded. Copy the dataset's Parquet files, so that
data/ultrafeedback_binarized/data/{train,test}_prefs-*.parquet exist:

  huggingface-cli download HuggingFaceH4/ultrafeedback_binarized --repo-type dataset \
      --local-dir data/ultrafeedback_binarized
  python -m rlhfjax.main --config configs/ultrafeedback.py --workdir runs/ultrafeedback \
      --config.model.init_from=/models/SmolLM2-135M-Instruct
  python -m rlhfjax.main --config configs/ultrafeedback.py:tiny ...   # a few steps, for tests

Each row has `prompt` (a string), `chosen` and `rejected` (message lists that begin with the user
turn), `messages`, `score_chosen`, `score_rejected`: the prompt conversation is the messages the
two lists share, and only the final assistant turn is trained and scored; the other columns are
kept with each record. The Parquet files are read one row group at a time.

Conversations need a chat template: a chat model's own (model.init_from, an instruct model), or
format.chat_template for a model trained from scratch, as :tiny does. A tokenizer with neither
is refused before anything runs.
"""

import ml_collections

from rlhfjax import config_file

# Zephyr's turn headers (what ultrafeedback_binarized was made for), without an end-of-turn
# token: a response ends with the tokenizer's eos. Used when the model has no template of its own.
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  if arg not in (None, "", "tiny"):
    raise ValueError(f"unknown config argument {arg!r}; expected '' or 'tiny'")
  c = config_file.sibling(__file__, "hh_rlhf", arg)  # Its stages, sizes and budgets (and :tiny).
  c.workdir = "runs/ultrafeedback"
  root = "data/ultrafeedback_binarized/data"
  train, test = f"{root}/train_prefs-*.parquet", f"{root}/test_prefs-*.parquet"
  c.data.update(train_file=train, test_file=test)
  c.rm.update(train_file=train, valid_file=test)
  c.format.chat_template = TEMPLATE if arg == "tiny" else ""  # '': the model's own.
  return c
