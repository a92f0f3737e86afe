"""The labeling site in a real browser (headless Chromium driven by Selenium), end to end.

docs/labeling.md's round, with the doc's own commands (each in bash, on a copy of the tiny
pipeline's workdir): label_load queues task=label's pairs, the server runs as its own process, the
admin's link signs her in with one click, she invites a second labeler from the admin page, both
answer the `stiennon` protocol's questions on the real page (mouse, keyboard, a revision with `U`,
a skip, a flag with a comment) until they have 20 labels, while the server is killed under a
pending save and started again; the admin releases the flag, reviews the disagreements, downloads
the export and revokes the second labeler. Each answer is checked in the database in the pair's
own A/B order (the page may show a pair swapped). Then label_export and task=rm, as the doc says.

On small databases of their own: markup in every text of a pair (and in a labeler's name) is
shown as text and never runs, on the labeling page, /mine and /admin; a label submitted after
the session ended is kept in the browser, not sent for another labeler, and delivered once after
signing in again; and the `binary` protocol (one response, thumbs up or down, by mouse and keyboard,
a revision with `U`) is stored as 1 or 0 and downloaded in the binary layout task=kto reads.

Without selenium, chromium or chromedriver these tests are skipped, unless
RLHFJAX_REQUIRE_BROWSER=1 (as in CI), which makes them fail instead.
Set RLHFJAX_SCREENSHOT=1 to also write docs/img/labeling*.png (the pages at 1280x900).
"""

import importlib.util
import json
import os
import re
import secrets
import shutil
import socket
import sqlite3
import subprocess
import threading
import time

import pytest

from rlhfjax.data import records
from rlhfjax.feedback import contrast
from rlhfjax.labeling import sources
from rlhfjax.labeling import store as store_lib
from rlhfjax.labeling import tasks
from rlhfjax import main
from rlhfjax.sources import loading
from conftest import ROOT, load_config

MISSING = None  # Why the browser tests cannot run here, if they cannot.
try:
  from selenium import webdriver  # pylint: disable=g-import-not-at-top
  from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
  from selenium.webdriver.chrome.service import Service
  from selenium.webdriver.common.action_chains import ActionChains
  from selenium.webdriver.common.by import By
  from selenium.webdriver.common.keys import Keys
  from selenium.webdriver.support.ui import WebDriverWait
except ImportError as e:
  MISSING = f"selenium is not installed (pip install selenium): {e}"
for module in ("starlette", "uvicorn"):
  if importlib.util.find_spec(module) is None:
    MISSING = MISSING or (f"the labeling site needs the label extra (pip install -e '.[label]'): "
                          f"{module} is not installed")


def _which(*names: str) -> str | None:
  for name in names:
    path = name if os.path.isabs(name) else shutil.which(name)
    if path and os.access(path, os.X_OK):
      return path
  return None


CHROMIUM = _which("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")
CHROMEDRIVER = _which("/usr/bin/chromedriver", "chromedriver")
if MISSING is None and (CHROMIUM is None or CHROMEDRIVER is None):
  MISSING = ("chromium or chromedriver is not installed (apt-get install chromium "
             "chromium-driver)")
REQUIRED = os.environ.get("RLHFJAX_REQUIRE_BROWSER") == "1"
if MISSING and not REQUIRED:
  pytest.skip(f"the browser tests need a browser: {MISSING}", allow_module_level=True)


@pytest.fixture(scope="session", autouse=True)
def _require_browser():
  """With RLHFJAX_REQUIRE_BROWSER=1 a missing browser fails every test here (before any other
  fixture is built), so CI cannot pass by skipping them."""
  if MISSING:
    pytest.fail(f"RLHFJAX_REQUIRE_BROWSER=1, but {MISSING}", pytrace=False)

AXES = ("overall", "accuracy", "coverage", "coherence")
FIELDS = ["preference"] + [f"{side}.{q}" for side in ("left", "right") for q in AXES]
SCREENSHOT = os.path.join(ROOT, "docs", "img", "labeling.png")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _config(task: str, port: int, **labeling):
  config = load_config("labeling", "tiny")
  config.task = task
  config.labeling.update({"protocol": "stiennon", "source": "methods:sft,ppo",
                          "labels_per_pair": 2, "valid_fraction": 0.0, "port": port, **labeling})
  return config


def _expected(answers: dict[str, str], swapped: bool) -> tuple[float, dict]:
  """The label stored for `answers` given on a page that showed the pair `swapped` (B on the
  left): written out here rather than taken from protocols.canonical, which it checks."""
  rating = int(answers["preference"])
  right = 0.0 if rating < 5 else 0.5 if rating == 5 else 1.0
  left_axes = {q: int(answers[f"left.{q}"]) for q in AXES}
  right_axes = {q: int(answers[f"right.{q}"]) for q in AXES}
  if swapped:
    return 1.0 - right, {"axes_a": right_axes, "axes_b": left_axes,
                         "extra": {"confidence": 10 - rating}}
  return right, {"axes_a": left_axes, "axes_b": right_axes, "extra": {"confidence": rating}}


class Server:
  """task=label_server in a thread of this process: `uvicorn.run` is replaced by a server this
  test can stop (the app is the one the task builds)."""

  def __init__(self, config, workdir: str, monkeypatch):
    import uvicorn  # pylint: disable=g-import-not-at-top
    self.servers, self.errors = [], []

    def run(app, host, port, log_level):
      server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                             log_config=None))  # Leaves logging alone.
      self.servers.append(server)
      server.run()

    def target():
      try:
        main.run(config, workdir)
      except BaseException as e:  # pylint: disable=broad-except
        self.errors.append(e)

    monkeypatch.setattr(uvicorn, "run", run)
    self.thread = threading.Thread(target=target, daemon=True)
    self.thread.start()
    deadline = time.time() + 30
    while not (self.servers and self.servers[0].started):
      assert not self.errors, f"task=label_server failed: {self.errors[0]!r}"
      assert self.thread.is_alive() and time.time() < deadline, "task=label_server did not start"
      time.sleep(0.05)

  def stop(self) -> None:
    if self.servers:
      self.servers[0].should_exit = True
    self.thread.join(15)
    assert not self.thread.is_alive(), "the labeling server did not shut down"
    assert not self.errors, f"task=label_server failed: {self.errors[0]!r}"


@pytest.fixture(scope="module")
def chromium():
  """One headless Chromium for the module's tests (starting one takes a second or two)."""
  options = webdriver.ChromeOptions()
  options.binary_location = CHROMIUM
  for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1280,900", "--force-device-scale-factor=1"):
    options.add_argument(arg)
  driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
  driver.set_page_load_timeout(30)
  try:
    yield driver
  finally:
    driver.quit()


@pytest.fixture
def browser(chromium):
  """The module's browser without another test's cookies (each test serves on its own port, so
  localStorage, which is per origin, starts empty)."""
  chromium.get("about:blank")
  chromium.execute_cdp_cmd("Network.clearBrowserCookies", {})
  return chromium


