"""The labeling web app: Starlette routes over a `store.Store`, rendered with Jinja2.

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

import collections
import dataclasses
import datetime
import json
import logging
import math
import os
import secrets
import sqlite3
import tempfile
import threading
import time
from typing import Any
import urllib.parse

import jinja2
import markupsafe
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool as in_thread  # SQLite blocks.
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from rlhfjax.labeling import comparisons
from rlhfjax.labeling import diff
from rlhfjax.labeling import guidelines as guidelines_lib
from rlhfjax.labeling import protocols
from rlhfjax.labeling import report
from rlhfjax.labeling import safe_text
from rlhfjax.labeling import store as store_lib

log = logging.getLogger("rlhfjax.labeling")
log.addFilter(safe_text.EscapeArgs())  # Paths and users' text: one line each, escaped.

COOKIE = "rlhfjax_session"  # The session cookie's default name (task=label_server: per port).
LOGIN_COOKIE = "rlhfjax_login"  # The sign-in form's own CSRF token (double submit).
HERE = os.path.dirname(__file__)
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
MAX_COMMENT = 2000  # Characters of a flag's comment.
LOG_COMMENT = 200  # Characters of a flag's comment in the log.
LAYOUTS = {"openai": ".jsonl", "alpaca": ".json"}  # Export layouts of pairs; one response: binary.
SINGLE_LAYOUTS = {"binary": ".jsonl"}
REVIEW_STATUSES = ("all", "disagreement", "flagged", "accepted")  # Filters of /admin/labels.


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


# What the page says after an action (`/?did=...`), in the status bar of the next page.
NOTICES = {"saved": "Saved.", "revised": "Changed: your new answer replaces the earlier one.",
           "skipped": "Skipped: this pair will not come back to you.",
           "flagged": "Flag sent: an admin will read it; the pair is held until then."}


def _when(t: float | None) -> markupsafe.Markup | str:
  """A time in UTC, marked up for the page's script to add the reader's local time beside it."""
  if not t:
    return "—"
  moment = datetime.datetime.fromtimestamp(t, datetime.timezone.utc)
  return markupsafe.Markup('<time datetime="{}">{}</time>').format(
      moment.isoformat(timespec="seconds"), moment.strftime("%Y-%m-%d %H:%M UTC"))


def _first_words(text: str, n: int = 12) -> str:
  words = text.split()
  return " ".join(words[:n]) + (" …" if len(words) > n else "")


def cookie_names(name: str = COOKIE) -> tuple[str, str]:
  """The session cookie's and the sign-in form's cookie's names for a site whose session cookie is
  `name`. Cookies ignore the port: two sites on one host need names of their own, or signing in to
  one replaces the other's session."""
  return (COOKIE, LOGIN_COOKIE) if name == COOKIE else (name, f"{name}_login")


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
  (`cookie_names`)."""
  session_cookie, login_cookie = cookie_names(cookie)
  parts = urllib.parse.urlsplit(public_url)
  public_origin = f"{parts.scheme}://{parts.netloc}" if parts.netloc else ""
  secure_cookie = parts.scheme == "https"
  limiter = LoginLimiter(login_per_minute)
  env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(HERE, "templates")),
                           autoescape=True, undefined=jinja2.StrictUndefined,
                           finalize=safe_text.visible)  # Bidi controls shown, not obeyed.
  env.filters["when"] = _when
  guidelines_html = guidelines_lib.render(guidelines or guidelines_lib.load(protocol.name))
  options = {field: dict(q.options) for field, q in protocol.questions()}
  single = protocol.single
  layouts = SINGLE_LAYOUTS if single else LAYOUTS

  def page(name: str, status: int = 200, **context: Any) -> HTMLResponse:
    return HTMLResponse(env.get_template(name).render(protocol=protocol, **context), status)

  def client_ip(request: Request) -> str:
    return request.client.host if request.client else "?"

  async def labeler(request: Request) -> sqlite3.Row | None:
    session = request.cookies.get(session_cookie)
    who = await in_thread(store.session, session) if session else None
    if who is not None:
      request.state.who = who["name"]
    return who

  async def ended_by_admin(request: Request) -> bool:
    """Whether the request's session was ended by an admin revoking its labeler."""
    session = request.cookies.get(session_cookie)
    return bool(session) and await in_thread(store.ended, session) == "revoked"

  async def signed_in(request: Request) -> sqlite3.Row:
    """The labeler, or a redirect to the sign-in form (raised)."""
    who = await labeler(request)
    if who is None:
      raise HTTPException(303, headers={"Location": "/login"})
    return who

  async def admin_only(request: Request) -> sqlite3.Row:
    who = await signed_in(request)
    if not who["is_admin"]:
      raise HTTPException(403, "admins only")
    return who

  def check_origin(request: Request) -> None:
    origin = request.headers.get("origin")
    if origin and origin not in (f"{request.url.scheme}://{request.url.netloc}", public_origin):
      raise HTTPException(403, "cross-origin request")

  def check_csrf(request: Request, who: sqlite3.Row, form_token: Any) -> None:
    token = request.headers.get("x-csrf-token") or (form_token if isinstance(form_token, str)
                                                    else "")
    if not secrets.compare_digest(token.encode(), who["csrf"].encode()):
      raise HTTPException(403, "missing or wrong CSRF token")
    check_origin(request)

  async def form_of(request: Request, who: sqlite3.Row) -> dict[str, str]:
    """A state-changing form, its CSRF token and origin checked."""
    form = await request.form()
    check_csrf(request, who, form.get("csrf"))
    return {k: v for k, v in form.items() if isinstance(v, str)}

  def login_form(status: int = 200, error: str = "", revoked: bool = False) -> HTMLResponse:
    csrf = secrets.token_urlsafe(16)
    response = page("login.html", status, csrf=csrf, error=error, revoked=revoked)
    response.set_cookie(login_cookie, csrf, max_age=3600, httponly=True, samesite="strict",
                        secure=secure_cookie, path="/login")
    return response

  async def login_page(request: Request) -> Response:
    return login_form(revoked=await ended_by_admin(request))

  async def login(request: Request) -> Response:
    ip = client_ip(request)
    check_origin(request)
    form = await request.form()
    expected = request.cookies.get(login_cookie, "")
    if not expected or not secrets.compare_digest(str(form.get("csrf", "")).encode(),
                                                  expected.encode()):
      log.warning("sign-in refused from %s: the form expired or came from elsewhere", ip)
      return login_form(403, "The sign-in form expired: sign in again.")
    token = str(form.get("token", ""))
    wait = limiter.wait(ip)
    if wait and not await in_thread(store.token_valid, token):
      log.warning("sign-in refused from %s: too many failed sign-ins (retry in %d s)", ip, wait)
      response = login_form(429, f"Too many failed sign-ins from your address: try again in "
                                 f"{wait} s.")
      response.headers["Retry-After"] = str(wait)
      return response
    session = await in_thread(store.login, token, session_s)
    if session is None:
      limiter.failed(ip)
      log.warning("sign-in failed from %s: an invalid, spent or expired link", ip)
      return login_form(401, "This sign-in link is not valid (each link works once; ask for a "
                             "new one).")
    log.info("sign-in: %s from %s", session[2], ip)
    response = RedirectResponse("/", 303)
    response.delete_cookie(login_cookie, path="/login")
    response.set_cookie(session_cookie, session[0], max_age=int(session_s), httponly=True,
                        samesite="strict", secure=secure_cookie)
    return response

  async def logout(request: Request) -> Response:
    who = await labeler(request)
    if who is not None:
      await form_of(request, who)
      await in_thread(store.logout, request.cookies[session_cookie])
      log.info("sign-out: %s", who["name"])
    response = RedirectResponse("/login", 303)
    response.delete_cookie(session_cookie)
    return response

  def sides(row: sqlite3.Row) -> tuple[str, str]:
    return ((row["response_b"], row["response_a"]) if row["swapped"]
            else (row["response_a"], row["response_b"]))

  async def label_page(who: sqlite3.Row, row: sqlite3.Row, status: int = 200,
                       notice: str = "") -> HTMLResponse:
    if single:  # One response: nothing to compare, nothing marked.
      marked_left, marked_right = [(row["response_a"], False)], []
    else:
      marked_left, marked_right = diff.words(*sides(row))
    chosen = json.loads(row["shown"]) if row["shown"] else {}
    return page("label.html", status, who=who, row=row, left=marked_left, right=marked_right,
                chosen=chosen, progress=await in_thread(store.my_progress, who["id"]),
                csrf=who["csrf"], last=await in_thread(store.last_label, who["id"]),
                max_comment=MAX_COMMENT, notice=notice, goal=goal)

  async def home(request: Request) -> Response:
    who = await signed_in(request)
    try:
      row = await in_thread(store.next_assignment, who["id"])
    except store_lib.Refused:  # An admin who has not chosen to label: the admin page.
      return RedirectResponse("/admin", 303)
    notice = NOTICES.get(request.query_params.get("did", ""), "")
    if row is None:
      return page("finished.html", who=who, csrf=who["csrf"], notice=notice, goal=goal,
                  progress=await in_thread(store.my_progress, who["id"]))
    return await label_page(who, row, notice=notice)

  async def own(who: sqlite3.Row, assignment_id: int) -> sqlite3.Row:
    try:
      return await in_thread(store.assignment, who["id"], assignment_id)
    except store_lib.NotFound:
      raise HTTPException(404, "no such assignment") from None

  async def edit(request: Request) -> Response:
    who = await signed_in(request)
    return await label_page(who, await own(who, request.path_params["assignment"]))

  async def submit(request: Request) -> Response:
    who = await labeler(request)
    if who is None:
      if await ended_by_admin(request):
        return JSONResponse({"error": "an admin signed you out", "reason": "revoked"}, 401)
      return JSONResponse({"error": "not signed in"}, 401)
    as_json = request.headers.get("content-type", "").startswith("application/json")
    try:
      body = await request.json() if as_json else dict(await request.form())
    except ValueError:
      return JSONResponse({"error": "body is not JSON"}, 400)
    if not isinstance(body, dict):
      return JSONResponse({"error": "body must be an object"}, 400)
    check_csrf(request, who, body.get("csrf"))
    row = await own(who, request.path_params["assignment"])
    answers = body.get("answers") if as_json else {
        k: v for k, v in body.items() if k not in ("csrf", "submission", "seconds", "pair",
                                                   "swapped")}
    try:  # What the labeler saw: the pair and its order, which the store checks.
      item_id, swapped = int(body["pair"]), {"0": False, "1": True}[str(int(body["swapped"]))]
    except (KeyError, TypeError, ValueError):
      return JSONResponse({"error": "the answer does not say which pair and order it was given "
                                    "on (pair, swapped): reload the page and answer again"}, 400)
    if not isinstance(answers, dict) or not all(isinstance(v, str) for v in answers.values()):
      return JSONResponse({"error": "answers must map questions to option values"}, 400)
    submission = str(body.get("submission") or secrets.token_hex(8))[:64]
    try:
      seconds = float(body["seconds"]) if body.get("seconds") not in (None, "") else None
      if seconds is not None and not math.isfinite(seconds):
        raise ValueError
    except (TypeError, ValueError):
      return JSONResponse({"error": "seconds must be a number"}, 400)
    try:
      label = protocols.canonical(protocol, answers, bool(row["swapped"]))
    except protocols.InvalidAnswer as e:
      return JSONResponse({"error": str(e)}, 400)
    stored = {"axes_a": label.axes_a, "axes_b": label.axes_b, "extra": label.extra}
    try:
      status = await in_thread(store.submit, who["id"], row["assignment_id"], label.preference,
                               stored, answers, submission, seconds, item_id=item_id,
                               swapped=swapped)
    except store_lib.Mismatch as e:
      log.warning("label refused: %s sent assignment %d an answer for another pair (%s)",
                  who["name"], row["assignment_id"], e)
      return JSONResponse({"error": str(e)}, 409)
    if not as_json:
      return RedirectResponse("/?did=saved", 303)
    return JSONResponse({"status": status, "assignment": row["assignment_id"],
                         "progress": await in_thread(store.my_progress, who["id"])})

  async def skip(request: Request) -> Response:
    who = await signed_in(request)
    await form_of(request, who)
    try:
      await in_thread(store.skip, who["id"], request.path_params["assignment"])
    except store_lib.NotFound:
      raise HTTPException(404, "no open assignment to skip") from None
    return RedirectResponse("/?did=skipped", 303)

  async def flag(request: Request) -> Response:
    who = await signed_in(request)
    comment = (await form_of(request, who)).get("comment", "").strip()
    if not comment:
      raise HTTPException(400, "say what is wrong with the pair (the comment is empty)")
    try:
      await in_thread(store.flag, who["id"], request.path_params["assignment"],
                      comment[:MAX_COMMENT])
    except store_lib.NotFound:
      raise HTTPException(404, "no such assignment") from None
    log.info("flag: %s flagged assignment %d: %s", who["name"], request.path_params["assignment"],
             comment[:LOG_COMMENT] + ("…" if len(comment) > LOG_COMMENT else ""))
    return RedirectResponse("/?did=flagged", 303)

  async def mine(request: Request) -> Response:
    who = await signed_in(request)
    first = protocol.pair[0].name
    rows = []
    for r in await in_thread(store.my_labels, who["id"]):
      shown = json.loads(r["shown"])
      rows.append({"assignment_id": r["assignment_id"], "updated": r["updated"],
                   "title": r["title"], "post": _first_words(r["prompt"]),
                   "answer": options[first].get(shown.get(first), shown.get(first))})
    return page("mine.html", who=who, rows=rows, csrf=who["csrf"], goal=goal,
                progress=await in_thread(store.my_progress, who["id"]))

  async def guidelines(request: Request) -> Response:
    who = await signed_in(request)
    return page("guidelines.html", who=who, csrf=who["csrf"], body=guidelines_html)

  async def admin(request: Request) -> Response:
    who = await admin_only(request)
    js = report.judgements(await in_thread(store.labels), single)
    names, mean, se, count = report.table(js)
    return page("admin.html", who=who, csrf=who["csrf"],
                progress=await in_thread(store.progress), k=store.settings.k,
                throughput=report.throughput(js), labelers=report.labelers(js), names=names,
                mean=mean, se=se, count=count, isnan=math.isnan, layouts=layouts,
                shares=report.SHARES[single], flags=len(await in_thread(store.flags)),
                reviewed=reviewed(await in_thread(store.reviews)), **await staffing(who))

  def invitation(request: Request, token: str) -> str:
    base = public_url or f"{request.url.scheme}://{request.url.netloc}"
    return f"{base.rstrip('/')}/login#token={token}"

  async def team(request: Request, status: int = 200, link: str = "", invited: str = "",
                 error: str = "") -> Response:
    who = await admin_only(request)
    return page("labelers.html", status, who=who, csrf=who["csrf"],
                labelers=await in_thread(store.labelers), link=link, invited=invited,
                error=error, token_hours=token_s / 3600, k=store.settings.k,
                **await staffing(who))

  async def invite(request: Request) -> Response:
    who = await admin_only(request)
    form = await form_of(request, who)
    name = form.get("name", "").strip()
    if not store_lib.NAME.fullmatch(name):
      return await team(request, 400, error=store_lib.NAME_RULE)
    token = await in_thread(store.add_labeler, name, form.get("admin") == "on", token_s)
    await in_thread(store.set_also_labels, name, form.get("also_labels") == "on")
    log.info("invitation: %s invited %s%s", who["name"], name,
             " (admin)" if form.get("admin") == "on" else "")
    return await team(request, link=invitation(request, token), invited=name)

  async def revoke(request: Request) -> Response:
    who = await admin_only(request)
    await form_of(request, who)
    name = request.path_params["name"]
    try:
      await in_thread(store.revoke, name, who["id"])
    except store_lib.Refused as e:
      return await team(request, 400, error=str(e))
    log.info("revocation: %s revoked %s", who["name"], name)
    return RedirectResponse("/admin/labelers", 303)

  async def flags(request: Request) -> Response:
    who = await admin_only(request)
    return page("flags.html", who=who, csrf=who["csrf"], flags=await in_thread(store.flags))

  async def resolve(request: Request) -> Response:
    who = await admin_only(request)
    action = (await form_of(request, who)).get("action", "")
    try:
      await in_thread(store.resolve, request.path_params["item"], action)
    except store_lib.Refused as e:
      raise HTTPException(400, str(e)) from None
    log.info("flag resolved: %s chose %s for pair %d", who["name"], action,
             request.path_params["item"])
    return RedirectResponse("/admin/flags", 303)

  async def disagreements(request: Request) -> Response:
    who = await admin_only(request)
    found = report.disagreements(await in_thread(store.labels), single)
    reviews = await in_thread(store.reviews)
    hide = request.query_params.get("hide") == "accepted"
    if hide:
      found = [d for d in found if not accepted(reviews, d["pair"]["item_id"])]
    for d in found:
      d["a"], d["b"] = ([(d["pair"]["response_a"], False)], []) if single else diff.words(
          d["pair"]["response_a"], d["pair"]["response_b"])
    return page("disagreements.html", who=who, csrf=who["csrf"], found=found, reviews=reviews,
                hide=hide, k=store.settings.k,
                back="/admin/disagreements" + ("?hide=accepted" if hide else ""))

  def export_file(layout: str, split: str) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
      out = comparisons.export(store.labels(), tmp, layout, protocol.name,
                               export_rules.min_gold_agreement, export_rules.min_gold_labels)
      with open(out[split], "rb") as f:
        return f.read()

  async def download(request: Request) -> Response:
    who = await admin_only(request)
    layout, split = request.path_params["layout"], request.path_params["split"]
    if layout not in layouts or split not in ("train", "valid", "agreement"):
      raise HTTPException(404, "no such export")
    body = await in_thread(export_file, layout, split)
    name = "agreement.md" if split == "agreement" else f"{split}{layouts[layout]}"
    log.info("download: %s took %s (%s)", who["name"], name, layout)
    kind = "text/markdown" if split == "agreement" else "application/json"
    return Response(body, media_type=f"{kind}; charset=utf-8",
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})

  async def error(request: Request, exc: HTTPException) -> Response:
    if exc.status_code == 303:
      return RedirectResponse(exc.headers["Location"], 303)
    if exc.status_code >= 400:
      log.warning("refused: %s %s %d %s", request.method, request.scope["path"], exc.status_code,
                  exc.detail)  # The path as received (request.url's drops CR and LF).
    if request.url.path.startswith("/label/") and request.method == "POST" and \
        request.url.path.count("/") == 2:
      return JSONResponse({"error": exc.detail}, exc.status_code)
    return page("error.html", exc.status_code, message=exc.detail)

  # Review: staffing, an admin's decisions on pairs, the labels of one labeler.

  async def staffing(who: sqlite3.Row) -> dict[str, Any]:
    """What the admin pages say about who labels: the people who can be handed pairs (to compare
    with k), and whether this admin is one of them."""
    return {"active": await in_thread(store.active_labelers),
            "labels_too": await in_thread(store.labels_too, who["id"])}

  def accepted(reviews: dict, item_id: int) -> bool:
    return item_id in reviews and reviews[item_id]["action"] == "accept"

  def reviewed(reviews: dict) -> dict[str, int]:
    """The admin page's review counts: pairs accepted, sent back, and sent back still short."""
    back = [r for r in reviews.values() if r["action"] == "send_back"]
    return {"accepted": sum(r["action"] == "accept" for r in reviews.values()),
            "sent_back": len(back), "waiting": sum(r["done_count"] < r["wanted"] for r in back)}

  def back_to(form: dict[str, str], default: str) -> str:
    """Where a review form returns: an admin page of this site, else `default`."""
    back = form.get("back", "")
    return back if back.startswith("/admin") and "\\" not in back else default

  async def also_labels(request: Request) -> Response:
    who = await admin_only(request)
    form = await form_of(request, who)
    name, on = form.get("name", ""), form.get("on") == "1"
    try:
      await in_thread(store.set_also_labels, name, on)
    except store_lib.Refused as e:
      raise HTTPException(400, str(e)) from None
    log.info("who labels: %s %s %s", who["name"],
             "now hands pairs to" if on else "no longer hands pairs to", name)
    back = form.get("back", "")
    return RedirectResponse(back if back in ("/", "/admin", "/admin/labelers") else "/admin", 303)

  async def review(request: Request) -> Response:
    who = await admin_only(request)
    form = await form_of(request, who)
    item, action = request.path_params["item"], form.get("action", "")
    try:
      counts = await in_thread(store.review, item, action, who["id"])
    except store_lib.Refused as e:
      raise HTTPException(400, str(e)) from None
    log.info("review: %s chose %s for pair %d (%d labels, %d wanted)", who["name"], action, item,
             counts["labels"], counts["wanted"])
    return RedirectResponse(back_to(form, "/admin/disagreements"), 303)

  async def labels_page(request: Request) -> Response:
    who = await admin_only(request)
    name = request.query_params.get("labeler", "")
    status = request.query_params.get("status", "all") or "all"
    if status not in REVIEW_STATUSES:
      raise HTTPException(400, f"status must be one of {', '.join(REVIEW_STATUSES)}")
    rows = await in_thread(store.labels)
    split = {d["pair"]["item_id"] for d in report.disagreements(rows, single)}
    flagged = await in_thread(store.flagged_items)
    reviews = await in_thread(store.reviews)
    shown = []
    for r in rows:
      item = r["item_id"]
      if name and r["labeler"] != name:
        continue
      if (status == "disagreement" and item not in split) or (
          status == "flagged" and item not in flagged) or (
          status == "accepted" and not accepted(reviews, item)):
        continue
      shown.append({"row": r, "answers": report.label_answers(r, single),
                    "disagreement": item in split, "flag": flagged.get(item),
                    "review": reviews.get(item)})
    query = urllib.parse.urlencode({"labeler": name, "status": status})
    names = [r["name"] for r in await in_thread(store.labelers)]
    return page("labels.html", who=who, csrf=who["csrf"], shown=shown, labeler=name,
                chosen=status, statuses=REVIEW_STATUSES, names=names,
                back=f"/admin/labels?{query}", k=store.settings.k)

  routes = [
      Route("/", home),
      Route("/login", login_page, methods=["GET"]),
      Route("/login", login, methods=["POST"]),
      Route("/logout", logout, methods=["POST"]),
      Route("/label/{assignment:int}", edit, methods=["GET"]),
      Route("/label/{assignment:int}", submit, methods=["POST"]),
      Route("/label/{assignment:int}/skip", skip, methods=["POST"]),
      Route("/label/{assignment:int}/flag", flag, methods=["POST"]),
      Route("/mine", mine),
      Route("/guidelines", guidelines),
      Route("/admin", admin),
      Route("/admin/labelers", team, methods=["GET"]),
      Route("/admin/labelers", invite, methods=["POST"]),
      Route("/admin/labelers/{name}/revoke", revoke, methods=["POST"]),
      Route("/admin/flags", flags, methods=["GET"]),
      Route("/admin/flags/{item:int}", resolve, methods=["POST"]),
      Route("/admin/disagreements", disagreements),
      Route("/admin/also-labels", also_labels, methods=["POST"]),
      Route("/admin/pairs/{item:int}/review", review, methods=["POST"]),
      Route("/admin/labels", labels_page, methods=["GET"]),
      Route("/admin/export/{layout}/{split}", download),
      Mount("/static", StaticFiles(directory=os.path.join(HERE, "static")), name="static"),
  ]
  return Starlette(routes=routes, middleware=[Middleware(AccessLog), Middleware(SecurityHeaders)],
                   exception_handlers={HTTPException: error})
