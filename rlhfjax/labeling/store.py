"""The labeling database: SQLite in WAL mode, one file per labeling project.

Every write is one `BEGIN IMMEDIATE` transaction (SQLite's lock serialises writers, so two labelers
can never take the same last slot of a pair; inside one server, writers also take turns on a lock of
their own, which keeps the slowest waits short) committed with `synchronous=FULL` before the caller
answers: a label the page was told is saved survives a SIGKILL or a power cut. A label belongs to
exactly one assignment (its primary key), so a retried submission cannot duplicate it; a submission
id already applied to an assignment is acknowledged again and changes nothing (an old retry cannot
undo a later revision), a new one from the same labeler revises the label, if it names the label it
revises (`base`: the one its page showed, or none): an answer from a page drawn before the label
last changed (another tab's, both retrying while the server was down) is refused (Stale), never
stored over the newer one.

A label can never land on a pair the labeler did not see: assignment ids are AUTOINCREMENT (SQLite
never hands an id out twice, even after its row is deleted, so a label sent late to id N cannot
reach a later assignment), and a submission names the pair (its id and its uid, a hash of its
prompt's id, or its text without one, and responses: `sources.item`; so a label kept by a browser
for another database's pair of the same id is refused too) and the left/right order it was given on, which must be the assignment's. Each
database has a random id of its own (`database`), with which the page keys what the browser keeps.

Each pair counts its labels (`done_count`); the queue reads a partial index of the pairs with fewer
than they want (k, more once an admin sent them back) and not held by a flag, so picking the next
pair, and counting those left, does not slow down as finished pairs pile up.

Assignment rules:
- a pair goes to `k` distinct labelers (never twice to one: one assignment per pair and labeler),
  and to one more for each time an admin sends it back;
- a labeler holds at most one open assignment; it is leased for `lease_s` seconds, after which it
  no longer counts against the pair's k and the pair returns to the queue (a late answer is still
  kept, and the pair may then end with more than k labels; but once the labeler asks for a pair
  again after others filled it, that assignment is deleted and a late answer for it is refused);
- left/right order is drawn per assignment and stored;
- an assignment is a gold pair (a known answer) with probability 1 / `gold_every`, drawn at random
  among those the labeler has not seen, while any remain (so neither the slot nor the pair gives a
  gold pair away); gold pairs go to every labeler and never count towards k;
- a skipped assignment no longer counts against the pair's k (the pair returns to the queue for
  others) and is never offered to that labeler again; a flagged one is skipped, and its pair is held
  out of the queue until an admin returns it (`release`) or removes it (`drop`: nobody is given it
  again and its labels are left out of exports). A label sent afterwards from a page still open is
  kept, as a late one is, and ends the skip (the flag stays).

Admins review pairs (`review`): *accept* marks a pair's labels as reviewed and accepted; *send
back* asks for one more label. The counts stay honest: `done_count` is always the number of labels,
and a pair wants `k + extra_labels` of them, `extra_labels` (0 unless sent back) being stored per
pair. Sending back raises it to one more than the pair has or was already due, so the pair is
open again and goes, by the usual rules, to one more labeler who has not been given it. The queue's
condition `done_count < k + extra_labels` is one expression over the row, so the partial index
keeps it as its literal (with k, as before) and stays the queue's index; a send-back is an update
of one row, which SQLite moves into the index. Every decision is a row of `reviews` (pair, action,
admin, time); the latest one is the pair's review status.

Admins are handed pairs only when they opt in (`labelers.also_labels`, `set_also_labels`):
`next_assignment` refuses the others, so no route can give them one. The people who can be handed
pairs (`active_labelers`) are the labelers not revoked and the admins who opted in; with fewer than
k of them no pair can be finished.

Login tokens and session ids are stored as SHA-256 hashes only; the file is created readable by
its owner alone. A new sign-in token for a labeler ends their open sessions; revoking a labeler
ends them too (marked as ended by an admin, so the page can say so), spends their token and gives
their open assignment back (their labels stay).
A database made by an earlier version gains the newer columns and tables when opened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import secrets
import sqlite3
import threading
import time
from typing import Any, Iterator, Sequence

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS items (
  id INTEGER PRIMARY KEY,
  uid TEXT NOT NULL UNIQUE,
  prompt TEXT NOT NULL, title TEXT NOT NULL, subreddit TEXT NOT NULL, input TEXT NOT NULL,
  response_a TEXT NOT NULL, response_b TEXT NOT NULL,
  policy_a TEXT NOT NULL, policy_b TEXT NOT NULL, prompt_id TEXT NOT NULL,
  split TEXT NOT NULL,
  gold REAL CHECK (gold IN (0, 0.5, 1)),
  position INTEGER NOT NULL,
  done_count INTEGER NOT NULL DEFAULT 0,
  held INTEGER NOT NULL DEFAULT 0,
  extra_labels INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS items_queue ON items (gold, position);
CREATE TABLE IF NOT EXISTS labelers (
  id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, is_admin INTEGER NOT NULL,
  token_hash TEXT UNIQUE, token_expires REAL, created REAL NOT NULL, revoked REAL,
  also_labels INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS sessions (
  id_hash TEXT PRIMARY KEY, labeler_id INTEGER NOT NULL REFERENCES labelers (id),
  csrf TEXT NOT NULL, expires REAL NOT NULL, ended TEXT);
CREATE TABLE IF NOT EXISTS assignments (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  item_id INTEGER NOT NULL REFERENCES items (id),
  labeler_id INTEGER NOT NULL REFERENCES labelers (id),
  swapped INTEGER NOT NULL CHECK (swapped IN (0, 1)),
  created REAL NOT NULL, lease_expires REAL NOT NULL, done REAL, skipped REAL,
  UNIQUE (item_id, labeler_id));
CREATE INDEX IF NOT EXISTS assignments_open ON assignments (labeler_id, done);
CREATE TABLE IF NOT EXISTS labels (
  assignment_id INTEGER PRIMARY KEY REFERENCES assignments (id),
  preference REAL NOT NULL CHECK (preference IN (0, 0.5, 1)),
  answers TEXT NOT NULL, shown TEXT NOT NULL, submission TEXT NOT NULL,
  created REAL NOT NULL, updated REAL NOT NULL, revisions INTEGER NOT NULL, seconds REAL);
CREATE TABLE IF NOT EXISTS submissions (
  assignment_id INTEGER NOT NULL REFERENCES assignments (id), submission TEXT NOT NULL,
  PRIMARY KEY (assignment_id, submission));
CREATE TABLE IF NOT EXISTS flags (
  id INTEGER PRIMARY KEY,
  item_id INTEGER NOT NULL REFERENCES items (id),
  labeler_id INTEGER NOT NULL REFERENCES labelers (id),
  comment TEXT NOT NULL, created REAL NOT NULL, resolved REAL, resolution TEXT,
  UNIQUE (item_id, labeler_id));
CREATE TABLE IF NOT EXISTS reviews (
  id INTEGER PRIMARY KEY,
  item_id INTEGER NOT NULL REFERENCES items (id),
  action TEXT NOT NULL CHECK (action IN ('accept', 'send_back')),
  admin_id INTEGER NOT NULL REFERENCES labelers (id),
  created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS reviews_item ON reviews (item_id, id);
"""