def _state(driver) -> dict:
  """What the page shows: its address, the label form's assignment, the highlighted question and
  the answers checked, the counter, the status line, an error, the finished page."""
  return driver.execute_script("""
    const form = document.getElementById("label-form");
    const text = (css) => (document.querySelector(css) || {}).textContent ?? null;
    return {ready: document.readyState, path: location.pathname, search: location.search,
            hash: location.hash,
            assignment: form ? form.dataset.assignment : null, done: text("#done"),
            status: text("#status"), error: text(".error"),
            finished: !!document.getElementById("finished"),
            current: (document.querySelector("fieldset.question.current") || {}).id || null,
            checked: Object.fromEntries(Array.from(document.querySelectorAll("input:checked"),
                                                   (i) => [i.name, i.value]))};""")


def _until(driver, condition, timeout: float = 10):
  """WebDriverWait's until, also retrying when the page reloads between finding an element and
  reading it (a form that submits and redirects: the element found is then stale)."""
  return WebDriverWait(driver, timeout,
                       ignored_exceptions=(StaleElementReferenceException,)).until(condition)


def _wait(driver, predicate, what: str, timeout: float = 15):
  """Waits until `predicate(state)` holds (page loads in between are expected)."""
  def check(d):
    try:
      state = _state(d)
    except WebDriverException:  # The page is being replaced.
      return False
    return state if state["ready"] == "complete" and predicate(state) else False
  try:
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(check)
  except Exception as e:
    raise AssertionError(f"timed out waiting for {what}; page: {_state(driver)}") from e


def _sign_in(driver, link: str) -> None:
  """Opens a sign-in link (`/login#token=...`) and signs in with the token it puts in the form.
  From about:blank: on /login already, the link would only change the address's fragment."""
  driver.get("about:blank")
  driver.get(link)
  _wait(driver, lambda s: s["path"] == "/login" and s["search"] == s["hash"] == "",
        "the token to leave the address bar")
  driver.find_element(By.ID, "sign-in").click()


def _click(driver, field: str, value: str) -> None:
  """Clicks the label of option `value` of question `field`, as a labeler's mouse does."""
  driver.find_element(By.CSS_SELECTOR, f'fieldset[data-field="{field}"] input[value="{value}"]'
                      ).find_element(By.XPATH, "..").click()


def _keys(driver, *keys: str) -> None:
  ActionChains(driver).send_keys(*keys).perform()


class Labels:
  """The database as the test reads it (sqlite3 directly, read-only)."""

  def __init__(self, path: str):
    self.path = path

  def rows(self) -> list[sqlite3.Row]:
    db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
      return db.execute(
          "SELECT l.*, a.swapped, a.labeler_id, lb.name AS labeler, i.response_a, i.response_b, "
          "i.split, i.uid FROM labels l JOIN assignments a ON a.id = l.assignment_id "
          "JOIN items i ON i.id = a.item_id JOIN labelers lb ON lb.id = a.labeler_id "
          "ORDER BY l.created").fetchall()
    finally:
      db.close()

  def get(self, assignment: str) -> sqlite3.Row:
    found = [r for r in self.rows() if r["assignment_id"] == int(assignment)]
    assert len(found) == 1, f"assignment {assignment}: {len(found)} labels"
    return found[0]

  def assignment(self, assignment: str) -> sqlite3.Row:
    db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
      return db.execute("SELECT a.*, i.response_a, i.response_b FROM assignments a JOIN items i "
                        "ON i.id = a.item_id WHERE a.id = ?", (int(assignment),)).fetchone()
    finally:
      db.close()


def _check_shown(driver, labels: Labels, assignment: str) -> bool:
  """The page shows the pair in the assignment's stored order; returns `swapped`."""
  row = labels.assignment(assignment)
  left, right = driver.execute_script(
      "return ['left', 'right'].map((id) => "
      "document.querySelector(`#${id} .text`).textContent);")
  swapped = bool(row["swapped"])
  expected = ((row["response_b"], row["response_a"]) if swapped
              else (row["response_a"], row["response_b"]))
  assert (left, right) == tuple(map(_as_parsed, expected))
  return swapped


def _as_parsed(text: str) -> str:
  """`text` as an HTML parser gives it back (a tiny model's samples hold such bytes): NUL dropped,
  CR and CRLF read as LF."""
  return text.replace("\x00", "").replace("\r\n", "\n").replace("\r", "\n")


def _check_label(labels: Labels, assignment: str, answers: dict[str, str], revisions: int = 0):
  row = labels.get(assignment)
  preference, stored = _expected(answers, bool(row["swapped"]))
  assert json.loads(row["shown"]) == answers
  assert row["preference"] == preference
  assert json.loads(row["answers"]) == stored
  assert row["revisions"] == revisions


def _label_by_keyboard(driver, answers: dict[str, str]) -> None:
  """Answers every question with its digit key (the highlighted question advances), then Enter."""
  _keys(driver, *(answers[f] for f in FIELDS))
  _keys(driver, Keys.ENTER)


def _doc_round() -> list[str]:
  """The shell commands of docs/labeling.md's round, in order (continuation lines joined, comments
  and the install left out)."""
  text = open(os.path.join(ROOT, "docs", "labeling.md"), encoding="utf-8").read()
  block = text.split("## A labeling round, end to end", 1)[1].split("```bash\n", 1)[1]
  block = block.split("```", 1)[0].replace("\\\n", " ")
  lines = [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines()]
  return [line for line in lines if line and not line.startswith(("#", "pip "))]


ASSIGNMENT = re.compile(r"^[A-Z]+=\S+")  # `W=runs/quickstart`, the start of `H=... && cp ...`.


