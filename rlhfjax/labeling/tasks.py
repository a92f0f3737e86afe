"""The labeling tasks of the command line (`config.labeling`; docs/labeling.md):

- `label_load`: queue the pairs of `labeling.source` (and gold pairs of `labeling.gold_file`);
- `label_user`: create a labeler (`labeling.user`, an admin with `labeling.admin`) and print a
  one-time sign-in link; run it again for a new link; or, with `labeling.revoke`, revoke a
  labeler's access;
- `label_server`: serve the labeling site on `labeling.host:labeling.port` (the `[label]` extra),
  logging every request and sign-in to stderr, one line each;
- `label_export`: write the finished labels as comparison files for task=rm (the binary protocol's
  as binary feedback files for task=kto), and the agreement report.

The database (`labeling.db`, default `<workdir>/labeling/labels.db`) keeps its protocol: a
different `labeling.protocol` later is an error, not a silent mix of answer kinds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import sys
from typing import Any, Iterator, TextIO

from rlhfjax.data import records
from rlhfjax.errors import ConfigError
from rlhfjax.labeling import comparisons
from rlhfjax.labeling import protocols
from rlhfjax.labeling import sources
from rlhfjax.labeling import store as store_lib
from rlhfjax.training import metrics as metrics_lib


def db_path(config, workdir: str) -> str:
  return config.labeling.db or os.path.join(workdir, "labeling", "labels.db")


def open_store(config, workdir: str) -> tuple[store_lib.Store, protocols.Protocol]:
  """The project's database with its assignment rules, and its protocol (checked against the
  config's)."""
  c = config.labeling
  try:
    protocol = protocols.get(c.protocol)
  except ValueError as e:
    raise ConfigError(f"labeling.protocol: {e}") from None
  for key, value in (("labels_per_pair", c.labels_per_pair), ("lease_minutes", c.lease_minutes)):
    if value <= 0:
      raise ConfigError(f"labeling.{key} must be positive, got {value}")
  if not 0 <= c.valid_fraction <= 1:
    raise ConfigError(f"labeling.valid_fraction must be in [0, 1], got {c.valid_fraction}")
  if c.gold_every < 0:
    raise ConfigError(f"labeling.gold_every must be 0 (no gold pairs) or more, got {c.gold_every}")
  store = store_lib.Store(db_path(config, workdir), store_lib.Settings(
      k=c.labels_per_pair, lease_s=60.0 * c.lease_minutes, gold_every=c.gold_every))
  stored = store.meta("protocol")
  if stored is None:
    store.set_meta("protocol", protocol.name)
  elif stored != protocol.name:
    raise ConfigError(f"labeling.protocol: {store.path} was started with the {stored!r} protocol, "
                      f"not {protocol.name!r}; use another labeling.db for a new protocol")
  return store, protocol


def load(config, workdir: str) -> dict[str, int]:
  """task=label_load: queues the pairs in an order shuffled by `labeling.seed`, valid pairs spread
  evenly through it (`sources.queue`)."""
  store, protocol = open_store(config, workdir)
  pairs = sources.load(config, workdir, protocol.single)
  random.Random(config.labeling.seed).shuffle(pairs)
  pairs = sources.queue(pairs, config.labeling.valid_fraction)
  added = store.add_items(pairs)
  progress = store.progress()
  metrics_lib.info(f"label_load: {added} new pairs of {len(pairs)} read; {store.path} holds "
                   f"{progress['pairs']} pairs and {progress['gold_pairs']} gold pairs")
  return {"added": added, **progress}


def user(config, workdir: str) -> str:
  """task=label_user: prints and returns the new labeler's one-time sign-in link; with
  `labeling.revoke`, revokes that labeler instead (`revoke`)."""
  c = config.labeling
  if c.revoke:
    if c.user:
      raise ConfigError(f"labeling.user ({c.user!r}) and labeling.revoke ({c.revoke!r}): give one "
                        "(a sign-in link, or a revocation)")
    return revoke(config, workdir)
  if not store_lib.NAME.fullmatch(c.user):
    raise ConfigError(f"labeling.user: {store_lib.NAME_RULE} (got {c.user!r})")
  store, _ = open_store(config, workdir)
  token = store.add_labeler(c.user, bool(c.admin), 3600.0 * c.token_hours)
  # The public address, else the one the site was last served at from this database.
  base = c.url or store.meta("served_url") or f"http://{c.host}:{c.port}"
  link = f"{base.rstrip('/')}/login#token={token}"  # After '#': never sent to the server.
  role = "admin" if c.admin else "labeler"
  print(f"{role} {c.user}: sign in once within {c.token_hours:g} h at\n{link}", flush=True)
  return link


def revoke(config, workdir: str) -> str:
  """task=label_user with `labeling.revoke=NAME`: ends the labeler's sessions, spends their sign-in
  link and gives back their open assignment; their labels stay. A new link (`labeling.user=NAME`)
  restores access. Prints and returns what it did."""
  name = config.labeling.revoke
  store, _ = open_store(config, workdir)
  row = store.read().execute("SELECT id, revoked FROM labelers WHERE name = ?",
                             (name,)).fetchone()
  if row is None:
    known = [r["name"] for r in store.labelers()]
    raise ConfigError(f"labeling.revoke: no labeler named {name!r} in {store.path} (labelers: "
                      f"{', '.join(known) if known else 'none'})")
  labels = store.read().execute("SELECT COUNT(*) FROM assignments WHERE labeler_id = ? AND done "
                                "IS NOT NULL", (row["id"],)).fetchone()[0]
  store.revoke(name)
  done = (f"revoked {name}" + (" (revoked already)" if row["revoked"] is not None else "") +
          f": sessions ended, sign-in link spent, open assignment returned to the queue; their "
          f"{labels} labels stay. A new link restores access: --config.labeling.user={name}")
  print(done, flush=True)
  return done


