"""Retransmissions per drop by kind, a tree of W = 16 over 4 leaves at
100 Gbit/s and 1 % loss, 2^E floats (the arguments of tests/test_recovery.py:
blocks of 256, gradients of seed 5), with 256 and 512 slots, seeds 1-3.

    python rpd_slots.py E
"""

import sys, numpy as np
from homagg.sim import Cluster
rng = np.random.default_rng(5)
e=int(sys.argv[1])
grads = [rng.standard_normal(1 << e).astype(np.float32) for _ in range(16)]
for slots in (256, 512):
    for seed in (1,2,3):
        with Cluster(workers=16, leaves=4, link_gbps=100, loss=0.01, seed=seed, slots=slots) as cl:
            st = cl.allreduce(grads, method="dense", block_elements=256).stats
        per=st["workers"]; d=st["fabric"]["dropped_loss"]
        k=lambda n: sum(w[n] for w in per)
        print(slots, seed, "rpd", round(k("retransmissions")/d,2), "fast", k("fast_retransmissions"), "to", k("timeouts"), "win", k("window_retransmissions"), "probes", k("start_probes"), "drops", d, "t", round(st["virtual_time"]*1e3,3))
