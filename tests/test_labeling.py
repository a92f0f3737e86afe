"""The labeling site without a browser: protocols (the stored value of every choice), the store's
assignment rules, the HTTP routes and their security, the report and the export task=rm reads."""

import dataclasses
import itertools
import json
import math
import re
import sqlite3
import time

import numpy as np
import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from rlhfjax.data import records  # noqa: E402
from rlhfjax.errors import ConfigError  # noqa: E402
from rlhfjax.evaluation import turing_advice  # noqa: E402
from rlhfjax.labeling import comparisons  # noqa: E402
from rlhfjax.labeling import protocols  # noqa: E402
from rlhfjax.labeling import report  # noqa: E402
from rlhfjax.labeling import server  # noqa: E402
from rlhfjax.labeling import site as site_lib  # noqa: E402
from rlhfjax.labeling import sources  # noqa: E402
from rlhfjax.labeling import store as store_lib  # noqa: E402
from rlhfjax.labeling import tasks  # noqa: E402

from conftest import load_config  # noqa: E402

STIENNON = protocols.get("stiennon")
ALPACA = protocols.get("alpacafarm")
ADVICE = protocols.get("turing_advice")
BINARY = protocols.get("binary")
XSS = '<script>alert("x")</script><img src=x onerror=alert(1)>'
SQLI = "'); DROP TABLE labels; --"


def stiennon_answers(rating: int, left: int = 3, right: int = 6) -> dict[str, str]:
  out = {"preference": str(rating)}
  for side, v in (("left", left), ("right", right)):
    out.update({f"{side}.{q}": str(v) for q in ("overall", "accuracy", "coverage", "coherence")})
  return out


# Protocols: what each choice stores.

@pytest.mark.parametrize("swapped", [False, True])
def test_every_stiennon_rating_stores_its_a_b_value(swapped):
  for rating in range(1, 10):
    label = protocols.canonical(STIENNON, stiennon_answers(rating), swapped)
    shown_right = 0.0 if rating < 5 else 0.5 if rating == 5 else 1.0
    assert label.preference == (1.0 - shown_right if swapped else shown_right)
    assert label.extra == {"confidence": 10 - rating if swapped else rating}
    left, right = {k: 3 for k in ("overall", "accuracy", "coverage", "coherence")}, \
        {k: 6 for k in ("overall", "accuracy", "coverage", "coherence")}
    assert (label.axes_a, label.axes_b) == ((right, left) if swapped else (left, right))


@pytest.mark.parametrize("swapped", [False, True])
def test_alpacafarm_and_turing_advice_choices(swapped):
  expect = {"left": 0.0, "right": 1.0, "tie": 0.5}
  for value, right in expect.items():
    label = protocols.canonical(ALPACA, {"preference": value}, swapped)
    assert label.preference == (1.0 - right if swapped else right)
    assert (label.axes_a, label.axes_b, label.extra) == (None, None, {})
  fields = [q.name for q in ADVICE.pair]
  valid = 0
  for values in itertools.product(*[[v for v, _ in q.options] for q in ADVICE.pair]):
    answers = dict(zip(fields, values))
    if values[3] not in turing_advice.FOLLOW_UPS[values[2]]:
      with pytest.raises(protocols.InvalidAnswer, match="follow_up: after"):
        protocols.canonical(ADVICE, answers, swapped)
      continue
    valid += 1
    label = protocols.canonical(ADVICE, answers, swapped)
    assert label.preference == (expect[values[0]] if not swapped else 1 - expect[values[0]])
    assert label.extra == dict(zip(fields[1:], values[1:]))
    turing_advice.Judgement(int(label.preference), label.extra["helpfulness"],
                            label.extra["follow_up"], label.extra["strength"] == "definitely")
  assert valid == 2 * 2 * 6  # Sides x strength x (helpfulness, its follow-ups).


@pytest.mark.parametrize("swapped", [False, True])
def test_binary_thumbs_store_one_or_zero_whatever_the_swap(swapped):
  for value, stored in (("up", 1.0), ("down", 0.0)):
    label = protocols.canonical(BINARY, {"label": value}, swapped)
    assert (label.preference, label.axes_a, label.axes_b, label.extra) == (stored, None, None, {})
  with pytest.raises(protocols.InvalidAnswer, match="label: expected one of up, down"):
    protocols.canonical(BINARY, {"label": "left"}, swapped)


@pytest.mark.parametrize("answers, message", [
    ({"preference": "left"}, None),
    ({}, "preference: expected one of left, right, tie, got None"),
    ({"preference": "1' OR '1'='1"}, "preference: expected one of"),
    ({"preference": "left", "extra": "x"}, "unknown fields: extra"),
])
def test_answers_outside_the_protocol_are_refused(answers, message):
  if message is None:
    protocols.canonical(ALPACA, answers, False)
    return
  with pytest.raises(protocols.InvalidAnswer, match=re.escape(message)):
    protocols.canonical(ALPACA, answers, False)


# The store's assignment rules.

def pair(i: int, gold: float | None = None, **fields) -> dict:
  prompt = {"id": f"post{i}", "prompt": fields.pop("prompt", f"post {i}"),
            "title": fields.pop("title", f"title {i}"),
            "subreddit": fields.pop("subreddit", "tifu"), "input": fields.pop("input", "")}
  return sources.item(prompt, fields.pop("a", f"summary a{i}"),
                      fields.pop("b", f"longer summary b{i}"), "sft", "ppo", "train", gold=gold)


def make_store(tmp_path, n=4, gold=0, **settings) -> store_lib.Store:
  s = store_lib.Store(str(tmp_path / "labels.db"), store_lib.Settings(**settings))
  s.add_items([pair(i) for i in range(n)] + [pair(100 + i, gold=0.0) for i in range(gold)])
  return s


def labeler(s: store_lib.Store, name: str) -> int:
  s.add_labeler(name, False, 60)
  return s.read().execute("SELECT id FROM labelers WHERE name = ?", (name,)).fetchone()[0]


def seen(row) -> dict:
  """The pair and order an assignment's page showed: what every submission names."""
  return {"item_id": row["id"], "swapped": bool(row["swapped"]), "uid": row["uid"]}


def finish(s, who, row, preference=0.0, submission=None):
  return s.submit(who, row["assignment_id"], preference, {"extra": {}}, {"preference": "left"},
                  submission or f"{who}-{row['assignment_id']}", 1.0, **seen(row))


def test_each_pair_goes_to_k_distinct_labelers_never_twice(tmp_path):
  s = make_store(tmp_path, n=3, k=2, gold_every=0)
  assert s.add_items([pair(i) for i in range(3)]) == 0  # Loading again adds nothing.
  people = [labeler(s, f"p{i}") for i in range(4)]
  seen = {p: [] for p in people}
  for _ in range(3):
    for p in people:
      row = s.next_assignment(p)
      if row is not None:
        assert s.next_assignment(p)["assignment_id"] == row["assignment_id"]  # One open at a time.
        seen[p].append(row["uid"])
        finish(s, p, row)
  for p in people:
    assert len(seen[p]) == len(set(seen[p]))
  counts = s.read().execute("SELECT item_id, COUNT(*) FROM assignments GROUP BY item_id").fetchall()
  assert sorted(c for _, c in counts) == [2, 2, 2]
  assert s.progress()["complete_pairs"] == 3 and s.next_assignment(people[0]) is None


