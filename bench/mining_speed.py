"""Speed of TL;DR mining on a synthetic Pushshift dump: reading, mining, TLDRHQ filter, statistics.

  python bench/mining_speed.py [--records 50000] [--tldr-share 0.2] [--json out.json]

Writes a dump of `--records` records in a temporary folder, half submissions (RS) and half comments
(RC), as plain NDJSON and as `.zst`, built from the simulated world's posts (three posts joined per
record, ~160 words) in the Pushshift layout. A share `--tldr-share` of the texts carries a TL;DR
after one of several keyword variants, 5% are deleted or removed, and a tenth have markdown and a
URL. Each stage runs once, single process: posts/s for reading (`reddit.iter_records`) and mining
(`tldr_mining.mine`, which reads too), pairs/s for the HQ filter and for `statistics`. Prints
numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time

import numpy as np
import zstandard

from rlhfjax.simulated import world
from rlhfjax.sources import reddit
from rlhfjax.sources import tldr_mining
from throughput import report

KEYWORDS = ("TL;DR:", "tl;dr", "TLDR", "tl dr", "Tl,dr:", "**TL;DR**", "tl/dr -")


def synthetic_dump(records: int, tldr_share: float, seed: int = 0) -> list[bytes]:
  """NDJSON lines of Pushshift submissions and comments with simulated-world texts."""
  rng = np.random.default_rng(seed)
  examples = world.generate(seed, 0, 3000)
  lines = []
  for i in range(records):
    picks = rng.integers(0, len(examples), 3)
    text = "\n\n".join(examples[j].post for j in picks)
    u = rng.random()
    if u < 0.05:
      text = "[deleted]" if u < 0.025 else "[removed]"
    elif u < 0.05 + tldr_share:
      text += f"\n\n{KEYWORDS[i % len(KEYWORDS)]} {examples[picks[0]].reference}"
    if rng.random() < 0.1:
      text = f"**Edit:** [see here](https://example.com/{i}) &amp; thanks.\n\n> {text}"
    base = {"author": f"user{i % 997}", "created_utc": 1546300800 + i,
            "id": np.base_repr(i + 10**6, 36).lower(), "score": int(rng.integers(0, 100)),
            "subreddit": examples[picks[0]].subreddit}
    if i % 2:
      row = {**base, "body": text, "link_id": "t3_abc", "parent_id": "t3_abc",
             "controversiality": 0}
    else:
      row = {**base, "selftext": text, "title": examples[picks[0]].title, "is_self": True,
             "num_comments": 3}
    lines.append(json.dumps(row).encode())
  return lines


def timed(fn) -> tuple[object, float]:
  t = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - t


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--records", type=int, default=50_000)
  ap.add_argument("--tldr-share", type=float, default=0.2)
  ap.add_argument("--json", default="", help="also write the numbers here")
  args = ap.parse_args()

  with tempfile.TemporaryDirectory() as tmp:
    data = b"\n".join(synthetic_dump(args.records, args.tldr_share)) + b"\n"
    plain, zst = os.path.join(tmp, "RS_2019-01"), os.path.join(tmp, "RS_2019-01.zst")
    with open(plain, "wb") as f:
      f.write(data)
    with open(zst, "wb") as f:
      f.write(zstandard.ZstdCompressor(level=19).compress(data))

    n_plain, read_plain_s = timed(lambda: sum(1 for _ in reddit.iter_records(plain)))
    n_zst, read_zst_s = timed(lambda: sum(1 for _ in reddit.iter_records(zst)))
    assert n_plain == n_zst == args.records
    result, mine_s = timed(lambda: tldr_mining.mine([plain], os.path.join(tmp, "pairs.jsonl")))
    _, mine_zst_s = timed(lambda: tldr_mining.mine([zst], os.path.join(tmp, "pairs_zst.jsonl")))
    pairs = os.path.join(tmp, "pairs.jsonl")
    hq, hq_s = timed(lambda: tldr_mining.write_high_quality(pairs, os.path.join(tmp, "hq.jsonl")))
    _, stats_s = timed(lambda: tldr_mining.statistics(tldr_mining.read_pairs(pairs)))
    out = {
        "host": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "records": args.records,
        "dump_mb": len(data) / 2**20,
        "zst_mb": os.path.getsize(zst) / 2**20,
        "read_plain_posts_per_s": args.records / read_plain_s,
        "read_zst_posts_per_s": args.records / read_zst_s,
        "mine_plain_posts_per_s": args.records / mine_s,
        "mine_zst_posts_per_s": args.records / mine_zst_s,
        "pairs_mined": result["counts"]["kept"],
        "hq_pairs_per_s": hq["pairs"] / hq_s,
        "hq_kept": hq["kept"],
        "stats_pairs_per_s": hq["pairs"] / stats_s,
    }
  report(out, args.json)


if __name__ == "__main__":
  main()
