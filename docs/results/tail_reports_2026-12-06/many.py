"""Time at 1 % per-hop loss over the loss-free time, one JSON line per
seed, on the NIC model as ``homagg bench scale`` builds a job (its link
delay and slots; the aggregators' links at homagg.sim.Cluster's
default), 2^E dense float32 per worker.  Virtual time, so the machine's
load does not enter.  SLOTS=S overrides the slots.

    python many.py W K GBITS LEAVES E SEED,SEED,...

Output fields: clean and lossy virtual time (ms), x = lossy / clean, rpd
= retransmissions per dropped frame, st and clean_st = the engines'
STATUS frames sent in the lossy and the loss-free run.
"""

import json
import os
import sys

import numpy as np

from homagg import sim
from homagg.bench.scale import LINK_DELAY, auto_slots
from homagg.protocol import tree_senders

W, K, L, leaves, e = (
    int(sys.argv[1]),
    int(sys.argv[2]),
    float(sys.argv[3]),
    int(sys.argv[4]),
    int(sys.argv[5]),
)
seeds = [int(x) for x in sys.argv[6].split(",")]
rng = np.random.default_rng(1)
g = [rng.standard_normal(1 << e).astype(np.float32) for _ in range(W)]
slots = int(os.environ.get("SLOTS", "0")) or auto_slots(
    tree_senders(W, leaves) if leaves else W, True
)
for seed in seeds:
    out = []
    for loss in (0.0, 0.01):
        with sim.Cluster(
            workers=W,
            link_gbps=L,
            seed=seed,
            delay=LINK_DELAY,
            aggregators=1 if leaves else K,
            leaves=leaves,
            loss=loss,
            slots=slots,
        ) as c:
            s = c.allreduce(g, method="dense").stats
            drops = s["fabric"]["dropped_loss"]
            rt = sum(w["retransmissions"] for w in s["workers"])
            out.append((s["virtual_time"] * 1e3, rt / max(drops, 1), s["engine"]["status_sent"]))
    print(
        json.dumps(
            dict(
                W=W,
                K=K,
                L=L,
                leaves=leaves,
                e=e,
                seed=seed,
                clean=out[0][0],
                lossy=out[1][0],
                x=out[1][0] / out[0][0],
                rpd=out[1][1],
                st=out[1][2],
                clean_st=out[0][2],
            )
        ),
        flush=True,
    )
