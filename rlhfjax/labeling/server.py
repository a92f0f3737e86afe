"""The labeling web app: Starlette routes over a `store.Store`, rendered with Jinja2 (the routes by
concern in `routes/`, what they share in `site.py`).

Security, on purpose:
- a labeler signs in by spending a one-time token (`task=label_user`, or an admin's invitation,
  gives a link that holds it after `#`, which browsers never send to a server or its logs); the
  session is a random id in an HttpOnly, SameSite=Strict cookie (Secure behind https), stored
  hashed;
- every state-changing request carries the session's CSRF token (a form field or the
  `X-CSRF-Token` header) and, when the browser sends one, a same-origin `Origin`; the sign-in form
  carries a token matching a cookie of its own, so no other site can sign a browser in;
- a labeler reads and writes only their own assignments (anything else is a 404, which does not
  say whether it exists); only admins see the admin pages, and only they see other labelers'
  answers (the review pages: disagreements, labels);
- templates escape everything (model text is untrusted) and show each bidi control character as
  a visible marker (`safe_text.visible`), so text reads as written; the Content-Security-Policy
  allows scripts and styles from this server only, so injected markup cannot run;
- failed sign-ins are limited per client address (`labeling.login_attempts_per_minute`), in
  memory, so a flood of them costs no database write; past the limit a failed attempt gets 429
  with `Retry-After`, while a valid link still signs in (another labeler behind the same address
  is not locked out: tokens are 192-bit random, so the limit slows a script, guessing is hopeless
  anyway).
A label is acknowledged (HTTP 200) only after its transaction is committed. Every request is logged
(`rlhfjax.labeling`: address, method, path without its query, status, milliseconds, labeler), and so
are sign-ins, flags (with their comment), refusals and errors, one line each: control characters in
paths and users' text are escaped (`safe_text.EscapeArgs`); tokens never reach a log.
"""

from __future__ import annotations

import os
import time
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from rlhfjax.labeling import protocols
from rlhfjax.labeling import store as store_lib
from rlhfjax.labeling.routes import admin
from rlhfjax.labeling.routes import exports
from rlhfjax.labeling.routes import labeling
from rlhfjax.labeling.routes import signin
from rlhfjax.labeling.site import COOKIE
from rlhfjax.labeling.site import ExportRules
from rlhfjax.labeling.site import HERE
from rlhfjax.labeling.site import log
from rlhfjax.labeling.site import Site

HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; "
                               "base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # Not no-referrer: with it, Chromium sends `Origin: null` on form posts. The sign-in token
    # follows '#', which no Referer carries.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
class SecurityHeaders:
  """Adds `HEADERS` to every response."""

  def __init__(self, app: Any):
    self.app = app

  async def __call__(self, scope, receive, send):
    async def with_headers(message):
      if message["type"] == "http.response.start":
        message.setdefault("headers", [])
        message["headers"] += [(k.lower().encode(), v.encode()) for k, v in HEADERS.items()]
      await send(message)
    await self.app(scope, receive, with_headers)


class AccessLog:
  """Logs each HTTP request once it is answered: client address, method, path (never the query
  string; a sign-in token is never in either), status, milliseconds and the labeler, if any."""

  def __init__(self, app: Any):
    self.app = app

  async def __call__(self, scope, receive, send):
    if scope["type"] != "http":
      return await self.app(scope, receive, send)
    start, status = time.perf_counter(), [500]

    async def record(message):
      if message["type"] == "http.response.start":
        status[0] = message["status"]
      await send(message)
    try:
      await self.app(scope, receive, record)
    finally:
      client = scope.get("client") or ("-", 0)
      who = scope.get("state", {}).get("who", "-")
      log.info("%s %s %s %d %.0fms %s", client[0], scope["method"], scope["path"], status[0],
               1000 * (time.perf_counter() - start), who)


def create_app(store: store_lib.Store, protocol: protocols.Protocol, *,
               session_s: float = 12 * 3600, login_per_minute: int = 10,
               public_url: str = "", guidelines: str = "", token_s: float = 72 * 3600,
               export_rules: ExportRules = ExportRules(), goal: int = 0,
               cookie: str = COOKIE) -> Starlette:
  """The app for one labeling database. `public_url` is its address behind a proxy (its origin is
  also accepted, an https one makes the cookie Secure, and invitation links use it);
  `guidelines` is the Markdown of the guidelines page ('' : the protocol's own); `token_s` is how
  long an invitation link works; `goal` the labels each labeler is asked for (0: none; the header
  shows each labeler's share of all labels either way); `cookie` names the session cookie
  (`site.cookie_names`)."""
  site = Site(store, protocol, session_s=session_s, login_per_minute=login_per_minute,
              public_url=public_url, guidelines=guidelines, token_s=token_s,
              export_rules=export_rules, goal=goal, cookie=cookie)

  async def error(request: Request, exc: HTTPException) -> Response:
    if exc.status_code == 303:
      return RedirectResponse(exc.headers["Location"], 303)
    if exc.status_code >= 400:
      log.warning("refused: %s %s %d %s", request.method, request.scope["path"], exc.status_code,
                  exc.detail)  # The path as received (request.url's drops CR and LF).
    if request.url.path.startswith("/label/") and request.method == "POST" and \
        request.url.path.count("/") == 2:
      return JSONResponse({"error": exc.detail}, exc.status_code)
    return site.page("error.html", exc.status_code, message=exc.detail)

  routes = [*signin.routes(site), *labeling.routes(site), *admin.routes(site),
            *exports.routes(site),
            Mount("/static", StaticFiles(directory=os.path.join(HERE, "static")), name="static")]
  return Starlette(routes=routes, middleware=[Middleware(AccessLog), Middleware(SecurityHeaders)],
                   exception_handlers={HTTPException: error})