def test_an_abandoned_assignment_returns_to_the_queue_and_a_late_label_is_kept(tmp_path):
  s = make_store(tmp_path, n=1, k=1, lease_s=0.2, gold_every=0)
  a, b = labeler(s, "a"), labeler(s, "b")
  held = s.next_assignment(a)
  assert s.next_assignment(b) is None  # Leased to a.
  time.sleep(0.3)
  taken = s.next_assignment(b)
  assert taken is not None and taken["uid"] == held["uid"]
  finish(s, b, taken)
  assert finish(s, a, held) == "saved"  # a's late answer is not thrown away.
  assert s.read().execute("SELECT COUNT(*) FROM labels").fetchone()[0] == 2
  assert s.next_assignment(a) is None


def test_expired_open_assignment_is_dropped_when_others_filled_the_pair(tmp_path):
  s = make_store(tmp_path, n=2, k=1, lease_s=0.2, gold_every=0)
  a, b = labeler(s, "a"), labeler(s, "b")
  first = s.next_assignment(a)
  time.sleep(0.3)
  finish(s, b, s.next_assignment(b))  # b takes the expired pair.
  again = s.next_assignment(a)
  assert again["uid"] != first["uid"]
  assert s.read().execute("SELECT COUNT(*) FROM assignments WHERE labeler_id = ?",
                          (a,)).fetchone()[0] == 1


def test_gold_pairs_drawn_at_random_not_counted_towards_k(tmp_path):
  s = make_store(tmp_path, n=3, gold=4, k=1, gold_every=1)  # Every assignment gold while any left.
  orders = []
  for who in ("a", "b", "c", "d", "e", "f"):
    w = labeler(s, who)
    rows = []
    while (row := s.next_assignment(w)) is not None:
      rows.append(row)
      finish(s, w, row)
    assert [r["gold"] is not None for r in rows[:4]] == [True] * 4  # Each sees every gold pair.
    orders.append(tuple(r["uid"] for r in rows[:4]))
  assert len(set(orders)) > 1  # In an order of its own.
  assert s.progress()["complete_pairs"] == 3  # The 3 pairs went to a, b, c; gold never counts.
  never = make_store(tmp_path / "none", n=2, gold=2, gold_every=0)
  w = labeler(never, "a")
  assert all(never.next_assignment(w)["gold"] is None for _ in range(3))


def test_submission_is_stored_once_and_revisions_counted(tmp_path):
  s = make_store(tmp_path, n=1, gold_every=0)
  a, b = labeler(s, "a"), labeler(s, "b")
  row = s.next_assignment(a)
  assert finish(s, a, row, 0.0, "x") == "saved"
  assert finish(s, a, row, 0.0, "x") == "repeated"
  assert finish(s, a, row, 1.0, "y") == "revised"
  assert finish(s, a, row, 0.0, "x") == "repeated"  # A late retry of "x" does not undo "y".
  got = s.read().execute("SELECT preference, revisions FROM labels").fetchall()
  assert [tuple(r) for r in got] == [(1.0, 1)]
  with pytest.raises(store_lib.NotFound):
    finish(s, b, row, 0.0, "z")  # Not b's assignment.
  with pytest.raises(store_lib.NotFound):
    s.assignment(b, row["assignment_id"])


def test_database_is_wal_and_private(tmp_path):
  s = make_store(tmp_path)
  assert s.read().execute("PRAGMA journal_mode").fetchone()[0] == "wal"
  assert (tmp_path / "labels.db").stat().st_mode & 0o077 == 0


# The site over HTTP.

class Site:
  """A store with pairs (single responses for a one-response protocol) whose every text field is
  hostile, the app, and signed-in clients."""

  def __init__(self, tmp_path, protocol=STIENNON, login_per_minute=100, **settings):
    self.store = store_lib.Store(str(tmp_path / "site.db"), store_lib.Settings(**settings))
    self.store.add_items([pair(i, prompt=f"{XSS} {SQLI} post {i}", title=f"{XSS} title",
                               subreddit=XSS, input=f"{XSS} input", a=f"{XSS} a{i}",
                               b="" if protocol.single else f"{SQLI} b{i}")
                          for i in range(4)])
    self.app = server.create_app(self.store, protocol, login_per_minute=login_per_minute)

  def client(self, name: str | None = None, admin: bool = False) -> TestClient:
    c = TestClient(self.app, base_url="http://testserver")
    if name is not None:
      assert sign_in(c, self.store.add_labeler(name, admin, 60)).status_code == 200
    return c


def sign_in(c: TestClient, token: str, **kwargs):
  """Opens the sign-in form (which sets its CSRF cookie) and posts `token` with the form's token."""
  csrf = re.search(r'name="csrf" value="([^"]+)"', c.get("/login").text).group(1)
  return c.post("/login", data={"token": token, "csrf": csrf}, **kwargs)


def page_ids(html: str) -> tuple[str, str]:
  return (re.search(r'name="csrf" value="([^"]+)"', html).group(1),
          re.search(r'data-assignment="(\d+)"', html).group(1))


def shown(c, assignment) -> dict:
  """The pair and order the assignment's page shows (nothing when it is not this labeler's)."""
  html = c.get(f"/label/{assignment}").text
  found = re.search(r'data-pair="(\d+)" data-swapped="(\d)"\s+data-uid="([0-9a-f]+)"', html)
  return ({"pair": int(found.group(1)), "swapped": int(found.group(2)), "uid": found.group(3)}
          if found else {})


def post_label(c, assignment, csrf, answers, submission="s", **headers):
  return c.post(f"/label/{assignment}", headers=headers,
                json={"csrf": csrf, "submission": submission, "answers": answers, "seconds": 2,
                      **shown(c, assignment)})


def test_sign_in_once_with_a_safe_cookie(tmp_path):
  site = Site(tmp_path)
  token = site.store.add_labeler("ada", False, 60)
  c = site.client()
  assert c.get("/").url.path == "/login"  # Signed out.
  response = sign_in(c, token, follow_redirects=False)
  assert response.status_code == 303
  cookie = response.headers["set-cookie"].lower()
  assert "httponly" in cookie and "samesite=strict" in cookie
  again = sign_in(site.client(), token)
  assert again.status_code == 401 and "not valid" in again.text
  for header, value in server.HEADERS.items():
    assert response.headers[header] == value


def test_failed_sign_ins_are_rate_limited_per_address_not_valid_links(tmp_path):
  site = Site(tmp_path, login_per_minute=3)
  c = site.client()
  codes = [sign_in(c, f"guess{i}").status_code for i in range(3)]  # 6 requests, 3 attempts.
  assert codes == [401, 401, 401]
  limited = sign_in(c, "guess3")
  assert limited.status_code == 429 and "try again in" in limited.text
  assert 1 <= int(limited.headers["retry-after"]) <= 60
  assert site.store.read().execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 0
  # Another address is not limited; a valid link from the limited one still signs in.
  elsewhere = TestClient(site.app, base_url="http://testserver", client=("192.0.2.7", 5000))
  assert sign_in(elsewhere, "guess4").status_code == 401
  good = site.store.add_labeler("ada", False, 60)
  assert sign_in(c, good).status_code == 200 and c.get("/").url.path == "/"
  assert site.store.read().execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 1


