"""Pushshift Reddit dumps: a streaming record reader and helpers for the Pushshift fields.

A dump is NDJSON, one submission (`RS_*`: `id`, `subreddit`, `title`, `selftext`, `created_utc`,
...) or comment (`RC_*`: `id`, `link_id`, `parent_id`, `body`, ...) a line, plain or compressed:
`.zst` (Pushshift's current format; it needs a 2 GiB window, `max_window_size=2**31`), `.bz2` or
`.xz` (older months). `iter_records` reads one line at a time and never holds the file in memory.

- Bytes that are not UTF-8 are decoded as U+FFFD, one per invalid sequence (as Python's
  `errors="replace"`); the record is kept and `ReadReport.replaced_bytes` counts the invalid bytes.
- A line that is not a JSON object is skipped and reported as `file:line: reason`; every other line
  is kept. Line numbers are those of the decompressed text.
- A compressed file that ends early or is corrupt raises `DataError` naming the file and how many
  lines were read (for `.zst`, also how many compressed bytes): the records before the damage were
  already yielded, a partial last line is not.
"""

from __future__ import annotations

import bz2
import collections
import dataclasses
import json
import logging
import lzma
import os
from typing import Iterator, Sequence

import zstandard

from rlhfjax.errors import DataError

MAX_LISTED_BAD_LINES = 1000  # A report lists this many bad lines and counts all of them.
_CHUNK = 1 << 20  # Compressed bytes read at a time.


@dataclasses.dataclass
class ReadReport:
  """What `iter_records` met in a file besides records; complete once the iterator is exhausted."""

  path: str
  lines: int = 0  # Lines read, blank ones included.
  records: int = 0  # JSON objects yielded.
  bad_count: int = 0  # Lines skipped because they are not a JSON object.
  bad_lines: list[str] = dataclasses.field(default_factory=list)  # The first, `file:line: reason`.
  replaced_bytes: int = 0  # Invalid UTF-8 bytes, decoded as U+FFFD.
  replaced_lines: int = 0  # Lines that held any of them.

  def add_bad(self, line: int, reason: str) -> str:
    message = f"{self.path}:{line}: {reason}"
    self.bad_count += 1
    if len(self.bad_lines) < MAX_LISTED_BAD_LINES:
      self.bad_lines.append(message)
    return message


def decode_utf8(raw: bytes) -> tuple[str, int]:
  """`raw` as text with each invalid UTF-8 sequence as U+FFFD, and the number of invalid bytes."""
  parts, bad, start = [], 0, 0
  while True:
    try:
      parts.append(raw[start:].decode("utf-8"))
      return "".join(parts), bad
    except UnicodeDecodeError as e:
      parts.append(raw[start:start + e.start].decode("utf-8"))
      parts.append("\ufffd")
      bad += e.end - e.start
      start += e.end


def _split_lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
  """Lines (without the newline) of a byte stream given in chunks; the last may lack a newline."""
  rest = b""
  for chunk in chunks:
    lines = (rest + chunk).split(b"\n")
    rest = lines.pop()
    yield from lines
  if rest:
    yield rest


def _zst_chunks(f, progress: list[int]) -> Iterator[bytes]:
  """Decompressed chunks of a zstd stream of one or more frames; raises if it ends mid-frame."""
  dctx = zstandard.ZstdDecompressor(max_window_size=2**31)
  dobj = dctx.decompressobj()
  while data := f.read(_CHUNK):
    progress[0] += len(data)
    while data:
      if dobj.eof:  # The previous frame ended inside this chunk: the rest is the next frame.
        dobj = dctx.decompressobj()
      try:
        out = dobj.decompress(data)
      except zstandard.ZstdError as e:
        raise DataError(f"corrupt zstd data: {e}") from e
      data = dobj.unused_data if dobj.eof else b""
      if out:
        yield out
  if not dobj.eof:
    raise DataError("the zstd stream ends before its frame does")


COMPRESSIONS = (".zst", ".bz2", ".xz")


