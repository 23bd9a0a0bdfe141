"""One tree allreduce per seed in the NIC model (virtual time): W workers
under L leaves and a root, homagg.sim.Cluster's defaults (its slots and
links), 2^E dense float32 per worker, loss-free and at 1 % per-hop loss.

    python tree.py W L GBITS E SEED,SEED,...

One JSON line per seed: per loss rate the virtual time t (ms), rpd =
the workers' retransmissions per dropped frame, to = their timer
expiries, floor = the highest stall floor of a worker (ms), up_re = the
leaves' upward resends (up_retransmissions), wall = seconds this took
(the machine's, not the model's); x = t over the loss-free t.
"""

import json
import os
import sys
import time

import numpy as np

from homagg import sim

W, L, G, e = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
seeds = [int(x) for x in sys.argv[5].split(",")]
losses = [float(x) for x in os.environ.get("LOSSES", "0,0.01").split(",")]
rng = np.random.default_rng(1)
g = [rng.standard_normal(1 << e).astype(np.float32) for _ in range(W)]
for seed in seeds:
    out = {"W": W, "leaves": L, "G": G, "e": e, "seed": seed}
    for loss in losses:
        t0 = time.time()
        c = sim.Cluster(workers=W, leaves=L, loss=loss, seed=seed, link_gbps=G)
        s = c.allreduce(g, method="dense").stats
        aggs = [c.aggregator_counters(k)["engine"] for k in range(c.aggregators)]
        c.close()
        ws = s["workers"]
        d = s["fabric"]["dropped_loss"]
        out[str(loss)] = dict(
            t=round(s["virtual_time"] * 1e3, 3),
            rpd=round(sum(w["retransmissions"] for w in ws) / max(d, 1), 2),
            to=sum(w["timeouts"] for w in ws),
            floor=round(max(w["rto_floor_ns"] for w in ws) / 1e6, 2),
            up_re=sum(a.get("up_retransmissions", 0) for a in aggs),
            wall=round(time.time() - t0, 1),
        )
    for k in out:
        if isinstance(out[k], dict) and k != "0.0" and "0.0" in out:
            out[k]["x"] = round(out[k]["t"] / out["0.0"]["t"], 2)
    print(json.dumps(out), flush=True)
