"""The tree rows of `homagg bench scale` without its flat rows: the same
gradients (workloads.generate_all) and the same run_one as

    homagg bench scale --workers W --elements 1048576 --workload dense \\
        --methods dense --leaves W/16 --drop-rate 0,DROPS \\
        --link-gbps 1,100 --agg-link-gbps auto --seed S

    python3 tree_rows.py OUT W DROPS SEED...   # e.g. rows 256 0.01 1 2 3

writes OUT_wW_seedS.json (rows_w256_1pct_seed*.json were written as
rows_w256_seed*.json by this command with DROPS 0.01, then renamed)."""

import json
import sys

from homagg import reference
from homagg._native import lib
from homagg.bench import workloads
from homagg.bench.scale import run_one

out, W, drops = sys.argv[1], int(sys.argv[2]), [float(x) for x in sys.argv[3].split(",")]
seeds = [int(s) for s in sys.argv[4:]]
n = 1 << 20
block = lib.HG_DEFAULT_BLOCK
for seed in seeds:
    grads = workloads.generate_all("dense", W, n, 1.0, seed)
    want = reference.allreduce(grads, block)
    rows = []
    for gbps in (1.0, 100.0):
        clean = None
        for drop in [0.0] + drops:
            row, _ = run_one(
                grads,
                "dense",
                gbps,
                block,
                None,
                seed,
                want=want,
                drop_rate=drop,
                agg_link_gbps="auto",
                leaves=W // 16,
            )
            row["workers"] = W
            if drop == 0:
                clean = row
            row["vs_clean"] = row["virtual_seconds"] / clean["virtual_seconds"]
            rows.append(row)
            print(
                W, seed, gbps, drop, row["virtual_seconds"], round(row["vs_clean"], 3), flush=True
            )
    with open(f"{out}_w{W}_seed{seed}.json", "w") as f:
        json.dump({"seed": seed, "results": rows}, f)
