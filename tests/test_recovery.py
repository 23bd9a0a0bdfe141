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

from homagg.errors import InvalidArgument, OutOfRange
from homagg.sim import NIC_GRANULARITY, NIC_RTO_MIN, NIC_START_WAIT, Cluster

from reference import allreduce as oracle_allreduce

pytestmark = pytest.mark.sanitize

BLOCK = 256


def _grads(W, n, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(np.float32) for _ in range(W)]


def _check_exact(res, grads, block=BLOCK):
    want = oracle_allreduce(grads, block).view(np.uint32)
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
    start_wait = cl.start_wait  # the simulated cluster's rto (with the pipe's bound)
    bound = K * (math.log2(delay / start_wait) + 2)
    for st in punctual:
        assert st["timeouts"] == 0 and st["spurious_timeouts"] == 0, st
        assert st["retransmissions"] == st["start_probes"] <= bound, (st["start_probes"], bound)
    # nothing learnt that slows the next, punctual allreduce down
    assert after.stats["virtual_time"] <= 1.5 * t0
    assert max(st["rto_floor_ns"] for st in after.stats["workers"]) == 0


@pytest.mark.parametrize("delay", [0.010, 0.100])
def test_a_straggler_late_at_every_allreduce_is_waited_for_without_probes(delay):
    """One worker starts every allreduce `delay` late, as a rank with more
    to compute before each.  The wait of an allreduce's first step is 1.5
    times the least of its latest samples, and each of them is that
    lateness: the punctual workers probe during the first allreduce only,
    then wait for the straggler.  A later step keeps its own samples (the
    peers decode the step before together), so its wait stays short
    (docs/PROTOCOL.md Part 3, "Why the least of the latest samples")."""
    W = 16
    grads = _grads(W, 1 << 16, seed=W)
    with Cluster(workers=W, seed=3) as cl:
        t0 = cl.allreduce(grads, method="dense", block_elements=BLOCK).stats["virtual_time"]
        cl.delay_start(W - 1, delay)
        runs = [cl.allreduce(grads, method="dense", block_elements=BLOCK) for _ in range(3)]
    # the workers' counters add up over the allreduces
    probes = [sum(st["start_probes"] for st in r.stats["workers"][:-1]) for r in runs]
    assert probes[0] > 0 and probes[2] == probes[0], probes
    for r in runs:
        _check_exact(r, grads)
        assert delay <= r.stats["virtual_time"] <= delay + 2 * t0, (r.stats["virtual_time"], t0)
        for st in r.stats["workers"][:-1]:
            assert st["timeouts"] == 0 and st["rto_floor_ns"] == 0, st
            # the longer class is the first step's, about 1.5 times the delay
            assert delay * 1e9 <= st["start_wait_ns"] <= 2 * delay * 1e9, st


def test_first_windows_queue_at_the_aggregators_without_expiries():
    """W = 256 workers, K = 16 aggregators, S = 8, 1 Gbit/s links, no loss:
    2048 frames queue in front of each aggregator, whose results come
    2.1 ms apart, against a first timeout (rto) of 0.2 ms.  Until an
    aggregator's first RTT sample its timeout is the RFC 6298 one of the
    step-start sample (docs/PROTOCOL.md Part 3, "The timeout before the
    first sample"), so no timer expires; the only resends are the start
    probes.  Before that rule each worker had 64 expiries (16,384), every
    one a resend into the bottleneck."""
    W, K, n = 256, 16, 1 << 15
    grads = _grads(W, n, seed=7)
    with Cluster(workers=W, aggregators=K, slots=8, link_gbps=1, agg_link_gbps=1, seed=3) as cl:
        res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
    _check_exact(res, grads)
    per = res.stats["workers"]
    assert res.stats["fabric"]["dropped_loss"] == 0
    assert sum(w["timeouts"] for w in per) == 0, [w["timeouts"] for w in per]
    for w in per:
        assert w["retransmissions"] == w["start_probes"], w
        # every aggregator has its samples now: the queue's round trip
        assert w["srtt_ns"] > 10 * 200_000, w["srtt_ns"]


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


LOSS = 0.01
RTO_MAX = 50e-3  # homagg.sim.Cluster's default rto_max


@pytest.mark.parametrize(
    "W,K,n,gbps", [(16, 1, 1 << 20, None), (64, 4, 1 << 18, None), (64, 4, 1 << 20, 100)]
)
def test_loss_at_scale_within_the_spec_time_bound(W, K, n, gbps):
    """1 % per-hop loss at W = 16 and 64: exact, at most two
    retransmissions per drop, and a virtual time within the bound the spec
    gives with loss reports (a peer's lost frame reported to it at once),
    for workers without the pipe's bound; with it (the default), exact,
    at most two per drop, and no slower on the same seed.

    The bound (docs/PROTOCOL.md Part 3, "Fast retransmission", "Window",
    "Who is missing, and why", "Loss reports").  A lost frame -- a contribution on its
    worker's link up, or a result on a worker's link down -- is repaired
    within R = 4 T + F: its gap shows within one turn T (DUPTHRESH results
    of chunks sent after it; its timer otherwise), its worker's turn comes
    within TURNS_MAX = 2 turns, and the STATUS and the resend's result come
    back within one more.  T is a worker's SRTT + 4 RTTVAR in the loss-free
    run: the window's queue, and so the path's round trip, is the same
    with and without loss (same S, same links); the lossy run's own
    estimate also took samples of chunks that waited through stalls
    (15-16 ms at the end of these runs against 23 and 92 us).  F is the floor
    stall timeouts taught, which no worker here should learn (nobody starts
    late, nobody stops): at most a tenth of the cluster's rto_max.  The
    window goes on past an overdue chunk, so repairs on different slots
    overlap; only the chunks that share one slot at one aggregator wait for
    one another (chunk c + K S is sent when c is complete).  A slot carries
    C = N / (K S) of a worker's N chunks, and a chunk needs a repair when
    any of its 2 W hops (W contributions up, W results down) loses its
    frame: with probability q = 1 - (1 - p)^(2 W).  So the allreduce takes
    at most the loss-free time plus a slot's chain of C q repairs of R
    each; twice that, for a chain longer than its mean (the seed is fixed,
    so the check is deterministic).

    At W = 64 on 100 Gbit/s links (the aggregators' too) a turn stretched
    by samples that waited through stalls held a worker's slot behind a
    lost result for up to rto_max, every peer's window waited for its
    contribution, and the floor learnt those stalls (17 ms, 11x the
    loss-free time); the turn is the path's round trip (PROTOCOL.md
    Part 3, "The turn: the path's round trip").
    """
    link = {"link_gbps": gbps, "agg_link_gbps": gbps} if gbps else {}
    link["pipe_gain"] = 0  # the whole window queued, with and without loss
    grads = _grads(W, n, seed=5)
    with Cluster(workers=W, aggregators=K, seed=3, **link) as cl:
        clean = cl.allreduce(grads, method="dense", block_elements=BLOCK).stats
    t0 = clean["virtual_time"]
    T = max(w["srtt_ns"] + 4 * w["rttvar_ns"] for w in clean["workers"]) / 1e9
    with Cluster(workers=W, aggregators=K, loss=LOSS, seed=3, **link) as cl:
        res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
        S = cl.job.slots
    # the pipe's bound (PROTOCOL.md Part 3, "The pipe"; homagg.sim's
    # default): exact, at most two per drop, and no slower
    link["pipe_gain"] = 2.0
    with Cluster(workers=W, aggregators=K, loss=LOSS, seed=3, **link) as cl:
        piped = cl.allreduce(grads, method="dense", block_elements=BLOCK)
    _check_exact(piped, grads)
    piped_lost = piped.stats["fabric"]["dropped_loss"]
    assert sum(w["retransmissions"] for w in piped.stats["workers"]) <= 2 * piped_lost
    assert piped.stats["virtual_time"] <= res.stats["virtual_time"]
    _check_exact(res, grads)
    per = res.stats["workers"]
    lost = res.stats["fabric"]["dropped_loss"]
    assert lost > 500
    assert sum(w["retransmissions"] for w in per) <= 2 * lost
    F = max(w["rto_floor_ns"] for w in per) / 1e9
    chain = per[0]["chunks"] / (K * S) * (1 - (1 - LOSS) ** (2 * W))
    bound = t0 + 2 * chain * (4 * T + F)
    assert F <= 0.1 * RTO_MAX, (F, T)
    assert res.stats["virtual_time"] <= bound, (res.stats["virtual_time"], bound, t0, T, F)