class DocRound:
  """The doc's commands, each in bash from the repository's root as a user would run them, with
  what a test needs: the tiny model (`configs/labeling.py:tiny`), runs/ under `root`, and a free
  port. Assignments (W=..., H=...) carry over to every later command."""

  def __init__(self, root: str, port: int):
    self.commands = _doc_round()
    self.root, self.port, self.server = root, port, None
    self.done: list[str] = []
    self.log = os.path.join(root, "server.log")

  def _script(self, command: str) -> str:
    if "rlhfjax.main" in command:
      command += f" --config.labeling.port={self.port}"
    assigned = [m.group(0) for m in map(ASSIGNMENT.match, self.done) if m]
    script = "set -euo pipefail\n" + "\n".join(assigned + [command])
    script = script.replace("configs/labeling.py", "configs/labeling.py:tiny")
    return re.sub(r"(^|[\s=])runs/", rf"\g<1>{self.root}/runs/", script)

  def _upcoming(self) -> str:
    """The next command, after any lines that only assign a variable (kept for later ones)."""
    while re.fullmatch(r"[A-Z]+=\S+", self.commands[len(self.done)]):
      self.done.append(self.commands[len(self.done)])
    return self.commands[len(self.done)]

  def next(self, expect: str) -> str:
    """Runs the next command (which must contain `expect`) and returns its output."""
    command = self._upcoming()
    assert expect in command, (expect, command)
    self.done.append(command)
    out = subprocess.run(["bash", "-c", self._script(command)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, f"{command}\n{out.stdout}\n{out.stderr}"
    return out.stdout + out.stderr

  def serve(self) -> None:
    """The next command is the server's: started in the background until `stop`."""
    if self.server is None:
      command = self._upcoming()
      assert "--config.task" not in command, command
      self.done.append(command)
      self._serve_command = command
    script = self._script(self._serve_command).replace("python -m", "exec python -m", 1)
    with open(self.log, "a") as log:
      self.server = subprocess.Popen(["bash", "-c", script], cwd=ROOT, stdout=log, stderr=log)
    deadline = time.time() + 120
    while True:
      try:
        with socket.create_connection(("127.0.0.1", self.port), timeout=1):
          return
      except OSError:
        assert self.server.poll() is None, open(self.log).read()
        assert time.time() < deadline, "the labeling server did not start"
        time.sleep(0.2)

  def kill(self) -> None:
    """SIGKILL, as a crash."""
    self.server.kill()
    self.server.wait(30)

  def stop(self) -> None:
    if self.server is not None and self.server.poll() is None:
      self.server.terminate()
      self.server.wait(30)


def _label_pairs(driver, labels: "Labels", n: int, answer, answered: dict) -> None:
  """Labels `n` pairs by keyboard, `answer(i, assignment)` giving the i-th pair's answers."""
  for i in range(n):
    state = _wait(driver, lambda s: s["assignment"], "a pair to label")
    _check_shown(driver, labels, state["assignment"])
    answers = answer(i, state["assignment"])
    _label_by_keyboard(driver, answers)
    answered[state["assignment"]] = answers
    _wait(driver, lambda s, a=state["assignment"]: s["finished"] or
          s["assignment"] not in (None, a), "the next pair")


def test_the_documented_round(tiny_pipeline, tmp_path, browser):
  """docs/labeling.md's round with its own commands: load, serve, the admin's link, labelling in
  Chromium by two labelers (the second invited from the admin page) with the mouse, the keyboard,
  a revision, a skip and a flag, 20 labels, the server killed under a pending save, the admin's
  pages (flags, disagreements, downloads, revoking), then label_export and task=rm on the export
  with no size chosen by hand."""
  _, source = tiny_pipeline
  root = str(tmp_path)
  shutil.copytree(source, os.path.join(root, "runs", "quickstart"))
  port = _free_port()
  base = f"http://127.0.0.1:{port}"
  doc = DocRound(root, port)
  workdir = os.path.join(root, "runs", "quickstart")
  out = doc.next("label_load")
  assert re.search(r"label_load: (\d+) new pairs", out), out
  labels = Labels(os.path.join(workdir, "labeling", "labels.db"))
  doc.serve()
  try:
    out = doc.next("label_user")
    links = re.findall(r"^(http://\S+/login#token=\S+)$", out, re.M)
    assert len(links) == 1 and links[0].startswith(f"{base}/login#token="), out
    driver = browser

    # One click: the link's page says it is ready, with the button focused; Enter presses it.
    driver.get("about:blank")
    driver.get(links[0])
    _wait(driver, lambda s: s["path"] == "/login" and s["hash"] == "", "the token to leave the bar")
    ready = driver.execute_script(
        "return [!document.getElementById('ready').hidden, document.activeElement.id, "
        "document.getElementById('paste').hidden];")
    assert ready == [True, "sign-in", True]
    _keys(driver, Keys.ENTER)
    # An admin lands on the admin page, handed no pairs until she chooses to label too.
    _wait(driver, lambda s: s["path"] == "/admin", "the admin page")
    assert "only 0 people" in driver.find_element(By.ID, "k-warning").text
    driver.find_element(By.ID, "label-too").click()
    first = _wait(driver, lambda s: s["assignment"], "the labeling page")
    assert first["path"] == "/" and first["done"] == "0" and first["current"] == "q-0"

    # The admin invites bob from the admin page.
    driver.get(base + "/admin")
    driver.find_element(By.LINK_TEXT, "Labelers: invite, revoke").click()
    driver.find_element(By.ID, "invite-name").send_keys("bob")
    driver.find_element(By.ID, "invite").click()
    bob_link = _until(driver, lambda d: d.find_element(By.ID, "invite-link"))
    bob_link = bob_link.get_attribute("value")
    assert bob_link.startswith(f"{base}/login#token=")
    assert "invited, not signed in yet" in driver.find_element(By.ID, "team").text

    # Pair 1 by mouse, pair 2 by keyboard alone, then U revises pair 2.
    driver.get(base + "/")
    first = _wait(driver, lambda s: s["assignment"], "the labeling page")
    mouse = {"preference": "2", "left.overall": "6", "left.accuracy": "7", "left.coverage": "5",
             "left.coherence": "6", "right.overall": "3", "right.accuracy": "2",
             "right.coverage": "4", "right.coherence": "1"}
    for field in FIELDS:
      _click(driver, field, mouse[field])
    driver.find_element(By.ID, "submit").click()
    second = _wait(driver, lambda s: s["assignment"] not in (None, first["assignment"]),
                   "the next pair after a mouse submission")
    assert second["done"] == "1" and second["checked"] == {}
    _check_label(labels, first["assignment"], mouse)
    _keys(driver, Keys.ENTER)
    _wait(driver, lambda s: "Answer every question" in s["status"], "the missing-answer hint")
    keyboard = {"preference": "8", "left.overall": "1", "left.accuracy": "2", "left.coverage": "3",
                "left.coherence": "7", "right.overall": "5", "right.accuracy": "6",
                "right.coverage": "7", "right.coherence": "1"}
    _keys(driver, "8", "1", "2", "3", "4")
    assert _state(driver)["current"] == "q-5"
    _keys(driver, Keys.ARROW_UP, "7", "5", "6", "7", "1")
    assert _state(driver)["checked"] == keyboard
    _keys(driver, Keys.ENTER)
    third = _wait(driver, lambda s: s["assignment"] not in (None, second["assignment"]),
                  "the next pair after a keyboard submission")
    _check_label(labels, second["assignment"], keyboard)
    _keys(driver, "u")
    edit = _wait(driver, lambda s: s["path"] == f"/label/{second['assignment']}", "the last label")
    assert edit["checked"] == keyboard and "Saved earlier" in edit["status"]
    _keys(driver, "3", Keys.ENTER)
    back = _wait(driver, lambda s: s["path"] == "/" and s["assignment"],
                 "the page after a revision")
    assert back["assignment"] == third["assignment"]
    _check_label(labels, second["assignment"], {**keyboard, "preference": "3"}, revisions=1)
    answered = {first["assignment"]: mouse, second["assignment"]: {**keyboard, "preference": "3"}}

    # S skips the pair; F opens the flag box, the comment is typed (its digits answer nothing).
    _keys(driver, "s")
    skipped = third["assignment"]
    fourth = _wait(driver, lambda s: s["assignment"] not in (None, skipped),
                   "the pair after a skip")
    assert labels.assignment(skipped)["skipped"] is not None
    _keys(driver, "f")
    WebDriverWait(driver, 5).until(lambda d: d.switch_to.active_element.get_attribute("id") ==
                                   "flag-comment")
    _keys(driver, "Summary B is cut off after 12 words")
    assert _state(driver)["checked"] == {}
    driver.find_element(By.ID, "flag").click()
    fifth = _wait(driver, lambda s: s["assignment"] not in (None, fourth["assignment"]),
                  "the pair after a flag")

    # The server dies under a pending save: the fixed status bar says so, in view after keyboard
    # labelling; the label is stored once the server is back.
    doc.kill()
    pending = dict(zip(FIELDS, "927364517"))
    _label_by_keyboard(driver, pending)
    _wait(driver, lambda s: "Not saved yet" in (s["status"] or ""), "the pending save")
    bar = driver.execute_script(
        "const r = document.getElementById('statusbar').getBoundingClientRect();"
        "return [r.top >= 0, r.bottom <= window.innerHeight, r.height > 0, "
        "document.getElementById('statusbar').className, window.scrollY];")
    assert bar[:4] == [True, True, True, "pending"], bar
    doc.serve()
    _wait(driver, lambda s: s["done"] == "3" and s["assignment"] != fifth["assignment"],
          "the pending label delivered after the restart", timeout=60)
    answered[fifth["assignment"]] = pending
    _check_label(labels, fifth["assignment"], pending)

    # Ada labels 7 more (10 labels), Bob signs in with his invitation and labels 10.
    _label_pairs(driver, labels, 7, lambda i, _: dict(zip(FIELDS, "19"[i % 2] + "27364517")),
                 answered)
    ada_cookies = driver.get_cookies()
    driver.delete_all_cookies()
    _sign_in(driver, bob_link)

    def against_ada(i: int, assignment: str) -> dict[str, str]:
      """Bob prefers the other response wherever Ada labelled the pair (so they disagree)."""
      mine = labels.assignment(assignment)
      hers = [r["preference"] for r in labels.rows() if r["labeler"] == "ada" and
              (r["response_a"], r["response_b"]) == (mine["response_a"], mine["response_b"])]
      wants_b = hers[0] == 0.0 if hers else i % 2 == 0
      return dict(zip(FIELDS, ("1" if wants_b == bool(mine["swapped"]) else "9") + "57364217"))
    _label_pairs(driver, labels, 10, against_ada, answered)
    bob_cookies = driver.get_cookies()
    assert driver.execute_script("return document.querySelector('a[href=\"/admin\"]')") is None
    driver.get(base + "/admin/disagreements")
    assert "admins only" in driver.find_element(By.CSS_SELECTOR, ".error").text
    driver.get(base + "/mine")
    rows = driver.find_elements(By.CSS_SELECTOR, "#mine tbody tr")
    assert len(rows) == 10 and "better" in rows[0].text and "UTC" in rows[0].text
    driver.find_element(By.LINK_TEXT, "Guidelines").click()
    _until(driver, lambda d: "9-point" in d.find_element(By.ID, "guidelines").text)
    rows = labels.rows()
    assert len(rows) == 20 and {r["labeler"] for r in rows} == {"ada", "bob"}
    for r in rows:
      _check_label(labels, str(r["assignment_id"]), answered[str(r["assignment_id"])],
                   revisions=int(str(r["assignment_id"]) == second["assignment"]))

    # The admin: the flag (released), the disagreements, a download, revoking bob.
    driver.delete_all_cookies()
    for c in ada_cookies:
      driver.add_cookie(c)
    driver.get(base + "/admin/flags")
    assert "Summary B is cut off" in driver.find_element(By.CSS_SELECTOR, ".flag").text
    driver.find_element(By.CSS_SELECTOR, ".flag button[value=release]").click()
    _until(driver, lambda d: d.find_elements(By.ID, "no-flags"))
    driver.get(base + "/admin/disagreements")
    split = driver.find_elements(By.CSS_SELECTOR, ".disagreement")
    assert split and all({"ada", "bob"} <= {td.text for td in d.find_elements(
        By.CSS_SELECTOR, ".answers td:first-child")} for d in split)
    # Accept the first pair's labels, then hide the accepted ones.
    accepted = split[0].get_attribute("data-pair")
    split[0].find_element(By.CSS_SELECTOR, "button[value=accept]").click()
    _until(driver, lambda d: "accepted by ada" in d.find_element(
        By.CSS_SELECTOR, f'.disagreement[data-pair="{accepted}"] .review').text)
    driver.find_element(By.LINK_TEXT, "Hide accepted pairs").click()
    _until(driver, lambda d: d.find_elements(By.LINK_TEXT, "show them"))
    assert accepted not in {d.get_attribute("data-pair") for d in driver.find_elements(
        By.CSS_SELECTOR, ".disagreement")}
    driver.get(base + "/admin")
    downloads = os.path.join(root, "downloads")
    os.makedirs(downloads)
    driver.execute_cdp_cmd("Browser.setDownloadBehavior",
                           {"behavior": "allow", "downloadPath": downloads})
    driver.find_element(By.CSS_SELECTOR, 'a[href="/admin/export/openai/train"]').click()
    target = os.path.join(downloads, "train.jsonl")
    deadline = time.time() + 20
    while not os.path.exists(target) and time.time() < deadline:
      time.sleep(0.1)
    downloaded = open(target, encoding="utf-8").read()
    driver.get(base + "/admin/labelers")
    driver.find_element(By.CSS_SELECTOR, 'tr[data-name="bob"] form.revoke button').click()
    _until(driver, lambda d: "revoked" in d.find_element(
        By.CSS_SELECTOR, 'tr[data-name="bob"] .status').text)
    driver.delete_all_cookies()
    for c in bob_cookies:
      driver.add_cookie(c)
    driver.get(base + "/")
    assert _state(driver)["path"] == "/login"  # Bob's session ended.
  finally:
    doc.stop()
  server_log = open(doc.log).read()
  assert "sign-in: ada from 127.0.0.1" in server_log and "sign-in: bob" in server_log
  assert re.search(r"127\.0\.0\.1 POST /label/\d+ 200 \d+ms ada", server_log)
  assert "token=" not in server_log and "Traceback" not in server_log

  # Work out, and a reward model trained on the export with the doc's commands.
  out = doc.next("label_export")
  counts = dict(re.findall(r"export/(train|valid)\.jsonl: (\d+) labels", out))
  assert int(counts["train"]) + int(counts["valid"]) == 20 and int(counts["valid"]) > 0, out
  export = os.path.join(workdir, "labeling", "export")
  assert open(os.path.join(export, "train.jsonl"), encoding="utf-8").read() == downloaded
  doc.next("cp -r")
  out = doc.next("--config.task=rm")
  human = os.path.join(root, "runs", "human_rm", "rm")
  assert os.listdir(os.path.join(human, "model")), out
  report = json.load(open(os.path.join(human, "eval.json")))
  assert "human" in report["label_source"] and "2 labelers" in report["label_source"], report
  assert len(doc.done) == len(doc.commands)


@pytest.mark.skipif(os.environ.get("RLHFJAX_SCREENSHOT") != "1",
                    reason="set RLHFJAX_SCREENSHOT=1 to write docs/img/labeling*.png")
def test_screenshot(tmp_path, browser, monkeypatch):
  """docs/img/labeling.png (the page at 1280x900 with two answers given), labeling-mine.png and
  labeling-admin.png, on pairs with readable text (a test post's reference summary against a copy
  with one fact made wrong), two labelers answering as careful ones would."""
  workdir, port = str(tmp_path), _free_port()
  base = f"http://127.0.0.1:{port}"
  path = os.path.join(workdir, "pairs.jsonl")
  config = _config("label_load", port)
  comps = contrast.comparisons(loading.load_splits(config.data)["test"], 0)[:8]
  records.write(path, comps, "openai")
  right_answers = {c.response_b if c.choice else c.response_a for c in comps}
  main.run(_config("label_load", port, source=f"comparisons:{path}"), workdir)
  links = {name: main.run(_config("label_user", port, user=name, admin=name == "ada"), workdir)
           for name in ("ada", "bob")}
  tasks.open_store(_config("label_server", port), workdir)[0].set_also_labels("ada", True)
  server = Server(_config("label_server", port), workdir, monkeypatch)

  def shot(name: str) -> None:
    browser.execute_script("window.scrollTo(0, 0)")
    browser.save_screenshot(os.path.join(os.path.dirname(SCREENSHOT), name))

  def careful(good_left: bool, rating: str) -> dict[str, str]:
    better, worse = ("6576", "3354") if good_left else ("3354", "6576")
    return dict(zip(FIELDS, rating + better + worse))

  try:
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False})
    for name, pairs in (("bob", 3), ("ada", 3)):
      browser.delete_all_cookies()
      _sign_in(browser, links[name])
      for n in range(pairs):
        _wait(browser, lambda s: s["assignment"], "the labeling page")
        left = browser.execute_script("return document.querySelector('#left .text').textContent")
        good_left = left in right_answers
        rating = ("2" if good_left else "8") if n or name == "bob" else ("7" if good_left else "3")
        _label_by_keyboard(browser, careful(good_left, rating))
        _wait(browser, lambda s: s["done"] == str(n + 1), "the next pair")
    state = _wait(browser, lambda s: s["assignment"], "the labeling page")
    left = browser.execute_script("return document.querySelector('#left .text').textContent")
    good_left = left in right_answers  # Answer as a careful labeler would.
    _click(browser, "preference", "3" if good_left else "7")
    _click(browser, "left.overall", "6" if good_left else "3")
    assert state["assignment"]
    os.makedirs(os.path.dirname(SCREENSHOT), exist_ok=True)
    shot("labeling.png")
    browser.get(base + "/mine")
    shot("labeling-mine.png")
    browser.get(base + "/admin")
    shot("labeling-admin.png")
    browser.get(base + "/admin/disagreements")
    shot("labeling-disagreements.png")
  finally:
    browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    server.stop()


