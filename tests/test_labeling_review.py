"""The admins' review of the labeling site: flags in the flagger's own left/right, every answer on
the disagreement page, accepting a pair or sending it back for one more label, a labeler's labels
filtered, the warning when fewer people label than each pair asks for, and admins handed pairs
only when they ask."""

import json
import logging
import re
import sqlite3
import time

import pytest

pytest.importorskip("starlette")

from rlhfjax.labeling import report  # noqa: E402
from rlhfjax.labeling import store as store_lib  # noqa: E402
from rlhfjax.labeling import tasks  # noqa: E402

from conftest import load_config  # noqa: E402
from test_labeling import (  # noqa: E402
    BINARY, XSS, Site, finish, form_csrf, labeler, lid, make_store, page_ids, post_label,
    stiennon_answers)


def admin(s: store_lib.Store, name: str = "root") -> int:
  s.add_labeler(name, True, 60)
  return lid(s, name)


def assignment_of(s: store_lib.Store, assignment: str) -> sqlite3.Row:
  return s.read().execute("SELECT * FROM assignments WHERE id = ?", (int(assignment),)).fetchone()


def set_swapped(s: store_lib.Store, assignment: str, swapped: int) -> None:
  """Fixes the side the labeler was shown (before they answer), so a test knows it."""
  with s.write() as db:
    db.execute("UPDATE assignments SET swapped = ? WHERE id = ?", (swapped, int(assignment)))


def sections(html: str, css_class: str) -> dict[str, str]:
  """The page's `<section class="css_class" data-pair=N>` blocks, by pair."""
  return {m.group(1): m.group(2) for m in re.finditer(
      rf'<section class="{css_class}[^"]*" data-pair="(\d+)"[^>]*>(.*?)</section>', html, re.S)}


# 1. Flags in the flagger's orientation.

def test_each_flag_shows_the_sides_its_flagger_saw(tmp_path):
  site = Site(tmp_path, gold_every=0, k=2)
  ada, bob = site.client("ada"), site.client("bob")  # Both hold the first pair.
  (ca, a), (cb, b) = page_ids(ada.get("/").text), page_ids(bob.get("/").text)
  set_swapped(site.store, a, 1)  # Ada saw B on the left, Bob saw A there.
  set_swapped(site.store, b, 0)
  for who, csrf, x, words in ((ada, ca, a, "the left one is wrong"),
                              (bob, cb, b, "the right one is cut off")):
    assert who.post(f"/label/{x}/flag", data={"csrf": csrf, "comment": words},
                    follow_redirects=False).status_code == 303
  flags = {f["labeler"]: f for f in site.store.flags()}
  assert (flags["ada"]["swapped"], flags["bob"]["swapped"]) == (1, 0)
  root = site.client("root", admin=True)
  page = root.get("/admin/flags").text
  assert "<script>alert" not in page and "&lt;script&gt;" in page
  found = re.findall(r'<section class="flag".*?</section>', page, re.S)
  by_name = {re.search(r"<strong>(\w+)</strong>", f).group(1): f for f in found}
  assert "left = B, right = A" in by_name["ada"] and "left = A, right = B" in by_name["bob"]
  pair = site.store.assignment(lid(site.store, "ada"), int(a))
  for name, left, right in (("ada", "response_b", "response_a"), ("bob", "response_a",
                                                                  "response_b")):
    sides = re.findall(r'<article data-side="(\w+)"><h3>(.*?)</h3><div class="text">(.*?)</div>',
                       by_name[name], re.S)
    assert [s[0] for s in sides] == ["left", "right"]
    assert sides[0][1].startswith("left = " + left[-1].upper())
    assert sides[1][1].startswith("right = " + right[-1].upper())
    # The texts in the order the flagger saw them (escaped as the page escapes them).
    escape = lambda t: t.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace(
        '"', "&#34;").replace("'", "&#39;")
    assert (sides[0][2], sides[1][2]) == (escape(pair[left]), escape(pair[right]))


