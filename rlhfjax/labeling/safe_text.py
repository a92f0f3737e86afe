"""Untrusted text (model responses, labelers' comments and names, request paths) made harmless
where it is shown: on a page, bidirectional-text controls are replaced by a visible marker, so a
response reads as written (an RLO cannot reverse what follows it); in a log line, control
characters are escaped, so a path or a comment cannot start a forged line.
"""

from __future__ import annotations

import logging
import re
from typing import Any

# The bidi controls: embeddings and overrides (LRE RLE PDF LRO RLO), isolates (LRI RLI FSI PDI),
# the marks (LRM RLM) and the Arabic letter mark.
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
_BIDI = re.compile(f"[{BIDI}]")
# In a log line: C0 and C1 controls (CR, LF, NUL, ESC, ...), DEL, the Unicode line and paragraph
# separators, the bidi controls, and the backslash (so an escape in the log is never ambiguous).
_UNSAFE = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f\u2028\u2029{BIDI}\\\\]")
_SHORT = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def marker(char: str) -> str:
  """What a page shows for a bidi control: its code point, e.g. `[U+202E]`."""
  return f"[U+{ord(char):04X}]"


def visible(value: Any) -> Any:
  """A string with every bidi control replaced by its marker; anything else as it is. The
  templates' `finalize`: every value a page shows passes through it (a `Markup` stays markup:
  the marker holds nothing to escape)."""
  if isinstance(value, str) and _BIDI.search(value):
    return _BIDI.sub(lambda m: marker(m.group()), value)
  return value


def escape(text: str) -> str:
  """`text` for one log line: each control character (and the backslash) as a Python escape
  (`\\n`, `\\x00`, `\\u202e`), the rest as it is."""
  def one(m: re.Match) -> str:
    c = m.group()
    return _SHORT.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
  return _UNSAFE.sub(one, text)


class EscapeArgs(logging.Filter):
  """On a logger: escapes the arguments of each record (`escape`), which is where requests' paths
  and users' text go, so every handler (stderr, absl's, pytest's) gets one line per event. A
  message without arguments has its control characters escaped as a whole."""

  def filter(self, record: logging.LogRecord) -> bool:
    if record.args:
      if isinstance(record.args, dict):
        record.args = {k: _arg(v) for k, v in record.args.items()}
      else:
        record.args = tuple(_arg(a) for a in record.args)
    elif isinstance(record.msg, str):
      record.msg = _UNSAFE.sub(lambda m: m.group() if m.group() == "\\" else escape(m.group()),
                               record.msg)
    return True


def _arg(value: Any) -> Any:
  if isinstance(value, (int, float)) or value is None:  # bool is an int: %d, %.0f stay numbers.
    return value
  return escape(value if isinstance(value, str) else str(value))