class SmallSite:
  """A labeling database of the given pairs (`sources.item` dicts) with its labelers, served by
  task=label_server in a thread under `protocol`; `link(name)` makes a new sign-in link."""

  def __init__(self, workdir: str, pairs: list[dict], labelers: dict[str, bool], monkeypatch,
               protocol: str = "stiennon", **labeling):
    self.protocol = protocol
    self.labeling = labeling
    self.port = _free_port()
    self.base = f"http://127.0.0.1:{self.port}"
    self.workdir = workdir
    self.store, _ = tasks.open_store(self._config("label_server"), workdir)
    assert self.store.add_items(pairs) == len(pairs)
    self.admin = labelers
    self.links = {name: self.link(name) for name in labelers}
    self.labels = Labels(self.store.path)
    self.server = Server(self._config("label_server"), workdir, monkeypatch)

  def _config(self, task: str):
    return _config(task, self.port, source="", protocol=self.protocol, **self.labeling)

  def link(self, name: str) -> str:
    if store_lib.NAME.fullmatch(name):
      token = self.store.add_labeler(name, self.admin[name], 3600.0)
    else:  # A name from before the store checked names (it refuses this one now), written directly.
      token, now = secrets.token_urlsafe(24), time.time()
      with self.store.write() as db:
        db.execute("INSERT INTO labelers (name, is_admin, token_hash, token_expires, created) "
                   "VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET token_hash = "
                   "excluded.token_hash, token_expires = excluded.token_expires",
                   (name, self.admin[name], store_lib.digest(token), now + 3600, now))
    if self.admin[name]:  # An admin of these tests labels too.
      self.store.set_also_labels(name, True)
    return f"{self.base}/login#token={token}"

  def end_sessions(self) -> None:
    """Every session expires now, as after `labeling.session_hours`."""
    db = sqlite3.connect(self.store.path)
    try:
      with db:
        db.execute("UPDATE sessions SET expires = 0")
    finally:
      db.close()

  def stop(self) -> None:
    self.server.stop()
    self.store.close()


