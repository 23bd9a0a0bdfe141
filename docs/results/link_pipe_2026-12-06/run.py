"""W workers over K aggregators (homagg.sim.Cluster's defaults, as the
issue table: its slots, links and aggregators' links), 2^E dense float32
per worker, one allreduce per cluster, loss-free and at 1 % per-hop loss
(LOSSES=0,0.01).  Virtual time of the NIC model.  With link_pipe.patch
applied, HOMAGG_PIPE_TOTAL=T bounds a worker's chunks in the network at
all its aggregators together to T, and HOMAGG_PIPE_LINK=1 or 2 adds the
adaptive bound of the worker's link (README).

    python run.py W K GBITS E SEED,SEED,...

One JSON line per seed: per loss rate the virtual time t (ms), rpd =
retransmissions per dropped frame, to = timer expiries, floor = the
highest stall floor of a worker (ms), x = t over the loss-free t.
"""

import json, sys, os
import numpy as np
from homagg import sim

W, K, L, e = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
seeds = [int(x) for x in sys.argv[5].split(",")]
losses = [float(x) for x in os.environ.get("LOSSES", "0,0.01").split(",")]
rng = np.random.default_rng(1)
g = [rng.standard_normal(1 << e).astype(np.float32) for _ in range(W)]
for seed in seeds:
    out = {
        "W": W,
        "K": K,
        "L": L,
        "e": e,
        "seed": seed,
        "T": os.environ.get("HOMAGG_PIPE_TOTAL", "0"),
    }
    for loss in losses:
        c = sim.Cluster(workers=W, aggregators=K, loss=loss, seed=seed, link_gbps=L)
        s = c.allreduce(g, method="dense").stats
        c.close()
        ws = s["workers"]
        d = s["fabric"]["dropped_loss"]
        out[str(loss)] = dict(
            t=round(s["virtual_time"] * 1e3, 3),
            rpd=round(sum(w["retransmissions"] for w in ws) / max(d, 1), 2),
            to=sum(w["timeouts"] for w in ws),
            floor=round(max(w["rto_floor_ns"] for w in ws) / 1e6, 2),
        )
    if "0.0" in out:
        for k in out:
            if k not in ("0.0",) and isinstance(out[k], dict):
                out[k]["x"] = round(out[k]["t"] / out["0.0"]["t"], 2)
    print(json.dumps(out), flush=True)
