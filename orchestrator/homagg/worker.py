"""A HomAgg worker on a real network: ``homagg.worker.Worker``.

The C worker client (homagg/client.h) over the kernel UDP port backend
(homagg/port_udp.h), talking to an aggregator such as homagg-switch::

    from homagg.worker import Worker

    with Worker(job=7, token=99, worker=0, workers=4,
                aggregator=("10.0.0.1", 48879), group="239.1.1.1",
                bind=("10.0.0.2", 0), timeout=5.0) as w:
        y = w.allreduce(grad, method="lhc")   # float32, the exact sum

Every worker of the job makes the same calls with its own ``worker`` id;
the job (id, token, W, slots, payload) must be configured on the
aggregator first (homagg.control.ControlClient.add_job).  A job spread over
K aggregators names them all, in the same order on every worker and with
aggregator k told its ``shard`` k at add_job (docs/PROTOCOL.md, "Several
aggregators")::

    Worker(..., aggregators=[("10.0.0.1", 48879), ("10.0.0.3", 48879)])

``payload`` is the job's payload size (1024 bytes by default; up to 8192
with jumbo frames): it must fit the MTU of the path to every aggregator,
which the worker asks the kernel for (or takes from ``mtu``).  A dead
aggregator makes ``allreduce`` raise ``PeerTimeout`` naming it within
``timeout`` seconds.  ``rto`` is the first retransmission timeout (before
any round trip was measured), ``rto_min`` the least one, ``start_wait``
the least wait for the first result of a step.  ``stats()`` returns every
counter of the client (homagg/client.h: timeouts, spurious_timeouts,
fast_retransmissions, ...), of each aggregator and of its UDP port (waits,
wait_timeouts: the blocking allreduce sleeps in ppoll until a result
arrives).

``allreduce`` releases the GIL for the whole C call (cffi does), so
``allreduce_async(grad)`` runs it on the worker's one background thread and
returns a concurrent.futures.Future: calls run one at a time in the order
they were made (every worker of a job must make the same calls in the same
order), while Python keeps running.

Every frame carries the worker's ``incarnation`` (default: from the clock,
so a restarted worker gets a greater one); an aggregator that restarts
during an allreduce makes it raise ``PeerRestarted``.  A job with
authentication gives every worker ``auth_file``: the job secret in a file
only its owner can read (homagg.auth).
"""
import concurrent.futures
import ipaddress
import socket
import threading

import numpy as np

from homagg import auth, protocol
from homagg._native import ffi, lib
from homagg.bindings.client import agg_stats_dict, client_stats_dict
from homagg.errors import InvalidArgument, check, error_for
from homagg.netaddr import parse_ipv4


# The least retransmission timeout of a worker on kernel UDP (seconds).  Its
# results stop for as long as the scheduler keeps a peer, the aggregator or
# itself off a core: up to 11 ms measured on the 2-core testbed under load 8
# (spurious timeouts of 1-11 ms with a 1-3 ms RTO).  Losses inside a window
# do not wait for it (fast retransmission); only a lost tail of a step does.
RTO_MIN = 0.02
# The least wait for the first result of a step (seconds): it includes the
# slowest peer's computing of the step (encoding 2^24 elements under CPU
# contention: 20-140 ms measured on that testbed).  Only a step none of
# whose results came back waits for it (a lost single-chunk step).
START_WAIT = 0.1


IP_MTU = getattr(socket, "IP_MTU", 14)  # linux/in.h
# IPv4 + UDP + HomAgg header + the optional MAC (docs/PROTOCOL.md Part 2)
FRAME_OVERHEAD = 20 + 8 + lib.HG_HDR_LEN + lib.HG_MAC_LEN


