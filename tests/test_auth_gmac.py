"""AES-GMAC's ISA paths (HOMAGG_MAC_ISA: portable, pclmul, avx2, avx512), and
the engine's checks of AES-GMAC and UMAC frames (one path each, bursts).

Each path is forced in turn and its tags compared, bit for bit, with NIST's
known answers (typed in below) and with the ``cryptography`` package's
AESGCM (OpenSSL, independent of the project's C) on frames of every length
class 0..9000: below, at and across 16-byte blocks, the 64-byte zmm loads
and the reductions of 144 blocks (2304 bytes).  A path is skipped only where /proc/cpuinfo
lacks its instructions; where the CPU has them, its absence fails.
"""

import os
import random

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from homagg import auth
from homagg.bindings import auth as _ab
from homagg.engine import Engine, MemPort
from homagg.errors import InvalidArgument
from helpers import cpu_flags
from auth_rig import PATH_FLAGS, force_mac_path

pytestmark = pytest.mark.sanitize

CPU = cpu_flags()


@pytest.fixture(params=list(PATH_FLAGS))
def mac_path(request, monkeypatch):
    """HOMAGG_MAC_ISA forced to one path for the test (auth_rig.force_mac_path)."""
    yield from force_mac_path(request.param, monkeypatch)


@pytest.fixture(params=["aes-gmac", "umac"])
def mac_alg(request):
    """The job's MAC algorithm for the engine tests below."""
    return request.param


def test_paths_match_the_cpu():
    # the default is the widest path the CPU has; every path it has is offered
    best = [isa for isa in PATH_FLAGS if PATH_FLAGS[isa] <= CPU]
    assert [i for i in _ab.MAC_ISAS if _ab.mac_isa_available(i)] == best
    if "HOMAGG_MAC_ISA" not in os.environ:
        assert _ab.mac_isa() == best[-1]


# NIST known answers, AES-256, 96-bit IV, empty plaintext, 128-bit tag:
# (key, IV, AAD, tag).  The first is Test Case 13 of "The Galois/Counter Mode
# of Operation (GCM)" (McGrew, Viega); the others are from the CAVP file
# gcmEncryptExtIV256.rsp, [PTlen = 0], AADlen 0, 128, 128 and 160.
NIST = [
    ("00" * 32, "00" * 12, "", "530f8afbc74536b9a963b4f1c4cb738b"),
    (
        "b52c505a37d78eda5dd34f20c22540ea1b58963cf8e5bf8ffa85f9f2492505b4",
        "516c33929df5a3284ff463d7",
        "",
        "bdc1ac884d332457a1d2664f168c76f0",
    ),
    (
        "78dc4e0aaf52d935c3c01eea57428f00ca1fd475f5da86a49c8dd73d68c8e223",
        "d79cf22d504cc793c3fb6c8a",
        "b96baa8c1c75a671bfb2d08d06be5f36",
        "3e5d486aa2e30b22e040b85723a06e76",
    ),
    (
        "4457ff33683cca6ca493878bdc00373893a9763412eef8cddb54f91318e0da88",
        "699d1f29d7b8c55300bb1fd2",
        "6749daeea367d0e9809e2dc2f309e6e3",
        "d60c74d2517fde4a74e0cd4709ed43a9",
    ),
    (
        "886cff5f3e6b8d0e1ad0a38fcdb26de97e8acbe79f6bed66959a598fa5047d65",
        "3a8efa1cd74bbab5448f9945",
        "519fee519d25c7a304d6c6aa1897ee1eb8c59655",
        "f6d47505ec96c98a42dc3ae719877b87",
    ),
]


@pytest.mark.parametrize("key,iv,aad,tag", NIST)
def test_nist_known_answers(mac_path, key, iv, aad, tag):
    key, iv, aad, tag = (bytes.fromhex(x) for x in (key, iv, aad, tag))
    assert AESGCM(key).encrypt(iv, b"", aad) == tag  # the reference agrees
    assert _ab.gmac(key, iv, aad) == tag