def test_sign_in_form_refuses_other_sites_and_a_new_token_ends_sessions(tmp_path):
  site = Site(tmp_path)
  c = site.client()
  token = site.store.add_labeler("ada", False, 60)
  csrf = re.search(r'name="csrf" value="([^"]+)"', c.get("/login").text).group(1)
  forged = site.client()  # Another site's form: no sign-in cookie of ours.
  assert forged.post("/login", data={"token": token, "csrf": csrf}).status_code == 403
  assert c.post("/login", data={"token": token, "csrf": csrf},
                headers={"Origin": "http://evil.example"}).status_code == 403
  assert sign_in(c, token).status_code == 200 and c.get("/").url.path == "/"
  site.store.add_labeler("ada", False, 60)  # A new link (say the old one leaked) ...
  assert c.get("/").url.path == "/login"  # ... ends the sessions it opened.


def test_label_page_escapes_model_text_and_stores_the_label(tmp_path):
  site = Site(tmp_path, gold_every=0)
  c = site.client("ada")
  html = c.get("/").text
  assert "<script>alert" not in html and "<img src=x" not in html
  assert html.count("&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;") == 5  # Every field.
  assert "&#39;); DROP TABLE labels; --" in html
  csrf, assignment = page_ids(html)
  response = post_label(c, assignment, csrf, stiennon_answers(2))
  assert response.status_code == 200 and response.json()["status"] == "saved"
  assert response.json()["progress"] == {"mine": 1, "everyone": 1, "open_to_me": 3}
  row = site.store.labels()[0]
  assert row["preference"] == (1.0 if row["swapped"] else 0.0)
  assert json.loads(row["answers"])["extra"]["confidence"] == (8 if row["swapped"] else 2)
  assert site.store.read().execute("SELECT COUNT(*) FROM items").fetchone()[0] == 4  # Intact.
  for path in ("/mine",):
    assert "<script>alert" not in c.get(path).text


def test_form_post_without_javascript(tmp_path):
  site = Site(tmp_path, ALPACA, gold_every=0)
  c = site.client("ada")
  csrf, assignment = page_ids(c.get("/").text)
  response = c.post(f"/label/{assignment}", data={"csrf": csrf, "preference": "tie",
                                                  **shown(c, assignment)},
                    follow_redirects=False)
  assert response.status_code == 303 and response.headers["location"] == "/?did=saved"
  assert site.store.labels()[0]["preference"] == 0.5


@pytest.mark.parametrize("case", ["missing", "wrong", "other session", "cross origin", "expired"])
def test_requests_without_a_valid_csrf_token_are_refused(tmp_path, case):
  site = Site(tmp_path, gold_every=0)
  c, other = site.client("ada"), site.client("bob")
  csrf, assignment = page_ids(c.get("/").text)
  other_csrf, _ = page_ids(other.get("/").text)
  body = {"submission": "s", "answers": stiennon_answers(1)}
  headers = {}
  if case == "wrong":
    body["csrf"] = csrf[:-2] + "xx"
  elif case == "other session":
    body["csrf"] = other_csrf
  elif case in ("cross origin", "expired"):
    body["csrf"] = csrf
    headers = {"Origin": "http://evil.example"} if case == "cross origin" else {}
  if case == "expired":
    with site.store.write() as db:
      db.execute("UPDATE sessions SET expires = 0")
  response = c.post(f"/label/{assignment}", json=body, headers=headers)
  assert response.status_code == (401 if case == "expired" else 403)
  assert site.store.labels() == []
  if case == "missing":  # Signing out needs the token too.
    assert c.post("/logout", data={}).status_code == 403


def test_another_labelers_label_can_be_neither_read_nor_changed(tmp_path):
  site = Site(tmp_path, gold_every=0)
  ada, bob = site.client("ada"), site.client("bob")
  csrf, assignment = page_ids(ada.get("/").text)
  assert post_label(ada, assignment, csrf, stiennon_answers(1)).status_code == 200
  bob_csrf, _ = page_ids(bob.get("/").text)
  assert bob.get(f"/label/{assignment}").status_code == 404
  assert post_label(bob, assignment, bob_csrf, stiennon_answers(9), "b").status_code == 404
  assert post_label(bob, 10**6, bob_csrf, stiennon_answers(9), "b").status_code == 404
  assert [r["labeler"] for r in site.store.labels()] == ["ada"]
  assert site.store.labels()[0]["revisions"] == 0
  assert f"/label/{assignment}" not in bob.get("/mine").text
  assert bob.get("/admin").status_code == 403
  assert ada.get(f"/label/{assignment}").status_code == 200


def test_admin_page_shows_statistics_not_answers(tmp_path):
  site = Site(tmp_path, gold_every=0)
  ada, admin = site.client("ada"), site.client("root", admin=True)
  csrf, assignment = page_ids(ada.get("/").text)
  post_label(ada, assignment, csrf, stiennon_answers(3))
  html = admin.get("/admin").text
  assert "Labels: 1" in html and "ada" in html and "Table 20" in html
  assert "<script>alert" not in html and "post 0" not in html


def test_hostile_session_cookie_and_answer_values(tmp_path):
  site = Site(tmp_path, gold_every=0)
  c = site.client()
  c.cookies.set(site_lib.COOKIE, "' OR '1'='1")
  assert c.get("/").url.path == "/login"
  ada = site.client("ada")
  csrf, assignment = page_ids(ada.get("/").text)
  bad = dict(stiennon_answers(1), preference=SQLI)
  response = post_label(ada, assignment, csrf, bad)
  assert response.status_code == 400 and "preference" in response.json()["error"]
  assert post_label(ada, assignment, csrf, {"preference": ["1"]}).status_code == 400
  assert site.store.labels() == []
  with pytest.raises(ConfigError, match="labeling.user"):
    config = load_config("labeling", "tiny")
    config.labeling.user = SQLI
    tasks.user(config, str(tmp_path))


# Report and export.

def judgement(who, item, p, gold=None, swapped=False, words=(1, 2)):
  return report.Judgement(who, item, p, swapped, gold, words[0], words[1], 0.0, 2.0)


def test_agreement_table_hand_worked():
  js = [judgement("a", 1, 0.0), judgement("b", 1, 0.0), judgement("a", 2, 1.0),
        judgement("b", 2, 0.5), judgement("a", 3, 1.0, gold=0.0), judgement("b", 3, 0.0, gold=0.0)]
  names, mean, se, count = report.table(js)
  assert names == ["a", "b", report.GOLD, report.LONGER]
  np.testing.assert_allclose(mean[0, 1], (1 + 0.5 + 0) / 3)
  assert count[0, 1] == 3 and count[0, 2] == 1 and mean[1, 2] == 1.0 and mean[0, 2] == 0.0
  np.testing.assert_allclose(mean[0, 3], (0 + 1 + 1) / 3)  # b is longer in every pair.
  stats = report.labelers(js)
  assert stats["a"]["agreement_with_gold"] == 0.0 and stats["b"]["agreement_with_gold"] == 1.0
  np.testing.assert_allclose(stats["a"]["agreement_with_others"], (1 + 0.5) / 2)
  assert stats["a"]["prefers_left"] == 1 / 3  # Shown unswapped: B (right) twice, A once.
  assert "50 ± " in report.format_table(*report.table(js)) or "50 (" in report.format_table(
      *report.table(js))


