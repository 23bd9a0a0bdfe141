"""treetest.py W L N SEED...: W workers under L leaves, N dense floats in
blocks of 4096, 100 Gbit/s, 1 % loss; each line seed, time over the
loss-free time, drops, retransmissions (tests/test_recovery.py's rule-5
test is W = 256, L = 16, N = 262144, seeds 1-4)."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tests"))
from test_recovery import _grads, _check_exact
from homagg.sim import Cluster

W, L, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
grads = _grads(W, n, seed=5)
with Cluster(workers=W, leaves=L, link_gbps=100, seed=1) as cl:
    clean = cl.allreduce(grads, method="dense", block_elements=4096).stats["virtual_time"]
for seed in map(int, sys.argv[4:]):
    with Cluster(workers=W, leaves=L, link_gbps=100, loss=0.01, seed=seed) as cl:
        res = cl.allreduce(grads, method="dense", block_elements=4096)
    _check_exact(res, grads, block=4096)
    lost = res.stats["fabric"]["dropped_loss"]
    rx = sum(w["retransmissions"] for w in res.stats["workers"])
    print(seed, round(res.stats["virtual_time"] / clean, 4), lost, rx, flush=True)
