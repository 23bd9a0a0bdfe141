"""The simulated cluster: the real engine and worker clients over the NIC model.

Exact methods are compared bit for bit with the numpy oracle of the
fixed-point contract (tests/reference.py), under loss,
duplication, reordering and all of them at once; nc is compared with the
same allreduce done codec-level (the C codec and the aggregation kernels
called directly, no network), which uses the same seeded streams.  Also: two jobs on one engine, hostile frames at the aggregator,
and a worker that dies mid-allreduce.
"""

import errno
import zlib

import numpy as np
import pytest

from homagg._native import ffi, lib
from homagg.errors import InvalidArgument, PeerRestarted, PeerTimeout
from homagg.sim import Cluster
from sim_rig import BLOCK, assert_bits_equal, check_result, make_grads

pytestmark = pytest.mark.sanitize

EXACT = ("dense", "blocks", "lhc", "union", "auto")


FAULTS = {
    "clean": {},
    "loss0.1%": {"loss": 0.001},
    "loss1%": {"loss": 0.01},
    "loss10%": {"loss": 0.1},
    "dup1%": {"duplicate": 0.01},
    "reorder": {"reorder": 0.1},
    "all": {"loss": 0.02, "duplicate": 0.02, "reorder": 0.1},
}


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("method", EXACT)
def test_exact_under_faults(method, fault):
    # enough frames that 1% duplication duplicates some for every method
    # (union sends the fewest); a seed stable across runs
    grads = make_grads(4, 30000, seed=zlib.crc32(f"{method} {fault}".encode()) % 1000)
    with Cluster(workers=4, seed=7, slots=16, **FAULTS[fault]) as cl:
        res = cl.allreduce(grads, method=method, block_elements=BLOCK)
        check_result(res, grads)
        fab = res.stats["fabric"]
        per = res.stats["workers"]
        retrans = sum(w["retransmissions"] for w in per)
        if fault == "clean":
            assert retrans == 0
            assert fab["dropped_loss"] == 0
            assert res.stats["engine"]["duplicates"] == 0
        if fab["dropped_loss"]:
            # Anything lost can only have been recovered by retransmission.
            assert retrans > 0
        if FAULTS[fault].get("loss", 0) >= 0.02:
            assert fab["dropped_loss"] > 0 and retrans > 0
        if FAULTS[fault].get("duplicate", 0) > 0:
            assert fab["duplicated"] > 0
        if FAULTS[fault].get("reorder", 0) > 0:
            assert fab["reordered"] > 0
        if method == "auto":
            assert res.stats["method"] in ("dense", "blocks", "union")
        else:
            assert res.stats["method"] == method
        assert res.stats["virtual_time"] > 0


@pytest.mark.parametrize("multicast", [True, False])
def test_unicast_and_multicast_results(multicast):
    grads = make_grads(3, 5000, seed=3)
    with Cluster(workers=3, multicast=multicast, loss=0.01, seed=2) as cl:
        res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
        check_result(res, grads)


def test_lhc_fallback_is_exact():
    grads = make_grads(4, 8000, density=0.3, seed=11)
    with Cluster(workers=4, loss=0.01, seed=5) as cl:
        res = cl.allreduce(
            grads, method="lhc", block_elements=BLOCK, sketch_cells_per_candidate=0.6
        )
        check_result(res, grads)
        w0 = res.stats["workers"][0]
        assert w0["stalled_blocks"] > 0
        assert w0["bytes_sent"]["fallback"] > 0


def _nc_codec_level(grads, block, seed):
    """nc without a network: every worker's codes, MAX8, NC8, decode."""
    W, n = len(grads), grads[0].size
    ps = []
    for w in range(W):
        p = ffi.new("struct hg_params *", {"block": block, "workers": W, "worker": w, "seed": seed})
        ps.append(p)
    nb = lib.hg_nblocks(ps[0], n)
    gcodes = np.full(nb, -128, np.int8)
    for w, g in enumerate(grads):
        codes = np.empty(nb, np.int8)
        assert (
            lib.hg_exp_encode(
                ps[w],
                ffi.from_buffer("float[]", g),
                n,
                ffi.from_buffer("int8_t[]", codes),
                ffi.NULL,
            )
            == 0
        )
        gcodes = np.maximum(gcodes, codes)
    top = lib.hg_nc_top(ps[0])
    acc = np.zeros(4 * n, np.uint8)
    for w, g in enumerate(grads):
        codes = np.empty(n, np.uint8)
        assert (
            lib.hg_nc_encode(
                ps[w],
                ffi.from_buffer("float[]", g),
                n,
                ffi.from_buffer("int8_t[]", gcodes),
                ffi.from_buffer("uint8_t[]", codes),
            )
            == 0
        )
        assert (
            lib.hg_aggregate(
                lib.HG_OP_NC8,
                ffi.from_buffer("uint8_t[]", acc),
                ffi.from_buffer("uint8_t[]", codes),
                n,
                top,
            )
            == 0
        )
    y = np.empty(n, np.float32)
    assert (
        lib.hg_dequantize(
            ps[0],
            ffi.from_buffer("uint8_t[]", acc),
            n,
            ffi.from_buffer("int8_t[]", gcodes),
            0,
            ffi.from_buffer("float[]", y),
        )
        == 0
    )
    return y