# ---- the pipe: docs/PROTOCOL.md Part 3, "The pipe" --------------------------

PIPE_MIN = 4  # the pipe's least bound (client_pvt.h)


@pytest.mark.parametrize("agg_link_gbps", [1.0, None], ids=["agg-bottleneck", "worker-bottleneck"])
def test_the_pipe_keeps_the_window_out_of_the_queue(agg_link_gbps):
    """Loss-free, 4 workers on 1 Gbit/s links, S = 64.  Without the pipe's
    bound (pipe_gain=0) every worker keeps its whole window in flight, in
    the queue in front of the bottleneck (the aggregator's link, or each
    worker's own), and a chunk's round trip is the window's: 2.3 and
    0.57 ms, 17-34 times the least.  With g = 2 the bound settles where
    the round trip is about twice its least, a tenth of the window is in
    flight, and the bottleneck is as busy as before: the same virtual
    time."""
    W, S = 4, 64
    grads = _grads(W, 1 << 18, seed=11)
    runs = {}
    for gain in (0, 2.0):
        with Cluster(
            workers=W, link_gbps=1.0, agg_link_gbps=agg_link_gbps, slots=S, seed=3, pipe_gain=gain
        ) as cl:
            res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
            aggs = [cl.job.worker_aggregator_stats(w, 0) for w in range(W)]
        _check_exact(res, grads)
        assert sum(w["retransmissions"] for w in res.stats["workers"]) == 0
        runs[gain] = res.stats, aggs
    (free, free_aggs), (piped, piped_aggs) = runs[0], runs[2.0]
    assert piped["virtual_time"] <= 1.001 * free["virtual_time"], (
        piped["virtual_time"],
        free["virtual_time"],
    )
    for st, a in zip(free["workers"], free_aggs):
        assert a["pipe_limit"] == 0
        assert st["flight_ns"] / (free["virtual_time"] * 1e9) > S / 2
        assert a["srtt_ns"] > 10 * a["rtt_min_ns"] > 0, a
    for st, a in zip(piped["workers"], piped_aggs):
        assert PIPE_MIN <= a["pipe_limit"] < S / 4, a
        assert st["flight_ns"] / (piped["virtual_time"] * 1e9) < S / 4
        assert 0 < a["rtt_min_ns"] <= a["srtt_ns"] <= 3 * a["rtt_min_ns"], a


@pytest.mark.parametrize("loss,seed", [(0.01, 1), (0.01, 2), (0.01, 3), (0.001, 1)])
def test_the_pipe_shortens_repairs_under_loss(loss, seed):
    """W = 16 on 1 Gbit/s links, 2^20 floats: every repair (the resend,
    the loss report, the result after it) crosses the queue in front of
    the bottleneck, which without the pipe's bound holds the whole window
    (0.55 ms of this worker's link): 1.19-1.38x the loss-free time at 1 %
    per-hop loss, and 2.1-2.4 retransmissions per drop at 0.1 % (a peer's
    resend queued behind its own window comes after the results that
    make this worker resend too).  With g = 2 the queue is about one round
    trip: exact, within the issue's bounds (1.5x at 1 %, 1.1x at 0.1 %),
    at most two retransmissions per drop, and faster than without."""
    W = 16
    grads = _grads(W, 1 << 20, seed=5)
    with Cluster(workers=W, link_gbps=1.0, seed=seed) as cl:
        t0 = cl.allreduce(grads, method="dense", block_elements=BLOCK).stats["virtual_time"]
    times = {}
    for gain in (0, 2.0):
        with Cluster(workers=W, link_gbps=1.0, loss=loss, seed=seed, pipe_gain=gain) as cl:
            res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
        _check_exact(res, grads)
        times[gain] = res.stats["virtual_time"]
    lost = res.stats["fabric"]["dropped_loss"]
    retrans = sum(w["retransmissions"] for w in res.stats["workers"])
    assert lost > 100
    assert retrans <= 2 * lost, (retrans, lost)
    assert times[2.0] <= (1.5 if loss >= 0.01 else 1.1) * t0, (times, t0)
    assert times[2.0] < times[0], (times, t0)


