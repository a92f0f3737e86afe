"""Load test of the labeling site: concurrent labelers, a SIGKILL of the server mid-load, and a
check of the database against every label the server acknowledged.

  python bench/labeling_load.py [--labelers 50] [--seconds 60] [--kill-at 30] [--pairs 5000]
      [--gold 200] [--workdir DIR] [--json out.json]

Builds a fresh labeling database (in `--workdir`, else a temporary folder) with `--pairs` pairs and
`--gold` gold pairs (the `alpacafarm` protocol, 3 labels per pair, one assignment in 10 a gold pair,
30-minute leases) and `--labelers` labelers, straight through `store.Store` (no model needed), then
starts the real server, `python -m rlhfjax.main --config configs/labeling.py` (task=label_server) on
a free 127.0.0.1 port. Each labeler is one `httpx.AsyncClient` with its own cookie jar: it signs in
with its one-time token (GET /login for the form's token, then POST), then loops without pause: GET
/ (its assignment and CSRF token), POST /label/N with a random answer (left, right or tie) and a
fresh submission id. A label counts as acknowledged only when the server answered 200. A request
that fails (connection refused or reset, a 5xx) is sent again, the same submission with the same id,
as the page's script does (backoff 0.1 s doubling to 1 s), until the server answers. At `--kill-at`
seconds the server process gets SIGKILL and the same command is started again; the bench polls GET
/login until it answers (downtime: SIGKILL to that first answer). After `--seconds`, labelers finish
the label they are on and stop; the server is stopped and the database is checked with `sqlite3`
directly: every acknowledged label is stored exactly once, with the acknowledged answers and
submission id; no label the clients were not told about; labels = finished assignments; no pair
twice to one labeler; at most one open assignment per labeler; no non-gold pair with more than k
labels (or k active assignments) unless a label came after its lease expired; gold pairs about 1 /
`gold_every` of the assignments; `PRAGMA integrity_check`; no traceback in the server log. Exits 1
if a check fails.

Prints labels acknowledged, labels/s (overall, while the server was up, per 10 s window),
p50/p95/p99 latency of acknowledged POST /label and GET / (the attempt that got the answer),
errors by kind, the downtime and the CPU seconds of server and client, then a Markdown summary.
Every label costs two write transactions (GET / leases the assignment, POST stores the label),
each committed in WAL mode with synchronous=FULL, i.e. an fsync of the WAL per commit; the bench
times a 4 KiB write+fsync in the same folder to show the disk's commit cost. CPU- and IO-bound:
there is no FLOP peak to compare. The client (one asyncio process) and the server (one uvicorn
process) share the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import json
import os
import platform
import random
import re
import resource
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from rlhfjax.labeling import protocols  # noqa: E402
from rlhfjax.labeling import sources  # noqa: E402
from rlhfjax.labeling import store as store_lib  # noqa: E402

PROTOCOL = "alpacafarm"
ANSWERS = ("left", "right", "tie")
ASSIGNMENT = re.compile(r'data-assignment="(\d+)"')
CSRF = re.compile(r'name="csrf" value="([^"]+)"')
SHOWN = re.compile(r'data-pair="(\d+)" data-swapped="([01])"')  # The pair and order on the page.
WORDS = ("the model answer says that a short list of steps helps when the question is about "
         "cooking travel money code health or history and each step is clear").split()


# The database.

def _text(rng: random.Random, n: int) -> str:
  return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def make_db(path: str, pairs: int, gold: int, labelers: int, settings: store_lib.Settings,
            seed: int = 0) -> dict[str, str]:
  """A new database at `path` with `pairs` pairs, `gold` gold pairs mixed in (one every
  pairs/gold positions) and `labelers` labelers; returns {labeler name: one-time token}."""
  rng = random.Random(seed)
  store = store_lib.Store(path, settings)
  store.set_meta("protocol", PROTOCOL)
  items, every, golds = [], max(1, (pairs + gold) // max(gold, 1)), 0
  for n in range(pairs + gold):
    is_gold = gold > 0 and n % every == every - 1 and golds < gold
    golds += is_gold
    prompt = {"id": f"p{n}", "prompt": _text(rng, 20), "input": _text(rng, 10) if n % 3 else ""}
    items.append(sources.item(prompt, _text(rng, 80), _text(rng, 80), "system_a", "system_b",
                              gold=float(rng.choice((0.0, 0.5, 1.0))) if is_gold else None))
  store.add_items(sources.queue(items, 0.1))
  tokens = {f"labeler{i:03d}": store.add_labeler(f"labeler{i:03d}", False, 3600.0)
            for i in range(labelers)}
  store.close()
  return tokens


# The server.

def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Server:
  """The real server (`python -m rlhfjax.main --config configs/labeling.py`) as a subprocess; its
  output goes to `log`."""

  def __init__(self, workdir: str, db: str, settings: store_lib.Settings, port: int | None = None):
    self.port = port or free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self.log = os.path.join(workdir, "server.log")
    self.command = [
        sys.executable, "-m", "rlhfjax.main", "--config", os.path.join(ROOT, "configs",
                                                                       "labeling.py"),
        "--workdir", workdir, "--config.task=label_server", f"--config.labeling.db={db}",
        f"--config.labeling.protocol={PROTOCOL}", "--config.labeling.host=127.0.0.1",
        f"--config.labeling.port={self.port}", f"--config.labeling.labels_per_pair={settings.k}",
        f"--config.labeling.lease_minutes={settings.lease_s / 60:g}",
        f"--config.labeling.gold_every={settings.gold_every}",
        "--config.labeling.login_attempts_per_minute=100000"]  # Every labeler signs in from here.
    self.proc: subprocess.Popen | None = None
    self.starts = 0

  def start(self) -> None:
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    with open(self.log, "a", encoding="utf-8") as log:
      log.write(f"--- start {self.starts} at {time.time():.3f}\n")
      log.flush()
      self.proc = subprocess.Popen(self.command, cwd=ROOT, env=env, stdout=log,
                                   stderr=subprocess.STDOUT)
    self.starts += 1

  async def wait_ready(self, timeout: float = 120.0) -> float:
    """Polls GET /login until it answers 200; returns the monotonic time it did."""
    end = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=self.url, timeout=2.0) as client:
      while time.monotonic() < end:
        if self.proc is not None and self.proc.poll() is not None:
          raise RuntimeError(f"the server exited with {self.proc.returncode}: "
                             f"{self.log_tail()}")
        try:
          if (await client.get("/login")).status_code == 200:
            return time.monotonic()
        except httpx.TransportError:
          pass
        await asyncio.sleep(0.05)
    raise RuntimeError(f"the server did not answer within {timeout:g} s: {self.log_tail()}")

  def kill(self) -> None:
    """SIGKILL to the server process (the Python process that runs uvicorn in its own loop)."""
    assert self.proc is not None
    os.kill(self.proc.pid, signal.SIGKILL)
    self.proc.wait()

  def stop(self) -> None:
    if self.proc is not None and self.proc.poll() is None:
      self.proc.send_signal(signal.SIGINT)
      try:
        self.proc.wait(20)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()

  def log_tail(self, n: int = 3000) -> str:
    with open(self.log, encoding="utf-8", errors="replace") as f:
      return f.read()[-n:]


# The labelers.

@dataclasses.dataclass
class Stats:
  acked: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)  # assignment -> ack
  double_acks: list[tuple[int, str, str]] = dataclasses.field(default_factory=list)
  statuses: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  errors: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  post_s: list[float] = dataclasses.field(default_factory=list)
  get_s: list[float] = dataclasses.field(default_factory=list)
  ack_times: list[float] = dataclasses.field(default_factory=list)
  gave_up: int = 0
  finished_labelers: int = 0
  kill_at: float | None = None
  ready_at: float | None = None
  start: float = 0.0
  end: float = 0.0
  client_cpu_s: float = 0.0  # This process during the load.
  server_cpu_s: float = 0.0  # Both server processes, their start-ups included.


class GaveUp(Exception):
  pass


async def _request(client: httpx.AsyncClient, stats: Stats, what: str, method: str, url: str,
                   give_up_at: float, **kwargs) -> tuple[httpx.Response, float]:
  """Sends the same request until the server answers with something other than a 5xx; returns
  the response and the seconds its successful attempt took."""
  attempt = 0
  while True:
    t = time.monotonic()
    try:
      r = await client.request(method, url, **kwargs)
      if r.status_code < 500:
        return r, time.monotonic() - t
      stats.errors[f"{what}: HTTP {r.status_code}"] += 1
    except httpx.TransportError as e:
      stats.errors[f"{what}: {type(e).__name__}"] += 1
    if time.monotonic() > give_up_at:
      stats.gave_up += 1
      raise GaveUp(what)
    await asyncio.sleep(min(1.0, 0.1 * 2 ** attempt))
    attempt += 1


async def labeler(url: str, name: str, token: str, stats: Stats, deadline: float,
                  give_up_at: float, seed: int) -> None:
  """One labeler: signs in, then labels until `deadline` (the request under way is finished)."""
  rng = random.Random(seed)
  async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
    r, _ = await _request(client, stats, "GET /login", "GET", "/login", give_up_at)
    form = re.search(r'name="csrf" value="([^"]+)"', r.text)
    r, _ = await _request(client, stats, "POST /login", "POST", "/login", give_up_at,
                          data={"token": token, "csrf": form.group(1) if form else ""})
    if r.status_code != 303 or not any(c.startswith("rlhfjax_session") for c in client.cookies):
      stats.errors[f"POST /login: HTTP {r.status_code}"] += 1
      stats.gave_up += 1
      return
    while time.monotonic() < deadline:
      r, seconds = await _request(client, stats, "GET /", "GET", "/", give_up_at)
      if r.status_code != 200:
        stats.errors[f"GET /: HTTP {r.status_code}"] += 1
        return
      stats.get_s.append(seconds)
      assignment, csrf = ASSIGNMENT.search(r.text), CSRF.search(r.text)
      if assignment is None:  # The finished page: nothing left for this labeler.
        stats.finished_labelers += 1
        return
      n = int(assignment.group(1))
      pair, swapped = map(int, SHOWN.search(r.text).groups())
      answers = {"preference": rng.choice(ANSWERS)}
      submission = secrets.token_hex(16)
      body = {"csrf": csrf.group(1), "submission": submission, "answers": answers,
              "seconds": rng.uniform(5, 60), "pair": pair, "swapped": swapped}
      r, seconds = await _request(client, stats, "POST /label", "POST", f"/label/{n}",
                                  give_up_at, json=body,
                                  headers={"X-CSRF-Token": csrf.group(1)})
      if r.status_code != 200:
        stats.errors[f"POST /label: HTTP {r.status_code}"] += 1
        continue
      reply = r.json()
      stats.post_s.append(seconds)
      stats.statuses[reply.get("status")] += 1
      stats.ack_times.append(time.monotonic())
      if n in stats.acked and stats.acked[n]["submission"] != submission:
        stats.double_acks.append((n, stats.acked[n]["submission"], submission))
      stats.acked[n] = {"labeler": name, "submission": submission, "answers": answers,
                        "status": reply.get("status"), "reply_assignment": reply.get("assignment"),
                        "pair": pair, "swapped": swapped}


async def killer(server: Server, stats: Stats, at: float) -> None:
  await asyncio.sleep(max(0.0, at - time.monotonic()))
  stats.kill_at = time.monotonic()
  server.kill()
  server.start()
  stats.ready_at = await server.wait_ready()


async def run_load(server: Server, tokens: dict[str, str], seconds: float,
                   kill_at: float | None, grace: float = 120.0) -> Stats:
  """`len(tokens)` labelers for `seconds`, with one SIGKILL and restart of the server `kill_at`
  seconds in (None: none)."""
  stats = Stats(start=time.monotonic())
  deadline = stats.start + seconds
  tasks = [labeler(server.url, name, token, stats, deadline, deadline + grace, seed)
           for seed, (name, token) in enumerate(sorted(tokens.items()))]
  if kill_at is not None:
    tasks.append(killer(server, stats, stats.start + kill_at))
  results = await asyncio.gather(*tasks, return_exceptions=True)
  stats.end = time.monotonic()
  for r in results:
    if isinstance(r, BaseException) and not isinstance(r, GaveUp):
      raise r
  return stats


# The checks.

def check(db_path: str, stats: Stats, settings: store_lib.Settings,
          server_log: str = "") -> tuple[list[str], dict[str, Any]]:
  """(failures, counts) of the database against the acknowledged labels."""
  protocol = protocols.get(PROTOCOL)
  fail: list[str] = []
  db = sqlite3.connect(db_path)
  db.row_factory = sqlite3.Row
  q = lambda sql, *args: db.execute(sql, args).fetchall()  # noqa: E731
  integrity = [r[0] for r in q("PRAGMA integrity_check")]
  if integrity != ["ok"]:
    fail.append(f"integrity_check: {integrity[:5]}")
  labels = {r["assignment_id"]: r for r in q(
      "SELECT l.*, a.swapped, a.item_id, a.labeler_id, a.done, lb.name FROM labels l JOIN "
      "assignments a ON "
      "a.id = l.assignment_id JOIN labelers lb ON lb.id = a.labeler_id")}
  n_labels = q("SELECT COUNT(*) FROM labels")[0][0]
  if n_labels != len(labels):
    fail.append(f"{n_labels} labels but {len(labels)} join an assignment and a labeler")
  lost = wrong = 0
  for n, ack in stats.acked.items():
    row = labels.get(n)
    if row is None:
      lost += 1
      continue
    expected = protocols.canonical(protocol, ack["answers"], bool(row["swapped"])).preference
    if (row["name"] != ack["labeler"] or row["submission"] != ack["submission"]
        or json.loads(row["shown"]) != ack["answers"] or row["preference"] != expected
        or row["revisions"] != 0 or ack["reply_assignment"] != n
        or (row["item_id"], row["swapped"]) != (ack["pair"], ack["swapped"])):
      wrong += 1
  if lost:
    fail.append(f"{lost} acknowledged labels are not in the database")
  if wrong:
    fail.append(f"{wrong} acknowledged labels are stored with other answers, submission, "
                "labeler, revisions, pair or left/right order")
  if stats.double_acks:
    fail.append(f"{len(stats.double_acks)} assignments acknowledged for two submissions "
                f"(e.g. {stats.double_acks[0]})")
  unacked = sorted(set(labels) - set(stats.acked))
  if unacked:
    fail.append(f"{len(unacked)} labels in the database were never acknowledged to their client "
                f"(e.g. assignments {unacked[:5]})")
  done = q("SELECT COUNT(*) FROM assignments WHERE done IS NOT NULL")[0][0]
  if done != n_labels:
    fail.append(f"{n_labels} labels but {done} assignments marked done")
  mismatched = q("SELECT COUNT(*) FROM assignments a LEFT JOIN labels l ON l.assignment_id = a.id "
                 "WHERE (a.done IS NULL) != (l.assignment_id IS NULL)")[0][0]
  if mismatched:
    fail.append(f"{mismatched} assignments whose done mark disagrees with having a label")
  twice = q("SELECT item_id, labeler_id, COUNT(*) FROM assignments GROUP BY item_id, labeler_id "
            "HAVING COUNT(*) > 1")
  if twice:
    fail.append(f"{len(twice)} (pair, labeler) assigned twice")
  open_many = q("SELECT labeler_id, COUNT(*) FROM assignments WHERE done IS NULL "
                "GROUP BY labeler_id HAVING COUNT(*) > 1")
  if open_many:
    fail.append(f"{len(open_many)} labelers hold more than one open assignment")
  over = q("SELECT a.item_id, COUNT(*) AS n, SUM(l.created > a.lease_expires) AS late "
           "FROM labels l JOIN assignments a ON a.id = l.assignment_id JOIN items i ON "
           "i.id = a.item_id WHERE i.gold IS NULL GROUP BY a.item_id HAVING COUNT(*) > ?",
           settings.k)
  unexplained = [r for r in over if r["n"] - r["late"] > settings.k]
  if unexplained:
    fail.append(f"{len(unexplained)} pairs with more than k={settings.k} labels not explained by "
                "late submissions")
  now = time.time()
  active = q("SELECT a.item_id FROM assignments a JOIN items i ON i.id = a.item_id "
             "WHERE i.gold IS NULL AND (a.done IS NOT NULL OR a.lease_expires > ?) "
             "GROUP BY a.item_id HAVING COUNT(*) > ?", now, settings.k)
  if active:
    fail.append(f"{len(active)} pairs with more than k={settings.k} active assignments")
  if settings.gold_every > 0:  # Each assignment is gold with probability 1 / gold_every.
    n, g = q("SELECT COUNT(*), SUM(i.gold IS NOT NULL) FROM assignments a JOIN items i ON "
             "i.id = a.item_id")[0]
    share, want = (g or 0) / max(n, 1), 1 / settings.gold_every
    if n >= 500 and not 0.5 * want <= share <= 1.5 * want:
      fail.append(f"gold pairs are {100 * share:.1f}% of {n} assignments, not about "
                  f"{100 * want:.0f}%")
  if stats.gave_up:
    fail.append(f"{stats.gave_up} requests given up (the server did not answer in time)")
  http_errors = {k: v for k, v in stats.errors.items() if "HTTP" in k}
  if http_errors:
    fail.append(f"the server answered with errors: {http_errors}")
  for needle in ("Traceback", "database is locked"):
    if needle in server_log:
      fail.append(f"the server log holds {needle!r}")
  counts = {
      "labels": n_labels, "done assignments": done,
      "open assignments": q("SELECT COUNT(*) FROM assignments WHERE done IS NULL")[0][0],
      "gold labels": q("SELECT COUNT(*) FROM labels l JOIN assignments a ON a.id = "
                       "l.assignment_id JOIN items i ON i.id = a.item_id "
                       "WHERE i.gold IS NOT NULL")[0][0],
      "complete pairs": q("SELECT COUNT(*) FROM (SELECT a.item_id FROM labels l JOIN assignments "
                          "a ON a.id = l.assignment_id JOIN items i ON i.id = a.item_id WHERE "
                          "i.gold IS NULL GROUP BY a.item_id HAVING COUNT(*) >= ?)",
                          settings.k)[0][0],
      "integrity_check": ",".join(integrity[:1]),
      "journal_mode": q("PRAGMA journal_mode")[0][0],
  }
  db.close()
  return fail, counts


# The machine.

def fsync_ms(folder: str, n: int = 200) -> float:
  """Median milliseconds of a 4 KiB write + fsync in `folder` (the disk's commit cost)."""
  path = os.path.join(folder, "fsync.probe")
  fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
  times = []
  try:
    for i in range(n):
      os.pwrite(fd, os.urandom(4096), (i % 16) * 4096)
      t = time.perf_counter()
      os.fsync(fd)
      times.append(time.perf_counter() - t)
  finally:
    os.close(fd)
    os.remove(path)
  return 1000 * float(np.median(times))


def machine(folder: str) -> dict[str, Any]:
  return {"cpus": os.cpu_count(), "cpus usable": len(os.sched_getaffinity(0)),
          "cpu": platform.processor() or platform.machine(),
          "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
          "sqlite durability": "WAL, synchronous=FULL (fsync of the WAL per commit)",
          "fsync 4KiB median ms": fsync_ms(folder)}


def percentiles(xs: list[float]) -> str:
  if not xs:
    return "n/a"
  p = np.percentile(np.asarray(xs) * 1000, [50, 95, 99])
  return f"{p[0]:.1f} / {p[1]:.1f} / {p[2]:.1f}"


def results(stats: Stats, args, info: dict[str, Any]) -> dict[str, Any]:
  elapsed = stats.end - stats.start
  down = (stats.ready_at - stats.kill_at) if stats.kill_at and stats.ready_at else 0.0
  return {
      "labelers": args.labelers, "seconds asked": args.seconds, "seconds run": elapsed,
      "pairs": args.pairs, "gold pairs": args.gold, "labels acknowledged": len(stats.acked),
      "labels/s": len(stats.acked) / elapsed,
      "labels/s while up": len(stats.acked) / max(1e-9, elapsed - down),
      "labels/s per 10 s": " ".join(str(int(n / 10)) for n in np.histogram(
          np.asarray(stats.ack_times) - stats.start,
          bins=np.arange(0, 10 * (elapsed // 10) + 1, 10))[0]) or "n/a",
      "replies saved/repeated/revised": "/".join(str(stats.statuses.get(s, 0))
                                                 for s in ("saved", "repeated", "revised")),
      "POST /label ms p50/p95/p99": percentiles(stats.post_s),
      "GET / ms p50/p95/p99": percentiles(stats.get_s),
      "SIGKILL at s": (stats.kill_at - stats.start) if stats.kill_at else "none",
      "downtime s (SIGKILL to first answer)": down,
      "errors": dict(sorted(stats.errors.items())) or "none",
      "server CPU s (both processes)": stats.server_cpu_s,
      "client CPU s": stats.client_cpu_s,
      "labelers that ran out of pairs": stats.finished_labelers,
      **info}


def markdown(out: dict[str, Any], counts: dict[str, Any], failures: list[str]) -> str:
  fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else (  # noqa: E731
      ", ".join(f"{k} {n}" for k, n in v.items()) if isinstance(v, dict) else str(v))
  rows = ["| measure | value |", "|---|---|"]
  rows += [f"| {k} | {fmt(v)} |" for k, v in out.items()]
  rows += [f"| db: {k} | {fmt(v)} |" for k, v in counts.items()]
  rows.append(f"| checks | {'all passed' if not failures else 'FAILED: ' + '; '.join(failures)} |")
  return "\n".join(rows)


def run(workdir: str, labelers: int, seconds: float, kill_at: float | None, pairs: int,
        gold: int, settings: store_lib.Settings = store_lib.Settings(k=3, lease_s=1800.0,
                                                                     gold_every=10)
        ) -> tuple[Stats, list[str], dict[str, Any], Server]:
  """The whole test in `workdir`: database, server, load (one SIGKILL), checks."""
  db_path = os.path.join(workdir, "labels.db")
  if os.path.exists(db_path):
    raise FileExistsError(f"{db_path} exists: the bench needs a fresh database")
  tokens = make_db(db_path, pairs, gold, labelers, settings)
  server = Server(workdir, db_path, settings)
  cpu = lambda who: (lambda r: r.ru_utime + r.ru_stime)(resource.getrusage(who))  # noqa: E731
  children = cpu(resource.RUSAGE_CHILDREN)
  server.start()
  try:
    asyncio.run(server.wait_ready())
    mine = cpu(resource.RUSAGE_SELF)
    stats = asyncio.run(run_load(server, tokens, seconds, kill_at))
    stats.client_cpu_s = cpu(resource.RUSAGE_SELF) - mine
  finally:
    server.stop()
  stats.server_cpu_s = cpu(resource.RUSAGE_CHILDREN) - children
  failures, counts = check(db_path, stats, settings, server.log_tail(10**7))
  return stats, failures, counts, server


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--labelers", type=int, default=50)
  ap.add_argument("--seconds", type=float, default=60.0)
  ap.add_argument("--kill-at", type=float, default=30.0, help="seconds in; negative: no kill")
  ap.add_argument("--pairs", type=int, default=5000)
  ap.add_argument("--gold", type=int, default=200)
  ap.add_argument("--workdir", default="", help="default: a temporary folder, removed after")
  ap.add_argument("--json", default="", help="also write the numbers here")
  args = ap.parse_args()

  workdir = args.workdir or tempfile.mkdtemp(prefix="labeling_load_")
  os.makedirs(workdir, exist_ok=True)
  try:
    info = machine(workdir)
    stats, failures, counts, _ = run(workdir, args.labelers, args.seconds,
                                     args.kill_at if args.kill_at >= 0 else None,
                                     args.pairs, args.gold)
    out = results(stats, args, info)
    width = max(map(len, [*out, *counts]))
    for k, v in [*out.items(), *(("db: " + k, v) for k, v in counts.items())]:
      print(f"{k:<{width + 4}}  {v:.4g}" if isinstance(v, float) else f"{k:<{width + 4}}  {v}")
    print("checks: " + ("all passed" if not failures else "FAILED"))
    for f in failures:
      print(f"  FAILED: {f}")
    print()
    print(markdown(out, counts, failures))
    if args.json:
      with open(args.json, "w", encoding="utf-8") as f:
        json.dump({"results": out, "db": counts, "failures": failures}, f, indent=2, default=str)
  finally:
    if not args.workdir:
      shutil.rmtree(workdir, ignore_errors=True)
  sys.exit(1 if failures else 0)


if __name__ == "__main__":
  main()
