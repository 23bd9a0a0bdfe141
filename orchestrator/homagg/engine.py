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

from homagg.bindings import engine as _e
from homagg.bindings import port_mem as _m
from homagg.bindings import wire as _w
from homagg.bindings.kernels import op_in_lane_bytes

# the wire's flags and names, also for users of homagg.engine
from homagg.bindings.wire import FLAG_AUTH, FLAG_OVERFLOW, FLAG_RESULT  # noqa: F401
from homagg.bindings.wire import FLAG_RETRANS, FLAG_SHADOW, FLAG_STATUS  # noqa: F401
from homagg.bindings.wire import FLAG_LOSS  # noqa: F401
from homagg.bindings.wire import UDP_PORT, WORKER_ALL, counter_names  # noqa: F401
from homagg.netaddr import parse_ipv4, parse_mac
from homagg.kernels import _op


@dataclass
class Addr:
    """An endpoint: MAC, IPv4 (int, host order), UDP port."""

    mac: bytes
    ipv4: int
    port: int

    @classmethod
    def of(cls, mac, ipv4, port):
        return cls(parse_mac(mac), parse_ipv4(ipv4), int(port))

    def _t(self):
        return (self.mac, self.ipv4, self.port)


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


def build_frame(
    src,
    dst,
    *,
    op,
    job,
    token,
    worker,
    seq,
    slot,
    lanes=None,
    exp=0,
    flags=0,
    payload=b"",
    version=None,
    shard=0,
    incarnation=1,
    nonce=0,
    udp_csum=True,
    key=None,
    alg=None,
    counter=1,
    direction=0,
):
    """Bytes of one frame.  ``lanes`` defaults to the count the payload
    length implies for ``op`` (a data packet); every field can be forced to
    any value so tests can build hostile frames.  With ``key`` (a 32-byte
    key, homagg.auth.derive_key) the frame carries FLAG_AUTH, MAC counter
    ``counter`` (its nonce field) and its MAC of algorithm ``alg`` (None:
    this host's default); the key epoch is ``flags >> 8``.  With FLAG_AUTH
    in ``flags`` and no key it ends in a zero MAC."""
    payload = bytes(payload)
    o = _op(op)
    if lanes is None:
        ib = op_in_lane_bytes(o) or 1
        lanes = len(payload) // ib
    hdr = {
        "version": _w.PROTOCOL_VERSION if version is None else version,
        "op": o,
        "flags": flags,
        "job": job,
        "token": token,
        "worker": worker,
        "slot": slot,
        "seq": seq,
        "lanes": lanes,
        "exp": exp,
        "shard": shard,
        "incarnation": incarnation,
        "nonce": nonce,
    }
    return _w.wire_build_mac(
        src._t(), dst._t(), hdr, payload, udp_csum, key, alg, counter, direction
    )


def parse_frame(frame, udp_port=0, udp_csum=True):
    """A Frame for a valid frame; else the drop reason's counter name (str)."""
    frame = bytes(frame)
    v = _w.wire_parse(frame, udp_port, udp_csum)
    if isinstance(v, str):
        return v
    h = v["hdr"]
    off, end = v["payload_off"], v["payload_off"] + v["payload_len"]
    return Frame(
        Addr(*v["src"]),
        Addr(*v["dst"]),
        h["version"],
        h["op"],
        h["flags"],
        h["job"],
        h["token"],
        h["worker"],
        h["slot"],
        h["seq"],
        h["lanes"],
        h["exp"],
        h["shard"],
        h["incarnation"],
        frame[off:end],
        frame[end : end + _w.MAC_LEN] if h["flags"] & FLAG_AUTH else None,
    )


class MemPort:
    """The in-memory port: inject frames for rx, pop transmitted frames."""

    def __init__(
        self,
        *,
        pool=4096,
        buf_size=9216,
        can_replicate=False,
        mac="02:00:00:00:00:01",
        ipv4="10.0.0.254",
        udp_port=UDP_PORT,
        mtu=9000,
        tx_limit=0,
    ):
        self._p = _m.port_mem_create(
            pool=pool,
            buf_size=buf_size,
            can_replicate=can_replicate,
            mac=parse_mac(mac),
            ipv4=parse_ipv4(ipv4),
            udp_port=udp_port,
            mtu=mtu,
            tx_limit=tx_limit,
        )
        self.buf_size = buf_size
        self.addr = Addr(parse_mac(mac), parse_ipv4(ipv4), udp_port)

    @property
    def port(self):
        return _m.port_mem_port(self._p)

    def inject(self, frame):
        _m.port_mem_inject(self._p, frame)

    def pop(self):
        """The oldest transmitted frame (bytes), or None."""
        return _m.port_mem_pop_tx(self._p, self.buf_size)

    def pop_all(self):
        out = []
        while (f := self.pop()) is not None:
            out.append(f)
        return out

    @property
    def rx_pending(self):
        return _m.port_mem_rx_pending(self._p)

    @property
    def tx_pending(self):
        return _m.port_mem_tx_pending(self._p)

    @property
    def free_count(self):
        return _m.port_mem_free_count(self._p)

    @property
    def groups_joined(self):
        return _m.port_mem_groups(self._p)

    def set_time(self, ns):
        _m.port_mem_set_time(self._p, ns)

    def set_tx_limit(self, limit):
        _m.port_mem_set_tx_limit(self._p, limit)