@pytest.mark.parametrize("layout", ["openai", "alpaca"])
def test_export_keeps_ties_and_ratings_leaves_out_gold_and_reads_back(tmp_path, layout):
  s = make_store(tmp_path, n=3, gold=1, k=2, gold_every=2)
  answers = [(0.0, 2), (0.5, 5), (1.0, 9)]
  for who in ("a", "b"):
    w = labeler(s, who)
    while (row := s.next_assignment(w)) is not None:
      p, rating = answers[int(row["uid"], 16) % 3]
      answers_ab = {"axes_a": {"overall": 7}, "axes_b": {"overall": 1},
                    "extra": {"confidence": rating}}
      s.submit(w, row["assignment_id"], p, answers_ab, {}, "x", 1.0, **seen(row))
  paths = comparisons.export(s.labels(), str(tmp_path / "out"), layout, "stiennon")
  got = records.read_strict(paths["train"], layout) + records.read_strict(paths["valid"], layout)
  assert len(got) == 6  # 3 pairs x 2 labelers, gold left out.
  assert sorted(c.annotator for c in got) == ["a"] * 3 + ["b"] * 3
  by_uid = {r["uid"]: r for r in s.labels()}
  for c in got:
    row = by_uid[c.extra["pair"]]
    assert c.tie == (row["preference"] == 0.5)
    assert c.tie or c.choice == int(row["preference"])
    assert (dict(c.axes_a), dict(c.axes_b)) == ({"overall": 7}, {"overall": 1})
    assert c.confidence in (2, 5, 9)
  assert "Table 20" in open(paths["agreement"]).read()


def test_labelers_who_fail_gold_pairs_are_left_out_of_the_export(tmp_path):
  s = make_store(tmp_path, n=2, gold=3, k=3, gold_every=1)
  for who, right in (("good", True), ("bad", False)):
    w = labeler(s, who)
    for _ in range(3):
      row = s.next_assignment(w)
      finish(s, w, row, row["gold"] if right else 1.0 - row["gold"])
    finish(s, w, s.next_assignment(w), 0.0)
  out = comparisons.export(s.labels(), str(tmp_path / "out"), "openai", "x", 0.6, 2)
  assert out["left_out"] == ["bad"]
  got = records.read_strict(out["train"], "openai") + records.read_strict(out["valid"], "openai")
  assert [c.annotator for c in got] == ["good"]
  assert "Left out of the export" in open(out["agreement"]).read()
  few = {"new": {"gold_labels": 1.0, "gold_judged": 1.0, "agreement_with_gold": 0.0}}
  assert comparisons.unqualified(few, 0.6, 2) == []  # Not judged on one gold answer.
  # Gold ties have no right answer: five of them leave a labeler not judged, not left out.
  ties = {"tied": {"gold_labels": 5.0, "gold_judged": 0.0, "agreement_with_gold": float("nan")}}
  assert comparisons.unqualified(ties, 0.6, 5) == []


def test_gold_ties_neither_qualify_nor_disqualify_a_labeler(tmp_path):
  """A labeler whose gold answers all fell on tie-gold pairs (its agreement with gold undefined)
  keeps their labels in the export: they were left out before."""
  s = make_store(tmp_path, n=2, gold=2, k=1, gold_every=1)
  with s.write() as db:
    db.execute("UPDATE items SET gold = 0.5 WHERE gold IS NOT NULL")
  w = labeler(s, "ada")
  for _ in range(2):
    row = s.next_assignment(w)
    assert row["gold"] == 0.5
    finish(s, w, row, 1.0)
  finish(s, w, s.next_assignment(w), 0.0)
  out = comparisons.export(s.labels(), str(tmp_path / "out"), "openai", "x", 0.6, 1)
  assert out["left_out"] == []
  assert [c.annotator for c in records.read_strict(out["train"], "openai") +
          records.read_strict(out["valid"], "openai")] == ["ada"]


def test_load_export_and_reward_model_files(tiny_pipeline, tmp_path):
  """task=label_load from two methods' outputs, the protocol kept, and the export's ties left out
  of what task=rm reads."""
  from rlhfjax.training import loaders
  config, workdir = tiny_pipeline
  config = load_config("labeling", "tiny")
  config.labeling.db = str(tmp_path / "labels.db")
  config.labeling.source = "methods:sft,ppo"
  first = tasks.load(config, workdir)
  assert first["added"] > 0 and tasks.load(config, workdir)["added"] == 0
  config.labeling.protocol = "alpacafarm"
  with pytest.raises(ConfigError, match="labeling.protocol: .* 'stiennon' protocol"):
    tasks.load(config, workdir)
  config.labeling.protocol = "stiennon"
  config.labeling.user = "ada"
  link = tasks.user(config, workdir)
  assert link.startswith("http://127.0.0.1:8080/login#token=")
  s, _ = tasks.open_store(config, workdir)
  who = s.read().execute("SELECT id FROM labelers").fetchone()[0]
  for p in (0.0, 0.5, 1.0):
    row = s.next_assignment(who)
    s.submit(who, row["assignment_id"], p, {"extra": {"confidence": 5}}, {}, "x", None,
             **seen(row))
  config.labeling.export_dir = str(tmp_path / "export")
  paths = tasks.export(config, workdir)
  comps = (records.read_strict(paths["train"], "openai") +
           records.read_strict(paths["valid"], "openai"))
  assert sorted(c.tie for c in comps) == [False, False, True]
  kept = [c for split in ("train", "valid") if paths["decisive"][split]
          for c in loaders.load_comparisons(paths[split], "openai")]
  assert len(kept) == 2 and all(c.policy_a == "sft" and c.policy_b == "ppo" for c in kept)


def test_sqlite_file_survives_hostile_text(tmp_path):
  s = make_store(tmp_path, n=0)
  s.add_items([pair(1, prompt=SQLI, a=SQLI, b=XSS)])
  db = sqlite3.connect(str(tmp_path / "labels.db"))
  assert db.execute("SELECT prompt, response_a FROM items").fetchone() == (SQLI, SQLI)
  assert db.execute("SELECT COUNT(*) FROM labels").fetchone()[0] == 0


def test_file_annotator_takes_the_majority_of_several_labelers(tmp_path):
  from rlhfjax.feedback import annotators
  from rlhfjax.data import pipeline
  path = str(tmp_path / "human.jsonl")
  one = records.Comparison(prompt="post", response_a="x", response_b="y", choice=0, id="p1")
  records.write(path, [one, dataclasses.replace(one, annotator="b"),
                       dataclasses.replace(one, choice=1, annotator="c"),
                       dataclasses.replace(one, id="p2", tie=True)], "openai")
  judge = annotators.FileAnnotator(path)
  posts = [pipeline.Post("p1", "", "", "post")] * 2
  rng = np.random.default_rng(0)
  assert judge.annotate(posts, ["x", "y"], ["y", "x"], rng).tolist() == [0, 1]
  ties = [judge.annotate([pipeline.Post("p2", "", "", "post")], ["x"], ["y"], rng)[0]
          for _ in range(40)]
  assert 0 < sum(ties) < 40  # A tie is a coin flip.