def test_the_pipes_rmin_comes_from_full_chunks():
    """Dense's block exponents of 2^20 floats in blocks of 4096 are one
    256-byte chunk, which crosses each 1 Gbit/s link in about 2 us; a
    full chunk of 1 KB values takes about 8.5 us each way.  Rmin is only
    taken from full chunks (docs/PROTOCOL.md Part 3, "The pipe"): every
    worker's is at least a full frame's time up and its result's down.
    Taken from the short chunk it was 12.6 us, and the bound of every
    later allreduce sat at 4 chunks: at 1 % loss the second allreduce
    took 1.18 times the first (1.26x the loss-free time).  Here it is
    within the issue's 1.5x and within 1.1 times the first."""
    W = 16
    grads = _grads(W, 1 << 20, seed=5)
    frame_s = (1024 + 32 + 42 + 4) * 8 / 1e9  # payload, header, Eth/IP/UDP, FCS
    with Cluster(workers=W, link_gbps=1.0, seed=1) as cl:
        t0 = [cl.allreduce(grads, method="dense").stats["virtual_time"] for _ in range(2)]
        for w in range(W):
            a = cl.job.worker_aggregator_stats(w, 0)
            assert a["rtt_min_ns"] >= 2 * frame_s * 1e9, (w, a)
    with Cluster(workers=W, link_gbps=1.0, loss=0.01, seed=1) as cl:
        runs = [cl.allreduce(grads, method="dense") for _ in range(2)]
    for res in runs:
        _check_exact(res, grads, block=4096)
    first, second = (r.stats["virtual_time"] for r in runs)
    assert second <= 1.5 * t0[1], (first, second, t0)
    assert second <= 1.1 * first, (first, second, t0)


@pytest.mark.parametrize(
    "aggregators,slots,start",
    [
        (1, 64, 8),
        (4, 64, 8),
        (5, 64, 6),
        (6, 64, 5),
        (8, 64, 4),
        (16, 64, 4),
        (1, 6, 6),
        (16, 2, 2),
    ],
)
def test_several_pipes_on_one_link_start_with_32_chunks_together(aggregators, slots, start):
    """A worker's K pipes share its own link: they start with at most 32
    chunks together, each at 32 / K within [4, 8] (4: the least bound) and
    at most S (docs/PROTOCOL.md Part 3, "Several pipes on one link").
    Read before any RTT sample, then moved by the samples of an
    allreduce."""
    W = 4
    with Cluster(
        workers=W, aggregators=aggregators, slots=slots, link_gbps=1.0, pipe_gain=2.0
    ) as cl:
        for w in range(W):
            for k in range(aggregators):
                assert cl.job.worker_aggregator_stats(w, k)["pipe_limit"] == start
        grads = _grads(W, 1 << 16, seed=3)
        res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
        _check_exact(res, grads)
        for w in range(W):
            for k in range(aggregators):
                a = cl.job.worker_aggregator_stats(w, k)
                assert a["rtt_samples"] > 0
                assert min(PIPE_MIN, slots) <= a["pipe_limit"] <= slots, a


def test_several_pipes_on_one_link_keep_repairs_out_of_the_queue_at_256_workers():
    """W = 256 over K = 16 aggregators, 1 Gbit/s links, 2^18 floats, 1 %
    per-hop loss.  Almost every chunk has a STATUS (some of 256
    contributions is missing), which gives no RTT sample, so the pipes
    keep their starts: at 8 chunks each, 128 of a worker's chunks queued
    on its own link and every repair waited behind them, 15.9x the
    loss-free time on this seed (the main build before; 9.8-24.4x over
    seeds 1-10 of docs/BENCHMARKS.md "Several pipes on one link").
    Starting at 32 / K = 2, at least 4 (docs/PROTOCOL.md Part 3, "Several
    pipes on one link"):
    exact, at most two retransmissions per drop, within 10x (4.1-8.4x
    over those seeds).  Virtual time: deterministic."""
    W, K = 256, 16
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal(1 << 18).astype(np.float32) for _ in range(W)]
    with Cluster(workers=W, aggregators=K, link_gbps=1.0, seed=1) as cl:
        t0 = cl.allreduce(grads, method="dense").stats["virtual_time"]
    with Cluster(workers=W, aggregators=K, link_gbps=1.0, loss=0.01, seed=1) as cl:
        res = cl.allreduce(grads, method="dense")
    _check_exact(res, grads, block=4096)
    lost = res.stats["fabric"]["dropped_loss"]
    retrans = sum(w["retransmissions"] for w in res.stats["workers"])
    assert lost > 1000
    assert retrans <= 2 * lost, (retrans, lost)
    assert res.stats["virtual_time"] <= 10 * t0, (res.stats["virtual_time"], t0)


def test_32_slots_with_a_capped_pipe_hold_fewer_repairs_at_256_workers():
    """W = 256 over 16 aggregators, 100 Gbit/s, 2^19 floats, 1 % per-hop
    loss, seed 1.  Nearly every chunk misses some worker's contribution
    and waits for a repair; with 16 slots (the default before) the window
    towards each aggregator is held by them: 2.02x the loss-free time.
    The default now (32 slots, the pipe capped at 8: docs/PROTOCOL.md
    Part 3, "Slots beyond the ring's share, in the NIC model") took
    1.63x: exact, at most two retransmissions per drop, no frame beyond
    a ring, faster than 16 slots and within 1.8x.  (Seeds 1-3 at 1 and
    100 Gbit/s: 2.70-3.24x -> 2.31-2.38x and 1.98-2.80x -> 1.60-1.70x.)
    Virtual time: deterministic."""
    W, K = 256, 16
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal(1 << 19).astype(np.float32) for _ in range(W)]
    with Cluster(workers=W, aggregators=K, link_gbps=100, seed=1) as cl:
        t0 = cl.allreduce(grads, method="dense").stats["virtual_time"]
    times = {}
    for slots in (None, 16):
        with Cluster(workers=W, aggregators=K, link_gbps=100, loss=0.01, seed=1, slots=slots) as cl:
            assert cl.job.pipe_max == (8 if slots is None else 0)
            res = cl.allreduce(grads, method="dense")
        _check_exact(res, grads, block=4096)
        times[slots] = res.stats["virtual_time"]
        lost = res.stats["fabric"]["dropped_loss"]
        retrans = sum(w["retransmissions"] for w in res.stats["workers"])
        assert lost > 1000
        assert retrans <= 2 * lost, (slots, retrans, lost)
        assert res.stats["fabric"]["rx_ring_overflow"] == 0
    assert times[None] < times[16], (times, t0)
    assert times[None] <= 1.8 * t0, (times, t0)


def _lossy_at_256_workers(n, **shape):
    """An allreduce of n dense floats by 256 workers on 1 Gbit/s links
    (``shape``: aggregators= or leaves=), loss-free and then with 1 %
    per-hop loss, seed 1: the lossy run's result, checked exact with at
    most two retransmissions per drop, and the loss-free virtual time."""
    W = 256
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal(n).astype(np.float32) for _ in range(W)]
    with Cluster(workers=W, link_gbps=1.0, seed=1, **shape) as cl:
        t0 = cl.allreduce(grads, method="dense").stats["virtual_time"]
    with Cluster(workers=W, link_gbps=1.0, loss=0.01, seed=1, **shape) as cl:
        res = cl.allreduce(grads, method="dense")
    _check_exact(res, grads, block=4096)
    lost = res.stats["fabric"]["dropped_loss"]
    retrans = sum(w["retransmissions"] for w in res.stats["workers"])
    assert lost > 1000
    assert retrans <= 2 * lost, (retrans, lost)
    return res, t0


