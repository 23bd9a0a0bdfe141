"""The aggregation engine through the bindings and the in-memory port.

numpy is the oracle of every sum; hostile frames must be dropped under their
counter and change nothing in sums running at the same time.
"""

import errno

import numpy as np
import pytest

from homagg import kernels
from homagg.engine import (
    FLAG_AUTH,
    FLAG_LOSS,
    FLAG_RESULT,
    FLAG_RETRANS,
    FLAG_SHADOW,
    FLAG_STATUS,
    UDP_PORT,
    WORKER_ALL,
    Addr,
    Engine,
    MemPort,
    build_frame,
    counter_names,
    parse_frame,
)
from homagg.errors import HomAggError, OutOfRange
from homagg.bindings.wire import PROTOCOL_VERSION

from engine_rig import AGG, EngineRig, frame, waddr
from helpers import be32, from_be32, wrap32

pytestmark = pytest.mark.sanitize

GROUP = "239.1.2.3"
GROUP_INT = (239 << 24) | (1 << 16) | (2 << 8) | 3


class Rig(EngineRig):
    def __init__(
        self,
        workers=4,
        slots=4,
        payload_bytes=1024,
        replicate=False,
        group=0,
        isa="best",
        **port_kw,
    ):
        super().__init__(
            replicate=replicate,
            isa=isa,
            port_kw=port_kw,
            workers=workers,
            slots=slots,
            payload_bytes=payload_bytes,
            group=group,
        )
        self.W, self.S = workers, slots


def contrib(op, rng, lanes):
    if op == "sum32":
        return rng.integers(-(2**31), 2**31, lanes, dtype=np.int64)
    if op == "nc8":
        return rng.integers(0, 256, lanes).astype(np.uint8)
    if op == "or":
        return rng.integers(0, 256, lanes).astype(np.uint8)
    return rng.integers(-128, 128, lanes).astype(np.int8)


def to_payload(op, x):
    return be32(x) if op == "sum32" else np.asarray(x).tobytes()


def expected(op, xs, top):
    if op == "sum32":
        return be32(wrap32(np.sum(xs, axis=0)))
    if op == "or":
        return np.bitwise_or.reduce(np.array(xs), axis=0).tobytes()
    if op == "max8":
        return np.max(np.array(xs), axis=0).astype(np.int8).tobytes()
    acc = kernels.identity("nc8", len(xs[0]))
    for x in xs:
        kernels.aggregate("nc8", acc, np.asarray(x, np.uint8), top=top, isa="portable")
    return acc.tobytes()