# What a labeling team expects: skip, flag, invitations, revocation, downloads, disagreements,
# guidelines, "My labels", the access log.

def lid(s: store_lib.Store, name: str) -> int:
  return s.read().execute("SELECT id FROM labelers WHERE name = ?", (name,)).fetchone()[0]


def form_csrf(html: str) -> str:
  return re.search(r'name="csrf" value="([^"]+)"', html).group(1)


def test_skip_returns_the_pair_to_others_never_to_the_skipper(tmp_path):
  site = Site(tmp_path, gold_every=0, k=1)
  ada = site.client("ada")
  csrf, first = page_ids(ada.get("/").text)
  assert ada.post(f"/label/{first}/skip", data={"csrf": csrf},
                  follow_redirects=False).status_code == 303
  _, second = page_ids(ada.get("/").text)
  assert second != first
  bob = site.client("bob")
  bob_csrf, bob_first = page_ids(bob.get("/").text)  # k = 1: the skipped pair is bob's first.
  skipped = site.store.assignment(lid(site.store, "ada"), int(first))
  assert site.store.assignment(lid(site.store, "bob"), int(bob_first))["uid"] == \
      skipped["uid"]
  assert post_label(bob, bob_first, bob_csrf, stiennon_answers(2)).status_code == 200
  assert ada.post(f"/label/{second}/skip", data={"csrf": csrf}).status_code == 200
  assert site.store.progress()["skipped"] == 2
  # A finished label cannot be skipped, nor another's assignment.
  assert bob.post(f"/label/{bob_first}/skip", data={"csrf": bob_csrf}).status_code == 404
  assert bob.post(f"/label/{second}/skip", data={"csrf": bob_csrf}).status_code == 404


@pytest.mark.parametrize("action", ["skip", "flag"])
def test_an_answer_from_a_page_open_before_a_skip_is_kept_and_ends_the_skip(tmp_path, action):
  """Another tab still shows the pair the labeler skipped (or flagged); its answer arrives after the
  pair went to someone else: kept on that pair, in its order, like a late label, and the assignment
  ends done, no longer skipped. A flag still holds the pair."""
  site = Site(tmp_path, gold_every=0, k=1)
  ada = site.client("ada")
  csrf, first = page_ids(ada.get("/").text)
  stale = shown(ada, first)  # The other tab's page, loaded before the skip.
  assert ada.post(f"/label/{first}/{action}", data={"csrf": csrf, "comment": "unreadable"},
                  follow_redirects=False).status_code == 303
  if action == "skip":  # k = 1: bob is given the pair and labels it.
    bob = site.client("bob")
    bob_csrf, bob_first = page_ids(bob.get("/").text)
    assert post_label(bob, bob_first, bob_csrf, stiennon_answers(6)).status_code == 200
  assert site.store.progress()["skipped"] == 1
  response = ada.post(f"/label/{first}", json={"csrf": csrf, "submission": "late", "seconds": 9,
                                               "answers": stiennon_answers(2), "base": "",
                                               **stale})
  assert response.status_code == 200 and response.json()["status"] == "saved"
  row = site.store.assignment(lid(site.store, "ada"), int(first))
  assert row["done"] is not None and (row["id"], row["swapped"]) == (stale["pair"],
                                                                     stale["swapped"])
  db = site.store.read()
  assert db.execute("SELECT skipped FROM assignments WHERE id = ?", (int(first),)).fetchone()[0] \
      is None
  assert site.store.progress()["skipped"] == 0
  assert site.store.my_progress(lid(site.store, "ada"))["mine"] == 1
  labels = {r["labeler"]: r for r in site.store.labels()}
  assert set(labels) == ({"ada", "bob"} if action == "skip" else {"ada"})
  assert row["done_count"] == len(labels)  # k + 1 after the skip: kept, as a late label is.
  assert len(site.store.flags()) == (action == "flag")


def test_a_flagged_pair_is_held_for_the_admin_then_released_or_dropped(tmp_path):
  site = Site(tmp_path, gold_every=0, k=2)
  ada, bob = site.client("ada"), site.client("bob")  # Both hold the first pair.
  csrf, flagged = page_ids(ada.get("/").text)
  uid = site.store.assignment(lid(site.store, "ada"), int(flagged))["uid"]
  assert ada.post(f"/label/{flagged}/flag", data={"csrf": csrf, "comment": " "}
                  ).status_code == 400  # Say what is wrong.
  comment = f"the post is cut off {XSS}"
  assert ada.post(f"/label/{flagged}/flag", data={"csrf": csrf, "comment": comment},
                  follow_redirects=False).status_code == 303
  served = set()
  for who in (ada, bob):  # Nobody is given the held pair, each gets the other three.
    for _ in range(3):
      c, a = page_ids(who.get("/").text)
      served.add(site.store.read().execute(
          "SELECT i.uid FROM assignments a JOIN items i ON i.id = a.item_id WHERE a.id = ?",
          (int(a),)).fetchone()[0])
      assert post_label(who, a, c, stiennon_answers(1), submission=a).status_code == 200
  assert uid not in served and "Nothing left" in bob.get("/").text
  assert bob.get("/admin/flags").status_code == 403
  root = site.client("root", admin=True)
  page = root.get("/admin/flags").text
  assert "the post is cut off &lt;script&gt;" in page and "<script>alert" not in page
  item = re.search(r'data-pair="(\d+)"', page).group(1)
  root_csrf = form_csrf(page)
  assert root.post(f"/admin/flags/{item}", data={"csrf": root_csrf, "action": "burn"}
                   ).status_code == 400
  assert root.post(f"/admin/flags/{item}", data={"csrf": root_csrf, "action": "release"},
                   follow_redirects=False).status_code == 303
  c, a = page_ids(bob.get("/").text)  # Back in the queue.
  assert post_label(bob, a, c, stiennon_answers(9)).status_code == 200
  assert len(site.store.labels()) == 7
  # Flag it again (from the label just given), then drop it: its label leaves the exports.
  assert bob.post(f"/label/{a}/flag", data={"csrf": c, "comment": "offensive"}).status_code == 200
  assert root.post(f"/admin/flags/{item}", data={"csrf": root_csrf, "action": "drop"}
                   ).status_code == 200
  assert len(site.store.labels()) == 6 and uid not in {r["uid"] for r in site.store.labels()}
  assert site.store.progress()["dropped_pairs"] == 1 and "No open flags" in root.get(
      "/admin/flags").text
  # A dropped pair stays dropped: flagging it again (from a label's page) is refused, and a
  # release never brings it back (a flag an earlier version reopened on it, say).
  response = bob.post(f"/label/{a}/flag", data={"csrf": c, "comment": "still offensive"})
  assert response.status_code == 409 and "removed this pair" in response.text
  with site.store.write() as db:
    db.execute("UPDATE flags SET resolved = NULL WHERE item_id = ?", (int(item),))
  site.store.resolve(int(item), "release")
  assert site.store.progress()["dropped_pairs"] == 1 and len(site.store.labels()) == 6


