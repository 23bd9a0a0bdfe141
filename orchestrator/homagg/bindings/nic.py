"""Bindings of homagg/nic.h (the software NIC model).

One function per C function; pointers are the cffi ``struct hg_nic_fabric *``
and ``struct hg_nic_port *`` the create functions return (freed by the
garbage collector through ``ffi.gc``).  Frames cross as bytes or packed
buffers; counters come back as dicts.  The typed API is ``homagg.nic``.
"""

import errno

from homagg._native import ffi, lib
from homagg.bindings._args import _fill
from homagg.errors import InvalidArgument, ResourceError, check

DIR_OUT = lib.HG_NIC_OUT
DIR_IN = lib.HG_NIC_IN

EVENT_KINDS = {
    lib.HG_NIC_EV_TX: "tx",
    lib.HG_NIC_EV_DELIVER: "deliver",
    lib.HG_NIC_EV_LOSS: "loss",
    lib.HG_NIC_EV_DUP: "dup",
    lib.HG_NIC_EV_CORRUPT: "corrupt",
    lib.HG_NIC_EV_HOLD: "hold",
    lib.HG_NIC_EV_RX_OVERFLOW: "rx_overflow",
    lib.HG_NIC_EV_OVERSIZE: "oversize",
    lib.HG_NIC_EV_NO_ROUTE: "no_route",
    lib.HG_NIC_EV_NOBUF: "nobuf",
}
NO_DST = 0xFFFF


def _counters(n, name_fn, read_fn, obj):
    buf = ffi.new("uint64_t[]", n)
    got = read_fn(obj, buf, n)
    return {ffi.string(name_fn(i)).decode(): int(buf[i]) for i in range(got)}


def fabric_create(**config):
    """hg_nic_fabric_create with the fields of struct hg_nic_fabric_config."""
    ptr = lib.hg_nic_fabric_create(_fill(ffi.new("struct hg_nic_fabric_config *"), config))
    if ptr == ffi.NULL:
        err = ffi.errno
        if err == errno.ENOMEM:
            raise ResourceError("hg_nic_fabric_create: out of memory", -err)
        raise InvalidArgument("hg_nic_fabric_create: bad configuration", -err)
    return ffi.gc(ptr, lib.hg_nic_fabric_destroy)


def port_create(fabric, **config):
    """hg_nic_port_create with the fields of struct hg_nic_port_config."""
    ptr = lib.hg_nic_port_create(fabric, _fill(ffi.new("struct hg_nic_port_config *"), config))
    if ptr == ffi.NULL:
        err = ffi.errno
        mac = bytes(config.get("mac", b"")).hex(":")
        raise InvalidArgument(
            f"hg_nic_port_create({mac}) failed: {errno.errorcode.get(err, err)}", -err
        )
    return ptr


def port_id(port):
    return lib.hg_nic_port_id(port)


def port_get(port):
    """The ``struct hg_port *`` of a NIC port."""
    return lib.hg_nic_port_get(port)


def port_set_faults(port, direction, **faults):
    c = _fill(ffi.new("struct hg_nic_faults *"), faults)
    check(lib.hg_nic_port_set_faults(port, direction, c), "set_faults")


def port_join(port, group_ipv4):
    check(lib.hg_nic_port_join(port, group_ipv4), "join")


def port_leave(port, group_ipv4):
    check(lib.hg_nic_port_leave(port, group_ipv4), "leave")


def port_send_frames(port, data, lens):
    """hg_nic_port_send_frames: frames packed in data (bytes-like), lengths
    in lens (a contiguous uint16 numpy array or a list).  Returns how many
    the port took."""
    n = len(lens)
    if sum(int(x) for x in lens) > len(data):
        raise InvalidArgument("lens add up to more than the data")
    if hasattr(lens, "dtype"):
        if str(lens.dtype) != "uint16" or not lens.flags.c_contiguous:
            raise InvalidArgument("lens must be a contiguous uint16 array")
        clens = ffi.from_buffer("uint16_t[]", lens)
    else:
        clens = ffi.new("uint16_t[]", list(lens))
    if n == 0:
        return 0
    return lib.hg_nic_port_send_frames(port, ffi.from_buffer(data), clens, n)


def recv_buffers(n, cap):
    """Reusable buffers for port_recv_frames_into: (data of cap bytes,
    lengths of n frames)."""
    return ffi.new("uint8_t[]", cap), ffi.new("uint16_t[]", n)


def port_recv_frames_into(port, buf, cap, lens, n, src=None):
    """hg_nic_port_recv_frames into buffers from recv_buffers (src: a
    uint16_t[n] for the source port ids, or None); returns the number of
    frames."""
    return lib.hg_nic_port_recv_frames(port, buf, cap, lens, ffi.NULL if src is None else src, n)


def port_recv_frames(port, n, buf_size):
    """At most n frames as a list of (src_port_id, bytes)."""
    if n == 0:
        return []
    cap = n * buf_size
    buf = ffi.new("uint8_t[]", cap)
    lens = ffi.new("uint16_t[]", n)
    src = ffi.new("uint16_t[]", n)
    got = lib.hg_nic_port_recv_frames(port, buf, cap, lens, src, n)
    raw = ffi.buffer(buf, cap)
    out, off = [], 0
    for i in range(got):
        out.append((int(src[i]), bytes(raw[off : off + lens[i]])))
        off += lens[i]
    return out


def port_rx_pending(port):
    return lib.hg_nic_port_rx_pending(port)


def port_counters(port):
    return _counters(
        lib.hg_nic_port_counter_count(),
        lib.hg_nic_port_counter_name,
        lib.hg_nic_port_counters,
        port,
    )


def now(fabric):
    return lib.hg_nic_now(fabric)


def advance(fabric, ns):
    check(lib.hg_nic_advance(fabric, ns), "advance")


def advance_to(fabric, t):
    check(lib.hg_nic_advance_to(fabric, t), "advance_to")


def next_event(fabric):
    """The time of the next event, or None."""
    t = ffi.new("uint64_t *")
    return int(t[0]) if lib.hg_nic_next_event(fabric, t) else None


def in_flight(fabric):
    return lib.hg_nic_in_flight(fabric)


def pool_free(fabric):
    return lib.hg_nic_pool_free(fabric)


def trace_hash(fabric):
    return lib.hg_nic_trace_hash(fabric)


def trace_count(fabric):
    return lib.hg_nic_trace_count(fabric)


def trace_copy(fabric, n):
    """The last n trace records as dicts (kind and dir as codes)."""
    if n == 0:
        return []
    recs = ffi.new("struct hg_nic_trace_rec[]", n)
    got = lib.hg_nic_trace_copy(fabric, recs, n)
    return [
        {
            "t_ns": int(r.t_ns),
            "hash": int(r.hash),
            "src": int(r.src),
            "dst": int(r.dst),
            "len": int(r.len),
            "kind": int(r.kind),
            "dir": int(r.dir),
        }
        for r in recs[0:got]
    ]


def fabric_counters(fabric):
    return _counters(
        lib.hg_nic_fabric_counter_count(),
        lib.hg_nic_fabric_counter_name,
        lib.hg_nic_fabric_counters,
        fabric,
    )