def test_nc_matches_codec_level_allreduce():
    grads = make_grads(4, 6000, density=0.5, seed=4)
    with Cluster(workers=4, loss=0.02, duplicate=0.01, reorder=0.05, seed=9) as cl:
        res = cl.allreduce(grads, method="nc", block_elements=BLOCK, seed=1234)
    assert res.stats["method"] == "nc"
    assert_bits_equal(res.sum, _nc_codec_level(grads, BLOCK, 1234))
    for out in res.outputs:
        assert_bits_equal(out, res.sum)
    # Lossy but unbiased-ish: close to the exact sum in aggregate.
    exact = np.sum(np.stack(grads).astype(np.float64), axis=0)
    assert abs(np.sum(res.sum) - np.sum(exact)) < 0.05 * np.sum(np.abs(exact)) + 1e-3


def test_successive_allreduces_continue_the_sequence():
    with Cluster(workers=3, loss=0.02, seed=1, slots=8) as cl:
        seqs = []
        for i, method in enumerate(["dense", "lhc", "blocks", "auto", "dense"]):
            grads = make_grads(3, 3000 + 500 * i, seed=20 + i)
            res = cl.allreduce(grads, method=method, block_elements=BLOCK)
            check_result(res, grads)
            st = res.stats["workers"]
            assert len({w["next_seq"] for w in st}) == 1  # every worker agrees
            seqs.append(st[0]["next_seq"])
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


@pytest.mark.parametrize("groups", [1, 0])
def test_candidate_lists_kept_across_allreduces_stay_exact(groups):
    # a worker keeps its lhc candidate list from one allreduce to the next
    # (codec_pvt.h, hg_lhc_scratch): longer, shorter and longer again,
    # sparse and dense, lhc and union, one block group or several at once
    sizes = [(40000, 0.6), (3000, 0.05), (60000, 0.9), (500, 1.0), (60000, 0.01)]
    with Cluster(workers=3, loss=0.01, seed=5, slots=8, pipeline_groups=groups) as cl:
        for i, (n, density) in enumerate(sizes):
            for method in ("union", "lhc"):
                grads = make_grads(3, n, density=density, seed=40 + i)
                check_result(cl.allreduce(grads, method=method, block_elements=BLOCK), grads)


def test_empty_and_zero_tensors():
    with Cluster(workers=2) as cl:
        res = cl.allreduce([np.zeros(0, np.float32)] * 2, method="lhc", block_elements=BLOCK)
        assert res.sum.size == 0
        zeros = [np.zeros(1000, np.float32), np.zeros(1000, np.float32)]
        for m in ("dense", "blocks", "lhc", "nc", "auto"):
            res = cl.allreduce(zeros, method=m, block_elements=BLOCK)
            assert_bits_equal(res.sum, np.zeros(1000, np.float32))


def test_single_worker():
    grads = make_grads(1, 2000, seed=8)
    with Cluster(workers=1, loss=0.05, seed=3) as cl:
        check_result(cl.allreduce(grads, method="lhc", block_elements=BLOCK), grads)


def test_two_jobs_interleaved_and_foreign_token_dropped():
    with Cluster(workers=3, loss=0.01, seed=12, slots=8) as cl:
        job_a = cl.job
        job_b = cl.add_job(workers=5, slots=12)
        ga = make_grads(3, 7000, seed=30)
        gb = make_grads(5, 5000, seed=31)
        before = cl.engine_counters()
        # A frame for job B carrying job A's token: must change nothing.
        cl.inject(
            cl.build_frame(
                job_b, token=job_a.token, seq=0, slot=0, worker=0, payload=b"\x00\x00\x7f\xff" * 4
            )
        )
        ra, rb = cl.allreduce_many(
            [
                (job_a, ga, "lhc", {"block_elements": BLOCK}),
                (job_b, gb, "dense", {"block_elements": BLOCK}),
            ]
        )
        check_result(ra, ga)
        check_result(rb, gb)
        after = cl.engine_counters()
        assert after["bad_token"] - before["bad_token"] == 1
        # Both jobs' chunks were in flight in the same virtual time window.
        assert ra.stats["virtual_time"] == rb.stats["virtual_time"]
        assert ra.stats["workers"][0]["chunks"] > 0 and rb.stats["workers"][0]["chunks"] > 0
        # And a job can still run alone afterwards.
        check_result(job_b.allreduce(gb, "blocks", block_elements=BLOCK), gb)


def _hostile_frames(cl, job):
    W, S = job.workers, job.slots
    good = dict(op=lib.HG_OP_SUM32, seq=5, slot=5 % S, worker=0)
    payload = b"\x01\x02\x03\x04" * 4
    f = {}
    full = cl.build_frame(job, payload=payload, **good)
    f["truncated"] = full[: 42 + 10]
    f["bad_version"] = cl.build_frame(job, payload=payload, version=7, **good)
    f["unknown_job"] = cl.build_frame(job, payload=payload, job=0xDEAD, **good)
    f["bad_token"] = cl.build_frame(job, payload=payload, token=job.token ^ 0x5555, **good)
    f["bad_worker"] = cl.build_frame(job, payload=payload, **{**good, "worker": W})
    f["bad_slot"] = cl.build_frame(job, payload=payload, **{**good, "slot": S})
    f["bad_lanes"] = cl.build_frame(job, payload=payload, lanes=3, **good)
    f["bad_op"] = cl.build_frame(job, payload=payload, **{**good, "op": 9})
    f["bad_flags"] = cl.build_frame(job, payload=payload, flags=lib.HG_FLAG_RESULT, **good)
    f["bad_shard"] = cl.build_frame(job, payload=payload, shard=1, **good)
    f["bad_mac"] = cl.build_frame(job, payload=payload, flags=lib.HG_FLAG_AUTH, **good)
    f["incarnation_zero"] = cl.build_frame(job, payload=payload, incarnation=0, **good)
    ones = bytearray(full)
    ones[42 : 42 + 32] = b"\xff" * 32
    f["all_ones"] = bytes(ones)
    return f


