"""The software NIC model (nic/include/homagg/nic.h) from Python.

A :class:`Fabric` is one L2 switch with a virtual clock in ns and a fixed
buffer pool; :meth:`Fabric.add_port` creates a :class:`Port` whose
``hg_port`` (a ``struct hg_port *``) the C engine and worker client use
unchanged.  Frames are raw Ethernet frames (``bytes``).  Nothing moves until
the clock does: ``fabric.advance(ns)``, ``fabric.advance_to(t)``,
``fabric.next_event()``.

Example::

    fab = Fabric(seed=1, trace_hash=True)
    a = fab.add_port(mac="02:00:00:00:00:01", rate_bps=10**10)
    b = fab.add_port(mac="02:00:00:00:00:02", rate_bps=10**10)
    b.set_faults("in", loss=0.01)
    a.send([frame])
    fab.advance(10_000)
    frames = b.recv()
"""
from __future__ import annotations

import errno
from dataclasses import dataclass, fields

from homagg._native import ffi, lib
from homagg.errors import InvalidArgument, ResourceError, check

OUT = "out"
IN = "in"
_DIRS = {OUT: lib.HG_NIC_OUT, IN: lib.HG_NIC_IN}

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


def parse_mac(mac) -> bytes:
    """'02:00:00:00:00:01' or 6 bytes -> 6 bytes."""
    if isinstance(mac, (bytes, bytearray)):
        raw = bytes(mac)
    else:
        raw = bytes(int(x, 16) for x in str(mac).split(":"))
    if len(raw) != 6:
        raise InvalidArgument(f"bad MAC address {mac!r}")
    return raw


def parse_ipv4(addr) -> int:
    """'10.0.0.1' or an int -> int in host byte order."""
    if isinstance(addr, int):
        return addr
    parts = [int(x) for x in str(addr).split(".")]
    if len(parts) != 4 or any(not 0 <= x <= 255 for x in parts):
        raise InvalidArgument(f"bad IPv4 address {addr!r}")
    return (parts[0] << 24) | (parts[1] << 16) | (parts[2] << 8) | parts[3]


@dataclass(frozen=True)
class Faults:
    """Faults of one direction of a port's link (see homagg/nic.h)."""

    loss: float = 0.0
    dup: float = 0.0
    corrupt: float = 0.0
    reorder: float = 0.0
    reorder_max: int = 0
    reorder_timeout_ns: int = 0
    delay_ns: int = 0
    jitter_ns: int = 0


@dataclass(frozen=True)
class TraceRecord:
    t_ns: int
    hash: int
    src: int
    dst: int | None
    len: int
    kind: str
    dir: str


def _counters(n, name_fn, read_fn, obj) -> dict[str, int]:
    buf = ffi.new("uint64_t[]", n)
    got = read_fn(obj, buf, n)
    return {ffi.string(name_fn(i)).decode(): int(buf[i]) for i in range(got)}


class Port:
    """A port of a :class:`Fabric` (created by :meth:`Fabric.add_port`)."""

    def __init__(self, fabric: "Fabric", ptr, mac: bytes, ipv4: int, udp_port: int, mtu: int):
        self.fabric = fabric
        self._p = ptr
        self.mac = mac
        self.ipv4 = ipv4
        self.udp_port = udp_port
        self.mtu = mtu
        self.id = lib.hg_nic_port_id(ptr)

    @property
    def hg_port(self):
        """The ``struct hg_port *`` for the C engine / worker client."""
        return lib.hg_nic_port_get(self._p)

    def set_faults(self, direction: str, faults: Faults | None = None, **kw) -> None:
        """Set the faults of the link ``"out"`` of or ``"in"``to this port."""
        if direction not in _DIRS:
            raise InvalidArgument(f"direction must be 'out' or 'in', not {direction!r}")
        f = faults if faults is not None else Faults(**kw)
        c = ffi.new("struct hg_nic_faults *")
        for fld in fields(Faults):
            setattr(c, fld.name, getattr(f, fld.name))
        check(lib.hg_nic_port_set_faults(self._p, _DIRS[direction], c), "set_faults")

    def join(self, group) -> None:
        check(lib.hg_nic_port_join(self._p, parse_ipv4(group)), "join")

    def leave(self, group) -> None:
        check(lib.hg_nic_port_leave(self._p, parse_ipv4(group)), "leave")

    def send(self, frames) -> int:
        """Send frames (an iterable of bytes) at the current time; returns how
        many the port took (stops at a full tx ring or an empty pool)."""
        frames = [bytes(fr) for fr in frames]
        if not frames:
            return 0
        for fr in frames:
            if len(fr) > 0xFFFF:
                raise InvalidArgument("frame longer than 65535 bytes")
        lens = ffi.new("uint16_t[]", [len(fr) for fr in frames])
        data = b"".join(frames)
        return lib.hg_nic_port_send_frames(self._p, ffi.from_buffer(data), lens, len(frames))

    def send_packed(self, data, lens) -> int:
        """Send frames packed back to back in ``data`` (bytes-like), lengths in
        ``lens`` (a uint16 numpy array or a list); returns how many were taken."""
        n = len(lens)
        if sum(int(x) for x in lens) > len(data):
            raise InvalidArgument("lens add up to more than the data")
        if hasattr(lens, "dtype"):
            if str(lens.dtype) != "uint16" or not lens.flags.c_contiguous:
                raise InvalidArgument("lens must be a contiguous uint16 array")
            clens = ffi.from_buffer("uint16_t[]", lens)
        else:
            clens = ffi.new("uint16_t[]", list(lens))
        return lib.hg_nic_port_send_frames(self._p, ffi.from_buffer(data), clens, n)

    def recv(self, max_frames: int | None = None, with_src: bool = False):
        """Take frames from the rx ring (all, or at most max_frames): a list of
        bytes, or of (src_port_id, bytes) with with_src."""
        pending = lib.hg_nic_port_rx_pending(self._p)
        n = pending if max_frames is None else min(max_frames, pending)
        out = []
        if n == 0:
            return out
        cap = n * self.fabric.buf_size
        buf = ffi.new("uint8_t[]", cap)
        lens = ffi.new("uint16_t[]", n)
        src = ffi.new("uint16_t[]", n)
        got = lib.hg_nic_port_recv_frames(self._p, buf, cap, lens, src, n)
        raw = ffi.buffer(buf, cap)
        off = 0
        for i in range(got):
            fr = bytes(raw[off:off + lens[i]])
            off += lens[i]
            out.append((int(src[i]), fr) if with_src else fr)
        return out

    @property
    def rx_pending(self) -> int:
        return lib.hg_nic_port_rx_pending(self._p)

    def counters(self) -> dict[str, int]:
        return _counters(lib.hg_nic_port_counter_count(), lib.hg_nic_port_counter_name,
                         lib.hg_nic_port_counters, self._p)

    def __repr__(self):
        return f"Port(id={self.id}, mac={self.mac.hex(':')})"


