"""What every route of the labeling site shares: the `Site` (its store, protocol, settings and
templates) and the checks a handler starts with — who is signed in, whether they are an admin,
whether a state-changing request carries the session's CSRF token from this site's origin."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import functools
import logging
import math
import os
import secrets
import sqlite3
import threading
import time
from typing import Any, Awaitable, Callable
import urllib.parse

import jinja2
import markupsafe
from starlette.concurrency import run_in_threadpool as in_thread  # SQLite blocks.
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from rlhfjax.labeling import guidelines as guidelines_lib
from rlhfjax.labeling import protocols
from rlhfjax.labeling import safe_text
from rlhfjax.labeling import store as store_lib

log = logging.getLogger("rlhfjax.labeling")
log.addFilter(safe_text.EscapeArgs())  # Paths and users' text: one line each, escaped.

COOKIE = "rlhfjax_session"  # The session cookie's default name (task=label_server: per port).
LOGIN_COOKIE = "rlhfjax_login"  # The sign-in form's own CSRF token (double submit).
HERE = os.path.dirname(__file__)
LAYOUTS = {"openai": ".jsonl", "alpaca": ".json"}  # Export layouts of pairs; one response: binary.
SINGLE_LAYOUTS = {"binary": ".jsonl"}


@dataclasses.dataclass(frozen=True)
class ExportRules:
  """What the download buttons write: `label_export`'s files under the same rules."""

  layout: str = "openai"
  min_gold_agreement: float = 0.0
  min_gold_labels: int = 1


class LoginLimiter:
  """At most `per_minute` failed sign-ins per client address in any 60 s."""

  def __init__(self, per_minute: int):
    self.per_minute = per_minute
    self._failed: dict[str, collections.deque] = collections.defaultdict(collections.deque)
    self._lock = threading.Lock()

  def wait(self, ip: str) -> int:
    """Seconds until `ip` may fail again (0: now)."""
    now = time.monotonic()
    with self._lock:
      failed = self._failed[ip]
      while failed and failed[0] < now - 60:
        failed.popleft()
      if len(failed) < self.per_minute:
        return 0
      return max(1, math.ceil(failed[0] + 60 - now))

  def failed(self, ip: str) -> None:
    with self._lock:
      self._failed[ip].append(time.monotonic())


def cookie_names(name: str = COOKIE) -> tuple[str, str]:
  """The session cookie's and the sign-in form's cookie's names for a site whose session cookie is
  `name`. Cookies ignore the port: two sites on one host need names of their own, or signing in to
  one replaces the other's session."""
  return (COOKIE, LOGIN_COOKIE) if name == COOKIE else (name, f"{name}_login")


def when(t: float | None) -> markupsafe.Markup | str:
  """A time in UTC, marked up for the page's script to add the reader's local time beside it."""
  if not t:
    return "—"
  moment = datetime.datetime.fromtimestamp(t, datetime.timezone.utc)
  return markupsafe.Markup('<time datetime="{}">{}</time>').format(
      moment.isoformat(timespec="seconds"), moment.strftime("%Y-%m-%d %H:%M UTC"))


class Site:
  """One labeling database served: its store and protocol, the settings of `server.create_app`,
  and the helpers every route module uses."""

  def __init__(self, store: store_lib.Store, protocol: protocols.Protocol, *, session_s: float,
               login_per_minute: int, public_url: str, guidelines: str, token_s: float,
               export_rules: ExportRules, goal: int, cookie: str):
    self.store, self.protocol = store, protocol
    self.session_s, self.token_s, self.goal = session_s, token_s, goal
    self.public_url, self.export_rules = public_url, export_rules
    self.session_cookie, self.login_cookie = cookie_names(cookie)
    parts = urllib.parse.urlsplit(public_url)
    self.public_origin = f"{parts.scheme}://{parts.netloc}" if parts.netloc else ""
    self.secure_cookie = parts.scheme == "https"
    self.limiter = LoginLimiter(login_per_minute)
    self.env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(HERE, "templates")),
                                  autoescape=True, undefined=jinja2.StrictUndefined,
                                  finalize=safe_text.visible)  # Bidi controls shown, not obeyed.
    self.env.filters["when"] = when
    self.guidelines_html = guidelines_lib.render(guidelines or guidelines_lib.load(protocol.name))
    self.options = {field: dict(q.options) for field, q in protocol.questions()}
    self.single = protocol.single
    self.layouts = SINGLE_LAYOUTS if self.single else LAYOUTS

  def page(self, name: str, status: int = 200, **context: Any) -> HTMLResponse:
    return HTMLResponse(self.env.get_template(name).render(protocol=self.protocol, **context),
                        status)

  async def labeler(self, request: Request) -> sqlite3.Row | None:
    """The signed-in labeler of `request`, or None (also noted for the access log)."""
    session = request.cookies.get(self.session_cookie)
    who = await in_thread(self.store.session, session) if session else None
    if who is not None:
      request.state.who = who["name"]
    return who

  async def ended_by_admin(self, request: Request) -> bool:
    """Whether the request's session was ended by an admin revoking its labeler."""
    session = request.cookies.get(self.session_cookie)
    return bool(session) and await in_thread(self.store.ended, session) == "revoked"

  async def signed_in(self, request: Request) -> sqlite3.Row:
    """The labeler, or a redirect to the sign-in form (raised)."""
    who = await self.labeler(request)
    if who is None:
      raise HTTPException(303, headers={"Location": "/login"})
    return who

  async def admin_only(self, request: Request) -> sqlite3.Row:
    who = await self.signed_in(request)
    if not who["is_admin"]:
      raise HTTPException(403, "admins only")
    return who

  def check_origin(self, request: Request) -> None:
    origin = request.headers.get("origin")
    if origin and origin not in (f"{request.url.scheme}://{request.url.netloc}",
                                 self.public_origin):
      raise HTTPException(403, "cross-origin request")

  def check_csrf(self, request: Request, who: sqlite3.Row, form_token: Any) -> None:
    token = request.headers.get("x-csrf-token") or (form_token if isinstance(form_token, str)
                                                    else "")
    if not secrets.compare_digest(token.encode(), who["csrf"].encode()):
      raise HTTPException(403, "missing or wrong CSRF token")
    self.check_origin(request)

  async def form_of(self, request: Request, who: sqlite3.Row) -> dict[str, str]:
    """A state-changing form, its CSRF token and origin checked."""
    form = await request.form()
    self.check_csrf(request, who, form.get("csrf"))
    return {k: v for k, v in form.items() if isinstance(v, str)}

  def route(self, path: str, handler: Callable[..., Awaitable[Response]],
            methods: list[str] | None = None) -> Route:
    """`path` answered by `handler(site, request)`."""
    return Route(path, functools.partial(handler, self), methods=methods)