def test_one_loss_report_of_a_chunk_to_the_group_at_256_workers():
    """W = 256 over 16 aggregators, 1 Gbit/s links, 2^19 floats, 1 %
    per-hop loss, seed 1.  A chunk lacks 2.6 contributions on average, and
    each lost one was reported to the whole group: every worker received
    2.5 STATUS frames per result, a third of its downstream link's result
    bytes, on the link that is as full as the upstream one (2.33x the
    loss-free time).  Beyond 128 workers only a chunk's first report goes
    to the group now, the later ones to the worker they name
    (docs/PROTOCOL.md Part 3, "Loss reports"): at most 1.5 STATUS frames
    per result at every worker, exact, at most two retransmissions per
    drop, within 2x (1.63x; seeds 2 and 3: 2.38x, 2.31x before, 1.82x,
    1.93x now).  Virtual time: deterministic."""
    res, t0 = _lossy_at_256_workers(1 << 19, aggregators=16)
    # 2.5 per result before at every worker; now about one
    for w in res.stats["workers"]:
        assert w["status_received"] <= 1.5 * w["results_received"], w
    assert res.stats["virtual_time"] <= 2.0 * t0, (res.stats["virtual_time"], t0)


def test_a_leaf_pushes_one_view_of_a_chunk_down_at_256_workers():
    """W = 256 over 16 leaves, 1 Gbit/s links, 2^18 floats, 1 % per-hop
    loss, seed 1.  A leaf sent its workers the root's view every time its
    missing-below bits changed: up to 4,242 STATUS frames per worker for
    1,025 results, on the downstream link that is as full as the upstream
    one (1.79x the loss-free time).  It now pushes a chunk's first view
    only; later ones reach a worker in the answer to its resend
    (docs/PROTOCOL.md "One view of a chunk pushed down"): fewer STATUS
    frames than results at every worker, exact, at most two
    retransmissions per drop, within 1.6x (1.36x; seeds 2 and 3: 1.72x,
    2.01x before, 1.35x, 1.42x now).  Virtual time: deterministic."""
    res, t0 = _lossy_at_256_workers(1 << 18, leaves=16)
    for w in res.stats["workers"]:
        assert w["status_received"] < w["results_received"], w
    assert res.stats["virtual_time"] <= 1.6 * t0, (res.stats["virtual_time"], t0)


def test_with_the_pipe_the_default_slots_cover_the_repairs_at_100_gbits():
    """W = 4 on 100 Gbit/s links, 2^20 floats, 1 % per-hop loss, seeds 1-3.
    A chunk takes about 0.1 us of a worker's link; a repair (the loss
    report after LOSS_LAG later chunks, the resend, its result) several
    round trips.  With S = 64, the default without the pipe's bound, the
    window is about 6 us of the link and every repair holds it (2-3x the
    loss-free time).  With the bound the slots only hold what waits for a
    repair, and the default is 256 (homagg.protocol.default_slots(W,
    pipe=True); docs/PROTOCOL.md Part 3, "The pipe"): exact, at most two
    retransmissions per drop, faster than the same cluster with 64 slots,
    and within the issue's 1.5x wherever no timer had to find a loss (a
    lost tail of a step shows no gap: seed 3 loses one, and its timer,
    at least rto_min = 100 us, is a quarter of the loss-free time)."""
    W = 4
    grads = _grads(W, 1 << 20, seed=5)
    with Cluster(workers=W, seed=1) as cl:
        assert cl.job.slots == 256
        t0 = cl.allreduce(grads, method="dense", block_elements=BLOCK).stats["virtual_time"]
    untimed = 0
    for seed in (1, 2, 3):
        times = {}
        for slots in (None, 64):
            with Cluster(workers=W, loss=0.01, seed=seed, slots=slots) as cl:
                res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
            _check_exact(res, grads)
            times[slots] = res.stats["virtual_time"]
            if slots is None:
                per = res.stats["workers"]
                lost = res.stats["fabric"]["dropped_loss"]
                retrans = sum(w["retransmissions"] for w in per)
                assert lost > 100
                assert retrans <= 2 * lost, (retrans, lost)
                timers = sum(w["timeouts"] + w["start_probes"] for w in per)
        assert times[None] < times[64], (seed, times, t0)
        if timers == 0:
            untimed += 1
            assert times[None] <= 1.5 * t0, (seed, times, t0)
    assert untimed >= 2


def test_the_pipe_keeps_a_trees_loss_free_time():
    """In a tree a result also waits for the slowest leaf, which the bound
    cannot shorten and which g = 2 takes for queue: W = 64 over 4 leaves on
    100 Gbit/s links, 2^18 floats, took 0.507 ms against 0.407 ms without
    the bound.  The tree's default gain (3) leaves room for that wait: the
    second allreduce (the bound learnt) as fast as without it, the first
    within 5 %."""
    W, L = 64, 4
    grads = _grads(W, 1 << 18, seed=3)
    times = {}
    for gain in (0, None):
        with Cluster(workers=W, leaves=L, link_gbps=100, seed=3, pipe_gain=gain) as cl:
            assert cl.pipe_gain == (0 if gain == 0 else 3.0)
            runs = [cl.allreduce(grads, method="dense", block_elements=BLOCK) for _ in range(2)]
        for res in runs:
            _check_exact(res, grads)
        times[gain] = [r.stats["virtual_time"] for r in runs]
    (first0, second0), (first, second) = times[0], times[None]
    assert first <= 1.05 * first0, times
    assert second <= 1.001 * second0, times


