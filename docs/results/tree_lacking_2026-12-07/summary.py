"""Medians, ranges and the leaves' resends by cause of the runs here.

python3 summary.py
"""

import glob
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
CAUSES = ("timer", "overtaken", "lacking", "worker")

for path in sorted(glob.glob(os.path.join(HERE, "*.jsonl"))):
    rows = {}
    for line in open(path):
        r = json.loads(line)
        rows[r["seed"]] = r
    rs = [rows[s] for s in sorted(rows)]
    t = [r["vs_clean"] for r in rs]
    first = sum(r["up_sent"] for r in rs)
    again = sum(r["up_retransmissions"] for r in rs)
    causes = {k: sum(r[f"up_resent_{k}"] for r in rs) for k in CAUSES}
    print(
        f"{os.path.basename(path)}: seeds {min(rows)}-{max(rows)}, median {statistics.median(t):.2f}x "
        f"({min(t):.2f}-{max(t):.2f}); resends per first send {again / first:.3f}; {causes}"
    )
    print("  " + " ".join(f"{s}:{rows[s]['vs_clean']:.2f}" for s in sorted(rows)))

for path in sorted(glob.glob(os.path.join(HERE, "*.txt"))):
    t = [float(x.split()[1]) for x in open(path) if not x.startswith("clean")]
    print(
        f"{os.path.basename(path)}: {len(t)} seeds, median {statistics.median(t):.2f}x, "
        f"mean {statistics.mean(t):.2f}x, max {max(t):.2f}x"
    )
