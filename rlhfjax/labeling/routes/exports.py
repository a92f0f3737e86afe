"""The admin's downloads: the labels as comparison files (`label_export`'s layouts and rules) and
the agreement report."""

from __future__ import annotations

import tempfile

from starlette.concurrency import run_in_threadpool as in_thread  # SQLite blocks.
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rlhfjax.labeling import comparisons
from rlhfjax.labeling.site import log
from rlhfjax.labeling.site import Site

SPLITS = ("train", "valid", "agreement")


def export_file(site: Site, layout: str, split: str) -> bytes:
  """One file of the export, written to a temporary directory and read back."""
  rules = site.export_rules
  with tempfile.TemporaryDirectory() as tmp:
    out = comparisons.export(site.store.labels(), tmp, layout, site.protocol.name,
                             rules.min_gold_agreement, rules.min_gold_labels)
    with open(out[split], "rb") as f:
      return f.read()


async def download(site: Site, request: Request) -> Response:
  who = await site.admin_only(request)
  layout, split = request.path_params["layout"], request.path_params["split"]
  if layout not in site.layouts or split not in SPLITS:
    raise HTTPException(404, "no such export")
  body = await in_thread(export_file, site, layout, split)
  name = "agreement.md" if split == "agreement" else f"{split}{site.layouts[layout]}"
  log.info("download: %s took %s (%s)", who["name"], name, layout)
  kind = "text/markdown" if split == "agreement" else "application/json"
  return Response(body, media_type=f"{kind}; charset=utf-8",
                  headers={"Content-Disposition": f'attachment; filename="{name}"'})


def routes(site: Site) -> list[Route]:
  return [site.route("/admin/export/{layout}/{split}", download)]
