"""Row files read leniently: every good row parsed, every bad row reported, not fatal.

Two layouts of the same rows: JSON Lines (one object a line; OpenAI's files) and one JSON array
of objects (Stanford Alpaca's and AlpacaFarm's `.json` files). `read_any` tells them apart by the
first non-whitespace byte: `[` is an array, anything else is JSON Lines.

A malformed row (not JSON, not an object, or refused by the row parser with a ValueError; in
JSON Lines also a line that is not UTF-8) becomes one problem and the rest of the file is kept:
`file:line: reason` in JSON Lines, `file: record N (index N-1): reason` in an array (N counts from
1, the index from 0, as in `rows[N-1]`). An array that is not valid UTF-8 JSON as a whole (say a
truncated download) cannot be split into rows, so it is a DataError naming the file, line and
column: nothing of it is kept, and nothing is lost unnoticed. So is a JSON Lines file whose last
line stops mid-record without a newline: a cut-off download or copy. `strict` turns the problems into one
DataError for callers that cannot go on without every row. `write` writes either layout atomically.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable, TypeVar

from rlhfjax import files
from rlhfjax.errors import DataError

T = TypeVar("T")


def _parse_row(row: Any, parse: Callable[[dict[str, Any]], T]) -> T:
  if not isinstance(row, dict):
    raise ValueError("not a JSON object")
  return parse(row)


def read(path: str, parse: Callable[[dict[str, Any]], T]) -> tuple[list[T], list[str]]:
  """`parse(row)` of every good line of a JSON Lines file; one `file:line: reason` per bad line."""
  items, problems = [], []
  with open(path, "rb") as f:
    for number, raw in enumerate(f, start=1):
      if not raw.strip():
        continue
      try:  # utf-8-sig: a byte-order mark some editors write is not part of the first record.
        row = json.loads(raw.decode("utf-8-sig" if number == 1 else "utf-8"))
      except (json.JSONDecodeError, UnicodeDecodeError) as e:
        if not raw.endswith(b"\n"):  # The last line, cut off: the file is incomplete.
          reason = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8"
          raise DataError(f"{path}:{number}: the last line ends mid-record ({reason}): the file "
                          "looks truncated; none of it was used") from None
        problems.append(f"{path}:{number}: {e}")
        continue
      try:
        items.append(_parse_row(row, parse))
      except ValueError as e:
        problems.append(f"{path}:{number}: {e}")
  return items, problems


_WHOLE_ARRAY = "the file starts with '[', so it is read as one JSON array; none of it was read"


def _array_rows(path: str, raw: bytes) -> list[Any]:
  """The elements of a file that is one JSON array; a DataError when it does not parse as one."""
  try:
    rows = json.loads(raw.decode("utf-8"))
  except UnicodeDecodeError as e:
    line = raw[:e.start].count(b"\n") + 1
    raise DataError(f"{path}:{line}: not UTF-8 ({_WHOLE_ARRAY})") from None
  except json.JSONDecodeError as e:
    where = f"{path}:{e.lineno}:{e.colno}"
    raise DataError(f"{where}: invalid JSON: {e.msg} ({_WHOLE_ARRAY})") from None
  if not isinstance(rows, list):
    raise DataError(f"{path}: expected one JSON array of objects, got {type(rows).__name__}")
  return rows


def read_array(path: str, parse: Callable[[dict[str, Any]], T]) -> tuple[list[T], list[str]]:
  """`parse(row)` of every good element of a one-JSON-array file, and one problem per bad element.

  A bad element is `file: record N (index N-1): reason`; an array that does not parse is a
  DataError naming the file, line and column."""
  with open(path, "rb") as f:
    rows = _array_rows(path, f.read())
  items, problems = [], []
  for index, row in enumerate(rows):
    try:
      items.append(_parse_row(row, parse))
    except ValueError as e:
      problems.append(f"{path}: record {index + 1} (index {index}): {e}")
  return items, problems


def _is_array(path: str) -> bool:
  """Whether the first non-whitespace byte of `path` is `[` (one JSON array, not JSON Lines); a
  DataError when the file is UTF-16 or UTF-32 text (a byte-order mark, or NUL bytes) or binary."""
  with open(path, "rb") as f:
    head = f.read(4096)
    if head.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in head:
      kind = "UTF-16 or UTF-32 text" if head.startswith((b"\xff\xfe", b"\xfe\xff")) or \
          head.count(b"\x00") * 4 >= len(head) else "binary data"
      raise DataError(f"{path}: not UTF-8 JSON: it holds {kind}; convert it to UTF-8 "
                      "(e.g. iconv -t UTF-8) or pass the right file")
    f.seek(0)
    while chunk := f.read(4096):
      if stripped := chunk.lstrip():
        return stripped.startswith(b"[")
  return False


def read_any(path: str, parse: Callable[[dict[str, Any]], T]) -> tuple[list[T], list[str]]:
  """`read_array` when `path` holds one JSON array, else `read` (JSON Lines)."""
  return (read_array if _is_array(path) else read)(path, parse)


def strict(items: list[T], problems: list[str]) -> list[T]:
  """`items` when there were no problems; else a DataError naming the first (and how many more)."""
  if problems:
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    raise DataError(problems[0] + more)
  return items


def write(path: str, rows: Iterable[dict[str, Any]], as_array: bool = False) -> None:
  """Writes `rows` as JSON Lines, or as one JSON array indented like AlpacaFarm's files.

  Atomic: a temporary file renamed into place, so a reader never sees half a file."""
  with files.atomic_open(path) as f:
    if as_array:
      json.dump(list(rows), f, ensure_ascii=False, indent=4)
      f.write("\n")
    else:
      f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
