"""Rows of a dataset file, whatever the file: JSON Lines, one JSON array, Parquet, or Arrow.

A path names, as a Hugging Face Hub download or `datasets` leaves them:
- a file: `.jsonl` / `.json` (JSON Lines or one JSON array, `jsonl.read_any`), `.parquet`, or an
  Arrow IPC stream `.arrow` (what `Dataset.save_to_disk` writes);
- a directory of Parquet shards (`data/train-00000-of-00003.parquet`, ... searched recursively), of
  JSON Lines files, or a `save_to_disk` directory (`data-0000N-of-0000M.arrow` beside
  `dataset_info.json` and `state.json`, whose `_data_files` gives the shards' order; of a
  DatasetDict, one split's directory);
- a glob (`data/train-*.parquet`).
Shards are read in natural order (`-2-` before `-10-`), and rows keep their order.

`read(path, parse)` returns `parse(row)` of every good row and one problem per bad row, as
`jsonl.read_any` does for JSON: a bad row in Parquet or Arrow is `file: row N (index N-1): reason`
(a `ValueError` from `parse`). A file that cannot be read at all (not Parquet, a truncated shard,
no file matching the glob) is one `DataError` naming it, raised before any row is parsed: every
file's footer or schema is opened first.

Memory: Parquet is read one row group at a time (`ParquetFile.iter_batches`, without pyarrow's
pre-buffering of the whole file) and Arrow one record batch at a time, each batch converted to
Python rows and dropped before the next, so what grows with the file is what `parse` keeps (the
records), not a second copy of the table.
"""

from __future__ import annotations

import glob as glob_lib
import json
import os
import re
from typing import Any, Callable, Iterator, TypeVar

from rlhfjax.data import jsonl
from rlhfjax.errors import DataError

T = TypeVar("T")

JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET, ARROW, JSON = "parquet", "arrow", "json"
_BATCH_ROWS = 4096  # Rows per batch converted to Python at a time (a row group may hold more).
# What `datasets` writes beside the data, never rows.
_METADATA = ("dataset_info.json", "state.json", "dataset_dict.json", "dataset_infos.json")


def _natural(path: str) -> list:
  return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


def _kind(path: str) -> str:
  """The kind of one file, by its suffix, else by its first bytes."""
  lower = path.lower()
  if lower.endswith(".parquet"):
    return PARQUET
  if lower.endswith(".arrow"):
    return ARROW
  if lower.endswith(JSON_SUFFIXES):
    return JSON
  with open(path, "rb") as f:
    head = f.read(8)
  if head.startswith(b"PAR1"):
    return PARQUET
  if head.startswith(b"\xff\xff\xff\xff") or head.startswith(b"ARROW1"):
    return ARROW
  return JSON


def _save_to_disk_files(directory: str) -> list[str] | None:
  """The Arrow shards of a `save_to_disk` directory in `state.json`'s order, or None when the
  directory is not one."""
  state = os.path.join(directory, "state.json")
  arrows = sorted(glob_lib.glob(os.path.join(directory, "*.arrow")), key=_natural)
  if not os.path.exists(state):
    return arrows or None
  try:
    with open(state, encoding="utf-8") as f:
      names = [d["filename"] for d in json.load(f).get("_data_files", [])]
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    raise DataError(f"{state}: not a `datasets` state.json ({e})") from None
  return [os.path.join(directory, n) for n in names] or arrows


def is_pattern(path: str) -> bool:
  """Whether `path` is a glob (`data/train-*.parquet`) rather than one file or directory."""
  return any(c in path for c in "*?[")