def _pair(n: int, text: str = "") -> dict:
  """A pair whose every text is `text` after a label of its own (so each can be found)."""
  prompt = {"id": f"p{n}", "prompt": f"prompt {n} {text}", "title": f"title {n} {text}",
            "subreddit": f"sub{n} {text}", "input": f"input {n} {text}"}
  return sources.item(prompt, f"summary A{n} {text}", f"summary B{n} {text}", "a", "b", "train")


# Markup in model outputs and data: an element, a script, and a quote that ends an attribute.
MARKUP = ('<img src=x onerror="window.__pwned=1"> <script>window.__pwned=2</script> '
          '"><svg onload="window.__pwned=3">')
MARKUP_NAME = 'eve"><img src=x onerror="window.__pwned=4">'  # An earlier version's name.


def _check_inert(driver, where: str) -> None:
  """No markup from the data ran or became an element (whatever the CSP would also block)."""
  found = driver.execute_script(
      "return {pwned: window.__pwned ?? null, elements: Array.from(document.querySelectorAll("
      "'img, svg, script:not([src]), iframe, object, embed'), (e) => e.outerHTML)};")
  assert found == {"pwned": None, "elements": []}, where


def test_markup_in_the_data_is_text(tmp_path, browser, monkeypatch):
  """Pair texts and a labeler's name holding markup are shown literally and run nothing on the
  labeling page, /mine and /admin."""
  site = SmallSite(str(tmp_path), [_pair(0, MARKUP)], {MARKUP_NAME: True}, monkeypatch)
  try:
    driver = browser
    _sign_in(driver, site.links[MARKUP_NAME])
    state = _wait(driver, lambda s: s["assignment"], "the labeling page")
    _check_inert(driver, "the labeling page")
    shown = driver.execute_script("""
      const text = (css) => document.querySelector(css).textContent;
      return {left: text('#left .text'), right: text('#right .text'), meta: text('#prompt .meta'),
              title: text('#prompt h2'), prompt: text('#prompt > .text:not(.input)'),
              input: text('#prompt .input'), me: text('header .me'),
              labeler: document.getElementById('label-form').dataset.labeler};""")
    assert {shown["left"], shown["right"]} == {f"summary A0 {MARKUP}", f"summary B0 {MARKUP}"}
    assert shown["meta"] == f"r/sub0 {MARKUP}" and shown["title"] == f"title 0 {MARKUP}"
    assert shown["prompt"] == f"prompt 0 {MARKUP}" and shown["input"] == f"input 0 {MARKUP}"
    assert shown["me"] == shown["labeler"] == MARKUP_NAME
    answers = dict(zip(FIELDS, "317264517"))
    _label_by_keyboard(driver, answers)
    _wait(driver, lambda s: s["finished"], "the finished page")
    _check_inert(driver, "the finished page")
    _check_label(site.labels, state["assignment"], answers)

    driver.get(site.base + "/mine")
    _check_inert(driver, "/mine")
    cells = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#mine tbody td")]
    assert cells[0].startswith("title 0 <img src=x onerror=")
    driver.get(site.base + "/admin")
    _check_inert(driver, "/admin")
    names = driver.find_elements(By.CSS_SELECTOR, "#labelers tbody td:first-child")
    assert [e.text for e in names] == [MARKUP_NAME]

    # Sign out (a form POST: Chromium sends it with `Origin: null` under no-referrer) ends the
    # session.
    driver.find_element(By.CSS_SELECTOR, "header form.inline button").click()
    _wait(driver, lambda s: s["path"] == "/login" and not s["error"], "the sign-in page", 5)
    assert not site.store.read().execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
    driver.get(site.base + "/mine")
    assert _state(driver)["path"] == "/login"
  finally:
    site.stop()


