"""Bindings of homagg/wire.h: building and parsing frames, the counter table.

Addresses are (mac: 6 bytes, ipv4: int in host order, port: int) tuples;
header fields are dicts keyed by the fields of ``struct hg_hdr``; frames are
bytes.  The typed API is ``homagg.engine`` (``build_frame``, ``parse_frame``).
"""

from homagg._native import ffi, lib
from homagg.errors import InvalidArgument, check

FLAG_RESULT = lib.HG_FLAG_RESULT
FLAG_RETRANS = lib.HG_FLAG_RETRANS
FLAG_SHADOW = lib.HG_FLAG_SHADOW
FLAG_OVERFLOW = lib.HG_FLAG_OVERFLOW
FLAG_STATUS = lib.HG_FLAG_STATUS
FLAG_AUTH = lib.HG_FLAG_AUTH
FLAG_LOSS = lib.HG_FLAG_LOSS
WORKER_ALL = lib.HG_WORKER_ALL
UDP_PORT = lib.HG_UDP_PORT
PROTOCOL_VERSION = lib.HG_PROTOCOL_VERSION
HDR_LEN = lib.HG_HDR_LEN
MAC_LEN = lib.HG_MAC_LEN
ETH_IP_UDP_LEN = lib.HG_ETH_IP_UDP_LEN
MAX_PAYLOAD = lib.HG_MAX_PAYLOAD
F_UDP_CSUM = lib.HG_WIRE_F_UDP_CSUM
# the key hg_wire_build_mac takes (homagg/auth.h)
AUTH_KEY_LEN = lib.HG_AUTH_KEY_LEN

# struct hg_hdr, in the order of docs/PROTOCOL.md Part 2
HDR_FIELDS = (
    "version",
    "op",
    "flags",
    "job",
    "token",
    "worker",
    "slot",
    "seq",
    "lanes",
    "exp",
    "shard",
    "incarnation",
    "nonce",
)


def counter_count():
    return int(lib.hg_counter_count())


def counter_name(i):
    return ffi.string(lib.hg_counter_name(i)).decode()


def counter_names():
    """The counter names in table order (homagg/counters.h)."""
    return [counter_name(i) for i in range(counter_count())]


def worker_counter_names():
    """The per-worker counter names in table order (homagg/counters.h)."""
    return [
        ffi.string(lib.hg_worker_counter_name(i)).decode()
        for i in range(int(lib.hg_worker_counter_count()))
    ]


def counters_read(read, what):
    """Call ``read(out, n)`` (an hg_*_counters function bound to its
    object) into a new counter array; a dict of counter name -> value."""
    n = counter_count()
    out = ffi.new("uint64_t[]", n)
    got = check(read(out, n), what)
    return dict(zip(counter_names()[:got], list(out)[:got]))


def _addr(a):
    mac, ipv4, port = a
    c = ffi.new("struct hg_wire_addr *")
    c.mac = list(mac)
    c.ipv4 = ipv4
    c.port = port
    return c


def wire_build_mac(
    src, dst, hdr, payload=b"", udp_csum=True, key=None, alg=None, counter=1, direction=0
):
    """hg_wire_build_mac: the bytes of one frame.  ``hdr`` sets any field
    of struct hg_hdr (hostile values included); ``key`` (AUTH_KEY_LEN
    bytes) appends the frame's MAC of algorithm ``alg`` (None: the host's
    default) with MAC counter ``counter`` in direction ``direction``."""
    from homagg.bindings.auth import wire_mac

    payload = bytes(payload)
    h = ffi.new("struct hg_hdr *")
    for k, v in hdr.items():
        setattr(h, k, v)
    buf = ffi.new("uint8_t[]", ETH_IP_UDP_LEN + HDR_LEN + len(payload) + MAC_LEN)
    if key is not None and len(bytes(key)) != AUTH_KEY_LEN:
        raise InvalidArgument(f"key: {AUTH_KEY_LEN} bytes")
    n = check(
        lib.hg_wire_build_mac(
            buf,
            len(buf),
            _addr(src),
            _addr(dst),
            h,
            payload if payload else ffi.NULL,
            len(payload),
            F_UDP_CSUM if udp_csum else 0,
            wire_mac(key, alg, direction, counter) if key is not None else ffi.NULL,
        ),
        "hg_wire_build_mac",
    )
    return bytes(ffi.buffer(buf, n))


def wire_parse(frame, udp_port=0, udp_csum=True):
    """hg_wire_parse: for a valid frame a dict with "src" and "dst"
    (address tuples), "hdr" (every header field), "payload_off" and
    "payload_len"; else the drop reason's counter name (str)."""
    frame = bytes(frame)
    v = ffi.new("struct hg_wire_view *")
    rc = check(
        lib.hg_wire_parse(frame, len(frame), udp_port, F_UDP_CSUM if udp_csum else 0, v),
        "hg_wire_parse",
    )
    if rc > 0:
        return counter_name(rc)
    return {
        "src": (bytes(v.src.mac), v.src.ipv4, v.src.port),
        "dst": (bytes(v.dst.mac), v.dst.ipv4, v.dst.port),
        "hdr": {k: getattr(v.hdr, k) for k in HDR_FIELDS},
        "payload_off": v.payload_off,
        "payload_len": v.payload_len,
    }