def test_a_flag_whose_assignment_is_gone_and_one_response_flags(tmp_path):
  s = make_store(tmp_path, n=1, gold_every=0)
  ada = labeler(s, "ada")
  row = s.next_assignment(ada)
  s.flag(ada, row["assignment_id"], "odd")
  with s.write() as db:  # As if an older version had deleted it.
    db.execute("DELETE FROM assignments")
  assert s.flags()[0]["swapped"] is None
  site = Site(tmp_path / "binary", protocol=BINARY, gold_every=0)
  ada_c = site.client("ada")
  csrf, x = page_ids(ada_c.get("/").text)
  ada_c.post(f"/label/{x}/flag", data={"csrf": csrf, "comment": "odd"})
  page = site.client("root", admin=True).get("/admin/flags").text
  assert 'class="flag"' in page and "left =" not in page and 'class="orientation"' not in page


# 2. Disagreements with every answer.

def test_disagreement_page_shows_every_answer_rating_and_axis_in_a_b_terms(tmp_path):
  site = Site(tmp_path, gold_every=0, k=2)
  ada, bob = site.client("ada"), site.client("bob")
  (ca, a), (cb, b) = page_ids(ada.get("/").text), page_ids(bob.get("/").text)
  set_swapped(site.store, a, 1)
  set_swapped(site.store, b, 0)
  # Ada (B on her left): her left "better" (2), left 3s and right 6s -> B better, 8 in A/B order,
  # A's axes 6, B's 3. Bob (A on his left): left definitely better (1), left 5s, right 1s.
  assert post_label(ada, a, ca, stiennon_answers(2, left=3, right=6)).status_code == 200
  assert post_label(bob, b, cb, stiennon_answers(1, left=5, right=1)).status_code == 200
  page = site.client("root", admin=True).get("/admin/disagreements").text
  assert page.count('class="disagreement"') == 1 and "<script>alert" not in page
  rows = {m.group(1): m.group(0) for m in re.finditer(r"<tr><td>(\w+)</td>.*?</tr>", page, re.S)}
  expect = {"ada": ("8: B better", "B", "8", "B (right: A)", "A 6 · B 3"),
            "bob": ("1: A definitely better", "A", "1", "A (right: B)", "A 5 · B 1")}
  for name, (words, preferred, rating, left, axis) in expect.items():
    row = rows[name]
    assert f"<td>{name}</td><td>{words}</td>" in row
    assert f'<td class="preferred">{preferred}</td>' in row
    assert f'<td class="rating">{rating}</td>' in row and f'<td class="left">{left}</td>' in row
    for q in ("overall", "accuracy", "coverage", "coherence"):
      assert f'<td class="axis" data-axis="{q}">{axis}</td>' in row
  for q in ("overall", "accuracy", "coverage", "coherence"):
    assert f"<th>{q} (A · B)</th>" in page


def test_label_answers_hand_worked():
  row = {"labeler": "a", "preference": 1.0, "swapped": 1,
         "answers": json.dumps({"axes_a": {"coherence": 2, "overall": 7},
                                "axes_b": {"overall": 1, "coherence": 4},
                                "extra": {"confidence": 7, "strength": "slightly"}})}
  got = report.label_answers(row)
  assert got == {"labeler": "a", "answer": "7: B somewhat better", "preferred": "B", "rating": 7,
                 "axes": [("overall", 7, 1), ("coherence", 2, 4)],  # The protocol's order.
                 "extra": {"strength": "slightly"}, "left": "B"}
  alpaca = {**row, "preference": 0.5, "swapped": 0,
            "answers": json.dumps({"axes_a": None, "axes_b": None, "extra": {}})}
  assert report.label_answers(alpaca) == {"labeler": "a", "answer": "tie", "preferred": "tie",
                                          "rating": None, "axes": [], "extra": {}, "left": "A"}
  thumbs = report.label_answers({**alpaca, "preference": 1.0}, single=True)
  assert (thumbs["answer"], thumbs["preferred"], thumbs["left"]) == ("thumbs up", "thumbs up",
                                                                     None)
  base = {"gold": None, "swapped": 0, "answers": '{"extra": {}}'}
  found = report.disagreements([{**base, "item_id": 1, "labeler": "a", "preference": 0.0},
                                {**base, "item_id": 1, "labeler": "b", "preference": 1.0}])
  assert [d["preferred"] for d in found[0]["labels"]] == ["A", "B"]