def _lengths():
    """Every length 0..300 (all block, zmm-load and tail shapes of the first
    chunk), every length around each multiple of 256 and of 1152 (the
    reductions of 144 blocks, 2304 bytes, and of the 72 they once were: the
    data's last block and the length block on either side of one) up to
    9000, and 300 more drawn at random up to 9000."""
    rng = random.Random(22)
    out = set(range(301))
    for m in [*range(256, 9001, 256), *range(1152, 9001, 1152)]:
        out.update(range(m - 33, min(m + 18, 9001)))
    out.update(rng.randrange(9001) for _ in range(300))
    out.add(9000)
    return sorted(out)


LENGTHS = _lengths()


def test_random_frames_match_cryptography(mac_path):
    rng = random.Random(0x6D4143)
    data = rng.randbytes(9000)
    for n in LENGTHS:
        key, iv = rng.randbytes(32), rng.randbytes(12)
        assert _ab.gmac(key, iv, data[:n]) == AESGCM(key).encrypt(iv, b"", data[:n]), (
            f"{mac_path}: {n} bytes"
        )


def test_frame_macs_match_cryptography(mac_path):
    # hg_auth_mac: the frame's own nonce (shard, direction, counter,
    # incarnation), both directions, counters up to 2^48 - 1
    rng = random.Random(7)
    for n in (32, 33, 47, 48, 64, 1056, 1057, 4128, 8224, 9000):
        key, data = rng.randbytes(32), rng.randbytes(n)
        for direction in (auth.DIR_REQUEST, auth.DIR_REPLY):
            for counter in (1, 0xFFFFFFFF + 5, 2**48 - 1):
                nonce = bytes([data[23], direction]) + counter.to_bytes(6, "big") + data[24:28]
                want = AESGCM(key).encrypt(nonce, b"", data)
                got = _ab.mac(auth.MAC_AES_GMAC, key, direction, counter, data)
                assert got == want, f"{mac_path}: {n} bytes, counter {counter}"
                assert _ab.verify(auth.MAC_AES_GMAC, key, direction, counter, data, want)
                bad = bytearray(data)
                bad[rng.randrange(n)] ^= 1 << rng.randrange(8)
                assert not _ab.verify(auth.MAC_AES_GMAC, key, direction, counter, bytes(bad), want)


def test_engine_on_each_path_and_a_key_keeps_its_path(mac_path, mac_alg, monkeypatch):
    # the engine verifies workers' frames and MACs its results on the path
    # forced when the job was registered; reloading another path later
    # changes neither (every path gives the same bytes): the sums exact, no
    # bad_mac, each result's tag equal to cryptography's
    import numpy as np

    from engine_rig import EngineRig
    from auth_rig import SECRET, ref_key, ref_mac, wframe
    from helpers import be32
    from homagg.engine import parse_frame

    rig = EngineRig(
        workers=2,
        slots=4,
        auth=SECRET,
        mac=mac_alg,
        replicate=True,
        payload_bytes=1200,
        group="239.1.2.3",
    )
    other = "portable" if mac_path != "portable" else "pclmul"
    if _ab.mac_isa_available(other):
        monkeypatch.setenv("HOMAGG_MAC_ISA", other)
        assert _ab.mac_isa_reload() == other
    xs = [np.arange(300) * 7 - 5, np.arange(300) * -3 + 11]
    for w in (0, 1):
        rig.port.inject(wframe(w, payload=be32(xs[w]), alg=auth.mac_code(mac_alg)))
    rig.eng.poll_all()
    raw = rig.port.pop_all()
    assert len(raw) == 1
    v = parse_frame(raw[0])
    assert v.payload == be32(xs[0] + xs[1])
    data = raw[0][42 : 42 + 32 + len(v.payload)]
    assert v.mac == ref_mac(ref_key(SECRET, auth.AGGREGATOR), data, auth.mac_code(mac_alg), 1)
    c = rig.eng.counters()
    assert c["bad_mac"] == 0 and c["summed"] == 2


