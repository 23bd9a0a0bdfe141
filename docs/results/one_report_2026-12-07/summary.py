"""Time over the loss-free time, per seed, main -> a variant, from the
`homagg bench scale` reports in this folder (measure.sh).

    python3 summary.py flat256            # the kept rule, W = 256 flat
    python3 summary.py every_job_note     # rule in every job, note in every worker
    python3 summary.py every_job_no_note  # rule in every job, no note
    python3 summary.py not_leaves_no_note # rule but in tree leaves, no note
    python3 summary.py limit64_small      # W = 4..128 with the limit at 64
    python3 summary.py kept_small         # W = 4..128, the kept rule: as before

Main's reports: seeds 1-3 are ../tree_window_2026-12-07/after_seed*.json,
seeds 4-7 ../present_wait_2026-12-07/main_seed*.json (W = 256 only, 1 %)."""

import glob
import os
import statistics
import sys
import json

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
            if r["drop_rate"] > 0:
                yield (r["workers"], r["leaves"], r["link_gbps"], r["drop_rate"]), r


def main(variant):
    cells = {}
    for path in sorted(glob.glob(os.path.join(HERE, f"{variant}_seed*.json"))):
        seed = int(path.rsplit("seed", 1)[1].split(".")[0])
        before = dict(rows(base(seed)))
        for key, r in rows(path):
            if key in before:
                cells.setdefault(key, []).append((seed, before[key], r))
    print(
        "| W, shape | link | loss | per seed: main -> variant | median | retrans per drop | exact |"
    )
    print("|---|---|---|---|---|---|---|")
    for (w, leaves, gbps, drop), v in sorted(cells.items()):
        shape = f"{leaves} leaves" if leaves else f"K = {v[0][2]['aggregators']}"
        same = all(b["virtual_seconds"] == r["virtual_seconds"] for _, b, r in v)
        per = ", ".join(f"{s}: {b['vs_clean']:.2f} -> {r['vs_clean']:.2f}" for s, b, r in v)
        med = (
            f"{statistics.median(b['vs_clean'] for _, b, _ in v):.2f}x -> "
            f"{statistics.median(r['vs_clean'] for _, _, r in v):.2f}x"
        )
        if same:
            med += " (same ns)"
        rpd = max(r["retransmissions_per_drop"] or 0 for _, _, r in v)
        exact = all(r["exact"] for _, _, r in v)
        print(
            f"| {w}, {shape} | {gbps:g} Gbit/s | {drop:g} | {per} | {med} | <= {rpd:.2f} | {exact} |"
        )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "flat256")