def test_hostile_frames_are_dropped_and_counted():
    grads = make_grads(4, 9000, seed=40)
    with Cluster(workers=4, seed=13, slots=8) as cl:
        frames = _hostile_frames(cl, cl.job)
        before = cl.engine_counters()
        for fr in frames.values():
            cl.inject(fr)
        res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
        check_result(res, grads)
        after = cl.engine_counters()
        delta = {k: after[k] - before[k] for k in after}
        for reason in (
            "truncated",
            "bad_version",
            "unknown_job",
            "bad_token",
            "bad_worker",
            "bad_slot",
            "bad_lanes",
            "bad_op",
            "bad_flags",
            "bad_shard",
            "bad_mac",
        ):
            assert delta[reason] >= 1, (reason, delta)
        drops = sum(
            v
            for k, v in delta.items()
            if k
            not in (
                "received",
                "summed",
                "completed",
                "results_sent",
                "replays",
                "status_sent",
                "status_repeats",
                "duplicates",
            )
        )
        assert drops == len(frames)
        # Nothing hostile was summed: exactly one contribution per worker and chunk.
        chunks = res.stats["workers"][0]["chunks"]
        assert delta["summed"] == 4 * chunks
        assert delta["completed"] == chunks


def test_dead_worker_is_named():
    grads = make_grads(4, 12000, seed=50)
    timeout = 0.05
    with Cluster(workers=4, seed=3, timeout=timeout, slots=8) as cl:
        cl.kill_worker(2, after_packets=5)
        with pytest.raises(PeerTimeout) as ei:
            cl.allreduce(grads, method="dense", block_elements=BLOCK)
        exc = ei.value
        assert "missing worker 2" in str(exc)
        live = [f for f in exc.failures if f.worker != 2]
        assert len(live) == 3
        for f in live:
            assert "missing worker 2" in str(f), str(f)
            assert "workers 0,1,3 present" in str(f), str(f)
        # They gave up within the configured deadline (virtual time).
        assert exc.stats["virtual_time"] <= 2 * timeout
        assert exc.stats["virtual_time"] >= timeout


def test_stalled_window_is_retransmitted_whole():
    """A dead peer stalls the window: once a chunk times out again, every
    open chunk is sent again (not only those whose own timer expired under
    backoff), so each gets a STATUS and the error names the missing worker.
    Timeouts as on kernel UDP (rto_min 20 ms, rto_max 100 ms)."""
    grads = make_grads(4, 400_000, seed=51)
    slots = 64
    with Cluster(
        workers=4, seed=3, timeout=0.6, slots=slots, rto=5e-3, rto_min=20e-3, rto_max=100e-3
    ) as cl:
        cl.kill_worker(2, after_packets=300)
        with pytest.raises(PeerTimeout) as ei:
            cl.allreduce(grads, method="dense", block_elements=BLOCK)
    exc = ei.value
    for f in exc.failures:
        if f.worker != 2:
            assert "workers 0,1,3 present, missing worker 2" in str(f), str(f)
    for w, st in enumerate(exc.stats["workers"]):
        if w == 2:
            continue
        open_chunks = st["packets_sent"] - st["retransmissions"] - 300
        assert open_chunks == slots, st
        assert st["window_retransmissions"] > 0, st
        assert st["retransmissions"] >= open_chunks, st


def test_no_aggregator_answer_names_the_aggregator():
    grads = make_grads(2, 1000, seed=60)
    with Cluster(workers=2, seed=3, timeout=0.02, loss=0.999999) as cl:
        with pytest.raises(PeerTimeout) as ei:
            cl.allreduce(grads, method="dense", block_elements=BLOCK)
        assert "no answer from aggregator 10.0.0.1:" in str(ei.value)


def test_bad_arguments():
    with Cluster(workers=2) as cl:
        with pytest.raises(InvalidArgument):
            cl.allreduce([np.zeros(10, np.float32)], method="dense")
        with pytest.raises(InvalidArgument):
            cl.allreduce([np.zeros(10, np.float32)] * 2, method="nope")
        with pytest.raises(InvalidArgument):
            cl.allreduce([np.zeros(10, np.float32)] * 2, method="dense", colour="blue")
        bad = [np.zeros(10, np.float32), np.full(10, np.nan, np.float32)]
        with pytest.raises(Exception):
            cl.allreduce(bad, method="dense")
    with pytest.raises(InvalidArgument):
        Cluster(workers=2, loss=1.5)


