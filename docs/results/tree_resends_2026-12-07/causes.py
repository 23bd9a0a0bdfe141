"""Why a tree's leaves send their partial sums up again: W workers over
W/16 leaves, 2^20 dense floats (the gradients of `homagg bench scale`),
NIC model, virtual time.  Per seed, the time over the loss-free time, and
from the aggregators' counters: the root's frames received and duplicates,
the leaves' first sends up and their resends by cause (up_resent_timer,
_overtaken, _lacking, _worker, docs/PROTOCOL.md's counter table).

    python3 causes.py W GBPS LOSS SEED... > OUT.jsonl
"""

import json
import sys

from homagg._native import lib
from homagg.bench import workloads
from homagg.bench.scale import LINK_DELAY
from homagg.sim import Cluster

W, gbps, loss = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
CAUSES = ("timer", "overtaken", "lacking", "worker")
for seed in (int(s) for s in sys.argv[4:]):
    grads = workloads.generate_all("dense", W, 1 << 20, 1.0, seed)
    runs = {}
    for drop in (0.0, loss):
        with Cluster(
            workers=W,
            link_gbps=gbps,
            seed=seed,
            delay=LINK_DELAY,
            aggregators=1,
            leaves=W // 16,
            loss=drop,
        ) as cl:
            res = cl.allreduce(grads, method="dense", block_elements=lib.HG_DEFAULT_BLOCK)
            eng = [cl.aggregator_counters(k)["engine"] for k in range(cl.aggregators)]
            runs[drop] = (res.stats["virtual_time"], eng)
    (clean, _), (vt, eng) = runs[0.0], runs[loss]
    leaves = [e for e in eng if e["up_sent"]]
    (root,) = [e for e in eng if not e["up_sent"]]
    row = {
        "workers": W,
        "link_gbps": gbps,
        "loss": loss,
        "seed": seed,
        "vs_clean": vt / clean,
        "virtual_seconds": vt,
        "root_received": root["received"],
        "root_duplicates": root["duplicates"],
        "up_sent": sum(e["up_sent"] for e in leaves),
        "up_retransmissions": sum(e["up_retransmissions"] for e in leaves),
        **{f"up_resent_{k}": sum(e[f"up_resent_{k}"] for e in leaves) for k in CAUSES},
    }
    print(json.dumps(row), flush=True)
