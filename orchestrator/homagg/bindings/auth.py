"""Bindings of homagg/auth.h: job keys and frame MACs (libsodium, and the
project's own AES-GMAC paths).

One function per C function; lengths are checked before the call, a
negative return code becomes an exception of ``homagg.errors``.  The typed
API is ``homagg.auth`` (secret files, keys).
"""

from homagg._native import ffi, lib
from homagg.errors import InvalidArgument, check

SECRET_LEN = lib.HG_AUTH_SECRET_LEN
KEY_LEN = lib.HG_AUTH_KEY_LEN
MAC_LEN = lib.HG_MAC_LEN
NONCE_LEN = lib.HG_AUTH_NONCE_LEN
KEY_AGGREGATOR = lib.HG_AUTH_KEY_AGGREGATOR
MAC_BLAKE2B = lib.HG_MAC_BLAKE2B
MAC_AES_GMAC = lib.HG_MAC_AES_GMAC
MAC_UMAC = lib.HG_MAC_UMAC
DIR_REQUEST = lib.HG_AUTH_DIR_REQUEST
DIR_REPLY = lib.HG_AUTH_DIR_REPLY


def fixed_bytes(v, size, what):
    v = bytes(v)
    if len(v) != size:
        raise InvalidArgument(f"{what} has {size} bytes, got {len(v)}")
    return v


# ---- AES-GMAC ISA path ----------------------------------------------------------

MAC_ISAS = ("portable", "pclmul", "avx2", "avx512")
_MAC_ISA_NEEDS = {
    "pclmul": "AES-NI, PCLMULQDQ and SSSE3",
    "avx2": "AES-NI, AVX2 and VPCLMULQDQ",
    "avx512": "AES-NI, VPCLMULQDQ and AVX-512 F and BW",
}


def _mac_isa_value(rc):
    """The path name of hg_mac_isa's result, or InvalidArgument naming
    HOMAGG_MAC_ISA and the fix."""
    import errno
    import os

    if rc >= 0:
        return MAC_ISAS[rc]
    value = os.environ.get("HOMAGG_MAC_ISA", "")
    if rc == -errno.EINVAL:
        raise InvalidArgument(
            f"HOMAGG_MAC_ISA={value!r} names no MAC path: set it to one of "
            f"{', '.join(MAC_ISAS)}, or unset it for the best this CPU has",
            rc,
        )
    raise InvalidArgument(
        f"HOMAGG_MAC_ISA={value!r}: this CPU lacks that path "
        f"({_MAC_ISA_NEEDS.get(value, '?')}): force a lower one or unset it",
        rc,
    )


def mac_isa_available(isa):
    """hg_mac_isa_available: does this CPU have path isa (a MAC_ISAS name)?"""
    if isa not in MAC_ISAS:
        raise InvalidArgument(f"MAC path {isa!r}: one of {', '.join(MAC_ISAS)}")
    return bool(lib.hg_mac_isa_available(MAC_ISAS.index(isa)))


def mac_isa():
    """hg_mac_isa: the AES-GMAC path ("portable", "pclmul", "avx2",
    "avx512"), read from HOMAGG_MAC_ISA at the first call of the process;
    InvalidArgument when that names no path or one the CPU lacks."""
    return _mac_isa_value(int(lib.hg_mac_isa()))


def mac_isa_reload():
    """hg_mac_isa_reload: read HOMAGG_MAC_ISA again (tests, after changing
    it); keys made from then on take the path.  As mac_isa()."""
    return _mac_isa_value(int(lib.hg_mac_isa_reload()))


def mac_available(alg):
    """hg_auth_mac_available: can this host compute algorithm alg?"""
    return bool(lib.hg_auth_mac_available(int(alg)))


def default_mac():
    """hg_auth_default_mac: MAC_UMAC where available, else MAC_BLAKE2B."""
    return int(lib.hg_auth_default_mac())


