"""Time over the loss-free time of the tree rows, per seed, main (the
build before) -> a leaf pushing one view of a chunk down.

    python3 summary.py

Main's reports: seeds 1-3 ../tree_window_2026-12-07/after_seed*.json,
seeds 4-7 ../present_wait_2026-12-07/main_seed*.json (W = 256, 1 %)."""

import glob
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))


def base(seed):
    for p in (
        os.path.join(HERE, "..", "tree_window_2026-12-07", f"after_seed{seed}.json"),
        os.path.join(HERE, "..", "present_wait_2026-12-07", f"main_seed{seed}.json"),
    ):
        if os.path.exists(p):
            return p
    return None


def rows(path):
    with open(path) as f:
        for r in json.load(f)["results"]:
            if r["drop_rate"] > 0 and r["leaves"]:
                yield (r["workers"], r["leaves"], r["link_gbps"], r["drop_rate"]), r


def main():
    cells = {}
    for path in sorted(glob.glob(os.path.join(HERE, "rows_*seed*.json"))):
        seed = int(path.rsplit("seed", 1)[1].split(".")[0])
        before = dict(rows(base(seed)))
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
        exact = all(r["exact"] for _, _, r in v)
        print(
            f"| {w}, {leaves} | {gbps:g} Gbit/s | {drop:g} | {per} | {med} | <= {rpd:.2f} | {exact} |"
        )


if __name__ == "__main__":
    main()
