"""Recovery by cause, in the seeded NIC model (virtual time, deterministic).

docs/PROTOCOL.md Part 3, "Three causes, told apart": a worker whose chunk
waits tells a lost frame of its own (gap or STATUS: fast retransmission),
a peer's repair (a STATUS with its contribution present) and a peer that
has not started the step (no result of the step yet: start probes, which
are not timeouts and back off only their own chunk).  Results are
compared bit for bit with the numpy fixed-point reference.
"""
import math

import numpy as np
import pytest

from homagg.sim import Cluster

from reference import allreduce as oracle_allreduce

pytestmark = pytest.mark.sanitize

BLOCK = 256


def _grads(W, n, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(np.float32) for _ in range(W)]


def _check_exact(res, grads):
    want = oracle_allreduce(grads, BLOCK).view(np.uint32)
    for out in res.outputs:
        assert np.array_equal(out.view(np.uint32), want)


@pytest.mark.parametrize("W,K", [(16, 1), (64, 4)])
@pytest.mark.parametrize("delay", [0.010, 0.100])
def test_straggler_costs_its_lateness_and_no_timeouts(W, K, delay):
    """One worker starts the allreduce `delay` late: the punctual ones
    time nothing out, learn no floor, and finish `delay` after they would
    have -- within one loss-free allreduce more (the straggler's own
    share once it starts); their only resends are start probes, about
    log2(delay / start_wait) + 1 per worker and aggregator."""
    grads = _grads(W, 1 << 16, seed=W)
    with Cluster(workers=W, aggregators=K, seed=3) as cl:
        base = cl.allreduce(grads, method="dense", block_elements=BLOCK)
        cl.delay_start(W - 1, delay)
        res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
        cl.delay_start(W - 1, 0)
        after = cl.allreduce(grads, method="dense", block_elements=BLOCK)
    _check_exact(res, grads)
    t0 = base.stats["virtual_time"]
    assert delay <= res.stats["virtual_time"] <= delay + 2 * t0, (res.stats["virtual_time"], t0)
    punctual = res.stats["workers"][:-1]
    start_wait = 4 * 200e-6  # the simulated cluster's 4 rto
    bound = K * (math.log2(delay / start_wait) + 2)
    for st in punctual:
        assert st["timeouts"] == 0 and st["spurious_timeouts"] == 0, st
        assert st["retransmissions"] == st["start_probes"] <= bound, (st["start_probes"], bound)
    # nothing learnt that slows the next, punctual allreduce down
    assert after.stats["virtual_time"] <= 1.5 * t0
    assert max(st["rto_floor_ns"] for st in after.stats["workers"]) == 0


@pytest.mark.parametrize("W,K,n", [(16, 1, 1 << 20), (64, 4, 1 << 18)])
def test_loss_at_scale_is_exact_within_two_retransmissions_per_drop(W, K, n):
    """1 % per-hop loss at W = 16 and 64: exact on every worker, at most
    two retransmissions per dropped frame (the turns of "Fast
    retransmission": a lost contribution costs 2 - 1/W on average)."""
    grads = _grads(W, n, seed=5)
    with Cluster(workers=W, aggregators=K, loss=0.01, seed=3) as cl:
        res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
    _check_exact(res, grads)
    lost = res.stats["fabric"]["dropped_loss"]
    retrans = sum(w["retransmissions"] for w in res.stats["workers"])
    assert lost > 500
    assert retrans <= 2 * lost, (retrans, lost)
