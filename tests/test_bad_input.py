"""Bad input anywhere ends in one clear message and leaves what earlier stages wrote as it was:
malformed comparison and tokenizer files (empty, truncated, wrong layout, wrong encoding), a
read-only workdir and a full disk (a small tmpfs in a private mount namespace)."""

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT
from rlhfjax.errors import DataError
from rlhfjax import main


def _digests(directory: str) -> dict[str, str]:
  out = {}
  for root, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
  return out


@pytest.fixture(scope="module")
def earlier(tiny_pipeline, tmp_path_factory):
  """A workdir holding what the tiny pipeline's SFT and labelling stages wrote, and its digests."""
  config, workdir = tiny_pipeline
  out = str(tmp_path_factory.mktemp("earlier"))
  for name in ("config.json", "tokenizer.model"):
    shutil.copy(os.path.join(workdir, name), out)
  for name in ("sft", "label"):
    shutil.copytree(os.path.join(workdir, name), os.path.join(out, name))
  return config, out, _digests(out)


def _comparisons(path, kind: str) -> None:
  """A comparisons file that is `kind` of wrong, made from the tiny run's own valid.jsonl."""
  with open(path.parent.parent / "good.jsonl", "rb") as f:
    good = f.read()
  data = {"empty": b"",
          "truncated lines": good[:len(good) // 2],
          "truncated array": ("[" + ",".join(good.decode().splitlines()) + "]").encode()[:300],
          "wrong layout": json.dumps([{"instruction": "i", "input": "", "output_1": "a",
                                       "output_2": "b", "preference": 1}] * 3).encode(),
          "wrong encoding": good.decode().encode("utf-16")}[kind]
  path.write_bytes(data)


@pytest.mark.parametrize("kind, message", [
    ("empty", r"bad\.jsonl holds no comparisons: the file is empty"),
    ("truncated lines", r"bad\.jsonl:\d+: the last line ends mid-record .* looks truncated"),
    ("truncated array", r"bad\.jsonl:1:\d+: invalid JSON: .*one JSON array; none of it was read"),
    ("wrong layout", r"bad\.jsonl holds no comparisons: .*bad\.jsonl: record 1 \(index 0\): .*"
                     r"\(and 2 more; is the layout 'openai' right\?\)"),
    ("wrong encoding", r"bad\.jsonl: not UTF-8 JSON: it holds UTF-16 or UTF-32 text; convert it"),
])
def test_malformed_comparisons_file(earlier, tmp_path, kind, message):
  config, workdir, before = earlier
  shutil.copy(os.path.join(workdir, "label", "valid.jsonl"), tmp_path / "good.jsonl")
  (tmp_path / "in").mkdir()
  bad = tmp_path / "in" / "bad.jsonl"
  _comparisons(bad, kind)
  work = str(tmp_path / "work")
  shutil.copytree(workdir, work)
  config = config.copy_and_resolve_references()
  config.task, config.rm.valid_file = "rm", str(bad)
  with pytest.raises(DataError, match=message):
    main.run(config, work)
  after = _digests(work)
  assert {k: v for k, v in after.items() if k != "config.json"} == \
         {k: v for k, v in before.items() if k != "config.json"}
  assert not os.path.exists(os.path.join(work, "rm", "model"))


@pytest.mark.parametrize("kind", ["empty", "truncated", "wrong format"])
def test_malformed_tokenizer_file(earlier, tmp_path, kind):
  config, workdir, before = earlier
  with open(os.path.join(workdir, "tokenizer.model"), "rb") as f:
    good = f.read()
  bad = tmp_path / "bad.model"
  bad.write_bytes({"empty": b"", "truncated": good[:len(good) // 3],
                   "wrong format": b'{"model": "not sentencepiece"}'}[kind])
  work = str(tmp_path / "work")
  shutil.copytree(workdir, work)
  config = config.copy_and_resolve_references()
  config.task, config.tokenizer.path = "rm", str(bad)
  with pytest.raises(DataError, match=r"bad\.model: not a usable SentencePiece model"):
    main.run(config, work)
  assert _digests(work) == before


def _namespaces() -> bool:
  try:
    return subprocess.run(["unshare", "-Urm", "true"], capture_output=True, timeout=30).returncode == 0
  except (OSError, subprocess.TimeoutExpired):
    return False


needs_namespaces = pytest.mark.skipif(
    not _namespaces(), reason="needs `unshare -Urm` (user and mount namespaces) to mount a tmpfs")


def _in_namespace(script: str, tmp_path) -> None:
  """Runs `script` (bash) in private user and mount namespaces, where it may mount a tmpfs."""
  r = subprocess.run(["unshare", "-Urm", "bash", "-euc", script], cwd=ROOT, capture_output=True,
                     text=True, timeout=600, env={**os.environ, "PY": sys.executable})
  assert r.returncode == 0, r.stderr[-3000:]


RM = '"$PY" -m rlhfjax.main --config configs/tldr_sim.py:tiny --workdir "$W" --config.task=rm'


@needs_namespaces
def test_read_only_workdir(earlier, tmp_path):
  _, workdir, before = earlier
  _in_namespace(f"""
    W={tmp_path}/w; mkdir -p "$W"; mount -t tmpfs tmpfs "$W"; cp -a {workdir}/. "$W"/
    mount -o remount,ro "$W"
    {RM} 2> {tmp_path}/err && echo 0 > {tmp_path}/rc || echo $? > {tmp_path}/rc
    cp -a "$W"/. {tmp_path}/after/
  """, tmp_path)
  assert (tmp_path / "rc").read_text().strip() == "2"
  last = (tmp_path / "err").read_text().strip().splitlines()[-1]
  assert last == (f"rlhfjax: error: {tmp_path}/w: Read-only file system; the workdir must be "
                  "writable: fix that (or use another --workdir) and rerun"), last
  assert _digests(str(tmp_path / "after")) == before


@needs_namespaces
def test_full_disk_then_rerun_with_space(earlier, tmp_path):
  """The reward model's checkpoint does not fit: one line names the checkpoint directory, nothing
  earlier changes, nothing looks finished; with space the same command finishes the stage."""
  _, workdir, before = earlier
  _in_namespace(f"""
    W={tmp_path}/w; mkdir -p "$W" {tmp_path}/after
    mount -t tmpfs -o size=$(( $(du -sk {workdir} | cut -f1) + 96 ))k tmpfs "$W"
    cp -a {workdir}/. "$W"/
    {RM} 2> {tmp_path}/err && echo 0 > {tmp_path}/rc || echo $? > {tmp_path}/rc
    cp -a "$W"/. {tmp_path}/after/
    mount -o remount,size=64m "$W"
    {RM} 2> {tmp_path}/err2 && echo 0 > {tmp_path}/rc2 || echo $? > {tmp_path}/rc2
    ls "$W"/rm "$W"/rm/checkpoints > {tmp_path}/ls2
  """, tmp_path)
  err = (tmp_path / "err").read_text()
  assert (tmp_path / "rc").read_text().strip() == "2", err[-3000:]
  last = err.strip().splitlines()[-1]
  assert last.startswith(f"rlhfjax: error: {tmp_path}/w/rm/") and "No space left on device; " \
      "free some space (or use another --workdir) and rerun: it resumes" in last, last
  after = _digests(str(tmp_path / "after"))
  assert {k: after[k] for k in before if k != "config.json"} == \
         {k: v for k, v in before.items() if k != "config.json"}
  assert not any(k.startswith("rm/model") or k.endswith(".tmp") for k in after), sorted(after)
  assert (tmp_path / "rc2").read_text().strip() == "0", (tmp_path / "err2").read_text()[-3000:]
  listed = (tmp_path / "ls2").read_text().split()
  assert "model" in listed and not any(n.endswith("-tmp") for n in listed), listed


def test_a_malformed_comparison_is_reported_once_with_what_was_kept(tmp_path, capsys):
  """The file's count (read, kept, left out) on one line, each malformed record once, and a second
  read of the same file (task=rm's report) says nothing again."""
  from rlhfjax.data import records
  from rlhfjax.training import loaders
  path = str(tmp_path / "c.jsonl")
  one = records.Comparison(prompt="post", response_a="x", response_b="y", choice=0, id="p1")
  records.write(path, [one] * 10 + [records.Comparison(prompt="post", response_a="x",
                                                       response_b="y", choice=0, tie=True,
                                                       id="p2")],
                "openai")
  with open(path, "a", encoding="utf-8") as f:
    f.write('{"bad": 1}\n')
  assert len(loaders.load_comparisons(path, "openai", "rm.train_file")) == 10
  out = capsys.readouterr().out.splitlines()
  assert out[0] == f"{path}: read 12 records, kept 10 (1 malformed, 1 ties left out)"
  assert len([line for line in out if "malformed:" in line and f"{path}:12:" in line]) == 1
  assert len(loaders.load_comparisons(path, "openai", report=False)) == 10
  assert capsys.readouterr().out == ""


def test_a_workdir_that_is_a_file_says_so(tmp_path):
  from conftest import load_config  # pylint: disable=g-import-not-at-top
  from rlhfjax.errors import ConfigError  # pylint: disable=g-import-not-at-top
  path = tmp_path / "notes.txt"
  path.write_text("mine")
  with pytest.raises(ConfigError, match=rf"^--workdir {path} is a file, not a directory"):
    main.run(load_config(), str(path))
  assert path.read_text() == "mine"
