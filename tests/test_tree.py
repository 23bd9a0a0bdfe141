"""A two-level aggregation tree (docs/PROTOCOL.md, "Tree").

Through the NIC model (homagg.sim.Cluster(leaves=L)): L leaf aggregators
each sum their part of the workers and send one partial sum per slot up to
the root, whose result comes back down.  Every exact method is
bit-identical to the numpy oracle (tests/reference.py) under loss,
duplication and reordering on every link, the root's included; nothing
is summed twice at either level; a dead leaf or a dead root is reported
within the timeout; the codec keeps the job's worker ids.
"""

import re

import numpy as np
import pytest

from homagg.errors import InvalidArgument, PeerTimeout
from homagg.protocol import EXACT_METHODS, OPS
from homagg.runs.session import NOT_FRAME_OUTCOMES
from homagg.sim import Cluster

from helpers import require_gmac
from sim_rig import BLOCK, assert_bits_equal, check_result, make_grads

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
        assert eng["received"] == sum(v for k, v in eng.items() if k not in NOT_FRAME_OUTCOMES), eng
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
    with Cluster(
        workers=W, leaves=3, seed=9, slots=4, loss=0.1, duplicate=0.05, reorder=0.05
    ) as cl:
        check_result(cl.allreduce(grads, method=method, block_elements=BLOCK), grads)
        assert_summed_once(cl, W)
        *leaves, root = engines(cl)
        assert sum(e["up_retransmissions"] for e in leaves) > 0
        assert root["duplicates"] > 0 and root["replays"] > 0
        # leaves saw late copies and duplicates of root replies
        assert sum(e["up_stale"] for e in leaves) > 0
        # the leaves reported their missing workers during repairs (PROTOCOL.md
        # "Who is missing in a tree"): taken at the root, never summed (above)
        assert root["leaf_reports"] > 0
        assert sum(e["up_reports"] for e in leaves) >= root["leaf_reports"]


@pytest.mark.parametrize("mac", ("umac", "aes-gmac", "blake2b"))
def test_tree_with_auth_is_exact_under_loss(mac):
    """Authentication at both levels (docs/PROTOCOL.md "Tree"): each leaf's
    workers use the leaf's secret, each leaf its own key at the root; with
    loss, duplication and reordering on every hop the sum is exact, no
    frame fails its MAC and nothing is summed twice."""
    from homagg import auth

    if mac != "blake2b":
        require_gmac(auth.mac_available(auth.mac_code(mac)))
    W = 6
    grads = make_grads(W, 20000, density=0.1, seed=53)
    with Cluster(
        workers=W,
        leaves=3,
        seed=10,
        slots=4,
        loss=0.05,
        duplicate=0.05,
        reorder=0.05,
        auth=True,
        mac=mac,
    ) as cl:
        check_result(cl.allreduce(grads, method="lhc", block_elements=BLOCK), grads)
        assert_summed_once(cl, W)
        *leaves, root = engines(cl)
        assert root["bad_mac"] == 0 and all(e["bad_mac"] == 0 for e in leaves)
        assert sum(e["up_retransmissions"] for e in leaves) > 0
        assert root["summed"] > 0
        assert root["leaf_reports"] > 0  # MACed reports verified at the root


@pytest.mark.parametrize("mac", ("umac", "blake2b"))
def test_tree_key_rotation_fails_no_allreduce(mac):
    """A running authenticated tree takes two key rotations (docs/PROTOCOL.md
    "Key epochs in a tree": every leaf the root's next keys, the root, then
    each leaf's workers and the leaf), under loss, duplication and
    reordering: every allreduce across the switches and past both grace
    periods is exact, no frame fails its MAC at any level, and the leaves
    went on sending up in the new epochs (the root refuses the old epoch
    once its grace period has passed)."""
    from homagg import auth

    if mac != "blake2b":
        require_gmac(auth.mac_available(auth.mac_code(mac)))
    W = 6
    grads = make_grads(W, 20000, density=0.1, seed=54)
    with Cluster(workers=W, leaves=3, seed=11, slots=4, auth=True, mac=mac, **FAULTS) as cl:
        check_result(cl.allreduce(grads, method="lhc", block_elements=BLOCK), grads)
        for epoch in (1, 2):
            assert cl.rotate_key(bytes([epoch]) * 32, grace=0.001) == epoch
            t_rotate = cl.stats()["now_ns"]
            for i in range(100):  # past the grace period, at least 3
                if i >= 3 and cl.stats()["now_ns"] - t_rotate > 1_000_000:
                    break
                check_result(cl.allreduce(grads, method="dense", block_elements=BLOCK), grads)
            assert cl.stats()["now_ns"] - t_rotate > 1_000_000
        assert_summed_once(cl, W)
        *leaves, root = engines(cl)
        assert root["bad_mac"] == 0 and all(e["bad_mac"] == 0 for e in leaves)
        assert sum(e["up_retransmissions"] for e in leaves) > 0


def test_w256_tree_under_loss_resends_no_copy_on_its_way():
    """W = 256 over 16 leaves at 100 Gbit/s, 1 % loss, seeded (virtual
    time): exact, and the leaves send up again at most one set in two of
    those they sent (docs/PROTOCOL.md "Repairs in a tree": a root STATUS
    that lacks a leaf within the hold-off puts the resend off).  Resending
    at once on every such STATUS sent 1.6-2.5 copies per set here, most
    of them while the first was still on its way."""
    W, L = 256, 16
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal(1 << 16).astype(np.float32) for _ in range(W)]
    with Cluster(workers=W, leaves=L, loss=0.01, seed=1, link_gbps=100) as cl:
        check_result(cl.allreduce(grads, method="dense", block_elements=BLOCK), grads)
        *leaves, root = engines(cl)
        sent = sum(e["up_sent"] for e in leaves)
        resent = sum(e["up_retransmissions"] for e in leaves)
        assert sent >= L * 256 and cl.fabric_counters()["dropped_loss"] > 0
        assert resent <= sent / 2, (resent, sent)
        # every resend has its cause, and the root sends nothing up
        for e in leaves:
            assert sum(_causes(e)) == e["up_retransmissions"], e
        assert sum(_causes(root)) == root["up_retransmissions"] == 0


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
            outs.append(
                cl.allreduce(
                    grads, method="dense", block_elements=BLOCK, stochastic=True, seed=77
                ).sum
            )
    assert_bits_equal(outs[1], outs[0])


def _missing(text):
    """The worker numbers a give-up text says are missing (as in
    tests/test_chaos_sim.py)."""
    m = re.search(r"missing workers? ([0-9,]+)", text)
    return {int(v) for v in m.group(1).split(",")} if m else set()


def assert_nothing_summed_twice(cl, workers, slots):
    """After a failure: every frame has one outcome (a leaf report is one,
    never summed), each completed set holds its contributors once, and the
    sets left open (at most 2 S) hold fewer than all of them."""
    *leaves, root = engines(cl)
    for eng in leaves + [root]:
        assert eng["received"] == sum(v for k, v in eng.items() if k not in NOT_FRAME_OUTCOMES), eng
    for eng, w in zip(leaves + [root], leaf_sizes(workers, len(leaves)) + [len(leaves)]):
        assert 0 <= eng["summed"] - w * eng["completed"] <= (w - 1) * 2 * slots, eng
    for eng in leaves:
        assert eng["up_sent"] == eng["completed"], eng
        assert eng["up_results"] == root["completed"], (eng, root)


def test_dead_leaf_is_named():
    """Leaf 1 dies: its workers name it as their leaf aggregator, the
    workers under the other leaves name it by its index and workers from
    the root's view their leaf's STATUS carries (docs/PROTOCOL.md "Who is
    missing in a tree"); no worker is blamed."""
    W = 6
    grads = make_grads(W, 40000, density=0.3, seed=55, zero_blocks=False)
    with Cluster(workers=W, leaves=3, seed=4, timeout=0.05, slots=8, link_gbps=1.0) as cl:
        cl.kill_aggregator(1, after=50e-6)
        with pytest.raises(PeerTimeout) as ei:
            cl.allreduce(grads, method="dense", block_elements=BLOCK)
        *leaves, root = engines(cl)
    exc = ei.value
    assert 0.05 <= exc.stats["virtual_time"] <= 0.1
    by_worker = {f.worker: str(f) for f in exc.failures}
    assert sorted(by_worker) == list(range(W))
    for w in (2, 3):  # leaf 1's workers name it
        assert re.search(
            r"no (status|answer) from leaf aggregator 10\.0\.1\.1:48879", by_worker[w]
        ), by_worker[w]
    for w, leaf in ((0, "10.0.0.1"), (1, "10.0.0.1"), (4, "10.0.1.2"), (5, "10.0.1.2")):
        # the others' leaves have them all and wait for the root, which lacks leaf 1
        t = by_worker[w]
        assert f"leaf aggregator {leaf}:48879 reports workers" in t, t
        assert (
            "complete there: it waits for its root aggregator, which reports leaves 0,2 present, "
            in t
        ), t
        assert "missing leaf 1 (workers 2-3): no status from leaf aggregator 1)" in t, t
    for t in by_worker.values():
        assert not _missing(t), t
    assert root["leaf_reports"] == 0 and all(e["up_reports"] == 0 for e in leaves)


@pytest.mark.parametrize("victim", (3, 0, 5))
@pytest.mark.parametrize("auth", (False, True))
def test_dead_worker_under_another_leaf_is_named(victim, auth):
    """A worker dies: the others of its leaf name it from their leaf's
    STATUS; the workers under the other leaves name it by its job number
    too, from the leaf report its leaf sent the root and the root's view
    their own leaf passes down (docs/PROTOCOL.md "Who is missing in a
    tree").  The reports are MACed in an auth tree and never summed."""
    W, L = 6, 3
    sizes = leaf_sizes(W, L)
    firsts = [sum(sizes[:l]) for l in range(L)]
    vleaf = max(l for l in range(L) if firsts[l] <= victim)
    grads = make_grads(W, 40000, density=0.3, seed=57, zero_blocks=False)
    with Cluster(
        workers=W, leaves=L, seed=4 + victim, timeout=0.05, slots=8, link_gbps=1.0, auth=auth
    ) as cl:
        cl.kill_worker(victim, after_packets=20)
        with pytest.raises(PeerTimeout) as ei:
            cl.allreduce(grads, method="dense", block_elements=BLOCK)
        *leaves, root = engines(cl)
        assert_nothing_summed_twice(cl, W, 8)
    exc = ei.value
    assert 0.05 <= exc.stats["virtual_time"] <= 0.1
    live = {f.worker: str(f) for f in exc.failures if f.worker != victim}
    assert sorted(live) == [w for w in range(W) if w != victim]
    lo, hi = firsts[vleaf], firsts[vleaf] + sizes[vleaf] - 1
    for w, t in live.items():
        assert _missing(t) == {victim}, t
        if firsts[vleaf] <= w <= hi:
            continue  # its own leaf's STATUS names it, as on a flat job
        assert (
            f"missing leaf {vleaf} (workers {lo}-{hi}): its aggregator reports missing worker {victim})"
            in t
        ), t
    assert leaves[vleaf]["up_reports"] > 0
    assert root["leaf_reports"] == leaves[vleaf]["up_reports"]  # no loss: each arrived
    assert root["bad_mac"] == 0 and all(e["bad_mac"] == 0 for e in leaves)
    for l, eng in enumerate(leaves):
        if l != vleaf:
            assert eng["up_reports"] == 0, (l, eng)  # nothing missing there


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