# Columns added after the first release: (table, column, declaration) for `ALTER TABLE ADD COLUMN`.
ADDED_COLUMNS = (("items", "held", "INTEGER NOT NULL DEFAULT 0"),
                 ("labelers", "revoked", "REAL"),
                 ("assignments", "skipped", "REAL"),
                 ("sessions", "ended", "TEXT"),
                 ("items", "extra_labels", "INTEGER NOT NULL DEFAULT 0"),
                 ("labelers", "also_labels", "INTEGER NOT NULL DEFAULT 0"))
REVIEW_ACTIONS = ("accept", "send_back")  # The admins' decisions on a pair (table `reviews`).
HELD, DROPPED = 1, 2  # items.held: 0 in the queue, 1 flagged (waits for an admin), 2 removed.

# A labeler's name: no spaces, nothing to escape, and a letter or digit first (never "." or "..",
# which a URL such as /admin/labelers/{name}/revoke cannot hold).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
NAME_RULE = ("A name is 1-64 letters, digits or _.@- and starts with a letter or digit "
             "(e.g. ada or ada.lovelace@example.org).")
ITEM_FIELDS = ("uid", "prompt", "title", "subreddit", "input", "response_a", "response_b",
               "policy_a", "policy_b", "prompt_id", "split", "gold")


def _never_reuse_assignment_ids(db: sqlite3.Connection) -> None:
  """Rebuilds an earlier version's `assignments` table (ids reusable after a delete) as
  AUTOINCREMENT, keeping every row and id: SQLite then never hands out an id again, so a label
  addressed to an assignment can never reach one made later. Inside the caller's transaction,
  with foreign keys off (SQLite's procedure for changing a table's definition)."""
  row = db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND "
                   "name = 'assignments'").fetchone()
  if row is None or "AUTOINCREMENT" in row[0].upper():
    return
  create = re.search(r"CREATE TABLE IF NOT EXISTS assignments \(.*?\);", SCHEMA, re.S).group(0)
  db.execute(create.replace("IF NOT EXISTS assignments", "assignments_rebuilt"))
  columns = ", ".join(r["name"] for r in db.execute(
      "SELECT name FROM pragma_table_info('assignments')"))
  db.execute(f"INSERT INTO assignments_rebuilt ({columns}) SELECT {columns} FROM assignments")
  db.execute("DROP TABLE assignments")
  db.execute("ALTER TABLE assignments_rebuilt RENAME TO assignments")
  if db.execute("PRAGMA foreign_key_check").fetchone() is not None:
    raise sqlite3.IntegrityError("the rebuilt assignments table breaks a foreign key")


