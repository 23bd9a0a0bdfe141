"""Time at 1 % per-hop loss over the loss-free time, one line per seed, on
the NIC model as ``homagg bench scale`` builds a job (its link delay and
slots; the aggregators' links at homagg.sim.Cluster's default), 2^18
dense float32 per worker, and the engines' bad_worker count of the lossy
run.  Virtual time, so the machine's load does not enter.

    python many.py W K GBITS LEAVES FIRST_SEED LAST_SEED
"""

import sys

import numpy as np

from homagg import sim
from homagg.bench.scale import LINK_DELAY, auto_slots

W, K, L, leaves, s0, s1 = (
    int(sys.argv[1]),
    int(sys.argv[2]),
    float(sys.argv[3]),
    int(sys.argv[4]),
    int(sys.argv[5]),
    int(sys.argv[6]),
)
n = 1 << 18
rng = np.random.default_rng(1)
g = [rng.standard_normal(n).astype(np.float32) for _ in range(W)]
out = []
for seed in range(s0, s1 + 1):
    row = []
    for loss in (0.0, 0.01):
        with sim.Cluster(
            workers=W,
            link_gbps=L,
            seed=seed,
            delay=LINK_DELAY,
            aggregators=1 if leaves else K,
            leaves=leaves,
            loss=loss,
            slots=auto_slots(W if not leaves else max(-(-W // leaves), leaves), True),
        ) as c:
            s = c.allreduce(g, method="dense").stats
            row.append(s["virtual_time"])
            bw = s["engine"]["bad_worker"]
    out.append(row[1] / row[0])
    print(f"seed {seed}: {out[-1]:.2f}x bad_worker {bw}", flush=True)
a = np.array(out)
print(f"median {np.median(a):.2f} mean {a.mean():.2f} max {a.max():.2f} n={len(a)}")
