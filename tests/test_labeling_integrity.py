"""A label lands on the pair the labeler saw, in the order they saw it, or nowhere: assignment ids
are never handed out twice (an earlier database is rebuilt so), a submission names its pair and
order and the store refuses any other, a revoked labeler's page and sign-in page say an admin
ended their access, and their kept answer lands on its own pair after they are let back in. Also
what each action tells the labeler afterwards. (The same sequence in Chromium:
tests/test_labeling_browser.py.)"""

import re
import sqlite3

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from rlhfjax.labeling import protocols  # noqa: E402
from rlhfjax.labeling import server  # noqa: E402
from rlhfjax.labeling import site as site_lib  # noqa: E402
from rlhfjax.labeling import store as store_lib  # noqa: E402

from test_labeling import (  # noqa: E402
    labeler, pair, page_ids, seen, shown, sign_in, stiennon_answers)


def make(tmp_path, n=3, **settings) -> store_lib.Store:
  s = store_lib.Store(str(tmp_path / "labels.db"),
                      store_lib.Settings(**{"k": 2, "gold_every": 0, **settings}))
  s.add_items([pair(i) for i in range(n)])
  return s


def test_assignment_ids_are_never_reused_after_a_delete(tmp_path):
  s = make(tmp_path)
  ada, bob = labeler(s, "ada"), labeler(s, "bob")
  first = s.next_assignment(ada)["assignment_id"]
  with s.write() as db:  # The newest assignment goes (as an expired, filled-in one does).
    db.execute("DELETE FROM assignments WHERE id = ?", (first,))
  assert s.next_assignment(bob)["assignment_id"] > first


def test_an_earlier_database_is_rebuilt_with_never_reused_ids(tmp_path):
  """A database made before AUTOINCREMENT keeps every assignment, id and label, and from then on
  never hands out an id again."""
  path = str(tmp_path / "old.db")
  s = store_lib.Store(path, store_lib.Settings(k=2, gold_every=0))
  s.add_items([pair(i) for i in range(3)])
  ada = labeler(s, "ada")
  done = s.next_assignment(ada)
  s.submit(ada, done["assignment_id"], 1.0, {"extra": {}}, {}, "x", None, **seen(done))
  last = s.next_assignment(ada)["assignment_id"]
  s.close()
  old = sqlite3.connect(path, isolation_level=None)  # The table as an earlier version made it.
  create = re.search(r"CREATE TABLE IF NOT EXISTS assignments \(.*?\);", store_lib.SCHEMA,
                     re.S).group(0)
  old.executescript("BEGIN; " + create.replace("IF NOT EXISTS assignments", "earlier").replace(
      " AUTOINCREMENT", "") + " INSERT INTO earlier SELECT * FROM assignments; "
      "DROP TABLE assignments; ALTER TABLE earlier RENAME TO assignments; "
      "DELETE FROM sqlite_sequence; COMMIT;")
  before = old.execute("SELECT * FROM assignments ORDER BY id").fetchall()
  assert len(before) == 2 and "AUTOINCREMENT" not in old.execute(
      "SELECT sql FROM sqlite_master WHERE name = 'assignments'").fetchone()[0]
  old.close()

  s = store_lib.Store(path, store_lib.Settings(k=2, gold_every=0))
  db = s.read()
  assert "AUTOINCREMENT" in db.execute(
      "SELECT sql FROM sqlite_master WHERE name = 'assignments'").fetchone()[0]
  assert [tuple(r) for r in db.execute("SELECT * FROM assignments ORDER BY id")] == before
  assert s.labels()[0]["assignment_id"] == done["assignment_id"]
  assert db.execute("PRAGMA foreign_key_check").fetchall() == []
  with s.write() as w:
    w.execute("DELETE FROM assignments WHERE id = ?", (last,))
  assert s.next_assignment(labeler(s, "bob"))["assignment_id"] > last


def test_the_store_refuses_a_label_for_another_pair_or_order(tmp_path):
  s = make(tmp_path)
  ada = labeler(s, "ada")
  row = s.next_assignment(ada)
  other = s.read().execute("SELECT id FROM items WHERE id != ?", (row["id"],)).fetchone()[0]
  for item_id, swapped in ((other, bool(row["swapped"])), (row["id"], not row["swapped"])):
    with pytest.raises(store_lib.Mismatch, match=f"assignment {row['assignment_id']} is pair "
                       f"{row['id']}"):
      s.submit(ada, row["assignment_id"], 1.0, {"extra": {}}, {}, "x", None, item_id=item_id,
               swapped=swapped)
  assert s.labels() == []
  assert s.submit(ada, row["assignment_id"], 1.0, {"extra": {}}, {}, "x", None,
                  **seen(row)) == "saved"


