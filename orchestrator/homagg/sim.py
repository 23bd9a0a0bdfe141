"""A whole HomAgg cluster in one process: ``homagg.sim.Cluster``.

The real C engine and the real C worker client, connected by the software
NIC model (virtual time, seeded loss, duplication, reordering, delay, line
rate), all driven by one event loop in C (homagg/sim.h)::

    from homagg.sim import Cluster

    with Cluster(workers=4, loss=0.01, seed=1) as cluster:
        result = cluster.allreduce(grads, method="lhc")   # grads: W arrays
        result.sum            # float32, bit-identical on every worker
        result.stats          # per worker, engine counters, virtual time

``Cluster(aggregators=K)`` spreads every job over K aggregators (one
engine and one link each; chunk c goes to aggregator c mod K, see
docs/PROTOCOL.md "Several aggregators"); ``cluster.aggregator_counters(k)``
gives aggregator k's engine and link counters, ``kill_aggregator(k)`` stops
one mid-job (the workers' ``PeerTimeout`` names it).

``Cluster(leaves=L)`` runs every job over a two-level tree (docs/PROTOCOL.md
"Tree"): aggregators 0..L-1 are leaf aggregators, each summing a contiguous
part of the workers and sending one partial sum per slot up to the root,
aggregator L, whose result comes back down through the leaves.

Several jobs share the aggregators: ``cluster.add_job(workers=...)`` returns a
``Job``; ``cluster.allreduce_many([(job, grads, method), ...])`` runs them
interleaved in one event loop.  Errors come from ``homagg.errors``: a dead
peer makes the others raise ``PeerTimeout`` naming it.
"""

import errno
import math
import numbers

import numpy as np

from homagg.bindings import sim as _b
from homagg.bindings.codec import DEFAULT_BLOCK, F_STOCHASTIC
from homagg.bindings.kernels import OP_SUM32
from homagg.bindings.wire import PROTOCOL_VERSION
from homagg import auth, protocol
from homagg import auth as _auth
from homagg.protocol import (
    PIPELINE_GROUPS,
    check_pipeline_groups,
    default_slots,
    pipe_slots,
    resolve_slots,
    tree_pipe_slots,
    tree_senders,
)
from homagg.cost import as_cost
from homagg.errors import InvalidArgument, OutOfRange, PeerTimeout, error_class, error_for
from homagg.errors import WorkerError

# The codec options, named as in homagg.codec.Params ("block" is an alias).
# frames an aggregator's receive ring holds: the W x S of its jobs together
AGG_RX_RING = _b.AGG_RX_RING
_CODEC_OPTIONS = (
    "block_elements",
    "block",
    "stochastic",
    "seed",
    "nc_levels",
    "sketch_cells_per_candidate",
)


class Result:
    """The outcome of one allreduce of one job.

    ``sum``: the reduced tensor (float32), identical on every worker;
    ``outputs``: every worker's output; ``stats``: ``workers`` (a dict per
    worker), ``engine`` (the engine's counter table), ``virtual_time``
    (seconds of virtual time the run took), ``method`` (auto's choice).
    """

    def __init__(self, outputs, stats):
        self.outputs = outputs
        self.sum = outputs[0]
        self.stats = stats

    def __repr__(self):
        return (
            f"Result(n={self.sum.size}, method={self.stats['method']}, "
            f"virtual_time={self.stats['virtual_time']:.6f}s)"
        )


def _params(
    workers,
    block_elements=None,
    block=None,
    stochastic=False,
    seed=0,
    nc_levels=0,
    sketch_cells_per_candidate=0.0,
    cost=None,
):
    if block_elements is None:
        block_elements = DEFAULT_BLOCK if block is None else block
    return _b.params(
        block=int(block_elements),
        workers=workers,
        worker=0,
        flags=F_STOCHASTIC if stochastic else 0,
        seed=int(seed) & (2**64 - 1),
        nc_levels=int(nc_levels),
        sketch_cells_per_candidate=float(sketch_cells_per_candidate),
        cost=as_cost(cost).fields(),
    )


def _ring_slots(slots, pipe_max, tree=False):
    """The slots a job's frames in flight are counted by in the ring
    check: S, or a flat job's workers' pipe cap below it (docs/PROTOCOL.md
    "Slots beyond the ring's share, in the NIC model"); a tree counts its
    whole S ("A tree's full window": its leaves send up without a pipe)."""
    return min(slots, pipe_max) if pipe_max and not tree else slots


