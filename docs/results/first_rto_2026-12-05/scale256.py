"""W = 256 on the NIC model as ``homagg bench scale`` builds it (the
aggregators' links as fast as a worker's, its slots and link delay), 2^18
dense float32 per worker, loss-free and 1 % per-hop loss, for each initial
timeout in RTOS (seconds; None: homagg.sim.Cluster's default); AGG=auto:
the aggregators' links at homagg.sim.Cluster's default instead
(``--agg-link-gbps auto``).  Virtual time, so the machine's load does not
enter.

    RTOS=200e-6,None [AGG=auto] python scale256.py W K GBITS LEAVES [SEED]
"""

import os
import sys
import time

import numpy as np

from homagg import sim
from homagg.bench.scale import LINK_DELAY, auto_slots

W, K, L, leaves = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
seed = int(sys.argv[5]) if len(sys.argv) > 5 else 3
n = 1 << 18
rng = np.random.default_rng(1)
g = [rng.standard_normal(n).astype(np.float32) for _ in range(W)]

for rto in [
    float(x) if x != "None" else None for x in os.environ.get("RTOS", "200e-6,None").split(",")
]:
    row = []
    for loss in (0.0, 0.01):
        t = time.time()
        with sim.Cluster(
            workers=W,
            link_gbps=L,
            agg_link_gbps=None if os.environ.get("AGG") == "auto" else L,
            seed=seed,
            delay=LINK_DELAY,
            aggregators=1 if leaves else K,
            leaves=leaves,
            loss=loss,
            rto=rto,
            slots=auto_slots(W if not leaves else max(-(-W // leaves), leaves), True),
        ) as c:
            s = c.allreduce(g, method="dense").stats
            ws = s["workers"]
            row.append(
                (
                    s["virtual_time"] * 1e3,
                    sum(w["timeouts"] for w in ws),
                    sum(w["start_probes"] for w in ws),
                    time.time() - t,
                )
            )
    print(
        f"W={W} K={K} L={L} leaves={leaves} seed={seed} rto={rto}: clean {row[0][0]:.2f} ms, 1% {row[1][0]:.2f} ms = {row[1][0] / row[0][0]:.2f}x; to={row[1][1]} sp={row[1][2]} clean sp={row[0][2]} wall {row[0][3] + row[1][3]:.0f}s",
        flush=True,
    )
