"""The figures of docs/BENCHMARKS.md "A tree leaf's resends, kept": the
W = 256 tree runs here (causes.py) with the two of
../tree_lacking_2026-12-07/ they are compared with, the flat W = 256,
K = 16, 1 Gbit/s, 1 % loss row per seed and build, and the loss table of
the lowest-first build against the build before.

python3 summary.py
"""

import glob
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LACKING = os.path.join(HERE, "..", "tree_lacking_2026-12-07")
TREE = [
    os.path.join(LACKING, "w256_before_100g.jsonl"),
    os.path.join(LACKING, "w256_after_100g.jsonl"),
    os.path.join(HERE, "w256_rules_putoff_100g.jsonl"),
    os.path.join(HERE, "w256_rules_lowest_100g.jsonl"),
    os.path.join(HERE, "w256_rules_oldest_100g.jsonl"),
    os.path.join(HERE, "w256_oldest_only_100g.jsonl"),
    os.path.join(LACKING, "w256_before_1g.jsonl"),
    os.path.join(LACKING, "w256_after_1g.jsonl"),
    os.path.join(HERE, "w256_rules_lowest_1g.jsonl"),
]

print("W = 256 over 16 leaves, 1 % loss: time over the loss-free time")
for path in TREE:
    rows = {}
    for line in open(path):
        r = json.loads(line)
        rows[r["seed"]] = r
    rs = [rows[s] for s in sorted(rows)]
    t = [r["vs_clean"] for r in rs]
    again = sum(r["up_retransmissions"] for r in rs) / sum(r["up_sent"] for r in rs)
    print(
        f"{os.path.relpath(path, HERE)}: seeds {min(rows)}-{max(rows)}, "
        f"median {statistics.median(t):.2f}x ({min(t):.2f}-{max(t):.2f}); "
        f"resends per first send {again:.3f}"
    )
    print("  " + " ".join(f"{s}:{rows[s]['vs_clean']:.2f}" for s in sorted(rows)))

print("\nW = 256, K = 16 (flat), 1 Gbit/s, 1 % loss: time over the loss-free time")
for name in ("before", "lowest", "putoff"):
    got = {}
    for path in glob.glob(os.path.join(HERE, f"flat1g_{name}_seed*.json")) + glob.glob(
        os.path.join(HERE, f"{name}_seed*.json")
    ):
        seed = int(re.search(r"seed(\d+)", path).group(1))
        for r in json.load(open(path))["results"]:
            flat = r["workers"] == 256 and not r["leaves"] and r["link_gbps"] == 1
            if flat and r["drop_rate"] == 0.01:
                got[seed] = r["vs_clean"]
    v = list(got.values())
    print(
        f"{name}: seeds {min(got)}-{max(got)}, median {statistics.median(v):.2f}x, "
        f"mean {statistics.mean(v):.3f}x; " + " ".join(f"{s}:{got[s]:.2f}" for s in sorted(got))
    )

print("\nThe loss table, the build before -> the lowest chunk first")
table = os.path.join(HERE, "..", "tree_window_2026-12-07", "summary.py")
before = sorted(glob.glob(os.path.join(HERE, "before_seed*.json")))
lowest = sorted(glob.glob(os.path.join(HERE, "lowest_seed*.json")))
subprocess.run([sys.executable, table, *before, "--", *lowest], check=True)
