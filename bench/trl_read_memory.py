"""Peak memory of reading a large Parquet file of TRL preference rows, against its decoded text.

  python bench/trl_read_memory.py [--rows 1000000] [--row-group 20000] \
      [--layouts explicit implicit ultrafeedback] [--words N] [--json out.json]

For each layout, writes `--rows` rows of HH-style text in row groups of `--row-group` rows, then
reads it with `records.read(path, "trl")` in a fresh process and prints that process's peak
resident memory (`ru_maxrss`) against the file's decoded text. Layouts (`--words`, the prompt's
mean words, each response half as many; by default 60, 120 and 60):
- explicit: TRL's standard `prompt`, `chosen`, `rejected` (trl-lib/tldr-preference);
- implicit: HH-RLHF's whole `chosen` and `rejected` transcripts, sharing their prompt;
- ultrafeedback: HuggingFaceH4/ultrafeedback_binarized's columns: `prompt`, `prompt_id`,
  conversational `chosen`, `rejected` and `messages` (lists of `{content, role}`), `score_chosen`,
  `score_rejected` (the extra columns stay with each record).

The decoded text is the UTF-8 bytes of every string in the file, nested ones included (an
implicit prompt counts twice, as the file holds it twice). "Before reading" is the resident set
once the interpreter, numpy and pyarrow are loaded; "beyond the text" is the growth to the peak
less the bytes of the distinct strings the records hold, per row. Numbers measured here are in
docs/data.md ("Memory"). Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

WORDS = ("the a of to and in is it you that he was for on are with as his they be at one have this "
         "from or had by hot word but what some we can out other were all there when up use your "
         "how said an each she which do their time if will way about many then them write would "
         "like so these her long make thing see him two has look more day could go come did number "
         "sound no most people my over know water than call first who may down side been now find "
         "garden recipe kitchen Python error memory sleep exercise travel budget").split()
LAYOUTS = {"explicit": 60, "implicit": 120, "ultrafeedback": 60}  # Layout: default --words.


def _texts(rng: np.random.Generator, n: int, words: int) -> list[str]:
  lengths = rng.integers(words // 2, words * 3 // 2, n)
  picks = rng.integers(0, len(WORDS), int(lengths.sum()))
  out, start = [], 0
  for k in lengths:
    out.append(" ".join(WORDS[i] for i in picks[start:start + k]))
    start += k
  return out


def _turns(user: list[str], assistant: list[str]) -> list[list[dict[str, str]]]:
  return [[{"content": u, "role": "user"}, {"content": a, "role": "assistant"}]
          for u, a in zip(user, assistant)]


def _columns(rng: np.random.Generator, n: int, words: int, layout: str) -> dict[str, list]:
  """One row group's columns of `layout`."""
  prompt, chosen, rejected = (_texts(rng, n, w) for w in (words, words // 2, words // 2))
  if layout == "ultrafeedback":
    prompt = [p + "?" for p in prompt]
    return {"prompt": prompt,
            "prompt_id": [hashlib.sha256(p.encode()).hexdigest() for p in prompt],
            "chosen": _turns(prompt, chosen), "rejected": _turns(prompt, rejected),
            "messages": _turns(prompt, chosen),
            "score_chosen": rng.integers(6, 11, n).astype(float).tolist(),
            "score_rejected": rng.integers(1, 6, n).astype(float).tolist()}
  prompt = [f"\n\nHuman: {t}?\n\nAssistant:" for t in prompt]
  chosen, rejected = ([" " + t + "." for t in texts] for texts in (chosen, rejected))
  if layout == "implicit":
    return {"chosen": [p + c for p, c in zip(prompt, chosen)],
            "rejected": [p + r for p, r in zip(prompt, rejected)]}
  return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def text_bytes(array: pa.Array | pa.ChunkedArray) -> int:
  """UTF-8 bytes of every string in `array`, inside lists and structs too."""
  if isinstance(array, pa.ChunkedArray):
    return sum(text_bytes(chunk) for chunk in array.chunks)
  if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
    return int(pc.sum(pc.binary_length(array)).as_py() or 0)
  if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
    return text_bytes(array.flatten())
  if pa.types.is_struct(array.type):
    return sum(text_bytes(array.field(i)) for i in range(array.type.num_fields))
  return 0


def write(path: str, rows: int, words: int, row_group: int, layout: str) -> int:
  """Writes the file one row group at a time; returns the decoded text bytes of its strings."""
  rng = np.random.default_rng(0)
  total, writer = 0, None
  for start in range(0, rows, row_group):
    table = pa.table(_columns(rng, min(row_group, rows - start), words, layout))
    total += sum(text_bytes(column) for column in table.columns)
    writer = writer or pq.ParquetWriter(path, table.schema)
    writer.write_table(table)
  writer.close()
  return total


_READER = """
import dataclasses, json, resource, sys, time
import numpy, pyarrow, pyarrow.parquet
from rlhfjax.data import records
def rss():
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * resource.getpagesize()
def held(x, seen):
  if isinstance(x, str):
    new = id(x) not in seen
    seen.add(id(x))
    return len(x.encode()) if new else 0
  if isinstance(x, (list, tuple)):
    return sum(held(v, seen) for v in x)
  if isinstance(x, dict):
    return sum(held(v, seen) for v in x.values())
  if dataclasses.is_dataclass(x):
    return sum(held(getattr(x, f.name), seen) for f in dataclasses.fields(x))
  return 0
before = rss()
t = time.perf_counter()
comps, problems = records.read(sys.argv[1], "trl")
seconds = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"pool": pyarrow.default_memory_pool().backend_name, "records": len(comps),
                  "problems": len(problems), "seconds": seconds, "rss_before": before,
                  "rss_peak": peak, "record_text_bytes": held(comps, set())}))
"""


def measure(rows: int, words: int, row_group: int, layout: str) -> dict:
  """Writes one file in a temporary directory and reads it in a fresh process."""
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "train-00000-of-00001.parquet")
    t = time.perf_counter()
    text = write(path, rows, words, row_group, layout)
    write_s = time.perf_counter() - t
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    out = subprocess.run([sys.executable, "-c", _READER, path], check=True, capture_output=True,
                         text=True, env=env)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r.update(layout=layout, rows=rows, words=words, row_group=row_group,
             file_bytes=os.path.getsize(path), text_bytes=text, write_seconds=write_s)
  return r


def report(r: dict) -> str:
  mib = lambda b: f"{b / 2**20:,.0f} MiB"
  rows, text, peak = r["rows"], r["text_bytes"], r["rss_peak"]
  grown = peak - r["rss_before"]
  return (f"{r['layout']}: {rows:,} rows, Parquet {mib(r['file_bytes'])} in row groups of "
          f"{r['row_group']:,}; decoded text {mib(text)} ({text:,} bytes, "
          f"{text / rows:,.0f} a row)\n"
          f"  read {r['records']:,} records in {r['seconds']:.1f} s ({rows / r['seconds']:,.0f} "
          f"rows/s, pyarrow pool {r['pool']}); peak RSS {mib(peak)} = {peak / text:.2f}x the "
          f"decoded text (before reading {mib(r['rss_before'])}; growth {mib(grown)}, "
          f"{(grown - r['record_text_bytes']) / rows:,.0f} bytes a row beyond the "
          f"{r['record_text_bytes'] / rows:,.0f} bytes of text the records hold)")


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--rows", type=int, default=1_000_000)
  ap.add_argument("--row-group", type=int, default=20_000)
  ap.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
  ap.add_argument("--words", type=int, default=0, help="0: the layout's default")
  ap.add_argument("--json", default="")
  args = ap.parse_args()
  print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"pyarrow {pa.__version__}, Python {platform.python_version()}")
  results = []
  for layout in args.layouts:
    results.append(measure(args.rows, args.words or LAYOUTS[layout], args.row_group, layout))
    print(report(results[-1]), flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=2)


if __name__ == "__main__":
  main()
