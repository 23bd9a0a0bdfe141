"""Bindings of homagg/port_udp.h, the kernel UDP port backend.

The port is the cffi ``struct hg_udp_port *`` ``udp_port_create`` returns
(freed by the garbage collector, or now by ``udp_port_destroy``).  The
typed API is ``homagg.worker.UdpPort``.
"""

from homagg._native import ffi, lib
from homagg.bindings._args import _fill, _struct_dict
from homagg.errors import check, error_for


def udp_port_create(context, **config):
    """hg_udp_port_create with the given fields of struct
    hg_udp_port_config; the error (from errno) names ``context``."""
    p = lib.hg_udp_port_create(_fill(ffi.new("struct hg_udp_port_config *"), config))
    if p == ffi.NULL:
        raise error_for(-ffi.errno, context)
    return ffi.gc(p, lib.hg_udp_port_destroy)


def udp_port_destroy(p):
    ffi.release(p)  # runs hg_udp_port_destroy now


def udp_port_port(p):
    """The ``struct hg_port *`` a client or an engine runs on."""
    return lib.hg_udp_port_port(p)


def udp_port_local(p):
    """(ipv4 int, port) the unicast socket is bound to."""
    ip = ffi.new("uint32_t *")
    port = ffi.new("uint16_t *")
    check(lib.hg_udp_port_local(p, ip, port))
    return ip[0], port[0]


def udp_port_wait(p, timeout_ns):
    """Whether a datagram is ready within timeout_ns."""
    return check(lib.hg_udp_port_wait(p, int(timeout_ns))) == 1


def udp_port_get_stats(p):
    ps = ffi.new("struct hg_udp_port_stats *")
    check(lib.hg_udp_port_get_stats(p, ps))
    return _struct_dict(ps, "struct hg_udp_port_stats")