# 3. Accept, or send back for one more label.

def test_a_sent_back_pair_goes_to_exactly_one_new_labeler_never_to_one_who_labeled_it(tmp_path):
  s = make_store(tmp_path, n=2, k=2, gold_every=0)
  root = admin(s)
  a, b, c, d = (labeler(s, n) for n in "abcd")
  rows = {}
  for who in (a, b):
    for _ in range(2):
      row = s.next_assignment(who)
      rows.setdefault(row["id"], []).append(who)
      finish(s, who, row)
  item = min(rows)
  assert s.progress()["complete_pairs"] == 2 and s.next_assignment(c) is None
  assert s.review(item, "send_back", root) == {"labels": 2, "wanted": 3}
  assert s.progress()["complete_pairs"] == 1
  assert s.my_progress(a)["open_to_me"] == 0 and s.my_progress(c)["open_to_me"] == 1
  assert s.next_assignment(a) is None and s.next_assignment(b) is None  # They labeled it.
  got = s.next_assignment(c)
  assert got["id"] == item
  assert s.next_assignment(d) is None  # Leased to c: one more label, not two.
  finish(s, c, got)
  assert s.next_assignment(d) is None and s.next_assignment(c) is None
  done = s.read().execute("SELECT done_count, extra_labels FROM items WHERE id = ?",
                          (item,)).fetchone()
  labels = s.read().execute("SELECT COUNT(*) FROM labels l JOIN assignments a ON "
                            "a.id = l.assignment_id WHERE a.item_id = ?", (item,)).fetchone()[0]
  assert tuple(done) == (3, 1) and labels == 3  # The counts stay honest.
  assert s.progress()["complete_pairs"] == 2
  # Sent back again: the fourth label goes to d, the only one left who has not labeled it.
  assert s.review(item, "send_back", root) == {"labels": 3, "wanted": 4}
  assert all(s.next_assignment(w) is None for w in (a, b, c))
  assert s.next_assignment(d)["id"] == item
  reviews = s.reviews()
  assert reviews[item]["action"] == "send_back" and reviews[item]["admin"] == "root"
  assert (reviews[item]["done_count"], reviews[item]["wanted"]) == (3, 4)


def test_sending_back_an_open_pair_asks_for_one_more_than_it_was_due(tmp_path):
  s = make_store(tmp_path, n=1, k=2, gold_every=0)
  root = admin(s)
  a, b, c, d = (labeler(s, n) for n in "abcd")
  finish(s, a, s.next_assignment(a))
  item = s.read().execute("SELECT id FROM items").fetchone()[0]
  assert s.review(item, "send_back", root) == {"labels": 1, "wanted": 3}
  for who in (b, c):
    finish(s, who, s.next_assignment(who))
  assert s.next_assignment(d) is None  # 3 labels: done.


def test_a_sent_back_pair_leased_and_abandoned_returns_to_the_queue(tmp_path):
  s = make_store(tmp_path, n=1, k=1, gold_every=0, lease_s=0.2)
  root = admin(s)
  a, b, c = (labeler(s, n) for n in "abc")
  finish(s, a, s.next_assignment(a))
  item = s.read().execute("SELECT id FROM items").fetchone()[0]
  s.review(item, "send_back", root)
  held = s.next_assignment(b)
  assert held["id"] == item and s.next_assignment(c) is None
  time.sleep(0.3)
  assert s.next_assignment(c)["id"] == item  # b's lease ran out.
  assert s.next_assignment(b) is None  # b's expired open assignment is given up: c holds it.


