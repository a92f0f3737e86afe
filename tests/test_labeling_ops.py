"""Running the labeling site: its log (one line per event, control characters in paths and users'
text escaped), a session cookie per site, labelers' names that every URL can hold, revoking from
the command line, and bidi control characters shown rather than obeyed."""

import http.client
import logging
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from rlhfjax.errors import ConfigError  # noqa: E402
from rlhfjax.labeling import diff  # noqa: E402
from rlhfjax.labeling import protocols  # noqa: E402
from rlhfjax.labeling import safe_text  # noqa: E402
from rlhfjax.labeling import server  # noqa: E402
from rlhfjax.labeling import site as site_lib  # noqa: E402
from rlhfjax.labeling import sources  # noqa: E402
from rlhfjax.labeling import store as store_lib  # noqa: E402
from rlhfjax.labeling.routes import labeling as labeling_routes  # noqa: E402
from rlhfjax.labeling import tasks  # noqa: E402

from conftest import ROOT, load_config  # noqa: E402

STIENNON = protocols.get("stiennon")
FORGED = "2026-11-27 11:20:00,000 INFO sign-in: ada from 10.6.6.6"
RLO = "\u202e"
UNSAFE = re.compile("[\x00-\x1f\x7f\u2028\u2029" + safe_text.BIDI + "]")


def pair(i: int, a: str | None = None, b: str | None = None) -> dict:
  prompt = {"id": f"post{i}", "prompt": f"post {i}", "title": f"title {i}", "subreddit": "tifu",
            "input": ""}
  return sources.item(prompt, a or f"summary a{i}", b or f"longer summary b{i}", "sft", "ppo",
                      "train")


def make_store(tmp_path, items=None) -> store_lib.Store:
  s = store_lib.Store(str(tmp_path / "ops.db"), store_lib.Settings(gold_every=0, k=2))
  s.add_items(items or [pair(i) for i in range(3)])
  return s


def sign_in(c: TestClient, token: str):
  csrf = form_csrf(c.get("/login").text)
  return c.post("/login", data={"token": token, "csrf": csrf})


def form_csrf(html: str) -> str:
  return re.search(r'name="csrf" value="([^"]+)"', html).group(1)


def client(app, s: store_lib.Store, name: str | None = None, admin: bool = False) -> TestClient:
  c = TestClient(app, base_url="http://testserver")
  if name is not None:
    assert sign_in(c, s.add_labeler(name, admin, 60)).status_code == 200
  return c


def assignment_of(html: str) -> str:
  return re.search(r'data-assignment="(\d+)"', html).group(1)


# 1. The log.

def test_escape_writes_control_characters_as_python_escapes():
  assert safe_text.escape("a\nb\rc\x00d\te\x1bf\x7fg\\h") == "a\\nb\\rc\\x00d\\te\\x1bf\\x7fg\\\\h"
  assert safe_text.escape(f"x\u2028y{RLO}z\u200e") == "x\\u2028y\\u202ez\\u200e"
  assert safe_text.escape("naïve — “quoted” 日本") == "naïve — “quoted” 日本"


