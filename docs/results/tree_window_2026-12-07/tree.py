"""A tree of W workers over L leaves in the NIC model, sim.Cluster's
defaults but for the slots: per seed the loss-free run and the run at
1 % loss per hop (LOSS to change it), 2^E dense floats, every output
checked bit for bit against the loss-free sum.

    tree.py W L GBITS E SEEDS [SLOTS[,CAP]]

SLOTS: the job's slots (default: sim.Cluster's, now 256 with the pipe
capped at 128 at 16 senders per aggregator); CAP: the workers' pipe cap
with those slots (set through sim.Cluster's default, as the rule does).
One line per seed: time over the loss-free time, the timer expiries
(spurious ones too), the highest stall floor, retransmissions, drops,
partial sums sent up and sent up again."""

import os
import sys

import numpy as np

from homagg.bench.scale import LINK_DELAY
from homagg.sim import Cluster

W, L, gbps, E = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
seeds = [int(s) for s in sys.argv[5].split(",")]
kw = {}
if len(sys.argv) > 6:
    slots, _, cap = sys.argv[6].partition(",")
    if cap:
        Cluster._default_slots = lambda self, s, workers: (int(slots), int(cap))
    else:
        kw["slots"] = int(slots)
loss = float(os.environ.get("LOSS", "0.01"))
rng = np.random.default_rng(7)
grads = [rng.standard_normal(1 << E).astype(np.float32) for _ in range(W)]
for seed in seeds:
    runs = []
    for p in (0.0, loss):
        with Cluster(
            workers=W, leaves=L, link_gbps=gbps, loss=p, seed=seed, delay=LINK_DELAY, **kw
        ) as cl:
            res = cl.allreduce(grads, method="dense")
            aggs = [cl.aggregator_counters(k)["engine"] for k in range(cl.aggregators)]
            job = (cl.job.slots, cl.job.pipe_max)
        per = res.stats["workers"]
        if p == 0.0:
            want = res.sum.view(np.uint32)
        exact = all(np.array_equal(o.view(np.uint32), want) for o in res.outputs)
        runs.append(
            dict(
                t=res.stats["virtual_time"],
                timeouts=sum(w["timeouts"] for w in per),
                spurious=sum(w["spurious_timeouts"] for w in per),
                floor=max(w["rto_floor_ns"] for w in per) / 1e6,
                retx=sum(w["retransmissions"] for w in per),
                drops=int(res.stats["fabric"]["dropped_loss"]),
                up=sum(a["up_sent"] for a in aggs),
                up_retx=sum(a["up_retransmissions"] for a in aggs),
                exact=exact,
            )
        )
    c, r = runs
    print(
        f"W={W} L={L} {gbps:g} Gbit/s S={job[0]} cap={job[1]} seed {seed}: "
        f"loss-free {c['t'] * 1e3:.3f} ms, {loss:g} loss {r['t'] * 1e3:.3f} ms = "
        f"{r['t'] / c['t']:.2f}x; timeouts {r['timeouts']} (spurious {r['spurious']}), "
        f"floor {r['floor']:.3f} ms; retx {r['retx']}, drops {r['drops']}; "
        f"up {r['up']}, up again {r['up_retx']}; exact {c['exact'] and r['exact']}",
        flush=True,
    )
