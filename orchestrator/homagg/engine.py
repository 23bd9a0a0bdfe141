"""The aggregation engine and its in-memory port, from Python.

``Engine`` wraps struct hg_engine (homagg/engine.h); ``MemPort`` wraps the
in-memory port backend (homagg/port_mem.h) that tests and benchmarks feed
frames into and read transmitted frames back from.  ``build_frame`` and
``parse_frame`` are the wire format (homagg/wire.h, docs/PROTOCOL.md).

    port = MemPort(can_replicate=True)
    eng = Engine(port)
    eng.add_job(job=1, token=7, workers=2, slots=4, group=0xE0000001)
    port.inject(build_frame(...)); eng.poll(); port.pop_all()
    eng.counters()  # {"received": 1, "summed": 1, ...}
"""
from dataclasses import dataclass

from homagg._native import ffi, lib
from homagg.errors import InvalidArgument, ResourceError, check
from homagg.netaddr import parse_ipv4, parse_mac
from homagg.kernels import _op

FLAG_RESULT = lib.HG_FLAG_RESULT
FLAG_RETRANS = lib.HG_FLAG_RETRANS
FLAG_SHADOW = lib.HG_FLAG_SHADOW
FLAG_OVERFLOW = lib.HG_FLAG_OVERFLOW
FLAG_STATUS = lib.HG_FLAG_STATUS
FLAG_AUTH = lib.HG_FLAG_AUTH
WORKER_ALL = lib.HG_WORKER_ALL
UDP_PORT = lib.HG_UDP_PORT


def counter_names():
    """The counter names in table order (homagg/counters.h)."""
    return [ffi.string(lib.hg_counter_name(i)).decode() for i in range(lib.hg_counter_count())]


@dataclass
class Addr:
    """An endpoint: MAC, IPv4 (int, host order), UDP port."""

    mac: bytes
    ipv4: int
    port: int

    @classmethod
    def of(cls, mac, ipv4, port):
        return cls(parse_mac(mac), parse_ipv4(ipv4), int(port))

    def _c(self):
        a = ffi.new("struct hg_wire_addr *")
        a.mac = list(self.mac)
        a.ipv4 = self.ipv4
        a.port = self.port
        return a


@dataclass
class Frame:
    """A parsed frame: addresses, header fields (host order) and payload."""

    src: Addr
    dst: Addr
    version: int
    op: int
    flags: int
    job: int
    token: int
    worker: int
    slot: int
    seq: int
    lanes: int
    exp: int
    shard: int
    incarnation: int
    payload: bytes
    mac: bytes = None  # the MAC trailer (HG_FLAG_AUTH), else None


def build_frame(src, dst, *, op, job, token, worker, seq, slot, lanes=None,
                exp=0, flags=0, payload=b"", version=None, shard=0, incarnation=1,
                reserved=0, udp_csum=True, key=None):
    """Bytes of one frame.  ``lanes`` defaults to the count the payload
    length implies for ``op`` (a data packet); every field can be forced to
    any value so tests can build hostile frames.  With ``key`` (a 32-byte
    key, homagg.auth.derive_key) the frame carries FLAG_AUTH and its MAC;
    with FLAG_AUTH in ``flags`` and no key it ends in a zero MAC."""
    payload = bytes(payload)
    o = _op(op)
    if lanes is None:
        ib = lib.hg_op_in_lane_bytes(o) or 1
        lanes = len(payload) // ib
    h = ffi.new("struct hg_hdr *")
    h.version = lib.HG_PROTOCOL_VERSION if version is None else version
    h.op = o
    h.flags = flags
    h.job = job
    h.token = token
    h.worker = worker
    h.slot = slot
    h.seq = seq
    h.lanes = lanes
    h.exp = exp
    h.shard = shard
    h.incarnation = incarnation
    h.reserved = reserved
    buf = ffi.new("uint8_t[]", lib.HG_ETH_IP_UDP_LEN + lib.HG_HDR_LEN + len(payload)
                  + lib.HG_MAC_LEN)
    if key is not None and len(bytes(key)) != lib.HG_AUTH_KEY_LEN:
        raise InvalidArgument(f"key: {lib.HG_AUTH_KEY_LEN} bytes")
    n = check(lib.hg_wire_build_mac(buf, len(buf), src._c(), dst._c(), h,
                                    payload if payload else ffi.NULL, len(payload),
                                    lib.HG_WIRE_F_UDP_CSUM if udp_csum else 0,
                                    bytes(key) if key is not None else ffi.NULL),
              "hg_wire_build_mac")
    return bytes(ffi.buffer(buf, n))