@contextlib.contextmanager
def stderr_log(stream: TextIO | None = None) -> Iterator[None]:
  """The site's log (`rlhfjax.labeling`: requests, sign-ins, refusals) on `stream` (stderr), one
  line per event, for the block: a handler of its own, and no propagation to the root logger,
  where absl's handler (app.run installs it) would write every event a second time. A logger
  someone configured already is left as it is."""
  log = logging.getLogger("rlhfjax.labeling")
  if log.handlers:
    yield
    return
  handler = logging.StreamHandler(stream or sys.stderr)
  handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
  level, propagate = log.level, log.propagate
  log.addHandler(handler)
  log.setLevel(logging.INFO)
  log.propagate = False
  try:
    yield
  finally:
    log.removeHandler(handler)
    log.setLevel(level)
    log.propagate = propagate


def cookie_name(c) -> str:
  """The session cookie's name: `labeling.cookie_name`, else one of the port's own (cookies ignore
  the port, so two sites on one host would otherwise sign each other's labelers out)."""
  name = c.cookie_name or f"rlhfjax_session_{c.port}"
  if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
    raise ConfigError(f"labeling.cookie_name: 1-64 letters, digits, _ or - (got {name!r})")
  return name


def serve(config, workdir: str) -> None:
  """task=label_server: serves until interrupted (Ctrl-C or SIGTERM)."""
  try:  # The label extra: the web stack and the guidelines' Markdown renderer.
    import uvicorn
    from rlhfjax.labeling import guidelines
    from rlhfjax.labeling import server
    from rlhfjax.labeling import site
  except ImportError as e:
    raise ConfigError(f"task=label_server needs the label extra: pip install -e '.[label]' ({e})"
                      ) from None
  c = config.labeling
  store, protocol = open_store(config, workdir)
  layout = export_layout(c.layout, protocol)
  app = server.create_app(
      store, protocol, session_s=3600.0 * c.session_hours,
      login_per_minute=c.login_attempts_per_minute, public_url=c.url,
      guidelines=guidelines.load(protocol.name, c.guidelines) if c.guidelines else "",
      token_s=3600.0 * c.token_hours,
      export_rules=site.ExportRules(layout, c.min_gold_agreement, c.min_gold_labels),
      goal=c.goal, cookie=cookie_name(c))
  served = f"http://{'127.0.0.1' if c.host in ('0.0.0.0', '::') else c.host}:{c.port}"
  store.set_meta("served_url", served)  # What label_user's links carry without labeling.url.
  metrics_lib.info(f"label_server: {protocol.name} protocol, {store.path}, {c.url or served}")
  warning = staffing_warning(store)
  if warning:
    metrics_lib.info(f"label_server: {warning}")
  with stderr_log():  # The access log and sign-in events.
    uvicorn.run(app, host=c.host, port=c.port, log_level="warning")


def staffing_warning(store: store_lib.Store) -> str:
  """A warning when fewer people can be handed pairs than each pair asks for (k), else ''."""
  active, k = store.active_labelers(), store.settings.k
  if active >= k:
    return ""
  return (f"warning: each pair asks for {k} labels (labeling.labels_per_pair) but only {active} "
          f"{'person' if active == 1 else 'people'} can be handed pairs (labelers not revoked, and "
          "admins who chose to label too): no pair gets its labels until more are invited")


def export(config, workdir: str) -> dict[str, Any]:
  """task=label_export: the finished labels as comparison files (`labeling.layout`), or as binary
  feedback files for a one-response protocol."""
  store, protocol = open_store(config, workdir)
  out = config.labeling.export_dir or os.path.join(workdir, "labeling", "export")
  c = config.labeling
  layout = export_layout(c.layout, protocol)
  out = comparisons.export(store.labels(), out, layout, protocol.name, c.min_gold_agreement,
                           c.min_gold_labels)
  if out["left_out"]:
    metrics_lib.info(f"label_export: left out the labels of {', '.join(out['left_out'])} "
                     f"(below {c.min_gold_agreement:.0%} agreement with gold)")
  if protocol.single:
    for split in ("train", "valid"):
      metrics_lib.info(f"label_export: {out[split]}: {out['labels'][split]} labels")
    metrics_lib.info(f"label_export: report: {out['agreement']}; task=kto reads the labels with "
                     f"kto.feedback=binary kto.train_file={out['train']}")
    return out
  for split in ("train", "valid"):
    metrics_lib.info(f"label_export: {out[split]}: {out['labels'][split]} labels, "
                     f"{out['decisive'][split]} of them decisive (ties aside)")
  metrics_lib.info(f"label_export: report: {out['agreement']}")
  for split in ("train", "valid"):
    if not out["decisive"][split]:
      metrics_lib.info(
          f"label_export: {out[split]} has no decisive label yet, so task=rm cannot use it as "
          f"rm.{split}_file: label more pairs (the queue spreads valid pairs through it, "
          "labeling.valid_fraction of them, fixed when pairs are loaded), or give task=rm an "
          f"rm.{split}_file of its own")
  return out


def export_layout(layout: str, protocol: protocols.Protocol) -> str:
  """The layout the labels are exported in: the binary one for a one-response protocol, else
  `labeling.layout` (checked)."""
  if protocol.single:
    return records.BINARY
  if layout not in ("openai", "alpaca"):
    raise ConfigError(f"labeling.layout must be 'openai' or 'alpaca', got {layout!r}")
  return layout
