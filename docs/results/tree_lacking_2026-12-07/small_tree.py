"""A small tree: W workers over L leaves at 100 Gbit/s, N dense floats,
1 % loss, seeds 1-40, NIC model (virtual time).  Per seed: the time over
the loss-free time (seed 1) and the leaves' resends for a worker's ask.

    python3 small_tree.py W L N > OUT.txt
"""

import sys

from homagg._native import lib
from homagg.bench import workloads
from homagg.sim import Cluster

W, L, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
grads = workloads.generate_all("dense", W, n, 1.0, 5)
with Cluster(workers=W, leaves=L, link_gbps=100, seed=1) as cl:
    res = cl.allreduce(grads, method="dense", block_elements=lib.HG_DEFAULT_BLOCK)
    clean = res.stats["virtual_time"]
print("clean", clean)
for seed in range(1, 41):
    with Cluster(workers=W, leaves=L, link_gbps=100, loss=0.01, seed=seed) as cl:
        r = cl.allreduce(grads, method="dense", block_elements=lib.HG_DEFAULT_BLOCK)
        eng = [cl.aggregator_counters(k)["engine"] for k in range(cl.aggregators)]
    print(seed, round(r.stats["virtual_time"] / clean, 2), sum(e["up_resent_worker"] for e in eng))
