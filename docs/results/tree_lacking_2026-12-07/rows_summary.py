"""The tree rows of the loss table, per seed, the build before (the rows
of ../tree_view_2026-12-07/) -> this one (rows_*.json here, written by
../tree_view_2026-12-07/tree_rows.py; rows_w256_1pct_seed*.json were
written as rows1pct_w256_seed*.json and renamed).

    python3 rows_summary.py
"""

import glob
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
BEFORE = os.path.join(HERE, "..", "tree_view_2026-12-07")


def rows(path):
    with open(path) as f:
        for r in json.load(f)["results"]:
            if r["drop_rate"] > 0 and r["leaves"]:
                yield (r["workers"], r["leaves"], r["link_gbps"], r["drop_rate"]), r


def main():
    cells = {}
    for path in sorted(glob.glob(os.path.join(HERE, "rows_*seed*.json"))):
        before_path = os.path.join(BEFORE, os.path.basename(path))
        if not os.path.exists(before_path):
            continue
        seed = int(path.rsplit("seed", 1)[1].split(".")[0])
        before = dict(rows(before_path))
        for key, r in rows(path):
            if key in before:
                cells.setdefault(key, []).append((seed, before[key], r))
    print(
        "| W, leaves | link | loss | per seed: before -> now | median | retrans per drop | exact |"
    )
    print("|---|---|---|---|---|---|---|")
    for (w, leaves, gbps, drop), v in sorted(cells.items()):
        v.sort(key=lambda x: x[0])
        per = ", ".join(f"{s}: {b['vs_clean']:.2f} -> {r['vs_clean']:.2f}" for s, b, r in v)
        med = (
            f"{statistics.median(b['vs_clean'] for _, b, _ in v):.2f}x -> "
            f"{statistics.median(r['vs_clean'] for _, _, r in v):.2f}x"
        )
        rpd = max(r["retransmissions_per_drop"] or 0 for _, _, r in v)
        rpd0 = max(b["retransmissions_per_drop"] or 0 for _, b, _ in v)
        exact = all(r["exact"] for _, _, r in v)
        print(
            f"| {w}, {leaves} | {gbps:g} Gbit/s | {drop:g} | {per} | {med} | <= {rpd0:.2f} -> <= {rpd:.2f} | {exact} |"
        )


if __name__ == "__main__":
    main()