# ---- retransmission timeout under a bottleneck ------------------------------
#
# 4 workers on 1 Gbit/s links, a window of 64 chunks: a full window's
# results take 64 chunk times at the bottleneck to come back, far more than
# the initial timeout (200 us).  The timeout must adapt (RFC 6298 with
# Karn's rule), or every chunk is sent several times.


def _dense_payload_bytes(n, block):
    """What one worker must send for a dense allreduce: 1 exponent byte per
    block (MAX8) and one int32 lane per element (SUM32)."""
    return (n + block - 1) // block + 4 * n


@pytest.mark.parametrize("agg_link_gbps", [1.0, None], ids=["agg-bottleneck", "agg-default"])
def test_bottleneck_without_faults_sends_almost_nothing_twice(agg_link_gbps):
    W, n = 4, 1 << 20
    rng = np.random.default_rng(5)
    grads = [rng.standard_normal(n).astype(np.float32) for _ in range(W)]
    # the whole window in the queue (no pipe bound): what the estimator must learn
    with Cluster(
        workers=W, link_gbps=1.0, agg_link_gbps=agg_link_gbps, slots=64, seed=1, pipe_gain=0
    ) as cl:
        res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
    check_result(res, grads)
    per = res.stats["workers"]
    packets = sum(w["packets_sent"] for w in per)
    retrans = sum(w["retransmissions"] for w in per)
    assert retrans < 0.05 * packets, (retrans, packets)
    want = _dense_payload_bytes(n, BLOCK)
    assert sum(w["timeouts"] for w in per) == 0
    assert sum(w["fast_retransmissions"] for w in per) == 0
    for w in per:
        sent = sum(w["bytes_sent"].values())
        assert want <= sent <= 1.03 * want, (sent, want)
        # The estimator learned the queueing of a full window: well above
        # the initial timeout, and the timeout above the smoothed RTT.
        assert w["rtt_samples"] > 0
        assert w["srtt_ns"] > 200_000
        assert w["rto_ns"] > w["srtt_ns"]


def test_bottleneck_with_loss_is_exact_and_retransmits_per_loss():
    W, n = 4, 1 << 18
    rng = np.random.default_rng(6)
    grads = [rng.standard_normal(n).astype(np.float32) for _ in range(W)]
    with Cluster(workers=W, link_gbps=1.0, agg_link_gbps=1.0, slots=64, loss=0.01, seed=2) as cl:
        res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
    check_result(res, grads)
    per = res.stats["workers"]
    packets = sum(w["packets_sent"] for w in per)
    retrans = sum(w["retransmissions"] for w in per)
    lost = res.stats["fabric"]["dropped_loss"]
    assert lost > 0
    # Each lost frame costs its sender (or the worker missing a result) a
    # retransmission; the workers take turns on a gap, and the first one's
    # STATUS reply (to the group) tells the one missing, so a lost
    # contribution costs about 2 - 1/W retransmissions, not W.
    assert lost // 2 <= retrans < 2 * lost, (retrans, lost)
    assert retrans < 0.1 * packets
    fast = sum(w["fast_retransmissions"] for w in per)
    timeouts = sum(w["timeouts"] for w in per)
    assert fast > timeouts, (fast, timeouts)
    window = sum(w["window_retransmissions"] for w in per)
    probes = sum(w["start_probes"] for w in per)
    assert retrans == fast + timeouts + window + probes
    # Loss is per hop here, results too: a worker's timer can expire while
    # its chunk waits for a peer's repair.  The aggregator's STATUS (its
    # bit set) or a second copy of the result shows such a timeout was
    # spurious.
    spurious = sum(w["spurious_timeouts"] for w in per)
    assert 0 < spurious <= timeouts
    # A floor of a worker's timeout comes only from a spurious timeout
    # (Eifel's adaptation), from the stall its chunk waited through; with
    # loss reports that stall can be too short to teach one.
    for w in per:
        if w["rto_floor_ns"] > 0:
            assert w["spurious_timeouts"] > 0, w
        assert w["rto_ns"] >= min(w["rto_floor_ns"], 50_000_000), w
    assert res.stats["engine"]["summed"] == W * per[0]["chunks"]


def _lossy_and_clean(W, n, seed, **kw):
    """Dense allreduces of the same gradients without loss and at 1% per-hop
    loss (NIC model, 1 Gbit/s links and aggregator link, S = 64), both
    exact: their stats."""
    rng = np.random.default_rng(6)
    grads = [rng.standard_normal(n).astype(np.float32) for _ in range(W)]
    runs = []
    for loss in (0.0, 0.01):
        with Cluster(
            workers=W, link_gbps=1.0, agg_link_gbps=1.0, slots=64, loss=loss, seed=seed, **kw
        ) as cl:
            res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
        check_result(res, grads)
        runs.append(res.stats)
    return runs


def _check_loss_cost(clean, lossy, min_lost, max_ratio):
    """At least min_lost frames dropped, fewer than 2 retransmissions per
    drop, and the lossy virtual time below max_ratio x the loss-free one."""
    lost = lossy["fabric"]["dropped_loss"]
    retrans = sum(w["retransmissions"] for w in lossy["workers"])
    assert lost > min_lost
    assert retrans < 2 * lost, (retrans, lost)
    ratio = lossy["virtual_time"] / clean["virtual_time"]
    assert ratio < max_ratio, (lossy["virtual_time"], clean["virtual_time"])


