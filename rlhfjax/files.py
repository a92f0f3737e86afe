"""Atomic file writes: a reader (or a relaunch) sees the old file or the whole new one, never half.

The text goes to `<path>.tmp` and is renamed over `path` once complete; when writing fails (a full
disk, a read-only directory) the temporary file is removed and the old file is untouched; a kill
leaves at most the `.tmp`, which nothing reads.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import IO, Iterator

from rlhfjax.errors import ConfigError


def check_writable(directory: str) -> None:
  """Creates `directory` if needed and a file in it; raises the OSError (read-only file system, no
  permission) naming `directory` before any work is done rather than at the first save, and a
  ConfigError when it is a file."""
  if os.path.exists(directory) and not os.path.isdir(directory):
    raise ConfigError(f"--workdir {directory} is a file, not a directory (the workdir is the "
                      "directory a run writes to; it is created if missing)")
  try:
    os.makedirs(directory, exist_ok=True)
    fd, probe = tempfile.mkstemp(dir=directory, prefix=".write-test-")
  except OSError as e:
    raise OSError(e.errno, e.strerror, directory) from e
  os.close(fd)
  os.remove(probe)


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w") -> Iterator[IO]:
  """`open(path, mode)` for writing ('w' or 'wb'), replacing `path` only when the block succeeds."""
  tmp = f"{path}.tmp"
  try:
    with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
      yield f
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