@pytest.mark.parametrize(
    "isa", [i for i in ("portable", "avx2", "avx512") if kernels.isa_supported(i)]
)
@pytest.mark.parametrize("op", ["sum32", "or", "max8", "nc8"])
@pytest.mark.parametrize("W", [1, 3, 8])
def test_sum_exact_all_ops(op, W, isa):
    rng = np.random.default_rng(W * 10 + len(op))
    rig = Rig(workers=W, slots=4, isa=isa)
    lanes = {"sum32": 256, "or": 1000, "max8": 77, "nc8": 256}[op]
    top = 29 if op == "nc8" else 0
    for seq in range(6):
        xs = [contrib(op, rng, lanes) for _ in range(W)]
        order = rng.permutation(W)
        out = rig.send(
            *[frame(int(w), op=op, seq=seq, payload=to_payload(op, xs[w]), exp=top) for w in order]
        )
        res = rig.results(out)
        assert len(res) == W  # unicast, one per worker
        assert sorted(r.worker for r in res) == list(range(W))
        for r in res:
            assert r.payload == expected(op, xs, top)
            assert r.seq == seq and r.slot == seq % 4 and r.op == kernels.OPS[op]
            assert r.dst == waddr(r.worker) and r.src == AGG
            assert r.exp == top and bool(r.flags & FLAG_SHADOW) == bool((seq // 4) % 2)
    c = rig.eng.counters()
    assert c["summed"] == 6 * W and c["completed"] == 6 and c["results_sent"] == 6 * W
    assert sum(c[k] for k in counter_names()[8:]) == 0
    rig.no_leak()


def test_duplicates_not_double_counted_and_replay():
    rng = np.random.default_rng(1)
    rig = Rig(workers=3)
    xs = [rng.integers(-1000, 1000, 256) for _ in range(3)]
    f = [frame(w, payload=be32(xs[w])) for w in range(3)]
    out = rig.send(f[0], f[0], f[1], f[1], f[1])
    assert out == []
    c = rig.eng.counters()
    assert c["duplicates"] == 3 and c["summed"] == 2
    out = rig.send(f[2])
    res = rig.results(out)
    assert len(res) == 3 and all(
        from_be32(r.payload).tolist() == (xs[0] + xs[1] + xs[2]).tolist() for r in res
    )
    # A duplicate after completion: the result again, to that worker only.
    out = rig.send(frame(1, payload=be32(xs[1]), flags=FLAG_RETRANS))
    assert len(out) == 1 and out[0].flags & FLAG_RESULT and out[0].worker == 1
    assert out[0].dst == waddr(1)
    assert from_be32(out[0].payload).tolist() == (xs[0] + xs[1] + xs[2]).tolist()
    c = rig.eng.counters()
    assert c["replays"] == 1 and c["duplicates"] == 4 and c["summed"] == 3
    rig.no_leak()


def test_status_bitmap():
    W = 20
    rig = Rig(workers=W, slots=2)
    present = [0, 3, 8, 9, 19]
    pay = be32(np.arange(256))
    rig.send(*[frame(w, seq=1, slots=2, payload=pay) for w in present])
    # A plain duplicate: no answer.
    assert rig.send(frame(3, seq=1, slots=2, payload=pay)) == []
    out = rig.send(frame(8, seq=1, slots=2, payload=pay, flags=FLAG_RETRANS))
    assert len(out) == 1
    st = out[0]
    assert st.flags & FLAG_STATUS and not st.flags & FLAG_RESULT
    assert st.worker == 8 and st.dst == waddr(8) and st.seq == 1 and st.slot == 1
    assert len(st.payload) == 6  # the worker bitmap, then the active bitmap
    bits = [(st.payload[i // 8] >> (i % 8)) & 1 for i in range(W)]
    assert [i for i in range(W) if bits[i]] == present
    assert rig.eng.counters()["status_sent"] == 1
    rig.no_leak()


def test_status_active_bitmap():
    """The STATUS payload's second bitmap (docs/PROTOCOL.md Part 3, "Who is
    missing, and why"): a missing worker is active when the engine accepted
    a frame of it (any chunk, a duplicate included) after the slot's chunk
    opened; one whose latest frame came before, or that was never heard
    from, is not; a new incarnation forgets what the worker sent."""
    W = 5
    rig = Rig(workers=W, slots=2)
    pay = be32(np.arange(256))

    def status(w, seq=1):
        (st,) = rig.send(frame(w, seq=seq, slots=2, payload=pay, flags=FLAG_RETRANS))
        assert st.flags & FLAG_STATUS and len(st.payload) == 2
        return st.payload[0], st.payload[1]

    rig.send(frame(3, seq=0, slots=2, payload=pay))  # before seq 1 opens
    rig.send(*[frame(w, seq=1, slots=2, payload=pay) for w in (0, 1)])
    assert status(0) == (0b00011, 0)  # 2, 3, 4 not active
    rig.send(frame(2, seq=2, slots=2, payload=pay))  # 2 sends a later chunk
    assert status(1) == (0b00011, 0b00100)
    rig.send(frame(3, seq=0, slots=2, payload=pay, flags=FLAG_RETRANS))  # a duplicate
    assert status(0) == (0b00011, 0b01100)
    # worker 2's next life: what its old one sent does not count
    rig.send(frame(2, seq=0, slots=2, payload=pay, incarnation=7))
    assert status(1) == (0b00011, 0b01100)  # its new frame came after
    rig.send(frame(4, seq=1, slots=2, payload=pay))
    assert status(0) == (0b10011, 0b01100)
    # the STATUS frames changed no sum: each worker counted once in seq 1
    res = rig.results(
        rig.send(
            frame(2, seq=1, slots=2, payload=pay, incarnation=7),
            frame(3, seq=1, slots=2, payload=pay),
        )
    )
    assert len(res) == W and all(
        from_be32(r.payload).tolist() == (W * np.arange(256)).tolist() for r in res
    )
    c = rig.eng.counters()
    assert c["summed"] == 8 and c["completed"] == 1, c
    rig.no_leak()


def test_status_to_the_group_once_per_bitmap():
    """Retransmissions of an open slot: the first STATUS of a bitmap goes to
    the group; a repeat of it to the asking worker and to each missing
    worker the engine has heard from, one unicast each (status_repeats); a
    new contribution changes the bitmap, so the next goes to the group
    again, and a new chunk in the slot starts over."""
    W = 6
    rig = Rig(workers=W, slots=2, replicate=True, group=GROUP)
    pay = be32(np.arange(256))

    def retrans(w, seq=1):
        out = rig.send(frame(w, seq=seq, slots=2, payload=pay, flags=FLAG_RETRANS))
        assert out and all(o.flags & FLAG_STATUS for o in out)
        return out

    rig.send(frame(5, seq=0, slots=2, payload=pay))  # its address known, 3 and 4 never heard from
    rig.send(*[frame(w, seq=1, slots=2, payload=pay) for w in (0, 1, 2)])
    (st,) = retrans(0)
    assert st.worker == WORKER_ALL and st.dst.ipv4 == GROUP_INT and st.payload == bytes([0b111, 0])
    for w in (1, 2, 0):
        out = retrans(w)
        assert [(o.worker, o.dst) for o in out] == [(w, waddr(w)), (5, waddr(5))]
        assert all(o.payload == bytes([0b111, 0]) for o in out)
    rig.send(frame(4, seq=1, slots=2, payload=pay))
    (st,) = retrans(2)
    assert st.worker == WORKER_ALL and st.payload == bytes([0b10111, 0])
    assert [o.worker for o in retrans(4)] == [4, 5]
    c = rig.eng.counters()
    assert (c["status_sent"], c["status_repeats"]) == (10, 8)
    # seq 5 reuses the set of seq 1 (slot 1, shadow 0): its first STATUS is the group's
    rig.send(*[frame(w, seq=3, slots=2, payload=pay) for w in range(W)])
    rig.send(frame(1, seq=5, slots=2, payload=pay))
    assert [o.worker for o in retrans(1, seq=5)] == [WORKER_ALL]
    rig.no_leak()


def test_loss_report_names_the_worker_that_lost_its_frame():
    """docs/PROTOCOL.md Part 3, "Loss reports": a worker's first
    transmission of seq comes while the set of seq - 3 lacks it: the engine
    sends that set's STATUS at once, flagged FLAG_LOSS with the worker's
    id, to the group (then a retransmission's STATUS of the same bitmap is
    a repeat), or to the worker alone without one; a retransmission, a
    worker the set has, or a set already complete reports nothing; the
    resend is summed once."""
    W, S = 4, 8
    pay = be32(np.arange(256))
    for group in (True, False):
        kw = dict(replicate=True, group=GROUP) if group else {}
        rig = Rig(workers=W, slots=S, **kw)
        for seq in range(3):  # worker 3's seq 0 is lost
            rig.send(
                *[frame(w, seq=seq, slots=S, payload=pay) for w in range(W) if (w, seq) != (3, 0)]
            )
        assert rig.send(*[frame(w, seq=3, slots=S, payload=pay) for w in range(3)]) == []
        out = rig.send(frame(3, seq=3, slots=S, payload=pay))  # completes seq 3 too
        (st,) = [o for o in out if o.flags & FLAG_STATUS]
        assert out[-1].flags & FLAG_RESULT and out[-1].seq == 3  # the report first
        assert st.flags & FLAG_STATUS and st.flags & FLAG_LOSS and st.seq == 0 and st.worker == 3
        assert st.payload == bytes([0b0111, 0b1000])  # 3 missing, and active
        assert st.dst.ipv4 == (GROUP_INT if group else waddr(3).ipv4)
        # a retransmission reports nothing; a repeat of the bitmap is unicast
        out = rig.send(frame(0, seq=0, slots=S, payload=pay, flags=FLAG_RETRANS))
        assert all(not o.flags & FLAG_LOSS for o in out)
        assert [o.worker for o in out] == ([0, 3] if group else [0])
        # the resend completes the set, summed once
        res = rig.results(rig.send(frame(3, seq=0, slots=S, payload=pay, flags=FLAG_RETRANS)))
        assert res and all(
            from_be32(r.payload).tolist() == (W * np.arange(256)).tolist() for r in res
        )
        # seq 4 from everyone: the set of seq 1 is complete, no report
        out = rig.send(*[frame(w, seq=4, slots=S, payload=pay) for w in range(W)])
        assert all(not o.flags & FLAG_STATUS for o in out)
        c = rig.eng.counters()
        assert c["summed"] == 5 * W and c["completed"] == 5, c
        rig.no_leak()


@pytest.mark.parametrize("W", [128, 130])
def test_loss_reports_reach_the_group_once_per_chunk(W):
    """docs/PROTOCOL.md Part 3, "Loss reports": in a job of more than 128
    workers only a chunk's first loss report goes to the group; a later
    one of the same chunk (the group has had a STATUS of it, a report or a
    retransmission's answer) goes to the worker it names alone.  Up to 128
    workers every report goes to the group.  The next chunk of the set
    starts over, and every lost frame is summed once."""
    S = 8
    pay = be32(np.arange(256))
    rig = Rig(workers=W, slots=S, replicate=True, group=GROUP)
    later = GROUP_INT if W <= 128 else None  # where a later report goes

    def reports(out):
        return [(o.seq, o.worker, o.dst.ipv4) for o in out if o.flags & FLAG_LOSS]

    def send(seq, workers=None, flags=0):
        ws = range(W) if workers is None else workers
        return rig.send(*[frame(w, seq=seq, slots=S, payload=pay, flags=flags) for w in ws])

    lost = {(2, 0), (3, 0), (4, 0), (1, 1), (4, 1)}  # seqs 0 and 1 lack some
    for seq in range(3):
        send(seq, [w for w in range(W) if (w, seq) not in lost])
    assert reports(send(3, [2])) == [(0, 2, GROUP_INT)]
    assert reports(send(3, [3])) == [(0, 3, later or waddr(3).ipv4)]
    # seq 1: a retransmission's STATUS reached the group first
    (st,) = send(1, [0], FLAG_RETRANS)
    assert st.worker == WORKER_ALL and not st.flags & FLAG_LOSS
    assert reports(send(4, [1])) == [(1, 1, later or waddr(1).ipv4)]
    # worker 4 lost both: one report each, the group had a STATUS of both chunks
    out = rig.send(frame(4, seq=3, slots=S, payload=pay), frame(4, seq=4, slots=S, payload=pay))
    assert reports(out) == [(0, 4, later or waddr(4).ipv4), (1, 4, later or waddr(4).ipv4)]
    c = rig.eng.counters()
    assert c["status_sent"] == 6, c  # five reports and one answer
    res = []
    for w, seq in sorted(lost, key=lambda x: x[1]):
        res += rig.results(send(seq, [w], FLAG_RETRANS))
    assert sorted({r.seq for r in res}) == [0, 1]
    assert all(from_be32(r.payload).tolist() == (W * np.arange(256)).tolist() for r in res)
    send(3, [w for w in range(W) if w not in (2, 3, 4)])
    send(4, [w for w in range(W) if w not in (1, 4)])
    # seq 8 reuses the set of seq 0: its first report is the group's again
    for seq in (5, 6, 7):
        send(seq)
    send(8, [w for w in range(W) if w not in (2, 3)])
    for seq in (9, 10):
        send(seq)
    out = send(11, [2, 3])
    assert reports(out) == [(8, 2, GROUP_INT), (8, 3, later or waddr(3).ipv4)]
    c = rig.eng.counters()
    # seqs 0-7, 9 and 10 complete, each contribution once; 8 and 11 open
    assert c["summed"] == 10 * W + (W - 2) + 2 and c["completed"] == 10, c
    rig.no_leak()


def test_shadow_sets_and_slot_reuse():
    """Many chunks through few slots with a window of S chunks in flight,
    interleaved out of order: every result exact, stale packets dropped."""
    rng = np.random.default_rng(5)
    W, S, N = 4, 3, 40
    rig = Rig(workers=W, slots=S)
    data = {seq: [rng.integers(-(2**31), 2**31, 64) for _ in range(W)] for seq in range(N)}
    got = {}
    seq_next = 0
    # Keep S chunks in flight; feed each chunk's packets interleaved with the next.
    pending = []
    while seq_next < N or pending:
        while seq_next < N and len({s for s, _ in pending}) < S:
            pending += [(seq_next, w) for w in range(W)]
            seq_next += 1
        rng.shuffle(pending)
        batch, pending = pending[:5], pending[5:]
        out = rig.send(*[frame(w, seq=s, slots=S, payload=be32(data[s][w])) for s, w in batch])
        for r in rig.results(out):
            got.setdefault(r.seq, set()).add((r.worker, r.payload))
    for seq in range(N):
        want = be32(wrap32(np.sum(data[seq], axis=0)))
        assert got[seq] == {(w, want) for w in range(W)}, seq
    # Chunk 0's set (slot 0, shadow 0) now holds a newer chunk: stale.
    out = rig.send(frame(0, seq=0, slots=S, payload=be32(data[0][0])))
    assert out == [] and rig.eng.counters()["stale"] == 1
    rig.no_leak()


def test_two_jobs_interleaved_and_foreign_token():
    rng = np.random.default_rng(8)
    rig = Rig(workers=2, slots=2)
    rig.eng.add_job(job=2, token=99, workers=3, slots=2, payload_bytes=512)
    a = [rng.integers(-9, 9, 128) for _ in range(2)]
    b = [rng.integers(-9, 9, 100) for _ in range(3)]
    frames = [
        frame(0, job=1, slots=2, payload=be32(a[0])),
        frame(0, job=2, token=99, slots=2, payload=be32(b[0])),
        # Job 2's packet carrying job 1's token: dropped, nothing changes.
        frame(1, job=2, token=77, slots=2, payload=be32(np.ones(100))),
        frame(1, job=2, token=99, slots=2, payload=be32(b[1])),
        frame(1, job=1, slots=2, payload=be32(a[1])),
        frame(2, job=2, token=99, slots=2, payload=be32(b[2])),
    ]
    res = rig.results(rig.send(*frames))
    r1 = [r for r in res if r.job == 1]
    r2 = [r for r in res if r.job == 2]
    assert len(r1) == 2 and len(r2) == 3
    assert all(from_be32(r.payload).tolist() == (a[0] + a[1]).tolist() for r in r1)
    assert all(from_be32(r.payload).tolist() == (b[0] + b[1] + b[2]).tolist() for r in r2)
    assert all(r.token == 99 for r in r2)
    assert rig.eng.counters()["bad_token"] == 1
    assert rig.eng.job_counters(2)["bad_token"] == 1
    assert rig.eng.job_counters(1)["bad_token"] == 0
    assert rig.eng.job_counters(2)["completed"] == 1
    rig.no_leak()


def _corrupt(f, off, val):
    b = bytearray(f)
    b[off] = val
    return bytes(b)


def hostile_frames():
    """(name, frame, counter) for every malformed or hostile frame."""
    ok = dict(payload=be32(np.arange(8)))
    good = frame(1, **ok)
    cases = [
        ("truncated_eth", good[:10], "truncated"),
        ("truncated_hdr", good[: 42 + 10], "truncated"),
        ("truncated_ip", good[:30], "truncated"),
        ("arp", _corrupt(good, 13, 0x06), "not_ip"),
        ("ipv6_version", _corrupt(good, 14, 0x65), "not_ip"),
        ("not_udp", frame_with_ip_proto(good, 6), "not_udp"),
        (
            "wrong_port",
            build_frame(
                waddr(1),
                Addr(AGG.mac, AGG.ipv4, 9999),
                op="sum32",
                job=1,
                token=77,
                worker=1,
                seq=0,
                slot=0,
                **ok,
            ),
            "wrong_port",
        ),
        ("bad_ip_csum", _corrupt(good, 24, good[24] ^ 0xFF), "bad_csum"),
        ("bad_udp_csum", _corrupt(good, 80, good[80] ^ 0x01), "bad_csum"),
        ("bad_version", frame(1, version=PROTOCOL_VERSION + 1, **ok), "bad_version"),
        ("version_1", frame(1, version=1, **ok), "bad_version"),
        ("version_2", frame(1, version=PROTOCOL_VERSION - 1, **ok), "bad_version"),
        ("version_1_layout", v1_frame(good), "bad_version"),
        ("unknown_job", frame(1, job=12345, **ok), "unknown_job"),
        ("bad_token", frame(1, token=78, **ok), "bad_token"),
        ("bad_worker", frame(4, **ok), "bad_worker"),
        (
            "worker_ffff",
            build_frame(
                waddr(1), AGG, op="sum32", job=1, token=77, worker=0xFFFF, seq=0, slot=0, **ok
            ),
            "bad_worker",
        ),
        ("slot_ge_S", frame(1, slot=4, **ok), "bad_slot"),
        ("slot_ne_seq", frame(1, seq=1, slot=2, **ok), "bad_slot"),
        (
            "shadow_wrong",
            build_frame(
                waddr(1),
                AGG,
                op="sum32",
                job=1,
                token=77,
                worker=1,
                seq=0,
                slot=0,
                flags=FLAG_SHADOW,
                **ok,
            ),
            "bad_slot",
        ),
        ("lanes_vs_len", frame(1, lanes=9, **ok), "bad_lanes"),
        ("lanes_zero_len", frame(1, lanes=0, **ok), "bad_lanes"),
        ("lanes_gt_job", frame(1, payload=be32(np.arange(300))), "bad_lanes"),
        ("nc8_gt_job", frame(1, op="nc8", exp=20, payload=bytes(300)), "bad_lanes"),
        ("unknown_op", frame(1, op=9, lanes=32, payload=bytes(32)), "bad_op"),
        ("op_zero", frame(1, op=0, lanes=32, payload=bytes(32)), "bad_op"),
        ("result_from_worker", frame(1, flags=FLAG_RESULT, **ok), "bad_flags"),
        # a STATUS from a worker is a leaf report (PROTOCOL.md "Who is missing
        # in a tree"): nothing summed, and this one is too short for one
        ("status_from_worker", frame(1, flags=FLAG_STATUS, payload=b"\x01", lanes=8), "bad_lanes"),
        ("unknown_flag", frame(1, flags=0x80, **ok), "bad_flags"),
        # a loss report is the aggregator's (PROTOCOL.md "Loss reports")
        ("loss_from_worker", frame(1, flags=FLAG_LOSS, **ok), "bad_flags"),
        ("epoch_without_auth", frame(1, flags=0x100, **ok), "bad_flags"),
        ("nonce_without_auth", frame(1, nonce=1, **ok), "bad_flags"),
        ("nonce_high_without_auth", frame(1, nonce=1 << 31, **ok), "bad_flags"),
        ("incarnation_zero", frame(1, incarnation=0, **ok), "bad_flags"),
        (
            "auth_no_room",
            with_auth_flag(frame(1, lanes=2, payload=bytes(8), udp_csum=False)),
            "truncated",
        ),
        ("auth_on_plain_job", frame(1, flags=FLAG_AUTH, **ok), "bad_mac"),
        ("bad_shard", frame(1, shard=1, **ok), "bad_shard"),
        ("old_incarnation", frame(0, incarnation=0xFFFFFFFF, **ok), "old_incarnation"),
        ("exp_nonzero_sum", frame(1, exp=3, **ok), "bad_exp"),
        ("exp_nc8_range", frame(1, op="nc8", exp=-1, payload=bytes(8)), "bad_exp"),
        (
            "all_ones",
            build_frame(
                waddr(1),
                AGG,
                op=0xFF,
                job=0xFFFFFFFF,
                token=0xFFFFFFFF,
                worker=0xFFFF,
                seq=0xFFFFFFFF,
                slot=0xFFFF,
                lanes=0xFFFF,
                exp=-1,
                flags=0xFFFF,
                version=0xFF,
                nonce=0xFF,
                payload=bytes(16),
            ),
            "bad_version",
        ),
        (
            "all_ones_v2",
            build_frame(
                waddr(1),
                AGG,
                op=0xFF,
                job=0xFFFFFFFF,
                token=0xFFFFFFFF,
                worker=0xFFFF,
                seq=0xFFFFFFFF,
                slot=0xFFFF,
                lanes=0xFFFF,
                exp=-1,
                flags=0xFFFF,
                nonce=0xFF,
                payload=bytes(16),
            ),
            "bad_flags",
        ),
    ]
    return cases


def _fix_ip_csum(b):
    b[24] = b[25] = 0
    s = sum(int.from_bytes(b[14 + i : 16 + i], "big") for i in range(0, 20, 2))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    b[24:26] = (~s & 0xFFFF).to_bytes(2, "big")


def v1_frame(f):
    """The same chunk laid out as protocol version 1 wrote it: a 24-byte
    header (no incarnation, no reserved word), version 1, no UDP checksum."""
    b = bytearray(f[: 42 + 24] + f[42 + 32 :])
    b[42] = 1
    b[42 + 23] = 0
    b[16:18] = (len(b) - 14).to_bytes(2, "big")
    b[38:40] = (len(b) - 34).to_bytes(2, "big")
    b[40] = b[41] = 0
    _fix_ip_csum(b)
    return bytes(b)


def with_auth_flag(f):
    """f (built without a UDP checksum) with HG_FLAG_AUTH set in place."""
    b = bytearray(f)
    b[42 + 3] |= FLAG_AUTH
    return bytes(b)


def frame_with_ip_proto(f, proto):
    b = bytearray(f)
    b[23] = proto
    _fix_ip_csum(b)
    return bytes(b)


@pytest.mark.parametrize("name,bad,reason", hostile_frames(), ids=[c[0] for c in hostile_frames()])
def test_hostile_frame_dropped(name, bad, reason):
    rig = Rig(workers=4, slots=4, payload_bytes=1024)
    xs = [np.arange(8) * (w + 1) - 5 for w in range(4)]
    # Half a sum in flight, the hostile frame, then the rest: still exact.
    rig.send(frame(0, payload=be32(xs[0])), frame(2, payload=be32(xs[2])))
    assert rig.send(bad) == []
    c = rig.eng.counters()
    assert c[reason] == 1, (name, {k: v for k, v in c.items() if v})
    drops = {k: v for k, v in c.items() if k not in ("received", "summed") and v}
    assert drops == {reason: 1}
    res = rig.results(rig.send(frame(1, payload=be32(xs[1])), frame(3, payload=be32(xs[3]))))
    assert len(res) == 4
    assert all(from_be32(r.payload).tolist() == sum(xs).tolist() for r in res)
    rig.no_leak()


def test_op_lanes_exp_mismatch_with_slot():
    rig = Rig(workers=3)
    rig.send(frame(0, op="nc8", exp=25, payload=bytes(range(64))))
    out = rig.send(
        frame(1, op="or", payload=bytes(64)),  # op differs
        frame(1, op="nc8", exp=25, payload=bytes(32)),  # lanes differ
        frame(1, op="nc8", exp=24, payload=bytes(64)),
    )  # exp differs
    assert out == []
    c = rig.eng.counters()
    assert (c["bad_op"], c["bad_lanes"], c["bad_exp"], c["summed"]) == (1, 1, 1, 1)
    res = rig.results(
        rig.send(
            frame(1, op="nc8", exp=25, payload=bytes(64)),
            frame(2, op="nc8", exp=25, payload=bytes(64)),
        )
    )
    assert len(res) == 3 and len(res[0].payload) == 256
    assert res[0].payload == expected(
        "nc8", [np.arange(64, dtype=np.uint8), np.zeros(64, np.uint8), np.zeros(64, np.uint8)], 25
    )


def test_multicast_vs_unicast():
    pay = [be32(np.full(16, w)) for w in range(5)]
    for replicate, group, n_expected in [(True, GROUP, 1), (False, GROUP, 5), (True, 0, 5)]:
        rig = Rig(workers=5, replicate=replicate, group=group)
        res = rig.results(rig.send(*[frame(w, payload=pay[w]) for w in range(5)]))
        assert len(res) == n_expected
        assert all(from_be32(r.payload).tolist() == [10] * 16 for r in res)
        if n_expected == 1:
            r = res[0]
            assert r.worker == WORKER_ALL and r.dst.ipv4 == GROUP_INT
            assert r.dst.mac == bytes([1, 0, 0x5E, 1, 2, 3]) and r.dst.port == UDP_PORT
        else:
            assert sorted(r.dst.ipv4 for r in res) == sorted(waddr(w).ipv4 for w in range(5))
        assert rig.eng.counters()["results_sent"] == n_expected
        assert rig.port.groups_joined == 0  # it sends to the group, never joins it
        rig.no_leak()


def test_result_larger_than_rx_buffer_allocates():
    # NC8 results are 4x the request: small buffers force a fresh allocation.
    rig = Rig(workers=1, buf_size=512)
    res = rig.results(rig.send(frame(0, op="nc8", exp=10, payload=bytes([1] * 100))))
    assert len(res) == 1 and from_be32(res[0].payload).tolist() == [512] * 100
    rig.no_leak()


def test_tx_full_and_no_buffer_counted():
    rig = Rig(workers=3, pool=8)
    rig.port.set_tx_limit(1)
    res = rig.results(rig.send(*[frame(w, payload=be32([w])) for w in range(3)]))
    assert len(res) == 1
    c = rig.eng.counters()
    assert c["tx_full"] == 2 and c["results_sent"] == 3
    rig.no_leak()


def test_worker_address_learned():
    rig = Rig(workers=2)
    moved = Addr.of("02:aa:bb:cc:dd:ee", "192.168.7.7", 5555)
    f0 = frame(0, payload=be32([1]))
    f1 = build_frame(
        moved, AGG, op="sum32", job=1, token=77, worker=1, seq=0, slot=0, payload=be32([2])
    )
    res = rig.results(rig.send(f0, f1))
    assert {r.worker: r.dst for r in res} == {0: waddr(0), 1: moved}


def test_seq_wraps():
    rig = Rig(workers=2, slots=4)
    S = 4
    for seq in [2**32 - 8, 2**32 - 4, 0, 4]:
        # Chunks seq and seq + 4k share a slot; the shadow set follows seq // S.
        res = rig.results(
            rig.send(*[frame(w, seq=seq, slots=S, payload=be32([seq & 0xFF, w])) for w in range(2)])
        )
        assert len(res) == 2, seq
    assert rig.eng.counters()["stale"] == 0


def test_job_management_errors():
    port = MemPort()
    eng = Engine(port, max_jobs=2)
    eng.add_job(1, 1, 2, 4)
    with pytest.raises(HomAggError) as ei:
        eng.add_job(1, 1, 2, 4)
    assert ei.value.code == -errno.EEXIST
    for kw in [
        dict(workers=0),
        dict(workers=257),
        dict(slots=0),
        dict(slots=70000),
        dict(payload_bytes=8193),
        dict(payload_bytes=0),
    ]:
        args = dict(job=5, token=1, workers=2, slots=4, payload_bytes=1024)
        args.update(kw)
        with pytest.raises(OutOfRange):
            eng.add_job(**args)
    eng.add_job(2, 1, 256, 1)
    with pytest.raises(OutOfRange):
        eng.add_job(3, 1, 2, 4)
    assert eng.job_count == 2
    eng.remove_job(1)
    with pytest.raises(HomAggError) as ei:
        eng.remove_job(1)
    assert ei.value.code == -errno.ENOENT
    eng.add_job(3, 1, 2, 4)
    assert eng.job_count == 2
    # A removed job's packets are unknown.
    port.inject(frame(0, job=1, token=1))
    eng.poll_all()
    assert eng.counters()["unknown_job"] == 1
    eng.close()
    eng.close()


def test_counter_names():
    names = counter_names()
    assert names[0] == "received"
    for n in [
        "summed",
        "duplicates",
        "replays",
        "results_sent",
        "status_sent",
        "stale",
        "not_ip",
        "not_udp",
        "wrong_port",
        "truncated",
        "bad_version",
        "unknown_job",
        "bad_token",
        "bad_worker",
        "bad_slot",
        "bad_lanes",
        "bad_op",
        "bad_flags",
        "bad_exp",
        "tx_full",
        "bad_mac",
        "bad_shard",
        "old_incarnation",
        "incarnation_resets",
    ]:
        assert n in names
    assert len(set(names)) == len(names)


def test_256_workers():
    rng = np.random.default_rng(3)
    W = 256
    rig = Rig(workers=W, slots=1, replicate=True, group=GROUP)
    xs = rng.integers(-(2**31), 2**31, (W, 256))
    res = rig.results(rig.send(*[frame(w, slots=1, payload=be32(xs[w])) for w in range(W)]))
    assert len(res) == 1 and res[0].payload == be32(wrap32(xs.sum(axis=0)))
    out = rig.send(frame(255, slots=1, payload=be32(xs[255]), flags=FLAG_RETRANS))
    assert len(out) == 1 and out[0].worker == 255 and out[0].dst == waddr(255)


def _udp_csum_ref(f):
    ip, udp = f[14:34], f[34:]
    ulen = int.from_bytes(udp[4:6], "big")
    data = ip[12:20] + b"\x00\x11" + udp[4:6] + udp[:6] + b"\x00\x00" + udp[8:ulen]
    if len(data) % 2:
        data += b"\x00"
    s = sum(int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    c = ~s & 0xFFFF
    return c or 0xFFFF


@pytest.mark.parametrize("nbytes", [0, 1, 3, 31, 100, 127, 128, 129, 1000, 1023, 4097, 8192])
def test_udp_checksum_matches_reference(nbytes):
    rng = np.random.default_rng(nbytes)
    pay = rng.integers(0, 256, nbytes).astype(np.uint8).tobytes()
    f = frame(1, op="or", payload=pay)
    assert int.from_bytes(f[40:42], "big") == _udp_csum_ref(f)
    assert not isinstance(parse_frame(f), str)
    if nbytes:
        bad = _corrupt(f, len(f) - 1, f[-1] ^ 0x40)
        assert parse_frame(bad) == "bad_csum"
        assert not isinstance(parse_frame(bad, udp_csum=False), str)


def test_result_checksums_large_payload():
    rng = np.random.default_rng(11)
    rig = Rig(workers=2, payload_bytes=8192)
    xs = [rng.integers(-(2**31), 2**31, 2048) for _ in range(2)]
    out = rig.send(*[frame(w, payload=be32(xs[w])) for w in range(2)])
    res = rig.results(out)
    assert len(res) == 2 and res[0].payload == be32(wrap32(xs[0] + xs[1]))
    # A corrupted large frame is dropped by the checksum, not summed.
    good = frame(0, seq=1, payload=be32(xs[0]))
    assert rig.send(_corrupt(good, 3000, good[3000] ^ 1)) == []
    assert rig.eng.counters()["bad_csum"] == 1


def test_replies_carry_the_jobs_shard_and_incarnation():
    port = MemPort()
    eng = Engine(port)
    assert eng.add_job(job=1, token=77, workers=2, slots=4, shard=3, incarnation=777) == 777
    assert eng.job_config(1)["shard"] == 3
    # The first frame of a worker may carry any incarnation, even one whose
    # serial distance from 0 is negative.
    for w, inc in ((0, 0x80000001), (1, 5)):
        port.inject(frame(w, shard=3, incarnation=inc, payload=be32([w + 1])))
    port.inject(frame(0, shard=0, seq=1, incarnation=0x80000001, payload=be32([1])))
    eng.poll_all()
    res = [parse_frame(f) for f in port.pop_all()]
    assert len(res) == 2
    assert all(
        r.shard == 3 and r.incarnation == 777 and from_be32(r.payload).tolist() == [3] for r in res
    )
    assert eng.counters()["bad_shard"] == 1
    # Without an incarnation the job gets one from the clock, never 0.
    assert eng.add_job(job=2, token=1, workers=1, slots=1) != 0


def test_new_incarnation_resets_slots_holding_the_old_life():
    rig = Rig(workers=3, slots=4)
    x = {w: np.arange(8) * (w + 2) for w in range(3)}
    x0_new = np.arange(8) * -7
    # Chunk 2 completes in life 1 of every worker; chunks 0 and 1 hold
    # worker 0's life-1 contribution, chunk 3 does not.
    done = rig.results(rig.send(*[frame(w, seq=2, payload=be32(x[w])) for w in range(3)]))
    assert len(done) == 3
    assert (
        rig.send(
            frame(0, seq=0, payload=be32(x[0])),
            frame(1, seq=0, payload=be32(x[1])),
            frame(0, seq=1, payload=be32(x[0])),
            frame(1, seq=3, payload=be32(x[1])),
        )
        == []
    )
    # Worker 0 restarts (incarnation 2): chunks 0 and 1 start over, and the
    # complete chunk 2 is emptied too.
    assert rig.send(frame(0, seq=0, incarnation=2, payload=be32(x0_new))) == []
    c = rig.eng.counters()
    assert c["incarnation_resets"] == 3
    # Its past life is never summed again ...
    assert (
        rig.send(
            frame(0, seq=1, payload=be32(x[0])),
            frame(0, seq=0, flags=FLAG_RETRANS, payload=be32(x[0])),
        )
        == []
    )
    assert rig.eng.counters()["old_incarnation"] == 2
    # ... worker 1's cleared contribution comes back by retransmission and
    # the sum holds the new life only.
    out = rig.send(frame(1, seq=0, flags=FLAG_RETRANS, payload=be32(x[1])))
    st = [f for f in out if f.flags & FLAG_STATUS]
    assert len(st) == 0  # not a duplicate any more: summed again
    res = rig.results(rig.send(frame(2, seq=0, payload=be32(x[2]))))
    assert len(res) == 3
    assert all(from_be32(r.payload).tolist() == (x0_new + x[1] + x[2]).tolist() for r in res)
    # Chunk 3 (no contribution of worker 0) kept worker 1's.
    res = rig.results(
        rig.send(
            frame(0, seq=3, incarnation=2, payload=be32(x[0])), frame(2, seq=3, payload=be32(x[2]))
        )
    )
    assert len(res) == 3
    assert all(from_be32(r.payload).tolist() == (x[0] + x[1] + x[2]).tolist() for r in res)
    rig.no_leak()


def test_new_incarnation_empties_complete_sets_too():
    """The life-1 result of chunk 2 is never replayed to worker 0's new life:
    its chunk 2 is a new sum (a new life numbers its chunks from 0 again)."""
    rig = Rig(workers=3, slots=4)
    x = {w: np.arange(8) * (w + 2) for w in range(3)}
    done = rig.results(rig.send(*[frame(w, seq=2, payload=be32(x[w])) for w in range(3)]))
    assert len(done) == 3
    y0 = np.arange(8) * -7
    assert rig.send(frame(0, seq=2, incarnation=2, payload=be32(y0))) == []
    c = rig.eng.counters()
    assert c["incarnation_resets"] == 1 and c["replays"] == 0 and c["duplicates"] == 0
    res = rig.results(
        rig.send(
            frame(1, seq=2, incarnation=2, payload=be32(x[1])),
            frame(2, seq=2, incarnation=2, payload=be32(x[2])),
        )
    )
    assert len(res) == 3
    assert all(from_be32(r.payload).tolist() == (y0 + x[1] + x[2]).tolist() for r in res)
    # Workers 1 and 2's new lives found nothing of their old ones left.
    assert rig.eng.counters()["incarnation_resets"] == 1
    rig.no_leak()


@pytest.mark.parametrize("chunks", [3, 11], ids=["same-seq", "later-seq"])
def test_second_run_of_new_workers_on_one_job_is_exact(chunks):
    """Run 1 (incarnation 1) leaves finished sets behind, their seq the same
    as run 2's first chunks (3 chunks < 2 S) or greater (11).  Run 2's
    workers (incarnation 2, chunks from 0 again, other data) get their own
    sums, in any arrival order."""
    W, S = 3, 4
    rig = Rig(workers=W, slots=S)
    rng = np.random.default_rng(chunks)
    for life in (1, 2):
        xs = rng.integers(-1000, 1000, size=(chunks, W, 8))
        order = [(c, w) for c in range(chunks) for w in rng.permutation(W)]
        got = {}
        for c, w in order:
            out = rig.send(frame(int(w), seq=c, incarnation=life, payload=be32(xs[c, w])))
            for r in rig.results(out):
                got.setdefault(r.seq, []).append(from_be32(r.payload).tolist())
        assert sorted(got) == list(range(chunks))
        for c in range(chunks):
            assert got[c] == [xs[c].sum(axis=0).tolist()] * W, (life, c)
    assert rig.eng.counters()["stale"] == 0
    rig.no_leak()


def test_old_incarnation_never_summed():
    rig = Rig(workers=2, slots=4)
    a, b, stale = np.arange(8), np.arange(8) * 3, np.full(8, 1000)
    rig.send(frame(0, incarnation=5, payload=be32(a)))
    assert (
        rig.send(
            frame(0, incarnation=4, payload=be32(stale)),
            frame(0, incarnation=4, seq=1, payload=be32(stale)),
        )
        == []
    )
    res = rig.results(rig.send(frame(1, payload=be32(b))))
    assert len(res) == 2 and all(from_be32(r.payload).tolist() == (a + b).tolist() for r in res)
    c = rig.eng.counters()
    assert c["old_incarnation"] == 2 and c["summed"] == 2
    rig.no_leak()


# ---- staged bursts == one frame at a time -----------------------------------
# The engine classifies a whole burst before it applies any frame of it
# (engine.c); frames of one burst that hit the same set (a set started over
# by its first frame, duplicates, stale and mismatching frames behind it)
# must come out exactly as when every frame is handled before the next.


def _mixed_stream(rng, W=4, S=4, lanes=64, chunks=40):
    """Valid contributions of `chunks` chunks in a windowed, shuffled order,
    with duplicates, retransmissions, stale and late frames, set mismatches
    and the hostile frames of hostile_frames() mixed in."""
    ops = ("sum32", "or", "max8", "nc8")
    frames = []
    for seq in range(chunks):
        op = ops[seq % 4]
        exp = 29 if op == "nc8" else 0
        n = lanes if op != "sum32" else lanes // 2
        for w in rng.permutation(W):
            p = to_payload(op, contrib(op, rng, n))
            f = frame(int(w), op=op, seq=seq, slots=S, payload=p, exp=exp)
            frames.append(f)
            r = rng.random()
            if r < 0.15:
                frames.append(f)  # duplicate (a replay once complete)
            elif r < 0.25:
                frames.append(
                    frame(int(w), op=op, seq=seq, slots=S, payload=p, exp=exp, flags=FLAG_RETRANS)
                )
            elif r < 0.30 and seq >= 2 * S:
                frames.append(
                    frame(int(w), op=op, seq=seq - 2 * S, slots=S, payload=p, exp=exp)
                )  # stale
            elif r < 0.35:
                other = ops[(seq + 1) % 4]
                frames.append(
                    frame(
                        int(w),
                        op=other,
                        seq=seq,
                        slots=S,
                        payload=to_payload(other, contrib(other, rng, n)),
                        exp=29 if other == "nc8" else 0,
                    )
                )  # op mismatch
            elif r < 0.40:
                frames.append(
                    frame(
                        int(w),
                        op=op,
                        seq=seq,
                        slots=S,
                        exp=exp,
                        payload=to_payload(op, contrib(op, rng, n // 2)),
                    )
                )
    hostile = [b for _name, b, _reason in hostile_frames()]
    for b in hostile:
        frames.insert(int(rng.integers(0, len(frames) + 1)), b)
    # a little reordering within a window: swap neighbours
    for _ in range(len(frames) // 4):
        i = int(rng.integers(0, len(frames) - 1))
        frames[i], frames[i + 1] = frames[i + 1], frames[i]
    return frames


def _run_mixed(frames, staged, burst, replicate):
    rig = Rig(
        workers=4, slots=4, payload_bytes=1024, replicate=replicate, group=GROUP if replicate else 0
    )
    eng = Engine(rig.port, burst=burst, staged=staged)
    rig.eng.close()
    rig.eng = eng
    eng.add_job(
        job=1,
        token=77,
        workers=4,
        slots=4,
        payload_bytes=1024,
        group=GROUP if replicate else 0,
        incarnation=7,
    )  # replies compared byte for byte
    out = []
    for i in range(0, len(frames), burst):
        for f in frames[i : i + burst]:
            rig.port.inject(f)
        eng.poll_all()  # bursts of `burst`: the injected frames in one call
        out += rig.port.pop_all()
    counters, job = eng.counters(), eng.job_counters(1)
    eng.close()
    return out, counters, job


@pytest.mark.parametrize("burst", [1, 31, 32, 33, 256])
@pytest.mark.parametrize("replicate", [False, True], ids=["unicast", "multicast"])
def test_staged_burst_equals_one_at_a_time(burst, replicate):
    rng = np.random.default_rng(burst * 7 + replicate)
    frames = _mixed_stream(rng)
    staged = _run_mixed(frames, True, burst, replicate)
    single = _run_mixed(frames, False, burst, replicate)
    assert staged[1] == single[1]  # every engine counter
    assert staged[2] == single[2]  # every job counter
    assert staged[0] == single[0]  # every frame sent, byte for byte, in order
    c = staged[1]
    # the mix exercised what it is meant to
    for k in (
        "completed",
        "duplicates",
        "replays",
        "status_sent",
        "stale",
        "bad_op",
        "bad_lanes",
        "bad_token",
        "unknown_job",
        "bad_slot",
    ):
        assert c[k] > 0, (k, {n: v for n, v in c.items() if v})


# ---- the first pass's fast path == the full parser --------------------------
# Staged bursts take frames of the usual shape through classify_fast()
# (engine.c: a few masked word compares) and hand everything else to the full
# parser; one-at-a-time processing always runs the full parser.  A frame with
# any header byte changed, cut short, padded, or carrying IP options must come
# out the same either way: same counters, same replies.


def with_ip_options(f):
    """f with four NOP bytes of IPv4 options (a 24-byte IP header): still
    valid, but not the shape the fast path takes."""
    b = bytearray(f[:34] + b"\x01\x01\x01\x01" + f[34:])
    b[14] = 0x46
    b[16:18] = (int.from_bytes(b[16:18], "big") + 4).to_bytes(2, "big")
    _fix_ip_csum(b)
    return bytes(b)


def _mutated_stream(rng, S, first_seq, W=4, chunks=24):
    frames = []
    for seq in range(first_seq, first_seq + chunks):
        seq &= 0xFFFFFFFF
        op = ("sum32", "nc8", "or", "max8")[seq % 4]
        n = 16 if op == "sum32" else 64
        for w in rng.permutation(W):
            p = to_payload(op, contrib(op, rng, n))
            f = frame(
                int(w),
                op=op,
                seq=seq,
                slots=S,
                payload=p,
                exp=29 if op == "nc8" else 0,
                udp_csum=bool(rng.random() < 0.5),
            )
            r = rng.random()
            if r < 0.1:
                f = with_ip_options(f)
            elif r < 0.15:
                f = f + bytes(int(rng.integers(1, 9)))  # Ethernet padding
            frames.append(f)
            if rng.random() < 0.5:  # a damaged copy
                b = bytearray(f)
                if rng.random() < 0.1:
                    b = b[: int(rng.integers(0, len(b)))]
                else:
                    # not the incarnation (bytes 66-69): a greater one would
                    # make every later frame of that worker old
                    i = int(rng.choice([i for i in range(min(len(b), 80)) if not 66 <= i < 70]))
                    b[i] ^= int(rng.integers(1, 256))
                frames.insert(int(rng.integers(0, len(frames) + 1)), bytes(b))
    return frames


def _run_frames(frames, staged, S, burst=32):
    rig = Rig(workers=4, slots=S, payload_bytes=1024, replicate=True, group=GROUP)
    eng = Engine(rig.port, burst=burst, staged=staged)
    rig.eng.close()
    rig.eng = eng
    eng.add_job(job=1, token=77, workers=4, slots=S, payload_bytes=1024, group=GROUP, incarnation=7)
    out = []
    for i in range(0, len(frames), burst):
        for f in frames[i : i + burst]:
            rig.port.inject(f)
        eng.poll_all()
        out += rig.port.pop_all()
    counters = eng.counters()
    eng.close()
    return out, counters


@pytest.mark.parametrize("S,first_seq", [(4, 0), (3, 0), (5, 2**32 - 37), (16, 2**32 - 40)])
def test_fast_path_equals_full_parser(S, first_seq):
    rng = np.random.default_rng(S * 1009 + first_seq % 1000)
    frames = _mutated_stream(rng, S, first_seq)
    fast = _run_frames(frames, True, S)
    full = _run_frames(frames, False, S)
    assert fast[1] == full[1]
    assert fast[0] == full[0]
    c = fast[1]
    assert c["completed"] >= 6 and c["bad_csum"] > 0, {k: v for k, v in c.items() if v}
