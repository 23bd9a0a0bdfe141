"""Medians of the runs of measure.sh, one build against another.

    python summary.py BASE_DIR NEW_DIR

issue_table_w64.jsonl (issue_table.py): per link rate, time over the
loss-free time at 0.1 % and 1 % loss, median (range) over the seeds, and
retransmissions per drop (range); w256_e20_*.jsonl (run.py) and
scale.jsonl (many.py): time over the loss-free time at 1 %, per seed,
and the loss-free times.
"""

import collections
import json
import statistics
import sys


def lines(path):
    with open(path) as f:
        return [json.loads(x) for x in f if x.strip()]


def issue_table(d):
    out = {}
    for r in lines(f"{d}/issue_table_w64.jsonl"):
        t0 = r["0.0"]["t"]
        for loss in ("0.001", "0.01"):
            x = r[loss]
            key = (r["link"], loss)
            out.setdefault(key, []).append((x["t"] / t0, x["retrans"] / max(x["drops"], 1), t0))
    return out


def fmt(v):
    xs = [a for a, _, _ in v]
    rp = [b for _, b, _ in v]
    return (
        f"{statistics.median(xs):.2f}x ({min(xs):.2f}-{max(xs):.2f}), "
        f"{min(rp):.2f}-{max(rp):.2f} per drop, loss-free {sorted({round(c * 1e3, 3) for _, _, c in v})} ms"
    )


def main():
    base, new = sys.argv[1], sys.argv[2]
    a, b = issue_table(base), issue_table(new)
    print("W = 64, K = 4, 2^20 floats (issue_table.py), base -> new")
    for k in sorted(a):
        print(f"  {k[0]:>5} Gbit/s, {float(k[1]) * 100:g} %: {fmt(a[k])}  ->  {fmt(b[k])}")
    for name in ("w256_e20_1g", "w256_e20_100g"):
        for d in (base, new):
            rs = lines(f"{d}/{name}.jsonl")
            print(
                f"{name} {d}: x =",
                [r["0.01"]["x"] for r in rs],
                "clean",
                sorted({r["0.0"]["t"] for r in rs}),
            )
    rows = collections.defaultdict(dict)
    for d in (base, new):
        for r in lines(f"{d}/scale.jsonl"):
            rows[(r["W"], r["K"], r["L"])].setdefault(d, []).append(r)
    print("homagg bench scale's links and slots, 2^18 floats (many.py), base -> new")
    for k, v in sorted(rows.items()):
        xs = {d: [round(r["x"], 2) for r in v.get(d, [])] for d in (base, new)}
        med = {d: statistics.median(x) if x else None for d, x in xs.items()}
        clean = {d: sorted({round(r["clean"], 3) for r in v.get(d, [])}) for d in (base, new)}
        print(
            f"  W={k[0]} K={k[1]} {k[2]:g} Gbit/s: {med[base]} {xs[base]} -> {med[new]} {xs[new]}"
            f"; loss-free {clean[base]} -> {clean[new]}"
        )


if __name__ == "__main__":
    main()