def parse_frame(frame, udp_port=0, udp_csum=True):
    """A Frame for a valid frame; else the drop reason's counter name (str)."""
    frame = bytes(frame)
    v = ffi.new("struct hg_wire_view *")
    rc = lib.hg_wire_parse(frame, len(frame), udp_port,
                           lib.HG_WIRE_F_UDP_CSUM if udp_csum else 0, v)
    check(rc, "hg_wire_parse")
    if rc > 0:
        return ffi.string(lib.hg_counter_name(rc)).decode()
    h = v.hdr

    def addr(a):
        return Addr(bytes(a.mac), a.ipv4, a.port)

    return Frame(addr(v.src), addr(v.dst), h.version, h.op, h.flags, h.job, h.token,
                 h.worker, h.slot, h.seq, h.lanes, h.exp, h.shard, h.incarnation,
                 frame[v.payload_off:v.payload_off + v.payload_len],
                 frame[v.payload_off + v.payload_len:v.payload_off + v.payload_len
                       + lib.HG_MAC_LEN] if h.flags & lib.HG_FLAG_AUTH else None)


class MemPort:
    """The in-memory port: inject frames for rx, pop transmitted frames."""

    def __init__(self, *, pool=4096, buf_size=9216, can_replicate=False,
                 mac="02:00:00:00:00:01", ipv4="10.0.0.254", udp_port=UDP_PORT,
                 mtu=9000, tx_limit=0):
        c = ffi.new("struct hg_port_mem_config *")
        lib.hg_port_mem_config_init(c)
        c.pool = pool
        c.buf_size = buf_size
        c.can_replicate = can_replicate
        c.mac = list(parse_mac(mac))
        c.ipv4 = parse_ipv4(ipv4)
        c.udp_port = udp_port
        c.mtu = mtu
        c.tx_limit = tx_limit
        p = lib.hg_port_mem_create(c)
        if p == ffi.NULL:
            raise ResourceError("hg_port_mem_create failed (config or memory)")
        self._p = ffi.gc(p, lib.hg_port_mem_destroy)
        self.buf_size = buf_size
        self.addr = Addr(parse_mac(mac), parse_ipv4(ipv4), udp_port)

    @property
    def port(self):
        return lib.hg_port_mem_port(self._p)

    def inject(self, frame):
        frame = bytes(frame)
        check(lib.hg_port_mem_inject(self._p, frame, len(frame)), "hg_port_mem_inject")

    def pop(self):
        """The oldest transmitted frame (bytes), or None."""
        buf = ffi.new("uint8_t[]", self.buf_size)
        n = check(lib.hg_port_mem_pop_tx(self._p, buf, len(buf)), "hg_port_mem_pop_tx")
        return bytes(ffi.buffer(buf, n)) if n else None

    def pop_all(self):
        out = []
        while (f := self.pop()) is not None:
            out.append(f)
        return out

    @property
    def rx_pending(self):
        return lib.hg_port_mem_rx_pending(self._p)

    @property
    def tx_pending(self):
        return lib.hg_port_mem_tx_pending(self._p)

    @property
    def free_count(self):
        return lib.hg_port_mem_free_count(self._p)

    @property
    def groups_joined(self):
        return lib.hg_port_mem_groups(self._p)

    def set_time(self, ns):
        lib.hg_port_mem_set_time(self._p, ns)

    def set_tx_limit(self, limit):
        lib.hg_port_mem_set_tx_limit(self._p, limit)