def test_root_restart_ends_the_allreduce_and_the_retry_is_exact():
    """The root loses its state mid-allreduce (restart, a new incarnation):
    the leaves see its new incarnation and take new ones, so every worker
    fails with PeerRestarted naming its leaf and both incarnations; the
    allreduce run again is exact."""
    import errno

    from homagg.errors import PeerRestarted

    W = 4
    grads = make_grads(W, 40000, density=0.3, seed=59, zero_blocks=False)
    with Cluster(workers=W, leaves=2, seed=2, timeout=0.05, slots=8) as cl:
        cl.restart_aggregator(2, after_frames=60)
        with pytest.raises(PeerRestarted) as ei:
            cl.allreduce(grads, method="dense", block_elements=BLOCK)
        assert len(ei.value.failures) == W
        for f in ei.value.failures:
            assert f.code == -errno.ECONNRESET
            leaf = "10.0.0.1" if f.worker < 2 else "10.0.1.1"
            assert (
                f"aggregator {leaf}:48879 restarted during the allreduce "
                "(incarnation 1000, now 1001)"
            ) in str(f), str(f)
        *leaves, _root = engines(cl)
        assert [e["up_root_restarts"] for e in leaves] == [1, 1]
        res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
        check_result(res, grads)


def test_leaves_stop_resending_after_the_give_up_time():
    """A dead root: each leaf resends its forwarded sets with a doubling
    timeout, then abandons them after up_give_up (counted), while its
    workers still wait."""
    W = 4
    grads = make_grads(W, 3000, density=1.0, seed=58, zero_blocks=False)
    with Cluster(
        workers=W, leaves=2, seed=4, timeout=0.06, slots=8, up_rto=1e-3, up_give_up=0.01
    ) as cl:
        cl.kill_aggregator(2)
        with pytest.raises(PeerTimeout):
            cl.allreduce(grads, method="dense", block_elements=BLOCK)
        *leaves, _root = engines(cl)
    for eng in leaves:
        # every set sent up, each abandoned once
        assert eng["up_sent"] == eng["completed"] == eng["up_abandoned"] > 0, eng
        # timers at 1, 2, 4 ms (7 ms < 10 ms <= 15 ms): 3 timer resends
        # per set, plus those the workers' retransmissions asked for
        assert eng["up_retransmissions"] >= 3 * eng["up_sent"], eng


def test_replies_to_a_leaf_only_from_its_root():
    """RESULT/STATUS frames reach a leaf from elsewhere (the fabric's
    attacker port): dropped under bad_flags, the allreduce stays exact; a
    flat job still drops every RESULT as bad_flags."""
    W = 4
    grads = make_grads(W, 5000, density=0.5, seed=57)
    with Cluster(workers=W, leaves=2, seed=5, slots=8) as cl:
        for flags in (lib_flag("RESULT"), lib_flag("STATUS")):
            cl.inject(
                cl.build_frame(
                    flags=flags,
                    payload=b"\0" * 1024 if flags == lib_flag("RESULT") else b"\xff",
                    lanes=256,
                    worker=0xFFFF,
                )
            )
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
    twice at either level; a tree and --aggregators are refused together,
    the message naming --leaves 0, with which the run is a flat job."""
    import os
    import secrets

    from helpers import require
    from homagg.runs import allreduce as runmod
    from homagg.switch.daemon import find_switch
    from homagg.deploy.local.testbed import Testbed

    require(os.geteuid() == 0, "needs root")
    try:
        find_switch()
    except runmod.RunError as e:
        require(False, str(e))
    sd = str(tmp_path / "testbeds")
    name = "tr" + secrets.token_hex(5)
    tb = Testbed.up(name, workers=3, link_mbit=1000, leaves=2, state_dir=sd)
    try:
        assert [h.name for h in tb.aggregators] == ["agg", "agg1", "agg2"]
        for method in ("dense", "lhc"):
            rep = runmod.run_allreduce(
                name,
                method,
                elements=40_000,
                density=0.05,
                workload="random",
                seed=11,
                state_dir=sd,
            )
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
        with pytest.raises(
            runmod.RunError,
            match="exclude each other: testbed .* is a tree of 2 leaves unless --leaves 0",
        ):
            runmod.run_allreduce(
                name, "dense", elements=100, density=1.0, state_dir=sd, aggregators=2
            )
        # --leaves 0: a flat job on the tree testbed's first two aggregators
        flat = runmod.run_allreduce(
            name,
            "dense",
            elements=40_000,
            density=0.05,
            workload="random",
            seed=11,
            state_dir=sd,
            aggregators=2,
            leaves=0,
        )
        assert flat["exact"] is True and flat["leaves"] == 0, flat["exact_per_worker"]
        assert [a["host"] for a in flat["aggregators"]] == ["agg", "agg1"]
    finally:
        Testbed.down(name, state_dir=sd)


def test_testbed_tree_names_a_dead_worker_under_another_leaf(tmp_path):
    """`homagg testbed up --leaves 2` of homagg-switch daemons, worker 2
    (under leaf agg1) stopped before the allreduce: worker 1 (same leaf)
    names it from its leaf's STATUS, worker 0 (under leaf agg) from the
    root's view its leaf passes down, which has agg1's leaf report
    (docs/PROTOCOL.md "Who is missing in a tree")."""
    import os
    import secrets

    from helpers import require
    from homagg.runs import allreduce as runmod
    from homagg.switch.daemon import find_switch
    from homagg.deploy.local.testbed import Testbed

    require(os.geteuid() == 0, "needs root")
    try:
        find_switch()
    except runmod.RunError as e:
        require(False, str(e))
    sd = str(tmp_path / "testbeds")
    name = "tw" + secrets.token_hex(5)
    Testbed.up(name, workers=3, link_mbit=1000, leaves=2, state_dir=sd)
    try:
        with pytest.raises(runmod.RunError) as ei:
            runmod.run_allreduce(
                name,
                "dense",
                elements=40_000,
                density=1.0,
                seed=11,
                # long enough for the STATUS chain leaf, root, leaf, worker
                # on a loaded host
                timeout=5.0,
                fail_workers=(2,),
                state_dir=sd,
            )
    finally:
        Testbed.down(name, state_dir=sd)
    text = str(ei.value)
    assert "failed on 3 of 3 workers" in text and "w2: exit -9" in text, text
    per = {
        int(m.group(1)): m.group(0)
        for m in re.finditer(r"PeerTimeout: worker (\d+) of job [^\n]*", text)
    }
    assert sorted(per) == [0, 1], text
    for t in per.values():
        assert _missing(t) == {2}, t
    assert re.search(
        r"leaf aggregator [0-9.]+:48879 reports workers 1 present, missing worker 2", per[1]
    )
    assert "missing leaf 1 (workers 1-2): its aggregator reports missing worker 2)" in per[0], per[
        0
    ]


def test_register_tree_requests_and_job_files(tmp_path):
    """register_tree: leaf l gets its workers' count, its group and the root
    as parent, the root the leaves as workers; each worker's job file names
    its leaf, the leaf's group and leaf_ids, and job_config reads them back
    (HOMAGG_LEAF_IDS overrides); a refused add_job removes the job again."""
    from homagg.errors import ConfigError
    from homagg.switch import job_file

    seen = [[] for _ in range(3)]

    def control(k, fail=False):
        def c(req):
            seen[k].append(req)
            if fail and req["cmd"] == "add_job":
                raise ConfigError("refused")
            return {}

        return c

    aggs = [
        ("10.0.0.1", 48879, "02:00:00:00:00:01"),
        ("10.0.0.2", 48879, "02:00:00:00:00:02"),
        ("10.0.0.3", 48879, "02:00:00:00:00:03"),
    ]
    files = job_file.register_tree(
        [control(k) for k in range(3)],
        aggs,
        leaves=2,
        workers=5,
        slots=8,
        payload=512,
        group="239.1.0.1",
        timeout=3.0,
        rto=0.002,
        job=77,
        token=99,
    )
    # leaf 0 serves workers 0, 1 (floor(5/2) = 2), leaf 1 workers 2, 3, 4
    leaf0, leaf1, root = (s[0] for s in seen)
    assert leaf0 == {
        "cmd": "add_job",
        "job": 77,
        "token": 99,
        "slots": 8,
        "payload": 512,
        "workers": 2,
        "group": "239.1.0.1",
        "parent": {
            "ip": "10.0.0.3",
            "mac": "02:00:00:00:00:03",
            "worker": 0,
            "rto_us": 2000,
            "base": 0,
            "leaves": 2,
        },
    }
    assert leaf1["workers"] == 3 and leaf1["group"] == "239.1.1.1"
    # its first worker's job number and L: it reports who it lacks
    assert (leaf1["parent"]["worker"], leaf1["parent"]["base"], leaf1["parent"]["leaves"]) == (
        1,
        2,
        2,
    )
    assert root == {
        "cmd": "add_job",
        "job": 77,
        "token": 99,
        "slots": 8,
        "payload": 512,
        "workers": 2,
    }
    expect = [
        ("10.0.0.1:48879", "239.1.0.1", [0, 2]),
        ("10.0.0.1:48879", "239.1.0.1", [1, 2]),
        ("10.0.0.2:48879", "239.1.1.1", [0, 3]),
        ("10.0.0.2:48879", "239.1.1.1", [1, 3]),
        ("10.0.0.2:48879", "239.1.1.1", [2, 3]),
    ]
    assert [(f["aggregator"], f["group"], f["leaf_ids"]) for f in files] == expect
    for w, f in enumerate(files):
        path = job_file.write_job_file(str(tmp_path / f"job-{w}.json"), **f)
        conf = job_file.job_config({"HOMAGG_JOB_FILE": path})
        assert conf["leaf_ids"] == tuple(expect[w][2])
        assert conf["aggregators"] == [(expect[w][0].split(":")[0], 48879)]
    flat = job_file.write_job_file(
        str(tmp_path / "flat.json"), aggregator="10.0.0.1", job=1, token=2
    )
    assert job_file.job_config({"HOMAGG_JOB_FILE": flat})["leaf_ids"] is None
    assert job_file.job_config({"HOMAGG_JOB_FILE": flat, "HOMAGG_LEAF_IDS": "1,4"})["leaf_ids"] == (
        1,
        4,
    )
    with pytest.raises(ConfigError, match="HOMAGG_LEAF_IDS"):
        job_file.job_config({"HOMAGG_JOB_FILE": flat, "HOMAGG_LEAF_IDS": "4,4"})
    # the root refuses: both leaves drop the job again
    seen = [[] for _ in range(3)]
    with pytest.raises(ConfigError, match="refused"):
        job_file.register_tree(
            [control(0), control(1), control(2, fail=True)],
            aggs,
            leaves=2,
            workers=5,
            group="239.1.0.1",
            job=78,
        )
    assert [r["cmd"] for r in seen[0]] == ["add_job", "remove_job"] == [r["cmd"] for r in seen[1]]
    assert seen[0][1]["job"] == 78


# ---- one leaf engine on the in-memory port: the root's side by hand -------


def _leaf_rig(workers=2, slots=4, rto=1e-3, give_up=1.0, replicate=False, reports=False, auth=None):
    """A leaf engine (job 5, workers 0..W-1) under a root at .99; with
    ``reports`` it is leaf 3 of 5 whose first worker is job worker 4, so it
    sends leaf reports ("Who is missing in a tree"); ``auth``: add_job's
    ``auth`` and ``mac`` and the parent's ``keys``."""
    from homagg.engine import Addr, Engine, MemPort

    root = Addr.of(bytes([2, 0, 0, 0, 9, 9]), (10 << 24) | 99, 48879)
    port = MemPort(can_replicate=replicate)
    port.set_time(1_000_000)
    eng = Engine(port)
    eng.add_job(
        job=5,
        token=55,
        workers=workers,
        slots=slots,
        incarnation=7,
        group="239.1.0.9" if replicate else 0,
        parent={"addr": root, "worker": 3, "shard": 2, "rto": rto, "give_up": give_up}
        | ({"base": 4, "leaves": 5} if reports else {})
        | ({"keys": auth["keys"]} if auth else {}),
        **({"auth": auth["auth"], "mac": auth["mac"]} if auth else {}),
    )
    return port, eng, root


