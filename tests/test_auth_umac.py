"""UMAC-64 (RFC 4418), the ``umac`` MAC of docs/PROTOCOL.md "Authentication".

The numpy implementation of RFC 4418 in tests/umac_reference.py is checked
against the RFC's own test vectors (UMAC-64 and UMAC-96, typed in below);
the project's C is then checked against both, bit for bit, on each MAC
path the CPU has (HOMAGG_MAC_ISA: the scalar NH on portable and pclmul,
the AVX2 one on avx2 and avx512), on messages of every length class up to
9000 bytes and on frames with their own nonces.
"""

import random

import pytest

from homagg import auth
from homagg.bindings import auth as _ab
from homagg.errors import InvalidArgument
from helpers import cpu_flags
from auth_rig import PATH_FLAGS, force_mac_path
from umac_reference import umac

pytestmark = pytest.mark.sanitize

CPU = cpu_flags()


@pytest.fixture(params=list(PATH_FLAGS))
def mac_path(request, monkeypatch):
    """HOMAGG_MAC_ISA forced to one path for the test (auth_rig.force_mac_path)."""
    yield from force_mac_path(request.param, monkeypatch)


# RFC 4418, Appendix "Test Vectors": key "abcdefghijklmnop", nonce
# "bcdefghi"; the 2^25-byte vector as corrected by the RFC's errata.
RFC_KEY, RFC_NONCE = b"abcdefghijklmnop", b"bcdefghi"
RFC = [
    (b"", 0, "6E155FAD26900BE1", "32FEDB100C79AD58F07FF764"),
    (b"a", 3, "44B5CB542F220104", "185E4FE905CBA7BD85E4C2DC"),
    (b"a", 2**10, "26BF2F5D60118BD9", "7A54ABE04AF82D60FB298C3C"),
    (b"a", 2**15, "27F8EF643B0D118D", "7B136BD911E4B734286EF2BE"),
    (b"a", 2**20, "A4477E87E9F55853", "F8ACFA3AC31CFEEA047F7B11"),
    (b"a", 2**25, "FACA46F856E9B45F", "A621C2457C0012E64F3FDAE9"),
    (b"abc", 1, "D4D7B9F6BD4FBFCF", "883C3D4B97A61976FFCF2323"),
    (b"abc", 500, "D4CF26DDEFD5C01A", "8824A260C53C66A36C9260A6"),
]


@pytest.mark.parametrize("pattern,reps,tag64,tag96", RFC)
def test_the_reference_gives_the_rfc_vectors(pattern, reps, tag64, tag96):
    msg = pattern * reps
    assert umac(RFC_KEY, msg, RFC_NONCE, 8).hex().upper() == tag64
    assert umac(RFC_KEY, msg, RFC_NONCE, 12).hex().upper() == tag96


def test_the_c_gives_the_rfc_vectors(mac_path):
    for pattern, reps, tag64, _ in RFC:
        msg = pattern * reps
        if len(msg) > 2**24:  # longer than any frame: refused by name
            with pytest.raises(InvalidArgument):
                _ab.umac(RFC_KEY, RFC_NONCE, msg)
            continue
        out = _ab.umac(RFC_KEY, RFC_NONCE, msg)
        assert out[:8].hex().upper() == tag64, f"{mac_path}: {len(msg)} bytes"
        assert out[8:] == bytes(8)  # the trailer's second half


def _lengths():
    """Every length 0..300 (the 32-byte blocks, the 64-byte pairs and the
    tail shapes), every length around each multiple of 1024 (chunks, L2)
    and of 64 near them up to 9000, and 200 more drawn at random."""
    rng = random.Random(4418)
    out = set(range(301))
    for m in range(1024, 9001, 1024):
        out.update(range(m - 70, min(m + 70, 9001)))
    out.update(rng.randrange(9001) for _ in range(200))
    out.add(9000)
    return sorted(out)


def test_random_messages_and_nonces_match_the_reference(mac_path):
    rng = random.Random(0x554D4143)
    data = rng.randbytes(9000)
    for n in _lengths():
        key, nonce = rng.randbytes(16), rng.randbytes(rng.randint(1, 16))
        want = umac(key, data[:n], nonce, 8) + bytes(8)
        assert _ab.umac(key, nonce, data[:n]) == want, f"{mac_path}: {n} bytes"


def test_frame_macs_match_the_reference(mac_path):
    # hg_auth_mac: the frame's own nonce (shard, direction, counter,
    # incarnation: its lowest bit picks the pad's half), both directions,
    # counters up to 2^48 - 1; a flipped bit, a tag of another nonce and a
    # non-zero second half all fail
    rng = random.Random(9)
    for n in (32, 33, 64, 1056, 1057, 1456, 2080, 4128, 8224, 9000):
        key = rng.randbytes(32)
        for inc_low in (0, 1):
            data = bytearray(rng.randbytes(n))
            data[27] = (data[27] & 0xFE) | inc_low
            data = bytes(data)
            for direction in (auth.DIR_REQUEST, auth.DIR_REPLY):
                for counter in (1, 0xFFFFFFFF + 5, 2**48 - 1):
                    nonce = bytes([data[23], direction]) + counter.to_bytes(6, "big") + data[24:28]
                    want = umac(key[:16], data, nonce, 8) + bytes(8)
                    got = _ab.mac(auth.MAC_UMAC, key, direction, counter, data)
                    assert got == want, f"{mac_path}: {n} bytes, counter {counter}"
                    assert _ab.verify(auth.MAC_UMAC, key, direction, counter, data, want)
                    bad = bytearray(data)
                    bad[rng.randrange(n)] ^= 1 << rng.randrange(8)
                    assert not _ab.verify(auth.MAC_UMAC, key, direction, counter, bytes(bad), want)
                    assert not _ab.verify(auth.MAC_UMAC, key, direction, counter + 1, data, want)
                    tail = bytearray(want)
                    tail[8 + rng.randrange(8)] ^= 1
                    assert not _ab.verify(auth.MAC_UMAC, key, direction, counter, data, bytes(tail))


