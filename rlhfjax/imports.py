"""Importing a library without an optional dependency it would load for nothing.

Two libraries this project uses import heavy packages it never reaches through them:
- tensorboardX imports torch, when torch is installed, only to accept torch tensors (2 s at the
  start of every run that logs metrics; this project logs floats and text);
- rouge-score imports NLTK, whose association measures, classifiers and parsers import
  scipy.stats, scikit-learn and scipy.sparse (1.5 s of every run that scores ROUGE-L; ROUGE uses
  NLTK's stemmer and tokenizer only).
Both import the package inside `try ... except ImportError` and go on without it. `without` makes
that import fail for the duration of one import (a name set to None in `sys.modules` is refused by
Python's import system) and restores it after, so a later `import torch` or `import scipy.stats`
anywhere in the process works as usual. A package already imported is left as it is. The
names are hidden from the whole process while the block runs, so it holds one import and
nothing else; the threads a run has besides the main one (orbax's checkpoint writers, the
rollout's sampler) import none of these names.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

# What NLTK imports for the parts of it ROUGE never reaches: rouge-score's import 2.0 s -> 0.6 s.
NLTK_UNUSED = ("scipy.stats", "scipy.sparse", "sklearn")


@contextlib.contextmanager
def without(*names: str) -> Iterator[None]:
  """Imports inside the block see `names` as not installed (unless already imported)."""
  hidden = [n for n in names if n not in sys.modules]
  for n in hidden:
    sys.modules[n] = None  # type: ignore[assignment]
  try:
    yield
  finally:
    for n in hidden:
      if n in sys.modules and sys.modules[n] is None:
        del sys.modules[n]
