"""Time over the loss-free time at 1 % loss, per seed, main -> a variant.

    python3 summary.py present_wait   # seeds 4-7 against main_seed*.json
    python3 summary.py rto_only       # seeds 1-3 against ../tree_window_2026-12-07/after_seed*.json
    python3 summary.py floor_only

Each file is a `homagg bench scale` report (measure.sh); main's seeds 1-3
are the table's runs of "Every default, the table re-measured"."""

import glob
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def rows(path):
    with open(path) as f:
        for r in json.load(f)["results"]:
            if r["drop_rate"] == 0.01:
                yield (r["workers"], r["leaves"], r["link_gbps"]), r


def main(variant):
    cells = {}
    for path in sorted(glob.glob(os.path.join(HERE, f"{variant}_*seed*.json"))):
        seed = int(path.rsplit("seed", 1)[1].split(".")[0])
        base = os.path.join(HERE, f"main_seed{seed}.json")
        if not os.path.exists(base):
            base = os.path.join(HERE, "..", "tree_window_2026-12-07", f"after_seed{seed}.json")
        before = dict(rows(base))
        for key, r in rows(path):
            b = before[key]
            cells.setdefault(key, []).append((seed, b["vs_clean"], r["vs_clean"], r))
    print("| W, shape | link | per seed: main -> variant | median | retrans per drop | exact |")
    print("|---|---|---|---|---|---|")
    for (w, leaves, gbps), v in sorted(cells.items()):
        shape = f"{leaves} leaves" if leaves else f"K = {v[0][3]['aggregators']}"
        per = ", ".join(f"{s}: {a:.2f} -> {b:.2f}" for s, a, b, _ in v)
        med = f"{statistics.median(a for _, a, _, _ in v):.2f}x -> {statistics.median(b for _, _, b, _ in v):.2f}x"
        rpd = max(r["retransmissions_per_drop"] for *_, r in v)
        print(f"| {w}, {shape} | {gbps:g} Gbit/s | {per} | {med} | <= {rpd:.2f} | {all(r['exact'] for *_, r in v)} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "present_wait")
