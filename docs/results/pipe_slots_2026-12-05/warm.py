"""Three allreduces in a row on one homagg.sim.Cluster (its estimators and
the pipe's bound kept between them), with and without 1 % per-hop loss:
each lossy allreduce's time over the loss-free one of the same index.
2^20 dense float32 per worker, the cluster's defaults.  Virtual time
(the NIC model), so the machine's load does not enter.

    python warm.py W K GBITS SEEDS > warm_W.txt
    SW=seconds: start_wait; RTOMIN=seconds: rto_min; RTO=seconds: the initial
    timeout (default: the cluster's)

Worker counters are per client and accumulate over the allreduces, so
to= and sp= are running totals.
"""

import os
import sys

import numpy as np

from homagg import sim

W, K, gb = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
seeds = [int(x) for x in sys.argv[4].split(",")]
opt = {}
if "SW" in os.environ:
    opt["start_wait"] = float(os.environ["SW"])
if "RTO" in os.environ:
    opt["rto"] = float(os.environ["RTO"])
if "RTOMIN" in os.environ:
    opt["rto_min"] = float(os.environ["RTOMIN"])
n = 1 << 20
rng = np.random.default_rng(1)
g = [rng.standard_normal(n).astype(np.float32) for _ in range(W)]
for seed in seeds:
    out = []
    for loss in (0.0, 0.01):
        c = sim.Cluster(workers=W, aggregators=K, loss=loss, seed=seed, link_gbps=gb, **opt)
        runs = []
        for _ in range(3):
            s = c.allreduce(g, method="dense").stats
            per = s["workers"]
            runs.append(
                (
                    s["virtual_time"],
                    sum(w["timeouts"] for w in per),
                    sum(w["start_probes"] for w in per),
                    s["fabric"]["dropped_loss"],
                    sum(w["retransmissions"] for w in per),
                )
            )
        c.close()
        out.append(runs)
    clean, lossy = out
    cells = []
    for i in range(3):
        # drops and retransmissions of this allreduce alone (the counters
        # accumulate)
        drops = lossy[i][3] - (lossy[i - 1][3] if i else 0)
        retrans = lossy[i][4] - (lossy[i - 1][4] if i else 0)
        cells.append(
            f"#{i}: {lossy[i][0] / clean[i][0]:.2f}x to={lossy[i][1]} sp={lossy[i][2]}"
            f" re/d={retrans / max(1, drops):.2f}"
        )
    print(
        f"W={W} K={K} {gb:g}G seed={seed} | "
        + " | ".join(cells)
        + f" | loss-free ms {[round(r[0] * 1e3, 3) for r in clean]}",
        flush=True,
    )