def test_a_one_chunk_steps_lost_frame_waits_a_short_start_wait():
    """Dense sends its block exponents as a step of one chunk here: a
    frame of it lost shows no gap and draws no loss report, so the step
    waits for its start probe (docs/PROTOCOL.md Part 3, "Step start").
    With the pipe's bound the NIC model's workers wait 20 us (they start a
    step together, on an exact clock: "The NIC model's timers"), rto
    before that, instead of 4 rto: W = 16 on 100 Gbit/s links at 1 %
    loss, seed 2, S = 64, where a worker's exponent result was lost: 1.98
    ms of virtual time with rto, against 2.57 ms with 4 rto (1.47 ms
    loss-free), so most of the 3 rto between the two waits is saved (2.23
    and 3.15 ms before a step's tail waited at most one turn).  Without
    the bound the default stays 4 rto and the client's timer floors."""
    W = 16
    grads = _grads(W, 1 << 20, seed=5)
    times = {}
    for start_wait in (None, 200e-6, 4 * 200e-6):
        # rto and 4 rto of the model's 200 us (its first timeout pinned);
        # None: every default, the path's first timeout among them
        rto = None if start_wait is None else 200e-6
        with Cluster(workers=W, loss=0.01, seed=2, slots=64, start_wait=start_wait, rto=rto) as cl:
            assert cl.start_wait == (NIC_START_WAIT if start_wait is None else start_wait)
            res = cl.allreduce(grads, method="dense", block_elements=4096)
        _check_exact(res, grads, block=4096)
        assert sum(w["start_probes"] for w in res.stats["workers"]) > 0
        times[start_wait] = res.stats["virtual_time"]
    assert times[200e-6] <= times[4 * 200e-6] - 2.5 * 200e-6, times
    # a fresh cluster: the probe then waits its turn, which before any RTT
    # sample is rto, with the defaults the path's 20 us ("The NIC model's
    # first timeout"; test_the_nic_models_timers_... has the later ones)
    assert times[None] <= times[200e-6], times
    with Cluster(workers=2, pipe_gain=0) as cl:
        assert cl.start_wait == 4 * 200e-6
        assert (cl.granularity, cl._rto_min) == (0, 0)  # the client's floors


def _three_in_a_row_within_the_bound(grads, **kw):
    """Three dense allreduces on a loss-free cluster and on one with 1 %
    per-hop loss, both of arguments kw: each lossy allreduce exact, within
    the issue's 1.5 times the loss-free one of the same index, at most two
    retransmissions per drop (the workers' counters add up over the
    allreduces)."""
    with Cluster(**kw) as cl:
        clean = [cl.allreduce(grads, method="dense").stats["virtual_time"] for _ in range(3)]
    with Cluster(loss=0.01, **kw) as cl:
        dropped = retrans = 0
        for i in range(3):
            res = cl.allreduce(grads, method="dense")
            _check_exact(res, grads, block=4096)
            st = res.stats
            lost = st["fabric"]["dropped_loss"] - dropped
            sent = sum(w["retransmissions"] for w in st["workers"]) - retrans
            dropped, retrans = dropped + lost, retrans + sent
            assert lost > 0 and sent <= 2 * lost, (i, sent, lost)
            assert st["virtual_time"] <= 1.5 * clean[i], (i, st["virtual_time"], clean)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_nic_models_timers_keep_later_allreduces_within_the_bound(seed):
    """W = 4 on 100 Gbit/s links, 2^20 floats, 1 % per-hop loss, three
    allreduces on one cluster.  Each takes 0.375 ms loss-free, and one
    lost frame only a timer finds cost the client's floors (rto_min 100
    us, turns of at least 50 us, a start wait of 200 us): 1.04-2.14x over
    seeds 1-5.  With the NIC model's timers (G 5 us, rto_min and
    start_wait 20 us; docs/PROTOCOL.md Part 3, "The NIC model's timers"):
    every allreduce exact, within the issue's 1.5x, at most two
    retransmissions per drop."""
    W = 4
    with Cluster(workers=W, seed=seed) as cl:
        assert (cl.granularity, cl._rto_min) == (NIC_GRANULARITY, NIC_RTO_MIN)
    _three_in_a_row_within_the_bound(_grads(W, 1 << 20, seed=5), workers=W, seed=seed)


def test_the_start_wait_does_not_learn_the_peers_repairs():
    """W = 64 over 4 aggregators at 100 Gbit/s and 1 % loss, three
    allreduces on one cluster (2^20 floats, 1.47 ms loss-free).  Under loss
    some peer repairs the tail of almost every step and starts the next one
    late; smoothed as RTT samples, those late starts took the start wait to
    about 1 ms, and a lost frame of a one-chunk step waited that long:
    the third allreduce of seed 1 took 1.73x.  With 1.5 times the least of
    the latest samples, per class (docs/PROTOCOL.md Part 3, "Why the least
    of the latest samples"), each allreduce is within the issue's 1.5x,
    exact, at most two retransmissions per drop."""
    W, K = 64, 4
    _three_in_a_row_within_the_bound(_grads(W, 1 << 20, seed=1), workers=W, aggregators=K, seed=1)


def test_the_nic_models_first_timeout_is_one_and_a_half_empty_round_trips():
    """With the pipe's bound a job's timeout before its first result is
    max(rto_min, 1.5 R0), R0 a first chunk's round trip on the model's
    empty links (docs/PROTOCOL.md Part 3, "The NIC model's first timeout"),
    computed here from the spec's formula."""
    F = (1024 + 128) * 8  # bits of a frame of 1 KB payload
    d = 1e-6

    def r0(n, up, agg, copies, k=1):
        return 4 * d + (k + 1) * F / up + (n + copies) * F / agg

    cases = [
        # W = 4 on 1 Gbit/s links, the aggregator's link 4 Gbit/s, multicast
        (dict(workers=4, link_gbps=1), 1.5 * r0(4, 1e9, 4e9, 1)),
        # the same by unicast: a copy per worker back through that link
        (dict(workers=4, link_gbps=1, multicast=False), 1.5 * r0(4, 1e9, 4e9, 4)),
        # W = 64 at 100 Gbit/s behind 400 Gbit/s: 1.5 R0 = 7.4 us, the floor
        (dict(workers=64, aggregators=4), NIC_RTO_MIN),
        # an aggregator link as slow as a worker's: the 256 frames queue;
        # 15 chunks for other aggregators ahead on a worker's link
        (
            dict(workers=256, aggregators=16, link_gbps=1, agg_link_gbps=1),
            1.5 * r0(256, 1e9, 1e9, 1, k=16),
        ),
        # the same behind the model's 256 Gbit/s aggregator links
        (dict(workers=256, aggregators=16, link_gbps=1), 1.5 * r0(256, 1e9, 256e9, 1, k=16)),
        # a tree of 4 leaves on 1 Gbit/s links (aggregator links 64 Gbit/s):
        # the leaf's 16 workers, then the root's 4 leaves
        (
            dict(workers=64, leaves=4, link_gbps=1),
            1.5 * (r0(16, 1e9, 64e9, 1) + r0(4, 64e9, 64e9, 4)),
        ),
    ]
    for kw, want in cases:
        with Cluster(**kw) as cl:
            assert cl.job_rto(kw["workers"]) == pytest.approx(want, rel=1e-9), kw
    # a timeout the user sets is taken as it is, and without the bound the
    # model keeps its 200 us
    with Cluster(workers=64, aggregators=4, rto=1e-3) as cl:
        assert cl.job_rto(64) == 1e-3
    with Cluster(workers=64, aggregators=4, pipe_gain=0) as cl:
        assert cl.job_rto(64) == 200e-6


