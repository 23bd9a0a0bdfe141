"""Median and mean of each configuration's ratios in two or more of this
folder's w_*.jsonl files, the first taken as the baseline.

    python summary.py w_base.jsonl w_tail.jsonl [...]
"""

import json
import statistics
import sys


def load(path):
    rows = {}
    with open(path) as f:
        for line in f:
            x = json.loads(line)
            rows.setdefault((x["W"], x["K"], x["L"], x["leaves"]), []).append(x)
    return rows


runs = [(p, load(p)) for p in sys.argv[1:]]
for key in runs[0][1]:
    W, K, L, leaves = key
    shape = f"W = {W}, {leaves} leaves" if leaves else f"W = {W}, K = {K}"
    cells = []
    for path, rows in runs:
        xs = [r["x"] for r in rows.get(key, [])]
        rpd = max(r["rpd"] for r in rows.get(key, [])) if xs else 0.0
        cells.append(
            f"{statistics.median(xs):.2f}x ({statistics.mean(xs):.2f}x), rpd <= {rpd:.2f}"
            if xs
            else "-"
        )
    print(f"| {shape} | {L:g} Gbit/s | " + " | ".join(cells) + " |")
