"""Real data from local files, and which examples a run reads.

- `loading.py`: the `data` config block's source cut into the pipeline's splits.
- `tfds_builders.py`: TFDS builders of every dataset (and of the simulated world).
- `openai_tldr.py`, `reddit.py`, `tldr_mining.py`: OpenAI's filtered TL;DR, Reddit dumps, and the
  TLDR9+ mining with TLDRHQ's ROUGE-oracle filter.
- `alpaca.py`: Alpaca's instructions; `reddit_advice.py`: RedditAdvice for TuringAdvice.
"""
