"""A labeler's pages: the next pair, answering (and revising) it, skipping or flagging it, their
own labels, and the guidelines."""

from __future__ import annotations

import json
import math
import secrets
import sqlite3

from starlette.concurrency import run_in_threadpool as in_thread  # SQLite blocks.
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from rlhfjax.labeling import diff
from rlhfjax.labeling import protocols
from rlhfjax.labeling import store as store_lib
from rlhfjax.labeling.site import log
from rlhfjax.labeling.site import Site

MAX_COMMENT = 2000  # Characters of a flag's comment.
LOG_COMMENT = 200  # Characters of a flag's comment in the log.
# What the page says after an action (`/?did=...`), in the status bar of the next page.
NOTICES = {"saved": "Saved.", "revised": "Changed: your new answer replaces the earlier one.",
           "skipped": "Skipped: this pair will not come back to you.",
           "flagged": "Flag sent: an admin will read it; the pair is held until then."}


def _first_words(text: str, n: int = 12) -> str:
  words = text.split()
  return " ".join(words[:n]) + (" …" if len(words) > n else "")


def _sides(row: sqlite3.Row) -> tuple[str, str]:
  """The pair's responses in the order the labeler is shown them."""
  return ((row["response_b"], row["response_a"]) if row["swapped"]
          else (row["response_a"], row["response_b"]))


async def _label_page(site: Site, who: sqlite3.Row, row: sqlite3.Row, status: int = 200,
                      notice: str = "") -> HTMLResponse:
  if site.single:  # One response: nothing to compare, nothing marked.
    marked_left, marked_right = [(row["response_a"], False)], []
  else:
    marked_left, marked_right = diff.words(*_sides(row))
  chosen = json.loads(row["shown"]) if row["shown"] else {}
  return site.page("label.html", status, who=who, row=row, left=marked_left, right=marked_right,
                   chosen=chosen, progress=await in_thread(site.store.my_progress, who["id"]),
                   csrf=who["csrf"], last=await in_thread(site.store.last_label, who["id"]),
                   max_comment=MAX_COMMENT, notice=notice, goal=site.goal,
                   database=site.store.database)


async def _own(site: Site, who: sqlite3.Row, assignment_id: int) -> sqlite3.Row:
  try:
    return await in_thread(site.store.assignment, who["id"], assignment_id)
  except store_lib.NotFound:
    raise HTTPException(404, "no such assignment") from None


async def home(site: Site, request: Request) -> Response:
  who = await site.signed_in(request)
  try:
    row = await in_thread(site.store.next_assignment, who["id"])
  except store_lib.Refused:  # An admin who has not chosen to label: the admin page.
    return RedirectResponse("/admin", 303)
  notice = NOTICES.get(request.query_params.get("did", ""), "")
  if row is None:
    return site.page("finished.html", who=who, csrf=who["csrf"], notice=notice, goal=site.goal,
                     progress=await in_thread(site.store.my_progress, who["id"]))
  return await _label_page(site, who, row, notice=notice)


async def edit(site: Site, request: Request) -> Response:
  who = await site.signed_in(request)
  return await _label_page(site, who, await _own(site, who, request.path_params["assignment"]))


