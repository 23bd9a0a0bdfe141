"""The authentication rig: a fixed secret, per-member keys and frame MACs
computed independently of libsodium and of the C MAC (hashlib's BLAKE2b,
the ``cryptography`` package's AES-GCM, and tests/umac_reference.py's
UMAC), and worker frames signed with them, shared by the authentication
tests."""

import hashlib
import itertools

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from homagg import auth
from homagg.bindings import auth as _ab
from homagg.engine import UDP_PORT, Addr, build_frame

from helpers import be32
from umac_reference import umac

SECRET = bytes(range(32))
AGG = Addr.of("02:00:00:00:00:01", "10.0.0.254", UDP_PORT)


JOB = 1


def ref_key(secret, key_id, job=JOB):
    """crypto_kdf_derive_from_key: BLAKE2b-256 keyed with the secret, salt =
    the 64-bit subkey id (job * 2^32 + member) little-endian in 16 bytes,
    personal = context padded to 16."""
    return hashlib.blake2b(
        b"",
        digest_size=32,
        key=secret,
        salt=((job << 32) | key_id).to_bytes(8, "little") + bytes(8),
        person=b"homaggv3" + bytes(8),
    ).digest()


def ref_nonce(hdr, direction, counter):
    """docs/PROTOCOL.md "Nonce": shard, direction, counter (48 bits BE), incarnation."""
    return bytes([hdr[23], direction]) + (counter & (2**48 - 1)).to_bytes(6, "big") + hdr[24:28]


def ref_mac(key, data, alg=None, direction=0, counter=None):
    """The MAC of a header + payload, by Python's hashlib, the
    ``cryptography`` package's AES-GCM or the numpy UMAC of
    tests/umac_reference.py (independent of libsodium and of the C)."""
    alg = _ab.default_mac() if alg is None else alg
    if alg == auth.MAC_BLAKE2B:
        return hashlib.blake2b(data, digest_size=16, key=key).digest()
    if counter is None:
        counter = int.from_bytes(data[28:32], "big")
    if alg == auth.MAC_UMAC:
        return umac(key[:16], data, ref_nonce(data, direction, counter), 8) + bytes(8)
    return AESGCM(key).encrypt(ref_nonce(data, direction, counter), b"", data)


COUNTER = itertools.count(1)


def waddr(w):
    return Addr.of(bytes([2, 0, 0, 1, 0, w]), (10 << 24) | (1 << 16) | w, 40000 + w)


def wframe(
    w,
    key_of=None,
    seq=0,
    payload=None,
    incarnation=1,
    flags=0,
    src=None,
    key=True,
    udp_csum=True,
    counter=None,
    secret=SECRET,
    alg=None,
):
    """Worker w's frame of chunk seq, MAC'd with worker key_of's key (default w's)
    by algorithm alg (None: this host's default)."""
    payload = be32(np.arange(8) * (w + 1)) if payload is None else payload
    k = ref_key(secret, w if key_of is None else key_of) if key else None
    return build_frame(
        src or waddr(w),
        AGG,
        op="sum32",
        job=JOB,
        token=77,
        worker=w,
        seq=seq,
        slot=seq % 4,
        flags=flags,
        payload=payload,
        incarnation=incarnation,
        key=k,
        udp_csum=udp_csum,
        counter=next(COUNTER) if counter is None else counter,
        alg=alg,
    )


# The CPU flags (as /proc/cpuinfo names them) the code of each MAC path
# (HOMAGG_MAC_ISA) uses.
PATH_FLAGS = {
    "portable": {"aes", "pclmulqdq"},
    "pclmul": {"aes", "pclmulqdq", "ssse3"},
    "avx2": {"aes", "pclmulqdq", "ssse3", "avx2", "vpclmulqdq"},
    "avx512": {
        "aes",
        "pclmulqdq",
        "ssse3",
        "avx2",
        "vpclmulqdq",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "gfni",
    },
}


def force_mac_path(isa, monkeypatch):
    """A fixture's body: HOMAGG_MAC_ISA forced to path isa for the test, the
    process's own path restored after it.  The path is skipped only where
    /proc/cpuinfo lacks its instructions, and the C must agree on that."""
    import pytest

    from helpers import cpu_flags

    cpu = cpu_flags()
    has = PATH_FLAGS[isa] <= cpu
    assert _ab.mac_isa_available(isa) == has, (
        f"/proc/cpuinfo {'has' if has else 'lacks'} {sorted(PATH_FLAGS[isa])} "
        f"but hg_mac_isa_available({isa}) says otherwise"
    )
    if not has:
        pytest.skip(f"this CPU lacks {sorted(PATH_FLAGS[isa] - cpu)}: no {isa} path here")
    monkeypatch.setenv("HOMAGG_MAC_ISA", isa)
    assert _ab.mac_isa_reload() == isa
    yield isa
    monkeypatch.undo()
    _ab.mac_isa_reload()
