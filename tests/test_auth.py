"""Per-worker authentication (docs/PROTOCOL.md Part 2, "Authentication").

The keys and MACs are checked against Python's hashlib (BLAKE2b with key,
salt and personalisation: an implementation independent of libsodium); the
engine against hostile frames with and without valid MACs; the simulated
cluster (NIC model) and workers over loopback UDP end to end, bit-exact
against the numpy oracle.
"""

import os
import socket
import threading

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from homagg import auth
from homagg.bindings import auth as _ab
from homagg.engine import (
    FLAG_AUTH,
    FLAG_RESULT,
    FLAG_RETRANS,
    Addr,
    Engine,
    MemPort,
    build_frame,
    parse_frame,
)
from homagg.errors import HomAggError, InvalidArgument
from homagg.sim import Cluster
from homagg.worker import Worker

from engine_rig import EngineRig
from auth_rig import AGG, COUNTER, JOB, SECRET, ref_key, ref_mac, ref_nonce, waddr, wframe
from helpers import be32, require_gmac, wait_for
from reference import allreduce as oracle_allreduce

pytestmark = pytest.mark.sanitize

# ---- keys, MACs, secret files ---------------------------------------------------------------


@pytest.mark.parametrize("key_id", [0, 1, 7, 255, auth.AGGREGATOR])
def test_keys_match_an_independent_kdf(key_id):
    for job in (0, 1, 0xFFFFFFFF):
        assert auth.derive_key(SECRET, job, key_id) == ref_key(SECRET, key_id, job)
    # a secret reused by another job gives other keys
    assert auth.derive_key(SECRET, 1, key_id) != auth.derive_key(SECRET, 2, key_id)


ALGS = [auth.MAC_BLAKE2B] + [a for a in (auth.MAC_AES_GMAC, auth.MAC_UMAC) if _ab.mac_available(a)]


def test_aes_macs_are_available_on_ci_hosts():
    # the CPUs this runs on (x86-64 with AES-NI and PCLMULQDQ) must take
    # the fast paths, UMAC by default; a host without them would silently
    # test BLAKE2b only
    flags = open("/proc/cpuinfo").read().split()
    if "aes" in flags:
        assert _ab.default_mac() == auth.MAC_UMAC
        assert auth.MAC_UMAC in ALGS
    if "aes" in flags and "pclmulqdq" in flags:
        assert auth.MAC_AES_GMAC in ALGS


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("key_id", [0, 255, auth.AGGREGATOR])
def test_macs_match_an_independent_implementation_on_random_frames(alg, key_id):
    rng = np.random.default_rng(key_id)
    key = auth.derive_key(SECRET, JOB, key_id)
    for n in (32, 33, 48, 1056, 8224):
        data = rng.bytes(n)
        for direction in (0, 1):
            for counter in (0, 1, 2**32 + 5, 2**48 - 1):
                want = ref_mac(key, data, alg, direction, counter)
                assert auth.mac(key, data, alg, direction, counter) == want
                assert _ab.verify(alg, key, direction, counter, data, want)
                if alg == auth.MAC_AES_GMAC:
                    # the nonce is part of the MAC: another counter or
                    # direction gives another tag
                    assert not _ab.verify(alg, key, direction ^ 1, counter, data, want)
                    assert not _ab.verify(alg, key, direction, counter + 1, data, want)
        assert _ab.nonce(data, 1, 0x0102030405060708) == ref_nonce(data, 1, 0x0102030405060708)


def test_aes_gmac_known_answer():
    """AES-256-GCM with an empty plaintext (GMAC): the test case of the
    GCM specification (McGrew and Viega, test case 13: zero key, zero
    nonce, nothing to authenticate) through the Python oracle, then a fixed
    frame through both implementations."""
    assert (
        AESGCM(bytes(32)).encrypt(bytes(12), b"", b"").hex() == "530f8afbc74536b9a963b4f1c4cb738b"
    )
    require_gmac(auth.MAC_AES_GMAC in ALGS)
    hdr = bytes(range(32))
    key = bytes(range(100, 132))
    # shard hdr[23] = 23, direction 1, counter 7, incarnation hdr[24:28]
    assert ref_nonce(hdr, 1, 7) == bytes([23, 1, 0, 0, 0, 0, 0, 7, 24, 25, 26, 27])
    assert auth.mac(key, hdr, auth.MAC_AES_GMAC, 1, 7) == AESGCM(key).encrypt(
        bytes([23, 1, 0, 0, 0, 0, 0, 7, 24, 25, 26, 27]), b"", hdr
    )


