"""The tree rows of scale.sh's runs, before against after: per link rate
the time over the loss-free time at 1 % (vs_clean; median and range over
the seeds), retransmissions per drop, and the loss-free virtual time.

    python scale_summary.py before_scale after_scale
"""

import glob
import json
import os
import statistics
import sys


def rows(folder, g):
    out = {}
    for f in glob.glob(os.path.join(folder, f"s*_{g}.json")):
        try:
            d = json.load(open(f))
        except ValueError:  # a run still writing, or one that failed
            continue
        seed = d["seed"]
        for r in d["results"]:
            if r.get("leaves") and r["drop_rate"] == 0.01:
                out[seed] = r
            if r.get("leaves") and r["drop_rate"] == 0:
                out.setdefault(("clean", seed), r)
    return out


print("| link | before: x med (range) | after | retrans./drop before -> after (med) | loss-free ms before / after |")
print("|---|---|---|---|---|")
for g in (1, 100):
    a, b = rows(sys.argv[1], g), rows(sys.argv[2], g)
    seeds = sorted(s for s in a if not isinstance(s, tuple) and s in b)
    fig = lambda d: (
        f"{statistics.median(d[s]['vs_clean'] for s in seeds):.2f}x "
        f"({min(d[s]['vs_clean'] for s in seeds):.2f}-{max(d[s]['vs_clean'] for s in seeds):.2f})"
    )
    rpd = lambda d: statistics.median(d[s]["retransmissions_per_drop"] for s in seeds)
    clean = lambda d: sorted({round(d[("clean", s)]["virtual_seconds"] * 1e3, 3) for s in seeds})
    print(f"| {g} Gbit/s | {fig(a)} | {fig(b)} | {rpd(a):.2f} -> {rpd(b):.2f} | {clean(a)} / {clean(b)} |")
print(f"seeds: {seeds}")
