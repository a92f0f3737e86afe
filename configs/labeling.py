"""A labeling round with people (docs/labeling.md): the quickstart's config, serving the labeling
site. The same tasks run with any config (its `labeling` block), e.g. configs/alpaca.py.

  pip install -e '.[label]'
  W=runs/quickstart   # a finished quickstart; H: a copy of it without rm/ (docs/labeling.md)
  python -m rlhfjax.main --config configs/labeling.py --workdir $W --config.task=label_load \\
      --config.labeling.source="comparisons:$W/label/train.jsonl;comparisons:$W/label/valid.jsonl"
  python -m rlhfjax.main --config configs/labeling.py --workdir $W   # serves http://127.0.0.1:8080
  python -m rlhfjax.main --config configs/labeling.py --workdir $W --config.task=label_user \\
      --config.labeling.user=ada --config.labeling.admin=True   # prints a one-time sign-in link
  python -m rlhfjax.main --config configs/labeling.py --workdir $W --config.task=label_export
  python -m rlhfjax.main --config configs/labeling.py --workdir $H --config.task=rm \\
      --config.rm.train_file=$W/labeling/export/train.jsonl \\
      --config.rm.valid_file=$W/labeling/export/valid.jsonl
"""

import ml_collections

from rlhfjax import config_file


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = config_file.sibling(__file__, "tldr_sim", arg)
  c.task = "label_server"
  return c