def test_loss_repairs_do_not_teach_the_stall_floor():
    """Under sustained loss the workers' timers fire while peers repair
    their losses; the floor learns only silences that held the whole
    window (a stall), so it stays below half a loss-free allreduce.  (With
    the floor learnt from each spurious chunk's own delay it climbed to
    0.48 s here, 0.82x the loss-free allreduce; 0.25 s with the silence
    rule, 0.10 s now.)  And a chunk's second expiry resends the whole
    window only when the aggregator has been silent for give_up_ns / 8
    (Stalled window, PROTOCOL.md Part 3): at step starts and during peers'
    long repairs each of the 64 workers resent its window, 24,429 window
    retransmissions here, 11.2 retransmissions per dropped frame and 3.3x
    the loss-free virtual time; now none, 1.9 per drop and 2.7x.  The
    windows are whole queues here (pipe_gain=0): with the pipe's bound
    (PROTOCOL.md Part 3, "The pipe") no timeout of this run is spurious,
    and the floor has nothing to learn."""
    clean, lossy = _lossy_and_clean(64, 1 << 18, seed=2, pipe_gain=0)
    per = lossy["workers"]
    assert all(w["rto_floor_ns"] == 0 for w in clean["workers"])
    assert sum(w["spurious_timeouts"] for w in per) > 0
    floor_s = max(w["rto_floor_ns"] for w in per) / 1e9
    assert 0 < floor_s < clean["virtual_time"] / 2, (floor_s, clean["virtual_time"])
    assert sum(w["window_retransmissions"] for w in per) == 0
    _check_loss_cost(clean, lossy, min_lost=1000, max_ratio=3)


def test_lost_repairs_hold_one_slot_not_the_window():
    """A repair that is lost again holds its slot only: the chunks after it
    go out (Window, PROTOCOL.md Part 3), their results show it lost again,
    and the peers' windows do not stop for a timer at the stall floor.
    W = 16 over K = 2 at 1% per-hop loss took 10.9x the loss-free virtual
    time with 2.01 retransmissions per drop before; 6.6x and 1.53 with
    overdue repairs only holding one slot; 5.2x and 1.62 with every overdue
    chunk holding one slot."""
    clean, lossy = _lossy_and_clean(16, 1 << 20, seed=1, aggregators=2)
    _check_loss_cost(clean, lossy, min_lost=1000, max_ratio=8)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_overdue_chunks_hold_one_slot_not_the_window(seed):
    """A chunk whose answer is a turn overdue holds its slot only, whether
    it waits for its first answer or for a repair (Window, PROTOCOL.md Part
    3): a worker waiting for its turn to resend a lost chunk, or for its
    timer, no longer stops its window, and with it every peer's (they wait
    for its contributions).  W = 4, 2^20 floats, 1% per-hop loss: 0.95-1.45 s of
    virtual time against 0.147 s loss-free (6.5-9.8x) when only overdue
    repairs let the window go on; now 0.18-0.20 s, 1.73-1.75
    retransmissions per drop."""
    clean, lossy = _lossy_and_clean(4, 1 << 20, seed=seed)
    _check_loss_cost(clean, lossy, min_lost=250, max_ratio=2)


def test_reordering_fast_retransmission_sums_each_contribution_once():
    """Frames overtaken by more than DUPTHRESH - 1 others look lost: they
    are resent at once (fast retransmission), the aggregator sees the copy
    as a duplicate and sums every worker's contribution exactly once."""
    W, n = 4, 1 << 16
    grads = make_grads(W, n, density=1.0, seed=71, zero_blocks=False)
    with Cluster(workers=W, link_gbps=1.0, agg_link_gbps=1.0, reorder=0.1, seed=1) as cl:
        res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
    check_result(res, grads)
    per = res.stats["workers"]
    eng = res.stats["engine"]
    assert res.stats["fabric"]["reordered"] > 0 and res.stats["fabric"]["dropped_loss"] == 0
    fast = sum(w["fast_retransmissions"] for w in per)
    assert fast > 0
    assert sum(w["timeouts"] for w in per) == 0
    chunks = per[0]["chunks"]
    assert all(w["chunks"] == chunks for w in per)
    # every chunk completed once, from W contributions each; the resent
    # copies were counted as duplicates, never summed
    assert eng["completed"] == chunks
    assert eng["summed"] == W * chunks
    assert eng["duplicates"] >= fast


def test_aggregator_link_rate():
    W, n = 4, 1 << 16
    grads = make_grads(W, n, density=1.0, seed=70, zero_blocks=False)
    times = {}
    for agg in (1.0, 4.0, None):
        with Cluster(workers=W, link_gbps=1.0, agg_link_gbps=agg, seed=3) as cl:
            assert cl.agg_link_gbps == (agg if agg is not None else 4.0)
            res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
            check_result(res, grads)
            times[agg] = res.stats["virtual_time"]
    # The aggregator's link carries W workers' chunks: at the worker rate
    # it is the bottleneck (about W times slower, virtual time).
    assert times[1.0] > 2 * times[4.0]
    assert times[None] == times[4.0]
    with pytest.raises(InvalidArgument):
        Cluster(workers=2, agg_link_gbps=-1.0)


