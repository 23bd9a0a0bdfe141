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

from dataclasses import asdict, dataclass

from homagg.bindings import nic as _b
from homagg.errors import InvalidArgument
from homagg.netaddr import parse_ipv4, parse_mac

OUT = "out"
IN = "in"
_DIRS = {OUT: _b.DIR_OUT, IN: _b.DIR_IN}
_DIR_NAMES = {v: k for k, v in _DIRS.items()}
EVENT_KINDS = _b.EVENT_KINDS


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


class Port:
    """A port of a :class:`Fabric` (created by :meth:`Fabric.add_port`)."""

    def __init__(self, fabric: "Fabric", ptr, mac: bytes, ipv4: int, udp_port: int, mtu: int):
        self.fabric = fabric
        self._p = ptr
        self.mac = mac
        self.ipv4 = ipv4
        self.udp_port = udp_port
        self.mtu = mtu
        self.id = _b.port_id(ptr)

    @property
    def hg_port(self):
        """The ``struct hg_port *`` for the C engine / worker client."""
        return _b.port_get(self._p)

    def set_faults(self, direction: str, faults: Faults | None = None, **kw) -> None:
        """Set the faults of the link ``"out"`` of or ``"in"``to this port."""
        if direction not in _DIRS:
            raise InvalidArgument(f"direction must be 'out' or 'in', not {direction!r}")
        f = faults if faults is not None else Faults(**kw)
        _b.port_set_faults(self._p, _DIRS[direction], **asdict(f))

    def join(self, group) -> None:
        _b.port_join(self._p, parse_ipv4(group, "group"))

    def leave(self, group) -> None:
        _b.port_leave(self._p, parse_ipv4(group, "group"))

    def send(self, frames) -> int:
        """Send frames (an iterable of bytes) at the current time; returns how
        many the port took (stops at a full tx ring or an empty pool)."""
        frames = [bytes(fr) for fr in frames]
        if not frames:
            return 0
        for fr in frames:
            if len(fr) > 0xFFFF:
                raise InvalidArgument("frame longer than 65535 bytes")
        return _b.port_send_frames(self._p, b"".join(frames), [len(fr) for fr in frames])

    def send_packed(self, data, lens) -> int:
        """Send frames packed back to back in ``data`` (bytes-like), lengths in
        ``lens`` (a uint16 numpy array or a list); returns how many were taken."""
        return _b.port_send_frames(self._p, data, lens)

    def recv(self, max_frames: int | None = None, with_src: bool = False):
        """Take frames from the rx ring (all, or at most max_frames): a list of
        bytes, or of (src_port_id, bytes) with with_src."""
        pending = _b.port_rx_pending(self._p)
        n = pending if max_frames is None else min(max_frames, pending)
        got = _b.port_recv_frames(self._p, n, self.fabric.buf_size)
        return got if with_src else [fr for _, fr in got]

    @property
    def rx_pending(self) -> int:
        return _b.port_rx_pending(self._p)

    def counters(self) -> dict[str, int]:
        return _b.port_counters(self._p)

    def __repr__(self):
        return f"Port(id={self.id}, mac={self.mac.hex(':')})"


class Fabric:
    """One L2 switch with a virtual clock, a buffer pool and ports."""

    def __init__(
        self,
        seed: int = 0,
        pool_size: int = 0,
        buf_size: int = 0,
        max_ports: int = 0,
        trace_records: int = 0,
        trace_hash: bool = True,
        multicast: bool = True,
        broadcast: bool = True,
    ):
        self._f = _b.fabric_create(
            seed=seed & (2**64 - 1),
            pool_size=pool_size,
            buf_size=buf_size,
            max_ports=max_ports,
            trace_records=trace_records,
            trace_hash=trace_hash,
            no_multicast=not multicast,
            no_broadcast=not broadcast,
        )
        self.seed = seed
        self.buf_size = buf_size or 2048
        self.ports: list[Port] = []

    def add_port(
        self,
        mac,
        ipv4=0,
        udp_port: int = 0,
        mtu: int = 0,
        rx_ring: int = 0,
        tx_ring: int = 0,
        rate_bps: int = 0,
        prop_delay_ns: int = 0,
    ) -> Port:
        raw = parse_mac(mac, "mac")
        ip = parse_ipv4(ipv4, "ipv4")
        ptr = _b.port_create(
            self._f,
            mac=list(raw),
            ipv4=ip,
            udp_port=udp_port,
            mtu=mtu,
            rx_ring=rx_ring,
            tx_ring=tx_ring,
            rate_bps=rate_bps,
            prop_delay_ns=prop_delay_ns,
        )
        port = Port(self, ptr, raw, ip, udp_port, mtu or 1500)
        self.ports.append(port)
        return port

    @property
    def now(self) -> int:
        return _b.now(self._f)

    def advance(self, ns: int) -> None:
        _b.advance(self._f, ns)

    def advance_to(self, t: int) -> None:
        _b.advance_to(self._f, t)

    def next_event(self) -> int | None:
        return _b.next_event(self._f)

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
        return _b.in_flight(self._f)

    @property
    def pool_free(self) -> int:
        return _b.pool_free(self._f)

    @property
    def trace_hash(self) -> int:
        return _b.trace_hash(self._f)

    @property
    def trace_count(self) -> int:
        return _b.trace_count(self._f)

    def trace(self, n: int | None = None) -> list[TraceRecord]:
        """The last n (default: all kept) trace records, oldest first."""
        n = n if n is not None else min(self.trace_count, 1 << 20)
        return [
            TraceRecord(
                r["t_ns"],
                r["hash"],
                r["src"],
                None if r["dst"] == _b.NO_DST else r["dst"],
                r["len"],
                EVENT_KINDS.get(r["kind"], str(r["kind"])),
                _DIR_NAMES[r["dir"]],
            )
            for r in _b.trace_copy(self._f, n)
        ]

    def counters(self) -> dict[str, int]:
        return _b.fabric_counters(self._f)
