"""Peak memory of reading a large Parquet file of TRL preference rows, against its decoded text.

  python bench/trl_read_memory.py [--rows 1000000] [--words 60] [--row-group 20000] \
      [--implicit] [--path file.parquet] [--json out.json]

Writes `--rows` rows of HH-style text (`--implicit`: HH-RLHF's layout, whole `chosen` and
`rejected` transcripts sharing their prompt; else TRL's explicit `prompt`, `chosen`, `rejected`) in
row groups of `--row-group` rows, then reads it with `records.read(path, "trl")` in a fresh
process and prints that process's peak resident memory (`ru_maxrss`): before reading (the
interpreter, numpy, pyarrow: the current resident set), and at the end. The decoded text size is
the UTF-8 bytes of the file's string columns. ARROW_DEFAULT_MEMORY_POOL=system makes pyarrow decode with the C allocator
instead of its default pool (mimalloc). Numbers measured here are in docs/data.md ("Memory").
Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
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


def _texts(rng: np.random.Generator, n: int, words: int) -> list[str]:
  lengths = rng.integers(words // 2, words * 3 // 2, n)
  picks = rng.integers(0, len(WORDS), int(lengths.sum()))
  out, start = [], 0
  for k in lengths:
    out.append(" ".join(WORDS[i] for i in picks[start:start + k]))
    start += k
  return out


def write(path: str, rows: int, words: int, row_group: int, implicit: bool) -> int:
  """Writes the file one row group at a time; returns the decoded text bytes of its strings."""
  rng = np.random.default_rng(0)
  text_bytes = 0
  schema = pa.schema([(n, pa.string()) for n in (("chosen", "rejected") if implicit
                                                  else ("prompt", "chosen", "rejected"))])
  with pq.ParquetWriter(path, schema) as writer:
    for start in range(0, rows, row_group):
      n = min(row_group, rows - start)
      prompt = [f"\n\nHuman: {t}?\n\nAssistant:" for t in _texts(rng, n, words)]
      chosen = [" " + t + "." for t in _texts(rng, n, words // 2)]
      rejected = [" " + t + "." for t in _texts(rng, n, words // 2)]
      if implicit:
        cols = {"chosen": [p + c for p, c in zip(prompt, chosen)],
                "rejected": [p + r for p, r in zip(prompt, rejected)]}
      else:
        cols = {"prompt": prompt, "chosen": chosen, "rejected": rejected}
      table = pa.table(cols, schema=schema)
      text_bytes += sum(int(pc.sum(pc.binary_length(table[c])).as_py()) for c in cols)
      writer.write_table(table)
  return text_bytes


_READER = """
import json, resource, sys, time
import pyarrow, numpy
from rlhfjax.data import records
def rss():
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * resource.getpagesize()
before = rss()
t = time.perf_counter()
comps, problems = records.read(sys.argv[1], "trl")
seconds = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
held = sum(len(c.prompt.encode()) + len(c.response_a.encode()) + len(c.response_b.encode())
           for c in comps)
print(json.dumps({"pool": pyarrow.default_memory_pool().backend_name, "records": len(comps),
                  "problems": len(problems), "seconds": seconds,
                  "rss_before": before, "rss_peak": peak, "record_text_bytes": held}))
"""


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--rows", type=int, default=1_000_000)
  ap.add_argument("--words", type=int, default=60)
  ap.add_argument("--row-group", type=int, default=20_000)
  ap.add_argument("--implicit", action="store_true")
  ap.add_argument("--path", default="")
  ap.add_argument("--json", default="")
  args = ap.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    path = args.path or os.path.join(tmp, "train-00000-of-00001.parquet")
    t = time.perf_counter()
    text_bytes = write(path, args.rows, args.words, args.row_group, args.implicit)
    write_s = time.perf_counter() - t
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    out = subprocess.run([sys.executable, "-c", _READER, path], check=True, capture_output=True,
                         text=True, env=env)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r.update(rows=args.rows, implicit=args.implicit, row_group=args.row_group,
             file_bytes=os.path.getsize(path), text_bytes=text_bytes, write_seconds=write_s,
             machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores")
  mib = lambda b: f"{b / 2**20:,.0f} MiB"
  grown = r["rss_peak"] - r["rss_before"]
  print(f"{r['rows']:,} rows ({'implicit' if args.implicit else 'explicit'} prompt), Parquet "
        f"{mib(r['file_bytes'])} in row groups of {args.row_group:,}; decoded text "
        f"{mib(text_bytes)} ({text_bytes / r['rows']:.0f} bytes a row)")
  print(f"read {r['records']:,} records in {r['seconds']:.1f} s (pyarrow pool {r['pool']}); "
        f"peak RSS {mib(r['rss_peak'])} "
        f"= {r['rss_peak'] / text_bytes:.2f}x the decoded text (before reading: "
        f"{mib(r['rss_before'])}; growth {mib(grown)} = {grown / text_bytes:.2f}x, "
        f"{(grown - r['record_text_bytes']) / r['rows']:.0f} bytes a record beyond its text)")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(r, f, indent=2)


if __name__ == "__main__":
  main()