def test_review_refuses_gold_dropped_unknown_pairs_and_actions(tmp_path):
  s = make_store(tmp_path, n=2, gold=1, gold_every=0)
  root = admin(s)
  ids = [r[0] for r in s.read().execute("SELECT id FROM items ORDER BY id")]
  gold = s.read().execute("SELECT id FROM items WHERE gold IS NOT NULL").fetchone()[0]
  with pytest.raises(store_lib.Refused, match="gold pair"):
    s.review(gold, "send_back", root)
  with pytest.raises(store_lib.Refused, match="unknown action"):
    s.review(ids[0], "burn", root)
  with pytest.raises(store_lib.Refused, match="no pair"):
    s.review(999, "accept", root)
  a = labeler(s, "a")
  row = s.next_assignment(a)
  s.flag(a, row["assignment_id"], "bad")
  s.resolve(row["id"], "drop")
  with pytest.raises(store_lib.Refused, match="dropped"):
    s.review(row["id"], "send_back", root)
  assert not s.reviews()
  s.review(ids[1], "accept", root)
  assert s.reviews()[ids[1]]["action"] == "accept"
  s.review(ids[1], "send_back", root)  # The latest decision counts.
  assert s.reviews()[ids[1]]["action"] == "send_back"


def test_accept_and_send_back_from_the_disagreement_page(tmp_path, caplog):
  caplog.set_level(logging.INFO, logger="rlhfjax.labeling")
  site = Site(tmp_path, gold_every=0, k=2)
  ada, bob = site.client("ada"), site.client("bob")
  (ca, a), (cb, b) = page_ids(ada.get("/").text), page_ids(bob.get("/").text)
  set_swapped(site.store, a, 0)
  set_swapped(site.store, b, 0)
  post_label(ada, a, ca, stiennon_answers(1))
  post_label(bob, b, cb, stiennon_answers(9))
  root = site.client("root", admin=True)
  page = root.get("/admin/disagreements").text
  item = re.search(r'class="disagreement" data-pair="(\d+)"', page).group(1)
  csrf = form_csrf(page)
  assert "not reviewed" in sections(page, "disagreement")[item]
  review = f"/admin/pairs/{item}/review"
  # Labelers, a missing or wrong token, another site: refused, nothing recorded.
  assert ada.post(review, data={"csrf": ca, "action": "accept"}).status_code == 403
  assert root.post(review, data={"action": "accept"}).status_code == 403
  assert root.post(review, data={"csrf": cb, "action": "accept"}).status_code == 403
  assert root.post(review, data={"csrf": csrf, "action": "accept"},
                   headers={"Origin": "http://evil.example"}).status_code == 403
  assert root.post(review, data={"csrf": csrf, "action": "burn"}).status_code == 400
  assert root.post("/admin/pairs/999/review", data={"csrf": csrf, "action": "accept"}
                   ).status_code == 400
  assert not site.store.reviews()
  got = root.post(review, data={"csrf": csrf, "action": "accept",
                                "back": "/admin/disagreements?hide=accepted"},
                  follow_redirects=False)
  assert got.status_code == 303 and got.headers["location"] == "/admin/disagreements?hide=accepted"
  assert "accepted by root" in sections(root.get("/admin/disagreements").text,
                                        "disagreement")[item]
  hidden = root.get("/admin/disagreements?hide=accepted").text
  assert 'class="disagreement"' not in hidden and 'href="/admin/disagreements"' in hidden
  # Elsewhere than an admin page: back to the disagreements.
  got = root.post(review, follow_redirects=False, data={
      "csrf": csrf, "action": "send_back", "back": "https://evil.example"})
  assert got.headers["location"] == "/admin/disagreements"
  assert "sent back by root" in sections(root.get("/admin/disagreements?hide=accepted").text,
                                         "disagreement")[item]
  counts = "Reviewed pairs: {} accepted, {} sent\n    back for another label ({} still waiting"
  assert counts.format(0, 1, 1) in root.get("/admin").text
  carol = site.client("carol")
  cc, c = page_ids(carol.get("/").text)
  assert assignment_of(site.store, c)["item_id"] == int(item)  # The pair came back, to carol.
  assert post_label(carol, c, cc, stiennon_answers(5)).status_code == 200
  assert counts.format(0, 1, 0) in root.get("/admin").text
  text = caplog.text
  assert f"review: root chose accept for pair {item} (2 labels, 2 wanted)" in text
  assert f"review: root chose send_back for pair {item} (2 labels, 3 wanted)" in text