def test_a_fresh_clusters_first_step_loss_waits_the_paths_timeout():
    """W = 64 over 4 aggregators at 100 Gbit/s, 1 % loss, the first
    allreduce of a fresh cluster (2^20 floats, 1.47 ms loss-free).  A frame
    of the first step's one chunk lost before any RTT sample waited
    max(RTO, start_wait) with RTO = 200 us, plus turns of 200 us: 1.70x on
    seed 1 (1.37x since a step's tail waits no turns, PROTOCOL.md "The tail
    of a step").  With the path's first timeout (20 us here) it is faster
    still and within 1.5x, exact, at most two retransmissions per drop."""
    W, K = 64, 4
    grads = _grads(W, 1 << 20, seed=1)
    with Cluster(workers=W, aggregators=K, seed=1) as cl:
        clean = cl.allreduce(grads, method="dense").stats["virtual_time"]
    times = {}
    for rto in (200e-6, None):
        with Cluster(workers=W, aggregators=K, loss=0.01, seed=1, rto=rto) as cl:
            res = cl.allreduce(grads, method="dense")
        _check_exact(res, grads, block=4096)
        st = res.stats
        lost = st["fabric"]["dropped_loss"]
        assert sum(w["start_probes"] for w in st["workers"]) > 0  # the first step lost a frame
        assert 0 < sum(w["retransmissions"] for w in st["workers"]) <= 2 * lost
        times[rto] = st["virtual_time"]
    assert times[None] < times[200e-6], (times, clean)
    assert times[None] <= 1.5 * clean, (times, clean)


def test_the_pipe_gain_is_checked():
    """A gain outside 0..10 is refused with the argument named, and so are
    the timers' floors that cannot work."""
    for bad in (-1, 10.5, float("nan")):
        with pytest.raises(InvalidArgument, match="pipe_gain"):
            Cluster(workers=2, pipe_gain=bad)
    # and so is a timer granularity that is not positive or beyond rto_max,
    # and an rto_min beyond rto_max
    for bad in (0, -1e-6, float("inf"), 1.0):
        with pytest.raises(InvalidArgument, match="granularity"):
            Cluster(workers=2, granularity=bad)
    with pytest.raises(InvalidArgument, match="rto_min"):
        Cluster(workers=2, rto_min=1.0)
    # below Cluster, the model passes on why a worker's client refused
    # (EINVAL), not "out of memory"
    from homagg.bindings import sim as sim_b

    s = sim_b.sim_create()
    try:
        with pytest.raises(InvalidArgument, match="invalid argument"):
            sim_b.sim_add_job(s, 2, rto_max_ns=10**6, rto_granularity_ns=10**6 + 1)
    finally:
        sim_b.sim_destroy(s)


# ---- trees: docs/PROTOCOL.md "Repairs in a tree" ---------------------------

TREE_RUNS = [(16, 0.01, s) for s in (1, 2, 3)] + [(64, 0.001, s) for s in (1, 2, 3)]


@pytest.mark.parametrize("W,loss,seed", TREE_RUNS)
def test_tree_loss_costs_at_most_two_retransmissions_per_drop(W, loss, seed):
    """A tree of 4 leaves on 100 Gbit/s links under per-hop loss: exact,
    and at most two retransmissions per dropped frame.  Before the leaf
    sent its loss reports up and resent a partial sum overtaken by later
    results, the workers of every other leaf resent a chunk that waited on
    one leaf's repair, or on a root result lost for every leaf, at their
    turns: 2.8-5.4 retransmissions per drop at W = 64 and 0.1 % loss
    (seeds 1-5), 1.4-2.3 at W = 16 and 1 % (seeds 1-8).  No frame is
    counted bad: the root's loss reports reach every leaf through its
    group, and the leaves a report does not name take it as a STATUS
    (docs/PROTOCOL.md "Loss reports"; before, dozens to hundreds of them
    per allreduce were counted as `bad_worker`)."""
    grads = _grads(W, 1 << 18, seed=5)
    with Cluster(workers=W, leaves=4, link_gbps=100, loss=loss, seed=seed) as cl:
        res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
    _check_exact(res, grads)
    lost = res.stats["fabric"]["dropped_loss"]
    retrans = sum(w["retransmissions"] for w in res.stats["workers"])
    assert lost > 100
    assert retrans <= 2 * lost, (retrans, lost)
    engine = res.stats["engine"]
    assert engine["bad_worker"] == 0, engine["bad_worker"]
    assert engine["up_status"] > 0


TAIL_RUNS = [(16, 100.0, 2.1), (64, 1.0, 1.27)]


@pytest.mark.parametrize("W,gbps,bound", TAIL_RUNS)
def test_a_steps_tail_waits_neither_turns_nor_other_chunks_backoff(W, gbps, bound):
    """docs/PROTOCOL.md Part 3, "The tail of a step".  Once a worker has
    sent every chunk of its step, a chunk a STATUS showed present waits
    its own timeout without a turn, a chunk overtaken below a leaf at most
    one turn, and no chunk's timeout is the aggregator's backed off by
    other chunks' expiries.  A tree of 4 leaves, 2^18 floats, 1 % loss,
    seeds 1-6: exact, at most two retransmissions per drop, and the median
    time over the loss-free time within `bound`.  Before these rules the
    last workers of a run each waited 94-122 us for one repair where a
    round trip took 8-21 us: medians 2.22x (W = 16, 100 Gbit/s) and 1.34x
    (W = 64, 1 Gbit/s); with them 1.92x and 1.20x."""
    grads = _grads(W, 1 << 18, seed=5)
    with Cluster(workers=W, leaves=4, link_gbps=gbps, seed=1) as cl:
        clean = cl.allreduce(grads, method="dense", block_elements=BLOCK).stats["virtual_time"]
    ratios = []
    for seed in range(1, 7):
        with Cluster(workers=W, leaves=4, link_gbps=gbps, loss=0.01, seed=seed) as cl:
            res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
        _check_exact(res, grads)
        lost = res.stats["fabric"]["dropped_loss"]
        assert lost > 100
        assert sum(w["retransmissions"] for w in res.stats["workers"]) <= 2 * lost
        ratios.append(res.stats["virtual_time"] / clean)
    ratios.sort()
    median = (ratios[2] + ratios[3]) / 2
    assert median <= bound, ratios