def test_a_counter_past_48_bits_gets_a_mac_that_verifies_nothing():
    key, data = bytes(range(32)), bytes(range(64))
    for counter in (2**48, 2**48 + 1):
        nonce = bytes([data[23], 0]) + (counter % 2**48).to_bytes(6, "big") + data[24:28]
        got = _ab.mac(auth.MAC_UMAC, key, 0, counter, data)
        assert got != umac(key[:16], data, nonce, 8) + bytes(8)
        assert not _ab.verify(auth.MAC_UMAC, key, 0, counter, data, got)


def test_umac_is_the_default_where_the_cpu_has_aes_ni():
    if "aes" in CPU:
        assert auth.default_mac_name() == "umac"
        assert auth.mac_code("auto") == auth.MAC_UMAC == auth.mac_code("umac")
    with pytest.raises(InvalidArgument, match="one of .*umac"):
        auth.mac_code("umac-128")


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(InvalidArgument, match="UMAC key"):
        _ab.umac(bytes(32), b"n", b"")
    with pytest.raises(InvalidArgument, match="nonce"):
        _ab.umac(bytes(16), b"", b"")
    with pytest.raises(InvalidArgument, match="nonce"):
        _ab.umac(bytes(16), bytes(17), b"")


@pytest.mark.parametrize("payload_bytes", [32, 1024, 1424, 4096, 8192])
def test_unicast_copies_of_a_result_each_carry_the_reference_mac(mac_path, payload_bytes):
    # without a group the aggregator sends each worker its own copy of a
    # result (its header names the worker, its MAC counter is its own);
    # the copies' MACs share the payload's NH and POLY terms (auth_pvt.h
    # hg_mac_key_share): each must equal the reference UMAC of its bytes,
    # and the sum be exact
    import numpy as np

    from auth_rig import SECRET, ref_key, ref_mac, wframe
    from engine_rig import EngineRig
    from helpers import be32
    from homagg.engine import parse_frame

    W = 5
    rig = EngineRig(workers=W, slots=4, auth=SECRET, mac="umac", payload_bytes=payload_bytes)
    rng = np.random.default_rng(payload_bytes)
    lanes = payload_bytes // 4
    for seq in range(3):
        xs = [rng.integers(-(2**28), 2**28, lanes) for _ in range(W)]
        frames = [wframe(w, seq=seq, payload=be32(xs[w]), alg=auth.MAC_UMAC) for w in range(W)]
        for f in frames:
            rig.port.inject(f)
        rig.eng.poll_all()
        raw = rig.port.pop_all()
        assert len(raw) == W, f"{len(raw)} replies"
        key = ref_key(SECRET, auth.AGGREGATOR)
        seen = set()
        for f in raw:
            v = parse_frame(f)
            assert not isinstance(v, str), v
            assert v.payload == be32(np.sum(xs, axis=0))
            data = f[42 : 42 + 32 + len(v.payload)]
            assert v.mac == ref_mac(key, data, auth.MAC_UMAC, auth.DIR_REPLY), (
                f"{mac_path}: copy to worker {v.worker}"
            )
            seen.add(v.worker)
        assert seen == set(range(W))
    c = rig.eng.counters()
    assert c["bad_mac"] == 0 and c["summed"] == 3 * W


def _marker_message(key, length, chunk, iteration):
    """A message of length bytes whose chunk number chunk (0-based) has,
    under iteration's NH key, an L1 value of at least 2^64 - 2^32: the
    words RFC 4418's POLY-64 takes with its marker.  NH adds (m + k) mod
    2^32 in pairs; choosing m = s - k sets each sum s: the chunk's first
    block gets (2^32 - 1)^2 + 2^32 and every other block of the chunk 0."""
    import numpy as np

    from umac_reference import kdf, l1_hash

    l1key = kdf(key, 1, 1024 + 16)[16 * iteration :]
    rng = random.Random(length * 7 + chunk)
    msg = bytearray(rng.randbytes(length))
    start = 1024 * chunk
    clen = min(1024, length - start)
    assert clen % 32 == 0
    k = np.frombuffer(l1key[:clen], dtype=">u4").astype(np.int64)
    s = np.zeros(clen // 4, dtype=np.int64)
    s[0], s[4], s[1], s[5] = 2**32 - 1, 2**32 - 1, 2**16, 2**16
    msg[start : start + clen] = ((s - k) % 2**32).astype("<u4").tobytes()
    assert l1_hash(l1key, bytes(msg))[chunk] >= 2**64 - 2**32  # the marker's case
    return bytes(msg)


@pytest.mark.parametrize(
    "length,chunk",
    [(1056, 0), (1056, 1), (2048, 1), (3072, 2), (3072, 1), (4160, 3), (5120, 4)],
)
def test_chunks_that_meet_poly64_s_marker_match_the_reference(mac_path, length, chunk):
    # the marker's branch of every POLY-64 step the C takes: the first two
    # chunks from y = 1, two chunks a step, a last chunk alone
    key = bytes(range(16))
    nonce = b"marker!!"
    for iteration in (0, 1):
        msg = _marker_message(key, length, chunk, iteration)
        want = umac(key, msg, nonce, 8) + bytes(8)
        assert _ab.umac(key, nonce, msg) == want, (
            f"{mac_path}: {length} bytes, marker in chunk {chunk}, iteration {iteration}"
        )