def test_an_earlier_database_gains_review_columns_and_queue_index(tmp_path):
  path = str(tmp_path / "old.db")
  old = sqlite3.connect(path)
  old.executescript(store_lib.SCHEMA.replace(",\n  extra_labels INTEGER NOT NULL DEFAULT 0", "")
                    .replace(",\n  also_labels INTEGER NOT NULL DEFAULT 0", ""))
  old.execute("CREATE INDEX items_queued_3 ON items (position) WHERE gold IS NULL AND "
              "done_count < 3 AND held = 0")
  old.execute("INSERT INTO items (uid, prompt, title, subreddit, input, response_a, response_b, "
              "policy_a, policy_b, prompt_id, split, position) VALUES ('u', 'p', 't', 's', '', "
              "'a', 'b', 'x', 'y', 'i', 'train', 0)")
  old.execute("INSERT INTO labelers (name, is_admin, created) VALUES ('root', 1, 0)")
  old.commit()
  old.close()
  s = store_lib.Store(path)
  assert "extra_labels" in {r[1] for r in s.read().execute("PRAGMA table_info(items)")}
  assert "also_labels" in {r[1] for r in s.read().execute("PRAGMA table_info(labelers)")}
  indexes = {r[0] for r in s.read().execute("SELECT name FROM sqlite_master WHERE type='index'")}
  assert "items_wanted_3" in indexes and "items_queued_3" not in indexes
  with pytest.raises(store_lib.Refused):  # An admin of the old file has not opted in.
    s.next_assignment(lid(s, "root"))
  assert s.next_assignment(labeler(s, "ada"))["uid"] == "u"
  plan = " ".join(r[3] for r in s.read().execute(
      f"EXPLAIN QUERY PLAN SELECT id FROM items INDEXED BY items_wanted_3 WHERE {s._queued} "
      "ORDER BY position LIMIT 1"))  # INDEXED BY fails when the index cannot serve the query.
  assert "items_wanted_3" in plan  # The queue still reads its partial index.


# 4. A labeler's labels, filtered.