def digest(secret: str) -> str:
  return hashlib.sha256(secret.encode("utf-8")).hexdigest()


class NotFound(LookupError):
  """No such assignment for this labeler (whether it exists for another is not said)."""


class Refused(ValueError):
  """An admin action that cannot be done (its message says why)."""


class Stale(ValueError):
  """A revision made on a page drawn before the label last changed."""


class Mismatch(ValueError):
  """A label made for another pair, or for the pair in the other order, than the assignment it
  was sent to holds (its message says which)."""


@dataclasses.dataclass(frozen=True)
class Settings:
  """The assignment rules (see the module docstring)."""

  k: int = 3
  lease_s: float = 1800.0
  gold_every: int = 10


class Store:
  """One labeling database; safe to share between threads (one connection per thread)."""

  def __init__(self, path: str, settings: Settings = Settings()):
    self.path = path
    self.settings = settings
    self._local = threading.local()
    self._turn = threading.Lock()  # This process's writers, one at a time and in turn.
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    if not os.path.exists(path):
      os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    db = self._db()
    db.execute("PRAGMA foreign_keys=OFF")  # A table rebuilt below keeps its rows' ids.
    with self.write() as db:  # One transaction: two processes opening an old file migrate once.
      for table, column, declaration in ADDED_COLUMNS:
        columns = {r["name"] for r in db.execute(f"SELECT name FROM pragma_table_info('{table}')")}
        if columns and column not in columns:  # An existing table of an earlier version.
          db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
      _never_reuse_assignment_ids(db)
    db.execute("PRAGMA foreign_keys=ON")
    db.executescript(SCHEMA)  # Idempotent; executescript runs its own transaction.
    k = int(settings.k)
    # A pair wants k labels plus those an admin asked for when sending it back (`extra_labels`).
    self._open = f"gold IS NULL AND done_count < {k} + extra_labels"
    self._queued = f"{self._open} AND held = 0"  # Open and not held by a flag: the index's literal.
    self._index = f"items_wanted_{k}"
    db.execute(f"CREATE INDEX IF NOT EXISTS {self._index} ON items (position) WHERE {self._queued}")
    # This database's own id (made once; two processes opening a new file keep the first).
    db.execute("INSERT OR IGNORE INTO meta VALUES ('database', ?)", (secrets.token_hex(8),))
    self.database = self.meta("database")
    for old in (f"items_open_{k}", f"items_queued_{k}"):  # Earlier versions' (no held, no extra).
      db.execute(f"DROP INDEX IF EXISTS {old}")

  def _db(self) -> sqlite3.Connection:
    db = getattr(self._local, "db", None)
    if db is None:
      db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None,
                           check_same_thread=False)
      db.row_factory = sqlite3.Row
      db.execute("PRAGMA journal_mode=WAL")
      db.execute("PRAGMA synchronous=FULL")
      db.execute("PRAGMA foreign_keys=ON")
      db.execute("PRAGMA busy_timeout=30000")
      self._local.db = db
    return db

  @contextlib.contextmanager
  def write(self) -> Iterator[sqlite3.Connection]:
    """One write transaction, committed (and on disk) when the block ends without an error."""
    db = self._db()
    with self._turn:
      db.execute("BEGIN IMMEDIATE")
      try:
        yield db
        db.execute("COMMIT")
      except BaseException:
        if db.in_transaction:  # Not when SQLite rolled back already.
          db.execute("ROLLBACK")
        raise

  def read(self) -> sqlite3.Connection:
    return self._db()

  def close(self) -> None:
    db = getattr(self._local, "db", None)
    if db is not None:
      db.close()
      self._local.db = None

  # Project settings stored with the labels: a database keeps its protocol.

  def meta(self, key: str) -> str | None:
    row = self.read().execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return row["value"] if row else None

  def set_meta(self, key: str, value: str) -> None:
    with self.write() as db:
      db.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = ?",
                 (key, value, value))

  # Work in.

  def add_items(self, items: Sequence[dict[str, Any]]) -> int:
    """Adds pairs (dicts with `ITEM_FIELDS`, split 'train' or 'valid') after those already queued;
    a pair whose uid is already there is skipped. Returns how many were added."""
    for item in items:
      if item["split"] not in ("train", "valid"):
        raise ValueError(f"pair {item['uid']}: split must be 'train' or 'valid', got "
                         f"{item['split']!r}")
    with self.write() as db:
      start = db.execute("SELECT COALESCE(MAX(position) + 1, 0) FROM items").fetchone()[0]
      added = 0
      for item in items:
        cur = db.execute(
            f"INSERT OR IGNORE INTO items ({', '.join(ITEM_FIELDS)}, position) "
            f"VALUES ({', '.join('?' * (len(ITEM_FIELDS) + 1))})",
            [item[f] for f in ITEM_FIELDS] + [start + added])
        added += cur.rowcount
    return added

  # Labelers and sessions.

  def add_labeler(self, name: str, is_admin: bool, token_s: float) -> str:
    """Creates the labeler (or keeps it, updating `is_admin`, and lifts a revocation) and returns
    a new one-time login token valid for `token_s` seconds; any earlier unused token and open
    session stop working. A `name` outside `NAME` is refused (ValueError)."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
      raise ValueError(f"labeler name {name!r}: {NAME_RULE}")
    token, now = secrets.token_urlsafe(24), time.time()
    with self.write() as db:
      db.execute(
          "INSERT INTO labelers (name, is_admin, token_hash, token_expires, created) "
          "VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET is_admin = excluded.is_admin, "
          "token_hash = excluded.token_hash, token_expires = excluded.token_expires, "
          "revoked = NULL",
          (name, int(is_admin), digest(token), now + token_s, now))
      db.execute("DELETE FROM sessions WHERE labeler_id = (SELECT id FROM labelers WHERE "
                 "name = ?)", (name,))
    return token

  def login(self, token: str, session_s: float) -> tuple[str, str, str] | None:
    """Spends a login token: (session id, CSRF token, labeler name) of a new session, or None."""
    now = time.time()
    with self.write() as db:
      row = db.execute("SELECT id, name FROM labelers WHERE token_hash = ? AND token_expires > ? "
                       "AND revoked IS NULL", (digest(token), now)).fetchone()
      if row is None:
        return None
      db.execute("UPDATE labelers SET token_hash = NULL, token_expires = NULL WHERE id = ?",
                 (row["id"],))
      session, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
      db.execute("INSERT INTO sessions (id_hash, labeler_id, csrf, expires) "
                 "VALUES (?, ?, ?, ?)", (digest(session), row["id"], csrf, now + session_s))
      db.execute("DELETE FROM sessions WHERE expires < ?", (now,))
    return session, csrf, row["name"]

  def session(self, session: str) -> sqlite3.Row | None:
    """The labeler (id, name, is_admin) and CSRF token of a live session."""
    return self.read().execute(
        "SELECT l.id, l.name, l.is_admin, s.csrf FROM sessions s JOIN labelers l "
        "ON l.id = s.labeler_id WHERE s.id_hash = ? AND s.expires > ? AND l.revoked IS NULL "
        "AND s.ended IS NULL", (digest(session), time.time())).fetchone()

  def ended(self, session: str) -> str | None:
    """Why a session that no longer works ended, when an admin ended it ('revoked'); None for a
    live, expired, signed-out or unknown one."""
    row = self.read().execute("SELECT ended FROM sessions WHERE id_hash = ? AND expires > ?",
                              (digest(session), time.time())).fetchone()
    return row["ended"] if row else None

  def logout(self, session: str) -> None:
    with self.write() as db:
      db.execute("DELETE FROM sessions WHERE id_hash = ?", (digest(session),))

  def token_valid(self, token: str) -> bool:
    """Whether `token` would sign in now (a read: nothing is spent)."""
    return self.read().execute(
        "SELECT 1 FROM labelers WHERE token_hash = ? AND token_expires > ? AND revoked IS NULL",
        (digest(token), time.time())).fetchone() is not None

  def revoke(self, name: str, by: int | None = None) -> None:
    """Ends the labeler's sessions (marked, so their page can say an admin ended them), spends
    their token and gives back their open assignment as an expired lease would: the pair returns
    to the queue, the assignment stays theirs, and an answer they send after being let back in
    lands on that pair, or is refused if others filled it. Their labels stay. `by` (the admin's
    id) may not revoke themselves."""
    with self.write() as db:
      row = db.execute("SELECT id FROM labelers WHERE name = ?", (name,)).fetchone()
      if row is None:
        raise Refused(f"no labeler named {name!r}")
      if row["id"] == by:
        raise Refused("you cannot revoke your own access")
      db.execute("UPDATE labelers SET revoked = ?, token_hash = NULL, token_expires = NULL "
                 "WHERE id = ?", (time.time(), row["id"]))
      db.execute("UPDATE sessions SET ended = 'revoked' WHERE labeler_id = ?", (row["id"],))
      db.execute("UPDATE assignments SET lease_expires = 0 WHERE labeler_id = ? AND done IS NULL "
                 "AND skipped IS NULL", (row["id"],))

  def labelers(self) -> list[sqlite3.Row]:
    """Every labeler for the admin: name, role, whether an admin also labels, whether a sign-in
    link is waiting, live sessions, labels, the last label's time, and when access was revoked
    (None: not revoked)."""
    now = time.time()
    return self.read().execute(
        "SELECT l.id, l.name, l.is_admin, l.also_labels, l.created, l.revoked, "
        "(l.token_hash IS NOT NULL AND l.token_expires > ?) AS invited, "
        "(SELECT COUNT(*) FROM sessions s WHERE s.labeler_id = l.id AND s.expires > ?) "
        "AS sessions, "
        "(SELECT COUNT(*) FROM assignments a WHERE a.labeler_id = l.id AND a.done IS NOT NULL) "
        "AS labels, (SELECT MAX(a.done) FROM assignments a WHERE a.labeler_id = l.id) AS last "
        "FROM labelers l ORDER BY l.name", (now, now)).fetchall()

  # The queue.

  def next_assignment(self, labeler_id: int) -> sqlite3.Row | None:
    """The labeler's open assignment (its lease renewed), else a new one; None when nothing is
    left for them. Returns the assignment joined with its pair. An admin is handed pairs only after
    opting in (`set_also_labels`); before, this raises `Refused`."""
    s, now = self.settings, time.time()
    with self.write() as db:
      who = db.execute("SELECT is_admin, also_labels FROM labelers WHERE id = ?",
                       (labeler_id,)).fetchone()
      if who is not None and who["is_admin"] and not who["also_labels"]:
        raise Refused("admins are handed pairs only when they choose to label too")
      row = db.execute("SELECT id, item_id, lease_expires FROM assignments "
                       "WHERE labeler_id = ? AND done IS NULL AND skipped IS NULL",
                       (labeler_id,)).fetchone()
      if row is not None:
        gold, held, extra = db.execute("SELECT gold, held, extra_labels FROM items WHERE id = ?",
                                       (row["item_id"],)).fetchone()
        if not held and (row["lease_expires"] > now or gold is not None or self._active(
            db, row["item_id"], now) < s.k + extra):  # Still held, or the pair still needs it.
          db.execute("UPDATE assignments SET lease_expires = ? WHERE id = ?",
                     (now + s.lease_s, row["id"]))
          return self._assignment(db, row["id"])
        # Others took it, or a flag holds the pair: it may come back later.
        db.execute("DELETE FROM assignments WHERE id = ?", (row["id"],))
      item = None
      if s.gold_every > 0 and secrets.randbelow(s.gold_every) == 0:
        item = db.execute(
            "SELECT id FROM items i WHERE gold IS NOT NULL AND held = 0 AND NOT EXISTS (SELECT 1 "
            "FROM assignments a WHERE a.item_id = i.id AND a.labeler_id = ?) ORDER BY random() "
            "LIMIT 1", (labeler_id,)).fetchone()
      if item is None:
        item = db.execute(
            f"SELECT id FROM items i INDEXED BY {self._index} WHERE {self._queued} AND "
            "NOT EXISTS (SELECT 1 FROM assignments a WHERE a.item_id = i.id AND "
            "a.labeler_id = ?) AND (SELECT COUNT(*) FROM assignments a WHERE a.item_id = i.id "
            "AND (a.done IS NOT NULL OR a.lease_expires > ?)) < ? + i.extra_labels "
            "ORDER BY position LIMIT 1",
            (labeler_id, now, s.k)).fetchone()
      if item is None:
        return None
      cur = db.execute(
          "INSERT INTO assignments (item_id, labeler_id, swapped, created, lease_expires) "
          "VALUES (?, ?, ?, ?, ?)",
          (item["id"], labeler_id, secrets.randbelow(2), now, now + s.lease_s))
      return self._assignment(db, cur.lastrowid)

  @staticmethod
  def _active(db: sqlite3.Connection, item_id: int, now: float) -> int:
    return db.execute("SELECT COUNT(*) FROM assignments WHERE item_id = ? AND (done IS NOT NULL "
                      "OR lease_expires > ?)", (item_id, now)).fetchone()[0]

  @staticmethod
  def _assignment(db: sqlite3.Connection, assignment_id: int) -> sqlite3.Row:
    return db.execute(
        "SELECT i.*, a.id AS assignment_id, a.labeler_id, a.swapped, a.done, l.answers, l.shown, "
        "l.submission "
        "FROM assignments a JOIN items i ON i.id = a.item_id "
        "LEFT JOIN labels l ON l.assignment_id = a.id WHERE a.id = ?",
        (assignment_id,)).fetchone()

  def assignment(self, labeler_id: int, assignment_id: int) -> sqlite3.Row:
    """One of the labeler's own assignments, with its pair and label if any."""
    row = self._assignment(self.read(), assignment_id)
    if row is None or row["labeler_id"] != labeler_id:
      raise NotFound(f"no assignment {assignment_id} for this labeler")
    return row

  def submit(self, labeler_id: int, assignment_id: int, preference: float,
             answers: dict[str, Any], shown: dict[str, str], submission: str,
             seconds: float | None, *, item_id: int, swapped: bool,
             uid: str | None = None, base: str | None = None) -> str:
    """Stores the label of one of the labeler's assignments; returns 'saved', 'revised' or
    'repeated' (this submission id was stored already). `item_id`, `uid` (None: a page of an
    earlier version, which did not send it) and `swapped` say which pair, in which order, the
    labeler answered: a label is stored only on that pair in that order (Mismatch otherwise),
    whatever assignment id it was sent to. `base` is the submission id of the label the answer's
    page showed ('' for none; None: not said, as by pages of earlier versions): a label that has
    changed since is not replaced (Stale)."""
    now = time.time()
    with self.write() as db:
      row = db.execute("SELECT a.labeler_id, a.item_id, a.swapped, i.uid FROM assignments a "
                       "JOIN items i ON i.id = a.item_id WHERE a.id = ?",
                       (assignment_id,)).fetchone()
      if row is None or row["labeler_id"] != labeler_id:
        raise NotFound(f"no assignment {assignment_id} for this labeler")
      if (row["item_id"], bool(row["swapped"])) != (item_id, bool(swapped)):
        order = lambda s: "B on the left" if s else "A on the left"
        raise Mismatch(f"this answer was given on pair {item_id} shown with {order(swapped)}, "
                       f"but assignment {assignment_id} is pair {row['item_id']} shown with "
                       f"{order(row['swapped'])}: not stored")
      if uid is not None and uid != row["uid"]:
        raise Mismatch(f"this answer was given on a pair {item_id} with other texts (uid "
                       f"{uid[:24]!r}, from another labeling database?) than assignment "
                       f"{assignment_id}'s (uid {row['uid']!r}): not stored")
      if db.execute("INSERT OR IGNORE INTO submissions VALUES (?, ?)",
                    (assignment_id, submission)).rowcount == 0:
        return "repeated"
      old = db.execute("SELECT submission FROM labels WHERE assignment_id = ?",
                       (assignment_id,)).fetchone()
      if base is not None and (old["submission"] if old else "") != base:
        raise Stale("this pair's label was changed from another page after this one was shown: "
                    "not stored (reload to see the label kept)")
      values = (preference, json.dumps(answers, sort_keys=True), json.dumps(shown, sort_keys=True))
      if old is not None:
        db.execute("UPDATE labels SET preference = ?, answers = ?, shown = ?, submission = ?, "
                   "updated = ?, revisions = revisions + 1 WHERE assignment_id = ?",
                   (*values, submission, now, assignment_id))
        return "revised"
      db.execute("INSERT INTO labels VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?)",
                 (assignment_id, *values, submission, now, now, seconds))
      # A label sent after a skip or a flag (from a page still open) ends the skip: the latest
      # act wins, and an assignment is never both skipped and done.
      db.execute("UPDATE assignments SET done = ?, skipped = NULL WHERE id = ?",
                 (now, assignment_id))
      db.execute("UPDATE items SET done_count = done_count + 1 WHERE id = ?", (row["item_id"],))
    return "saved"

  def skip(self, labeler_id: int, assignment_id: int) -> None:
    """Gives an open assignment back: the pair returns to the queue for others, never to this
    labeler. A finished one cannot be skipped (NotFound, as for another's)."""
    with self.write() as db:
      if db.execute("UPDATE assignments SET skipped = ?, lease_expires = 0 WHERE id = ? AND "
                    "labeler_id = ? AND done IS NULL", (time.time(), assignment_id, labeler_id)
                    ).rowcount == 0:
        raise NotFound(f"no open assignment {assignment_id} for this labeler")

  def flag(self, labeler_id: int, assignment_id: int, comment: str) -> None:
    """Flags the pair of one of the labeler's assignments with a comment: an open assignment is
    skipped, and the pair is held out of the queue until an admin resolves the flag. Flagging the
    same pair again replaces the comment."""
    now = time.time()
    with self.write() as db:
      row = db.execute("SELECT a.item_id, a.done, i.held FROM assignments a JOIN items i ON "
                       "i.id = a.item_id WHERE a.id = ? AND a.labeler_id = ?",
                       (assignment_id, labeler_id)).fetchone()
      if row is None:
        raise NotFound(f"no assignment {assignment_id} for this labeler")
      if row["held"] == DROPPED:  # A flag would bring it back to the admin's list, and release.
        raise Refused("an admin has removed this pair already: nothing to flag")
      if row["done"] is None:
        db.execute("UPDATE assignments SET skipped = ?, lease_expires = 0 WHERE id = ?",
                   (now, assignment_id))
      db.execute("INSERT INTO flags (item_id, labeler_id, comment, created) VALUES (?, ?, ?, ?) "
                 "ON CONFLICT (item_id, labeler_id) DO UPDATE SET comment = excluded.comment, "
                 "created = excluded.created, resolved = NULL, resolution = NULL",
                 (row["item_id"], labeler_id, comment, now))
      db.execute("UPDATE items SET held = ? WHERE id = ? AND held = 0", (HELD, row["item_id"]))

  def flags(self) -> list[sqlite3.Row]:
    """Flags no admin has resolved yet, oldest first, with their pairs and labelers, and `swapped`:
    how the flagger was shown the pair (1: B on the left; None if their assignment is gone)."""
    return self.read().execute(
        "SELECT f.id AS flag_id, f.comment, f.created AS flagged, lb.name AS labeler, i.*, "
        "a.swapped AS swapped "
        "FROM flags f JOIN items i ON i.id = f.item_id JOIN labelers lb ON lb.id = f.labeler_id "
        "LEFT JOIN assignments a ON a.item_id = f.item_id AND a.labeler_id = f.labeler_id "
        "WHERE f.resolved IS NULL ORDER BY f.created").fetchall()

  def resolve(self, item_id: int, action: str) -> None:
    """Resolves every open flag of a pair: `release` returns it to the queue, `drop` removes it
    (never served again, its labels left out of exports and reports; no later release brings it
    back)."""
    if action not in ("release", "drop"):
      raise Refused(f"unknown action {action!r} (release or drop)")
    with self.write() as db:
      if db.execute("UPDATE flags SET resolved = ?, resolution = ? WHERE item_id = ? AND "
                    "resolved IS NULL", (time.time(), action, item_id)).rowcount == 0:
        raise Refused(f"pair {item_id} has no open flag")
      if action == "release":
        db.execute("UPDATE items SET held = 0 WHERE id = ? AND held = ?", (item_id, HELD))
      else:
        db.execute("UPDATE items SET held = ? WHERE id = ?", (DROPPED, item_id))

  # Work out.

  def progress(self) -> dict[str, int]:
    """Counts for the admin: pairs, gold pairs, labels, pairs with k labels or more, pairs held by
    a flag, pairs dropped, and skips."""
    db = self.read()
    pairs, gold, held, dropped = db.execute(
        f"SELECT SUM(gold IS NULL), SUM(gold IS NOT NULL), SUM(held = {HELD}), "
        f"SUM(held = {DROPPED}) FROM items").fetchone()
    open_pairs = db.execute(f"SELECT COUNT(*) FROM items WHERE {self._open}").fetchone()[0]
    labels = db.execute("SELECT COUNT(*) FROM assignments WHERE done IS NOT NULL").fetchone()[0]
    skipped = db.execute("SELECT COUNT(*) FROM assignments WHERE skipped IS NOT NULL").fetchone()[0]
    return {"pairs": pairs or 0, "gold_pairs": gold or 0, "labels": labels,
            "complete_pairs": (pairs or 0) - open_pairs, "held_pairs": held or 0,
            "dropped_pairs": dropped or 0, "skipped": skipped}

  def my_progress(self, labeler_id: int) -> dict[str, int]:
    """The page's counter: the labeler's labels, everyone's, and the pairs short of k labels they
    have not been given (some may be leased to others just now)."""
    db = self.read()
    mine = db.execute("SELECT COUNT(*) FROM assignments WHERE labeler_id = ? AND done IS NOT NULL",
                      (labeler_id,)).fetchone()[0]
    everyone = db.execute("SELECT COUNT(*) FROM labels").fetchone()[0]
    open_pairs = db.execute(f"SELECT COUNT(*) FROM items INDEXED BY {self._index} WHERE "
                            f"{self._queued}").fetchone()[0]
    seen = db.execute("SELECT COUNT(*) FROM assignments a JOIN items i ON i.id = a.item_id "
                      "WHERE a.labeler_id = ? AND i.gold IS NULL AND "
                      "i.done_count < ? + i.extra_labels AND "
                      "i.held = 0", (labeler_id, self.settings.k)).fetchone()[0]
    return {"mine": mine, "everyone": everyone, "open_to_me": open_pairs - seen}

  def my_labels(self, labeler_id: int) -> list[sqlite3.Row]:
    """The labeler's own finished assignments, newest first."""
    return self.read().execute(
        "SELECT a.id AS assignment_id, a.swapped, l.shown, l.updated, i.prompt, i.title, "
        "i.input "
        "FROM labels l "
        "JOIN assignments a ON a.id = l.assignment_id JOIN items i ON i.id = a.item_id "
        "WHERE a.labeler_id = ? ORDER BY l.updated DESC", (labeler_id,)).fetchall()

  def last_label(self, labeler_id: int) -> int | None:
    """The assignment of the labeler's most recently saved label (what `U` on the page opens)."""
    row = self.read().execute(
        "SELECT a.id FROM labels l JOIN assignments a ON a.id = l.assignment_id "
        "WHERE a.labeler_id = ? ORDER BY l.updated DESC LIMIT 1", (labeler_id,)).fetchone()
    return row[0] if row else None

  def labels(self) -> list[sqlite3.Row]:
    """Every finished label with its pair and labeler, in the order they were first saved; the
    labels of pairs an admin dropped are left out."""
    return self.read().execute(
        "SELECT i.*, l.*, a.swapped, a.item_id, a.labeler_id, lb.name AS labeler FROM labels l "
        "JOIN assignments a ON a.id = l.assignment_id JOIN items i ON i.id = a.item_id "
        f"JOIN labelers lb ON lb.id = a.labeler_id WHERE i.held != {DROPPED} "
        "ORDER BY l.created, l.assignment_id").fetchall()

  # Review: an admin's decisions on pairs, and who labels.

  def set_also_labels(self, name: str, on: bool) -> None:
    """Whether the admin `name` is handed pairs too (labelers always are). Turning it off gives
    back an open assignment (labels stay)."""
    with self.write() as db:
      row = db.execute("SELECT id, is_admin FROM labelers WHERE name = ?", (name,)).fetchone()
      if row is None:
        raise Refused(f"no labeler named {name!r}")
      db.execute("UPDATE labelers SET also_labels = ? WHERE id = ?", (int(on), row["id"]))
      if row["is_admin"] and not on:
        db.execute("DELETE FROM assignments WHERE labeler_id = ? AND done IS NULL AND skipped "
                   "IS NULL", (row["id"],))

  def labels_too(self, labeler_id: int) -> bool:
    """Whether `next_assignment` hands this labeler pairs: a labeler, or an admin who opted in."""
    row = self.read().execute("SELECT is_admin, also_labels FROM labelers WHERE id = ?",
                              (labeler_id,)).fetchone()
    return row is not None and (not row["is_admin"] or bool(row["also_labels"]))

  def active_labelers(self) -> int:
    """The people who can be handed pairs: not revoked, and not an admin unless they opted in.
    Fewer than k of them and no pair can get its k labels (each goes to k distinct people)."""
    return self.read().execute(
        "SELECT COUNT(*) FROM labelers WHERE revoked IS NULL AND (is_admin = 0 OR "
        "also_labels != 0)").fetchone()[0]

  def review(self, item_id: int, action: str, admin_id: int) -> dict[str, int]:
    """Records an admin's decision on a (non-gold, not dropped) pair: `accept` marks its labels
    reviewed and accepted; `send_back` asks for one more label than the pair has or is already
    due (k + extra_labels, whichever is more): `extra_labels` grows so the pair is open again and
    goes to one labeler who has not been given it. Returns the pair's labels and wanted labels."""
    if action not in REVIEW_ACTIONS:
      raise Refused(f"unknown action {action!r} (accept or send_back)")
    k = self.settings.k
    with self.write() as db:
      item = db.execute("SELECT gold, held, done_count, extra_labels FROM items WHERE id = ?",
                        (item_id,)).fetchone()
      if item is None:
        raise Refused(f"no pair {item_id}")
      if item["gold"] is not None:
        raise Refused(f"pair {item_id} is a gold pair: it goes to everyone and is not reviewed")
      if item["held"] == DROPPED:
        raise Refused(f"pair {item_id} was dropped")
      extra = item["extra_labels"]
      if action == "send_back":
        extra = max(k + extra, item["done_count"]) + 1 - k
        db.execute("UPDATE items SET extra_labels = ? WHERE id = ?", (extra, item_id))
      db.execute("INSERT INTO reviews (item_id, action, admin_id, created) VALUES (?, ?, ?, ?)",
                 (item_id, action, admin_id, time.time()))
    return {"labels": item["done_count"], "wanted": k + extra}

  def reviews(self) -> dict[int, sqlite3.Row]:
    """Each reviewed pair's latest decision: item_id -> (action, admin, created, done_count,
    extra_labels, wanted)."""
    rows = self.read().execute(
        "SELECT r.item_id, r.action, r.created, lb.name AS admin, i.done_count, i.extra_labels, "
        "? + i.extra_labels AS wanted FROM reviews r JOIN labelers lb ON lb.id = r.admin_id "
        "JOIN items i ON i.id = r.item_id "
        "WHERE r.id = (SELECT MAX(id) FROM reviews WHERE item_id = r.item_id)",
        (self.settings.k,)).fetchall()
    return {r["item_id"]: r for r in rows}

  def flagged_items(self) -> dict[int, bool]:
    """Pairs anyone flagged: item_id -> whether a flag of it is still open."""
    rows = self.read().execute("SELECT item_id, SUM(resolved IS NULL) AS open FROM flags "
                               "GROUP BY item_id").fetchall()
    return {r["item_id"]: bool(r["open"]) for r in rows}
