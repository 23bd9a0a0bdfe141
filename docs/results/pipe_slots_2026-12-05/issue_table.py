"""The loss table of docs/BENCHMARKS.md "The pipe": homagg.sim.Cluster's
defaults, 2^20 dense float32 per worker, one allreduce per cluster, with
and without the pipe's bound.  Virtual time (the NIC model), so the
machine's load does not enter.

    python issue_table.py W:K:Gbit/s,... SEEDS > issue_table.jsonl
    GAINS=0,-1 (default): the rule without the bound (0) and the default (-1)
"""

import json
import os
import sys

import numpy as np

from homagg import sim

rows = [
    tuple(int(x) if i < 2 else float(x) for i, x in enumerate(r.split(":")))
    for r in sys.argv[1].split(",")
]
seeds = [int(s) for s in sys.argv[2].split(",")]
gains = [float(x) for x in os.environ.get("GAINS", "0,-1").split(",")]
n = 1 << 20
for W, K, L in rows:
    rng = np.random.default_rng(1)
    g = [rng.standard_normal(n).astype(np.float32) for _ in range(W)]
    for seed in seeds:
        for gain in gains:
            out = {"W": W, "K": K, "link": L, "seed": seed, "gain": gain}
            for loss in (0.0, 0.001, 0.01):
                c = sim.Cluster(
                    workers=W,
                    aggregators=K,
                    loss=loss,
                    seed=seed,
                    link_gbps=L,
                    pipe_gain=None if gain < 0 else gain,
                )
                r = c.allreduce(g, method="dense")
                c.close()
                s = r.stats
                ws = s["workers"]
                out[str(loss)] = dict(
                    t=s["virtual_time"],
                    drops=s["fabric"]["dropped_loss"],
                    retrans=sum(w["retransmissions"] for w in ws),
                    timeouts=sum(w["timeouts"] for w in ws),
                )
            print(json.dumps(out), flush=True)