def test_labels_page_filters_by_labeler_and_status(tmp_path):
  site = Site(tmp_path, gold_every=0, k=2)
  ada, bob, carol = site.client("ada"), site.client("bob"), site.client("carol")
  (ca, a), (cb, b) = page_ids(ada.get("/").text), page_ids(bob.get("/").text)
  for x in (a, b):
    set_swapped(site.store, x, 0)
  post_label(ada, a, ca, stiennon_answers(1))  # The first pair: ada and bob disagree.
  post_label(bob, b, cb, stiennon_answers(9))
  split = assignment_of(site.store, a)["item_id"]
  cc, c = page_ids(carol.get("/").text)  # The second pair: carol, then bob flags it after labeling.
  set_swapped(site.store, c, 0)
  post_label(carol, c, cc, stiennon_answers(3), submission="c")
  cb, b2 = page_ids(bob.get("/").text)
  set_swapped(site.store, b2, 0)  # Both prefer A: no disagreement.
  post_label(bob, b2, cb, stiennon_answers(4), submission="b2")
  assert assignment_of(site.store, b2)["item_id"] == assignment_of(site.store, c)["item_id"]
  assert bob.post(f"/label/{b2}/flag", data={"csrf": cb, "comment": XSS}).status_code == 200
  root = site.client("root", admin=True)
  root_csrf = form_csrf(root.get("/admin").text)
  root.post(f"/admin/pairs/{split}/review", data={"csrf": root_csrf, "action": "accept"})

  def shown(query: str) -> list[tuple[str, str]]:
    page = root.get(f"/admin/labels{query}")
    assert page.status_code == 200 and "<script>alert" not in page.text
    return sorted((m.group(2), m.group(1)) for m in re.finditer(
        r'data-assignment="(\d+)">.*?<p class="meta">(\w+),', page.text, re.S))

  assert shown("") == sorted([("ada", a), ("bob", b), ("carol", c), ("bob", b2)])
  assert shown("?labeler=bob") == [("bob", b), ("bob", b2)]
  assert shown("?labeler=bob&status=all") == [("bob", b), ("bob", b2)]
  assert shown("?status=disagreement") == [("ada", a), ("bob", b)]
  assert shown("?labeler=bob&status=flagged") == [("bob", b2)]
  assert shown("?status=flagged") == sorted([("bob", b2), ("carol", c)])
  assert shown("?status=accepted") == [("ada", a), ("bob", b)]
  assert shown("?labeler=carol&status=accepted") == []
  assert shown("?labeler=nobody") == []
  page = root.get("/admin/labels?labeler=ada").text
  assert '<option value="ada" selected>ada</option>' in page and "accepted by root" in page
  assert "<td>ada</td><td>1: A definitely better</td>" in page
  assert root.get("/admin/labels?status=everything").status_code == 400
  assert ada.get("/admin/labels").status_code == 403
  # The labelers page links each one's labels; a review form comes back to the filtered list.
  assert 'href="/admin/labels?labeler=ada"' in root.get("/admin/labelers").text
  got = root.post(f"/admin/pairs/{split}/review", follow_redirects=False, data={
      "csrf": root_csrf, "action": "accept", "back": "/admin/labels?labeler=ada&status=accepted"})
  assert got.headers["location"] == "/admin/labels?labeler=ada&status=accepted"


# 5. Fewer people than k.

def test_warning_when_k_exceeds_the_people_who_label(tmp_path):
  site = Site(tmp_path, gold_every=0, k=3)
  root = site.client("root", admin=True)
  s = site.store
  assert s.active_labelers() == 0
  for path in ("/admin", "/admin/labelers"):
    page = root.get(path).text
    assert 'id="k-warning"' in page and "only 0 people" in page
  site.client("ada"), site.client("bob")
  assert s.active_labelers() == 2 and "only 2 people" in root.get("/admin").text
  s.set_also_labels("root", True)  # An admin who labels counts.
  assert s.active_labelers() == 3
  assert 'id="k-warning"' not in root.get("/admin").text
  assert 'id="k-warning"' not in root.get("/admin/labelers").text
  s.revoke("bob")  # A revoked labeler does not.
  assert s.active_labelers() == 2 and 'id="k-warning"' in root.get("/admin/labelers").text


def test_label_server_warns_at_start_up(tmp_path, monkeypatch, capsys):
  uvicorn = pytest.importorskip("uvicorn")
  served = []
  monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.append(kw))
  config = load_config("labeling", "tiny")
  config.labeling.update(db=str(tmp_path / "labels.db"), labels_per_pair=2)
  s, _ = tasks.open_store(config, str(tmp_path))
  s.add_labeler("ada", False, 60)
  tasks.serve(config, str(tmp_path))
  out = capsys.readouterr().out
  assert served and "label_server: warning: each pair asks for 2 labels" in out
  assert "only 1 person can be handed pairs" in out
  s.add_labeler("bob", False, 60)
  tasks.serve(config, str(tmp_path))
  assert "warning" not in capsys.readouterr().out