def test_an_exhausted_counter_never_reuses_a_nonce():
    require_gmac(auth.MAC_AES_GMAC in ALGS)
    key, data = bytes(32), bytes(range(64))
    for counter in (2**48, 2**48 + 1, 2**64 - 1):
        # the nonce holds 48 bits: past them the MAC verifies nothing
        tag = auth.mac(key, data, auth.MAC_AES_GMAC, 0, counter)
        assert tag != ref_mac(key, data, auth.MAC_AES_GMAC, 0, counter)
        assert not _ab.verify(auth.MAC_AES_GMAC, key, 0, counter, data, tag)


def test_counter_extension():
    ext = _ab.counter_extend
    assert ext(0, 5) == 5
    assert ext(2**32 + 10, 0xFFFFFFF0) == 0xFFFFFFF0  # a late frame
    assert ext(0xFFFFFFF0, 5) == 2**32 + 5  # the 32 bits wrapped
    assert ext(5 * 2**32 + 7, 9) == 5 * 2**32 + 9
    assert ext(0, 0xFFFFFFFF) == 0xFFFFFFFF  # nothing below 0


def test_key_ids_and_lengths_are_checked():
    with pytest.raises(InvalidArgument):
        auth.derive_key(SECRET, JOB, 256)  # neither a worker nor the aggregator
    with pytest.raises(InvalidArgument):
        auth.derive_key(SECRET[:31], JOB, 0)
    with pytest.raises(InvalidArgument):
        auth.mac(b"short", bytes(32))
    with pytest.raises(InvalidArgument):
        auth.mac_code("hmac")


def test_frames_carry_the_flag_and_the_mac_over_header_and_payload():
    f = wframe(2)
    v = parse_frame(f)
    assert v.flags & FLAG_AUTH and len(v.mac) == 16
    hdr_and_payload = f[42 : 42 + 32 + len(v.payload)]
    assert v.mac == ref_mac(ref_key(SECRET, 2), hdr_and_payload)
    assert f[-16:] == v.mac


def test_secret_file_owner_only(tmp_path):
    path = tmp_path / "job.secret"
    old = os.umask(0)
    try:
        secret = auth.create_secret_file(path)
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert auth.load_secret(path) == secret
    with pytest.raises(FileExistsError):
        auth.create_secret_file(path)
    for mode in (0o640, 0o604, 0o620):
        os.chmod(path, mode)
        with pytest.raises(auth.SecretFileError) as ei:
            auth.load_secret(path)
        assert f"accessible by its group or others (mode {mode:04o})" in str(ei.value)
        assert f"chmod 600 {path}" in str(ei.value)
        assert secret.hex() not in str(ei.value)
    os.chmod(path, 0o600)
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)
        with pytest.raises(auth.SecretFileError, match="belongs to uid 65534"):
            auth.load_secret(path)
        os.chown(path, 0, 0)
    bad = tmp_path / "bad.secret"
    fd = os.open(bad, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"00ff\n")
    os.close(fd)
    with pytest.raises(auth.SecretFileError, match="64 hexadecimal digits"):
        auth.load_secret(bad)
    with pytest.raises(auth.SecretFileError, match="No such file"):
        auth.load_secret(tmp_path / "missing")


# ---- the engine ------------------------------------------------------------------------------


