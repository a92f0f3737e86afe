"""Signing in with a one-time link's token, and signing out."""

from __future__ import annotations

import secrets

from starlette.concurrency import run_in_threadpool as in_thread  # SQLite blocks.
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from rlhfjax.labeling.site import log
from rlhfjax.labeling.site import Site


def login_form(site: Site, status: int = 200, error: str = "",
               revoked: bool = False) -> HTMLResponse:
  """The sign-in form, with a fresh token in a cookie of its own (double submit)."""
  csrf = secrets.token_urlsafe(16)
  response = site.page("login.html", status, csrf=csrf, error=error, revoked=revoked)
  response.set_cookie(site.login_cookie, csrf, max_age=3600, httponly=True, samesite="strict",
                      secure=site.secure_cookie, path="/login")
  return response


async def login_page(site: Site, request: Request) -> Response:
  return login_form(site, revoked=await site.ended_by_admin(request))


async def login(site: Site, request: Request) -> Response:
  ip = request.client.host if request.client else "?"
  site.check_origin(request)
  form = await request.form()
  expected = request.cookies.get(site.login_cookie, "")
  if not expected or not secrets.compare_digest(str(form.get("csrf", "")).encode(),
                                                expected.encode()):
    log.warning("sign-in refused from %s: the form expired or came from elsewhere", ip)
    return login_form(site, 403, "The sign-in form expired: sign in again.")
  token = str(form.get("token", ""))
  wait = site.limiter.wait(ip)
  if wait and not await in_thread(site.store.token_valid, token):
    log.warning("sign-in refused from %s: too many failed sign-ins (retry in %d s)", ip, wait)
    response = login_form(site, 429, f"Too many failed sign-ins from your address: try again in "
                                     f"{wait} s.")
    response.headers["Retry-After"] = str(wait)
    return response
  session = await in_thread(site.store.login, token, site.session_s)
  if session is None:
    site.limiter.failed(ip)
    log.warning("sign-in failed from %s: an invalid, spent or expired link", ip)
    return login_form(site, 401, "This sign-in link is not valid (each link works once; ask for "
                                 "a new one).")
  log.info("sign-in: %s from %s", session[2], ip)
  response = RedirectResponse("/", 303)
  response.delete_cookie(site.login_cookie, path="/login")
  response.set_cookie(site.session_cookie, session[0], max_age=int(site.session_s), httponly=True,
                      samesite="strict", secure=site.secure_cookie)
  return response


async def logout(site: Site, request: Request) -> Response:
  who = await site.labeler(request)
  if who is not None:
    await site.form_of(request, who)
    await in_thread(site.store.logout, request.cookies[site.session_cookie])
    log.info("sign-out: %s", who["name"])
  response = RedirectResponse("/login", 303)
  response.delete_cookie(site.session_cookie)
  return response


def routes(site: Site) -> list[Route]:
  return [site.route("/login", login_page, ["GET"]),
          site.route("/login", login, ["POST"]),
          site.route("/logout", logout, ["POST"])]
