"""Each variant against w256_1pct.jsonl (the build as it is), per rate:
time over the loss-free time per seed and the median, and the leaves'
resends up by cause summed over the seeds.

    python3 summary.py
"""

import json
import statistics

CAUSES = ("timer", "overtaken", "lacking", "worker")
VARIANTS = (
    "dupthresh16",
    "out_of_order_reports_ignored",
    "other_status_ignored",
    "other_status_ignored_dupthresh16",
)


def rows(name):
    with open(f"{name}.jsonl") as f:
        return {(r["link_gbps"], r["seed"]): r for r in map(json.loads, f)}


base = rows("w256_1pct")
for name in ("w256_1pct",) + VARIANTS:
    runs = rows(name)
    print(name)
    for g in (100.0, 1.0):
        seeds = sorted(s for gg, s in runs if gg == g)
        per = [runs[(g, s)]["vs_clean"] for s in seeds]
        was = [base[(g, s)]["vs_clean"] for s in seeds]
        causes = [sum(runs[(g, s)][f"up_resent_{k}"] for s in seeds) for k in CAUSES]
        sent = sum(runs[(g, s)]["up_sent"] for s in seeds)
        print(
            f"  {g:g} Gbit/s: median {statistics.median(was):.2f}x -> "
            f"{statistics.median(per):.2f}x; per seed "
            + ", ".join(f"{a:.2f}->{b:.2f}" for a, b in zip(was, per))
            + f"; resends per first send {sum(causes) / sent:.3f}, by cause "
            + ", ".join(f"{k} {c}" for k, c in zip(CAUSES, causes))
        )