class Rig(EngineRig):
    def __init__(self, workers=3, replicate=False):
        super().__init__(
            replicate=replicate,
            workers=workers,
            slots=4,
            auth=SECRET,
            group="239.1.2.3" if replicate else 0,
        )

    def drops(self):
        c = self.eng.counters()
        return {
            k: v
            for k, v in c.items()
            if v
            and k
            not in (
                "received",
                "summed",
                "completed",
                "results_sent",
                "duplicates",
                "replays",
                "status_sent",
                "status_repeats",
            )
        }


def test_engine_sums_authenticated_frames_and_macs_its_results():
    rig = Rig(workers=3)
    res = rig.send(*[wframe(w) for w in range(3)])
    assert len(res) == 3
    agg_key = ref_key(SECRET, auth.AGGREGATOR)
    want = sum(np.arange(8) * (w + 1) for w in range(3))
    for r in res:
        assert r.flags & FLAG_RESULT and r.flags & FLAG_AUTH
        assert np.frombuffer(r.payload, ">i4").tolist() == want.tolist()
    # every result's MAC verifies with the aggregator's key (rebuilt here)
    rig2 = Rig(workers=1, replicate=True)
    rig2.port.inject(wframe(0, payload=be32([5, 6])))
    rig2.eng.poll_all()
    raw = rig2.port.pop_all()
    assert len(raw) == 1
    v = parse_frame(raw[0])
    assert v.mac == ref_mac(agg_key, raw[0][42 : 42 + 32 + len(v.payload)], direction=1)
    assert rig.drops() == {} and rig2.drops() == {}


def test_engine_drops_forged_flipped_unflagged_and_old_frames_before_any_state():
    rig = Rig(workers=3)
    x = {w: np.arange(8) * (w + 3) for w in range(3)}
    rig.send(wframe(0, payload=be32(x[0])))
    thief = Addr.of("02:66:66:66:66:66", "10.9.9.9", 6666)
    # no UDP checksum: the MAC, not the checksum, must catch the flip
    flipped = bytearray(wframe(1, payload=be32(x[1]), udp_csum=False))
    flipped[42 + 32 + 5] ^= 0x10
    hostile = {
        # worker 0 speaks for worker 1 with its own key, from its own host
        "forged_id": wframe(1, key_of=0, payload=be32([999] * 8), src=thief),
        "flipped_bit": bytes(flipped),
        "no_flag": wframe(1, payload=be32([999] * 8), key=False),
        "zero_mac": wframe(1, payload=be32([999] * 8), key=False, flags=FLAG_AUTH),
        # an earlier life of worker 0 (its first frame used incarnation 1)
        "old_incarnation": wframe(0, incarnation=0xFFFFFFFF, payload=be32([999] * 8)),
    }
    for name, f in hostile.items():
        assert rig.send(f) == [], name
    assert rig.drops() == {"bad_mac": 4, "old_incarnation": 1}
    # the forged frames taught the engine no address: worker 1's result goes
    # to worker 1's own host
    res = rig.send(wframe(1, payload=be32(x[1])), wframe(2, payload=be32(x[2])))
    assert len(res) == 3
    assert {r.worker: r.dst for r in res} == {w: waddr(w) for w in range(3)}
    assert all(
        np.frombuffer(r.payload, ">i4").tolist() == (x[0] + x[1] + x[2]).tolist() for r in res
    )
    # a replayed frame of the finished chunk is a duplicate: answered with the
    # result to the worker's learned address, never summed again
    out = rig.send(wframe(1, payload=be32(x[1])))
    assert len(out) == 1 and out[0].dst == waddr(1)
    c = rig.eng.counters()
    assert c["summed"] == 3 and c["replays"] == 1
    rig.port.pop_all()
    assert rig.port.free_count == rig.pool


SECRET2 = bytes(range(50, 82))