class Job:
    """One job of a cluster: W workers with their own token and slots."""

    def __init__(
        self, cluster, index, workers, slots, secret=None, mac=None, cost=None, pipe_max=0
    ):
        self.cluster = cluster
        self.mac = mac  # its MAC algorithm code when it authenticates
        self.cost = as_cost(cost)  # the job's cost model (homagg.cost)
        self.index = index
        self.workers = workers
        self.slots = slots
        # the workers' pipe cap (0: S; docs/PROTOCOL.md "Slots beyond the
        # ring's share, in the NIC model") and the slots its frames in
        # flight are counted by
        self.pipe_max = pipe_max
        self.ring_slots = _ring_slots(slots, pipe_max, bool(cluster.leaves))
        self.secret = secret  # the job secret when it authenticates, else None
        self.epoch = 0  # its key epoch (Cluster.rotate_key)
        self.wire_id, self.token = _b.sim_job_wire(cluster._sim, index)

    def key(self, key_id):
        """Key ``key_id`` (a worker id or homagg.auth.AGGREGATOR) of the job."""
        if self.secret is None:
            raise InvalidArgument("the job does not authenticate (Cluster(auth=True))")
        return auth.derive_key(self.secret, self.wire_id, key_id)

    def allreduce(self, grads, method="lhc", **options):
        return self.cluster.allreduce_many([(self, grads, method, options)])[0]

    def kill_worker(self, worker, after_packets=0):
        """Worker stops once it sent after_packets more frames."""
        _b.sim_kill_worker(self.cluster._sim, self.index, worker, after_packets)

    def delay_start(self, worker, seconds):
        """Worker starts every later allreduce ``seconds`` of virtual time
        late (0: on time): a straggler, a rank still computing."""
        if not 0 <= worker < self.workers:
            raise InvalidArgument(f"worker {worker} not in 0..{self.workers - 1}")
        if not 0 <= seconds <= 60:
            raise InvalidArgument(f"start delay must be 0..60 s, got {seconds}")
        _b.sim_delay_start(self.cluster._sim, self.index, worker, int(seconds * 1e9))

    def worker_stats(self, worker):
        return _b.sim_worker_stats(self.cluster._sim, self.index, worker)

    def worker_aggregator_stats(self, worker, k):
        """What worker exchanged with aggregator k (packets, bytes, RTO)."""
        return _b.sim_worker_agg_stats(self.cluster._sim, self.index, worker, k)


# The numeric arguments of Cluster checked before anything is built:
# name -> (integer, low, high, low excluded, what a good value looks like).
_CONFIG = {
    "workers": (True, 1, 256, False, "workers=4"),
    "slots": (True, 1, 65536, False, "slots=64"),
    "payload": (True, 4, 8192, False, "payload=1024 (a multiple of 4)"),
    "link_gbps": (False, 0.0, 1e4, False, "link_gbps=100 (0: unlimited)"),
    "agg_link_gbps": (False, 0.0, 1e4, False, "agg_link_gbps=400 (0: unlimited)"),
    "timeout": (False, 0.0, 1e6, True, "timeout=2.0"),
    "rto": (False, 0.0, 60.0, True, "rto=200e-6"),
    "delay": (False, 0.0, 60.0, False, "delay=1e-6"),
    "max_time": (False, 0.0, 1e6, True, "max_time=600"),
    "pipe_gain": (False, 0.0, 10.0, False, "pipe_gain=2.0 (0: no bound but the slots)"),
    "start_wait": (False, 0.0, 1e6, True, "start_wait=200e-6"),
    "granularity": (False, 0.0, 60.0, True, "granularity=5e-6"),
}

# The floors of the model's workers' timers with the pipe's bound
# (docs/PROTOCOL.md Part 3, "The NIC model's timers"): an exact clock and
# no scheduler, so a few round trips of a 100 Gbit/s path.
NIC_RTO_DEFAULT = 200e-6  # the initial timeout without the bound
NIC_GRANULARITY = 5e-6
NIC_RTO_MIN = 20e-6
NIC_START_WAIT = 20e-6
# Bytes a frame adds to its payload on the wire, an upper bound (Ethernet,
# IP, UDP and HomAgg headers, a MAC, preamble and gap): "The NIC model's
# first timeout".
NIC_FRAME_EXTRA = 128