def _pending(driver, site, name: str, database: str | None = None) -> list | None:
  """The labels the browser keeps for `name` on the site's database (or another's), oldest first;
  None when it keeps none."""
  raw = driver.execute_script("return localStorage.getItem(arguments[0]);",
                              f"rlhfjax-pending-label:{database or site.store.database}:{name}")
  if raw is None:
    return None
  entries = json.loads(raw)
  entries = [entries] if "payload" in entries else list(entries.values())  # One: an older page's.
  return sorted(entries, key=lambda e: e.get("kept", 0))


def test_label_after_the_session_ended_is_kept_and_sent(tmp_path, browser, monkeypatch):
  """Submitted once the session has expired: the label waits in the browser under its labeler's
  name and database (another labeler's page, or a page of another database served at the same
  address, neither sends nor drops it; a damaged or refused entry of their own is dropped), and is
  stored once when its labeler signs in again, with the new session's CSRF token."""
  site = SmallSite(str(tmp_path), [_pair(0), _pair(1)], {"ada": False, "bob": False},
                   monkeypatch)
  try:
    driver = browser
    _sign_in(driver, site.links["ada"])
    first = _wait(driver, lambda s: s["assignment"], "Ada's first pair")
    answers = dict(zip(FIELDS, "827364517"))
    _keys(driver, *(answers[f] for f in FIELDS))
    site.end_sessions()
    _keys(driver, Keys.ENTER)
    _wait(driver, lambda s: "Signed out" in (s["status"] or ""), "the signed-out notice", 5)
    _wait(driver, lambda s: s["path"] == "/login", "the sign-in page", 5)
    [kept] = _pending(driver, site, "ada")
    assert kept["assignment"] == first["assignment"] and kept["payload"]["answers"] == answers
    assert not site.labels.rows()

    # Bob's page leaves Ada's label alone; an entry of his own that is damaged, or refused (not his
    # assignment), is dropped, the refusal said.
    _sign_in(driver, site.links["bob"])
    bob = _wait(driver, lambda s: s["assignment"], "Bob's page")
    assert bob["status"] == "" and _pending(driver, site, "ada") == [kept]
    mine = f"rlhfjax-pending-label:{site.store.database}:bob"
    driver.execute_script("localStorage.setItem(arguments[0], '{damaged');", mine)
    driver.refresh()
    bob = _wait(driver, lambda s: s["assignment"], "Bob's page again")
    assert bob["status"] == "" and _pending(driver, site, "bob") is None
    refused = """
      const csrf = document.getElementById('label-form').elements.csrf.value;
      localStorage.setItem(arguments[0], JSON.stringify({assignment: arguments[1],
          payload: {csrf: csrf, submission: 'x', answers: arguments[2]}}));"""
    # Bob's entry for another database (a pilot served here before) waits for that database.
    driver.execute_script(refused, "rlhfjax-pending-label:0123456789abcdef:bob",
                          bob["assignment"], answers)
    driver.refresh()
    bob = _wait(driver, lambda s: s["assignment"], "Bob's page beside another database's entry")
    assert bob["status"] == "" and not site.labels.rows()
    assert _pending(driver, site, "bob", "0123456789abcdef") is not None
    driver.execute_script(refused, mine, first["assignment"], answers)
    driver.refresh()
    bob = _wait(driver, lambda s: "not kept" in (s["status"] or ""), "Bob's refused entry", 5)
    assert "no such assignment" in bob["status"] and _pending(driver, site, "bob") is None
    assert _pending(driver, site, "ada") is not None and not site.labels.rows()

    # Ada signs in again: her label goes, once, and her next pair comes.
    _sign_in(driver, site.link("ada"))
    state = _wait(driver, lambda s: s["done"] == "1" and s["assignment"] not in (
        None, first["assignment"]), "Ada's next pair after her kept label was sent")
    assert _pending(driver, site, "ada") is None
    _check_label(site.labels, first["assignment"], answers)
    assert len(site.labels.rows()) == 1 and state["checked"] == {}
  finally:
    site.stop()