def _w256_tail_ratios(loss, min_lost, **shape):
    """W = 256 (``shape``: aggregators=K or leaves=L), 2^18 dense floats in
    blocks of 4096, 100 Gbit/s, seeds 1-4 at ``loss``: each run exact,
    with more than ``min_lost`` drops and at most two retransmissions per
    drop; returns {seed: time over the loss-free time}."""
    W = 256
    grads = _grads(W, 1 << 18, seed=5)
    with Cluster(workers=W, link_gbps=100, seed=1, **shape) as cl:
        clean = cl.allreduce(grads, method="dense", block_elements=4096).stats["virtual_time"]
    ratios = {}
    for seed in range(1, 5):
        with Cluster(workers=W, link_gbps=100, loss=loss, seed=seed, **shape) as cl:
            res = cl.allreduce(grads, method="dense", block_elements=4096)
        _check_exact(res, grads, block=4096)
        lost = res.stats["fabric"]["dropped_loss"]
        assert lost > min_lost
        assert sum(w["retransmissions"] for w in res.stats["workers"]) <= 2 * lost
        ratios[seed] = res.stats["virtual_time"] / clean
    return ratios


def test_a_steps_tail_waits_at_most_one_turn_for_a_lost_result():
    """docs/PROTOCOL.md Part 3, "The tail of a step", rule 4.  A worker
    whose own result of a step's last chunks is lost is the only one that
    asks for it; in the tail its timer waits its timeout and at most one
    turn, not its rank's two.  W = 256 over 16 aggregators, 2^18 floats,
    blocks of 4096, 100 Gbit/s, 0.1 % loss, seeds 1-4: exact, at most two
    retransmissions per drop, and every run within 1.3x the loss-free
    time.  With two turns the same runs took 1.35-1.56x; with one,
    1.24-1.29x."""
    ratios = _w256_tail_ratios(0.001, 20, aggregators=16)
    assert max(ratios.values()) <= 1.3, ratios


def test_below_a_leaf_a_tail_chunks_first_timeout_is_a_few_round_trips():
    """docs/PROTOCOL.md Part 3, "The tail of a step", rule 5.  Below a tree
    leaf, a chunk still open in the step's tail times out first after at
    most max(rto_min, 3 Rmin), where its RTO carried the root's queue, and
    then doubles its own timer as before.  W = 256 over 16 leaves, 2^18
    floats, blocks of 4096, 100 Gbit/s, 1 % loss, seeds 1-4: exact, at
    most two retransmissions per drop, every run within 1.7x the
    loss-free time.  Without the rule the same runs took 1.58-1.94x;
    with it, 1.58-1.68x."""
    ratios = _w256_tail_ratios(0.01, 1000, leaves=16)
    assert max(ratios.values()) <= 1.7, ratios


def test_a_lost_first_copy_does_not_hold_the_tree_for_the_leafs_first_holdoff():
    """docs/PROTOCOL.md "Repairs in a tree", the hold-off: before a leaf
    has measured its root's answer time, a worker's first ask of a set
    sent up once sends it up again at once.  Before, a leaf whose first
    partial sum of the run was lost held every worker for up_rto_ns / 2
    (0.5 ms: one chunk in flight, so no loss report; the upward timer 1
    ms): W = 16 over 4 leaves, 2^16 floats, 100 Gbit/s, 1 % loss, seed 8
    took 587 us more than the 60 us loss-free run.  Seeds 1-20: exact,
    and no run takes the half up_rto_ns more than the loss-free one."""
    grads = _grads(16, 1 << 16, seed=5)
    with Cluster(workers=16, leaves=4, link_gbps=100, seed=1) as cl:
        clean = cl.allreduce(grads, method="dense", block_elements=BLOCK).stats["virtual_time"]
    extra = {}
    for seed in range(1, 21):
        with Cluster(workers=16, leaves=4, link_gbps=100, loss=0.01, seed=seed) as cl:
            res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
        _check_exact(res, grads)
        extra[seed] = res.stats["virtual_time"] - clean
    assert max(extra.values()) < 0.5e-3, extra


def test_tree_leaves_time_their_upward_frames_by_the_round_trip_to_the_root():
    """256 workers under 16 leaves, every link (the aggregators' too) at
    1 Gbit/s, loss-free: the root's queue of 16 leaves x 64 sets holds a
    partial sum's result for several ms, beyond the leaves' 1 ms upward
    timeout.  With a fixed timeout most sets went up several times and
    the root answered every copy with its result again (`homagg bench
    scale --workers 256 --leaves W/16 --link-gbps 1`, seed 3: 96,421
    results sent for 16,400 partial sums, 846 ms of virtual time); the
    upward timeout now follows the measured round trip (docs/PROTOCOL.md
    "Repairs in a tree"), so the links carry each sum about once (165 ms
    there, 156 ms here with about 1 % of the sums sent again, at S = 16,
    the default before a tree's slots came from its senders per
    aggregator; at 128 the same time with 2.1 % sent again)."""
    W, L = 256, 16
    grads = _grads(W, 1 << 18, seed=5)
    with Cluster(workers=W, leaves=L, link_gbps=1.0, agg_link_gbps=1.0, seed=3, slots=16) as cl:
        res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
        eng = [cl.aggregator_counters(k)["engine"] for k in range(L + 1)]
    _check_exact(res, grads)
    sent = sum(c["up_sent"] for c in eng[:L])
    resent = sum(c["up_retransmissions"] for c in eng[:L])
    assert resent <= 0.02 * sent, (resent, sent)
    assert eng[L]["replays"] <= 0.02 * sent, eng[L]["replays"]
    # 16 MB into each aggregator link at 1 Gbit/s is 134 ms
    assert res.stats["virtual_time"] < 0.3, res.stats["virtual_time"]


def test_a_trees_default_slots_come_from_the_senders_of_an_aggregator():
    """A tree's aggregator hears at most max(ceil(W / L), L) senders, so
    the NIC model's default S comes from that (docs/PROTOCOL.md "A tree's
    slots in the NIC model"), not from default_slots(256), which gave 16,
    a window of 1.4 us at 100 Gbit/s that every repair held: at 1 % loss
    2^16 floats took 21-35 ms with it (seeds 1-4; 0.17 ms loss-free).
    With the pipe, 16 senders get the tree's full window, 256 slots (the
    next test).  A flat job of as many workers gets pipe_slots(W)."""
    from homagg.protocol import pipe_slots, tree_pipe_slots

    W, L = 256, 16
    with Cluster(workers=W, leaves=L, link_gbps=100, loss=0.01, seed=2) as cl:
        assert (cl.job.slots, cl.job.pipe_max) == tree_pipe_slots(W, L) == (256, 128)
        grads = _grads(W, 1 << 16, seed=1)
        res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
    _check_exact(res, grads)
    assert res.stats["virtual_time"] < 5e-3, res.stats["virtual_time"]
    with Cluster(workers=W, aggregators=16) as cl:
        assert (cl.job.slots, cl.job.pipe_max) == pipe_slots(W) == (32, 8)
    with Cluster(workers=16, leaves=4) as cl:  # 4 senders: 256 within half the ring
        assert (cl.job.slots, cl.job.pipe_max) == tree_pipe_slots(16, 4) == (256, 0)


