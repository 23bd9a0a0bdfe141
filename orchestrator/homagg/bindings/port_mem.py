"""Bindings of homagg/port_mem.h, the in-memory port backend.

The port is the cffi ``struct hg_port_mem *`` ``port_mem_create`` returns
(freed by the garbage collector); frames cross as bytes.  The typed API is
``homagg.engine.MemPort``.
"""

from homagg._native import ffi, lib
from homagg.bindings._args import _fill
from homagg.errors import ResourceError, check


def port_mem_create(**config):
    """hg_port_mem_create with hg_port_mem_config_init's defaults and the
    given fields of struct hg_port_mem_config."""
    c = ffi.new("struct hg_port_mem_config *")
    lib.hg_port_mem_config_init(c)
    p = lib.hg_port_mem_create(_fill(c, config))
    if p == ffi.NULL:
        raise ResourceError("hg_port_mem_create failed (config or memory)")
    return ffi.gc(p, lib.hg_port_mem_destroy)


def port_mem_port(m):
    """The ``struct hg_port *`` to hand to an engine."""
    return lib.hg_port_mem_port(m)


def port_mem_inject(m, frame):
    frame = bytes(frame)
    check(lib.hg_port_mem_inject(m, frame, len(frame)), "hg_port_mem_inject")


def port_mem_pop_tx(m, cap):
    """The oldest transmitted frame (bytes, at most cap), or None."""
    buf = ffi.new("uint8_t[]", cap)
    n = check(lib.hg_port_mem_pop_tx(m, buf, len(buf)), "hg_port_mem_pop_tx")
    return bytes(ffi.buffer(buf, n)) if n else None


def port_mem_rx_pending(m):
    return lib.hg_port_mem_rx_pending(m)


def port_mem_tx_pending(m):
    return lib.hg_port_mem_tx_pending(m)


def port_mem_free_count(m):
    return lib.hg_port_mem_free_count(m)


def port_mem_groups(m):
    return lib.hg_port_mem_groups(m)


def port_mem_set_time(m, ns):
    lib.hg_port_mem_set_time(m, ns)


def port_mem_set_tx_limit(m, limit):
    lib.hg_port_mem_set_tx_limit(m, limit)