def test_admin_invites_and_revokes_labelers_from_the_web(tmp_path):
  site = Site(tmp_path, gold_every=0)
  root, ada = site.client("root", admin=True), site.client("ada")
  ada_csrf = form_csrf(ada.get("/").text)
  assert ada.post("/admin/labelers", data={"csrf": ada_csrf, "name": "eve"}).status_code == 403
  page = root.get("/admin/labelers").text
  csrf = form_csrf(page)
  assert "ada" in page and "signed in" in page
  assert root.post("/admin/labelers", data={"name": "eve"}).status_code == 403  # No token.
  assert root.post("/admin/labelers", data={"csrf": csrf, "name": "eve"},
                   headers={"Origin": "http://evil.example"}).status_code == 403
  assert root.post("/admin/labelers", data={"csrf": csrf, "name": "e v<e>"}).status_code == 400
  invited = root.post("/admin/labelers", data={"csrf": csrf, "name": "eve", "admin": "on"})
  link = re.search(r'value="(http://testserver/login#token=[^"]+)"', invited.text).group(1)
  assert "invited, not signed in yet" in invited.text
  assert "token=" not in root.get("/admin/labelers").text  # Shown once.
  eve = site.client()
  assert sign_in(eve, link.split("#token=")[1]).status_code == 200
  assert eve.get("/admin").status_code == 200  # Invited as an admin.
  # Revoking: needs the token, ends the session, the labels stay; nobody revokes themselves.
  assert root.post("/admin/labelers/ada/revoke", data={}).status_code == 403
  csrf_a, assignment = page_ids(ada.get("/").text)
  assert post_label(ada, assignment, csrf_a, stiennon_answers(2)).status_code == 200
  assert root.post("/admin/labelers/ada/revoke", data={"csrf": csrf},
                   follow_redirects=False).status_code == 303
  assert ada.get("/").url.path == "/login" and len(site.store.labels()) == 1
  assert "revoked" in root.get("/admin/labelers").text
  refused = root.post("/admin/labelers/root/revoke", data={"csrf": csrf})
  assert refused.status_code == 400 and "your own access" in refused.text
  assert root.post("/admin/labelers/nobody/revoke", data={"csrf": csrf}).status_code == 400
  # A new link restores access.
  assert sign_in(ada, site.store.add_labeler("ada", False, 60)).status_code == 200
  assert ada.get("/").url.path == "/"


def test_download_buttons_give_what_label_export_writes(tmp_path):
  site = Site(tmp_path, gold_every=0)
  ada, bob, root = site.client("ada"), site.client("bob"), site.client("root", admin=True)
  for who, rating in ((ada, 2), (bob, 8), (ada, 5)):
    csrf, a = page_ids(who.get("/").text)
    assert post_label(who, a, csrf, stiennon_answers(rating), submission=a).status_code == 200
  admin_page = root.get("/admin").text
  for layout, ext in (("openai", ".jsonl"), ("alpaca", ".json")):
    for split in ("train", "valid"):
      assert f'href="/admin/export/{layout}/{split}"' in admin_page
      got = root.get(f"/admin/export/{layout}/{split}")
      assert got.status_code == 200
      assert f'filename="{split}{ext}"' in got.headers["content-disposition"]
      written = comparisons.export(site.store.labels(), str(tmp_path / layout), layout,
                                   "stiennon")
      assert got.content == open(written[split], "rb").read()
  assert len(root.get("/admin/export/openai/train").text.splitlines()) == 3
  assert "Table 20" in root.get("/admin/export/openai/agreement").text
  assert ada.get("/admin/export/openai/train").status_code == 403
  assert root.get("/admin/export/csv/train").status_code == 404


def test_disagreements_are_shown_to_admins_only_in_pair_order(tmp_path):
  site = Site(tmp_path, gold_every=0, k=2)
  ada, bob, root = site.client("ada"), site.client("bob"), site.client("root", admin=True)
  assert "No pair has labels that disagree" in root.get("/admin/disagreements").text
  ca, a = page_ids(ada.get("/").text)
  cb, b = page_ids(bob.get("/").text)
  post_label(ada, a, ca, stiennon_answers(1))  # Left definitely better, as ada saw it.
  swaps = [site.store.assignment(lid(site.store, n), int(x))["swapped"]
           for n, x in (("ada", a), ("bob", b))]
  post_label(bob, b, cb, stiennon_answers(9 if swaps[0] == swaps[1] else 1))  # The other one.
  rows = site.store.labels()
  assert rows[0]["uid"] == rows[1]["uid"]
  page = root.get("/admin/disagreements").text
  assert page.count('class="disagreement"') == 1 and "<script>alert" not in page
  for r in rows:
    words = report.in_pair_order(r["preference"], json.loads(r["answers"])["extra"])
    assert f"<td>{r['labeler']}</td><td>{words}</td>" in page
  assert {report.in_pair_order(r["preference"], json.loads(r["answers"])["extra"])
          for r in rows} <= {"1: A definitely better", "9: B definitely better"}
  for labeler in (ada, bob):
    assert labeler.get("/admin/disagreements").status_code == 403


def test_in_pair_order_and_disagreements_hand_worked():
  assert report.in_pair_order(0.0, {"confidence": 4}) == "4: A slightly better"
  assert report.in_pair_order(0.5, {}) == "tie" and report.in_pair_order(1.0, {}) == "B better"
  base = {"gold": None, "answers": '{"extra": {"strength": "slightly"}}'}
  rows = [{**base, "item_id": 1, "labeler": "a", "preference": 0.0},
          {**base, "item_id": 1, "labeler": "b", "preference": 0.0},
          {**base, "item_id": 2, "labeler": "a", "preference": 0.0},
          {**base, "item_id": 2, "labeler": "b", "preference": 0.5},
          {**base, "item_id": 3, "labeler": "a", "preference": 1.0},
          {**base, "item_id": 3, "labeler": "b", "preference": 0.0},
          {**base, "item_id": 4, "labeler": "a", "preference": 1.0, "gold": 0.0},
          {**base, "item_id": 4, "labeler": "b", "preference": 0.0, "gold": 0.0}]
  found = report.disagreements(rows)
  assert [d["pair"]["item_id"] for d in found] == [3, 2]  # Widest split first; gold aside.
  assert found[0]["answers"] == [("a", "B better", {"strength": "slightly"}),
                                 ("b", "A better", {"strength": "slightly"})]


def test_my_labels_show_the_answer_words_time_and_post(tmp_path):
  site = Site(tmp_path, gold_every=0)
  ada = site.client("ada")
  csrf, a = page_ids(ada.get("/").text)
  post_label(ada, a, csrf, stiennon_answers(4))
  page = ada.get("/mine").text
  row = re.search(r"<tr>(.*?)</tr>", page.split("<tbody>")[1], re.S).group(1)
  assert "left slightly better" in row and " UTC" in row
  assert "&lt;script&gt;" in row and "post" in row and "<script>alert" not in row


def test_guidelines_page_renders_the_protocols_or_the_configs(tmp_path):
  site = Site(tmp_path)
  assert site.client().get("/guidelines").url.path == "/login"
  page = site.client("ada").get("/guidelines").text
  assert "<h1>" in page and "9-point" in page
  custom = server.create_app(site.store, STIENNON, guidelines=f"# Our rules\n\n{XSS}")
  c = TestClient(custom, base_url="http://testserver")
  assert sign_in(c, site.store.add_labeler("bob", False, 60)).status_code == 200
  page = c.get("/guidelines").text
  assert "<h1>Our rules</h1>" in page and "<script>alert" not in page