def test_a_label_for_another_databases_pair_of_the_same_id_is_refused(tmp_path):
  """Two databases served one after another at one address number their pairs and assignments
  alike: a label a browser kept for the first names its pair's uid (a hash of its texts), so the
  second refuses it even where the pair's id, the order and the assignment's id all match. Each
  database has an id of its own, kept across openings, that the page keys what it keeps with."""
  first, second = make(tmp_path / "pilot"), store_lib.Store(
      str(tmp_path / "round" / "labels.db"), store_lib.Settings(k=2, gold_every=0))
  second.add_items([pair(10 + i) for i in range(3)])
  ada_first, ada_second = labeler(first, "ada"), labeler(second, "ada")
  kept, row = first.next_assignment(ada_first), second.next_assignment(ada_second)
  with second.write() as db:  # The same order as the first database's, whatever was drawn.
    db.execute("UPDATE assignments SET swapped = ? WHERE id = ?",
               (kept["swapped"], row["assignment_id"]))
  assert (kept["assignment_id"], kept["id"]) == (row["assignment_id"], row["id"])
  assert kept["uid"] != row["uid"]
  with pytest.raises(store_lib.Mismatch, match="other texts"):
    second.submit(ada_second, row["assignment_id"], 1.0, {"extra": {}}, {}, "x", None,
                  **seen(kept))
  assert second.labels() == []
  assert first.database != second.database and len(first.database) == 16
  path = first.path
  first.close()
  assert store_lib.Store(path, store_lib.Settings(k=2, gold_every=0)).database == first.database


def test_an_answer_from_a_page_drawn_before_the_label_changed_is_refused(tmp_path):
  """Two tabs show one open pair; both answers wait while the server is down, and the newer
  arrives first: the older names the label its page showed (none) and is refused, not stored over
  the newer. A page drawn after (the label's edit page) revises it; a retry is acknowledged."""
  s = make(tmp_path)
  ada = labeler(s, "ada")
  row = s.next_assignment(ada)
  send = lambda preference, submission, base: s.submit(
      ada, row["assignment_id"], preference, {"extra": {}}, {}, submission, None, base=base,
      **seen(row))
  assert send(1.0, "newer", "") == "saved"
  with pytest.raises(store_lib.Stale, match="changed from another page"):
    send(0.0, "older", "")
  assert [r["preference"] for r in s.labels()] == [1.0]
  assert send(1.0, "newer", "") == "repeated"
  assert s.assignment(ada, row["assignment_id"])["submission"] == "newer"
  assert send(0.0, "edited", "newer") == "revised"
  assert [r["preference"] for r in s.labels()] == [0.0]


class Site:
  def __init__(self, tmp_path, k=2):
    self.store = make(tmp_path, k=k)
    self.app = server.create_app(self.store, protocols.get("stiennon"), login_per_minute=100)

  def client(self, name: str, admin: bool = False) -> TestClient:
    """Signed in (an admin stays off the labeling page, which would hand them a pair)."""
    c = TestClient(self.app, base_url="http://testserver")
    response = sign_in(c, self.store.add_labeler(name, admin, 60), follow_redirects=not admin)
    assert response.status_code == (303 if admin else 200)
    return c


def body(csrf, answers, shown_as, submission="s") -> dict:
  return {"csrf": csrf, "submission": submission, "answers": answers, **shown_as}


def test_the_site_refuses_an_answer_naming_another_pair_with_a_message(tmp_path):
  site = Site(tmp_path)
  ada = site.client("ada")
  csrf, assignment = page_ids(ada.get("/").text)
  mine = shown(ada, assignment)
  for wrong in ({**mine, "pair": mine["pair"] + 1}, {**mine, "swapped": 1 - mine["swapped"]}):
    response = ada.post(f"/label/{assignment}", json=body(csrf, stiennon_answers(2), wrong))
    assert response.status_code == 409
    assert f"assignment {assignment} is pair {mine['pair']}" in response.json()["error"]
  response = ada.post(f"/label/{assignment}",
                      json=body(csrf, stiennon_answers(2), {**mine, "uid": "0" * 24}))
  assert response.status_code == 409 and "other texts" in response.json()["error"]
  response = ada.post(f"/label/{assignment}",
                      json=body(csrf, stiennon_answers(2), {**mine, "base": "not-shown"}))
  assert response.status_code == 409 and "changed from another page" in response.json()["error"]
  response = ada.post(f"/label/{assignment}", json=body(csrf, stiennon_answers(2), {}))
  assert response.status_code == 400 and "which pair" in response.json()["error"]
  assert site.store.labels() == []
  response = ada.post(f"/label/{assignment}", json=body(csrf, stiennon_answers(2), mine))
  assert response.status_code == 200 and response.json()["status"] == "saved"