class Engine:
    """An aggregation engine on a port (MemPort, or any object whose ``port``
    attribute is a ``struct hg_port *``); the port must outlive it."""

    def __init__(self, port, *, max_jobs=64, udp_port=UDP_PORT, burst=32,
                 udp_csum=True, isa="best", staged=True):
        from homagg.kernels import _isa

        c = ffi.new("struct hg_engine_config *")
        lib.hg_engine_config_init(c)
        c.port = port.port
        c.max_jobs = max_jobs
        c.udp_port = udp_port
        c.burst = burst
        c.flags = lib.HG_ENGINE_F_UDP_CSUM if udp_csum else 0
        c.isa = _isa(isa)
        e = lib.hg_engine_create(c)
        if e == ffi.NULL:
            raise InvalidArgument("hg_engine_create failed (config out of range, "
                                  "unsupported ISA, or no memory)")
        self._port = port  # keep the port alive as long as the engine
        self._e = ffi.gc(e, lib.hg_engine_destroy)
        if not staged:
            self.set_staging(False)

    def set_staging(self, staged):
        """Staged bursts (classify all, then apply; the default) or one
        frame at a time: the same counters and results either way."""
        check(lib.hg_engine_set_staging(self._e, bool(staged)), "hg_engine_set_staging")

    def close(self):
        """Destroy the engine now (idempotent)."""
        if self._e is not None:
            ffi.release(self._e)  # runs hg_engine_destroy now
            self._e = None

    def add_job(self, job, token, workers, slots, payload_bytes=1024, group=0,
                shard=0, incarnation=0, auth=None):
        """Add a job; ``shard`` is this aggregator's index among the job's,
        ``incarnation`` the job's in replies (0: from the clock), ``auth``
        the job secret (32 bytes) of an authenticated job (None: off).
        Returns the incarnation the job got."""
        j = ffi.new("struct hg_job_config *")
        j.job = job
        j.token = token
        j.workers = workers
        j.slots = slots
        j.payload_bytes = payload_bytes
        j.group_ipv4 = parse_ipv4(group, "group")
        j.shard = shard
        j.incarnation = incarnation
        if auth is not None:
            auth = bytes(auth)
            if len(auth) != lib.HG_AUTH_SECRET_LEN:
                raise InvalidArgument(f"auth: a job secret has {lib.HG_AUTH_SECRET_LEN} bytes")
            j.auth = 1
            j.secret = list(auth)
        check(lib.hg_engine_add_job(self._e, j), f"add job {job}")
        return self.job_config(job)["incarnation"]

    def job_config(self, job):
        """The job's configuration as the engine holds it (a dict)."""
        j = ffi.new("struct hg_job_config *")
        check(lib.hg_engine_job_config(self._e, job, j), f"job {job}")
        return {k: getattr(j, k) for k in (
            "job", "token", "workers", "slots", "payload_bytes", "group_ipv4",
            "shard", "incarnation", "auth")}

    def remove_job(self, job):
        check(lib.hg_engine_remove_job(self._e, job), f"remove job {job}")

    @property
    def job_count(self):
        return lib.hg_engine_job_count(self._e)

    def poll(self):
        """One rx burst: the number of frames received."""
        return check(lib.hg_engine_poll(self._e), "hg_engine_poll")

    def poll_all(self, limit=1_000_000):
        """Poll until the port has nothing; the total received."""
        total = 0
        while total < limit:
            n = self.poll()
            if not n:
                break
            total += n
        return total

    def process(self, pkts, n):
        """Process n packets (a ``struct hg_pkt *[]``) already received."""
        return check(lib.hg_engine_process(self._e, pkts, n), "hg_engine_process")

    def counters(self):
        n = lib.hg_counter_count()
        out = ffi.new("uint64_t[]", n)
        lib.hg_engine_counters(self._e, out, n)
        return dict(zip(counter_names(), list(out)))

    def job_counters(self, job):
        n = lib.hg_counter_count()
        out = ffi.new("uint64_t[]", n)
        check(lib.hg_engine_job_counters(self._e, job, out, n), f"job {job} counters")
        return dict(zip(counter_names(), list(out)))
