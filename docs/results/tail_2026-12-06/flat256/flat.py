"""Flat jobs in the NIC model: W workers over K aggregators, sim.Cluster's
defaults, 2^E dense floats, loss-free and 1 % loss; one JSON line per seed.
    python flat.py W K GBITS E SEEDS"""
import json, sys, numpy as np
from homagg import sim
W, K, G, e = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
seeds = [int(x) for x in sys.argv[5].split(",")]
rng = np.random.default_rng(1)
g = [rng.standard_normal(1 << e).astype(np.float32) for _ in range(W)]
for seed in seeds:
    out = {"W": W, "K": K, "G": G, "e": e, "seed": seed}
    for loss in (0.0, 0.01):
        c = sim.Cluster(workers=W, aggregators=K, loss=loss, seed=seed, link_gbps=G)
        s = c.allreduce(g, method="dense").stats
        c.close()
        d = s["fabric"]["dropped_loss"]
        out[str(loss)] = dict(t=round(s["virtual_time"] * 1e3, 4), rpd=round(sum(w["retransmissions"] for w in s["workers"]) / max(d, 1), 2))
    out["x"] = round(out["0.01"]["t"] / out["0.0"]["t"], 2)
    print(json.dumps(out), flush=True)