def test_revoked_then_let_back_in_the_kept_answer_lands_on_its_own_pair(tmp_path):
  """The issue's sequence: a labeler's pair is open, an admin revokes them, their page sends the
  answer (refused: an admin signed them out, the sign-in page says so), the admin invites them
  again, they sign in, and the kept answer is sent again: stored on the pair it was given on, in
  the order it was shown, and the next pair is a new one."""
  site = Site(tmp_path, k=2)
  boss = site.client("boss", admin=True)
  ada = site.client("ada")
  csrf, assignment = page_ids(ada.get("/").text)
  mine = shown(ada, assignment)
  boss_csrf = re.search(r'name="csrf" value="([^"]+)"', boss.get("/admin/labelers").text).group(1)
  assert boss.post("/admin/labelers/ada/revoke", data={"csrf": boss_csrf}).status_code == 200

  answer = body(csrf, stiennon_answers(2), mine, submission="kept")
  response = ada.post(f"/label/{assignment}", json=answer)
  assert response.status_code == 401 and response.json()["reason"] == "revoked"
  page = ada.get("/")
  assert page.url.path == "/login" and 'id="revoked"' in page.text
  assert "An admin has signed you out" in page.text
  assert site.store.labels() == []
  bob = site.client("bob")  # Meanwhile the pair may go to someone else.
  assert page_ids(bob.get("/").text)[1] != assignment

  again = TestClient(site.app, base_url="http://testserver")
  assert sign_in(again, site.store.add_labeler("ada", False, 60)).status_code == 200
  assert 'id="revoked"' not in again.get("/login").text
  csrf, now = page_ids(again.get("/").text)
  assert now == assignment  # The pair still needs her label: her assignment is hers again.
  response = again.post(f"/label/{assignment}", json={**answer, "csrf": csrf})
  assert response.status_code == 200 and response.json()["status"] == "saved"
  (label,) = site.store.labels()
  assert (label["labeler"], label["assignment_id"], label["item_id"], label["swapped"]) == \
      ("ada", int(assignment), mine["pair"], mine["swapped"])
  assert label["preference"] == (1.0 if mine["swapped"] else 0.0)
  assert page_ids(again.get("/").text)[1] not in (assignment, None)


def test_a_kept_answer_for_a_pair_others_filled_is_refused_not_moved(tmp_path):
  """Revoked with a pair open, and the pair filled by others before they are back: the kept answer
  is refused (404), and no other assignment of theirs receives it."""
  site = Site(tmp_path, k=1)
  ada = site.client("ada")
  csrf, assignment = page_ids(ada.get("/").text)
  mine = shown(ada, assignment)
  site.store.revoke("ada")
  bob = site.client("bob")
  bob_csrf, bobs = page_ids(bob.get("/").text)
  assert bobs == assignment or shown(bob, bobs)["pair"] == mine["pair"]
  assert bob.post(f"/label/{bobs}", json=body(bob_csrf, stiennon_answers(8),
                                              shown(bob, bobs))).status_code == 200
  again = TestClient(site.app, base_url="http://testserver")
  assert sign_in(again, site.store.add_labeler("ada", False, 60)).status_code == 200
  csrf, now = page_ids(again.get("/").text)
  assert now != assignment
  response = again.post(f"/label/{assignment}", json=body(csrf, stiennon_answers(2), mine))
  assert response.status_code == 404
  response = again.post(f"/label/{now}", json=body(csrf, stiennon_answers(2), mine))
  assert response.status_code == 409
  assert [r["labeler"] for r in site.store.labels()] == ["bob"]


@pytest.mark.parametrize("action, said", [("skip", "Skipped"), ("flag", "Flag sent"),
                                          ("label", "Saved.")])
def test_each_action_is_acknowledged_on_the_next_page(tmp_path, action, said):
  site = Site(tmp_path)
  ada = site.client("ada")
  csrf, assignment = page_ids(ada.get("/").text)
  if action == "label":
    form = {"csrf": csrf, **shown(ada, assignment), **stiennon_answers(3)}
    response = ada.post(f"/label/{assignment}", data=form, follow_redirects=False)
  else:
    response = ada.post(f"/label/{assignment}/{action}", data={"csrf": csrf, "comment": "x"},
                        follow_redirects=False)
  assert response.status_code == 303
  page = ada.get(response.headers["location"]).text
  status = re.search(r'<span id="status"[^>]*>(.*?)</span>', page, re.S).group(1)
  assert said in status
  assert ("<kbd>U</kbd> changes your last label" in status) == (action == "label")
  assert said not in ada.get("/").text  # Said once, after the action.


def test_the_counter_shows_the_labelers_share_and_goal(tmp_path):
  s = make(tmp_path, n=4, k=2)
  app = server.create_app(s, protocols.get("stiennon"), goal=40)
  ada = TestClient(app, base_url="http://testserver")
  bob = TestClient(app, base_url="http://testserver")
  for c, name in ((ada, "ada"), (bob, "bob")):
    assert sign_in(c, s.add_labeler(name, False, 60)).status_code == 200
  for c, n in ((ada, 3), (bob, 1)):
    for i in range(n):
      csrf, assignment = page_ids(c.get("/").text)
      assert c.post(f"/label/{assignment}", json=body(csrf, stiennon_answers(2),
                                                      shown(c, assignment), f"{i}")).is_success
  page = ada.get("/mine").text
  assert re.search(r'Done <span id="done">3</span> of <span id="goal">40</span>', page)
  assert '<span class="item" id="share">75% of all labels</span>' in page


def test_times_are_marked_up_for_local_time():
  assert str(site_lib.when(1_700_000_000.0)) == (
      '<time datetime="2023-11-14T22:13:20+00:00">2023-11-14 22:13 UTC</time>')
  assert site_lib.when(None) == "—"