class Fabric:
    """One L2 switch with a virtual clock, a buffer pool and ports."""

    def __init__(self, seed: int = 0, pool_size: int = 0, buf_size: int = 0,
                 max_ports: int = 0, trace_records: int = 0, trace_hash: bool = True,
                 multicast: bool = True, broadcast: bool = True):
        cfg = ffi.new("struct hg_nic_fabric_config *")
        cfg.seed = seed & (2**64 - 1)
        cfg.pool_size = pool_size
        cfg.buf_size = buf_size
        cfg.max_ports = max_ports
        cfg.trace_records = trace_records
        cfg.trace_hash = trace_hash
        cfg.no_multicast = not multicast
        cfg.no_broadcast = not broadcast
        ptr = lib.hg_nic_fabric_create(cfg)
        if ptr == ffi.NULL:
            err = ffi.errno
            if err == errno.ENOMEM:
                raise ResourceError("hg_nic_fabric_create: out of memory", -err)
            raise InvalidArgument("hg_nic_fabric_create: bad configuration", -err)
        self._f = ffi.gc(ptr, lib.hg_nic_fabric_destroy)
        self.seed = seed
        self.buf_size = buf_size or 2048
        self.ports: list[Port] = []

    def add_port(self, mac, ipv4=0, udp_port: int = 0, mtu: int = 0, rx_ring: int = 0,
                 tx_ring: int = 0, rate_bps: int = 0, prop_delay_ns: int = 0) -> Port:
        cfg = ffi.new("struct hg_nic_port_config *")
        raw = parse_mac(mac)
        cfg.mac = list(raw)
        cfg.ipv4 = parse_ipv4(ipv4)
        cfg.udp_port = udp_port
        cfg.mtu = mtu
        cfg.rx_ring = rx_ring
        cfg.tx_ring = tx_ring
        cfg.rate_bps = rate_bps
        cfg.prop_delay_ns = prop_delay_ns
        ptr = lib.hg_nic_port_create(self._f, cfg)
        if ptr == ffi.NULL:
            err = ffi.errno
            raise InvalidArgument(f"hg_nic_port_create({raw.hex(':')}) failed: "
                                  f"{errno.errorcode.get(err, err)}", -err)
        port = Port(self, ptr, raw, cfg.ipv4, udp_port, mtu or 1500)
        self.ports.append(port)
        return port

    @property
    def now(self) -> int:
        return lib.hg_nic_now(self._f)

    def advance(self, ns: int) -> None:
        check(lib.hg_nic_advance(self._f, ns), "advance")

    def advance_to(self, t: int) -> None:
        check(lib.hg_nic_advance_to(self._f, t), "advance_to")

    def next_event(self) -> int | None:
        t = ffi.new("uint64_t *")
        return int(t[0]) if lib.hg_nic_next_event(self._f, t) else None

    def run_until_idle(self, max_ns: int | None = None) -> None:
        """Advance event by event until nothing is pending (or max_ns later)."""
        end = None if max_ns is None else self.now + max_ns
        while True:
            t = self.next_event()
            if t is None or (end is not None and t > end):
                break
            self.advance_to(t)
        if end is not None and end > self.now:
            self.advance_to(end)

    @property
    def in_flight(self) -> int:
        return lib.hg_nic_in_flight(self._f)

    @property
    def pool_free(self) -> int:
        return lib.hg_nic_pool_free(self._f)

    @property
    def trace_hash(self) -> int:
        return lib.hg_nic_trace_hash(self._f)

    @property
    def trace_count(self) -> int:
        return lib.hg_nic_trace_count(self._f)

    def trace(self, n: int | None = None) -> list[TraceRecord]:
        """The last n (default: all kept) trace records, oldest first."""
        n = n if n is not None else min(self.trace_count, 1 << 20)
        if n == 0:
            return []
        recs = ffi.new("struct hg_nic_trace_rec[]", n)
        got = lib.hg_nic_trace_copy(self._f, recs, n)
        dirs = {lib.HG_NIC_OUT: OUT, lib.HG_NIC_IN: IN}
        return [TraceRecord(int(r.t_ns), int(r.hash), int(r.src),
                            None if r.dst == 0xFFFF else int(r.dst), int(r.len),
                            EVENT_KINDS.get(r.kind, str(r.kind)), dirs[r.dir])
                for r in recs[0:got]]

    def counters(self) -> dict[str, int]:
        return _counters(lib.hg_nic_fabric_counter_count(), lib.hg_nic_fabric_counter_name,
                         lib.hg_nic_fabric_counters, self._f)
