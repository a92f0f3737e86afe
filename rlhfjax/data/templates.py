"""Chat templates (Jinja) rendered as transformers renders them.

A template comes with a checkpoint, so it is untrusted code: it runs in Jinja's immutable sandbox,
with the environment transformers gives templates (`trim_blocks`, `lstrip_blocks`, loop controls,
`raise_exception`, a `tojson` that does not escape HTML, `strftime_now`). Each template is compiled
once per process: encoding a dataset renders it once per example, and compiling is most of the
cost of a render (a tenth of a tiny pipeline's time when it compiled per prompt).
"""

from __future__ import annotations

import datetime
import functools
import json
from typing import Any

from rlhfjax.errors import ConfigError


def _jinja2():
  try:
    import jinja2  # pylint: disable=g-import-not-at-top
    import jinja2.sandbox  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ConfigError("chat templates need `jinja2`: pip install jinja2") from e
  return jinja2


@functools.lru_cache(maxsize=16)
def _compiled(template: str) -> Any:
  jinja2 = _jinja2()

  def raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)

  def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
             separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)

  env = jinja2.sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
  return env.from_string(template)


def render(template: str, messages: list[dict[str, str]], add_generation_prompt: bool,
           **variables: Any) -> str:
  """`template` applied to `messages`; `variables` are the names it may read besides them
  (`bos_token`, `eos_token`, `enable_thinking`). A template that fails raises ConfigError."""
  jinja2 = _jinja2()
  try:
    return _compiled(template).render(messages=messages,
                                      add_generation_prompt=add_generation_prompt, **variables)
  except jinja2.TemplateError as e:
    raise ConfigError(f"the chat template failed on {len(messages)} messages: {e}") from e