def test_two_tabs_each_keep_their_label_until_it_is_stored(tmp_path, browser, monkeypatch):
  """Two tabs of one labeler, each submitting after the session expired: the browser keeps both
  labels (it kept one slot, so the second replaced the first, which was lost), and after signing
  in again each is stored once on its own pair, the oldest first."""
  site = SmallSite(str(tmp_path), [_pair(0), _pair(1), _pair(2)], {"ada": False}, monkeypatch)
  try:
    driver = browser
    _sign_in(driver, site.links["ada"])
    first = _wait(driver, lambda s: s["assignment"], "Ada's first pair")
    _label_by_keyboard(driver, dict(zip(FIELDS, "827364517")))
    second = _wait(driver, lambda s: s["assignment"] not in (None, first["assignment"]),
                   "Ada's second pair")
    tab_a = driver.current_window_handle
    driver.switch_to.new_window("tab")  # Tab B changes her first label.
    driver.get(f"{site.base}/label/{first['assignment']}")
    _wait(driver, lambda s: s["assignment"] == first["assignment"], "the first pair in tab B")
    site.end_sessions()
    answers_a, answers_b = dict(zip(FIELDS, "235476123")), dict(zip(FIELDS, "746253471"))
    driver.switch_to.window(tab_a)
    _label_by_keyboard(driver, answers_a)
    _wait(driver, lambda s: s["path"] == "/login", "tab A at the sign-in page", 5)
    driver.switch_to.window([h for h in driver.window_handles if h != tab_a][0])
    # Every question is answered here already: a digit answers the highlighted one, the arrow
    # moves on.
    _keys(driver, *(k for f in FIELDS for k in (answers_b[f], Keys.ARROW_DOWN)), Keys.ENTER)
    _wait(driver, lambda s: s["path"] == "/login", "tab B at the sign-in page", 5)
    kept = _pending(driver, site, "ada")
    assert [k["assignment"] for k in kept] == [second["assignment"], first["assignment"]]
    _sign_in(driver, site.link("ada"))  # Sends tab A's label; the page after it, tab B's.
    _wait(driver, lambda s: s["assignment"] and _pending(driver, site, "ada") is None,
          "both kept labels sent", 15)
    _check_label(site.labels, second["assignment"], answers_a)
    _check_label(site.labels, first["assignment"], answers_b, revisions=1)
    assert len(site.labels.rows()) == 2
  finally:
    site.stop()


def test_binary_protocol_thumbs_up_and_down(tmp_path, browser, monkeypatch):
  """The binary protocol in Chromium: one response shown, no sides; thumbs up by mouse, thumbs
  down by keyboard, then `U` turns that one up; each label stored as 1 (up) or 0 (down), /mine
  in the protocol's words, and the admin's download is binary feedback in the binary layout."""
  texts = {f"summary {n}" for n in range(3)}
  items = [sources.item({"id": f"p{n}", "prompt": f"post {n}", "title": f"title {n}",
                         "subreddit": "tifu", "input": ""}, f"summary {n}", "", "sft", "", "train")
           for n in range(3)]
  site = SmallSite(str(tmp_path), items, {"ada": True}, monkeypatch, protocol="binary")
  try:
    driver = browser
    _sign_in(driver, site.links["ada"])
    first = _wait(driver, lambda s: s["assignment"], "the labeling page")
    shown = driver.execute_script(
        "return [document.querySelector('#response .text').textContent, "
        "document.querySelectorAll('#left, #right, mark').length, "
        "document.querySelectorAll('fieldset.question').length];")
    assert shown[0] in texts and shown[1:] == [0, 1]
    _click(driver, "label", "up")
    driver.find_element(By.ID, "submit").click()
    second = _wait(driver, lambda s: s["assignment"] not in (None, first["assignment"]),
                   "the next response after a mouse submission")
    assert second["done"] == "1" and second["checked"] == {}
    _keys(driver, "2", Keys.ENTER)
    third = _wait(driver, lambda s: s["assignment"] not in (None, second["assignment"]),
                  "the next response after a keyboard submission")
    assert site.labels.get(second["assignment"])["preference"] == 0.0
    _keys(driver, "u")
    edit = _wait(driver, lambda s: s["path"] == f"/label/{second['assignment']}", "the last label")
    assert edit["checked"] == {"label": "down"} and "Saved earlier" in edit["status"]
    _keys(driver, "1", Keys.ENTER)
    _wait(driver, lambda s: s["path"] == "/" and s["assignment"] == third["assignment"],
          "the page after a revision")
    _keys(driver, "2", Keys.ENTER)
    _wait(driver, lambda s: s["finished"], "the finished page")
    answered = {first["assignment"]: ("up", 1.0, 0), second["assignment"]: ("up", 1.0, 1),
                third["assignment"]: ("down", 0.0, 0)}
    for assignment, (value, preference, revisions) in answered.items():
      row = site.labels.get(assignment)
      assert json.loads(row["shown"]) == {"label": value} and row["preference"] == preference
      assert row["revisions"] == revisions and row["response_b"] == ""
      assert json.loads(row["answers"]) == {"axes_a": None, "axes_b": None, "extra": {}}
    driver.get(site.base + "/mine")
    words = sorted(e.text for e in driver.find_elements(By.CSS_SELECTOR, "#mine tbody tr"))
    assert sum("thumbs up: good" in w for w in words) == 2
    assert sum("thumbs down: not good" in w for w in words) == 1

    # The admin's download: the binary layout, one record per label.
    driver.get(site.base + "/admin")
    downloads = os.path.join(str(tmp_path), "downloads")
    os.makedirs(downloads)
    driver.execute_cdp_cmd("Browser.setDownloadBehavior",
                           {"behavior": "allow", "downloadPath": downloads})
    driver.find_element(By.CSS_SELECTOR, 'a[href="/admin/export/binary/train"]').click()
    target = os.path.join(downloads, "train.jsonl")
    deadline = time.time() + 20
    while not os.path.exists(target) and time.time() < deadline:
      time.sleep(0.1)
    got = records.read_binary_strict(target)
    by_text = {row["response_a"]: row["preference"] == 1.0 for row in site.labels.rows()}
    assert sorted((f.completion, f.label) for f in got) == sorted(by_text.items())
    assert {f.annotator for f in got} == {"ada"} and {f.policy for f in got} == {"sft"}
  finally:
    site.stop()


class Admin:
  """An admin at the live site over plain HTTP (a second browser would do the same clicks)."""

  def __init__(self, site: SmallSite, name: str):
    import httpx  # pylint: disable=g-import-not-at-top
    self.http = httpx.Client(base_url=site.base, headers={"Origin": site.base})
    csrf = re.search(r'name="csrf" value="([^"]+)"', self.http.get("/login").text).group(1)
    token = site.link(name).split("#token=", 1)[1]
    assert self.http.post("/login", data={"token": token, "csrf": csrf}).status_code == 303

  def revoke(self, name: str) -> None:
    page = self.http.get("/admin/labelers").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
    assert self.http.post(f"/admin/labelers/{name}/revoke", data={"csrf": csrf}).is_redirect

  def invite(self, name: str) -> str:
    page = self.http.get("/admin/labelers").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
    page = self.http.post("/admin/labelers", data={"csrf": csrf, "name": name}).text
    return re.search(r'id="invite-link"[^>]*value="([^"]+)"', page).group(1)


