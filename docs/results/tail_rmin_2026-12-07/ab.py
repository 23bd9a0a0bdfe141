"""W K GBPS LOSS SEED...: time over loss-free, retrans per drop, timeouts.
Environment: N floats (default 2^20); LEAVES=L for a tree of L leaves (K
then unused)."""

import json, sys
from homagg._native import lib
from homagg.bench import workloads
from homagg.bench.scale import LINK_DELAY
from homagg.sim import Cluster

import os

L = int(os.environ.get("LEAVES", "0"))
W, K, gbps, loss = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
for seed in map(int, sys.argv[5:]):
    grads = workloads.generate_all("dense", W, int(os.environ.get("N", 1 << 20)), 1.0, seed)
    out = {}
    for drop in (0.0, loss):
        with Cluster(
            workers=W,
            link_gbps=gbps,
            seed=seed,
            delay=LINK_DELAY,
            aggregators=1 if L else K,
            leaves=L,
            loss=drop,
        ) as cl:
            res = cl.allreduce(grads, method="dense", block_elements=lib.HG_DEFAULT_BLOCK)
            per = res.stats["workers"]
            drops = int(cl.fabric_counters()["dropped_loss"])
            out[drop] = (
                res.stats["virtual_time"],
                sum(w["retransmissions"] for w in per),
                drops,
                sum(w["timeouts"] for w in per),
            )
    (c, *_), (vt, rx, dr, to) = out[0.0], out[loss]
    print(
        json.dumps(
            {
                "seed": seed,
                "vs_clean": round(vt / c, 4),
                "rpd": round(rx / max(dr, 1), 3),
                "timeouts": to,
            }
        ),
        flush=True,
    )