def _leaf_send(port, eng, *frames):
    from homagg.engine import parse_frame

    for f in frames:
        port.inject(f)
    eng.poll_all()
    return [parse_frame(f) for f in port.pop_all()]


def _worker_frame(port, w, seq, op, payload, flags=0, exp=0, slots=4):
    from homagg.engine import FLAG_SHADOW, Addr, build_frame

    src = Addr.of(bytes([2, 0, 0, 1, 0, w]), (10 << 24) | (1 << 16) | (w + 1), 40000 + w)
    if (seq // slots) % 2:
        flags |= FLAG_SHADOW
    return build_frame(
        src,
        port.addr,
        op=op,
        job=5,
        token=55,
        worker=w,
        seq=seq,
        slot=seq % slots,
        flags=flags,
        payload=payload,
        exp=exp,
        incarnation=1,
    )


def _root_frame(port, root, seq, payload, flags, slots=4, **kw):
    from homagg.engine import FLAG_SHADOW, build_frame

    if (seq // slots) % 2:
        flags |= FLAG_SHADOW
    fields = dict(
        op="sum32",
        job=5,
        token=55,
        worker=3,
        seq=seq,
        slot=seq % slots,
        shard=2,
        incarnation=11,
        lanes=len(payload) // 4,
    )
    fields.update(kw)
    return build_frame(root, port.addr, flags=flags, payload=payload, **fields)


@pytest.mark.parametrize("mac", ("umac", "aes-gmac", "blake2b"))
def test_leaf_engine_takes_the_roots_next_keys(mac):
    """docs/PROTOCOL.md "Key epochs in a tree", at an authenticated leaf
    (leaf 3 under a root, job 5): its frames up carry upward epoch 0 and
    the MAC of its key of root secret R0 (checked by an independent
    implementation: hashlib, ``cryptography``, numpy UMAC); given its keys
    of R1 it still sends in epoch 0 and verifies root replies of epochs 0
    and 1; the first root reply of epoch 1 switches it: its next frame up
    carries epoch 1, MAC counter 1 and the MAC of its key of R1; a root
    reply of epoch 0 in flight is still taken, one of epoch 2 or MACed
    with the wrong epoch's key is bad_mac and relays nothing."""
    from auth_rig import ref_key, ref_mac
    from homagg import auth
    from homagg.engine import FLAG_RESULT, FLAG_SHADOW, Addr, build_frame, parse_frame

    alg = auth.mac_code(mac)
    if mac != "blake2b":
        require_gmac(auth.mac_available(alg))
    leaf_secret, r0, r1 = bytes([7]) * 32, bytes([8]) * 32, bytes([9]) * 32
    port, eng, root = _leaf_rig(
        auth={
            "auth": leaf_secret,
            "mac": mac,
            "keys": (ref_key(r0, 3, job=5), ref_key(r0, auth.AGGREGATOR, job=5)),
        }
    )
    pay = np.ones(16, dtype=">i4").tobytes()
    ctr = {0: 0, 1: 0}

    def workers_send(seq):
        for w in range(2):
            ctr[w] += 1
            src = Addr.of(bytes([2, 0, 0, 1, 0, w]), (10 << 24) | (1 << 16) | (w + 1), 40000 + w)
            f = build_frame(
                src,
                port.addr,
                op="sum32",
                job=5,
                token=55,
                worker=w,
                seq=seq,
                slot=seq % 4,
                flags=FLAG_SHADOW if (seq // 4) % 2 else 0,
                payload=pay,
                incarnation=1,
                key=ref_key(leaf_secret, w, job=5),
                alg=alg,
                counter=ctr[w],
            )
            port.inject(f)
        eng.poll_all()
        return port.pop_all()

    def root_result(seq, epoch, secret, counter):
        flags = FLAG_RESULT | epoch << 8 | (FLAG_SHADOW if (seq // 4) % 2 else 0)
        port.inject(
            build_frame(
                root,
                port.addr,
                op="sum32",
                job=5,
                token=55,
                worker=3,
                seq=seq,
                slot=seq % 4,
                shard=2,
                incarnation=11,
                lanes=16,
                flags=flags,
                payload=pay,
                key=ref_key(secret, auth.AGGREGATOR, job=5),
                alg=alg,
                counter=counter,
                direction=1,  # a reply
            )
        )
        eng.poll_all()
        return [parse_frame(f) for f in port.pop_all()]

    def check_up(raw, epoch, secret, counter):
        assert len(raw) == 1
        v = parse_frame(raw[0])
        assert v.dst.ipv4 == root.ipv4 and v.flags >> 8 == epoch
        data = raw[0][42 : 42 + 32 + len(v.payload)]
        assert data[28:32] == counter.to_bytes(4, "big")
        assert v.mac == ref_mac(ref_key(secret, 3, job=5), data, alg, direction=0)
        assert v.mac != ref_mac(ref_key(r0 if secret == r1 else r1, 3, job=5), data, alg, 0)

    check_up(workers_send(0), 0, r0, 1)
    assert eng.rotate_up_key(5, ref_key(r1, 3, job=5), ref_key(r1, auth.AGGREGATOR, job=5)) == 1
    assert len(root_result(0, 0, r0, 1)) == 2  # epoch 0: relayed to both workers
    check_up(workers_send(1), 0, r0, 2)  # not switched yet
    assert len(root_result(1, 1, r1, 1)) == 2  # epoch 1 verified: switched
    check_up(workers_send(2), 1, r1, 1)
    check_up(workers_send(3), 1, r1, 2)
    assert len(root_result(2, 0, r0, 2)) == 2  # an old-epoch reply in flight
    bad = eng.counters()["bad_mac"]
    assert root_result(3, 2, r1, 2) == []  # an epoch the leaf has no key of
    assert root_result(3, 1, r0, 2) == []  # epoch 1 made with epoch 0's key
    assert eng.counters()["bad_mac"] - bad == 2
    assert len(root_result(3, 1, r1, 2)) == 2
    c = eng.counters()
    assert (c["summed"], c["completed"], c["up_sent"], c["up_results"]) == (8, 4, 4, 4)


def test_leaf_engine_forwards_nc8_as_sum32_and_relays_the_root_result():
    """Two NC8 requests complete the leaf's set: one SUM32 request goes up
    (worker 3, the root's shard, exp 0, the int32 partial sum); malformed
    root replies are dropped under their reasons, a late one is up_stale;
    the root's RESULT reaches the workers as the NC8 result of the leaf's
    own job (its op, exp, shard 0, its incarnation)."""
    from homagg import kernels
    from homagg.engine import FLAG_LOSS, FLAG_RESULT, FLAG_RETRANS, FLAG_STATUS

    port, eng, root = _leaf_rig()
    rng = np.random.default_rng(3)
    codes = [rng.integers(0, 256, 64).astype(np.uint8) for _ in range(2)]
    top = 9
    out = _leaf_send(
        port,
        eng,
        *(_worker_frame(port, w, 6, "nc8", codes[w].tobytes(), exp=top) for w in range(2)),
    )
    assert len(out) == 1
    up = out[0]
    acc = kernels.identity("nc8", 64)
    for c in codes:
        kernels.aggregate("nc8", acc, c, top=top, isa="portable")
    assert (up.op, up.worker, up.shard, up.exp, up.seq, up.slot, up.lanes) == (
        OPS["sum32"].code,
        3,
        2,
        0,
        6,
        2,
        64,
    )
    assert up.dst.ipv4 == root.ipv4 and up.dst.mac == root.mac and up.dst.port == root.port
    assert up.incarnation == 7 and not up.flags & FLAG_RETRANS
    assert up.payload == acc.tobytes()

    result = np.arange(64, dtype=">i4").tobytes()  # whatever the root summed
    bad = [
        (dict(token=56), "bad_token"),
        (dict(shard=0), "bad_shard"),
        (dict(worker=1), "bad_worker"),
        (dict(slot=3), "bad_slot"),
        (dict(exp=1), "bad_exp"),
    ]
    for fields, reason in bad:
        before = eng.counters()[reason]
        assert (
            _leaf_send(port, eng, _root_frame(port, root, 6, result, FLAG_RESULT, **fields)) == []
        )
        assert eng.counters()[reason] == before + 1, reason
    # not from the root: a worker's address
    from homagg.engine import Addr

    other = Addr.of(bytes([2, 0, 0, 1, 0, 0]), (10 << 24) | (1 << 16) | 1, 40000)
    assert _leaf_send(port, eng, _root_frame(port, other, 6, result, FLAG_RESULT)) == []
    assert eng.counters()["bad_flags"] == 1
    # a result for another seq of the set's slot: not the forwarded one
    assert _leaf_send(port, eng, _root_frame(port, root, 2, result, FLAG_RESULT)) == []
    assert eng.counters()["up_stale"] == 1
    # a STATUS that has this leaf (bit 3): counted, nothing resent
    assert (
        _leaf_send(port, eng, _root_frame(port, root, 6, bytes([0b1000]), FLAG_STATUS, lanes=64))
        == []
    )
    # one without it: the copy may still be on its way, nothing is sent
    lacking = bytes([0b0001])
    assert _leaf_send(port, eng, _root_frame(port, root, 6, lacking, FLAG_STATUS, lanes=64)) == []
    # a loss report naming it: the partial sum goes up again at once
    again = _leaf_send(
        port, eng, _root_frame(port, root, 6, lacking, FLAG_STATUS | FLAG_LOSS, lanes=64)
    )
    assert len(again) == 1 and again[0].flags & FLAG_RETRANS and again[0].payload == up.payload
    assert eng.counters()["up_status"] == 3

    down = _leaf_send(port, eng, _root_frame(port, root, 6, result, FLAG_RESULT, worker=0xFFFF))
    assert len(down) == 2  # unicast to both workers (the port does not replicate)
    for f, w in zip(down, (0, 1)):
        assert f.flags & FLAG_RESULT and f.worker == w
        assert (f.op, f.exp, f.shard, f.incarnation, f.lanes) == (OPS["nc8"].code, top, 0, 7, 64)
        assert f.payload == result
    c = eng.counters()
    assert (c["up_sent"], c["up_retransmissions"], c["up_results"], c["completed"]) == (1, 1, 1, 1)
    assert c["summed"] == 2
    # a second copy of the root's result is late; a worker's retransmission
    # of the done set is a replay of the root's result
    assert _leaf_send(port, eng, _root_frame(port, root, 6, result, FLAG_RESULT)) == []
    assert eng.counters()["up_stale"] == 2
    replay = _leaf_send(
        port, eng, _worker_frame(port, 1, 6, "nc8", codes[1].tobytes(), flags=FLAG_RETRANS, exp=top)
    )
    assert len(replay) == 1 and replay[0].worker == 1 and replay[0].payload == result


def test_a_root_loss_report_naming_another_leaf_is_taken_and_left():
    """The root sends its loss reports to its group, so each leaf also
    gets the reports naming the others (docs/PROTOCOL.md "Loss reports"):
    such a report is counted under up_status and sends nothing, even when
    its bitmap lacks this leaf; one naming this leaf sends the partial sum
    up again at once.  A root reply naming another leaf that is no loss
    report, or naming no leaf of the root (id >= L), is bad_worker."""
    from homagg.engine import FLAG_LOSS, FLAG_RETRANS, FLAG_STATUS

    port, eng, root = _leaf_rig(reports=True)  # leaf 3 of 5
    pay = np.ones(16, dtype=">i4").tobytes()
    (up,) = _leaf_send(port, eng, *(_worker_frame(port, w, 6, "sum32", pay) for w in range(2)))
    lacking = bytes([0b00010])  # leaf 1 in, this leaf (3) not
    loss = FLAG_STATUS | FLAG_LOSS

    def report(flags=loss, **kw):
        return _root_frame(port, root, 6, lacking, flags, lanes=16, **kw)

    def counts():
        c = eng.counters()
        return c["up_status"], c["bad_worker"], c["up_retransmissions"]

    assert counts() == (0, 0, 0)
    for other in (0, 2, 4):
        assert _leaf_send(port, eng, report(worker=other)) == []
    assert counts() == (3, 0, 0)
    for fields in (dict(worker=5), dict(worker=7)):  # no leaf of the root's 5
        assert _leaf_send(port, eng, report(**fields)) == []
    assert _leaf_send(port, eng, report(FLAG_STATUS, worker=2)) == []
    assert counts() == (3, 3, 0)
    (again,) = _leaf_send(port, eng, report(worker=3))
    assert again.flags & FLAG_RETRANS and again.payload == up.payload
    assert counts() == (4, 3, 1)


def test_leaf_engine_timers_and_worker_retransmissions():
    """The upward timer doubles per expiry; a worker's retransmission of a
    forwarded set gets a STATUS with every bit and, past half the timeout
    since the last send, one more upward copy (not summed again); after
    the give-up time the set is abandoned once."""
    from homagg.engine import FLAG_RETRANS, FLAG_STATUS

    port, eng, root = _leaf_rig(rto=1e-3, give_up=10e-3)
    t0 = 1_000_000
    pay = np.ones(16, dtype=">i4").tobytes()
    out = _leaf_send(port, eng, *(_worker_frame(port, w, 0, "sum32", pay) for w in range(2)))
    assert len(out) == 1 and eng.next_deadline == t0 + 1_000_000
    sent = [t0]
    for dt in (1, 2, 4):  # expiries at +1, +3, +7 ms
        t = sent[-1] + dt * 1_000_000
        port.set_time(t - 1)
        assert eng.timers() == 0 and port.pop_all() == []
        port.set_time(t)
        assert eng.timers() == 1
        f = [_parse(x) for x in port.pop_all()]
        assert len(f) == 1 and f[0].flags & FLAG_RETRANS
        assert f[0].payload == np.full(16, 2, dtype=">i4").tobytes()
        sent.append(t)
    # a worker retransmits 0.3 ms after the last upward copy: STATUS only
    port.set_time(sent[-1] + 300_000)
    out = _leaf_send(port, eng, _worker_frame(port, 0, 0, "sum32", pay, flags=FLAG_RETRANS))
    assert len(out) == 1 and out[0].flags & FLAG_STATUS and out[0].worker == 0
    assert out[0].payload == bytes([0b11, 0])  # worker bitmap, active bitmap
    # 0.6 ms after it: STATUS and one upward copy, the timer doubling kept
    port.set_time(sent[-1] + 600_000)
    out = _leaf_send(port, eng, _worker_frame(port, 1, 0, "sum32", pay, flags=FLAG_RETRANS))
    assert sorted(bool(f.flags & FLAG_STATUS) for f in out) == [False, True]
    # re-armed 8 ms (2^3 x 1 ms) from then; the engine wakes at the old
    # due time first (an early bound), resends nothing, and learns it
    port.set_time(sent[-1] + 8_000_000)
    assert eng.timers() == 0 and port.pop_all() == []
    assert eng.next_deadline == sent[-1] + 600_000 + 8_000_000
    c = eng.counters()
    assert c["summed"] == 2 and c["duplicates"] == 2 and c["up_retransmissions"] == 4
    assert _causes(c) == (3, 0, 0, 1)  # three expiries, one worker's resend
    # the give-up time (10 ms after the first send) passes: abandoned once
    port.set_time(t0 + 20_000_000)
    assert eng.timers() == 0 and port.pop_all() == []
    assert eng.counters()["up_abandoned"] == 1 and eng.next_deadline is None
    out = _leaf_send(port, eng, _worker_frame(port, 0, 0, "sum32", pay, flags=FLAG_RETRANS))
    assert len(out) == 1 and out[0].flags & FLAG_STATUS  # no more upward copies
    assert eng.counters()["up_abandoned"] == 1


def test_leaf_upward_timeout_follows_the_round_trip_to_the_root():
    """docs/PROTOCOL.md "Repairs in a tree", the upward timeout: a root
    that answers in 1.7 ms, above the 1 ms up_rto.  The first set's timer
    expires (a resend); the timeout of the sets sent after it doubles
    until a set sent once is answered; that answer is a round-trip sample
    (a resent set gives none, Karn's rule), and from then on the timeout
    is USRTT + 4 URTTVAR."""
    from homagg.engine import FLAG_RESULT, FLAG_RETRANS

    port, eng, root = _leaf_rig(rto=1e-3, give_up=1.0)
    pay = np.ones(16, dtype=">i4").tobytes()
    result = np.full(16, 2, dtype=">i4").tobytes()
    t0 = 1_000_000

    def complete(seq, at):
        port.set_time(at)
        out = _leaf_send(port, eng, *(_worker_frame(port, w, seq, "sum32", pay) for w in range(2)))
        assert len(out) == 1 and out[0].seq == seq and not out[0].flags & FLAG_RETRANS

    def root_result(seq, at):
        port.set_time(at)
        return _leaf_send(port, eng, _root_frame(port, root, seq, result, FLAG_RESULT))

    complete(0, t0)
    assert eng.next_deadline == t0 + 1_000_000
    port.set_time(t0 + 1_000_000)
    assert eng.timers() == 1  # the root has not answered within 1 ms
    port.pop_all()
    complete(1, t0 + 1_500_000)  # under the doubled timeout: 2 ms
    assert eng.next_deadline == t0 + 3_000_000  # set 0's second expiry (2 ms)
    root_result(0, t0 + 2_800_000)  # set 0 was sent twice: no sample
    port.set_time(t0 + 3_000_000)  # the engine wakes at the old due time
    assert eng.timers() == 0
    assert eng.next_deadline == t0 + 3_500_000  # set 1: 1.5 + 2 ms
    root_result(1, t0 + 3_200_000)  # set 1 sent once: a 1.7 ms sample
    complete(2, t0 + 4_000_000)
    # USRTT 1.7 ms, URTTVAR 0.85 ms: 5.1 ms, the doubling ended
    assert eng.next_deadline == t0 + 4_000_000 + 5_100_000
    assert eng.counters()["up_retransmissions"] == 1
    assert _causes(eng.counters()) == (1, 0, 0, 0)  # the timer's


def test_leaf_waits_out_the_holdoff_on_a_root_status_that_lacks_it():
    """docs/PROTOCOL.md "Repairs in a tree", a root STATUS that lacks the
    leaf: before any answer-time sample a worker's first ask sends the set
    up again at once; the root's answer to that resend (a STATUS showing
    the leaf present, 20 us later) is a sample, so the hold-off is 20 + 4 x
    10 = 60 us.  Then a loss report naming the leaf 10 us after a send puts
    the resend off to the end of the hold-off, where the timer sends it
    without doubling; one followed by a STATUS showing the leaf present is
    dropped, and the set's timer is the upward timeout from its send
    again."""
    from homagg.engine import FLAG_LOSS, FLAG_RESULT, FLAG_RETRANS, FLAG_STATUS

    port, eng, root = _leaf_rig(rto=1e-3, give_up=1.0)
    pay = np.ones(16, dtype=">i4").tobytes()
    lacking = _bits([0, 1], 1) + bytes(1)  # leaves 0 and 1 in, not 3
    present = _bits([0, 1, 3], 1) + bytes(1)

    def complete(seq, at):
        port.set_time(at)
        out = _leaf_send(port, eng, *(_worker_frame(port, w, seq, "sum32", pay) for w in range(2)))
        assert len(out) == 1 and out[0].seq == seq and not out[0].flags & FLAG_RETRANS

    def status(seq, bits, at, flags=FLAG_STATUS | FLAG_LOSS):
        port.set_time(at)
        return _leaf_send(port, eng, _root_frame(port, root, seq, bits, flags, lanes=16))

    t0 = 1_000_000
    complete(0, t0)
    port.set_time(t0 + 10_000)  # no sample yet: a worker's first ask, at once
    out = _leaf_send(port, eng, _worker_frame(port, 0, 0, "sum32", pay, flags=FLAG_RETRANS))
    up = [f for f in out if f.dst.ipv4 == root.ipv4]
    assert len(up) == 1 and up[0].flags & FLAG_RETRANS and up[0].seq == 0
    assert status(0, present, t0 + 30_000, FLAG_STATUS) == []  # a 20 us answer
    assert eng.counters()["up_retransmissions"] == 1
    port.set_time(t0 + 40_000)  # set 0 done: its timer is out of the way
    result = np.full(16, 2, dtype=">i4").tobytes()
    assert len(_leaf_send(port, eng, _root_frame(port, root, 0, result, FLAG_RESULT))) == 2

    t1 = t0 + 100_000
    complete(1, t1)
    assert status(1, lacking, t1 + 10_000) == []  # within 60 us: put off
    assert eng.next_deadline == t1 + 60_000
    port.set_time(t1 + 59_999)
    assert eng.timers() == 0 and port.pop_all() == []
    port.set_time(t1 + 60_000)
    assert eng.timers() == 1
    out = [_parse(f) for f in port.pop_all()]
    assert len(out) == 1 and out[0].flags & FLAG_RETRANS and out[0].seq == 1
    assert eng.counters()["up_retransmissions"] == 2
    # asked for, not an expiry: the next timeout is 1 ms, not doubled
    assert eng.next_deadline == t1 + 60_000 + 1_000_000

    t2 = t1 + 200_000
    complete(2, t2)
    assert status(2, lacking, t2 + 10_000) == []
    assert status(2, present, t2 + 20_000, FLAG_STATUS) == []  # in at the root after all
    port.set_time(t2 + 60_000)
    assert eng.timers() == 0 and port.pop_all() == []
    assert eng.counters()["up_retransmissions"] == 2
    # a loss report naming it after the hold-off: at once
    out = status(2, lacking, t2 + 70_000)
    assert len(out) == 1 and out[0].flags & FLAG_RETRANS and out[0].seq == 2
    assert eng.counters()["up_retransmissions"] == 3
    # a worker's first ask, then two loss reports: at once, put off, at once
    assert _causes(eng.counters()) == (0, 0, 2, 1)


def test_leaf_acts_on_a_root_status_that_lacks_it_only_when_it_tells_of_a_loss():
    """docs/PROTOCOL.md "Repairs in a tree": a root STATUS lacking the leaf
    that is no loss report naming it may answer another leaf while the
    leaf's copy is still queued before the root: nothing is sent.  It
    tells of a loss once the root has answered a set first sent after the
    set's latest copy (the root made the STATUS after it had that later
    copy, so the earlier one was lost), or when the set already went up
    more than once.  Before any answer-time sample, such a STATUS resends
    at once."""
    from homagg.engine import FLAG_RESULT, FLAG_RETRANS, FLAG_STATUS

    port, eng, root = _leaf_rig(rto=1.0, give_up=10.0)
    pay = np.ones(16, dtype=">i4").tobytes()
    result = np.full(16, 2, dtype=">i4").tobytes()
    lacking = _bits([0, 1], 1) + bytes(1)  # leaves 0 and 1 in, not 3
    present = _bits([0, 1, 3], 1) + bytes(1)

    def complete(seq):
        out = _leaf_send(port, eng, *(_worker_frame(port, w, seq, "sum32", pay) for w in range(2)))
        assert len(out) == 1 and out[0].seq == seq and not out[0].flags & FLAG_RETRANS

    def reply(seq, payload, flags):
        out = _leaf_send(port, eng, _root_frame(port, root, seq, payload, flags, lanes=16))
        return [f for f in out if f.dst.ipv4 == root.ipv4]

    for seq in range(4):
        complete(seq)
    assert reply(0, lacking, FLAG_STATUS) == []  # set 0's copy may be on its way
    assert reply(1, lacking, FLAG_STATUS) == []
    # the root shows set 2 present: it had set 2's copy, sent after sets 0, 1
    assert reply(2, present, FLAG_STATUS) == []
    (up,) = reply(0, lacking, FLAG_STATUS)  # so set 0's copy was lost
    assert up.seq == 0 and up.flags & FLAG_RETRANS
    # set 0 went up twice now: a STATUS lacking it acts (before any
    # answer-time sample, at once)
    (up,) = reply(0, lacking, FLAG_STATUS)
    assert up.seq == 0 and up.flags & FLAG_RETRANS
    assert reply(3, lacking, FLAG_STATUS) == []  # set 3 went up after set 2
    # the root's RESULT of set 3: set 1's copy, sent before it, was lost
    assert len(reply(3, result, FLAG_RESULT)) == 0
    (up,) = reply(1, lacking, FLAG_STATUS)
    assert up.seq == 1 and up.flags & FLAG_RETRANS
    c = eng.counters()
    assert (c["up_sent"], c["up_retransmissions"], c["up_status"]) == (4, 3, 7)
    assert _causes(c) == (0, 0, 3, 0)


def test_leaf_takes_a_workers_first_ask_at_once_before_it_knows_the_root():
    """docs/PROTOCOL.md "Repairs in a tree", the hold-off: before the leaf
    has measured the root's answer time, a worker's retransmission of a
    set sent up once sends it up again at once (a lost first copy would
    otherwise hold every worker for up_rto_ns / 2); a second worker's ask
    of the same set, now sent twice, waits out up_rto_ns / 2 (0.5 ms)."""
    from homagg.engine import FLAG_RETRANS, FLAG_STATUS

    port, eng, root = _leaf_rig(rto=1e-3, give_up=1.0)
    pay = np.ones(16, dtype=">i4").tobytes()
    t0 = 1_000_000
    (first,) = _leaf_send(port, eng, *(_worker_frame(port, w, 0, "sum32", pay) for w in range(2)))

    def ask(w, at):
        port.set_time(at)
        out = _leaf_send(port, eng, _worker_frame(port, w, 0, "sum32", pay, flags=FLAG_RETRANS))
        st = [f for f in out if f.flags & FLAG_STATUS]
        assert len(st) == 1 and st[0].worker == w
        return [f for f in out if f.dst.ipv4 == root.ipv4]

    (up,) = ask(0, t0 + 30_000)
    assert up.flags & FLAG_RETRANS and up.payload == first.payload
    assert ask(1, t0 + 40_000) == []  # sent twice: held off
    assert ask(1, t0 + 30_000 + 499_999) == []
    (up,) = ask(1, t0 + 30_000 + 500_000)
    assert up.flags & FLAG_RETRANS and up.payload == first.payload
    c = eng.counters()
    assert (c["up_sent"], c["up_retransmissions"], c["summed"]) == (1, 2, 2)
    assert _causes(c) == (0, 0, 0, 2)


def _causes(c):
    """A leaf's up_retransmissions by cause: timer, overtaken, lacking, worker."""
    return tuple(c[f"up_resent_{k}"] for k in ("timer", "overtaken", "lacking", "worker"))


def _parse(f):
    from homagg.engine import parse_frame

    return parse_frame(f)


@pytest.mark.root
@pytest.mark.netns
@pytest.mark.dpdk
@pytest.mark.timeout(400)
def test_testbed_tree_with_auth_exact_under_loss_and_bad_mac_at_the_root(tmp_path):
    """A DPDK testbed tree with authentication (`homagg run allreduce
    --leaves 2 --auth`): each leaf its own secret, the root the job's, of
    which each leaf gets its key at the root and the root's aggregator key
    (add_job's parent.key / parent.reply_key); every daemon's port drops 3 %
    of what it receives (seeded), so both hops lose frames and repair them:
    bit-exact against the numpy reference, nothing summed twice, no bad_mac
    anywhere.  Then, on a root daemon holding an authenticated job, a frame
    MACed with a key of another secret is counted as bad_mac and summed
    nowhere, and one MACed with the leaf's key is summed."""
    import os
    import secrets
    import socket
    import tempfile
    import threading

    from helpers import require
    from homagg import auth
    from homagg.deploy.local.placement import TestbedPlacement
    from homagg.deploy.local.testbed import Testbed
    from homagg.engine import Addr, build_frame
    from homagg.runs import allreduce as runmod
    from homagg.runs import job as localrun
    from homagg.switch.daemon import Switch, find_switch
    from switch_helpers import wait_for

    require(os.geteuid() == 0, "needs root")
    try:
        find_switch()
    except runmod.RunError as e:
        require(False, str(e))
    sd = str(tmp_path / "testbeds")
    name = "ta" + secrets.token_hex(5)
    tb = Testbed.up(name, workers=3, link_mbit=1000, leaves=2, state_dir=sd)
    try:
        n, density, seed = 40_000, 0.05, 13
        pl = TestbedPlacement(name, sd, runs_dir=str(tmp_path / "runs"), label="lhc")
        rep = runmod.run_allreduce(
            pl,
            "lhc",
            elements=n,
            density=density,
            workload="random",
            seed=seed,
            auth=True,
            drop_rate=0.03,
            timeout=30,
            rto=0.02,
        )
        assert rep["auth"] is True and rep["leaves"] == 2
        assert rep["exact"] is True, rep["exact_per_worker"]
        # the run's check, and here once more against the numpy reference
        grads = [localrun.gradient(n, density, "random", seed, w) for w in range(3)]
        ref = localrun.reference(grads, localrun.DEFAULT_BLOCK).view(np.uint32)
        for w in range(3):
            got = np.load(os.path.join(rep["run_dir"], f"result-{w}.npy")).view(np.uint32)
            assert np.array_equal(got, ref), w
        leaves = [a["counters"] for a in rep["aggregators"][:2]]
        root = rep["aggregators"][2]["counters"]
        for c, w in zip(leaves, (1, 2)):
            assert c["completed"] > 0 and c["bad_mac"] == 0, c
            assert c["summed"] == w * c["completed"], c
            assert c["up_results"] == c["completed"] == root["completed"], c
        assert root["bad_mac"] == 0 and root["summed"] == 2 * root["completed"], root
        assert sum(a["port_counters"].get("drop_injected", 0) for a in rep["aggregators"]) > 0, [
            a["port_counters"] for a in rep["aggregators"]
        ]
        assert all(ws["bad_mac"] == 0 for ws in rep["worker_stats"])

        # a root holding an authenticated tree job: one forged, one genuine leaf frame
        work = tempfile.mkdtemp(prefix="hgta-")
        sw = Switch(tb, work, host="agg2")
        try:
            job, token, root_secret = 77, 0x7A7A, auth.new_secret()
            with sw.client() as c:
                c.add_job(job=job, token=token, workers=2, slots=4, auth=root_secret)
                before = c.stats()["stats"]
            nowhere = Addr.of(bytes(6), 0, 0)
            lanes = np.arange(8, dtype=">i4").tobytes()

            def frame(key, seq):
                return build_frame(
                    nowhere,
                    nowhere,
                    op="sum32",
                    job=job,
                    token=token,
                    worker=0,
                    seq=seq,
                    slot=seq,
                    payload=lanes,
                    key=key,
                    incarnation=9,
                )[42:]  # the UDP payload

            forged = frame(auth.derive_key(auth.new_secret(), job, 0), 0)
            genuine = frame(auth.derive_key(root_secret, job, 0), 1)
            err = []

            def send():
                from pyroute2.netns import setns

                try:
                    setns(tb.host("w0").netns, flags=0)  # this thread only
                    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                        for f in (forged, genuine):
                            s.sendto(f, (tb.host("agg2").ip, localrun.UDP_PORT))
                except Exception as exc:  # noqa: BLE001 - reported below
                    err.append(exc)

            t = threading.Thread(target=send, daemon=True)
            t.start()
            t.join(30)
            assert not t.is_alive() and not err, err

            def stats():
                with sw.client() as c:
                    return c.stats()["stats"]

            after = wait_for(
                lambda: (lambda s: s["summed"] > before["summed"] and s)(stats()),
                20,
                "the root to sum the genuine leaf frame",
            )
            assert after["bad_mac"] - before["bad_mac"] == 1
            assert after["summed"] - before["summed"] == 1
        finally:
            sw.stop()
    finally:
        Testbed.down(name, state_dir=sd)


@pytest.mark.root
@pytest.mark.netns
@pytest.mark.dpdk
@pytest.mark.timeout(400)
def test_testbed_tree_key_rotation_while_workers_run(tmp_path):
    """A running authenticated tree on DPDK daemons (testbed: 3 workers, 2
    leaves, a root) takes a key rotation at every level between two
    allreduces of its running workers (``job_file.rotate_tree``: every leaf
    the root's next keys, the root, then each leaf's own secret; the
    workers got their leaf's next secret first): no allreduce fails, every
    result is bit-exact against the numpy reference, no frame is bad_mac
    at any level, the later allreduces run in the new epochs (the leaves'
    upward frames too: they run after the root's grace period), and no
    secret reaches a daemon's output.  A root's keys given to a job that
    is no tree leaf are refused naming it.  (The workers wait while the
    keys change, so that no retransmission can meet a key not yet
    registered: whether one does would depend on scheduling.)"""
    import os
    import secrets
    import threading
    import time

    from pyroute2.netns import setns

    from helpers import require
    from homagg import auth
    from homagg.deploy.local.testbed import Testbed
    from homagg.errors import HomAggError
    from homagg.runs import allreduce as runmod
    from homagg.runs import job as localrun
    from homagg.switch import job_file
    from homagg.switch.daemon import Switch, find_switch
    from homagg.worker import Worker

    require(os.geteuid() == 0, "needs root")
    try:
        find_switch()
    except runmod.RunError as e:
        require(False, str(e))
    W, L, rounds, grace = 3, 2, 5, 3.0
    sd = str(tmp_path / "testbeds")
    name = "tr" + secrets.token_hex(5)
    tb = Testbed.up(name, workers=W, link_mbit=1000, leaves=L, state_dir=sd)
    sws = []
    try:
        aggs = tb.aggregators  # the L leaves, then the root
        for a in aggs:
            sws.append(Switch(tb, str(tmp_path), host=a.name, frames=W * 8))
        root0, root1 = auth.new_secret(), auth.new_secret()
        leaf0 = [auth.new_secret() for _ in range(L)]
        leaf1 = [auth.new_secret() for _ in range(L)]
        old_files = [str(tmp_path / f"leaf{k}-e0.secret") for k in range(L)]
        new_files = [str(tmp_path / f"leaf{k}-e1.secret") for k in range(L)]
        for k in range(L):
            auth.create_secret_file(old_files[k], leaf0[k])
            auth.create_secret_file(new_files[k], leaf1[k])
        group = "239.77.0.1"
        fields = job_file.register_tree(
            [s.control for s in sws],
            [(a.ip, localrun.UDP_PORT, a.mac) for a in aggs],
            leaves=L,
            workers=W,
            slots=8,
            group=group,
            rto=0.02,
            auth=root0,
            leaf_auth=leaf0,
            auth_files=[old_files[tree_leaf_of(w, W, L)] for w in range(W)],
            mac="blake2b",
        )
        job = fields[0]["job"]
        n = 30_000
        grads = [localrun.gradient(n, 0.05, "random", 17, w) for w in range(W)]
        ref = localrun.reference(grads, localrun.DEFAULT_BLOCK)
        before = [s.control({"cmd": "stats"})["stats"] for s in sws]
        rotating = threading.Barrier(W + 1, timeout=120)
        rotated = threading.Barrier(W + 1, timeout=120)
        results = [[] for _ in range(W)]
        errors = [None] * W

        def work(w):
            f, leaf = fields[w], tree_leaf_of(w, W, L)
            try:
                setns(tb.workers[w].netns, flags=0)  # this thread only
                with Worker(
                    job=job,
                    token=f["token"],
                    worker=w,
                    workers=W,
                    aggregator=(aggs[leaf].ip, localrun.UDP_PORT),
                    group=f["group"],
                    bind=(tb.workers[w].ip, 0),
                    timeout=30.0,
                    slots=8,
                    rto=0.02,
                    auth_file=f["auth_file"],
                    mac="blake2b",
                    leaf_ids=f["leaf_ids"],
                ) as wk:
                    for r in range(rounds):
                        if r == 2:  # past the root's grace period
                            time.sleep(grace + 0.5)
                        results[w].append(
                            wk.allreduce(grads[w], method="lhc", block=localrun.DEFAULT_BLOCK)
                        )
                        if r == 0:
                            wk.rotate_key(new_files[leaf], 1)
                            rotating.wait()
                            rotated.wait()
            except Exception as exc:  # noqa: BLE001 - reported below
                errors[w] = exc
                rotating.abort()
                rotated.abort()

        threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in range(W)]
        for t in threads:
            t.start()
        try:
            rotating.wait()
        except threading.BrokenBarrierError:
            pass
        else:
            try:
                epoch = job_file.rotate_tree(
                    [s.control for s in sws],
                    leaves=L,
                    job=job,
                    auth=root1,
                    leaf_auth=leaf1,
                    grace=grace,
                )
            finally:
                rotated.wait()
            assert epoch == 1
        for t in threads:
            t.join(240)
        assert not any(t.is_alive() for t in threads)
        assert errors == [None] * W, errors
        want = ref.view(np.uint32)
        for per_worker in results:
            assert len(per_worker) == rounds
            for y in per_worker:
                assert np.array_equal(y.view(np.uint32), want)
        after = [s.control({"cmd": "stats"})["stats"] for s in sws]
        for b, a in zip(before, after):
            assert a["bad_mac"] == b["bad_mac"], (b, a)
            assert a["completed"] > b["completed"]
        # a root's next keys for a job that is no leaf: refused, naming it
        with sws[L].client() as c, pytest.raises(HomAggError, match="no authenticated tree leaf"):
            c.rotate_up_key(job, bytes(32), bytes(32))
        for s in sws:
            with open(s.logpath, errors="replace") as f:
                log = f.read()
            for x in (root0, root1, *leaf0, *leaf1):
                assert x.hex() not in log
    finally:
        for s in sws:
            s.stop()
        Testbed.down(name, state_dir=sd)


def tree_leaf_of(w, workers, leaves):
    """The leaf of worker w (register_tree's split)."""
    from homagg.switch.job_file import tree_leaf

    return tree_leaf(w, workers, leaves)[0]


def test_register_tree_with_auth_gives_each_level_its_own_secret():
    """register_tree(auth=...): the root gets the job's secret, each leaf a
    secret of its own and, for its link up, its key at the root and the
    root's reply key (both checked against an independent KDF: hashlib's
    BLAKE2b), never the root's secret; each worker's fields name its leaf's
    secret file and the MAC, and hold no secret."""
    from homagg import auth as hg_auth
    from homagg.switch import job_file
    from auth_rig import ref_key

    seen = [[] for _ in range(3)]

    def control(k):
        return lambda req: seen[k].append(req) or {}

    aggs = [
        ("10.0.0.1", 48879, "02:00:00:00:00:01"),
        ("10.0.0.2", 48879, "02:00:00:00:00:02"),
        ("10.0.0.3", 48879, "02:00:00:00:00:03"),
    ]
    root, leaf = bytes(range(32)), [bytes([7] * 32), bytes([9] * 32)]
    paths = [f"/run/w{w}/leaf-{job_file.tree_leaf(w, 5, 2)[0]}.secret" for w in range(5)]
    files = job_file.register_tree(
        [control(k) for k in range(3)],
        aggs,
        leaves=2,
        workers=5,
        group="239.1.0.1",
        job=77,
        token=99,
        auth=root,
        leaf_auth=leaf,
        auth_files=paths,
        mac="blake2b",
    )
    r0, r1, rr = (s[0] for s in seen)
    assert rr["auth"] == root.hex() and rr["mac"] == "blake2b" and rr["workers"] == 2
    for k, r in enumerate((r0, r1)):
        assert r["auth"] == leaf[k].hex() and r["mac"] == "blake2b"
        assert r["parent"]["key"] == ref_key(root, k, job=77).hex()
        assert r["parent"]["reply_key"] == ref_key(root, hg_auth.AGGREGATOR, job=77).hex()
        assert root.hex() not in str(r)
    assert [f["auth_file"] for f in files] == [
        "/run/w0/leaf-0.secret",
        "/run/w1/leaf-0.secret",
        "/run/w2/leaf-1.secret",
        "/run/w3/leaf-1.secret",
        "/run/w4/leaf-1.secret",
    ]
    assert all(f["mac"] == "blake2b" for f in files)
    text = str(files)
    assert all(x.hex() not in text for x in (root, *leaf))
    with pytest.raises(ValueError, match="leaf_auth: one secret per leaf"):
        job_file.register_tree(
            [control(k) for k in range(3)],
            aggs,
            leaves=2,
            workers=5,
            group="239.1.0.1",
            auth=root,
            leaf_auth=leaf[:1],
            auth_files=paths,
        )
    with pytest.raises(ValueError, match="auth_files: one path per worker"):
        job_file.register_tree(
            [control(k) for k in range(3)],
            aggs,
            leaves=2,
            workers=5,
            group="239.1.0.1",
            auth=root,
            leaf_auth=leaf,
        )


# ---- who is missing in a tree: the frames byte by byte --------------------


def _bits(ids, nbytes):
    """A bitmap of nbytes bytes with bit i % 8 of byte i // 8 set per id."""
    out = bytearray(nbytes)
    for i in ids:
        out[i // 8] |= 1 << (i % 8)
    return bytes(out)


def test_leaf_reports_its_missing_workers_and_passes_the_roots_view_down():
    """docs/PROTOCOL.md "Who is missing in a tree", at a leaf (workers 4, 5
    of the job, leaf 3 of 5): a worker's retransmission of an open set
    sends the root a leaf report (base, n, the bitmap of the missing);
    a root STATUS of the forwarded set whose missing-below bits are new is
    passed to the workers at once, after the leaf's own bitmaps: L, the
    root's two bitmaps, the missing-below bitmap."""
    from homagg.engine import FLAG_RETRANS, FLAG_STATUS, Addr, Engine, MemPort

    root = Addr.of(bytes([2, 0, 0, 0, 9, 9]), (10 << 24) | 99, 48879)
    port = MemPort(can_replicate=False)
    port.set_time(1_000_000)
    eng = Engine(port)
    eng.add_job(
        job=5,
        token=55,
        workers=2,
        slots=4,
        incarnation=7,
        parent={"addr": root, "worker": 3, "shard": 2, "base": 4, "leaves": 5},
    )
    pay = np.ones(16, dtype=">i4").tobytes()
    assert _leaf_send(port, eng, _worker_frame(port, 0, 6, "sum32", pay)) == []
    out = _leaf_send(port, eng, _worker_frame(port, 0, 6, "sum32", pay, flags=FLAG_RETRANS))
    reports = [f for f in out if f.dst.ipv4 == root.ipv4]
    status = [f for f in out if f.dst.ipv4 != root.ipv4]
    assert len(reports) == 1 and len(status) == 1
    r = reports[0]
    assert r.flags & FLAG_STATUS and not r.flags & FLAG_RETRANS
    assert (r.worker, r.seq, r.slot, r.shard, r.exp, r.lanes) == (3, 6, 2, 2, 0, 16)
    assert r.payload == (4).to_bytes(2, "big") + (2).to_bytes(2, "big") + _bits([1], 1)
    assert status[0].payload == _bits([0], 1) + bytes(1)  # no tail: open here
    assert eng.counters()["up_reports"] == 1
    # within half an upward timeout: no second report
    out = _leaf_send(port, eng, _worker_frame(port, 0, 6, "sum32", pay, flags=FLAG_RETRANS))
    assert [f for f in out if f.dst.ipv4 == root.ipv4] == []
    # worker 1 completes the set: it goes up
    up = _leaf_send(port, eng, _worker_frame(port, 1, 6, "sum32", pay))
    assert len(up) == 1 and up[0].dst.ipv4 == root.ipv4 and not up[0].flags & FLAG_STATUS
    # the root lacks leaf 1, whose report says job worker 2 is missing
    below = _bits([2], 32)
    root_view = _bits([0, 2, 3, 4], 1) + _bits([], 1)
    down = _leaf_send(
        port, eng, _root_frame(port, root, 6, root_view + below, FLAG_STATUS, lanes=16)
    )
    tail = (5).to_bytes(2, "big") + root_view + below
    assert sorted(f.worker for f in down) == [0, 1]  # pushed: the news is new
    for f in down:
        assert f.flags & FLAG_STATUS and f.payload == _bits([0, 1], 1) + bytes(1) + tail
    # the same view again: nothing pushed; a worker's resend gets it
    assert (
        _leaf_send(port, eng, _root_frame(port, root, 6, root_view + below, FLAG_STATUS, lanes=16))
        == []
    )
    again = _leaf_send(port, eng, _worker_frame(port, 1, 6, "sum32", pay, flags=FLAG_RETRANS))
    st = [f for f in again if f.flags & FLAG_STATUS]
    assert len(st) == 1 and st[0].worker == 1 and st[0].payload.endswith(tail)
    c = eng.counters()
    assert (c["summed"], c["completed"], c["up_sent"]) == (2, 1, 1)


def test_root_keeps_leaf_reports_and_sends_them_in_its_status():
    """At the root (an ordinary job of L = 3 workers): a leaf report is
    taken into the set's missing-below bitmap (its range replaced), never
    summed; a change is pushed as the set's STATUS to the leaves heard
    from; later STATUS frames of the set carry it after the two bitmaps;
    a report of another chunk or a malformed one changes nothing."""
    from homagg.engine import FLAG_RETRANS, FLAG_STATUS, Engine, MemPort, build_frame

    port = MemPort(can_replicate=False)
    port.set_time(1_000_000)
    eng = Engine(port)
    eng.add_job(job=5, token=55, workers=3, slots=4, incarnation=7)
    pay = np.ones(16, dtype=">i4").tobytes()

    def report(leaf, seq, base, n, missing, **kw):
        src = _worker_frame(port, leaf, seq, "sum32", pay)  # for its address
        from homagg.engine import FLAG_SHADOW, parse_frame

        a = parse_frame(src).src
        fields = dict(op="sum32", job=5, token=55, worker=leaf, seq=seq, slot=seq % 4, lanes=16)
        fields.update(kw)
        flags = FLAG_STATUS | (FLAG_SHADOW if (seq // 4) % 2 else 0)
        body = base.to_bytes(2, "big") + n.to_bytes(2, "big") + _bits(missing, (n + 7) // 8)
        return build_frame(a, port.addr, flags=flags, payload=body, **fields)

    # leaves 0 and 2 contribute chunk 6 (leaf 1 waits for its worker 3)
    assert _leaf_send(port, eng, *(_worker_frame(port, l, 6, "sum32", pay) for l in (0, 2))) == []
    pushed = _leaf_send(port, eng, report(1, 6, 2, 2, [1]))
    below = _bits([3], 32)
    want = _bits([0, 2], 1) + bytes(1) + below
    # to the leaves it learnt addresses from (a report teaches none)
    assert sorted(f.worker for f in pushed) == [0, 2]
    assert all(f.flags & FLAG_STATUS and f.payload == want for f in pushed)
    # the same report again: no news; its range replaced by a new one
    assert _leaf_send(port, eng, report(1, 6, 2, 2, [1])) == []
    pushed = _leaf_send(port, eng, report(1, 6, 2, 2, [0]))
    assert all(f.payload == _bits([0, 2], 1) + bytes(1) + _bits([2], 32) for f in pushed)
    # a leaf's resend gets it too
    st = _leaf_send(port, eng, _worker_frame(port, 0, 6, "sum32", pay, flags=FLAG_RETRANS))
    assert len(st) == 1 and st[0].payload.endswith(_bits([2], 32))
    # malformed: n 0, past 256 workers; a wrong token, worker or slot
    for frame, reason in (
        (report(1, 6, 2, 0, []), "bad_lanes"),
        (report(1, 6, 255, 2, [0]), "bad_lanes"),
        (report(1, 6, 2, 2, [1], token=56), "bad_token"),
        (report(3, 6, 2, 2, [1], worker=3), "bad_worker"),
        (report(1, 6, 2, 2, [1], slot=1), "bad_slot"),
    ):
        before = eng.counters()[reason]
        assert _leaf_send(port, eng, frame) == []
        assert eng.counters()[reason] == before + 1, reason
    # another chunk of the slot: kept for it, not shown for chunk 6
    assert _leaf_send(port, eng, report(1, 10, 2, 2, [1])) == []
    st = _leaf_send(port, eng, _worker_frame(port, 2, 6, "sum32", pay, flags=FLAG_RETRANS))
    assert len(st) == 1 and st[0].payload.endswith(_bits([2], 32))
    c = eng.counters()
    assert c["leaf_reports"] == 4 and c["summed"] == 2 and c["completed"] == 0


def test_leaf_resends_a_partial_sum_that_later_results_overtook():
    """docs/PROTOCOL.md "Repairs in a tree": the root's results of
    DUPTHRESH (16) sets sent up after a forwarded set overtake it, and it
    goes up again at once (its upward timer is 1 s away); a root STATUS
    that shows the leaf's sum present restarts the count, so only sets
    sent up after that STATUS overtake it from then on."""
    from homagg.engine import FLAG_RESULT, FLAG_RETRANS, FLAG_STATUS

    S, D = 32, 16
    port, eng, root = _leaf_rig(slots=S, rto=1.0)
    pay = np.ones(16, dtype=">i4").tobytes()
    result = np.full(16, 2, dtype=">i4").tobytes()

    def complete(seq):
        out = _leaf_send(
            port, eng, *(_worker_frame(port, w, seq, "sum32", pay, slots=S) for w in range(2))
        )
        assert len(out) == 1 and out[0].dst.ipv4 == root.ipv4 and out[0].seq == seq
        assert not out[0].flags & FLAG_RETRANS

    def root_result(seq):
        out = _leaf_send(port, eng, _root_frame(port, root, seq, result, FLAG_RESULT, slots=S))
        return [f for f in out if f.dst.ipv4 == root.ipv4]

    for seq in range(D + 2):
        complete(seq)
    for seq in range(1, D):
        assert root_result(seq) == [], seq
    up = root_result(D)  # the 16th result of a set sent up after set 0
    assert len(up) == 1 and up[0].seq == 0 and up[0].flags & FLAG_RETRANS
    assert up[0].payload == result  # the partial sum of two ones
    assert root_result(0) == []
    assert eng.counters()["up_retransmissions"] == 1

    # set D + 1 is overtaken by no set yet; sets D + 2 .. 2D + 1 go up
    late = D + 1
    for seq in range(D + 2, 2 * D + 2):
        complete(seq)
    for seq in range(D + 2, D + 10):  # overtaken 8 times
        assert root_result(seq) == [], seq
    # the root has its sum (leaf bit 3): it waits for another leaf
    status = _root_frame(port, root, late, bytes([0b1000]), FLAG_STATUS, slots=S, lanes=16)
    assert _leaf_send(port, eng, status) == []
    for seq in range(D + 10, 2 * D + 2):  # sent up before that STATUS: not counted
        assert root_result(seq) == [], seq
    for seq in range(2 * D + 2, 3 * D + 2):
        complete(seq)
    for seq in range(2 * D + 2, 3 * D + 1):
        assert root_result(seq) == [], seq
    up = root_result(3 * D + 1)
    assert len(up) == 1 and up[0].seq == late and up[0].flags & FLAG_RETRANS
    c = eng.counters()
    assert (c["up_sent"], c["up_retransmissions"], c["up_results"]) == (3 * D + 2, 2, 3 * D + 1)
    assert _causes(c) == (0, 2, 0, 0)  # both overtaken


def test_leaf_sends_its_loss_report_up():
    """docs/PROTOCOL.md "Repairs in a tree": when a leaf reports a worker's
    lost frame to its workers (worker 1's first frame of seq 3 came while
    set 0 lacks it), it sends its root a leaf report of that set too, so
    the root's STATUS reaches the other leaves' workers before the gap."""
    from homagg.engine import FLAG_LOSS, FLAG_STATUS, Addr, Engine, MemPort

    root = Addr.of(bytes([2, 0, 0, 0, 9, 9]), (10 << 24) | 99, 48879)
    port = MemPort(can_replicate=False)
    port.set_time(1_000_000)
    eng = Engine(port)
    eng.add_job(
        job=5,
        token=55,
        workers=2,
        slots=4,
        incarnation=7,
        parent={"addr": root, "worker": 3, "shard": 2, "base": 4, "leaves": 5},
    )
    pay = np.ones(16, dtype=">i4").tobytes()
    frames = [_worker_frame(port, 0, seq, "sum32", pay) for seq in range(4)]
    frames += [_worker_frame(port, 1, seq, "sum32", pay) for seq in (1, 2)]
    out = _leaf_send(port, eng, *frames)
    assert [f.seq for f in out] == [1, 2]  # two sets complete and go up
    out = _leaf_send(port, eng, _worker_frame(port, 1, 3, "sum32", pay))
    loss = [f for f in out if f.flags & FLAG_LOSS]
    reports = [f for f in out if f.dst.ipv4 == root.ipv4 and f.flags & FLAG_STATUS]
    assert len(loss) == 1 and loss[0].seq == 0 and loss[0].worker == 1
    assert len(reports) == 1
    r = reports[0]
    assert (r.worker, r.seq, r.slot, r.shard) == (3, 0, 0, 2)
    assert r.payload == (4).to_bytes(2, "big") + (2).to_bytes(2, "big") + _bits([1], 1)
    assert eng.counters()["up_reports"] == 1


def test_leaf_repeats_its_report_while_the_set_waits():
    """docs/PROTOCOL.md "Who is missing in a tree": once it has reported an
    open set, a leaf repeats the report every report period (min(up_rto,
    1 ms)) on its timers, so the root can tell a leaf that waits from one
    that stopped; the repeats end when the set goes up, and after
    up_give_up_ns."""
    from homagg.engine import FLAG_RETRANS, FLAG_STATUS

    # an upward timeout longer than the report period: 1 ms rules
    port, eng, root = _leaf_rig(rto=5e-3, reports=True)
    t = 1_000_000
    pay = np.ones(16, dtype=">i4").tobytes()

    def reports(out):
        return [f for f in out if f.dst.ipv4 == root.ipv4 and f.flags & FLAG_STATUS]

    assert _leaf_send(port, eng, _worker_frame(port, 0, 6, "sum32", pay)) == []
    assert eng.next_deadline is None  # nothing reported: nothing to repeat
    out = _leaf_send(port, eng, _worker_frame(port, 0, 6, "sum32", pay, flags=FLAG_RETRANS))
    assert len(reports(out)) == 1
    assert eng.next_deadline == t + 1_000_000
    port.set_time(t + 999_999)
    assert reports(_leaf_send(port, eng)) == []
    for k in (1, 2, 3):
        port.set_time(t + k * 1_000_000)
        rep = reports(_leaf_send(port, eng))
        assert len(rep) == 1 and rep[0].seq == 6, k
        assert rep[0].payload == (4).to_bytes(2, "big") + (2).to_bytes(2, "big") + _bits([1], 1)
    assert eng.counters()["up_reports"] == 4
    # worker 1 completes the set: it goes up, and nothing is repeated
    up = _leaf_send(port, eng, _worker_frame(port, 1, 6, "sum32", pay))
    assert len(up) == 1 and not up[0].flags & FLAG_STATUS
    port.set_time(t + 10_000_000)
    assert reports(_leaf_send(port, eng)) == []
    assert eng.counters()["up_reports"] == 4


def test_leaf_report_repeats_end_at_the_give_up_time():
    """A set that never completes is reported for up_give_up_ns after its
    first report, then no more."""
    from homagg.engine import FLAG_RETRANS, FLAG_STATUS

    port, eng, root = _leaf_rig(rto=1e-3, give_up=4.5e-3, reports=True)
    t = 1_000_000
    pay = np.ones(16, dtype=">i4").tobytes()
    _leaf_send(port, eng, _worker_frame(port, 0, 1, "sum32", pay))
    _leaf_send(port, eng, _worker_frame(port, 0, 1, "sum32", pay, flags=FLAG_RETRANS))
    sent = []
    for k in range(1, 12):
        port.set_time(t + k * 1_000_000)
        sent += [f for f in _leaf_send(port, eng) if f.dst.ipv4 == root.ipv4]
    assert all(f.flags & FLAG_STATUS and f.seq == 1 for f in sent)
    # the first report at t, repeats at t + 1 .. t + 4 ms (within 4.5 ms
    # of the first), then none
    assert len(sent) == 4
    assert eng.next_deadline is None


def test_root_shows_a_leaf_s_report_until_its_sum_comes_or_it_falls_silent():
    """docs/PROTOCOL.md "Who is missing in a tree", at the root: a leaf's
    missing-below bits end when its partial sum of the set arrives (it has
    all its workers) and when its latest report is more than 4 ms old (a
    live leaf repeats it every millisecond: a silent one has stopped), so
    a leaf that died after reporting is named itself, not its worker."""
    from homagg.engine import FLAG_RETRANS, FLAG_SHADOW, FLAG_STATUS, Engine, MemPort
    from homagg.engine import build_frame, parse_frame

    port = MemPort(can_replicate=False)
    t = 1_000_000
    port.set_time(t)
    eng = Engine(port)
    eng.add_job(job=5, token=55, workers=4, slots=4, incarnation=7)
    pay = np.ones(16, dtype=">i4").tobytes()

    def report(leaf, seq, base, n, missing):
        a = parse_frame(_worker_frame(port, leaf, seq, "sum32", pay)).src
        flags = FLAG_STATUS | (FLAG_SHADOW if (seq // 4) % 2 else 0)
        body = base.to_bytes(2, "big") + n.to_bytes(2, "big") + _bits(missing, (n + 7) // 8)
        return build_frame(
            a,
            port.addr,
            flags=flags,
            payload=body,
            op="sum32",
            job=5,
            token=55,
            worker=leaf,
            seq=seq,
            slot=seq % 4,
            lanes=16,
        )

    def tail_after_resend():
        st = _leaf_send(port, eng, _worker_frame(port, 0, 6, "sum32", pay, flags=FLAG_RETRANS))
        assert len(st) == 1 and st[0].flags & FLAG_STATUS
        return st[0].payload[2:]  # after the worker and active bitmaps (1 byte each)

    # leaves 0 and 2 contribute chunk 6; leaf 1 (workers 2, 3) lacks worker
    # 3, leaf 3 (workers 6, 7) lacks worker 6
    _leaf_send(port, eng, *(_worker_frame(port, l, 6, "sum32", pay) for l in (0, 2)))
    _leaf_send(port, eng, report(1, 6, 2, 2, [1]), report(3, 6, 6, 2, [0]))
    assert tail_after_resend() == _bits([3, 6], 32)
    # leaf 1's sum: worker 3's repair reached it; its bits end
    _leaf_send(port, eng, _worker_frame(port, 1, 6, "sum32", pay))
    assert tail_after_resend() == _bits([6], 32)
    # leaf 3 repeats its report within 4 ms: still shown
    port.set_time(t + 3_000_000)
    _leaf_send(port, eng, report(3, 6, 6, 2, [0]))
    port.set_time(t + 7_000_000)
    assert tail_after_resend() == _bits([6], 32)
    # then it falls silent: after 4 ms its bits are no longer shown
    port.set_time(t + 7_000_001)
    assert tail_after_resend() == bytes(32)
    # a report from it again: shown again
    _leaf_send(port, eng, report(3, 6, 6, 2, [0]))
    assert tail_after_resend() == _bits([6], 32)
    c = eng.counters()
    assert c["leaf_reports"] == 4 and c["summed"] == 3 and c["completed"] == 0
