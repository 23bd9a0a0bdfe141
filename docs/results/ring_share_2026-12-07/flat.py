"""A flat job of W workers over K aggregators in the NIC model, 2^E dense
floats, sim.Cluster's defaults: loss-free, then 1 % loss with 16 slots
(the default before "Slots beyond the ring's share", docs/PROTOCOL.md
Part 3) and with the default now (32 slots, the pipe capped at half the
ring).  One JSON line per seed; times in ms of virtual time; x16 and x
the lossy times over the loss-free one.  Every worker's output of every
run is checked bit for bit against the loss-free run's sum.
    python flat.py W K GBITS E SEEDS        (SEEDS: 1,2,3)
LOSS=0.001 in the environment gives another loss rate (default 0.01)."""

import json
import os
import sys

import numpy as np

from homagg import sim

LOSS = float(os.environ.get("LOSS", "0.01"))
W, K, G, e = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(1)
grads = [rng.standard_normal(1 << e).astype(np.float32) for _ in range(W)]
for seed in [int(x) for x in sys.argv[5].split(",")]:
    out = {"W": W, "K": K, "gbits": G, "e": e, "seed": seed, "loss": LOSS}
    ref = None
    for name, loss, slots in (("free", 0.0, None), ("s16", LOSS, 16), ("default", LOSS, None)):
        with sim.Cluster(
            workers=W, aggregators=K, loss=loss, seed=seed, link_gbps=G, slots=slots
        ) as cl:
            res = cl.allreduce(grads, method="dense")
            job = (cl.job.slots, cl.job.pipe_max)
        if ref is None:
            ref = res.sum
        exact = all(np.array_equal(o.view(np.uint32), ref.view(np.uint32)) for o in res.outputs)
        st = res.stats
        drops = st["fabric"]["dropped_loss"]
        out[name] = dict(
            ms=round(st["virtual_time"] * 1e3, 4),
            slots=job[0],
            pipe_max=job[1],
            exact=exact,
            rpd=round(sum(w["retransmissions"] for w in st["workers"]) / max(drops, 1), 2),
            timeouts=sum(w["timeouts"] for w in st["workers"]),
            ring_overflow=st["fabric"]["rx_ring_overflow"],
        )
    out["x16"] = round(out["s16"]["ms"] / out["free"]["ms"], 2)
    out["x"] = round(out["default"]["ms"] / out["free"]["ms"], 2)
    print(json.dumps(out), flush=True)