def eframe(w, seq, payload, epoch=0, secret=SECRET, alg=None, **kw):
    """Worker w's chunk seq in key epoch ``epoch``, MACed with ``secret``'s key."""
    return build_frame(
        waddr(w),
        AGG,
        op="sum32",
        job=JOB,
        token=77,
        worker=w,
        seq=seq,
        slot=seq % 4,
        flags=epoch << 8 | (4 if (seq // 4) % 2 else 0),
        payload=payload,
        incarnation=1,
        key=ref_key(secret, w),
        alg=alg,
        counter=next(COUNTER),
        **kw,
    )


@pytest.mark.parametrize("alg", ALGS)
def test_engine_key_rotation_with_a_grace_period(alg):
    """A new key epoch registered on a live job (virtual time): replies use
    it at once; frames of the old epoch are summed within the grace period,
    dropped as bad_mac after it; no other epoch is ever accepted; every sum
    exact and every reply's MAC verifies (Python oracle) with the key of the
    epoch it names."""
    rig = EngineRig(workers=2, slots=4, auth=SECRET, mac=auth.MAC_NAMES[alg])
    rig.port.set_time(1_000_000_000)
    xs = {w: np.arange(8) * (w + 2) - 3 for w in range(2)}
    want = be32(xs[0] + xs[1])

    res = rig.send(eframe(0, 0, be32(xs[0]), alg=alg), eframe(1, 0, be32(xs[1]), alg=alg))
    assert [r.payload for r in res] == [want, want]
    assert all(r.flags >> 8 == 0 for r in res)
    assert rig.eng.rotate_key(JOB, SECRET2, grace=0.5) == 1
    # within the grace period: one worker still in epoch 0, one in epoch 1
    res = rig.send(
        eframe(0, 1, be32(xs[0]), alg=alg),
        eframe(1, 1, be32(xs[1]), epoch=1, secret=SECRET2, alg=alg),
    )
    assert [r.payload for r in res] == [want, want]
    assert all(r.flags >> 8 == 1 for r in res)
    rig.port.inject(eframe(0, 2, be32(xs[0]), epoch=1, secret=SECRET2, alg=alg))
    rig.port.inject(eframe(1, 2, be32(xs[1]), epoch=1, secret=SECRET2, alg=alg))
    rig.eng.poll_all()
    raw_replies = rig.port.pop_all()
    assert len(raw_replies) == 2
    for raw in raw_replies:
        v = parse_frame(raw)
        assert v.payload == want and v.flags >> 8 == 1
        data = raw[42 : 42 + 32 + len(v.payload)]
        assert v.mac == ref_mac(ref_key(SECRET2, auth.AGGREGATOR), data, alg, 1)
        assert v.mac != ref_mac(ref_key(SECRET, auth.AGGREGATOR), data, alg, 1)
    assert rig.eng.counters()["bad_mac"] == 0
    # after the grace period: epoch 0 is bad_mac; a never-registered epoch too,
    # and a frame of the new epoch MACed with the old secret
    rig.port.set_time(1_600_000_000)
    for bad in (
        eframe(0, 3, be32([9] * 8), alg=alg),
        eframe(0, 3, be32([9] * 8), epoch=2, secret=SECRET2, alg=alg),
        eframe(0, 3, be32([9] * 8), epoch=1, secret=SECRET, alg=alg),
    ):
        assert rig.send(bad) == []
    assert rig.eng.counters()["bad_mac"] == 3
    res = rig.send(
        eframe(0, 3, be32(xs[0]), epoch=1, secret=SECRET2, alg=alg),
        eframe(1, 3, be32(xs[1]), epoch=1, secret=SECRET2, alg=alg),
    )
    assert [r.payload for r in res] == [want, want]
    assert rig.eng.counters()["summed"] == 8
    with pytest.raises(HomAggError):
        rig.eng.rotate_key(JOB + 1, SECRET2)  # no such job
    plain = EngineRig(workers=1, slots=4)
    with pytest.raises(HomAggError):
        plain.eng.rotate_key(1, SECRET2)  # a job without auth
    rig.port.pop_all()
    rig.no_leak()


def test_job_without_auth_refuses_macs_and_auth_job_refuses_plain_frames():
    port = MemPort()
    eng = Engine(port)
    eng.add_job(job=1, token=77, workers=1, slots=4)
    eng.add_job(job=2, token=77, workers=1, slots=4, auth=SECRET)
    port.inject(wframe(0))  # job 1 with a MAC
    port.inject(
        build_frame(
            waddr(0), AGG, op="sum32", job=2, token=77, worker=0, seq=0, slot=0, payload=be32([1])
        )
    )  # job 2 without
    eng.poll_all()
    assert port.pop_all() == []
    assert eng.job_counters(1)["bad_mac"] == 1 and eng.job_counters(2)["bad_mac"] == 1
    assert eng.job_config(2)["auth"] == 1
    with pytest.raises(InvalidArgument):
        eng.add_job(job=3, token=1, workers=1, slots=1, auth=b"short")


# ---- the simulated cluster -------------------------------------------------------------------


def grads_of(W, n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(W):
        x = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3, n)).astype(np.float32)
        x[rng.random(n) < 0.7] = 0
        out.append(x)
    return out


@pytest.mark.parametrize("method", ["dense", "lhc"])
def test_cluster_with_auth_is_exact(method):
    grads = grads_of(4, 20000, seed=3)
    with Cluster(workers=4, seed=2, auth=True, loss=0.01) as cl:
        res = cl.allreduce(grads, method=method, block_elements=1024)
        want = oracle_allreduce(grads, 1024)
        for y in res.outputs:
            assert y.tobytes() == want.tobytes()
        assert res.stats["engine"]["bad_mac"] == 0
        assert all(st["bad_mac"] == 0 for st in res.stats["workers"])


@pytest.mark.parametrize("mac", [auth.MAC_NAMES[a] for a in ALGS])
def test_cluster_with_auth_drops_each_hostile_frame_under_its_reason(mac):
    """Against the running allreduce: a worker forging another's id, a frame
    with a flipped payload bit, a replayed frame of the finished allreduce,
    a frame of an old incarnation, one of a key epoch the job does not have,
    one MACed with another secret's key and one cut short, each with a MAC
    made with a real key (a member's): each is dropped and counted under
    its reason, and the sum stays exact."""
    grads = grads_of(3, 8000, seed=4)
    with Cluster(workers=3, seed=5, slots=8, auth=True, mac=mac) as cl:
        job = cl.job
        want = oracle_allreduce(grads, 1024)
        first = cl.allreduce(grads, method="dense", block_elements=1024)
        assert first.sum.tobytes() == want.tobytes()
        st = job.worker_stats(0)
        # the next allreduce's first chunk, and a full chunk of the finished one
        seq, done = st["next_seq"], st["next_seq"] - 2
        bogus = np.full(256, 0x01010101, ">i4").tobytes()

        def f(worker, key_of, s, **kw):
            return cl.build_frame(
                job,
                payload=bogus,
                worker=worker,
                seq=s,
                slot=s % 8,
                flags=lib_shadow(s),
                key=job.key(key_of),
                **kw,
            )

        flipped = bytearray(f(1, 1, seq))
        flipped[42 + 32 + 100] ^= 0x04
        cases = {
            "forged_id": (f(1, 0, seq), "bad_mac"),
            "flipped_bit": (bytes(flipped), "bad_mac"),
            # the last chunk of the finished allreduce, as worker 2 sent it
            # (its payload aside), flagged as a retransmission
            "replay": (
                cl.build_frame(
                    job,
                    payload=bogus,
                    worker=2,
                    seq=done,
                    slot=done % 8,
                    flags=lib_shadow(done) | FLAG_RETRANS,
                    key=job.key(2),
                ),
                "replays",
            ),
            "old_incarnation": (f(0, 0, seq, incarnation=999), "old_incarnation"),
            "wrong_epoch": (
                cl.build_frame(
                    job,
                    payload=bogus,
                    worker=1,
                    seq=seq,
                    slot=seq % 8,
                    flags=lib_shadow(seq) | 1 << 8,
                    key=job.key(1),
                ),
                "bad_mac",
            ),
            "wrong_key": (
                cl.build_frame(
                    job,
                    payload=bogus,
                    worker=1,
                    seq=seq,
                    slot=seq % 8,
                    flags=lib_shadow(seq),
                    key=auth.derive_key(bytes(32), job.wire_id, 1),
                ),
                "bad_mac",
            ),
            "truncated": (f(1, 1, seq)[:-4], "truncated"),
        }
        before = cl.engine_counters()
        for frame, _reason in cases.values():
            cl.inject(frame)
        second = cl.allreduce(grads, method="dense", block_elements=1024)
        for y in second.outputs:
            assert y.tobytes() == want.tobytes()
        delta = {k: v - before[k] for k, v in cl.engine_counters().items()}
        assert delta["bad_mac"] == 4
        assert delta["old_incarnation"] == 1
        assert delta["truncated"] == 1
        assert delta["replays"] >= 1  # answered with the old result, nothing summed
        chunks = second.stats["workers"][0]["chunks"] - st["chunks"]
        assert delta["summed"] == 3 * chunks


def lib_shadow(seq, slots=8):
    from homagg._native import lib

    return lib.HG_FLAG_SHADOW if (seq // slots) % 2 else 0


def test_cluster_without_auth_unchanged():
    grads = grads_of(3, 5000, seed=6)
    with Cluster(workers=3, seed=7) as cl:
        assert cl.job.secret is None
        res = cl.allreduce(grads, method="lhc", block_elements=1024)
        assert res.sum.tobytes() == oracle_allreduce(grads, 1024).tobytes()
        assert res.stats["engine"]["bad_mac"] == 0


# ---- workers over loopback UDP: forged results are dropped by the worker ---------------------


def test_worker_drops_results_without_the_aggregators_mac(tmp_path):
    from udp_rig import LoopbackAggregator

    agg = LoopbackAggregator()
    secret_file = tmp_path / "job.secret"
    secret = auth.create_secret_file(secret_file)
    agg.engine.add_job(job=9, token=5, workers=1, slots=4, auth=secret)
    x = grads_of(1, 30000, seed=8)[0]
    stop = threading.Event()
    try:
        with Worker(
            job=9,
            token=5,
            worker=0,
            workers=1,
            aggregator=agg.address,
            bind=("127.0.0.1", 0),
            slots=4,
            timeout=10.0,
            auth_file=secret_file,
        ) as w:
            me = w.local_address
            worker_key = auth.derive_key(secret, 9, 0)

            def one_round(s):
                # results of every early chunk, MAC'd with the worker's own
                # key (not the aggregator's), from the aggregator's address
                # family: they must never be placed
                for seq in range(64):
                    fr = build_frame(
                        Addr.of("02:00:00:00:00:09", agg.address[0], agg.address[1]),
                        Addr.of("02:00:00:00:00:08", me[0], me[1]),
                        op="max8",
                        job=9,
                        token=5,
                        worker=0,
                        seq=seq,
                        slot=seq % 4,
                        lanes=30,
                        payload=bytes(30),
                        flags=FLAG_RESULT,
                        key=worker_key,
                    )
                    s.sendto(fr[42:], me)

            def rogue():
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                try:
                    while not stop.is_set():
                        one_round(s)
                finally:
                    s.close()

            # one round queued on the worker's socket before the allreduce
            # starts (read first, whatever the scheduler does with the
            # thread), then a flood while it runs
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s0:
                one_round(s0)
            t = threading.Thread(target=rogue, daemon=True)
            t.start()
            y = w.allreduce(x, method="dense", block=1024)
            stop.set()
            t.join(10)
            assert y.tobytes() == oracle_allreduce([x], 1024).tobytes()
            assert w.stats()["bad_mac"] > 0
    finally:
        stop.set()
        agg.close()


def test_worker_started_after_a_rotation_uses_the_epoch_it_is_given(tmp_path):
    """A worker process started after a rotation reads the new secret with
    its epoch (the job file's key_epoch) and is exact; one started with the
    new secret but epoch 0 is refused by the aggregator (bad_mac) and times
    out instead of summing anything."""
    from udp_rig import LoopbackAggregator

    from homagg.errors import PeerTimeout

    agg = LoopbackAggregator()
    first, second = tmp_path / "e0.secret", tmp_path / "e1.secret"
    auth.create_secret_file(first, SECRET)
    auth.create_secret_file(second, SECRET2)
    agg.engine.add_job(job=9, token=5, workers=1, slots=4, auth=SECRET)
    assert agg.engine.rotate_key(9, SECRET2, grace=0.0) == 1
    x = grads_of(1, 5000, seed=9)[0]
    try:
        with Worker(
            job=9,
            token=5,
            worker=0,
            workers=1,
            aggregator=agg.address,
            bind=("127.0.0.1", 0),
            slots=4,
            timeout=10.0,
            auth_file=second,
            key_epoch=1,
        ) as w:
            y = w.allreduce(x, method="dense", block=1024)
            assert y.tobytes() == oracle_allreduce([x], 1024).tobytes()
            assert w.stats()["bad_mac"] == 0
        before = agg.engine.counters()["bad_mac"]
        with Worker(
            job=9,
            token=5,
            worker=0,
            workers=1,
            aggregator=agg.address,
            bind=("127.0.0.1", 0),
            slots=4,
            timeout=0.5,
            auth_file=second,
        ) as w:
            with pytest.raises(PeerTimeout):
                w.allreduce(x, method="dense", block=1024)
        # the aggregator's thread counts the frames it polled (it may run
        # after the worker gave up)
        wait_for(lambda: agg.engine.counters()["bad_mac"] > before, 20, "bad_mac counted")
    finally:
        agg.close()


@pytest.mark.parametrize("mac", [auth.MAC_NAMES[a] for a in ALGS])
def test_cluster_key_rotation_fails_no_allreduce(mac):
    """NIC model, virtual time, 2% loss: the job's workers get a new key
    epoch, then its aggregator with a 1 ms grace period; the allreduces
    across the switch and after the grace period are all exact with no
    frame refused, so the workers moved to the new epoch; afterwards a
    frame of the old epoch is bad_mac and one of the new is summed."""
    grads = grads_of(4, 20000, seed=12)
    want = oracle_allreduce(grads, 1024)
    with Cluster(workers=4, seed=13, slots=8, auth=True, mac=mac, loss=0.02) as cl:
        job = cl.job
        old_key = job.key(1)
        assert (
            cl.allreduce(grads, method="lhc", block_elements=1024).sum.tobytes() == want.tobytes()
        )
        assert cl.rotate_key(SECRET2, grace=0.001) == 1
        t_rotate = cl.stats()["now_ns"]
        # at least 3 allreduces, and on until the grace period is over
        # (virtual time: how long they take depends on the loss recovery)
        for i in range(100):
            if i >= 3 and cl.stats()["now_ns"] - t_rotate > 1_000_000:
                break
            res = cl.allreduce(grads, method="dense", block_elements=1024)
            for y in res.outputs:
                assert y.tobytes() == want.tobytes()
        assert cl.stats()["now_ns"] - t_rotate > 1_000_000
        assert cl.engine_counters()["bad_mac"] == 0
        assert all(st["bad_mac"] == 0 for st in res.stats["workers"])
        st = job.worker_stats(0)
        seq = st["next_seq"]
        bogus = np.full(256, 0x01010101, ">i4").tobytes()
        before = cl.engine_counters()
        # the old epoch's key, after the grace period
        cl.inject(
            cl.build_frame(
                job,
                payload=bogus,
                worker=1,
                seq=seq,
                slot=seq % 8,
                flags=lib_shadow(seq),
                key=old_key,
            )
        )
        # an earlier frame of the new epoch: its MAC verifies (a duplicate
        # or stale, never bad_mac)
        cl.inject(
            cl.build_frame(
                job,
                payload=bogus,
                worker=1,
                seq=seq - 8,
                slot=seq % 8,
                flags=lib_shadow(seq - 8) | 1 << 8,
                key=job.key(1),
                counter=2**31,
            )
        )
        res = cl.allreduce(grads, method="dense", block_elements=1024)
        assert res.sum.tobytes() == want.tobytes()
        delta = {k: v - before[k] for k, v in cl.engine_counters().items()}
        assert delta["bad_mac"] == 1