def test_paths_and_flag_comments_reach_the_log_escaped_one_line_each(tmp_path, caplog):
  s = make_store(tmp_path)
  app = server.create_app(s, STIENNON)
  caplog.set_level("INFO", logger="rlhfjax.labeling")
  ada = client(app, s, "ada")
  for path in (f"/nothing%0a{FORGED}", f"/nothing%0d{FORGED}", "/nul%00byte%1b[2J",
               "/back%5cslash%0d%0a"):
    assert ada.get(path).status_code == 404
  html = ada.get("/").text
  comment = f"cut off\r\n{FORGED}\x00 and {RLO}txt.exe " + "x" * 400
  assert ada.post(f"/label/{assignment_of(html)}/flag",
                  data={"csrf": form_csrf(html), "comment": comment}).status_code == 200
  messages = [r.getMessage() for r in caplog.records if r.name == "rlhfjax.labeling"]
  assert messages and not [m for m in messages if UNSAFE.search(m)]
  lines = caplog.text.splitlines()
  assert len(lines) == len(caplog.records)  # Each record one line.
  assert not [line for line in lines if FORGED in line and not re.search(r"\\[nr]" + FORGED, line)]
  for escaped in (f"GET /nothing\\n{FORGED} 404", f"GET /nothing\\r{FORGED} 404",
                  "GET /nul\\x00byte\\x1b[2J 404", "GET /back\\\\slash\\r\\n 404"):
    assert len([m for m in messages if escaped in m]) == 2, (escaped, messages)  # Access, refusal.
  flag = [m for m in messages if m.startswith("flag: ada flagged assignment")]
  assert len(flag) == 1
  head = f": cut off\\r\\n{FORGED}\\x00 and \\u202etxt.exe x"
  assert head in flag[0] and flag[0].endswith(
      safe_text.escape(comment[:labeling_routes.LOG_COMMENT]) + "…"), flag[0]
  assert len(flag[0]) < labeling_routes.LOG_COMMENT + 60  # Truncated.
  assert "\x00" not in caplog.text and "\r" not in caplog.text