@pytest.mark.parametrize("filled", [False, True], ids=["pair still open", "pair filled by others"])
def test_revoke_submit_reinvite_never_puts_a_label_on_another_pair(tmp_path, browser, monkeypatch,
                                                                    filled):
  """The issue's sequence in Chromium: Ada answers a pair; the admin revokes her; she presses
  Enter (the page says an admin signed her out, and so does the sign-in page); the admin invites
  her again and she signs in. Her kept answer is then stored on the pair she answered, in the
  order she saw it, when the pair still needs her; when Bob filled it meanwhile (one label per
  pair), it is refused with a message on her page. It is never stored on another pair."""
  site = SmallSite(str(tmp_path), [_pair(n) for n in range(4)],
                   {"boss": True, "ada": False, "bob": False}, monkeypatch,
                   labels_per_pair=1 if filled else 2)
  try:
    admin = Admin(site, "boss")
    driver = browser
    _sign_in(driver, site.links["ada"])
    first = _wait(driver, lambda s: s["assignment"], "Ada's pair")
    seen = site.labels.assignment(first["assignment"])
    swapped = _check_shown(driver, site.labels, first["assignment"])
    answers = dict(zip(FIELDS, "237364517"))
    _keys(driver, *(answers[f] for f in FIELDS))
    admin.revoke("ada")
    _keys(driver, Keys.ENTER)
    status = _wait(driver, lambda s: "An admin signed you out" in (s["status"] or ""),
                   "the revoked notice", 5)["status"]
    assert "not saved" in status and "kept" not in status.replace("keeps", "")
    _wait(driver, lambda s: s["path"] == "/login", "the sign-in page", 10)
    assert "An admin has signed you out" in driver.find_element(By.ID, "revoked").text
    assert not site.labels.rows()
    if filled:  # Bob takes the pair Ada gave back and labels it (one label per pair here).
      bob = site.store.read().execute("SELECT id FROM labelers WHERE name = 'bob'").fetchone()[0]
      row = site.store.next_assignment(bob)
      assert row["id"] == seen["item_id"]
      site.store.submit(bob, row["assignment_id"], 1.0, {"extra": {}}, {}, "bob", None,
                        item_id=row["id"], swapped=bool(row["swapped"]))

    _sign_in(driver, admin.invite("ada"))
    if filled:
      state = _wait(driver, lambda s: "not kept" in (s["status"] or ""), "the refusal", 15)
      assert "no such assignment" in state["status"]
      assert state["assignment"] != first["assignment"] and state["checked"] == {}
      assert [r["labeler"] for r in site.labels.rows()] == ["bob"]
    else:
      _wait(driver, lambda s: s["done"] == "1" and s["assignment"] not in (
          None, first["assignment"]), "the kept answer sent, then the next pair", 15)
      (label,) = site.labels.rows()
      assert label["assignment_id"] == int(first["assignment"]) and label["labeler"] == "ada"
      assert site.labels.assignment(first["assignment"])["item_id"] == seen["item_id"]
      assert bool(label["swapped"]) == swapped
      _check_label(site.labels, first["assignment"], answers)
    assert _pending(driver, site, "ada") is None
  finally:
    site.stop()


def test_drafts_survive_a_reload_and_each_action_is_acknowledged(tmp_path, browser, monkeypatch):
  """Half-answered, reloaded: the answers and a flag's comment come back (for this pair only);
  then 'Saved.' (with U to change it), 'Skipped' and 'Flag sent' each show on the next page, and a
  time on /mine has the local time beside UTC."""
  site = SmallSite(str(tmp_path), [_pair(n) for n in range(4)], {"ada": False}, monkeypatch)
  try:
    driver = browser
    _sign_in(driver, site.links["ada"])
    first = _wait(driver, lambda s: s["assignment"], "Ada's pair")
    half = dict(zip(FIELDS[:3], "237"))
    _keys(driver, *half.values())
    driver.refresh()
    back = _wait(driver, lambda s: s["assignment"] == first["assignment"], "the reloaded pair")
    assert back["checked"] == half and "draft" in back["status"]
    assert back["current"] == "q-3"
    rest = dict(zip(FIELDS[3:], "364517"))
    _keys(driver, *rest.values(), Keys.ENTER)
    saved = _wait(driver, lambda s: s["assignment"] not in (None, first["assignment"]),
                  "the next pair")
    assert saved["status"].startswith("Saved.") and "U" in saved["status"]
    assert saved["search"] == "" and saved["checked"] == {}
    _check_label(site.labels, first["assignment"], {**half, **rest})

    _keys(driver, "f")
    _until(driver, lambda d: d.switch_to.active_element.get_attribute("id") == "flag-comment")
    _keys(driver, "the summaries are swapped")
    driver.refresh()
    _wait(driver, lambda s: s["assignment"] == saved["assignment"], "the reloaded pair")
    assert driver.find_element(By.ID, "flag-comment").get_attribute("value") == \
        "the summaries are swapped"
    driver.find_element(By.ID, "flag").click()
    flagged = _wait(driver, lambda s: s["assignment"] not in (None, saved["assignment"]),
                    "the pair after the flag")
    assert flagged["status"].startswith("Flag sent")
    assert driver.find_element(By.ID, "flag-comment").get_attribute("value") == ""
    _keys(driver, "s")
    skipped = _wait(driver, lambda s: s["assignment"] != flagged["assignment"], "after the skip")
    assert (skipped["status"] or "").startswith("Skipped")
    driver.get(site.base + "/mine")
    cell = driver.find_element(By.CSS_SELECTOR, "#mine tbody td:nth-child(3)").text
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC \(.+ your time\)", cell), cell
  finally:
    site.stop()


def test_the_header_works_400_px_wide(tmp_path, browser, monkeypatch):
  """At 400 px every header item (the links, the name, the counter's parts, Sign out) is on screen
  and none breaks across lines; the pair's two sides stay side by side."""
  site = SmallSite(str(tmp_path), [_pair(n, "a longer text " * 5) for n in range(2)],
                   {"dorothea.longname": True}, monkeypatch)
  try:
    driver = browser
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 400, "height": 800, "deviceScaleFactor": 1, "mobile": True})
    _sign_in(driver, site.links["dorothea.longname"])
    _wait(driver, lambda s: s["assignment"], "the labeling page")
    items = driver.execute_script("""
      const parts = Array.from(document.querySelectorAll(
          'header .site, header nav > a, header .me, .counter .item, #sign-out'));
      return parts.map((e) => {
        const r = e.getBoundingClientRect();
        return {text: e.textContent.trim(), lines: e.getClientRects().length,
                left: r.left, right: r.right, top: r.top, height: r.height};
      });""")
    width = driver.execute_script("return document.documentElement.clientWidth")
    assert width <= 400 and len(items) >= 9, items
    for item in items:
      assert item["lines"] == 1 and item["left"] >= 0 and item["right"] <= width, item
      assert item["height"] < 40, item  # One line of text (a wrapped one is twice as tall).
    assert driver.execute_script("return document.documentElement.scrollWidth") <= width
    if os.environ.get("RLHFJAX_SCREENSHOT") == "1":
      driver.execute_script("window.scrollTo(0, 0)")
      driver.save_screenshot(os.path.join(os.path.dirname(SCREENSHOT), "labeling-400px.png"))
  finally:
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    site.stop()
