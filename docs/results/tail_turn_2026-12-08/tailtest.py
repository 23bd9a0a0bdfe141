"""The runs of tests/test_recovery.py's rule-4 test, printed: W = 256 over
16 aggregators, 2^18 floats, 100 Gbit/s, 0.1 % loss, seeds 1-4; each line
seed, time over the loss-free time, drops, retransmissions."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tests"))
from test_recovery import _grads, _check_exact
from homagg.sim import Cluster

W = 256
grads = _grads(W, 1 << 18, seed=5)
with Cluster(workers=W, aggregators=16, link_gbps=100, seed=1) as cl:
    clean = cl.allreduce(grads, method="dense", block_elements=4096).stats["virtual_time"]
for seed in range(1, 5):
    with Cluster(workers=W, aggregators=16, link_gbps=100, loss=0.001, seed=seed) as cl:
        res = cl.allreduce(grads, method="dense", block_elements=4096)
    _check_exact(res, grads, block=4096)
    lost = res.stats["fabric"]["dropped_loss"]
    rx = sum(w["retransmissions"] for w in res.stats["workers"])
    print(seed, round(res.stats["virtual_time"] / clean, 4), lost, rx, flush=True)
