"""The admin's pages: progress and agreement, the team (invitations, revocations, who labels),
flags, and the review of labels (disagreements, accept or send back, one labeler's labels)."""

from __future__ import annotations

import math
import sqlite3
from typing import Any
import urllib.parse

from starlette.concurrency import run_in_threadpool as in_thread  # SQLite blocks.
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from rlhfjax.labeling import diff
from rlhfjax.labeling import report
from rlhfjax.labeling import store as store_lib
from rlhfjax.labeling.site import log
from rlhfjax.labeling.site import Site

REVIEW_STATUSES = ("all", "disagreement", "flagged", "accepted")  # Filters of /admin/labels.


async def _staffing(site: Site, who: sqlite3.Row) -> dict[str, Any]:
  """What the admin pages say about who labels: the people who can be handed pairs (to compare
  with k), and whether this admin is one of them."""
  return {"active": await in_thread(site.store.active_labelers),
          "labels_too": await in_thread(site.store.labels_too, who["id"])}


def _accepted(reviews: dict, item_id: int) -> bool:
  return item_id in reviews and reviews[item_id]["action"] == "accept"


def _reviewed(reviews: dict) -> dict[str, int]:
  """The admin page's review counts: pairs accepted, sent back, and sent back still short."""
  back = [r for r in reviews.values() if r["action"] == "send_back"]
  return {"accepted": sum(r["action"] == "accept" for r in reviews.values()),
          "sent_back": len(back), "waiting": sum(r["done_count"] < r["wanted"] for r in back)}


def _back_to(form: dict[str, str], default: str) -> str:
  """Where a review form returns: an admin page of this site, else `default`."""
  back = form.get("back", "")
  return back if back.startswith("/admin") and "\\" not in back else default


def _invitation(site: Site, request: Request, token: str) -> str:
  base = site.public_url or f"{request.url.scheme}://{request.url.netloc}"
  return f"{base.rstrip('/')}/login#token={token}"


async def admin(site: Site, request: Request) -> Response:
  who = await site.admin_only(request)
  js = report.judgements(await in_thread(site.store.labels), site.single)
  names, mean, se, count = report.table(js)
  return site.page("admin.html", who=who, csrf=who["csrf"],
                   progress=await in_thread(site.store.progress), k=site.store.settings.k,
                   throughput=report.throughput(js), labelers=report.labelers(js), names=names,
                   mean=mean, se=se, count=count, isnan=math.isnan, layouts=site.layouts,
                   shares=report.SHARES[site.single],
                   flags=len(await in_thread(site.store.flags)),
                   reviewed=_reviewed(await in_thread(site.store.reviews)),
                   **await _staffing(site, who))


async def team(site: Site, request: Request, status: int = 200, link: str = "",
               invited: str = "", error: str = "") -> Response:
  who = await site.admin_only(request)
  return site.page("labelers.html", status, who=who, csrf=who["csrf"],
                   labelers=await in_thread(site.store.labelers), link=link, invited=invited,
                   error=error, token_hours=site.token_s / 3600, k=site.store.settings.k,
                   **await _staffing(site, who))


async def invite(site: Site, request: Request) -> Response:
  who = await site.admin_only(request)
  form = await site.form_of(request, who)
  name = form.get("name", "").strip()
  if not store_lib.NAME.fullmatch(name):
    return await team(site, request, 400, error=store_lib.NAME_RULE)
  token = await in_thread(site.store.add_labeler, name, form.get("admin") == "on", site.token_s)
  await in_thread(site.store.set_also_labels, name, form.get("also_labels") == "on")
  log.info("invitation: %s invited %s%s", who["name"], name,
           " (admin)" if form.get("admin") == "on" else "")
  return await team(site, request, link=_invitation(site, request, token), invited=name)


async def revoke(site: Site, request: Request) -> Response:
  who = await site.admin_only(request)
  await site.form_of(request, who)
  name = request.path_params["name"]
  try:
    await in_thread(site.store.revoke, name, who["id"])
  except store_lib.Refused as e:
    return await team(site, request, 400, error=str(e))
  log.info("revocation: %s revoked %s", who["name"], name)
  return RedirectResponse("/admin/labelers", 303)