def test_access_log_and_sign_in_events_never_hold_a_token(tmp_path, caplog):
  site = Site(tmp_path, gold_every=0)
  caplog.set_level("INFO", logger="rlhfjax.labeling")
  token = site.store.add_labeler("ada", False, 60)
  c = site.client()
  sign_in(c, "not-a-token")
  sign_in(c, token)
  c.get("/mine?q=secret")
  text = caplog.text
  assert "sign-in failed from testclient" in text and "sign-in: ada from testclient" in text
  assert re.search(r"testclient GET /mine 200 \d+ms ada", text)
  assert re.search(r"testclient POST /login 401 \d+ms -", text)
  assert token not in text and "not-a-token" not in text and "secret" not in text


def test_an_earlier_database_gains_the_new_columns(tmp_path):
  path = str(tmp_path / "old.db")
  old = sqlite3.connect(path)
  old.executescript(
      store_lib.SCHEMA.replace(",\n  held INTEGER NOT NULL DEFAULT 0", "")
      .replace(", revoked REAL", "").replace(", skipped REAL", ""))
  old.execute("INSERT INTO items (uid, prompt, title, subreddit, input, response_a, response_b, "
              "policy_a, policy_b, prompt_id, split, position) VALUES ('u', 'p', 't', 's', '', "
              "'a', 'b', 'x', 'y', 'i', 'train', 0)")
  old.commit()
  assert "held" not in {r[1] for r in old.execute("PRAGMA table_info(items)")}
  old.close()
  s = store_lib.Store(path)
  for table, column, _ in store_lib.ADDED_COLUMNS:
    assert column in {r[1] for r in s.read().execute(f"PRAGMA table_info({table})")}
  who = labeler(s, "ada")
  assert s.next_assignment(who)["uid"] == "u"


def test_label_user_links_carry_the_served_address(tmp_path):
  config = load_config("labeling", "tiny")
  config.labeling.update(db=str(tmp_path / "labels.db"), user="ada")
  s, _ = tasks.open_store(config, str(tmp_path))
  assert tasks.user(config, str(tmp_path)).startswith("http://127.0.0.1:8080/login#token=")
  s.set_meta("served_url", "http://127.0.0.1:8123")  # What task=label_server records.
  assert tasks.user(config, str(tmp_path)).startswith("http://127.0.0.1:8123/login#token=")
  config.labeling.url = "https://label.example.org/"
  assert tasks.user(config, str(tmp_path)).startswith("https://label.example.org/login#token=")


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.25, 0.5, 1.0])
def test_valid_pairs_are_spread_through_the_queue(fraction):
  free = [{"split": "", "gold": None, "n": n} for n in range(40)]
  gold = {"split": "train", "gold": 1.0, "n": -1}
  out = sources.queue([gold] + free, fraction)
  valid = [i for i, p in enumerate(out[:-1]) if p["split"] == "valid"]
  for n in range(1, 41):  # Every served prefix holds its share.
    assert sum(i < n for i in valid) == int(np.floor(n * fraction + 0.5))
  if fraction == 0.1:
    assert valid == [4, 14, 24, 34]
  assert out[-1] is gold and sorted(p["n"] for p in out) == list(range(-1, 40))
  # Pairs with splits of their own (a comparison file's) keep them, spread the same way.
  own = [{"split": "valid" if n < 10 else "train", "gold": None} for n in range(30)]
  out = sources.queue(own, fraction)
  assert [p["split"] for p in out[:6]] == ["train", "valid", "train"] * 2


@pytest.mark.parametrize("case", ["missing", "wrong", "other session", "cross origin"])
def test_every_new_form_refuses_requests_without_a_valid_csrf_token(tmp_path, case):
  """Skip, flag, invite, revoke and the flag decision, each with a bad token or origin: 403, and
  nothing changes."""
  site = Site(tmp_path, gold_every=0)
  ada, root = site.client("ada"), site.client("root", admin=True)
  site.store.set_also_labels("root", True)  # Admins are handed pairs only when they ask.
  csrf, assignment = page_ids(ada.get("/").text)
  root_csrf = form_csrf(root.get("/admin/labelers").text)
  _, other = page_ids(root.get("/").text)
  assert root.post(f"/label/{other}/flag", data={"csrf": root_csrf, "comment": "x"}
                   ).status_code == 200
  item = site.store.flags()[0]["id"]

  def bad(token: str, theirs: str) -> tuple[dict, dict]:
    headers = {"Origin": "http://evil.example"} if case == "cross origin" else {}
    value = {"missing": None, "wrong": token[:-2] + "xx", "other session": theirs,
             "cross origin": token}[case]
    return ({} if value is None else {"csrf": value}), headers

  before = site.store.read().execute(
      "SELECT (SELECT COUNT(*) FROM assignments WHERE skipped IS NOT NULL), "
      "(SELECT COUNT(*) FROM flags), (SELECT COUNT(*) FROM labelers WHERE revoked IS NOT NULL), "
      "(SELECT COUNT(*) FROM labelers), (SELECT SUM(held) FROM items)").fetchone()
  form, headers = bad(csrf, root_csrf)
  assert ada.post(f"/label/{assignment}/skip", data=form, headers=headers).status_code == 403
  assert ada.post(f"/label/{assignment}/flag", data={**form, "comment": "x"},
                  headers=headers).status_code == 403
  form, headers = bad(root_csrf, csrf)
  assert root.post("/admin/labelers", data={**form, "name": "eve"},
                   headers=headers).status_code == 403
  assert root.post("/admin/labelers/ada/revoke", data=form, headers=headers).status_code == 403
  assert root.post(f"/admin/flags/{item}", data={**form, "action": "drop"},
                   headers=headers).status_code == 403
  after = site.store.read().execute(
      "SELECT (SELECT COUNT(*) FROM assignments WHERE skipped IS NOT NULL), "
      "(SELECT COUNT(*) FROM flags), (SELECT COUNT(*) FROM labelers WHERE revoked IS NOT NULL), "
      "(SELECT COUNT(*) FROM labelers), (SELECT SUM(held) FROM items)").fetchone()
  assert tuple(before) == tuple(after) and ada.get("/").url.path == "/"


def test_the_words_that_differ_are_marked_and_escaped(tmp_path):
  s = store_lib.Store(str(tmp_path / "d.db"), store_lib.Settings(gold_every=0))
  s.add_items([pair(0, a="the cat sat on the <b>mat</b>", b="the dog sat on a <b>mat</b>")])
  c = TestClient(server.create_app(s, STIENNON), base_url="http://testserver")
  assert sign_in(c, s.add_labeler("ada", False, 60)).status_code == 200
  texts = re.findall(r'<article id="(left|right)"><h3>\w+</h3><div class="text">(.*?)</div>',
                     c.get("/").text)
  assert {side: text for side, text in texts}.keys() == {"left", "right"}
  assert sorted(text for _, text in texts) == [
      "the <mark>cat</mark> sat on <mark>the</mark> &lt;b&gt;mat&lt;/b&gt;",
      "the <mark>dog</mark> sat on <mark>a</mark> &lt;b&gt;mat&lt;/b&gt;"]


# The binary protocol: one response, thumbs up or down, exported in the binary layout.

