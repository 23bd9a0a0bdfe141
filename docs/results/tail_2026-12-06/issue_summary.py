"""Before/after table of issue_table.py outputs: median (range) of t over
the loss-free t per (W, K, link) and loss, and retransmissions per drop."""

import collections, json, statistics, sys


def load(f):
    d = collections.defaultdict(list)
    for line in open(f):
        r = json.loads(line)
        d[(r["W"], r["K"], r["link"])].append(r)
    return d


b, a = load(sys.argv[1]), load(sys.argv[2])
print("| W, K | link | 0.1 %, before | 0.1 %, after | 1 %, before | 1 %, after |")
print("|---|---|---|---|---|---|")
for key in b:
    cells = []
    for loss in ("0.001", "0.01"):
        for d in (b, a):
            xs = [r[loss]["t"] / r["0.0"]["t"] for r in d[key]]
            rp = [r[loss]["retrans"] / max(r[loss]["drops"], 1) for r in d[key]]
            cells.append(
                f"{statistics.median(xs):.2f}x ({min(xs):.2f}-{max(xs):.2f}), {min(rp):.2f}-{max(rp):.2f}"
            )
    same = all(x["0.0"]["t"] == y["0.0"]["t"] for x, y in zip(b[key], a[key]))
    print(
        f"| {key[0]}, {key[1]} | {key[2]:g} Gbit/s | "
        + " | ".join(cells)
        + " |"
        + ("" if same else " loss-free differs")
    )