def files(path: str) -> list[tuple[str, str]]:
  """(file, kind) of every file `path` names (a file, a directory, or a glob), in reading order;
  a DataError when it names none."""
  if is_pattern(path):
    found = sorted((p for p in glob_lib.glob(path, recursive=True) if os.path.isfile(p)),
                   key=_natural)
    if not found:
      raise DataError(f"{path}: no file matches this pattern")
    return [(p, _kind(p)) for p in found]
  if os.path.isdir(path):
    splits = os.path.join(path, "dataset_dict.json")
    if os.path.exists(splits):  # A DatasetDict's save_to_disk: one directory per split.
      names = sorted(n for n in os.listdir(path) if os.path.isdir(os.path.join(path, n)))
      raise DataError(f"{path}: a DatasetDict saved to disk; name one of its splits' directories "
                      f"({', '.join(names)})")
    arrows = _save_to_disk_files(path)
    if arrows:
      return [(p, ARROW) for p in arrows]
    for suffixes, kind in (((".parquet",), PARQUET), (JSON_SUFFIXES, JSON)):
      found = sorted((os.path.join(root, n) for root, _, names in os.walk(path) for n in names
                      if n.lower().endswith(suffixes) and n not in _METADATA), key=_natural)
      if found:
        return [(p, kind) for p in found]
    raise DataError(f"{path}: a directory with no .parquet, .arrow, .jsonl or .json file")
  if not os.path.exists(path):
    raise FileNotFoundError(f"data file not found: {path}")
  return [(path, _kind(path))]


def _pyarrow():
  try:
    import pyarrow  # pylint: disable=g-import-not-at-top
    import pyarrow.ipc  # pylint: disable=g-import-not-at-top,unused-import
    import pyarrow.parquet  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    raise DataError("Parquet and Arrow files need pyarrow: pip install pyarrow") from e
  return pyarrow


def _open(path: str, kind: str) -> Any:
  """An open reader of a Parquet or Arrow file; a DataError naming it when it is not one."""
  pa = _pyarrow()
  try:
    if kind == PARQUET:
      # No pre-buffering: pyarrow's default reads every row group's column chunks into memory up
      # front (about the file's size, held to the end); without it one row group is in memory.
      return pa.parquet.ParquetFile(path, pre_buffer=False)
    source = pa.memory_map(path)  # Record batches are views of the mapped file, not copies.
    try:
      return pa.ipc.open_stream(source)
    except pa.ArrowInvalid:
      return pa.ipc.open_file(source)
  except (pa.ArrowException, OSError) as e:
    reason = " ".join(str(e).split())[:200]
    raise DataError(f"{path}: not a readable {kind} file ({reason}); none of it was used") from None


def _batches(reader: Any, kind: str) -> Iterator[Any]:
  if kind == PARQUET:
    yield from reader.iter_batches(batch_size=_BATCH_ROWS)
  elif hasattr(reader, "num_record_batches"):  # The Arrow file format.
    for i in range(reader.num_record_batches):
      yield reader.get_batch(i)
  else:
    yield from reader


def check(path: str) -> None:
  """Resolves `path` and opens each of its Parquet and Arrow files (footer, schema): a DataError
  (or FileNotFoundError) when any cannot be read at all."""
  for p, kind in files(path):
    if kind != JSON:
      _open(p, kind)


def read(path: str, parse: Callable[[dict[str, Any]], T]) -> tuple[list[T], list[str]]:
  """`parse(row)` of every good row of every file `path` names, and one problem per bad row."""
  found = files(path)
  readers = {p: _open(p, kind) for p, kind in found if kind != JSON}  # Unreadable: fail first.
  items: list[T] = []
  problems: list[str] = []
  for p, kind in found:
    if kind == JSON:
      got, bad = jsonl.read_any(p, parse)
      items += got
      problems += bad
      continue
    index = 0
    try:
      for batch in _batches(readers.pop(p), kind):
        rows = batch.to_pylist()
        del batch
        for row in rows:
          try:
            items.append(parse(row))
          except ValueError as e:
            problems.append(f"{p}: row {index + 1} (index {index}): {e}")
          index += 1
        del rows
    except (OSError, _pyarrow().ArrowException) as e:
      reason = " ".join(str(e).split())[:200]
      raise DataError(f"{p}: unreadable after row {index} ({reason}): the file looks truncated "
                      "or corrupt; none of the data was used") from None
  return items, problems
