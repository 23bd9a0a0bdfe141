"""cmp.py A B SEED...: each loss row of the table in A_s{SEED}.json and
B_s{SEED}.json (`homagg bench scale --json`): the median over the seeds of
the time over the loss-free time, A -> B, each seed's, and the most
retransmissions per drop of any seed."""

import json, sys, statistics

a, b, seeds = sys.argv[1], sys.argv[2], sys.argv[3:]


def rows(p, s):
    d = json.load(open(f"{p}_s{s}.json"))
    out = {}
    for r in d["results"]:
        if r["drop_rate"] == 0:
            continue
        shape = f"W={r['workers']} " + (
            f"{r['leaves']} leaves" if r["leaves"] else f"K={r['aggregators']}"
        )
        out[(shape, r["link_gbps"], r["drop_rate"])] = (
            r["vs_clean"],
            r["retransmissions_per_drop"],
            r["timeouts"],
        )
    return out


A = {s: rows(a, s) for s in seeds}
B = {s: rows(b, s) for s in seeds}
keys = list(A[seeds[0]])
for k in keys:
    va = [A[s][k][0] for s in seeds]
    vb = [B[s][k][0] for s in seeds]
    ra = max(A[s][k][1] or 0 for s in seeds)
    rb = max(B[s][k][1] or 0 for s in seeds)
    print(
        f"{k[0]:16s} {k[1]:5g}G {k[2]:6g}  {statistics.median(va):.3f} -> {statistics.median(vb):.3f}   "
        f"{' '.join(f'{x:.2f}' for x in va)} -> {' '.join(f'{x:.2f}' for x in vb)}   rpd<= {ra:.2f} -> {rb:.2f}"
    )