def derive_key(secret, job, key_id):
    """hg_auth_derive_key: member key_id's key (a worker id or
    KEY_AGGREGATOR) of job under secret."""
    secret = fixed_bytes(secret, SECRET_LEN, "a job secret")
    key = ffi.new("uint8_t[]", KEY_LEN)
    check(lib.hg_auth_derive_key(secret, int(job), int(key_id), key), f"derive key {key_id}")
    return bytes(key)


def nonce(hdr, direction, counter):
    """hg_auth_nonce: the AES-GMAC nonce of a frame with header hdr."""
    hdr = bytes(hdr)
    if len(hdr) < lib.HG_HDR_LEN:
        raise InvalidArgument(f"a header has {lib.HG_HDR_LEN} bytes, got {len(hdr)}")
    out = ffi.new("uint8_t[]", NONCE_LEN)
    lib.hg_auth_nonce(hdr, int(direction), int(counter), out)
    return bytes(out)


def mac(alg, key, direction, counter, data):
    """hg_auth_mac: the MAC_LEN-byte MAC of data (header + payload)."""
    key = fixed_bytes(key, KEY_LEN, "a key")
    if int(alg) in (MAC_AES_GMAC, MAC_UMAC):
        mac_isa()  # a bad HOMAGG_MAC_ISA refuses here, by name
    data = bytes(data)
    out = ffi.new("uint8_t[]", MAC_LEN)
    check(lib.hg_auth_mac(int(alg), key, int(direction), int(counter), data, len(data), out), "mac")
    return bytes(out)


def gmac(key, nonce, data):
    """hg_auth_gmac: the AES-256-GCM tag of an empty plaintext with data as
    additional data under key and a 12-byte nonce, on the MAC path of
    mac_isa() (known-answer tests)."""
    key = fixed_bytes(key, KEY_LEN, "a key")
    nonce = fixed_bytes(nonce, NONCE_LEN, "a nonce")
    mac_isa()  # a bad HOMAGG_MAC_ISA refuses here, by name
    data = bytes(data)
    out = ffi.new("uint8_t[]", MAC_LEN)
    check(lib.hg_auth_gmac(key, nonce, data, len(data), out), "gmac")
    return bytes(out)


def umac(key, nonce, data):
    """hg_auth_umac: RFC 4418's UMAC-64 (UMAC-AES-128, an 8-byte tag) of
    data under a 16-byte key and a nonce of 1..16 bytes, followed by 8 zero
    bytes as in a frame's trailer; NH in the form of the MAC path of
    mac_isa() (known-answer tests)."""
    key = fixed_bytes(key, 16, "a UMAC key")
    nonce = bytes(nonce)
    if not 1 <= len(nonce) <= 16:
        raise InvalidArgument(f"a UMAC nonce has 1..16 bytes, got {len(nonce)}")
    mac_isa()  # a bad HOMAGG_MAC_ISA refuses here, by name
    data = bytes(data)
    out = ffi.new("uint8_t[]", MAC_LEN)
    check(lib.hg_auth_umac(key, nonce, len(nonce), data, len(data), out), "umac")
    return bytes(out)


def verify(alg, key, direction, counter, data, tag):
    """hg_auth_verify: does tag verify for data (constant time)?"""
    key = fixed_bytes(key, KEY_LEN, "a key")
    tag = fixed_bytes(tag, MAC_LEN, "a MAC")
    data = bytes(data)
    return bool(
        lib.hg_auth_verify(int(alg), key, int(direction), int(counter), data, len(data), tag)
    )


def counter_extend(last, c32):
    """hg_auth_counter_extend: the full counter a receiver takes."""
    return int(lib.hg_auth_counter_extend(int(last), int(c32)))


def wire_mac(key, alg=None, direction=0, counter=1):
    """A ``struct hg_wire_mac *`` for hg_wire_build_mac / hg_sim_build_frame
    (alg None: this host's default)."""
    m = ffi.new("struct hg_wire_mac *")
    m.alg = default_mac() if alg is None else int(alg)
    m.dir = int(direction)
    m.counter = int(counter)
    m.key = list(fixed_bytes(key, KEY_LEN, "a key"))
    return m