def test_a_tree_takes_its_full_window_with_a_capped_pipe():
    """docs/PROTOCOL.md Part 3, "A tree's full window, in the NIC model":
    W = 64 over 4 leaves (16 senders per aggregator) gets 256 slots, not
    the 128 of the pipe's half-ring rule, with its workers' pipe capped at
    128, half a leaf's ring; the ring check counts the whole window, so a
    second job finds no slot left and is refused naming the frames held.
    At 100 Gbit/s and 1 % loss (2^20 dense floats, seed 1) the window of
    128 chunks, about 50 us of the loss-free pace, was held by repairs
    that cross the root: 1.77x the loss-free time, now 1.30x (seeds 1-3:
    1.70-1.78x -> 1.29-1.32x; the loss-free time is the same)."""
    from homagg.protocol import tree_pipe_slots

    W, L = 64, 4
    assert tree_pipe_slots(W, L) == (256, 128)
    grads = _grads(W, 1 << 20, seed=7)
    with Cluster(workers=W, leaves=L, link_gbps=100, seed=1) as cl:
        assert (cl.job.slots, cl.job.pipe_max, cl.job.ring_slots) == (256, 128, 256)
        clean = cl.allreduce(grads, method="dense", block_elements=BLOCK).stats["virtual_time"]
        with pytest.raises(OutOfRange, match="the 4096 held by the jobs already on it"):
            cl.add_job(workers=W)
    times = {}
    for slots in (128, None):
        with Cluster(workers=W, leaves=L, link_gbps=100, loss=0.01, seed=1, slots=slots) as cl:
            assert cl.job.pipe_max == (0 if slots else 128)
            res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
            limits = [cl.job.worker_aggregator_stats(w, 0)["pipe_limit"] for w in range(W)]
        _check_exact(res, grads)
        lost = res.stats["fabric"]["dropped_loss"]
        assert lost > 1000
        assert sum(w["retransmissions"] for w in res.stats["workers"]) <= 2 * lost
        assert res.stats["fabric"]["rx_ring_overflow"] == 0
        assert 4 <= min(limits) and max(limits) <= (slots or 128), limits
        times[slots] = res.stats["virtual_time"] / clean
    assert times[None] < times[128], times
    assert times[None] <= 1.5, times


def test_a_flat_job_beyond_128_workers_caps_its_pipe_and_holds_32_slots():
    """docs/PROTOCOL.md Part 3, "Slots beyond the ring's share, in the NIC
    model": beyond W = 128 a flat job whose workers bound their pipe gets
    32 slots, its pipe capped at half the ring (8 at W = 256), and the
    ring check counts W x 8 frames, so a second such job still fits and a
    third is refused naming the frames the first two hold.  The cap holds
    from the pipe's start to the end of an allreduce; a cap below the
    pipe's least bound of 4 is refused by the client."""
    from homagg.bindings import sim as sim_b
    from homagg.protocol import pipe_slots

    assert [pipe_slots(W) for W in (4, 16, 64, 128, 129, 256)] == [
        (256, 0),
        (128, 0),
        (64, 0),
        (32, 0),
        (32, 15),
        (32, 8),
    ]
    W, K = 256, 4
    with Cluster(workers=W, aggregators=K, link_gbps=100, loss=0.01, seed=4) as cl:
        assert (cl.job.slots, cl.job.pipe_max, cl.job.ring_slots) == (32, 8, 8)
        for w in (0, W - 1):
            for k in range(K):  # the start, 32 / K
                assert cl.job.worker_aggregator_stats(w, k)["pipe_limit"] == 8
        grads = _grads(W, 1 << 14, seed=2)
        res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
        _check_exact(res, grads)
        assert res.stats["fabric"]["rx_ring_overflow"] == 0
        limits = [
            cl.job.worker_aggregator_stats(w, k)["pipe_limit"] for w in range(W) for k in range(K)
        ]
        assert 4 <= min(limits) and max(limits) <= 8, (min(limits), max(limits))
        second = cl.add_job(workers=W)
        assert (second.slots, second.pipe_max) == (32, 8)  # 2 x 2048 frames
        with pytest.raises(OutOfRange, match="with the 4096 held .*job 0: 2048, job 1: 2048"):
            cl.add_job(workers=W)
    # slots the user sets, and a job without the pipe, keep W x S
    with pytest.raises(OutOfRange, match="256 workers x 32 slots = 8192 frames"):
        Cluster(workers=W, aggregators=K, slots=32)
    with Cluster(workers=W, aggregators=K, pipe_gain=0) as cl:
        assert (cl.job.slots, cl.job.pipe_max) == (16, 0)
    s = sim_b.sim_create()
    try:
        with pytest.raises(InvalidArgument, match="invalid argument"):
            sim_b.sim_add_job(s, 2, slots=64, pipe_gain_pct=200, pipe_max=3)
        # a cap below the pipe's start of 8 holds it from the start
        job = sim_b.sim_add_job(s, 2, slots=64, pipe_gain_pct=200, pipe_max=5)
        assert sim_b.sim_worker_agg_stats(s, job, 1, 0)["pipe_limit"] == 5
    finally:
        sim_b.sim_destroy(s)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_tree_repairs_do_not_wait_for_the_leaves_upward_timer(seed):
    """With a 0.2 s upward timeout at the leaves (its hold-off for the
    workers' resends is half of it until the leaf has timed the root's
    answers), a lost partial sum or a root result lost on the way down
    that waited for the timer or the hold-off would take the allreduce
    past 0.1 s.  The leaf resends a partial sum that three results of
    sets sent up after it overtook, and holds off the workers' resends
    for the root's measured answer time: W = 16, 2^18 floats, 1 % loss
    at 100 Gbit/s (about 450 drops) takes a few ms (0.32-0.79 s before,
    seeds 1-5).  A root result lost at every leaf before any of them had
    an answer of the root still waits the hold-off: the first set, on
    seed 8 of this run."""
    up_rto = 0.2
    grads = _grads(16, 1 << 18, seed=5)
    with Cluster(workers=16, leaves=4, link_gbps=100, loss=0.01, seed=seed, up_rto=up_rto) as cl:
        res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
        leaves = [cl.aggregator_counters(k)["engine"] for k in range(4)]
    _check_exact(res, grads)
    assert res.stats["fabric"]["dropped_loss"] > 100
    assert sum(c["up_retransmissions"] for c in leaves) > 0
    assert res.stats["virtual_time"] < up_rto / 4, res.stats["virtual_time"]