def test_old_incarnation_frames_are_never_summed():
    """Frames of a worker's earlier life (incarnation below the workers'
    HG_SIM_INCARNATION), for the very chunks the next allreduce uses, are
    dropped: the allreduce stays exact."""
    grads = make_grads(3, 5000, seed=61)
    with Cluster(workers=3, seed=9, slots=8) as cl:
        check_result(cl.allreduce(grads, method="dense", block_elements=BLOCK), grads)
        seq = cl.job.worker_stats(0)["next_seq"]
        chunks_before = cl.job.worker_stats(0)["chunks"]
        old = lib.HG_SIM_INCARNATION - 1
        bogus = np.full(256, 0x01010101, dtype=">i4").tobytes()
        before = cl.engine_counters()
        for w in range(3):
            for k in range(4):
                cl.inject(
                    cl.build_frame(
                        cl.job,
                        payload=bogus,
                        worker=w,
                        seq=seq + k,
                        slot=(seq + k) % 8,
                        incarnation=old,
                        flags=lib.HG_FLAG_SHADOW if (seq + k) // 8 % 2 else 0,
                    )
                )
        res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
        check_result(res, grads)
        delta = {k: v - before[k] for k, v in cl.engine_counters().items()}
        assert delta["old_incarnation"] == 12
        assert delta["summed"] == 3 * (res.stats["workers"][0]["chunks"] - chunks_before)
        assert delta["incarnation_resets"] == 0


def test_aggregator_restart_mid_allreduce_names_both_incarnations():
    grads = make_grads(3, 60000, seed=62)
    with Cluster(workers=3, seed=5, slots=8, timeout=0.2) as cl:
        cl.restart_aggregator(0, after_frames=40, incarnation=2000)
        with pytest.raises(PeerRestarted) as ei:
            cl.allreduce(grads, method="dense", block_elements=BLOCK)
        assert len(ei.value.failures) == 3
        for f in ei.value.failures:
            assert f.code == -errno.ECONNRESET
            assert (
                "aggregator 10.0.0.1:48879 restarted during the allreduce "
                "(incarnation 1000, now 2000)"
            ) in str(f)


def test_aggregator_restart_between_allreduces_is_transparent():
    grads = make_grads(3, 6000, seed=63)
    with Cluster(workers=3, seed=6, slots=8) as cl:
        check_result(cl.allreduce(grads, method="lhc", block_elements=BLOCK), grads)
        cl.restart_aggregator(after_frames=0)
        check_result(cl.allreduce(grads, method="lhc", block_elements=BLOCK), grads)


# ---------------------------------------------------------------- payload sizes
# A job's payload size (docs/PROTOCOL.md Part 2 "Ops, lanes, payload sizes"):
# 1 KB by default, up to 8 KB through NIC ports of MTU 9000 (jumbo frames).
# 2996 is a size no power of two: lanes per chunk 749 (SUM32) and 2996
# (MAX8, OR), so chunk boundaries fall mid-block.


def _chunks(nbytes, payload):
    return (nbytes + payload - 1) // payload


@pytest.mark.parametrize("payload", [1024, 2996, 4096, 8192])
@pytest.mark.parametrize("method", ["dense", "lhc"])
def test_payload_sizes_through_jumbo_nic_ports(payload, method):
    W, n = 4, 3 * 4096 + 77
    grads = make_grads(W, n, density=0.3 if method == "lhc" else 1.0, seed=payload)
    with Cluster(workers=W, payload=payload, mtu=9000, seed=3) as cl:
        res = cl.allreduce(grads, method=method, block_elements=BLOCK)
        fabric = cl.fabric_counters()
    check_result(res, grads)
    eng = res.stats["engine"]
    assert eng["summed"] == W * eng["completed"] and eng["duplicates"] == 0
    assert not any(v for k, v in fabric.items() if "oversize" in k), fabric
    if method == "dense":
        # one MAX8 byte per block, then one int32 lane per element: every
        # chunk as full as the payload allows
        nb = (n + BLOCK - 1) // BLOCK
        assert eng["completed"] == _chunks(nb, payload) + _chunks(4 * n, payload)
    else:
        # every stream (exponents, counts, index, sketch, fallback) cut
        # into full chunks but its last
        sent = res.stats["workers"][0]["bytes_sent"]
        assert sent["sketch"] > payload
        assert eng["completed"] == sum(_chunks(b, payload) for b in sent.values())


def test_jumbo_payload_exact_under_faults():
    W, n = 4, 1 << 15
    grads = make_grads(W, n, density=0.2, seed=9)
    with Cluster(
        workers=W, payload=8192, mtu=9000, loss=0.02, duplicate=0.02, reorder=0.05, seed=11
    ) as cl:
        res = cl.allreduce(grads, method="lhc", block_elements=BLOCK)
    check_result(res, grads)
    assert sum(w["retransmissions"] for w in res.stats["workers"]) > 0