async def also_labels(site: Site, request: Request) -> Response:
  who = await site.admin_only(request)
  form = await site.form_of(request, who)
  name, on = form.get("name", ""), form.get("on") == "1"
  try:
    await in_thread(site.store.set_also_labels, name, on)
  except store_lib.Refused as e:
    raise HTTPException(400, str(e)) from None
  log.info("who labels: %s %s %s", who["name"],
           "now hands pairs to" if on else "no longer hands pairs to", name)
  back = form.get("back", "")
  return RedirectResponse(back if back in ("/", "/admin", "/admin/labelers") else "/admin", 303)


async def flags(site: Site, request: Request) -> Response:
  who = await site.admin_only(request)
  return site.page("flags.html", who=who, csrf=who["csrf"],
                   flags=await in_thread(site.store.flags))


async def resolve(site: Site, request: Request) -> Response:
  who = await site.admin_only(request)
  action = (await site.form_of(request, who)).get("action", "")
  try:
    await in_thread(site.store.resolve, request.path_params["item"], action)
  except store_lib.Refused as e:
    raise HTTPException(400, str(e)) from None
  log.info("flag resolved: %s chose %s for pair %d", who["name"], action,
           request.path_params["item"])
  return RedirectResponse("/admin/flags", 303)


async def disagreements(site: Site, request: Request) -> Response:
  who = await site.admin_only(request)
  found = report.disagreements(await in_thread(site.store.labels), site.single)
  reviews = await in_thread(site.store.reviews)
  hide = request.query_params.get("hide") == "accepted"
  if hide:
    found = [d for d in found if not _accepted(reviews, d["pair"]["item_id"])]
  for d in found:
    d["a"], d["b"] = ([(d["pair"]["response_a"], False)], []) if site.single else diff.words(
        d["pair"]["response_a"], d["pair"]["response_b"])
  return site.page("disagreements.html", who=who, csrf=who["csrf"], found=found, reviews=reviews,
                   hide=hide, k=site.store.settings.k,
                   back="/admin/disagreements" + ("?hide=accepted" if hide else ""))


async def review(site: Site, request: Request) -> Response:
  who = await site.admin_only(request)
  form = await site.form_of(request, who)
  item, action = request.path_params["item"], form.get("action", "")
  try:
    counts = await in_thread(site.store.review, item, action, who["id"])
  except store_lib.Refused as e:
    raise HTTPException(400, str(e)) from None
  log.info("review: %s chose %s for pair %d (%d labels, %d wanted)", who["name"], action, item,
           counts["labels"], counts["wanted"])
  return RedirectResponse(_back_to(form, "/admin/disagreements"), 303)


async def labels_page(site: Site, request: Request) -> Response:
  who = await site.admin_only(request)
  name = request.query_params.get("labeler", "")
  status = request.query_params.get("status", "all") or "all"
  if status not in REVIEW_STATUSES:
    raise HTTPException(400, f"status must be one of {', '.join(REVIEW_STATUSES)}")
  rows = await in_thread(site.store.labels)
  split = {d["pair"]["item_id"] for d in report.disagreements(rows, site.single)}
  flagged = await in_thread(site.store.flagged_items)
  reviews = await in_thread(site.store.reviews)
  shown = []
  for r in rows:
    item = r["item_id"]
    if name and r["labeler"] != name:
      continue
    if (status == "disagreement" and item not in split) or (
        status == "flagged" and item not in flagged) or (
        status == "accepted" and not _accepted(reviews, item)):
      continue
    shown.append({"row": r, "answers": report.label_answers(r, site.single),
                  "disagreement": item in split, "flag": flagged.get(item),
                  "review": reviews.get(item)})
  query = urllib.parse.urlencode({"labeler": name, "status": status})
  names = [r["name"] for r in await in_thread(site.store.labelers)]
  return site.page("labels.html", who=who, csrf=who["csrf"], shown=shown, labeler=name,
                   chosen=status, statuses=REVIEW_STATUSES, names=names,
                   back=f"/admin/labels?{query}", k=site.store.settings.k)


def routes(site: Site) -> list[Route]:
  return [site.route("/admin", admin),
          site.route("/admin/labelers", team, ["GET"]),
          site.route("/admin/labelers", invite, ["POST"]),
          site.route("/admin/labelers/{name}/revoke", revoke, ["POST"]),
          site.route("/admin/also-labels", also_labels, ["POST"]),
          site.route("/admin/flags", flags, ["GET"]),
          site.route("/admin/flags/{item:int}", resolve, ["POST"]),
          site.route("/admin/disagreements", disagreements),
          site.route("/admin/pairs/{item:int}/review", review, ["POST"]),
          site.route("/admin/labels", labels_page, ["GET"])]