# 6. Admins label only when they ask.

def test_admins_are_handed_pairs_only_after_opting_in(tmp_path):
  s = make_store(tmp_path, n=2, k=1, gold_every=0)
  root, ada = admin(s), labeler(s, "ada")
  with pytest.raises(store_lib.Refused, match="only when they choose"):
    s.next_assignment(root)
  assert not s.labels_too(root) and s.labels_too(ada)
  s.set_also_labels("root", True)
  held = s.next_assignment(root)
  assert held is not None and s.labels_too(root)
  s.set_also_labels("root", False)  # The open pair is given back, to ada.
  with pytest.raises(store_lib.Refused):
    s.next_assignment(root)
  assert s.next_assignment(ada)["id"] == held["id"]
  s.set_also_labels("ada", False)  # Means nothing for a labeler.
  assert s.next_assignment(ada)["id"] == held["id"]
  with pytest.raises(store_lib.Refused, match="no labeler"):
    s.set_also_labels("nobody", True)


def test_an_admins_home_is_the_admin_page_until_they_choose_to_label(tmp_path, caplog):
  caplog.set_level(logging.INFO, logger="rlhfjax.labeling")
  site = Site(tmp_path, gold_every=0)
  root, ada = site.client("root", admin=True), site.client("ada")
  home = root.get("/", follow_redirects=False)
  assert home.status_code == 303 and home.headers["location"] == "/admin"
  page = root.get("/").text
  assert 'id="label-too"' in page and "data-assignment" not in page
  csrf = form_csrf(page)
  form = {"csrf": csrf, "name": "root", "on": "1", "back": "/"}
  ada_csrf = form_csrf(ada.get("/").text)
  assert ada.post("/admin/also-labels", data={**form, "csrf": ada_csrf}).status_code == 403
  assert root.post("/admin/also-labels", data={**form, "csrf": "x"}).status_code == 403
  assert root.post("/admin/also-labels", data={**form, "name": "nobody"}).status_code == 400
  assert not site.store.labels_too(lid(site.store, "root"))
  got = root.post("/admin/also-labels", data=form, follow_redirects=False)
  assert got.status_code == 303 and got.headers["location"] == "/"
  _, assignment = page_ids(root.get("/").text)  # Now a pair.
  assert 'id="stop-labeling"' in root.get("/admin").text
  root.post("/admin/also-labels", data={**form, "on": "0", "back": "/admin"})
  assert root.get("/", follow_redirects=False).headers["location"] == "/admin"
  assert "who labels: root now hands pairs to root" in caplog.text
  assert "who labels: root no longer hands pairs to root" in caplog.text


def test_invite_an_admin_who_also_labels(tmp_path):
  site = Site(tmp_path, gold_every=0)
  root = site.client("root", admin=True)
  page = root.get("/admin/labelers").text
  csrf = form_csrf(page)
  assert 'name="also_labels"' in page
  root.post("/admin/labelers", data={"csrf": csrf, "name": "eve", "admin": "on",
                                     "also_labels": "on"})
  root.post("/admin/labelers", data={"csrf": csrf, "name": "max", "admin": "on"})
  team = {r["name"]: r for r in site.store.labelers()}
  assert (team["eve"]["also_labels"], team["max"]["also_labels"]) == (1, 0)
  page = root.get("/admin/labelers").text
  row = lambda n: re.search(rf'<tr data-name="{n}">(.*?)</tr>', page, re.S).group(1)
  assert "labels pairs too" in row("eve") and "Stop handing pairs" in row("eve")
  assert "does not label" in row("max") and "Hand pairs too" in row("max")
  # The toggle on the labelers page for another admin.
  root.post("/admin/also-labels", data={"csrf": csrf, "name": "max", "on": "1",
                                        "back": "/admin/labelers"})
  assert {r["name"]: r["also_labels"] for r in site.store.labelers()}["max"] == 1