def path_mtu(dest, source="0.0.0.0"):
    """The kernel's MTU of the route from ``source`` to ``dest`` (IPv4
    strings): a connected UDP socket's IP_MTU; 1500 when it cannot tell."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((source, 0))
            s.connect((dest, 9))
            return int(s.getsockopt(socket.IPPROTO_IP, IP_MTU))
        except OSError:
            return 1500


def max_payload(mtu):
    """The largest job payload (bytes, a multiple of 4, at most
    HG_MAX_PAYLOAD) whose frames fit a link of this MTU."""
    return min(lib.HG_MAX_PAYLOAD, (int(mtu) - FRAME_OVERHEAD) // 4 * 4)


class UdpPort:
    """The kernel UDP port backend (homagg/port_udp.h); ``port`` is the
    ``struct hg_port *`` a Worker's client or an Engine runs on; ``mtu`` is
    what its get_info reports (0 = 1500)."""

    def __init__(self, bind=("0.0.0.0", 0), group_port=0, packets=0, rcvbuf=0, mtu=0):
        if mtu and not 576 <= int(mtu) <= 9000:
            raise InvalidArgument(f"mtu must be 576..9000, got {mtu}")
        pc = ffi.new("struct hg_udp_port_config *")
        pc.bind_ipv4 = parse_ipv4(bind[0], "bind")
        pc.bind_port = int(bind[1])
        pc.group_port = int(group_port)
        pc.packets = int(packets)
        pc.rcvbuf = int(rcvbuf)
        pc.mtu = int(mtu)
        p = lib.hg_udp_port_create(pc)
        if p == ffi.NULL:
            raise error_for(-ffi.errno, f"UDP socket on {bind[0]}:{bind[1]}")
        self._p = ffi.gc(p, lib.hg_udp_port_destroy)

    @property
    def port(self):
        return lib.hg_udp_port_port(self._p)

    @property
    def local_address(self):
        """(ip, port) the unicast socket is bound to."""
        ip = ffi.new("uint32_t *")
        port = ffi.new("uint16_t *")
        check(lib.hg_udp_port_local(self._p, ip, port))
        return (str(ipaddress.IPv4Address(ip[0])), port[0])

    def wait(self, timeout):
        """Block until a datagram is ready (True) or timeout seconds pass."""
        return check(lib.hg_udp_port_wait(self._p, int(timeout * 1e9))) == 1

    def stats(self):
        ps = ffi.new("struct hg_udp_port_stats *")
        check(lib.hg_udp_port_get_stats(self._p, ps))
        return {name: getattr(ps, name)
                for name, _ in ffi.typeof("struct hg_udp_port_stats").fields}

    def close(self):
        if self._p is not None:
            ffi.release(self._p)
            self._p = None


class Worker:
    """One worker of one job, with its own UDP socket(s)."""

    def __init__(self, job, token, worker, workers,
                 aggregator=("10.0.0.1", 48879), group=None,
                 bind=("0.0.0.0", 0), timeout=5.0, slots=64, payload=1024,
                 rto=0.001, packets=0, aggregators=None, mtu=None, incarnation=0,
                 rto_min=RTO_MIN, start_wait=START_WAIT,
                 auth_file=None):
        if not 0 <= worker < workers:
            raise InvalidArgument(f"worker {worker} not in 0..{workers - 1}")
        if timeout <= 0:
            raise InvalidArgument("timeout must be positive")
        if not 4 <= int(payload) <= lib.HG_MAX_PAYLOAD or int(payload) % 4:
            raise InvalidArgument(f"payload must be a multiple of 4 in 4..{lib.HG_MAX_PAYLOAD}, "
                                  f"got {payload}")
        if not 0 <= int(incarnation) < 2**32:
            raise InvalidArgument(f"incarnation {incarnation} not in 0..2^32-1 (0: from the clock)")
        if aggregators is None:
            aggregators = [aggregator]
        aggregators = [(str(a[0]), int(a[1])) for a in aggregators]
        if not 1 <= len(aggregators) <= lib.HG_CLIENT_MAX_AGGREGATORS:
            raise InvalidArgument(f"aggregators: 1..{lib.HG_CLIENT_MAX_AGGREGATORS} "
                                  f"(host, port) pairs, got {len(aggregators)}")
        if len(set(aggregators)) != len(aggregators):
            raise InvalidArgument(f"aggregators: the same address twice in {aggregators}")
        self.job, self.token = job, token
        self.worker, self.workers = worker, workers
        self.aggregators = aggregators
        self.aggregator = aggregators[0]
        for a in aggregators:
            parse_ipv4(a[0], "aggregator")
        self.group = group
        self.timeout = timeout
        # the smallest MTU of the paths to the aggregators
        narrow = min(aggregators, key=lambda a: path_mtu(a[0], str(bind[0])))
        self.mtu = int(mtu) if mtu else min(9000, max(576, path_mtu(narrow[0], str(bind[0]))))
        if payload > max_payload(self.mtu):
            raise InvalidArgument(
                f"payload {payload} bytes does not fit the MTU {self.mtu} of the path to "
                f"aggregator {narrow[0]}: at most {max_payload(self.mtu)} bytes; "
                f"a {payload}-byte payload needs links with MTU >= {payload + FRAME_OVERHEAD} "
                f"(jumbo frames, e.g. `homagg testbed up --mtu 9000`)")

        self._port = UdpPort(bind, packets=max(int(packets),
                                               4 * slots * len(aggregators) + 256),
                             mtu=self.mtu)

        cfg = ffi.new("struct hg_client_config *")
        cfg.port = self._port.port
        cfg.job = job
        cfg.token = token
        cfg.worker = worker
        cfg.workers = workers
        cfg.slots = slots
        cfg.payload_bytes = payload
        aggs = ffi.new("struct hg_client_agg[]", len(aggregators))
        for a, (host, port) in zip(aggs, aggregators):
            a.ipv4 = parse_ipv4(host, "aggregator")
            a.udp_port = port
        cfg.naggs = len(aggregators)
        cfg.aggs = aggs
        cfg.group_ipv4 = parse_ipv4(group, "group") if group else 0
        cfg.rto_ns = int(rto * 1e9)
        cfg.rto_min_ns = int(rto_min * 1e9)
        cfg.start_wait_ns = int(start_wait * 1e9)
        cfg.give_up_ns = int(timeout * 1e9)
        cfg.incarnation = int(incarnation)
        if auth_file is not None:
            cfg.auth = 1
            cfg.secret = list(auth.load_secret(auth_file))
        self._cfg = cfg
        self._aggs = aggs
        client = lib.hg_client_create(cfg)
        cfg.secret = [0] * len(cfg.secret)  # the client keeps only its keys
        if client == ffi.NULL:
            raise InvalidArgument(
                f"worker client configuration refused (job {job}, worker "
                f"{worker}/{workers}, slots {slots}, payload {payload})")
        # the destructor holds the port: the client frees packets into it
        self._client = ffi.gc(
            client, lambda c, _port=self._port: lib.hg_client_destroy(c))
        # one C call at a time; allreduce_async's calls run on one thread
        self._lock = threading.Lock()
        self._executor = None

    @property
    def local_address(self):
        return self._port.local_address

    def allreduce(self, array, method="dense", out=None, block=None,
                  stochastic=False, seed=0, nc_levels=0, info=None):
        """The sum over the job's workers of ``array`` (float32, 1-D).

        ``info`` (a dict, optional) receives what this call did:
        "method" (the method that ran: auto's choice), "bytes_sent" and
        "bytes_received" (HomAgg payload bytes of this call)."""
        code = protocol.method(method).code
        x = np.ascontiguousarray(array, dtype=np.float32).reshape(-1)
        if out is None:
            out = np.empty_like(x)
        elif (out.dtype != np.float32 or out.size != x.size
              or not out.flags.c_contiguous):
            raise InvalidArgument("out must be a contiguous float32 array of the input's size")
        p = ffi.new("struct hg_params *")
        p.block = int(block or lib.HG_DEFAULT_BLOCK)
        p.workers = self.workers
        p.worker = self.worker
        p.flags = lib.HG_F_STOCHASTIC if stochastic else 0
        p.seed = int(seed) & (2**64 - 1)
        p.nc_levels = int(nc_levels)
        with self._lock:
            if self._client is None:
                raise InvalidArgument("worker is closed")
            if info is not None:
                before = self._payload_bytes()
            rc = lib.hg_client_allreduce(
                self._client, p, code,
                ffi.from_buffer("float[]", x), x.size,
                ffi.from_buffer("float[]", out, require_writable=True))
            if info is not None and rc >= 0:
                after = self._payload_bytes()
                m = protocol.METHOD_BY_CODE.get(after[2])
                info["method"] = m.name if m else None
                info["bytes_sent"] = after[0] - before[0]
                info["bytes_received"] = after[1] - before[1]
        if rc < 0:
            text = ffi.string(lib.hg_client_error_text(self._client)).decode()
            where = ", ".join(f"{h}:{p}" for h, p in self.aggregators)
            where = f"aggregator{'s' if len(self.aggregators) > 1 else ''} {where}"
            raise error_for(rc, f"worker {self.worker} of job {self.job}, "
                                f"{where}: {text or 'failed'}")
        return out

    def allreduce_async(self, array, method="dense", **kwargs):
        """``allreduce`` on the worker's background thread: returns a
        concurrent.futures.Future of the result (its exception on failure,
        e.g. PeerTimeout naming the aggregator).  ``array`` must stay
        unchanged until the future is done.  Calls run in submission order."""
        if self._client is None:
            raise InvalidArgument("worker is closed")
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"homagg-w{self.worker}")
        return self._executor.submit(self.allreduce, array, method, **kwargs)

    def _payload_bytes(self):
        """(bytes sent, bytes received, method chosen) of the client so far."""
        st = ffi.new("struct hg_client_stats *")
        lib.hg_client_get_stats(self._client, st)
        return (sum(st.bytes_sent), sum(st.bytes_received), st.method_chosen)

    def stats(self):
        """The client's counters and the UDP port's, as one dict."""
        st = ffi.new("struct hg_client_stats *")
        check(lib.hg_client_get_stats(self._client, st))
        out = client_stats_dict(st)
        out["bytes_sent"] = sum(st.bytes_sent)
        out["bytes_received"] = sum(st.bytes_received)
        m = protocol.METHOD_BY_CODE.get(st.method_chosen)
        out["method_chosen"] = m.name if m else None
        out["port"] = self._port.stats()
        out["aggregators"] = []
        ast = ffi.new("struct hg_client_agg_stats *")
        for k in range(len(self.aggregators)):
            check(lib.hg_client_get_agg_stats(self._client, k, ast))
            out["aggregators"].append(agg_stats_dict(ast))
        return out

    def close(self):
        # pending asynchronous calls finish (or time out) first
        if getattr(self, "_executor", None) is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        # the client first: it holds packets of the port
        if getattr(self, "_client", None) is not None:
            with self._lock:
                ffi.release(self._client)
                self._client = None
        if getattr(self, "_port", None) is not None:
            self._port.close()
            self._port = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
