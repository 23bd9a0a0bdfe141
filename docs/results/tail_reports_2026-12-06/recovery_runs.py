"""`tests/test_recovery.py`'s tree runs and four more: W = 16 at 1 %, W = 64 at 0.1 %
and 1 %, 4 leaves, 100 Gbit/s, 2^18 dense floats, blocks of 256; one line
per run: retransmissions per drop, timeouts, virtual time, the engines'
tail_reports.  Virtual time (the NIC model).

    python recovery_runs.py TAIL_MIN_SECONDS   (needs leaf_tail_reports.patch)
"""

import sys

import numpy as np
from homagg.sim import Cluster

W_L = (
    [(16, 0.01, s) for s in (1, 2, 3)]
    + [(64, 0.001, s) for s in (1, 2, 3, 4, 5)]
    + [(64, 0.01, s) for s in (1, 2)]
)
tm = float(sys.argv[1])
for W, loss, seed in W_L:
    rng = np.random.default_rng(5)
    grads = [rng.standard_normal(1 << 18).astype(np.float32) for _ in range(W)]
    with Cluster(workers=W, leaves=4, link_gbps=100, loss=loss, seed=seed, tail_min=tm) as cl:
        res = cl.allreduce(grads, method="dense", block_elements=256)
    lost = res.stats["fabric"]["dropped_loss"]
    retrans = sum(w["retransmissions"] for w in res.stats["workers"])
    fast = sum(w["fast_retransmissions"] for w in res.stats["workers"])
    to = sum(w["timeouts"] for w in res.stats["workers"])
    print(
        W,
        loss,
        seed,
        "rpd %.2f" % (retrans / lost),
        retrans,
        lost,
        "fast",
        fast,
        "to",
        to,
        "vt %.3f ms" % (res.stats["virtual_time"] * 1e3),
        "tail",
        res.stats["engine"].get("tail_reports"),
        flush=True,
    )