def check_distinct(paths: Sequence[str]) -> None:
  """A ValueError when two dump files are one dump (`RS_2019-07` and `RS_2019-07.zst`, say, as a
  folder holds after decompressing): every record would be mined twice."""
  stems = collections.defaultdict(list)
  for p in paths:
    name = os.path.basename(p)
    stem, ext = os.path.splitext(name)
    stems[stem if ext.lower() in COMPRESSIONS else name].append(name)
  twice = sorted(", ".join(sorted(names)) for names in stems.values() if len(names) > 1)
  if twice:
    raise ValueError(f"the same dump more than once ({'; '.join(twice)}): keep one of each, or "
                     "its records are mined twice")


def _raw_lines(path: str, report: ReadReport) -> Iterator[bytes]:
  """The file's lines as bytes; a compressed file that ends early or is corrupt is a `DataError`."""
  ext = os.path.splitext(path)[1].lower()
  if ext not in COMPRESSIONS:
    with open(path, "rb") as f:
      for raw in f:
        yield raw.rstrip(b"\n")
    return
  progress = [0]
  opener = {".zst": open, ".bz2": bz2.open, ".xz": lzma.open}[ext]
  with opener(path, "rb") as f:
    try:
      if ext == ".zst":
        yield from _split_lines(_zst_chunks(f, progress))
      else:
        for raw in f:
          if not raw.endswith(b"\n"):
            f.read(1)  # Raises if the stream ended early; after a complete one it returns b"".
          yield raw.rstrip(b"\n")
    except (DataError, EOFError, OSError, lzma.LZMAError) as e:
      where = f"after {progress[0]} of {os.path.getsize(path)} compressed bytes, " * (ext == ".zst")
      raise DataError(f"{path}: truncated or corrupt {ext[1:]} file ({where}{report.lines} "
                      f"complete lines read; the records before them were yielded): {e}") from e


def _parse(raw: bytes) -> tuple[object, int]:
  """The JSON value of a line, and how many invalid UTF-8 bytes were replaced to read it."""
  try:
    return json.loads(raw), 0
  except UnicodeDecodeError:
    text, bad = decode_utf8(raw)
    return json.loads(text), bad


def iter_records(path: str, report: ReadReport | None = None) -> Iterator[dict]:
  """Streams the JSON objects of a Pushshift dump, plain or `.zst` / `.bz2` / `.xz`.

  Bad lines and replaced bytes are recorded in `report` when one is given (read it once the iterator
  is exhausted) and logged as warnings otherwise, so that none goes unnoticed.
  """
  log = report is None
  if report is None:
    report = ReadReport(path)
  for raw in _raw_lines(path, report):
    report.lines += 1
    if not raw.strip():
      continue
    try:
      row, bad = _parse(raw)
      if not isinstance(row, dict):
        raise ValueError(f"not a JSON object ({type(row).__name__})")
    except ValueError as e:
      message = report.add_bad(report.lines, str(e))
      if log:
        logging.warning("%s", message)
      continue
    if bad:
      report.replaced_bytes += bad
      report.replaced_lines += 1
      if log:
        logging.warning("%s:%d: %d invalid UTF-8 bytes replaced", path, report.lines, bad)
    report.records += 1
    yield row


def is_deleted(text: str | None) -> bool:
  """True for a missing, empty, "[deleted]" or "[removed]" body or selftext."""
  return not isinstance(text, str) or text.strip() in ("", "[deleted]", "[removed]")


def is_comment(record: dict) -> bool:
  """Comments have a `body`; submissions have a `selftext` (empty for link posts) instead."""
  return "body" in record


def text_of(record: dict) -> str | None:
  """The author's text: a comment's `body` or a submission's `selftext`."""
  return record.get("body") if is_comment(record) else record.get("selftext")


def is_top_level(comment: dict) -> bool:
  """A comment that replies to the submission itself (its parent is a `t3_` fullname)."""
  return str(comment.get("parent_id") or "").startswith("t3_")


def submission_id(comment: dict) -> str:
  """The id of the submission a comment belongs to: its `link_id` without the `t3_` prefix."""
  return str(comment.get("link_id") or "").removeprefix("t3_")
