"""Chaos in the NIC model: whoever stops, every worker's give-up names it.

A worker or an aggregator stops at many points of an allreduce (before
its first frame, early, in the middle, near the end), with and without
loss, on one aggregator and spread over three.  Deterministic (seeded
NIC model, virtual time).  Each surviving worker must fail with
PeerTimeout whose text names the missing worker (by its job number) or
the dead aggregator (docs/PROTOCOL.md Part 3, "Timeouts and naming the
missing peers"), within its give-up time.  The DPDK testbed's version
with real processes is tests/test_chaos.py.
"""

import re

import numpy as np
import pytest

from homagg.errors import PeerTimeout
from homagg.sim import Cluster

pytestmark = pytest.mark.sanitize

TIMEOUT = 0.05
W = 4


def _grads(seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(40000).astype(np.float32) for _ in range(W)]


def _missing(text):
    """The worker numbers a give-up text says are missing."""
    m = re.search(r"missing workers? ([0-9,]+)", text)
    return {int(v) for v in m.group(1).split(",")} if m else set()


@pytest.mark.parametrize("aggregators", [1, 3])
@pytest.mark.parametrize("loss", [0.0, 0.02])
@pytest.mark.parametrize("victim,after", [(0, 0), (2, 5), (3, 60), (1, 120)])
def test_dead_worker_is_named_by_every_other_worker(aggregators, loss, victim, after):
    with Cluster(
        workers=W,
        aggregators=aggregators,
        seed=3 + victim,
        loss=loss,
        timeout=TIMEOUT,
        slots=8,
        link_gbps=1.0,
    ) as cl:
        cl.kill_worker(victim, after_packets=after)
        with pytest.raises(PeerTimeout) as ei:
            cl.allreduce(_grads(victim), method="dense")
    exc = ei.value
    live = [f for f in exc.failures if f.worker != victim]
    assert sorted(f.worker for f in live) == [w for w in range(W) if w != victim]
    for f in live:
        assert victim in _missing(str(f)), str(f)
        assert "no status from" not in str(f) and "no answer from" not in str(f), str(f)
    assert TIMEOUT <= exc.stats["virtual_time"] <= 3 * TIMEOUT


@pytest.mark.parametrize("loss", [0.0, 0.02])
@pytest.mark.parametrize("dead,after", [(0, 0.0), (1, 50e-6), (2, 0.6e-3)])
def test_dead_aggregator_is_named_by_every_worker(loss, dead, after):
    with Cluster(
        workers=W, aggregators=3, seed=5, loss=loss, timeout=TIMEOUT, slots=8, link_gbps=1.0
    ) as cl:
        cl.kill_aggregator(dead, after=after)
        with pytest.raises(PeerTimeout) as ei:
            cl.allreduce(_grads(7), method="dense")
    exc = ei.value
    assert sorted(f.worker for f in exc.failures) == list(range(W))
    ip = "10.0.0.1" if dead == 0 else f"10.0.1.{dead}"
    name = f"aggregator {ip}:48879 (shard {dead} of 3)"
    for f in exc.failures:
        assert name in str(f), str(f)
        assert not _missing(str(f)), str(f)  # no worker blamed
    assert TIMEOUT <= exc.stats["virtual_time"] <= 3 * TIMEOUT


# A two-level tree (docs/PROTOCOL.md "Tree", "Who is missing in a tree"):
# 6 workers under 3 leaves (0-1, 2-3, 4-5).  Before the leaves reported
# their missing workers to the root, the workers under the other leaves
# could only say that their leaf waited for the root.
TREE_W, LEAVES = 6, 3


def _tree_grads(seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(40000).astype(np.float32) for _ in range(TREE_W)]


@pytest.mark.parametrize("loss", [0.0, 0.02])
@pytest.mark.parametrize("victim,after", [(0, 0), (2, 5), (3, 60), (5, 120)])
def test_dead_worker_in_a_tree_is_named_by_every_other_worker(loss, victim, after):
    with Cluster(
        workers=TREE_W,
        leaves=LEAVES,
        seed=3 + victim,
        loss=loss,
        timeout=TIMEOUT,
        slots=8,
        link_gbps=1.0,
    ) as cl:
        cl.kill_worker(victim, after_packets=after)
        with pytest.raises(PeerTimeout) as ei:
            cl.allreduce(_tree_grads(victim), method="dense")
    exc = ei.value
    live = [f for f in exc.failures if f.worker != victim]
    assert sorted(f.worker for f in live) == [w for w in range(TREE_W) if w != victim]
    vleaf = victim // 2
    for f in live:
        assert _missing(str(f)) == {victim}, str(f)
        assert "no status from" not in str(f) and "no answer from" not in str(f), str(f)
        if f.worker // 2 != vleaf:
            assert f"missing leaf {vleaf} (workers {2 * vleaf}-{2 * vleaf + 1})" in str(f), str(f)
    assert TIMEOUT <= exc.stats["virtual_time"] <= 3 * TIMEOUT


@pytest.mark.parametrize("loss", [0.0, 0.02])
@pytest.mark.parametrize("dead,after", [(0, 0.0), (1, 50e-6), (2, 0.6e-3)])
def test_dead_leaf_is_named_by_every_worker(loss, dead, after):
    with Cluster(
        workers=TREE_W,
        leaves=LEAVES,
        seed=5,
        loss=loss,
        timeout=TIMEOUT,
        slots=8,
        link_gbps=1.0,
    ) as cl:
        cl.kill_aggregator(dead, after=after)
        with pytest.raises(PeerTimeout) as ei:
            cl.allreduce(_tree_grads(7), method="dense")
    exc = ei.value
    assert sorted(f.worker for f in exc.failures) == list(range(TREE_W))
    ip = "10.0.0.1" if dead == 0 else f"10.0.1.{dead}"
    for f in exc.failures:
        t = str(f)
        if f.worker // 2 == dead:
            assert re.search(rf"no (status|answer) from leaf aggregator {ip}:48879", t), t
        else:
            assert (
                f"missing leaf {dead} (workers {2 * dead}-{2 * dead + 1}): "
                f"no status from leaf aggregator {dead})" in t
            ), t
        assert not _missing(t), t  # no worker blamed
    assert TIMEOUT <= exc.stats["virtual_time"] <= 3 * TIMEOUT
