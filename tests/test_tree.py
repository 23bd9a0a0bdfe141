"""A two-level aggregation tree (docs/PROTOCOL.md, "Tree").

Through the NIC model (homagg.sim.Cluster(leaves=L)): L leaf aggregators
each sum their part of the workers and send one partial sum per slot up to
the root, whose result comes back down.  Every exact method is
bit-identical to the numpy oracle (tests/reference.py) under loss,
duplication and reordering on every link, the root's included; nothing
is summed twice at either level; a dead leaf or a dead root is reported
within the timeout; the codec keeps the job's worker ids.
"""
import numpy as np
import pytest

from homagg.errors import InvalidArgument, PeerTimeout
from homagg.protocol import EXACT_METHODS
from homagg.session import NOT_FRAME_OUTCOMES
from homagg.sim import Cluster

from test_sim import BLOCK, assert_bits_equal, check_result, make_grads

pytestmark = pytest.mark.sanitize

FAULTS = {"loss": 0.02, "duplicate": 0.02, "reorder": 0.05}


def leaf_sizes(workers, leaves):
    """Workers per leaf: leaf l serves floor(l W / L) .. floor((l + 1) W / L) - 1."""
    return [(l + 1) * workers // leaves - l * workers // leaves for l in range(leaves)]


def engines(cl):
    return [cl.aggregator_counters(k)["engine"] for k in range(cl.aggregators)]


def assert_summed_once(cl, workers):
    """Every completed set holds exactly its contributors, once each: no
    retransmission or duplicate was summed twice at a leaf or the root."""
    *leaves, root = engines(cl)
    for eng in leaves + [root]:
        # every received frame has exactly one outcome, root replies too
        assert eng["received"] == sum(v for k, v in eng.items()
                                      if k not in NOT_FRAME_OUTCOMES), eng
    for l, (eng, w) in enumerate(zip(leaves, leaf_sizes(workers, len(leaves)))):
        assert eng["summed"] == w * eng["completed"], (l, eng)
        # every set it sent up came back with the root's result
        assert eng["up_sent"] == eng["up_results"] == eng["completed"], (l, eng)
        assert eng["completed"] == root["completed"], (l, eng, root)
    assert root["summed"] == len(leaves) * root["completed"], root
    assert root["completed"] > 0


@pytest.mark.parametrize("leaves", (2, 3))
@pytest.mark.parametrize("method", EXACT_METHODS)
def test_exact_through_a_tree_under_faults(method, leaves):
    W = 7  # unequal leaves with L = 3 (2, 2, 3)
    grads = make_grads(W, 20000, density=0.05, seed=40 + leaves)
    with Cluster(workers=W, leaves=leaves, seed=leaves, slots=8, **FAULTS) as cl:
        res = cl.allreduce(grads, method=method, block_elements=BLOCK)
        check_result(res, grads)
        fab = cl.fabric_counters()
        assert fab["dropped_loss"] > 0 and fab["duplicated"] > 0 and fab["reordered"] > 0
        assert_summed_once(cl, W)


@pytest.mark.parametrize("method", ("dense", "lhc", "union"))
def test_heavy_loss_between_leaves_and_root(method):
    """10% loss on every hop: partial sums and root results are lost, the
    leaves resend up (timer, root STATUS, workers' retransmissions) and
    the root answers a leaf's retransmission of a completed slot with a
    replay; exact, nothing summed twice."""
    W = 6
    grads = make_grads(W, 30000, density=0.1, seed=51)
    with Cluster(workers=W, leaves=3, seed=9, slots=4, loss=0.1, duplicate=0.05,
                 reorder=0.05) as cl:
        check_result(cl.allreduce(grads, method=method, block_elements=BLOCK), grads)
        assert_summed_once(cl, W)
        *leaves, root = engines(cl)
        assert sum(e["up_retransmissions"] for e in leaves) > 0
        assert root["duplicates"] > 0 and root["replays"] > 0
        # leaves saw late copies and duplicates of root replies
        assert sum(e["up_stale"] for e in leaves) > 0


def test_results_are_multicast_at_each_level():
    W = 8
    grads = make_grads(W, 20000, density=1.0, seed=52, zero_blocks=False)
    with Cluster(workers=W, leaves=2, seed=1, slots=8) as cl:
        check_result(cl.allreduce(grads, method="dense", block_elements=BLOCK), grads)
        *leaves, root = engines(cl)
        # one frame per set at each level, to its group
        assert root["results_sent"] == root["completed"]
        for eng in leaves:
            assert eng["results_sent"] == eng["completed"]
        # per set a leaf's link receives its 4 workers' requests and the
        # root's result, the root's link the 2 leaves' partial sums (dense:
        # every frame of a set has the same size)
        rx = [cl.aggregator_counters(k)["link"]["rx_bytes"] for k in range(3)]
        assert rx[0] == rx[1] and abs(rx[2] / rx[0] - 2 / 5) < 0.01, rx


def test_unicast_tree_is_exact():
    W = 5
    grads = make_grads(W, 15000, density=0.2, seed=53)
    with Cluster(workers=W, leaves=2, seed=2, slots=8, multicast=False, **FAULTS) as cl:
        check_result(cl.allreduce(grads, method="lhc", block_elements=BLOCK), grads)
        assert_summed_once(cl, W)
        *leaves, root = engines(cl)
        assert root["results_sent"] >= 2 * root["completed"]


def test_successive_allreduces_reuse_the_sets():
    """S = 4: the sets start over many times at both levels."""
    W = 4
    with Cluster(workers=W, leaves=2, seed=6, slots=4, **FAULTS) as cl:
        for i, n in enumerate((700, 5000, 257, 9000)):
            grads = make_grads(W, n, density=0.3, seed=60 + i, zero_blocks=False)
            method = EXACT_METHODS[i % len(EXACT_METHODS)]
            check_result(cl.allreduce(grads, method=method, block_elements=BLOCK), grads)
        assert_summed_once(cl, W)


def test_codec_keeps_the_jobs_worker_ids():
    """Stochastic rounding draws per codec worker id: a tree (wire ids
    restart at 0 in every leaf) gives the flat cluster's bits."""
    W = 6
    grads = make_grads(W, 8000, density=0.5, seed=54)
    outs = []
    for leaves in (0, 3):
        with Cluster(workers=W, leaves=leaves, seed=3) as cl:
            outs.append(cl.allreduce(grads, method="dense", block_elements=BLOCK,
                                     stochastic=True, seed=77).sum)
    assert_bits_equal(outs[1], outs[0])


def test_dead_leaf_is_named():
    W = 6
    grads = make_grads(W, 40000, density=0.3, seed=55, zero_blocks=False)
    with Cluster(workers=W, leaves=3, seed=4, timeout=0.05, slots=8, link_gbps=1.0) as cl:
        cl.kill_aggregator(1, after=50e-6)
        with pytest.raises(PeerTimeout) as ei:
            cl.allreduce(grads, method="dense", block_elements=BLOCK)
    exc = ei.value
    assert 0.05 <= exc.stats["virtual_time"] <= 0.1
    by_worker = {f.worker: str(f) for f in exc.failures}
    assert sorted(by_worker) == list(range(W))
    for w in (2, 3):  # leaf 1's workers name it
        assert "aggregator 10.0.1.1:48879" in by_worker[w], by_worker[w]
    for w, leaf in ((0, "10.0.0.1"), (5, "10.0.1.2")):
        # the others' leaves have them all and wait for the root
        assert f"aggregator {leaf}:48879 reports workers" in by_worker[w]
        assert "complete there: it waits for its root aggregator" in by_worker[w]


def test_dead_root_is_reported_by_every_worker():
    W = 4
    grads = make_grads(W, 20000, density=0.3, seed=56, zero_blocks=False)
    with Cluster(workers=W, leaves=2, seed=4, timeout=0.05, slots=8) as cl:
        cl.kill_aggregator(2)
        with pytest.raises(PeerTimeout) as ei:
            cl.allreduce(grads, method="dense", block_elements=BLOCK)
        *leaves, _root = engines(cl)
    assert len(ei.value.failures) == W
    for f in ei.value.failures:
        assert "waits for its root aggregator" in str(f), str(f)
        # the worker ids named are the job's (2, 3 at leaf 1), not the leaf's
        assert ("workers 0,1 present" if f.worker < 2 else "workers 2,3 present") in str(f)
    for eng in leaves:
        assert eng["up_results"] == 0 and eng["up_retransmissions"] > 0
        assert eng["summed"] == 2 * eng["completed"]


def test_replies_to_a_leaf_only_from_its_root():
    """RESULT/STATUS frames reach a leaf from elsewhere (the fabric's
    attacker port): dropped under bad_flags, the allreduce stays exact; a
    flat job still drops every RESULT as bad_flags."""
    W = 4
    grads = make_grads(W, 5000, density=0.5, seed=57)
    with Cluster(workers=W, leaves=2, seed=5, slots=8) as cl:
        for flags in (lib_flag("RESULT"), lib_flag("STATUS")):
            cl.inject(cl.build_frame(flags=flags, payload=b"\0" * 1024 if flags == lib_flag("RESULT")
                                     else b"\xff", lanes=256, worker=0xFFFF))
        check_result(cl.allreduce(grads, method="dense", block_elements=BLOCK), grads)
        leaf0 = cl.aggregator_counters(0)["engine"]
        assert leaf0["bad_flags"] == 2
        assert leaf0["up_results"] == leaf0["completed"]
    with Cluster(workers=2, seed=5) as cl:
        cl.inject(cl.build_frame(flags=lib_flag("RESULT"), payload=b"\0" * 1024, lanes=256))
        cl.allreduce(make_grads(2, 1000, seed=1), method="dense", block_elements=BLOCK)
        assert cl.engine_counters()["bad_flags"] == 1


def lib_flag(name):
    from homagg._native import lib

    return getattr(lib, f"HG_FLAG_{name}")


def test_bad_tree_configurations():
    with pytest.raises(InvalidArgument, match="aggregators=1"):
        Cluster(workers=4, leaves=2, aggregators=2)
    with pytest.raises(InvalidArgument, match="at least as many workers"):
        Cluster(workers=2, leaves=3)
    with pytest.raises(InvalidArgument, match="does not authenticate"):
        Cluster(workers=4, leaves=2, auth=True)
    with pytest.raises(InvalidArgument, match="leaves must be"):
        Cluster(workers=80, leaves=64)
    with Cluster(workers=4, leaves=2) as cl:
        assert cl.aggregators == 3
        with pytest.raises(Exception, match="add job"):
            cl.add_job(workers=1)



# ---- the DPDK testbed: two leaf daemons and a root daemon -----------------

@pytest.mark.root
@pytest.mark.netns
@pytest.mark.dpdk
@pytest.mark.timeout(300)
def test_testbed_tree_of_dpdk_daemons(tmp_path):
    """`homagg testbed up --leaves 2`: 3 workers (2 at leaf agg1), leaves
    agg and agg1 below the root agg2, each a homagg-switch; exact for a
    SUM32 method (dense) and for lhc (OR and SUM32 phases); nothing summed
    twice at either level; a tree and --aggregators are refused together."""
    import os
    import secrets

    from conftest import require
    from homagg import run as runmod
    from homagg.testbed import Testbed

    require(os.geteuid() == 0, "needs root")
    try:
        runmod.find_switch()
    except runmod.RunError as e:
        require(False, str(e))
    sd = str(tmp_path / "testbeds")
    name = "tr" + secrets.token_hex(5)
    tb = Testbed.up(name, workers=3, link_mbit=1000, leaves=2, state_dir=sd)
    try:
        assert [h.name for h in tb.aggregators] == ["agg", "agg1", "agg2"]
        for method in ("dense", "lhc"):
            rep = runmod.run_allreduce(name, method, elements=40_000, density=0.05,
                                       workload="random", seed=11, state_dir=sd)
            assert rep["exact"] is True, rep["exact_per_worker"]
            assert rep["leaves"] == 2
            roles = {a["host"]: a["role"] for a in rep["aggregators"]}
            assert roles == {"agg": "leaf", "agg1": "leaf", "agg2": "root"}
            leaves = [a["counters"] for a in rep["aggregators"][:2]]
            root = rep["aggregators"][2]["counters"]
            for c, w in zip(leaves, (1, 2)):
                assert c["completed"] > 0
                assert c["summed"] == w * c["completed"], c
                assert c["up_sent"] == c["up_results"] == c["completed"] == root["completed"]
            assert root["summed"] == 2 * root["completed"], root
            assert tb.state()["processes"] == []
        with pytest.raises(runmod.RunError, match="exclude each other"):
            runmod.run_allreduce(name, "dense", elements=100, density=1.0, state_dir=sd,
                                 aggregators=2)
    finally:
        Testbed.down(name, state_dir=sd)