def test_payload_must_fit_the_nic_mtu():
    with pytest.raises(InvalidArgument) as ei:
        Cluster(workers=2, payload=8192, mtu=1500)
    assert "payload 8192 bytes does not fit MTU 1500: at most" in str(ei.value)
    assert "e.g. mtu=9000" in str(ei.value)
    with pytest.raises(InvalidArgument, match="mtu must be 576..9000"):
        Cluster(workers=2, mtu=9216)
    # the largest payload of an MTU of 1500 goes through
    from homagg.worker import max_payload

    grads = make_grads(2, 5000, density=1.0, seed=2)
    with Cluster(workers=2, payload=max_payload(1500), mtu=1500) as cl:
        check_result(cl.allreduce(grads, method="dense", block_elements=BLOCK), grads)


@pytest.mark.parametrize("slots", [8, 64])
def test_window_occupancy_and_full_window_time(slots):
    """flight_ns (the chunks' time in flight, summed) over the run's time is
    the mean window occupancy: at most S per aggregator; behind a 1 Gbit/s
    bottleneck the window fills (window_full_ns > 0) and stays nearly full.
    A window that holds every chunk of the allreduce never waits.  Without
    the pipe's bound (pipe_gain=0), which keeps most of the window out of
    the bottleneck's queue (tests/test_recovery.py, "the pipe")."""
    W, n = 4, 1 << 18
    rng = np.random.default_rng(11)
    grads = [rng.standard_normal(n).astype(np.float32) for _ in range(W)]
    with Cluster(
        workers=W, link_gbps=1.0, agg_link_gbps=1.0, slots=slots, seed=3, pipe_gain=0
    ) as cl:
        res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
    check_result(res, grads)
    span = res.stats["virtual_time"] * 1e9
    for w in res.stats["workers"]:
        assert w["results_received"] == w["chunks"] > slots
        occupancy = w["flight_ns"] / span
        assert slots / 2 < occupancy <= slots, (occupancy, slots)
        assert 0 < w["window_full_ns"] <= span
    # more slots than the allreduce of n/2 has chunks (513), W x S the whole ring
    roomy = 1 << 10
    grads = [g[: n // 2] for g in grads]
    with Cluster(
        workers=W, link_gbps=1.0, agg_link_gbps=1.0, slots=roomy, seed=3, pipe_gain=0
    ) as cl:
        res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
    check_result(res, grads)
    for w in res.stats["workers"]:
        assert w["chunks"] < roomy and w["window_full_ns"] == 0
        assert 0 < w["flight_ns"] <= w["chunks"] * res.stats["virtual_time"] * 1e9


def test_refused_frames_are_sent_later_once():
    """A worker port that refuses most of every burst (a tx ring of 16, as
    a full socket send buffer does): every refused frame goes out at a
    later poll, none is lost or sent twice -- no retransmission, no
    duplicate at the engine, exact.  The whole window of 64 goes out in one
    burst (pipe_gain=0: the pipe's bound would send 8 at first)."""
    W, n = 4, 1 << 18
    rng = np.random.default_rng(12)
    grads = [rng.standard_normal(n).astype(np.float32) for _ in range(W)]
    with Cluster(workers=W, link_gbps=1.0, slots=64, seed=4, worker_tx_ring=16, pipe_gain=0) as cl:
        res = cl.allreduce(grads, method="dense", block_elements=BLOCK)
    check_result(res, grads)
    per = res.stats["workers"]
    assert all(w["tx_refused"] > 0 for w in per), [w["tx_refused"] for w in per]
    assert sum(w["fast_retransmissions"] for w in per) == 0
    assert sum(w["retransmissions"] for w in per) == 0
    assert res.stats["engine"]["duplicates"] == 0


def test_jobs_together_must_fit_the_aggregator_ring():
    """The aggregators' receive ring (4096 frames) bounds the frames in flight
    of all the jobs on them: a job that overflows it, alone or with the jobs
    already added, is refused naming the figures, those jobs and the fix;
    the C call refuses it too (-ERANGE) and a refused job holds nothing."""
    from homagg.bindings import sim as simb
    from homagg.errors import OutOfRange

    assert simb.AGG_RX_RING == 4096
    with pytest.raises(OutOfRange) as ei:
        Cluster(workers=8, slots=1024)
    assert str(ei.value) == (
        "field 'slots': 8 workers x 1024 slots = 8192 frames in flight "
        "towards aggregator 0 exceed its receive ring of 4096 frames: use "
        "at most 512 slots, or a cluster of its own for this job"
    )
    with Cluster(workers=4, slots=512, aggregators=2) as cl:
        cl.add_job(workers=2, slots=512)
        with pytest.raises(OutOfRange) as ei:
            cl.add_job(workers=4, slots=300)
        assert str(ei.value) == (
            "field 'slots': 4 workers x 300 slots = 1200 frames in flight towards aggregator "
            "0, with the 3072 held by the jobs already on it (job 0: 2048, job 1: 1024), make "
            "4272 frames, more than its receive ring of 4096 frames: use at most 256 slots, "
            "or a cluster of its own for this job"
        )
        with pytest.raises(OutOfRange):
            simb.sim_add_job(cl._sim, 4, slots=300)
        # exactly the 1024 frames left fit; then nothing does
        job = cl.add_job(workers=4, slots=256)
        with pytest.raises(OutOfRange, match="with the 4096 held by .*: no slot is left"):
            cl.add_job(workers=1, slots=1)
        with pytest.raises(OutOfRange):
            simb.sim_add_job(cl._sim, 1, slots=1)
        grads = make_grads(4, 3000, seed=40)
        check_result(job.allreduce(grads, "dense", block_elements=BLOCK), grads)
    # a tree: a leaf holds its part of the workers, the root one per leaf
    with Cluster(workers=8, leaves=2, slots=1024) as cl:
        with pytest.raises(
            OutOfRange,
            match="2 workers x 1 slots = 1 frames in flight towards "
            r"aggregator 0, with the 4096 held .*\(job 0: 4096\)",
        ):
            cl.add_job(workers=2, slots=1)
    with Cluster(workers=16, leaves=8, slots=256) as cl:
        cl.add_job(workers=8, slots=256)
        with pytest.raises(OutOfRange, match="towards aggregator 8, with the 4096 held"):
            cl.add_job(workers=8, slots=1)


def test_default_slots_fit_the_aggregator_ring_at_any_size():
    """Without slots=, a job gets the most slots (up to 64) whose W x S fits
    the aggregators' 4096-frame ring: Cluster(workers=256, aggregators=32)
    works (it raised OutOfRange with a fixed 64) and sums exactly, and a job
    added next to others gets what their share of the ring leaves."""
    from homagg import protocol

    for W in (1, 2, 63, 64, 65, 100, 255, 256):
        S = protocol.default_slots(W)
        assert 1 <= S <= 64 and W * S <= 4096 and (S == 64 or W * (S + 1) > 4096), (W, S)
    assert protocol.resolve_slots(None, 256) == protocol.resolve_slots(0, 256) == 16
    # with the workers' pipe (the NIC model's default) up to 256 within half
    # the ring, and never fewer than without it
    for W in (1, 2, 4, 8, 16, 17, 31, 32, 63, 64, 65, 255, 256):
        S, P = protocol.default_slots(W), protocol.default_slots(W, pipe=True)
        assert S <= P <= max(S, 256) and (P == S or 2 * W * P <= 4096), (W, S, P)
    assert [protocol.default_slots(W, pipe=True) for W in (4, 16, 32, 64, 256)] == [
        256,
        128,
        64,
        64,
        16,
    ]
    with Cluster(workers=4) as cl, Cluster(workers=4, pipe_gain=0) as free:
        assert (cl.job.slots, free.job.slots) == (256, 64)
    assert protocol.resolve_slots(100, 256) == 100  # the user's choice is kept
    with pytest.raises(InvalidArgument, match="field 'slots'"):
        protocol.resolve_slots(-1, 4)
    grads = make_grads(256, 700, seed=41)
    with Cluster(workers=256, aggregators=32, seed=3) as cl:
        # beyond W = 128 a flat pipe job gets 32 slots, its pipe capped at
        # half the ring (docs/PROTOCOL.md "Slots beyond the ring's share")
        assert (cl.job.slots, cl.job.pipe_max) == (32, 8)
        check_result(cl.allreduce(grads, "dense", block_elements=BLOCK), grads)
    with Cluster(workers=256, leaves=16, seed=3) as cl:
        # a tree's aggregator hears 16 senders, for which the pipe's rule
        # gives 128 slots; the tree takes its full window of 256 with the
        # workers' pipe capped at half a leaf's ring (docs/PROTOCOL.md "A
        # tree's full window, in the NIC model")
        assert protocol.default_slots(16, pipe=True) == 128
        assert (cl.job.slots, cl.job.pipe_max, cl.job.ring_slots) == (256, 128, 256)
        check_result(cl.allreduce(grads, "dense", block_elements=BLOCK), grads)
    with Cluster(workers=256, leaves=16, seed=3, pipe_gain=0) as cl:
        assert (cl.job.slots, cl.job.pipe_max) == (64, 0)
    with Cluster(workers=32, seed=3) as cl:
        assert cl.job.slots == 64  # 2048 of the ring
        assert cl.add_job(workers=64).slots == 32  # the 2048 frames left


def test_worker_and_job_file_default_slots():
    """homagg.worker.Worker and the job file's registration (what `homagg
    run`, `homagg testbed up` and `homagg up` call) choose the same
    default_slots(W) when the user sets none, and keep a number given."""
    from homagg import protocol
    from homagg.switch import job_file
    from homagg.worker import Worker

    with Worker(1, 2, 0, 256, aggregator=("127.0.0.1", 9), bind=("127.0.0.1", 0), mtu=1500) as w:
        assert w.slots == protocol.default_slots(256) == 16
    with Worker(
        1, 2, 0, 4, aggregator=("127.0.0.1", 9), bind=("127.0.0.1", 0), mtu=1500, slots=8
    ) as w:
        assert w.slots == 8
    asked = []
    fields = job_file.register(
        [asked.append, asked.append], [("10.0.0.1", 1), ("10.0.0.2", 1)], workers=200
    )
    assert [r["slots"] for r in asked] == [20, 20] and fields["slots"] == 20
    asked.clear()
    job_file.register([asked.append], [("10.0.0.1", 1)], workers=200, slots=4)
    assert asked[0]["slots"] == 4
    assert (
        job_file.job_config(
            {"HOMAGG_AGGREGATOR": "10.0.0.1", "HOMAGG_JOB": "1", "HOMAGG_TOKEN": "2"}
        )["slots"]
        == 0
    )  # Worker's default