def _free_port() -> int:
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def test_label_server_writes_each_event_once(tmp_path):
  """The real command (absl's app.run, uvicorn): every event one line, in our format only."""
  port = _free_port()
  err = open(tmp_path / "stderr", "w+", encoding="utf-8", errors="backslashreplace")
  proc = subprocess.Popen(
      [sys.executable, "-m", "rlhfjax.main", "--config", "configs/labeling.py:tiny",
       "--workdir", str(tmp_path / "w"), f"--config.labeling.port={port}"],
      cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
  try:
    deadline = time.time() + 120
    while True:
      try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/login")
        break
      except OSError:
        assert proc.poll() is None and time.time() < deadline, "the server did not start"
        time.sleep(0.3)
    assert conn.getresponse().status == 200
    for path in (f"/nothing%0a{FORGED.replace(' ', '%20')}", "/nul%00byte%0d"):
      conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
      conn.request("GET", path)
      assert conn.getresponse().status == 404
  finally:
    proc.send_signal(signal.SIGTERM)
    try:
      proc.wait(30)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
  err.seek(0)
  text = err.read()
  lines = text.splitlines()
  events = [line for line in lines if " GET /" in line]
  assert len(events) == 5, text  # 3 requests, 2 of them refused: one line each.
  assert len([line for line in events if re.search(r" INFO 127\.0\.0\.1 GET /login 200 ", line)]
             ) == 1, text
  assert len([line for line in events if f"GET /nothing\\n{FORGED} 404" in line]) == 2, text
  assert len([line for line in events if "GET /nul\\x00byte\\r 404" in line]) == 2, text
  assert not [line for line in lines if re.match(r"[IWEF]\d{4} ", line)], text  # absl's format.
  assert not [line for line in lines if line.startswith(FORGED)], text
  assert "\x00" not in text


def test_stderr_log_restores_the_logger_and_leaves_a_configured_one_alone():
  log = logging.getLogger("rlhfjax.labeling")
  before = (list(log.handlers), log.level, log.propagate)
  with tasks.stderr_log():
    assert len(log.handlers) == len(before[0]) + (0 if before[0] else 1)
    assert log.propagate is (before[2] if before[0] else False)
  assert (list(log.handlers), log.level, log.propagate) == before


# 2. A cookie per site.

def test_two_sites_on_one_host_keep_their_sessions(tmp_path):
  """One browser (one cookie jar) signs in to two sites on one host, ports 8001 and 8002."""
  def sites(cookies):
    apps = {}
    for port, cookie in zip((8001, 8002), cookies):
      s = store_lib.Store(str(tmp_path / f"{cookie}{port}.db"), store_lib.Settings(gold_every=0))
      s.add_items([pair(0)])
      apps[port] = (server.create_app(s, STIENNON, cookie=cookie), s)

    async def by_port(scope, receive, send):
      await apps[scope["server"][1]][0](scope, receive, send)
    return TestClient(by_port, base_url="http://testserver"), apps

  def both_signed_in(cookies) -> list[bool]:
    browser, apps = sites(cookies)
    for port, (_, s) in apps.items():
      csrf = form_csrf(browser.get(f"http://testserver:{port}/login").text)
      assert browser.post(f"http://testserver:{port}/login",
                          data={"token": s.add_labeler("ada", False, 60), "csrf": csrf},
                          follow_redirects=False).status_code == 303
    return [browser.get(f"http://testserver:{port}/", follow_redirects=False).status_code == 200
            for port in apps]

  assert both_signed_in([site_lib.COOKIE] * 2) == [False, True]  # One name: the second wins.
  config = load_config("labeling", "tiny")
  names = []
  for port in (8001, 8002):
    config.labeling.port = port
    names.append(tasks.cookie_name(config.labeling))
  assert names == ["rlhfjax_session_8001", "rlhfjax_session_8002"]
  assert both_signed_in(names) == [True, True]
  config.labeling.cookie_name = "team_b"
  assert tasks.cookie_name(config.labeling) == "team_b"
  assert site_lib.cookie_names("team_b") == ("team_b", "team_b_login")
  config.labeling.cookie_name = "a b;"
  with pytest.raises(ConfigError, match="labeling.cookie_name"):
    tasks.cookie_name(config.labeling)


# 3. Labelers' names.

BAD_NAMES = [".", "..", "-x", "_x", "@x", ".hidden", "a/b", "../admin", "a b", " ada", "ada\n",
             "", "x" * 65, "a\x00", f"a{RLO}b", "é"]


def test_names_must_start_with_a_letter_or_digit_at_the_store_and_the_form(tmp_path):
  s = make_store(tmp_path)
  for name in BAD_NAMES:
    with pytest.raises(ValueError, match="starts with a letter or digit"):
      s.add_labeler(name, False, 60)
  assert s.labelers() == []
  for name in ("a", "0", "ada.lovelace", "ada@example.org", "a-b_c", "x" * 64):
    s.add_labeler(name, False, 60)
  app = server.create_app(s, STIENNON)
  root = client(app, s, "root", admin=True)
  csrf = form_csrf(root.get("/admin/labelers").text)
  for name in BAD_NAMES:
    refused = root.post("/admin/labelers", data={"csrf": csrf, "name": name})
    if name.strip() and store_lib.NAME.fullmatch(name.strip()):
      continue  # The form trims surrounding spaces: " ada" is ada.
    assert refused.status_code == 400 and "starts with a letter or digit" in refused.text, name
  assert len(s.labelers()) == 7 + 1  # The six above, the long one, root (and " ada" as ada).
  config = load_config("labeling", "tiny")
  config.labeling.update(db=str(tmp_path / "ops.db"), user="..")
  with pytest.raises(ConfigError, match="labeling.user: .*starts with a letter or digit"):
    tasks.user(config, str(tmp_path))


def test_a_name_with_a_dot_is_invited_and_revoked_from_the_web(tmp_path):
  s = make_store(tmp_path)
  app = server.create_app(s, STIENNON)
  root = client(app, s, "root", admin=True)
  csrf = form_csrf(root.get("/admin/labelers").text)
  invited = root.post("/admin/labelers", data={"csrf": csrf, "name": "ada.lovelace"})
  token = re.search(r'value="http://testserver/login#token=([^"]+)"', invited.text).group(1)
  ada = TestClient(app, base_url="http://testserver")
  assert sign_in(ada, token).status_code == 200 and ada.get("/").url.path == "/"
  assert root.post("/admin/labelers/ada.lovelace/revoke", data={"csrf": csrf},
                   follow_redirects=False).status_code == 303
  assert ada.get("/").url.path == "/login"
  assert [r["revoked"] is not None for r in s.labelers() if r["name"] == "ada.lovelace"] == [True]


# 4. label_user --config.labeling.revoke=NAME.

def test_label_user_revokes_from_the_command_line(tmp_path, capsys):
  config = load_config("labeling", "tiny")
  config.labeling.update(db=str(tmp_path / "ops.db"), user="ada")
  link = tasks.user(config, str(tmp_path))
  s, _ = tasks.open_store(config, str(tmp_path))
  s.add_items([pair(i) for i in range(3)])
  app = server.create_app(s, STIENNON)
  ada = TestClient(app, base_url="http://testserver")
  assert sign_in(ada, link.split("#token=")[1]).status_code == 200
  assert ada.get("/").url.path == "/"  # Holds an open assignment.
  capsys.readouterr()
  config.labeling.update(user="", revoke="ada")
  said = tasks.user(config, str(tmp_path))
  assert capsys.readouterr().out.strip() == said
  assert said.startswith("revoked ada: sessions ended") and "their 0 labels stay" in said
  assert ada.get("/").url.path == "/login"
  # The open pair is given back (its lease ended), the assignment kept for a late answer.
  assert [tuple(r) for r in s.read().execute("SELECT lease_expires FROM assignments")] == [(0,)]
  assert "revoked already" in tasks.user(config, str(tmp_path))
  config.labeling.revoke = "nobody"
  with pytest.raises(ConfigError, match=r"labeling.revoke: no labeler named 'nobody' .*ada"):
    tasks.user(config, str(tmp_path))
  config.labeling.user = "bob"
  with pytest.raises(ConfigError, match="give one"):
    tasks.user(config, str(tmp_path))
  # A name an earlier version allowed, which no URL can hold, is revoked here.
  s.read().execute("INSERT INTO labelers (name, is_admin, created) VALUES ('..', 0, 0)")
  config.labeling.update(user="", revoke="..")
  assert tasks.user(config, str(tmp_path)).startswith("revoked ..:")
  # A new link restores access.
  config.labeling.update(user="ada", revoke="")
  assert sign_in(ada, tasks.user(config, str(tmp_path)).split("#token=")[1]).status_code == 200
  assert ada.get("/").url.path == "/"


# 5. Bidi controls shown as written.

def test_bidi_controls_are_shown_as_markers_on_every_page(tmp_path):
  every = safe_text.BIDI
  s = make_store(tmp_path, [pair(0, a=f"good {RLO}txt.exe summary", b=f"good gnp{RLO}.exe summary"),
                            pair(1, a=f"all {every} here", b=f"{every}")])
  app = server.create_app(s, STIENNON)
  # A name from before names were checked (it can no longer be given), signed in by its token.
  s.read().execute("INSERT INTO labelers (name, is_admin, token_hash, token_expires, created) "
                   "VALUES (?, 0, ?, ?, 0)", (f"eve{RLO}lin", store_lib.digest("tok"),
                                              time.time() + 60))
  eve = TestClient(app, base_url="http://testserver")
  assert sign_in(eve, "tok").status_code == 200
  pages = []
  for _ in range(2):
    html = eve.get("/").text
    pages.append(html)
    assert eve.post(f"/label/{assignment_of(html)}/flag",
                    data={"csrf": form_csrf(html), "comment": f"odd {RLO}txt.exe text"}
                    ).status_code == 200
  root = client(app, s, "root", admin=True)
  pages += [root.get(p).text for p in ("/admin", "/admin/labelers", "/admin/flags")]
  for html in pages:
    assert not set(safe_text.BIDI) & set(html), html
  for char in every:
    assert safe_text.marker(char) in "".join(pages), char
  assert "good [U+202E]txt.exe summary" in "".join(pages)
  flags = pages[-1]
  assert "odd [U+202E]txt.exe text" in flags and "eve[U+202E]lin" in flags
  assert "eve[U+202E]lin" in pages[-2]  # The labelers page.


def test_the_word_diff_compares_the_text_as_shown():
  a, b = f"the cat {RLO}sat down", "the cat sat down"
  left, right = diff.words(a, b)
  assert "".join(t for t, _ in left) == "the cat [U+202E]sat down"
  assert [t for t, changed in left if changed] == ["[U+202E]sat"]
  assert [t for t, changed in right if changed] == ["sat"]
  assert diff.words("same", "same") == ([("same", False)], [("same", False)])
  assert safe_text.visible(5) == 5 and safe_text.visible(None) is None
