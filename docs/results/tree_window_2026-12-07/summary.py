"""The table of docs/BENCHMARKS.md "Every default, the table re-measured"
from `homagg bench scale` reports: summary.py BEFORE.json... -- AFTER.json...

Per W, shape and link: time over the loss-free time at 0.1 % and 1 %
loss, median (range) over the reports' seeds, before -> after, and the
after runs' retransmissions per drop at 1 % (range); exact over all."""

import json
import statistics
import sys


def load(paths):
    rows = {}
    for path in paths:
        with open(path) as f:
            for r in json.load(f)["results"]:
                key = (r["workers"], r["leaves"], r["aggregators"], r["link_gbps"])
                rows.setdefault(key, {}).setdefault(r["drop_rate"], []).append(r)
    return rows


def cell(rs):
    v = sorted(r["vs_clean"] for r in rs)
    lo, hi = v[0], v[-1]
    return f"{statistics.median(v):.2f}x ({lo:.2f}-{hi:.2f})" if lo != hi else f"{lo:.2f}x"


cut = sys.argv.index("--")
before, after = load(sys.argv[1:cut]), load(sys.argv[cut + 1 :])
print("| W, shape | link | S / cap | 0.1 % | 1 % | retrans per drop at 1 % |")
print("|---|---|---|---|---|---|")
exact = True
for key in sorted(after):
    W, L, K, gbps = key
    a, b = after[key], before.get(key, {})
    exact &= all(r["exact"] for rs in a.values() for r in rs)
    shape = f"{L} leaves" if L else f"K = {K}"
    s = a[0.01][0]
    sb = b[0.01][0] if 0.01 in b else s
    slots = f"{s['slots']} / {s['pipe_max']}"
    if (sb["slots"], sb["pipe_max"]) != (s["slots"], s["pipe_max"]):
        slots = f"{sb['slots']} / {sb['pipe_max']} -> " + slots
    cells = []
    for d in (0.001, 0.01):
        before_cell = cell(b[d]) if d in b else None
        after_cell = cell(a[d])
        same = d in b and [r["virtual_seconds"] for r in b[d]] == [
            r["virtual_seconds"] for r in a[d]
        ]
        cells.append(after_cell if same or before_cell is None else f"{before_cell} -> {after_cell}")
    rpd = sorted(r["retransmissions_per_drop"] for r in a[0.01])
    print(
        f"| {W}, {shape} | {gbps:g} Gbit/s | {slots} | {cells[0]} | {cells[1]} | "
        f"{rpd[0]:.2f}-{rpd[-1]:.2f} |"
    )
print(f"\nevery output exact: {exact}")