async def submit(site: Site, request: Request) -> Response:
  """An answer, as a form or JSON: stored only for the pair and order it names, which must be the
  assignment's (a 409 otherwise); acknowledged once committed."""
  who = await site.labeler(request)
  if who is None:
    if await site.ended_by_admin(request):
      return JSONResponse({"error": "an admin signed you out", "reason": "revoked"}, 401)
    return JSONResponse({"error": "not signed in"}, 401)
  as_json = request.headers.get("content-type", "").startswith("application/json")
  try:
    body = await request.json() if as_json else dict(await request.form())
  except ValueError:
    return JSONResponse({"error": "body is not JSON"}, 400)
  if not isinstance(body, dict):
    return JSONResponse({"error": "body must be an object"}, 400)
  site.check_csrf(request, who, body.get("csrf"))
  row = await _own(site, who, request.path_params["assignment"])
  answers = body.get("answers") if as_json else {
      k: v for k, v in body.items() if k not in ("csrf", "submission", "seconds", "pair",
                                                 "swapped", "uid", "base")}
  try:  # What the labeler saw: the pair and its order, which the store checks.
    item_id, swapped = int(body["pair"]), {"0": False, "1": True}[str(int(body["swapped"]))]
  except (KeyError, TypeError, ValueError):
    return JSONResponse({"error": "the answer does not say which pair and order it was given "
                                  "on (pair, swapped): reload the page and answer again"}, 400)
  # The pair's texts' hash, and the label the page showed: absent from pages of earlier versions.
  uid, base = body.get("uid"), body.get("base")
  if any(v is not None and not isinstance(v, str) for v in (uid, base)):
    return JSONResponse({"error": "uid and base must be strings"}, 400)
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
    label = protocols.canonical(site.protocol, answers, bool(row["swapped"]))
  except protocols.InvalidAnswer as e:
    return JSONResponse({"error": str(e)}, 400)
  stored = {"axes_a": label.axes_a, "axes_b": label.axes_b, "extra": label.extra}
  try:
    status = await in_thread(site.store.submit, who["id"], row["assignment_id"], label.preference,
                             stored, answers, submission, seconds, item_id=item_id,
                             swapped=swapped, uid=uid, base=base)
  except store_lib.Mismatch as e:
    log.warning("label refused: %s sent assignment %d an answer for another pair (%s)",
                who["name"], row["assignment_id"], e)
    return JSONResponse({"error": str(e)}, 409)
  except store_lib.Stale as e:
    return JSONResponse({"error": str(e)}, 409)
  except store_lib.NotFound:  # Given back (its lease ran out and others filled its pair) just now.
    return JSONResponse({"error": "no such assignment"}, 404)
  if not as_json:
    return RedirectResponse("/?did=saved", 303)
  return JSONResponse({"status": status, "assignment": row["assignment_id"],
                       "progress": await in_thread(site.store.my_progress, who["id"])})


async def skip(site: Site, request: Request) -> Response:
  who = await site.signed_in(request)
  await site.form_of(request, who)
  try:
    await in_thread(site.store.skip, who["id"], request.path_params["assignment"])
  except store_lib.NotFound:
    raise HTTPException(404, "no open assignment to skip") from None
  return RedirectResponse("/?did=skipped", 303)


async def flag(site: Site, request: Request) -> Response:
  who = await site.signed_in(request)
  comment = (await site.form_of(request, who)).get("comment", "").strip()
  if not comment:
    raise HTTPException(400, "say what is wrong with the pair (the comment is empty)")
  try:
    await in_thread(site.store.flag, who["id"], request.path_params["assignment"],
                    comment[:MAX_COMMENT])
  except store_lib.NotFound:
    raise HTTPException(404, "no such assignment") from None
  except store_lib.Refused as e:
    raise HTTPException(409, str(e)) from None
  log.info("flag: %s flagged assignment %d: %s", who["name"], request.path_params["assignment"],
           comment[:LOG_COMMENT] + ("…" if len(comment) > LOG_COMMENT else ""))
  return RedirectResponse("/?did=flagged", 303)


async def mine(site: Site, request: Request) -> Response:
  who = await site.signed_in(request)
  first = site.protocol.pair[0].name
  rows = []
  for r in await in_thread(site.store.my_labels, who["id"]):
    shown = json.loads(r["shown"])
    rows.append({"assignment_id": r["assignment_id"], "updated": r["updated"],
                 "title": r["title"], "post": _first_words(r["prompt"]),
                 "answer": site.options[first].get(shown.get(first), shown.get(first))})
  return site.page("mine.html", who=who, rows=rows, csrf=who["csrf"], goal=site.goal,
                   progress=await in_thread(site.store.my_progress, who["id"]))


async def guidelines(site: Site, request: Request) -> Response:
  who = await site.signed_in(request)
  return site.page("guidelines.html", who=who, csrf=who["csrf"], body=site.guidelines_html)


def routes(site: Site) -> list[Route]:
  return [site.route("/", home),
          site.route("/label/{assignment:int}", edit, ["GET"]),
          site.route("/label/{assignment:int}", submit, ["POST"]),
          site.route("/label/{assignment:int}/skip", skip, ["POST"]),
          site.route("/label/{assignment:int}/flag", flag, ["POST"]),
          site.route("/mine", mine),
          site.route("/guidelines", guidelines)]
