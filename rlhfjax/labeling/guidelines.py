"""The labeling guidelines: Markdown that the site shows at /guidelines, from the file named by
`labeling.guidelines` or, when that is '', the protocol's default shipped in `guidelines/`.

The file is the admin's, but it is rendered as if untrusted: raw HTML in it is escaped, never passed
through, and links to `javascript:` and other unsafe URLs are not made (markdown-it's
`validateLink`), so it can add nothing to a page that the Content-Security-Policy would have to
stop.
"""

from __future__ import annotations

import os

import markdown_it
import markupsafe

from rlhfjax.errors import ConfigError
from rlhfjax.labeling import protocols

DEFAULTS = os.path.join(os.path.dirname(__file__), "guidelines")

_MARKDOWN = markdown_it.MarkdownIt("commonmark", {"html": False}).enable("table")


def load(protocol: str, path: str = "") -> str:
  """The Markdown at `path`, or the default guidelines of `protocol` when `path` is ''."""
  if not path:
    return _read(os.path.join(DEFAULTS, f"{protocols.get(protocol).name}.md"))
  try:
    return _read(path)
  except OSError as e:
    raise ConfigError(f"labeling.guidelines: cannot read {path}: {e.strerror}") from e
  except UnicodeDecodeError as e:
    raise ConfigError(f"labeling.guidelines: {path} is not UTF-8 text") from e


def _read(path: str) -> str:
  with open(path, encoding="utf-8") as f:
    return f.read()


def render(markdown: str) -> markupsafe.Markup:
  """`markdown` as HTML that a template may insert unescaped."""
  return markupsafe.Markup(_MARKDOWN.render(markdown))
