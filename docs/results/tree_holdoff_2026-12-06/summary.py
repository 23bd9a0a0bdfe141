"""Before against after, per tree and link: the time over the loss-free
time at 1 % loss (median, mean, highest over the seeds), the geometric
mean of the per-seed ratio after / before of the time, how many seeds
got faster, the leaves' upward resends (median) and whether every
loss-free time is the same.

    python summary.py before after
"""

import glob
import json
import os
import statistics
import sys

a_dir, b_dir = sys.argv[1], sys.argv[2]
print("| W, leaves | link | before: x med (mean, max) | after | after/before, geo. mean | faster | upward resends, med | loss-free same |")
print("|---|---|---|---|---|---|---|---|")
for f in sorted(glob.glob(os.path.join(a_dir, "*.jsonl")), key=lambda p: [int(x) for x in os.path.basename(p)[:-6].split("_")]):
    name = os.path.basename(f)
    a = {r["seed"]: r for r in map(json.loads, open(f))}
    b = {r["seed"]: r for r in map(json.loads, open(os.path.join(b_dir, name)))}
    seeds = sorted(set(a) & set(b))
    r0 = a[seeds[0]]

    def fig(d):
        x = [d[s]["0.01"]["x"] for s in seeds]
        return f"{statistics.median(x):.2f}x ({statistics.mean(x):.2f}, {max(x):.2f})"

    ratio = [b[s]["0.01"]["t"] / a[s]["0.01"]["t"] for s in seeds]
    up = lambda d: statistics.median(d[s]["0.01"]["up_re"] for s in seeds)
    same = all(a[s]["0.0"]["t"] == b[s]["0.0"]["t"] for s in seeds)
    print(
        f"| {r0['W']}, {r0['leaves']} | {r0['G']:g} Gbit/s | {fig(a)} | {fig(b)} | "
        f"{statistics.geometric_mean(ratio):.2f} | {sum(x < 1 for x in ratio)}/{len(seeds)} | "
        f"{up(a):.0f} -> {up(b):.0f} | {same} |"
    )