@pytest.mark.parametrize(
    "value,words",
    [
        ("sse", "names no MAC path"),
        ("AVX512", "names no MAC path"),
    ],
)
def test_a_bad_path_name_is_refused_in_one_line(monkeypatch, value, words):
    monkeypatch.setenv("HOMAGG_MAC_ISA", value)
    try:
        with pytest.raises(InvalidArgument) as ei:
            _ab.mac_isa_reload()
        msg = str(ei.value)
        assert "HOMAGG_MAC_ISA" in msg and words in msg and "\n" not in msg
        assert "portable, pclmul, avx2, avx512" in msg
        # the API that makes keys refuses the same way, by name
        with pytest.raises(InvalidArgument, match="HOMAGG_MAC_ISA"):
            _ab.mac(auth.MAC_AES_GMAC, bytes(32), 0, 1, bytes(32))
        with pytest.raises(InvalidArgument, match="HOMAGG_MAC_ISA"):
            Engine(MemPort()).add_job(
                job=1, token=1, workers=2, slots=4, auth=bytes(32), mac="aes-gmac"
            )
    finally:
        monkeypatch.undo()
        _ab.mac_isa_reload()


@pytest.mark.parametrize("workers", [3, 10, 17])
@pytest.mark.parametrize("lanes", [7, 8])
def test_authenticated_replies_carry_a_checksum_over_the_mac(workers, lanes):
    # a reply's UDP checksum covers its MAC: added to the payload's sum
    # where the MAC starts 16-bit aligned (results, and STATUS: its two
    # bitmaps, present and active, are of even length together), summed
    # again where not; parse_frame checks the checksum, cryptography the MAC
    import numpy as np

    from engine_rig import EngineRig
    from homagg.engine import FLAG_RETRANS, FLAG_STATUS
    from auth_rig import SECRET, ref_key, ref_mac, wframe
    from helpers import be32
    from homagg.engine import parse_frame

    rig = EngineRig(
        workers=workers,
        slots=4,
        auth=SECRET,
        payload_bytes=4 * lanes,
        replicate=True,
        group="239.1.2.3",
    )
    key = ref_key(SECRET, auth.AGGREGATOR)
    payloads = [be32(np.arange(lanes) * (w + 3) - w) for w in range(workers)]
    rig.port.inject(wframe(0, payload=payloads[0]))
    rig.port.inject(wframe(0, payload=payloads[0], flags=FLAG_RETRANS))
    for w in range(1, workers):
        rig.port.inject(wframe(w, payload=payloads[w]))
    rig.eng.poll_all()
    raw = rig.port.pop_all()
    kinds = []
    for f in raw:
        v = parse_frame(f)
        assert not isinstance(v, str), v  # e.g. "bad_csum"
        data = f[42 : 42 + 32 + len(v.payload)]
        assert v.mac == ref_mac(key, data, None, 1)  # the default MAC
        kinds.append((bool(v.flags & FLAG_STATUS), len(v.payload)))
    want = sum(np.frombuffer(p, ">i4").astype(np.int64) for p in payloads)
    assert kinds == [(True, 2 * ((workers + 7) // 8)), (False, 4 * lanes)]
    assert parse_frame(raw[-1]).payload == be32(want)


# ---- the engine checks a burst's MACs together ------------------------------------------------
# The engine checks the MACs of a burst's authenticated frames together
# (engine.c verify_burst, auth.c hg_mac_key_check_burst: the E_K(J0) of up
# to 32 frames pipelined), and must decide exactly as one frame at a time:
# the same counters (a bad MAC counted before any check after it), the same
# replies byte for byte, the sums exact against numpy.


def _auth_stream(rng, W=5, chunks=12, lanes=256, mac="aes-gmac"):
    """Good frames of W workers (1 KB payloads: 66 blocks and the length
    block, one reduction each), shuffled, with forged, flipped, retransmitted,
    bad-slot-good-MAC, bad-slot-forged and header-damaged frames among
    them; returns the
    frames, the expected {seq: sum} and the hostile frames' counts."""
    import numpy as np

    from auth_rig import AGG, JOB, SECRET, ref_key, waddr
    from homagg.engine import build_frame
    from helpers import be32

    def f(w, seq, x, key_of=None, slot=None, flip=False):
        b = bytearray(
            build_frame(
                waddr(w),
                AGG,
                op="sum32",
                job=JOB,
                token=77,
                worker=w,
                seq=seq,
                slot=seq % 4 if slot is None else slot,
                flags=4 if (seq // 4) % 2 else 0,
                payload=be32(x),
                incarnation=1,
                key=ref_key(SECRET, w if key_of is None else key_of),
                alg=auth.mac_code(mac),
                counter=next(ctr),
                udp_csum=not flip,
            )
        )
        if flip:
            b[42 + 32 + int(rng.integers(0, 4 * lanes))] ^= 1 << int(rng.integers(0, 8))
        return bytes(b)

    import itertools

    ctr = itertools.count(1)
    frames, sums = [], {}
    n = {"bad_mac": 0, "bad_slot": 0}
    for seq in range(chunks):
        xs = [rng.integers(-(2**20), 2**20, lanes) for _ in range(W)]
        sums[seq] = np.sum(xs, axis=0)
        for w in rng.permutation(W):
            w = int(w)
            good = f(w, seq, xs[w])
            frames.append(good)
            r = rng.random()
            if r < 0.15:  # another worker's key
                frames.append(f(w, seq, xs[w] + 1, key_of=(w + 1) % W))
                n["bad_mac"] += 1
            elif r < 0.3:  # a flipped payload bit
                frames.append(f(w, seq, xs[w], flip=True))
                n["bad_mac"] += 1
            elif r < 0.45:  # a good MAC, a bad slot
                frames.append(f(w, seq, xs[w], slot=(seq + 1) % 4))
                n["bad_slot"] += 1
            elif r < 0.6:  # a bad slot and a bad MAC
                frames.append(f(w, seq, xs[w], slot=(seq + 1) % 4, key_of=(w + 2) % W))
                n["bad_mac"] += 1
            elif r < 0.7:  # a retransmission
                frames.append(good)
            elif r < 0.85:  # a header byte changed
                # (not the incarnation, bytes 66-69: a greater one would
                # make the worker's later frames old)
                b = bytearray(good)
                i = int(rng.choice([i for i in range(74) if not 66 <= i < 70]))
                b[i] ^= int(rng.integers(1, 256))
                frames.append(bytes(b))
    return frames, sums, n


def _run_auth(frames, staged, burst, W=5, payload_bytes=1024, mac="aes-gmac"):
    from engine_rig import EngineRig
    from auth_rig import SECRET

    rig = EngineRig(workers=W, slots=4, auth=SECRET, mac=mac, payload_bytes=payload_bytes)
    eng = Engine(rig.port, burst=burst, staged=staged)
    rig.eng.close()
    rig.eng = eng
    eng.add_job(
        job=1,
        token=77,
        workers=W,
        slots=4,
        auth=SECRET,
        mac=mac,
        payload_bytes=payload_bytes,
        incarnation=7,
    )  # replies compared byte for byte
    out = []
    for i in range(0, len(frames), burst):
        for fr in frames[i : i + burst]:
            rig.port.inject(fr)
        eng.poll_all()
        out += rig.port.pop_all()
    counters, job = eng.counters(), eng.job_counters(1)
    eng.close()
    return out, counters, job


@pytest.mark.parametrize("burst", [1, 7, 33, 256])
def test_engine_burst_checks_equal_one_at_a_time(mac_path, mac_alg, burst):
    import numpy as np

    from helpers import be32
    from homagg.engine import parse_frame

    rng = np.random.default_rng(burst)
    frames, sums, n = _auth_stream(rng, mac=mac_alg)
    staged = _run_auth(frames, True, burst, mac=mac_alg)
    single = _run_auth(frames, False, burst, mac=mac_alg)
    assert staged[1] == single[1] and staged[2] == single[2]
    assert staged[0] == single[0]  # every reply, byte for byte, in order
    c = staged[1]
    # a changed header byte is dropped under some counter: at least these
    assert c["bad_mac"] >= n["bad_mac"] and c["bad_slot"] >= n["bad_slot"], (c, n)
    assert n["bad_mac"] and n["bad_slot"]
    assert c["completed"] == len(sums)
    got = {}
    for raw in staged[0]:
        v = parse_frame(raw)
        got.setdefault(v.seq, set()).add(v.payload)
    assert got == {s: {be32(x)} for s, x in sums.items()}


@pytest.mark.parametrize("burst", [2, 7, 33])
def test_engine_8k_bursts_equal_one_at_a_time(mac_path, mac_alg, burst):
    # 8 KB payloads (four 144-block reductions per frame, the next frame's
    # data prefetched during each tag): hostile frames among them decide
    # and count as one at a time, and the sums are exact
    import numpy as np

    from helpers import be32
    from homagg.engine import parse_frame

    rng = np.random.default_rng(100 + burst)
    frames, sums, n = _auth_stream(rng, chunks=8, lanes=2048, mac=mac_alg)
    staged = _run_auth(frames, True, burst, payload_bytes=8192, mac=mac_alg)
    single = _run_auth(frames, False, burst, payload_bytes=8192, mac=mac_alg)
    assert staged[1] == single[1] and staged[2] == single[2]
    assert staged[0] == single[0]  # every reply, byte for byte, in order
    c = staged[1]
    assert c["bad_mac"] >= n["bad_mac"] and c["bad_slot"] >= n["bad_slot"], (c, n)
    assert n["bad_mac"] and n["bad_slot"]
    assert c["completed"] == len(sums)
    got = {}
    for raw in staged[0]:
        v = parse_frame(raw)
        got.setdefault(v.seq, set()).add(v.payload)
    assert got == {s: {be32(x)} for s, x in sums.items()}


def test_engine_burst_extends_each_counter_after_the_frames_before_it(mac_path, mac_alg):
    # worker 0's counter jumps past 2^32 within one burst: the second
    # frame's 32 bits extend to the right counter only from the first
    # frame's (verify_burst checks it again alone); both are summed
    import numpy as np

    from engine_rig import EngineRig
    from auth_rig import AGG, JOB, SECRET, ref_key, waddr
    from homagg.engine import build_frame
    from helpers import be32

    def f(w, seq, x, counter):
        return build_frame(
            waddr(w),
            AGG,
            op="sum32",
            job=JOB,
            token=77,
            worker=w,
            seq=seq,
            slot=seq,
            payload=be32(x),
            incarnation=1,
            key=ref_key(SECRET, w),
            counter=counter,
            alg=auth.mac_code(mac_alg),
        )

    rig = EngineRig(workers=2, slots=4, auth=SECRET, mac=mac_alg)
    x = [np.arange(8) + 3, np.arange(8) * 5]
    res = rig.send(
        f(0, 0, x[0], 100),
        f(0, 1, x[0], 0xC000_0000),
        f(0, 2, x[0], 0x1_0000_0010),
        f(1, 0, x[1], 7),
        f(1, 1, x[1], 8),
        f(1, 2, x[1], 9),
    )
    c = rig.eng.counters()
    assert c["bad_mac"] == 0 and c["summed"] == 6, c
    # unicast: each result to both workers
    assert sorted((r.seq, r.payload) for r in res) == [
        (s, be32(x[0] + x[1])) for s in range(3) for _ in range(2)
    ]
    # the same 32 bits again, from the old side of the wrap: bad MAC
    rig.send(f(0, 3, x[0], 0x10))
    assert rig.eng.counters()["bad_mac"] == 1
