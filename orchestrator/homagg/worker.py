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
aggregator first (homagg.switch.control.ControlClient.add_job).  ``slots``
unset is ``homagg.protocol.default_slots(workers)`` (W x S fits a
4096-frame receive ring), what the job file and ``homagg run`` register by
default.  A job spread over
K aggregators names them all, in the same order on every worker and with
aggregator k told its ``shard`` k at add_job (docs/PROTOCOL.md, "Several
aggregators")::

    Worker(..., aggregators=[("10.0.0.1", 48879), ("10.0.0.3", 48879)])

Below a tree leaf (docs/PROTOCOL.md "Tree") a worker keeps its id in the
job (``worker``, ``workers``: the codec's) and is wire worker ``i`` of the
leaf's ``n``: ``leaf_ids=(i, n)``, ``aggregator`` the leaf.

``payload`` is the job's payload size (1024 bytes by default; up to 8192
with jumbo frames): it must fit the MTU of the path to every aggregator,
which the worker asks the kernel for (or takes from ``mtu``).  A dead
aggregator makes ``allreduce`` raise ``PeerTimeout`` naming it within
``timeout`` seconds.  ``rto`` is the first retransmission timeout (before
any round trip was measured), ``rto_min`` the least one, ``start_wait``
the least wait for the first result of a step.  ``pipeline_groups`` (the
same on every worker of the job) cuts every method into block groups that
go through the steps independently (docs/PROTOCOL.md "Pipelined block
groups"; auto chooses per group): 0 automatic, 1 not pipelined, N groups.
``stats()`` returns every
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
only its owner can read (homagg.auth), ``mac``: the job's MAC algorithm
("umac", "aes-gmac" or "blake2b"; None: this host's default) and, after a key
rotation, ``key_epoch``: the epoch of that secret; ``rotate_key`` gives a
running worker the next one (docs/SECURITY.md "Rotating keys").
"""

import concurrent.futures
import ipaddress
import socket
import threading

import numpy as np

from homagg import auth, protocol
from homagg.cost import as_cost
from homagg.bindings import client as _c
from homagg.bindings import port_udp as _u
from homagg.bindings.codec import DEFAULT_BLOCK, F_STOCHASTIC
from homagg.bindings.wire import HDR_LEN, MAC_LEN, MAX_PAYLOAD
from homagg.errors import InvalidArgument, PeerTimeout
from homagg.netaddr import parse_ipv4
from homagg.protocol import PIPELINE_GROUPS, check_pipeline_groups, resolve_slots


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
FRAME_OVERHEAD = 20 + 8 + HDR_LEN + MAC_LEN


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
    return min(MAX_PAYLOAD, (int(mtu) - FRAME_OVERHEAD) // 4 * 4)


class UdpPort:
    """The kernel UDP port backend (homagg/port_udp.h); ``port`` is the
    ``struct hg_port *`` a Worker's client or an Engine runs on; ``mtu`` is
    what its get_info reports (0 = 1500); ``gso``: a run of equal frames to
    one destination leaves as one UDP_SEGMENT message (homagg/port_udp.h:
    only where the aggregator's port sees the datagrams cut)."""

    def __init__(
        self, bind=("0.0.0.0", 0), group_port=0, packets=0, rcvbuf=0, mtu=0, sndbuf=0, gso=False
    ):
        if mtu and not 576 <= int(mtu) <= 9000:
            raise InvalidArgument(f"mtu must be 576..9000, got {mtu}")
        self._p = _u.udp_port_create(
            f"UDP socket on {bind[0]}:{bind[1]}",
            bind_ipv4=parse_ipv4(bind[0], "bind"),
            bind_port=int(bind[1]),
            group_port=int(group_port),
            packets=int(packets),
            rcvbuf=int(rcvbuf),
            sndbuf=int(sndbuf),
            mtu=int(mtu),
            gso=1 if gso else 0,
        )

    @property
    def port(self):
        return _u.udp_port_port(self._p)

    @property
    def local_address(self):
        """(ip, port) the unicast socket is bound to."""
        ip, port = _u.udp_port_local(self._p)
        return (str(ipaddress.IPv4Address(ip)), port)

    def wait(self, timeout):
        """Block until a datagram is ready (True) or timeout seconds pass."""
        return _u.udp_port_wait(self._p, int(timeout * 1e9))

    def stats(self):
        return _u.udp_port_get_stats(self._p)

    def close(self):
        if self._p is not None:
            _u.udp_port_destroy(self._p)
            self._p = None


class Worker:
    """One worker of one job, with its own UDP socket(s).

    ``cost``: the job's cost model (homagg.cost.Cost or its dict, as the
    job file's ``cost`` field holds it; None: no link rate, every choice by
    bytes).  It must be the one registered with the job, the same on every
    worker: never this host's own calibration.

    ``udp_gso``: send runs of frames to an aggregator as UDP segmentation
    offload messages (one system call and one trip through the local
    stack per run; the datagrams on the wire are the same).  Only where
    the aggregator's port receives them cut: a NIC, or a testbed whose
    switch ports segment (``Testbed.udp_gso``); a packet socket on a veth
    of the same host would see one unsegmented frame.  False by default.

    ``pipe_gain``: g of the pipe's bound (docs/PROTOCOL.md Part 3, "The
    pipe"): first transmissions wait while this worker's chunks in the
    network's queues at an aggregator reach a bound that settles where
    the round trip is g times its least (2 in the NIC model).  0 (the
    default) keeps the whole window of S chunks in flight: on a shared
    host the scheduler's stalls make the least round trip a quiet
    moment's, and the bound would hold the window near its floor of 4."""

    def __init__(
        self,
        job,
        token,
        worker,
        workers,
        aggregator=("10.0.0.1", 48879),
        group=None,
        bind=("0.0.0.0", 0),
        timeout=5.0,
        slots=None,
        payload=1024,
        rto=0.001,
        packets=0,
        aggregators=None,
        mtu=None,
        incarnation=0,
        rto_min=RTO_MIN,
        start_wait=START_WAIT,
        auth_file=None,
        leaf_ids=None,
        pipeline_groups=PIPELINE_GROUPS,
        mac=None,
        key_epoch=0,
        cost=None,
        udp_gso=False,
        pipe_gain=0.0,
    ):
        if not 0 <= worker < workers:
            raise InvalidArgument(f"worker {worker} not in 0..{workers - 1}")
        agg_worker, agg_workers = leaf_ids or (0, 0)
        if leaf_ids is not None and not (
            0 <= agg_worker < agg_workers <= workers and agg_worker <= worker
        ):
            raise InvalidArgument(
                f"leaf_ids {tuple(leaf_ids)}: (i, n) with 0 <= i < n <= "
                f"workers ({workers}) and i <= worker ({worker})"
            )
        if timeout <= 0:
            raise InvalidArgument("timeout must be positive")
        if not 0 <= float(pipe_gain) <= 10:
            raise InvalidArgument(
                f"pipe_gain must be a number from 0 to 10 (0: no bound but the slots), "
                f"got {pipe_gain!r}; e.g. pipe_gain=2.0"
            )
        if not 4 <= int(payload) <= MAX_PAYLOAD or int(payload) % 4:
            raise InvalidArgument(
                f"payload must be a multiple of 4 in 4..{MAX_PAYLOAD}, got {payload}"
            )
        if not 0 <= int(incarnation) < 2**32:
            raise InvalidArgument(f"incarnation {incarnation} not in 0..2^32-1 (0: from the clock)")
        pipeline_groups = check_pipeline_groups(pipeline_groups)
        slots = resolve_slots(slots, workers)
        self.slots = slots
        if aggregators is None:
            aggregators = [aggregator]
        aggregators = [(str(a[0]), int(a[1])) for a in aggregators]
        if not 1 <= len(aggregators) <= _c.MAX_AGGREGATORS:
            raise InvalidArgument(
                f"aggregators: 1..{_c.MAX_AGGREGATORS} (host, port) pairs, got {len(aggregators)}"
            )
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
        self.payload = int(payload)
        self.cost = as_cost(cost)  # the job's cost model (homagg.torch's choice of path)
        self.key_epoch = int(key_epoch) & 255  # its newest key epoch (rotate_key)
        # the smallest MTU of the paths to the aggregators
        narrow = min(aggregators, key=lambda a: path_mtu(a[0], str(bind[0])))
        self.mtu = int(mtu) if mtu else min(9000, max(576, path_mtu(narrow[0], str(bind[0]))))
        if payload > max_payload(self.mtu):
            raise InvalidArgument(
                f"payload {payload} bytes does not fit the MTU {self.mtu} of the path to "
                f"aggregator {narrow[0]}: at most {max_payload(self.mtu)} bytes; "
                f"a {payload}-byte payload needs links with MTU >= {payload + FRAME_OVERHEAD} "
                f"(jumbo frames, e.g. `homagg testbed up --mtu 9000`)"
            )

        # the send buffer holds a window of frames queued behind the link
        # (about twice their bytes each in kernel memory)
        self._port = UdpPort(
            bind,
            packets=max(int(packets), 4 * slots * len(aggregators) + 256),
            mtu=self.mtu,
            sndbuf=max(4 << 20, 2 * slots * len(aggregators) * (self.payload + FRAME_OVERHEAD)),
            gso=udp_gso,
        )

        # the client holds the port: it frees packets into it
        self._client = _c.client_create(
            self._port.port,
            [(parse_ipv4(host, "aggregator"), port) for host, port in aggregators],
            auth.load_secret(auth_file) if auth_file is not None else None,
            self._port,
            f"job {job}, worker {worker}/{workers}, slots {slots}, payload {payload}",
            job=job,
            token=token,
            worker=worker,
            workers=workers,
            slots=slots,
            payload_bytes=payload,
            group_ipv4=parse_ipv4(group, "group") if group else 0,
            rto_ns=int(rto * 1e9),
            rto_min_ns=int(rto_min * 1e9),
            start_wait_ns=int(start_wait * 1e9),
            give_up_ns=int(timeout * 1e9),
            incarnation=int(incarnation),
            agg_worker=int(agg_worker),
            agg_workers=int(agg_workers),
            pipeline_groups=pipeline_groups,
            mac=auth.mac_code(mac) if auth_file is not None else 0,
            epoch=int(key_epoch) & 255,
            cost=as_cost(cost).fields(),
            pipe_gain_pct=round(float(pipe_gain) * 100),
        )
        # one C call at a time; allreduce_async's calls run on one thread
        self._lock = threading.Lock()
        self._executor = None

    def rotate_key(self, secret_file, epoch):
        """The job's next key epoch ``epoch`` from ``secret_file``
        (docs/PROTOCOL.md "Key epochs"): replies of it verify at once; the
        worker sends with it from its first such reply or retransmission."""
        with self._lock:
            _c.client_rotate_key(self._client, auth.load_secret(secret_file), epoch)
            self.key_epoch = int(epoch) & 255

    @property
    def local_address(self):
        return self._port.local_address

    def allreduce(
        self,
        array,
        method="dense",
        out=None,
        block=None,
        stochastic=False,
        seed=0,
        nc_levels=0,
        info=None,
        divide_by=None,
    ):
        """The sum over the job's workers of ``array`` (float32, 1-D).

        ``divide_by`` (a positive number, optional): the sum divided by it
        in float32, ``sum / np.float32(divide_by)`` bit for bit, done by the
        decoder while each block is in cache (the workers' count gives a
        DDP hook's mean without a pass over the result).

        ``info`` (a dict, optional) receives what this call did:
        "method" (the method that ran: auto's choice), "bytes_sent" and
        "bytes_received" (HomAgg payload bytes of this call), "nonzeros"
        (the elements of ``array`` that are not 0, counted by the C scan of
        lhc, union and auto at no extra pass; None for the other methods).

        ``out`` (optional): a contiguous float32 array of the input's size
        the result is written into (every element, no zeroing first), so a
        caller that sums the same shape again reuses its memory instead of
        a fresh array's page faults; it must not overlap ``array``."""
        code = protocol.method(method).code
        divisor = 0.0
        if divide_by is not None:
            divisor = float(np.float32(divide_by))
            if not (0.0 < divisor < float("inf")) or divisor < float(np.finfo(np.float32).tiny):
                raise InvalidArgument(
                    f"divide_by {divide_by!r}: a finite positive float32 (normal), "
                    "e.g. the job's worker count"
                )
        x = np.ascontiguousarray(array, dtype=np.float32).reshape(-1)
        if out is None:
            out = np.empty_like(x)
        elif out.dtype != np.float32 or out.size != x.size or not out.flags.c_contiguous:
            raise InvalidArgument("out must be a contiguous float32 array of the input's size")
        elif np.may_share_memory(out, x):
            raise InvalidArgument("out must not overlap the input: pass a separate array")
        p = _c.client_params(
            int(block or DEFAULT_BLOCK),
            self.workers,
            self.worker,
            F_STOCHASTIC if stochastic else 0,
            int(seed) & (2**64 - 1),
            int(nc_levels),
            divisor,
        )
        with self._lock:
            if self._client is None:
                raise InvalidArgument("worker is closed")
            if info is not None:
                before = self._payload_bytes()
            where = ", ".join(f"{h}:{port}" for h, port in self.aggregators)
            where = f"aggregator{'s' if len(self.aggregators) > 1 else ''} {where}"
            too_big = self._port.stats()["tx_too_big"]
            try:
                _c.client_allreduce(
                    self._client,
                    p,
                    code,
                    x,
                    out,
                    f"worker {self.worker} of job {self.job}, {where}",
                )
            except PeerTimeout as e:
                self._raise_if_too_big(too_big, e)
                raise
            if info is not None:
                after = self._payload_bytes()
                m = protocol.METHOD_BY_CODE.get(after[2])
                info["method"] = m.name if m else None
                info["bytes_sent"] = after[0] - before[0]
                info["bytes_received"] = after[1] - before[1]
                info["nonzeros"] = after[3] if after[3] != 2**64 - 1 else None
        return out

    def _raise_if_too_big(self, too_big_before, cause):
        """The kernel refused this call's frames as larger than the path MTU
        (the socket never fragments): say so instead of the timeout."""
        st = self._port.stats()
        if st["tx_too_big"] == too_big_before:
            return
        host = self.aggregators[0][0]
        mtu = path_mtu(host, self.local_address[0])
        raise InvalidArgument(
            f"payload {self.payload} bytes: the kernel refused {st['tx_too_big'] - too_big_before} "
            f"frames of {st['tx_too_big_bytes']} bytes (IPv4) as larger than the MTU {mtu} of "
            f"the path to aggregator {host} (don't-fragment is set; the worker was told MTU "
            f"{self.mtu}): use a payload of at most {max_payload(mtu)} bytes, or links with "
            f"MTU >= {self.payload + FRAME_OVERHEAD}"
        ) from cause

    def allreduce_async(self, array, method="dense", **kwargs):
        """``allreduce`` on the worker's background thread: returns a
        concurrent.futures.Future of the result (its exception on failure,
        e.g. PeerTimeout naming the aggregator).  ``array`` must stay
        unchanged until the future is done.  Calls run in submission order."""
        if self._client is None:
            raise InvalidArgument("worker is closed")
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"homagg-w{self.worker}"
            )
        return self._executor.submit(self.allreduce, array, method, **kwargs)

    def _payload_bytes(self):
        """(bytes sent, bytes received, method chosen) of the client so far."""
        st = _c.client_get_stats(self._client)
        return (sum(st.bytes_sent), sum(st.bytes_received), st.method_chosen, st.input_nonzeros)

    def counters(self):
        """The client's counters (struct hg_client_stats) as a dict, the
        per-phase ones as {phase: value}; read under the call lock, so
        between allreduces (homagg.ops.worker_metrics)."""
        with self._lock:
            if self._client is None:
                raise InvalidArgument("worker is closed")
            return _c.client_stats_dict(_c.client_get_stats(self._client))

    def stats(self):
        """The client's counters and the UDP port's, as one dict."""
        st = _c.client_get_stats(self._client)
        out = _c.client_stats_dict(st)
        out["bytes_sent"] = sum(st.bytes_sent)
        out["bytes_received"] = sum(st.bytes_received)
        m = protocol.METHOD_BY_CODE.get(st.method_chosen)
        out["method_chosen"] = m.name if m else None
        out["port"] = self._port.stats()
        out["aggregators"] = []
        for k in range(len(self.aggregators)):
            out["aggregators"].append(_c.client_get_agg_stats(self._client, k))
        return out

    def close(self):
        # pending asynchronous calls finish (or time out) first
        if getattr(self, "_executor", None) is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        # the client first: it holds packets of the port
        if getattr(self, "_client", None) is not None:
            with self._lock:
                _c.client_destroy(self._client)
                self._client = None
        if getattr(self, "_port", None) is not None:
            self._port.close()
            self._port = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