def single(i: int, gold: float | None = None, split: str = "train") -> dict:
  prompt = {"id": f"post{i}", "prompt": f"post {i}", "title": f"title {i}", "subreddit": "tifu",
            "input": ""}
  return sources.item(prompt, f"summary {i}", "", "sft", "", split, gold=gold)


def test_binary_site_shows_one_response_and_exports_binary_feedback(tmp_path):
  site = Site(tmp_path, BINARY, gold_every=0, k=2)
  ada, bob, root = site.client("ada"), site.client("bob"), site.client("root", admin=True)
  html = ada.get("/").text
  assert 'id="response"' in html and 'id="left"' not in html and 'id="right"' not in html
  assert "thumbs up: good" in html and "<script>alert" not in html
  for who, value in ((ada, "up"), (bob, "down"), (ada, "down")):
    csrf, a = page_ids(who.get("/").text)
    response = post_label(who, a, csrf, {"label": value}, submission=a)
    assert response.status_code == 200 and response.json()["status"] == "saved"
  assert "thumbs up" in ada.get("/mine").text
  admin = root.get("/admin").text
  assert "<th>thumbs up</th>" in admin and "prefers left" not in admin
  assert 'href="/admin/export/binary/train"' in admin and "/admin/export/openai/" not in admin
  assert root.get("/admin/export/openai/train").status_code == 404
  got = root.get("/admin/export/binary/train")
  assert 'filename="train.jsonl"' in got.headers["content-disposition"]
  path = tmp_path / "train.jsonl"
  path.write_bytes(got.content)
  exported = records.read_binary_strict(str(path))
  stored = {(r["labeler"], r["uid"]): r["preference"] for r in site.store.labels()}
  assert len(exported) == 3 and {f.annotator for f in exported} == {"ada", "bob"}
  for f in exported:
    assert f.label == (stored[(f.annotator, f.extra["item"])] == 1.0)
    assert f.completion.endswith(("a0", "a1", "a2", "a3")) and f.batch == "labeling round: binary"
  assert "thumbs up" in root.get("/admin/export/binary/agreement").text


def test_binary_report_and_export_hand_worked(tmp_path):
  """Two labelers on two responses and a gold one: agreement on what both judged, with gold, the
  share of thumbs up; no position or length figures and no longer-response judge."""
  s = store_lib.Store(str(tmp_path / "labels.db"), store_lib.Settings(k=2, gold_every=1))
  s.add_items([single(0), single(1, split="valid"), single(9, gold=1.0)])
  answers = {"a": {"post0": 1.0, "post1": 1.0, "post9": 1.0},
             "b": {"post0": 1.0, "post1": 0.0, "post9": 0.0}}
  for who, mine in answers.items():
    w = labeler(s, who)
    while (row := s.next_assignment(w)) is not None:
      s.submit(w, row["assignment_id"], mine[row["prompt_id"]], {"extra": {}}, {},
               who + row["prompt_id"], 1.0, **seen(row))
  js = report.judgements(s.labels(), single=True)
  assert not any(j.swapped for j in js)  # Whatever the store drew: one response has no sides.
  stats = report.labelers(js)
  assert stats["a"]["thumbs_up"] == 1.0 and stats["b"]["thumbs_up"] == 1 / 3
  assert stats["a"]["agreement_with_others"] == 0.5  # Same on post0, not on post1.
  assert stats["a"]["agreement_with_gold"] == 1.0 and stats["b"]["agreement_with_gold"] == 0.0
  assert math.isnan(stats["a"]["prefers_left"]) and math.isnan(stats["a"]["prefers_longer"])
  names, *_ = report.table(js)
  assert names == ["a", "b", report.GOLD]
  assert report.in_pair_order(0.0, {}, single=True) == "thumbs down"
  out = comparisons.export(s.labels(), str(tmp_path / "out"), records.BINARY, "binary")
  train = records.read_binary_strict(out["train"])
  valid = records.read_binary_strict(out["valid"])
  assert [(f.annotator, f.label) for f in train] == [("a", True), ("b", True)]
  assert [(f.annotator, f.label, f.split) for f in valid] == [("a", True, "valid1"),
                                                              ("b", False, "valid1")]
  assert out["labels"] == out["decisive"] == {"train": 2, "valid": 2}
  text = open(out["agreement"]).read()
  assert "| thumbs up |" in text and "prefers left" not in text and report.LONGER not in text


def test_binary_load_from_every_source_and_export_for_kto(tiny_pipeline, tmp_path):
  """label_load under the binary protocol: one method's answers, each response of a comparison
  file, a binary file, gold from a binary file; label_export writes what task=kto reads."""
  _, workdir = tiny_pipeline
  config = load_config("labeling", "tiny")
  config.labeling.update(db=str(tmp_path / "labels.db"), protocol="binary", valid_fraction=0.0,
                         gold_every=0)
  comps = records.read_strict(f"{workdir}/label/train.jsonl", "openai")[:3]
  feedback = records.unpaired(comps)
  records.write_binary(str(tmp_path / "gold.jsonl"), feedback[:2])
  records.write_binary(str(tmp_path / "more.jsonl"), feedback[2:])
  config.labeling.source = (f"methods:sft;comparisons:{workdir}/label/train.jsonl;"
                            f"binary:{tmp_path}/more.jsonl")
  config.labeling.gold_file = str(tmp_path / "gold.jsonl")
  loaded = sources.load(config, workdir, single=True)
  assert all(p["response_b"] == "" and p["policy_b"] == "" for p in loaded)
  with open(f"{workdir}/sft/outputs.json") as f:
    answers = [o["output"] for o in json.load(f)["outputs"]]
  texts = [p["response_a"] for p in loaded if p["gold"] is None]
  pairs = records.read_strict(f"{workdir}/label/train.jsonl", "openai")
  assert texts == ([a for a in answers if a.strip()] +
                   [t for c in pairs for t in (c.response_a, c.response_b) if t.strip()] +
                   [f.completion for f in feedback[2:] if f.completion.strip()])
  golds = [p for p in loaded if p["gold"] is not None]
  assert [(p["response_a"], p["gold"]) for p in golds] == [
      (f.completion, float(f.label)) for f in feedback[:2]]
  added = tasks.load(config, workdir)["added"]
  assert 0 < added <= len(loaded)  # A response two sources share is queued once.
  config.labeling.user = "ada"
  tasks.user(config, workdir)
  s, protocol = tasks.open_store(config, workdir)
  assert protocol is BINARY
  who = s.read().execute("SELECT id FROM labelers").fetchone()[0]
  for value in (1.0, 0.0, 1.0):
    row = s.next_assignment(who)
    s.submit(who, row["assignment_id"], value, {"extra": {}}, {"label": "x"}, str(value), None,
             **seen(row))
  config.labeling.export_dir = str(tmp_path / "export")
  out = tasks.export(config, workdir)
  got = records.read_binary_strict(out["train"])
  assert [(f.annotator, f.label) for f in got] == [("ada", True), ("ada", False), ("ada", True)]
  assert out["train"].endswith("export/train.jsonl") and out["labels"]["valid"] == 0
  config.labeling.protocol = "stiennon"
  config.labeling.db = str(tmp_path / "pairs.db")
  config.labeling.source = f"binary:{tmp_path}/more.jsonl"
  with pytest.raises(ConfigError, match="under the stiennon protocol"):
    tasks.load(config, workdir)
