"""Timeline of a flat NIC-model allreduce (W over K aggregators, 2^20 dense
floats): every STEP us, the busiest aggregator link's rx bytes in the
step (as a share of its line rate), workers done, results placed.

    python3 timeline.py W K GBPS LOSS SEED STEP_US
"""

import sys

import numpy as np
from homagg import protocol
from homagg._native import lib
from homagg.bench import workloads
from homagg.bench.scale import LINK_DELAY
from homagg.bindings import sim as _b
from homagg.sim import Cluster, _params

W, K, gbps, loss, seed, step = (
    int(sys.argv[1]),
    int(sys.argv[2]),
    float(sys.argv[3]),
    float(sys.argv[4]),
    int(sys.argv[5]),
    float(sys.argv[6]),
)
grads = workloads.generate_all("dense", W, 1 << 20, 1.0, seed)
with Cluster(
    workers=W, link_gbps=gbps, seed=seed, delay=LINK_DELAY, aggregators=K, loss=loss
) as cl:
    s = cl._live()
    job = cl.job
    xs = [np.ascontiguousarray(g).reshape(-1) for g in grads]
    ys = [np.empty_like(x) for x in xs]
    p = _params(W, cost=job.cost, block_elements=lib.HG_DEFAULT_BLOCK)
    keep = _b.sim_start(s, job.index, protocol.method("dense").code, p, xs, ys)
    rate = cl.agg_link_gbps * 1e9 / 8
    prev = [0] * K
    t = 0.0
    done_at = {}
    while True:
        rc = _b.sim_run(s, int(step * 1000))
        t += step
        rx = [cl.aggregator_counters(k)["link"]["rx_bytes"] for k in range(K)]
        d = [a - b for a, b in zip(rx, prev)]
        prev = rx
        for w in range(W):
            if w not in done_at and _b.sim_worker_status(s, job.index, w) != 0:
                done_at[w] = t
        done = len(done_at)
        res = sum(_b.sim_worker_stats(s, job.index, w)["results_received"] for w in range(W))
        to = sum(_b.sim_worker_stats(s, job.index, w)["timeouts"] for w in range(W))
        print(
            f"{t:8.1f} us  busiest {max(d) / (rate * step * 1e-6):5.2f} least {min(d) / (rate * step * 1e-6):5.2f}"
            f"  done {done:4d}  results {res:8d}  timeouts {to}",
            flush=True,
        )
        if rc == 0:
            break
    late = sorted(done_at, key=lambda w: -done_at[w])[:20]
    for w in late:
        st = _b.sim_worker_stats(s, job.index, w)
        print(
            w,
            done_at[w],
            {
                k: st[k]
                for k in (
                    "timeouts",
                    "spurious_timeouts",
                    "fast_retransmissions",
                    "retransmissions",
                    "srtt_ns",
                    "rttvar_ns",
                    "rto_ns",
                    "rto_floor_ns",
                    "status_received",
                )
            },
        )
    import statistics

    for k in ("srtt_ns", "rttvar_ns", "rto_ns", "rto_floor_ns"):
        v = [_b.sim_worker_stats(s, job.index, w)[k] for w in range(W)]
        print(k, "median", statistics.median(v), "max", max(v), "nonzero", sum(1 for x in v if x))