def first_rto(
    workers,
    payload,
    link_gbps,
    agg_link_gbps,
    delay,
    leaves=0,
    rto_min=NIC_RTO_MIN,
    multicast=True,
    aggregators=1,
):
    """The model's timeout before a job's first result with the pipe's
    bound (docs/PROTOCOL.md Part 3, "The NIC model's first timeout"):
    ``max(rto_min, 1.5 R0)``, R0 the round trip of a first chunk on empty
    links: at each level of n inputs (a tree: the leaf's W / leaves
    workers, then the root's leaves), ``4 d + (K + 1) F / L + (n + m) F /
    A``, the K - 1 chunks for other aggregators ahead on a worker's link
    (K = 1 in a tree), the n frames queued at the aggregator's link and m
    result copies on its way back (1 by multicast, n unicast; a root
    sends one per leaf)."""
    bits = (payload + NIC_FRAME_EXTRA) * 8.0

    def per(gbps):
        return bits / (gbps * 1e9) if gbps > 0 else 0.0

    if leaves:
        levels = [
            (-(-workers // leaves), link_gbps, multicast, 1),
            (leaves, agg_link_gbps, False, 1),
        ]
    else:
        levels = [(workers, link_gbps, multicast, aggregators)]
    r0 = sum(
        4 * delay + (k + 1) * per(up) + (n + (1 if mc else n)) * per(agg_link_gbps)
        for n, up, mc, k in levels
    )
    return max(rto_min, 1.5 * r0)


def default_pipe_gain(leaves=0):
    """The gain g of the workers' pipe when the user sets none
    (docs/PROTOCOL.md Part 3, "The pipe"): 2, or 3 in a tree (leaves > 0),
    where a result also waits for the slowest leaf, a wait the bound cannot
    shorten: with g = 2 it held the loss-free allreduce of W = 64 over 4
    leaves at 100 Gbit/s 25 % longer."""
    return 3.0 if leaves else 2.0


def _check_config(**values):
    """InvalidArgument naming the first argument of values outside _CONFIG's
    range (None: the default, not checked)."""
    for name, v in values.items():
        if v is None:
            continue
        integer, lo, hi, lo_open, example = _CONFIG[name]
        kind = numbers.Integral if integer else numbers.Real
        ok = (
            isinstance(v, kind)
            and not isinstance(v, bool)
            and math.isfinite(v)
            and lo <= v <= hi
            and not (lo_open and v == lo)
            and not (name == "payload" and v % 4)
        )
        if not ok:
            rng = (
                f"{'an integer' if integer else 'a number'} {'>' if lo_open else '>='} {lo:g}"
                f" and <= {hi:g}"
            )
            raise InvalidArgument(f"{name} must be {rng}, got {v!r}; e.g. {example}", -errno.EINVAL)


class Cluster:
    """A simulated cluster: ``aggregators`` aggregator engines (K, each
    with its own link; every job is spread over all of them), one job of
    ``workers`` workers to start with, every link with the same faults.

    loss, duplicate, reorder: per-frame probabilities on every worker link
    hop; delay: one-way link delay (s); link_gbps: line rate of each
    worker's link (0 = unlimited); agg_link_gbps: line rate of each
    aggregator's link -- None (default) gives it the workers' aggregate,
    ``min(workers * link_gbps, max(400, link_gbps))`` (a switch or
    aggregator port is faster than one worker's link; at most 400 Gbit/s,
    one fast port), 0 unlimited, a number that rate (equal to link_gbps
    makes the aggregator's link the bottleneck, W times over);
    slots: S of each job (None: ``homagg.protocol.default_slots(workers,
    pipe=pipe_gain > 0)``, W x S within the aggregators' receive ring: as
    ``Worker`` and ``homagg run`` choose it without the pipe's bound, and
    with it up to 256 within half the ring, 256 at W = 4, and beyond
    W = 128 in a flat job 32 with the pipe capped at half the ring
    (``homagg.protocol.pipe_slots``); in a tree of L
    leaves the same of the most senders an aggregator hears,
    max(ceil(W / L), L), and with the pipe's bound where that is below 256
    and 256 fit the ring, 256 with the workers' pipe capped at half a
    leaf's ring (``homagg.protocol.tree_pipe_slots``: 256, cap 128 at W =
    64 over 4 leaves to 256 over 16); a job added later gets at most what
    the ring has left); timeout: the give-up deadline per chunk (s);
    rto: the initial retransmission timeout (s), used until the first RTT
    sample (None: with the pipe's bound 1.5 times a first chunk's round
    trip on the model's empty links, at least rto_min, ``first_rto``;
    200 us without); rto_min, rto_max: clamps of the adaptive timeout (s; rto_min
    None = 20 us with the pipe's bound, the client's default without);
    start_wait: the least wait for a step's first result before a start
    probe (s; docs/PROTOCOL.md Part 3, "Step start"; None = 20 us with the
    pipe's bound, the client's 4 rto without: the model's workers start a
    step together unless ``delay_start`` makes one late; without the bound
    the earlier probes fed the stall floor, 27 ms at W = 64 over 4
    aggregators at 100 Gbit/s and 1 % loss); granularity: G of the
    workers' timeouts and turns (s; None = 5 us with the pipe's bound, the
    client's 50 us without).  With the bound the model's workers, whose
    clock is exact and who never lose a core, take these short floors
    (PROTOCOL.md Part 3, "The NIC model's timers"): at 100 Gbit/s the
    client's, made for a host's scheduler, were a quarter to a half of a
    0.375 ms allreduce per lost frame only a timer finds;
    max_time: the virtual-time budget of one run (s); multicast: results by multicast (else unicast); payload: the
    job's payload bytes per packet (1024; up to 8192); mtu: the MTU of every
    NIC port (None: 1500, or what the payload needs; 9000: jumbo frames), a
    payload whose frames do not fit it is refused with the limit named.
    auth: every job authenticates its frames (per-worker MACs,
    docs/PROTOCOL.md "Authentication"; the job secret is ``job.secret``).
    leaves: L > 0 runs every job over a tree of L leaves and a root
    (``aggregators`` is then L + 1: leaves 0..L-1, the root L; each job
    needs at least L workers; trees do not authenticate); up_rto: the
    leaves' upward retransmission timeout (s; None: the engine's 1 ms);
    up_give_up: when a leaf stops resending a partial sum (s; None: the
    engine's 10 s).
    pipeline_groups: block groups of every method (docs/PROTOCOL.md
    "Pipelined block groups"; auto chooses per group): 0 automatic, 1 not
    pipelined, N groups.
    worker_tx_ring: tx descriptors of every worker's NIC port (None: 4096);
    a small ring refuses a burst's tail, as a full socket send buffer does.
    cost: the jobs' cost model (homagg.cost.Cost or its dict; None: no link
    rate, every choice by bytes), registered with each job like its
    block groups: every worker of the job decides with it.
    pipe_gain: g of every worker's pipe (docs/PROTOCOL.md Part 3, "The
    pipe"): a worker's first transmissions wait while its chunks in the
    network's queues at an aggregator reach a bound that settles where the
    round trip is g times its least, so that repairs do not cross a queue
    of the whole window; 0 = no bound but the slots (what a worker on
    kernel UDP does).  None (default): ``default_pipe_gain(leaves)``, 2
    flat and 3 in a tree.
    """

    def __init__(
        self,
        workers=4,
        loss=0.0,
        duplicate=0.0,
        reorder=0.0,
        seed=0,
        slots=None,
        link_gbps=100.0,
        timeout=2.0,
        rto=None,
        rto_max=50e-3,
        delay=1e-6,
        payload=1024,
        multicast=True,
        max_time=600.0,
        agg_link_gbps=None,
        rto_min=None,
        start_wait=None,
        granularity=None,
        aggregators=1,
        mtu=None,
        auth=False,
        leaves=0,
        up_rto=None,
        up_give_up=None,
        mac=None,
        pipeline_groups=PIPELINE_GROUPS,
        worker_tx_ring=None,
        cost=None,
        pipe_gain=None,
    ):
        if pipe_gain is None:
            pipe_gain = default_pipe_gain(leaves)
        _check_config(
            workers=workers,
            slots=slots,
            payload=payload,
            link_gbps=link_gbps,
            agg_link_gbps=agg_link_gbps,
            timeout=timeout,
            rto=rto,
            delay=delay,
            max_time=max_time,
            pipe_gain=pipe_gain,
            start_wait=start_wait,
            granularity=granularity,
        )
        leaves = int(leaves or 0)
        self.cost = as_cost(cost)
        if leaves:
            if aggregators != 1:
                raise InvalidArgument(
                    f"a tree has one root: leaves={leaves} needs aggregators=1, got {aggregators}"
                )
            if workers < leaves:
                raise InvalidArgument(
                    f"leaves={leaves} needs at least as many workers, got workers={workers}"
                )
        if mtu is not None:
            from homagg.worker import FRAME_OVERHEAD, max_payload

            if not 576 <= int(mtu) <= 9000:
                raise InvalidArgument(f"mtu must be 576..9000, got {mtu}")
            if payload > max_payload(mtu):
                raise InvalidArgument(
                    f"payload {payload} bytes does not fit MTU {mtu}: at most "
                    f"{max_payload(mtu)} bytes (a {payload}-byte payload needs MTU >= "
                    f"{payload + FRAME_OVERHEAD}, e.g. mtu=9000)"
                )
        if agg_link_gbps is None:
            agg_link_gbps = (
                min(workers * link_gbps, max(400.0, link_gbps)) if link_gbps > 0 else 0.0
            )
        elif agg_link_gbps == 0:
            agg_link_gbps = 1e9  # the C side reads 0 as "same as link_gbps"
        self.agg_link_gbps = float(agg_link_gbps)
        self._sim = _b.sim_create(
            loss=float(loss),
            duplicate=float(duplicate),
            reorder=float(reorder),
            delay_ns=int(delay * 1e9),
            link_gbps=float(link_gbps),
            seed=seed,
            payload_bytes=payload,
            unicast_results=not multicast,
            agg_link_gbps=self.agg_link_gbps,
            aggregators=int(aggregators),
            pool_frames=self._pool_frames(
                workers,
                resolve_slots(slots, workers, pipe=pipe_gain > 0),
                leaves + 1 if leaves else aggregators,
                payload,
                mtu,
            ),
            mtu=int(mtu or 0),
            leaves=leaves,
            up_rto_ns=int((up_rto or 0) * 1e9),
            up_give_up_ns=int((up_give_up or 0) * 1e9),
            worker_tx_ring=int(worker_tx_ring or 0),
        )
        self.leaves = leaves
        self.aggregators = leaves + 1 if leaves else int(aggregators)
        self._timeout = timeout
        piped = float(pipe_gain) > 0
        self._piped = piped
        self._rto = rto  # None: first_rto() of each job with the bound, else 200 us
        self._path = (payload, float(link_gbps), self.agg_link_gbps, float(delay), bool(multicast))
        if rto_min is None:
            rto_min = NIC_RTO_MIN if piped else 0.0  # 0: the client's default
        if granularity is None:
            granularity = NIC_GRANULARITY if piped else 0.0
        for name, v, example in (
            ("rto_min", rto_min, NIC_RTO_MIN),
            ("granularity", granularity, NIC_GRANULARITY),
        ):
            if v > rto_max:
                raise InvalidArgument(
                    f"{name} must be at most rto_max ({rto_max:g} s), got {v!r};"
                    f" e.g. {name}={example:g}",
                    -errno.EINVAL,
                )
        self._rto_min = rto_min
        self.granularity = float(granularity)
        self._rto_max = rto_max
        self._slots = slots
        self._seed = seed
        self.auth = bool(auth)
        self.mac = mac  # the jobs' MAC algorithm name (None: this host's default)
        self.pipeline_groups = check_pipeline_groups(pipeline_groups)
        self.pipe_gain = float(pipe_gain)
        if start_wait is None:
            start_wait = NIC_START_WAIT if piped else 4 * (rto or NIC_RTO_DEFAULT)
        self.start_wait = float(start_wait)
        self.max_time = max_time
        self.jobs = []
        self.job = self.add_job(workers)

    def job_rto(self, workers):
        """The initial retransmission timeout (s) of a job of ``workers``
        workers: the cluster's ``rto``, or with the pipe's bound the path's
        (``first_rto``), else 200 us."""
        if self._rto is not None:
            return self._rto
        if not self._piped:
            return NIC_RTO_DEFAULT
        payload, link, agg, delay, mc = self._path
        return first_rto(
            workers, payload, link, agg, delay, self.leaves, self._rto_min, mc, self.aggregators
        )

    @staticmethod
    def _pool_frames(workers, slots, aggregators, payload, mtu):
        """Fabric buffers for the first job's worst case: every worker's
        window full at every aggregator, each request and each result copy
        (multicast: one per worker) holding a buffer; at least 65536 (the
        fabric's default), at most 512 MB of buffers."""
        frame = max(int(mtu or 0), 1500, payload + 100) + 64
        return max(65536, min((512 << 20) // frame, 2 * workers * slots * aggregators + 8192))

    # ---- lifecycle -------------------------------------------------------
    def close(self):
        if self._sim is not None:
            _b.sim_destroy(self._sim)
            self._sim = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _live(self):
        if self._sim is None:
            raise InvalidArgument("the cluster is closed")
        return self._sim

    # ---- jobs ------------------------------------------------------------
    def add_job(
        self,
        workers,
        slots=None,
        timeout=None,
        auth=None,
        pipeline_groups=None,
        mac=None,
        cost=None,
    ):
        """A new job on the aggregators; ``auth`` (default: the cluster's)
        gives it a job secret, drawn from the seed so runs repeat, and the
        MAC algorithm ``mac`` ('umac', 'aes-gmac', 'blake2b'; None: this host's
        default); ``pipeline_groups`` (default: the cluster's) its block groups;
        ``cost`` (default: the cluster's) its cost model."""
        s = self._live()
        pipeline_groups = check_pipeline_groups(
            self.pipeline_groups if pipeline_groups is None else pipeline_groups
        )
        slots = self._slots if slots is None else slots
        pipe_max = 0
        if slots is None or slots == 0:
            slots, pipe_max = self._default_slots(s, workers)
        timeout = self._timeout if timeout is None else timeout
        auth = self.auth if auth is None else auth
        mac = self.mac if mac is None else mac
        secret = (
            np.random.default_rng([self._seed, len(self.jobs), 0xA07]).bytes(32) if auth else None
        )
        mac_alg = _auth.mac_code(mac) if auth else 0
        self._check_rings(s, workers, _ring_slots(slots, pipe_max, bool(self.leaves)))
        idx = _b.sim_add_job(
            s,
            workers,
            slots=slots,
            rto_ns=int(self.job_rto(workers) * 1e9),
            rto_max_ns=int(self._rto_max * 1e9),
            give_up_ns=int(timeout * 1e9),
            rto_min_ns=int(self._rto_min * 1e9),
            start_wait_ns=int(self.start_wait * 1e9),
            rto_granularity_ns=int(self.granularity * 1e9),
            secret=secret,
            pipeline_groups=pipeline_groups,
            mac=mac_alg,
            pipe_gain_pct=round(self.pipe_gain * 100),
            pipe_max=pipe_max,
        )
        job = Job(
            self,
            idx,
            workers,
            slots,
            secret,
            mac_alg or None,
            self.cost if cost is None else cost,
            pipe_max=pipe_max,
        )
        self.jobs.append(job)
        return job

    def _default_slots(self, s, workers):
        """(S, pipe_max) of a job whose slots the user does not set.

        A flat job whose workers bound their pipe: pipe_slots(W), 32 slots
        with the pipe capped at half the ring beyond W = 128
        (docs/PROTOCOL.md "Slots beyond the ring's share, in the NIC
        model"), while the jobs already on the aggregators leave room for
        the cap's frames.  A tree whose workers bound their pipe:
        tree_pipe_slots(W, L), 256 slots with the workers' pipe capped at
        half a leaf's ring where its aggregators hear 9 to 16 senders ("A
        tree's full window, in the NIC model"), while the jobs already on
        them leave room for the whole window.  Otherwise default_slots of the most senders an
        aggregator hears (W, or in a tree max(ceil(W / L), L): "A tree's
        slots in the NIC model") and no cap, or fewer slots when the jobs
        already on the aggregators hold part of their rings (at least 1: a
        full ring is then refused by _check_rings, naming the jobs holding
        it)."""
        pipe = self.pipe_gain > 0
        senders = tree_senders(workers, self.leaves)
        if not pipe:
            slots, cap = 0, 0
        elif self.leaves:
            slots, cap = tree_pipe_slots(workers, self.leaves)
        else:
            slots, cap = pipe_slots(workers)
        try:
            left = min(
                max(1, (AGG_RX_RING - held) // per_slot)
                for per_slot, held in (
                    _b.sim_agg_frames(s, k, workers, 1) for k in range(self.aggregators)
                )
            )
        except InvalidArgument:  # W out of range: sim_add_job names it
            return (slots, cap) if cap else (default_slots(senders, pipe=pipe), 0)
        if cap and _ring_slots(slots, cap, bool(self.leaves)) <= left:
            return slots, cap
        return min(default_slots(senders, pipe=pipe), left), 0

    def _check_rings(self, s, workers, slots):
        """Explain what hg_sim_add_job refuses with -ERANGE: a job whose frames
        in flight, alone or with those of the jobs already added, exceed an
        aggregator's receive ring (docs/PROTOCOL.md Part 2, "Frames in
        flight").  The message names the figures, the jobs holding the ring
        and the fix."""
        try:
            per_slot, held = _b.sim_agg_frames(s, 0, workers, 1)
        except InvalidArgument:
            return  # W out of range: sim_add_job names it
        ring = AGG_RX_RING
        for k in range(self.aggregators):
            per_slot, held = _b.sim_agg_frames(s, k, workers, 1)
            frames = _b.sim_agg_frames(s, k, workers, slots or 0)[0]
            if held + frames <= ring:
                continue
            fit = (ring - held) // per_slot
            fix = (
                f"use at most {fit} slots" if fit else "no slot is left"
            ) + ", or a cluster of its own for this job"
            head = (
                f"field 'slots': {workers} workers x {frames // per_slot} slots = "
                f"{frames} frames in flight towards aggregator {k}"
            )
            if not held:
                raise OutOfRange(f"{head} exceed its receive ring of {ring} frames: {fix}")
            jobs = ", ".join(
                f"job {j.index}: {_b.sim_agg_frames(s, k, j.workers, j.ring_slots or 0)[0]}"
                for j in self.jobs
            )
            raise OutOfRange(
                f"{head}, with the {held} held by the jobs already on it ({jobs}), "
                f"make {held + frames} frames, more than its receive ring of "
                f"{ring} frames: {fix}"
            )

    @property
    def workers(self):
        return self.job.workers

    def allreduce(self, grads, method="lhc", **options):
        """Allreduce of the first job: grads is a sequence of W arrays."""
        return self.job.allreduce(grads, method, **options)

    def allreduce_many(self, items):
        """Run several jobs' allreduces interleaved in one event loop.

        items: (job, grads, method) or (job, grads, method, options) tuples,
        at most one per job.  Returns one Result per item; raises the first
        failing job's error (PeerTimeout names the missing worker).
        """
        s = self._live()
        started = []
        seen = set()
        for item in items:
            job, grads, method = item[:3]
            options = item[3] if len(item) > 3 else {}
            if job.index in seen:
                raise InvalidArgument("one allreduce per job at a time")
            seen.add(job.index)
            unknown = set(options) - set(_CODEC_OPTIONS)
            if unknown:
                raise InvalidArgument(f"unknown codec options: {sorted(unknown)}")
            code = protocol.method(method).code
            if len(grads) != job.workers:
                raise InvalidArgument(f"job has {job.workers} workers, got {len(grads)} gradients")
            for w, g in enumerate(grads):  # as homagg.codec refuses them: no silent rounding
                if not isinstance(g, np.ndarray) or g.dtype != np.float32:
                    got = g.dtype.str if isinstance(g, np.ndarray) else type(g).__name__
                    raise InvalidArgument(
                        f"worker {w}: grads[{w}]: expected a float32 numpy "
                        f"array, got {got} (convert with "
                        f".astype(np.float32))"
                    )
            xs = [np.ascontiguousarray(g).reshape(-1) for g in grads]
            ys = [np.empty_like(x) for x in xs]
            p = _params(job.workers, cost=job.cost, **options)
            keep = _b.sim_start(s, job.index, code, p, xs, ys)
            started.append((job, xs, ys, keep))

        t0 = _b.sim_stats(s)["now_ns"]
        rc = _b.sim_run(s, int(self.max_time * 1e9))
        t1 = _b.sim_stats(s)["now_ns"]
        engine = self.engine_counters()
        fabric = _b.sim_fabric_counters(s)
        results = []
        errors = []
        for job, xs, ys, _keep in started:
            per = []
            failures = []
            for w in range(job.workers):
                st = _b.sim_worker_stats(s, job.index, w)
                per.append(st)
                status = _b.sim_worker_status(s, job.index, w)
                if status < 0:
                    failures.append((w, status, _b.sim_worker_error(s, job.index, w)))
                elif status == 0:
                    failures.append(
                        (
                            w,
                            -errno.ETIMEDOUT,
                            f"not finished after {self.max_time} s of virtual time",
                        )
                    )
            stats = {
                "workers": per,
                "engine": engine,
                "fabric": fabric,
                "virtual_time": (t1 - t0) / 1e9,
                "method": protocol.method_name(per[0]["method_chosen"]),
            }
            if failures:
                errors.append(self._group_error(job, failures, stats))
                results.append(None)
                continue
            results.append(Result(ys, stats))
        if errors:
            raise errors[0]
        if rc < 0:  # pragma: no cover - every worker finished, so rc is 0
            raise error_for(rc, "simulated cluster")
        return results

    @staticmethod
    def _group_error(job, failures, stats):
        text = "; ".join(f"job {job.index} worker {w}: {msg}" for w, _rc, msg in failures)
        timeouts = [rc for _w, rc, _m in failures if rc == -errno.ETIMEDOUT]
        code = timeouts[0] if timeouts else failures[0][1]
        cls = PeerTimeout if timeouts else error_class(code)
        exc = cls(text, code)
        exc.failures = [WorkerError(msg, rc) for w, rc, msg in failures]
        for (w, _rc, _m), e in zip(failures, exc.failures):
            e.worker = w
        exc.stats = stats
        return exc

    # ---- engine and fabric -----------------------------------------------
    def engine_counters(self):
        """The engine's counter table as a dict (name -> count)."""
        return _b.sim_engine_counters(self._live())

    def aggregator_counters(self, k):
        """Aggregator k's counters: ``{"engine": {...}, "link": {...}}`` (its
        engine's counter table and its NIC port's: rx_bytes is the load of
        its link towards it, tx_bytes from it)."""
        engine, link = _b.sim_aggregator_counters(self._live(), k)
        return {"engine": engine, "link": link}

    def rotate_key(self, secret, grace, job=None):
        """The next key epoch of ``job`` (default: the first) with
        ``secret``: its workers get it first, then its aggregators, whose
        grace period for the previous epoch is ``grace`` seconds of virtual
        time (docs/PROTOCOL.md "Key epochs").  In a tree ``secret`` is the
        root's: every level rotates in the order of "Key epochs in a tree",
        each leaf's next secret derived from it.  Returns the epoch."""
        job = job or self.job
        epoch = _b.sim_rotate_key(self._live(), job.index, secret, int(grace * 1e9))
        job.secret, job.epoch = bytes(secret), epoch
        return epoch

    def kill_aggregator(self, k, after=0.0):
        """Aggregator k dies ``after`` seconds of virtual time from now (0:
        now): it is not polled again and its port discards what arrives."""
        if not 0 <= k < self.aggregators:
            raise InvalidArgument(f"aggregator {k} not in 0..{self.aggregators - 1}")
        _b.sim_kill_aggregator(self._live(), k, int(after * 1e9))

    def inject(self, frame):
        """Send a raw Ethernet frame to the aggregator from an extra port."""
        _b.sim_inject(self._live(), frame)

    def build_frame(self, for_job=None, payload=b"", key=None, alg=None, counter=1, **fields):
        """A well-formed frame to the aggregator from the attacker port with
        any header fields (version, op, flags, job, token, worker, slot, seq,
        lanes, exp, shard, incarnation, nonce); job id and token default
        to those of for_job (default: the first job), lanes to the payload's
        int32 lanes, the incarnation to the workers' (HG_SIM_INCARNATION).
        ``key``: MAC the frame with it (Job.key), algorithm ``alg`` (None:
        the job's), MAC counter ``counter``."""
        job = for_job or self.job
        hdr = {
            "version": PROTOCOL_VERSION,
            "op": OP_SUM32,
            "job": job.wire_id,
            "token": job.token,
            "lanes": len(payload) // 4,
            "incarnation": _b.INCARNATION,
        }
        hdr.update(fields)
        if alg is None:
            alg = job.mac
        return _b.sim_build_frame(self._live(), hdr, payload, key, alg, counter)

    def restart_aggregator(self, k=0, after_frames=0, incarnation=0):
        """Aggregator k restarts (every job's state there lost, a new
        incarnation: ``incarnation`` or the previous one + 1) once it has
        received ``after_frames`` more frames.  Workers in the middle of an
        allreduce then fail with PeerRestarted naming it and both
        incarnations."""
        if not 0 <= k < self.aggregators:
            raise InvalidArgument(f"aggregator {k} not in 0..{self.aggregators - 1}")
        _b.sim_restart_aggregator(self._live(), k, after_frames, incarnation)

    def delay_start(self, worker, seconds, job=None):
        """Worker starts every later allreduce ``seconds`` late (Job.delay_start)."""
        (job or self.job).delay_start(worker, seconds)

    def kill_worker(self, worker, after_packets=0, job=None):
        (job or self.job).kill_worker(worker, after_packets)

    def fabric_counters(self):
        """The NIC fabric's counters as a dict (frames lost, duplicated, ...)."""
        return _b.sim_fabric_counters(self._live())

    def stats(self):
        """Event-loop statistics: virtual time, rounds, frames sent/delivered."""
        return _b.sim_stats(self._live())