class Engine:
    """An aggregation engine on a port (MemPort, or any object whose ``port``
    attribute is a ``struct hg_port *``); the port must outlive it."""

    def __init__(
        self,
        port,
        *,
        max_jobs=64,
        udp_port=UDP_PORT,
        burst=32,
        udp_csum=True,
        isa="best",
        staged=True,
    ):
        from homagg.kernels import _isa

        e = _e.engine_create(
            port.port,
            max_jobs=max_jobs,
            udp_port=udp_port,
            burst=burst,
            flags=_e.F_UDP_CSUM if udp_csum else 0,
            isa=_isa(isa),
        )
        self._port = port  # keep the port alive as long as the engine
        self._e = e
        if not staged:
            self.set_staging(False)

    def set_staging(self, staged):
        """Staged bursts (classify all, then apply; the default) or one
        frame at a time: the same counters and results either way."""
        _e.engine_set_staging(self._e, staged)

    def close(self):
        """Destroy the engine now (idempotent)."""
        if self._e is not None:
            _e.engine_destroy(self._e)
            self._e = None

    def add_job(
        self,
        job,
        token,
        workers,
        slots,
        payload_bytes=1024,
        group=0,
        shard=0,
        incarnation=0,
        auth=None,
        parent=None,
        mac=None,
    ):
        """Add a job; ``shard`` is this aggregator's index among the job's,
        ``incarnation`` the job's in replies (0: from the clock), ``auth``
        the job secret (32 bytes) of an authenticated job (None: off), ``mac``
        its algorithm ('umac', 'aes-gmac', 'blake2b'; None: this host's default).
        ``parent``: this engine is a tree leaf below that root
        (docs/PROTOCOL.md "Tree"), an ``Addr`` or a dict with ``addr`` (an
        Addr), ``worker`` (the leaf's id at the root) and optionally
        ``shard``, ``group``, ``rto``, ``give_up`` (seconds), ``base`` and
        ``leaves`` (the job's id of the leaf's first worker and L: the
        leaf then reports who it lacks, docs/PROTOCOL.md "Who is missing
        in a tree") and, for an
        authenticated tree, ``keys``: (the leaf's key at the root, the
        root's aggregator key), from the root job's secret.
        Returns the incarnation the job got."""
        up = {}
        up_keys = None
        if parent is not None:
            p = parent if isinstance(parent, dict) else {"addr": parent}
            a = p["addr"]
            up = dict(
                up=1,
                up_mac=list(a.mac),
                up_ipv4=a.ipv4,
                up_port=a.port,
                up_worker=int(p.get("worker", 0)),
                up_base=int(p.get("base", 0)),
                up_leaves=int(p.get("leaves", 0)),
                up_shard=int(p.get("shard", 0)),
                up_group=parse_ipv4(p.get("group") or 0, "parent group"),
                up_rto_ns=int(p.get("rto", 0) * 1e9),
                up_give_up_ns=int(p.get("give_up", 0) * 1e9),
            )
            up_keys = p.get("keys")
        from homagg import auth as _auth

        if auth is not None:
            up["mac"] = _auth.mac_code(mac)
        _e.engine_add_job(
            self._e,
            secret=auth,
            up_keys=up_keys,
            job=job,
            token=token,
            workers=workers,
            slots=slots,
            payload_bytes=payload_bytes,
            group_ipv4=parse_ipv4(group, "group"),
            shard=shard,
            incarnation=incarnation,
            **up,
        )
        return self.job_config(job)["incarnation"]

    def rotate_key(self, job, secret, grace=10.0):
        """Register the next key epoch of authenticated job ``job`` with
        ``secret``; frames of the previous epoch are accepted for ``grace``
        seconds more (docs/PROTOCOL.md "Key epochs").  Returns the epoch."""
        return _e.engine_rotate_key(self._e, job, secret, int(grace * 1e9))

    def rotate_up_key(self, job, key, reply_key):
        """Tree leaf ``job`` of an authenticated tree: the keys of the root's
        next key epoch (the leaf's key at the root, the root's aggregator
        key, as ``parent["keys"]`` of add_job), given before the root
        rotates; the leaf verifies root replies of both epochs and sends
        up with the new keys from the first reply of the new one
        (docs/PROTOCOL.md "Key epochs in a tree").  Returns that epoch."""
        return _e.engine_rotate_up_key(self._e, job, key, reply_key)

    def job_config(self, job):
        """The job's configuration as the engine holds it (a dict)."""
        return _e.engine_job_config(self._e, job)

    def remove_job(self, job):
        _e.engine_remove_job(self._e, job)

    @property
    def job_count(self):
        return _e.engine_job_count(self._e)

    def poll(self):
        """One rx burst: the number of frames received."""
        return _e.engine_poll(self._e)

    def timers(self):
        """Tree leaves: resend the partial sums whose timer is due; how many."""
        return _e.engine_timers(self._e)

    @property
    def next_deadline(self):
        """When the next upward timer is due (port clock, ns); None: none."""
        return _e.engine_next_deadline(self._e)

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
        return _e.engine_process(self._e, pkts, n)

    def counters(self):
        return _e.engine_counters(self._e)

    def job_counters(self, job):
        return _e.engine_job_counters(self._e, job)

    def worker_counters(self, job, worker):
        """{"summed", "duplicates", "retransmissions", "dropped"} of one
        worker of a job (homagg/counters.h HG_FOREACH_WORKER_COUNTER)."""
        return _e.engine_worker_counters(self._e, job, worker)

    def job_open_sets(self, job):
        """The job's sets holding a chunk not answered yet."""
        return _e.engine_job_open_sets(self._e, job)
