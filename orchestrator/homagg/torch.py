"""PyTorch DDP communication hook: gradients summed by HomAgg.

One line in a torch.distributed program (any backend for rendezvous; Gloo
is enough)::

    import homagg.torch
    model = torch.nn.parallel.DistributedDataParallel(model)
    model.register_comm_hook(homagg.torch.HookState(), homagg.torch.allreduce_hook)

Every gradient bucket DDP hands to the hook goes through a HomAgg
``homagg.worker.Worker`` on the hook's background thread (the C call
runs without the GIL), buckets in order, and the hook returns a
``torch.futures.Future`` completed from that thread, so DDP overlaps communication with the rest of
the backward pass.  The bucket's average is the exact fixed-point sum
(docs/PROTOCOL.md) divided by the world size in float32 (by the decoder,
block by block): bit-identical on every rank.  float16 / bfloat16 buckets
are reduced in float32 and cast back.  Inside DDP's backward pass (and
without a recorder) a bucket's result is written into the array of its
previous call, which DDP has copied into the gradients: the hook keeps one
float32 array per bucket, as large as DDP's bucket.

Options of ``HookState``:

- ``method``: "auto" (default: per bucket, the exact method with the fewest
  bytes, decided on exact counts) or any of homagg.protocol.METHODS;
  "nc" is natural compression (lossy, unbiased).
- ``sparsify``: ``TopK(fraction)`` or ``Threshold(value)`` keeps only the
  largest entries of each bucket, with error feedback: what a rank did not
  send is kept per parameter and added to its next gradient (as PowerSGD's
  hook keeps its error dict).  Off by default.

Configuration (the torchrun way): rank and world size come from
torch.distributed (the hook's process group); the job from the environment,
each variable overriding the same field of the job file::

    HOMAGG_JOB_FILE   JSON written by `homagg testbed up`, `homagg up -i` or
                      `homagg train` (fields below, lower case)
    HOMAGG_AGGREGATOR ip[:port] of the aggregator (homagg-switch), port 48879;
                      a job spread over K aggregators names them all, comma
                      separated, in shard order: ip[:port],ip[:port],...
    HOMAGG_JOB, HOMAGG_TOKEN  the job registered on the aggregator(s)
    HOMAGG_WORKERS    the job's worker count: must equal the world size (optional)
    HOMAGG_GROUP      multicast group of the results (optional)
    HOMAGG_BIND       this rank's local address (default: any)
    HOMAGG_TIMEOUT    seconds without progress before an allreduce fails (10)
    HOMAGG_SLOTS, HOMAGG_PAYLOAD  the job's slots and payload bytes (64, 1024)
    HOMAGG_METRICS_PORT  serve this rank's allreduce statistics to Prometheus
                      on this port + LOCAL_RANK (homagg.ops.worker_metrics,
                      docs/OPERATIONS.md); HOMAGG_METRICS_BIND its address

A missing aggregator is an error naming the variable to set.  An
authenticated job's file names its secret file (``auth_file``, ``mac``,
``key_epoch``); a HookState made from the job file checks it (a stat)
before each bucket on the hook's thread and gives its worker a new key
epoch written there (``homagg rotate-key``, docs/SECURITY.md "Rotating
keys").

Surviving the aggregator (``fallback=True``, the default, when
torch.distributed is initialised): a bucket whose HomAgg allreduce fails on
any rank (aggregator dead or restarted, job gone, timeout) is reduced with
the process group's own allreduce (a Gloo group the hook creates, the
float32 sum / W) and training goes on.  The ranks agree per bucket over
that group, in bucket order, on the hook's thread:

1. a rank that is healthy tries HomAgg; then every rank contributes 0 (it
   succeeded) or 1 (it failed) to an allreduce MAX of one int32: 0 -> every
   rank keeps HomAgg's result; 1 -> every rank drops it and the bucket goes
   through the group's allreduce, so parameters stay identical even when
   one rank failed while the others succeeded;
2. after a failure the hook backs off (``backoff`` seconds, doubling per
   consecutive failure up to ``backoff_max``): each bucket first agrees, by
   the same MAX of one flag (1: "my back-off has not elapsed"), whether to
   try HomAgg again; until every rank's has elapsed the bucket goes through
   the group.  A retry makes a fresh HomAgg worker (a new incarnation) when
   the hook made its worker from the environment, so an aggregator
   restarted (and its job registered again) is used again without
   restarting training.

Every failure logs a warning (logger ``homagg.torch``) and counts in
``HookState.counters`` ("homagg_failures", "fallback_buckets", "retries");
each bucket's log entry says which path reduced it ("path": "homagg" or
"fallback").  The agreement costs one allreduce of 16 bytes per bucket
(the flag and, for ``measure``, HomAgg's time).
With ``fallback=False`` (or without torch.distributed) a failure is raised
by the backward pass: PeerTimeout naming the aggregator within
HOMAGG_TIMEOUT seconds.

Never slower than the baseline (``baseline=True``, the default, when
torch.distributed is initialised and the job registers a link rate, its
cost model: homagg.cost): before each bucket every rank predicts, from
inputs that are the same on every rank, the time of the process group's
own ring allreduce and an upper bound of HomAgg's method
(homagg.cost.choose_path: the bucket's element count, the world size, the
job's link rate, round trip and calibration, with the ring's CPU the
testbed's port calibration fitted when the job's cost carries it, and the
largest non-zero count of any rank).  When the group's is strictly smaller the bucket goes
through the group's allreduce (path "baseline", ``counters
["baseline_buckets"]``), started asynchronously and in place as DDP's own.
When no agreement of the count is due at this call, DDP's thread starts it
in the hook call itself, as DDP's own hook does (no hand-over to the hook's
thread; on a Gloo group of its own, so its order of collectives is DDP's
order of buckets); otherwise the hook's thread starts it after the
agreement, on a second Gloo group of the same ranks (so the agreements of
the next buckets do not wait behind it).  Neither path passes over the
bucket before its allreduce starts.  The non-zero count is agreed by an allreduce MAX
of one int64 over the hook's group, only for buckets whose choice depends
on it (homagg.cost.needs_density: dense's bound alone loses), on a
bucket's first call and every ``density_every``-th after (between those
the last agreed count decides: the same on every rank, and the sums are
exact whichever path); it travels with the fallback's back-off flag when
both are needed.  Exact methods
only (auto, dense, blocks, lhc, union); ``nc`` always runs HomAgg.  The
rule is docs/TRAINING.md's "Never slower than the baseline".

Measured, not only predicted (``measure=True``, the default): the model
can be wrong on a host (cores shared by the ranks and the aggregator, a
kernel packet path slower than calibrated), so the rule also compares what
each path really took for this bucket.  After a bucket's HomAgg allreduce
the fallback's agreement carries, in the same allreduce MAX (negated),
the shortest rank's time of it (whole microseconds): the last rank to
reach the bucket's, which waited for no peer, so the time is the path's
own and not the ranks' skew (which both paths pay alike); a rank's time of
the group's allreduce of the bucket (from its start to its result) is
agreed the same way (neither path's first run on a bucket is measured: a cold start) at the bucket's next call that runs on the hook's thread (the first
call after it when none is agreed yet, then every ``density_every``-th).
The choice then takes each path's agreed measured time where one younger
than ``remeasure`` calls of the bucket exists, and the model's prediction
otherwise: a bucket HomAgg made slower than the model's baseline
prediction goes to the group at its next call, is measured there, and the
two measured times decide from then on; once HomAgg's time has expired the
model decides again, so a HomAgg path that got faster is tried again.
Every input is agreed, so every rank takes the same path.  Without
``fallback`` there is no agreement after HomAgg and only the group's time
is measured.

Whole steps (``trial_calls``, off by default: 0; for example 3, with
``trial_every=128`` and ``trial_margin=2.0``, the defaults; docs/TRAINING.md
"Whole steps, where a bucket's time is not its cost"): a
bucket's time is not what its path costs the iteration when the ranks
share cores (HomAgg's CPU is taken from the other ranks' compute).  So a
bucket whose two times (measured or predicted) are within
``trial_margin`` of each other takes the other path than the rule's for
``trial_calls`` calls at scheduled calls (every ``trial_every``-th, the
buckets one after another); the hook compares the median step period
(between a bucket's hand-overs) after those calls with the one after the
``trial_calls`` calls of the rule's path before, agreed by one allreduce
MAX, and holds the path of the strictly shorter steps until the next
trial.  DDP's calls only (inside a backward pass).
"""

import concurrent.futures
import dataclasses
import inspect
import logging
import math
import threading
import time

import numpy as np
import torch

from homagg import cost as _cost
from homagg import protocol
from homagg.errors import InvalidArgument, PeerTimeout
from homagg.switch.job_file import JOB_FIELDS, UDP_PORT, write_job_file  # noqa: F401
from homagg.switch.job_file import ConfigError, job_config
from homagg.worker import Worker

# --------------------------------------------------------------------------
# Sparsifiers (error feedback lives in HookState)


@dataclasses.dataclass(frozen=True)
class TopK:
    """Keep the ceil(fraction * n) largest-magnitude entries of a bucket."""

    fraction: float

    def __post_init__(self):
        if not 0.0 < self.fraction <= 1.0:
            raise InvalidArgument(f"TopK fraction {self.fraction} not in (0, 1]")

    def mask(self, v):
        k = max(1, math.ceil(self.fraction * v.size))
        if k >= v.size:
            return np.ones(v.size, dtype=bool)
        keep = np.argpartition(np.abs(v), v.size - k)[v.size - k :]
        m = np.zeros(v.size, dtype=bool)
        m[keep] = True
        return m


@dataclasses.dataclass(frozen=True)
class Threshold:
    """Keep the entries with |value| >= value."""

    value: float

    def __post_init__(self):
        if not self.value >= 0.0:
            raise InvalidArgument(f"Threshold value {self.value} must be >= 0")

    def mask(self, v):
        return np.abs(v) >= self.value


# --------------------------------------------------------------------------
# The hook


@dataclasses.dataclass
class _Timing:
    """The measured times of one bucket (index and size), in seconds: the
    agreed ones (MIN over the ranks; the same on every rank) with the call
    that measured them, this rank's latest time of the group's allreduce,
    not agreed yet, and how often each path ran (a path's first run on a
    bucket is not measured: it pays the cold start of its connections and
    buffers)."""

    homagg: float | None = None
    homagg_at: int = 0
    baseline: float | None = None
    baseline_at: int = 0
    local: float | None = None
    homagg_runs: int = 0  # (the same on every rank: every rank runs the same paths)
    baseline_runs: int = 0
    # whole steps (HookState trial_calls): the latest calls' hand-over
    # times (call -> perf_counter) and paths (call -> path); the trial
    # under way (its first call, None: none; the path it tries and the
    # rule's, whose calls before it are its reference); a verdict's path
    # and the first call after its hold
    starts: dict = dataclasses.field(default_factory=dict)
    paths: dict = dataclasses.field(default_factory=dict)
    trial_from: int | None = None
    trial_path: str = "baseline"
    ref_path: str = "homagg"
    held_path: str = "homagg"
    held_until: int = 0


def _micros(seconds):
    """Seconds as whole microseconds (at least 1) for an agreement."""
    return max(1, int(seconds * 1e6))


class HookState:
    """What the hook keeps between calls: the HomAgg worker, the options,
    the error-feedback residuals and a per-bucket log.

    ``worker``: a homagg.worker.Worker to use (default: made from the
    environment, see the module doc, with rank = worker id and world size
    = workers of ``process_group``).  ``log`` collects one dict per bucket
    reduced (index, numel, nnz, method run, bytes sent, seconds); read it
    with ``take_log()``.  An entry is written after the bucket's result
    reached DDP (``take_log()`` waits for the buckets handed over), so
    neither it nor its non-zero count delays the result: "nnz" is the
    agreed count where one was agreed, else counted from the bucket's input
    after the hand-over, and None for a bucket the group summed in place
    (counting it first would cost a pass over the bucket before its
    allreduce could start).  ``recorder(bucket, x, y, params)``, when given,
    is called (on the hook's thread or, for a bucket the group summed, one
    of Gloo's, in the order DDP handed the buckets over) with each bucket's
    float32 input as summed (after sparsification), its averaged result and
    the bucket's parameters (their gradients lie in x in this order).  A log entry's
    "cpu_seconds" is the hook thread's CPU time for the bucket: HomAgg's
    codec and packet work (the client sleeps in ppoll while it waits), or
    the fallback's.  ``last_call`` is the perf_counter time of the latest
    bucket handed over; a log entry's "handed_over" and "done" are the
    perf_counter times (CLOCK_MONOTONIC: comparable between the ranks of
    one host) of the bucket's hand-over and of its result;
    "agree_seconds" the part of "seconds" spent in the ranks' agreements
    over the process group (the fallback's status, the count of the
    choice of path).  A recorder that takes a ``path`` keyword also gets
    "homagg", "baseline" or "fallback".

    ``fallback`` (default True), ``backoff`` and ``backoff_max`` (seconds):
    see "Surviving the aggregator" in the module doc.

    ``baseline`` (default True) and ``cost`` (a homagg.cost.Cost or its
    dict; default: the job's, the worker's ``cost``) and ``density_every``
    (default 16: calls of a bucket between agreements of its count): see
    "Never slower than the baseline" in the module doc.  A log entry's "path" is then
    "homagg", "baseline" or "fallback", and "predicted_homagg_seconds" /
    "predicted_baseline_seconds" carry the two predictions (None when the
    rule did not apply).  ``cost`` may be replaced between buckets (the
    same on every rank).

    ``measure`` (default True) and ``remeasure`` (default 128 calls): the
    rule replaces a prediction by the path's measured time, agreed over
    the ranks, where one younger than ``remeasure`` calls of the bucket
    exists ("Measured, not only predicted" in the module doc); a log
    entry's "measured_homagg_seconds" / "measured_baseline_seconds" are
    the times that decided (None: the prediction decided).

    ``trial_calls`` (default 0: none; for example 3), ``trial_every``
    (default 128 calls, at least 2 trial_calls + 2) and ``trial_margin``
    (default 2.0):
    trials of whole steps ("Whole steps" in the module doc); a log entry's
    "trial" is "trial" or "held" for the calls whose path they set (None
    otherwise) and "trial_step_seconds" a verdict: {"homagg", "baseline":
    the median step periods after each path's calls, "held": the path
    held}.

    ``paths`` (default None): a list, by hand-over number (a log entry's
    "seq"), of the path each bucket takes instead of the rule's choice:
    another run's log, to run it again the same way (``homagg train``
    times its phase without a recorder, then records a second one that
    takes the timed phase's paths).  A "homagg" that fails still falls
    back; None, or a number past the list, leaves the choice to the rule."""

    def __init__(
        self,
        worker=None,
        *,
        method="auto",
        sparsify=None,
        process_group=None,
        block=None,
        nc_levels=0,
        seed=0,
        recorder=None,
        env=None,
        fallback=True,
        backoff=1.0,
        backoff_max=60.0,
        baseline=True,
        cost=None,
        density_every=16,
        measure=True,
        remeasure=128,
        trial_calls=0,
        trial_every=128,
        trial_margin=2.0,
        paths=None,
    ):
        protocol.method(method)  # InvalidArgument naming the choices
        if sparsify is not None and not hasattr(sparsify, "mask"):
            raise InvalidArgument("sparsify must be homagg.torch.TopK(...) or Threshold(...)")
        if not 0 < backoff <= backoff_max:
            raise InvalidArgument(
                f"backoff {backoff} and backoff_max {backoff_max}: "
                "need 0 < backoff <= backoff_max (seconds)"
            )
        self.method = method
        self.sparsify = sparsify
        self.block = block
        self.nc_levels = nc_levels
        self.seed = seed
        self.recorder = recorder
        self.residuals = {}  # parameter -> float32 residual (error feedback)
        self.log = []
        self._log_lock = threading.Lock()
        self._pending = 0  # buckets handed over and not yet logged
        self._pending_cv = threading.Condition()
        self._rec_cv = threading.Condition()  # the recorder's order (_record)
        self._rec_next, self._rec_done = 0, set()
        self._calls = 0
        self.last_call = None
        self._recorder_path = recorder is not None and _takes_keyword(recorder, "path")
        self._make_worker = None
        self._env, self._job_file_seen = env, None  # _follow_job_file
        if worker is None:
            self._make_worker = lambda: self._worker_from_environment(process_group, env)
            worker = self._make_worker()
        self.worker = worker
        self.world_size = worker.workers
        self.backoff, self.backoff_max = float(backoff), float(backoff_max)
        self.counters = {
            "homagg_failures": 0,
            "fallback_buckets": 0,
            "retries": 0,
            "baseline_buckets": 0,
            "density_agreements": 0,
            "trial_calls": 0,
            "held_calls": 0,
            "trials": 0,
            "trials_to_group": 0,
            "trials_to_homagg": 0,
        }
        self.last_failure = None  # the latest HomAgg failure, as the warning says it
        self._failures = 0  # consecutive agreed failures
        self._retry_at = None  # monotonic time of the next HomAgg try; None: healthy
        self.cost = cost if cost is not None else getattr(worker, "cost", None)
        self._group = None
        self.fallback = self.baseline = False
        if int(density_every) < 1:
            raise InvalidArgument(f"density_every {density_every}: at least 1 (calls)")
        self.density_every = int(density_every)
        self._nnz_cache = {}  # (bucket index, size) -> (agreed count, calls since)
        if int(remeasure) < 1:
            raise InvalidArgument(f"remeasure {remeasure}: at least 1 (calls)")
        self.measure, self.remeasure = bool(measure), int(remeasure)
        if int(trial_calls) < 0 or (
            int(trial_calls) and int(trial_every) < 2 * int(trial_calls) + 2
        ):
            raise InvalidArgument(
                f"trial_calls {trial_calls} and trial_every {trial_every}: need "
                "trial_calls >= 0 (0: no trials) and trial_every >= 2 trial_calls + 2 "
                "(a trial's reference calls, its calls and its verdict fit between two)"
            )
        if not float(trial_margin) >= 1.0:
            raise InvalidArgument(f"trial_margin {trial_margin}: at least 1")
        self.trial_calls, self.trial_every = int(trial_calls), int(trial_every)
        self.trial_margin = float(trial_margin)
        if paths is not None:
            paths = list(paths)
            bad = [p for p in paths if p not in (None, "homagg", "baseline", "fallback")]
            if bad:
                raise InvalidArgument(
                    f"paths: {bad[0]!r} is not a path; each is 'homagg', 'baseline', "
                    "'fallback' or None (the rule decides)"
                )
        self.paths = paths
        self._calls_of = {}  # (bucket index, size) -> calls handed over
        self._timing = {}  # (bucket index, size) -> _Timing (measure=True)
        self._outputs = {}  # (bucket index, size) -> HomAgg's result array (_output)
        self._baseline_group = self._direct_group = None
        if fallback or baseline:
            self._group = _fallback_group(process_group)
            self.fallback = bool(fallback) and self._group is not None
            self.baseline = bool(baseline) and self._group is not None
        if self.baseline:
            # the buckets sent to the group run on a group of their own, so
            # the next bucket's agreement does not queue behind their data
            self._baseline_group = _fallback_group(process_group)
            # and those DDP's thread starts itself (HookState._direct): a
            # group of their own, so that its order of collectives is DDP's
            # order of buckets whatever the hook's thread does meanwhile
            self._direct_group = _fallback_group(process_group)
            import torch.distributed as dist

            self._baseline_backend = dist.get_backend(self._baseline_group)
        # one thread runs the buckets in order: HomAgg, the agreement, the fallback
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"homagg-hook{worker.worker}"
        )
        # HOMAGG_METRICS_PORT: this rank's Prometheus endpoint (docs/OPERATIONS.md)
        from homagg.ops import worker_metrics

        self.metrics = worker_metrics.from_environment(worker.job, worker.worker, env)

    @staticmethod
    def _worker_from_environment(process_group, env):
        import torch.distributed as dist

        conf = job_config(env)
        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank(process_group)
            world = dist.get_world_size(process_group)
        elif "rank" in conf and "world_size" in conf:
            rank, world = conf["rank"], conf["world_size"]
        else:
            raise ConfigError(
                "torch.distributed is not initialised: call "
                "init_process_group before HookState() (rank and world "
                "size of the HomAgg job come from it)"
            )
        if conf["workers"] and conf["workers"] != world:
            raise ConfigError(
                f"the HomAgg job {conf['job']} has {conf['workers']} workers "
                f"(HOMAGG_WORKERS or the job file), the world size is {world}: "
                "start as many ranks as the job has workers"
            )
        return Worker(
            job=conf["job"],
            token=conf["token"],
            worker=rank,
            workers=world,
            aggregators=conf["aggregators"],
            group=conf["group"] or None,
            bind=(conf["bind"], 0),
            timeout=conf["timeout"],
            slots=conf["slots"],
            payload=conf["payload"],
            auth_file=conf["auth_file"] or None,
            mac=conf["mac"] or None,
            key_epoch=conf["key_epoch"],
            cost=conf["cost"],
            leaf_ids=conf["leaf_ids"],
            udp_gso=conf["udp_gso"],
        )

    def take_log(self):
        """The log entries of the buckets reduced since the last call; waits
        (bounded) for the buckets already handed over to be logged (an
        entry is written after its result reached DDP)."""
        with self._pending_cv:
            self._pending_cv.wait_for(lambda: self._pending == 0, self._settle_timeout())
        with self._log_lock:
            out, self.log = self.log, []
        return out

    def close(self):
        self._executor.shutdown(wait=True)
        if self.worker is not None:
            self.worker.close()
        if self.metrics is not None:
            self.metrics.close()

    # -- per bucket ----------------------------------------------------------

    def _sparsified(self, x, params, grads):
        """x + residual, masked; the new residual is what was not sent."""
        offsets = np.cumsum([0] + [g.numel() for g in grads])
        if offsets[-1] != x.size:
            raise InvalidArgument(
                f"bucket layout: gradients hold {offsets[-1]} elements, the buffer {x.size}"
            )
        v = x.copy()
        for p, a, b in zip(params, offsets[:-1], offsets[1:]):
            r = self.residuals.get(p)
            if r is not None and r.size == b - a:
                v[a:b] += r
        sent = np.where(self.sparsify.mask(v), v, np.float32(0))
        rest = v - sent
        for p, a, b in zip(params, offsets[:-1], offsets[1:]):
            self.residuals[p] = rest[a:b].copy()
        return sent

    def reduce(self, index, buffer, params=(), grads=()):
        """Start the average of one bucket; returns a torch Future of it."""
        fut = torch.futures.Future()
        params = list(params)
        dtype = buffer.dtype
        x = buffer.detach().to(torch.float32).reshape(-1).numpy()
        # x is the bucket's own memory (float32, no sparsifier): DDP refills
        # it next step, and the group's path sums it in place
        own = dtype == torch.float32 and self.sparsify is None
        if self.sparsify is not None:
            x = self._sparsified(x, params, list(grads))
        info = {}
        t0 = time.perf_counter()
        self.last_call = t0  # the time DDP handed over the latest bucket
        seq = self._calls  # the recorder sees the buckets in this order
        seed = self.seed + seq
        self._calls += 1
        key = (index, int(x.size))
        call = self._calls_of.get(key, 0)  # this bucket's calls before this one
        self._calls_of[key] = call + 1
        steps = self._steps(key)  # trials of whole steps: the call's hand-over
        if steps is not None:
            steps.starts[call] = self._step_clock(key, call)
            steps.starts.pop(call - 2 * self.trial_calls - 2, None)
        world = np.float32(self.world_size)
        settled = threading.Event()  # the Future has its result (or the error is known)
        failure = []
        with self._pending_cv:
            self._pending += 1

        def retire():
            with self._pending_cv:
                self._pending -= 1
                self._pending_cv.notify_all()

        def finish(y, path, cpu, xin):
            try:
                if steps is not None:  # before DDP's next step can read it
                    steps.paths[call] = path
                    steps.paths.pop(call - 2 * self.trial_calls - 2, None)
                if path != "homagg":  # HomAgg's decoder divided already (_homagg)
                    np.divide(y, world, out=y)
                seconds = time.perf_counter() - t0
                if path == "baseline" and "path_t0" in info:
                    # this rank's time of the group's allreduce, agreed
                    # over the ranks at a later call (_reduce_sum)
                    tm = self._timing.get(key)
                    if tm is not None:
                        tm.baseline_runs += 1
                        if tm.baseline_runs > 1:  # the first is a cold start
                            tm.local = self._elapsed("baseline", info["path_t0"])
                if self.recorder is not None and path != "homagg":
                    # y is the summed bucket (DDP's memory): recorded before
                    # DDP may reuse it
                    self._record(seq, index, xin, y, params, path)
                out = torch.from_numpy(y).to(dtype).reshape(buffer.shape)
                fut.set_result(out)
                settled.set()
            except BaseException as exc:
                fail(exc)
                return
            # after the hand-over, off DDP's path: the recorder (y is this
            # call's own array), the metrics, the log and its non-zero count
            try:
                if self.recorder is not None and path == "homagg":
                    self._record(seq, index, xin, y, params, path)
                if self.metrics is not None and path == "homagg":
                    # between calls (this thread makes them): the client is idle
                    self.metrics.observe(seconds, info.get("method"), self.worker.counters())
                if "nnz" in info:
                    nnz = info["nnz"]
                elif info.get("in_place") and xin is x:
                    nnz = None  # x holds the sum now; not counted (a pass over the bucket)
                else:
                    nnz = _count_nonzero(xin)
                with self._log_lock:
                    self.log.append(
                        {
                            "bucket": index,
                            "seq": seq,
                            "numel": int(x.size),
                            "nnz": nnz,
                            "method": info.get("method"),
                            "bytes_sent": info.get("bytes_sent"),
                            "path": path,
                            "cpu_seconds": cpu,
                            "seconds": seconds,
                            "dtype": str(dtype),
                            "handed_over": t0,
                            "done": t0 + seconds,
                            "agree_seconds": info.get("agree_seconds", 0.0),
                            "predicted_homagg_seconds": info.get("predicted_homagg_seconds"),
                            "predicted_baseline_seconds": info.get("predicted_baseline_seconds"),
                            "measured_homagg_seconds": info.get("measured_homagg_seconds"),
                            "measured_baseline_seconds": info.get("measured_baseline_seconds"),
                            "trial": info.get("trial"),
                            "trial_step_seconds": info.get("trial_step_seconds"),
                        }
                    )
            except BaseException:  # noqa: BLE001 - the result is DDP's already
                _log.exception("homagg.torch: bucket %d: after its result", index)
            finally:
                retire()

        def fail(exc):
            try:
                if self.metrics is not None:
                    self.metrics.failed()
            finally:
                if self.recorder is not None:
                    self._record_skip(seq)
                failure.append(exc)
                if in_backward:  # check() below raises it, its type intact
                    fut.set_result(buffer)
                else:
                    fut.set_exception(exc)
                settled.set()
                retire()

        def deliver(y, path, cpu, xin):
            if not isinstance(y, torch._C.Future):  # (what Work.get_future() gives)
                finish(y, path, cpu, xin)
                return
            # the group's allreduce runs in Gloo's threads, as DDP's own:
            # this thread goes on with the next bucket

            def done(f):
                try:
                    yy = f.value().numpy()
                except BaseException as exc:
                    fail(exc)
                    return
                finish(yy, path, cpu, xin)

            y.then(done)

        def run():
            self._follow_job_file()
            try:
                c0 = time.thread_time()
                # the recorder keeps the input: a copy of the bucket's memory,
                # made here rather than on DDP's thread; the group's path
                # then sums the bucket's memory in place (no second copy)
                xin = x.copy() if own and self.recorder is not None else x
                y, path = self._reduce_sum(
                    index,
                    x,
                    seed,
                    info,
                    in_place=xin is not x or self.recorder is None,
                    call=call,
                    out=self._output(key, x.size, in_backward),
                    forced=forced,
                    steps=in_backward,
                )
                cpu = time.thread_time() - c0
            except BaseException as exc:
                fail(exc)
                return
            deliver(y, path, cpu, xin)

        def direct():
            try:
                c0 = time.thread_time()
                xin = x.copy() if own and self.recorder is not None else x
                y = self._group_sum_async(
                    x, info, xin is not x or self.recorder is None, group=self._direct_group
                )
                cpu = time.thread_time() - c0
            except BaseException as exc:
                fail(exc)
                return
            deliver(y, "baseline", cpu, xin)

        def check():
            # waits for this bucket's result only (its log entry follows)
            limit = self._settle_timeout()
            if not settled.wait(limit):
                raise PeerTimeout(
                    f"homagg.torch: bucket {index} has no result after "
                    f"{limit:.0f} s (HOMAGG_TIMEOUT per bucket in flight)"
                )
            if failure:
                raise failure[0]

        # DDP's reducer reads the Future from C++: an exception set on it
        # reaches the user as "Unable to cast ... to Tensor", and one raised
        # in a then() callback as a RuntimeError quoting it.  A callback
        # queued on the autograd engine runs before the reducer's own (which
        # is queued once every bucket is handed out) and raises the
        # worker's exception itself: loss.backward() raises PeerTimeout,
        # InvalidArgument, ... as the worker did.
        try:
            torch.autograd.Variable._execution_engine.queue_callback(check)
            in_backward = True
        except RuntimeError:  # called outside a backward pass: the Future carries it
            in_backward = False
        forced = self.paths[seq] if self.paths is not None and seq < len(self.paths) else None
        if forced is None and self._direct_group is not None:
            go_direct = self._direct(index, x.size, info, call, steps=in_backward)
        else:
            go_direct = forced == "baseline" and self._direct_group is not None
        if go_direct:
            direct()
        else:
            self._executor.submit(run)
        return fut

    def _output(self, key, n, in_backward):
        """The array HomAgg's result of bucket ``key`` is written into: the
        bucket's own, kept from its last call, inside DDP's backward pass
        without a recorder (DDP copies a result into the gradients before
        the backward pass returns, so the next call of the bucket may
        overwrite it), saving a fresh array's page faults (15 MB: 3,800
        pages zeroed by the kernel on first touch) at every call; None (a
        new array) otherwise: a recorder keeps its ``y``, and a caller of
        ``reduce`` outside DDP holds every result it got."""
        if not in_backward or self.recorder is not None:
            return None
        y = self._outputs.get(key)
        if y is None or y.size != n:
            y = self._outputs[key] = np.empty(n, dtype=np.float32)
        return y

    def _record(self, seq, index, xin, y, params, path):
        """The recorder's call of hand-over number ``seq``, after those of
        the buckets handed over before it: buckets complete out of order
        (the group's allreduces run in Gloo's threads), the recorder sees
        them in DDP's order on every rank."""
        with self._rec_cv:
            if not self._rec_cv.wait_for(lambda: self._rec_next >= seq, self._settle_timeout()):
                _log.warning("homagg.torch: bucket %d recorded out of order", index)
        try:
            if self._recorder_path:
                self.recorder(index, xin, y, params, path=path)
            else:
                self.recorder(index, xin, y, params)
        finally:
            self._record_skip(seq)

    def _record_skip(self, seq):
        """Hand-over ``seq`` is recorded (or will never be): the next may go."""
        with self._rec_cv:
            self._rec_done.add(seq)
            while self._rec_next in self._rec_done:
                self._rec_done.discard(self._rec_next)
                self._rec_next += 1
            self._rec_cv.notify_all()

    def _settle_timeout(self):
        """Seconds a backward pass waits for one bucket before it fails:
        generous, the worker's own timeout fails a bucket first, and each
        bucket still in flight ahead of it may take one such timeout (a
        retry after a back-off)."""
        timeout = float(getattr(self.worker, "timeout", None) or 10.0)
        return 60.0 + 2.0 * timeout * max(1, self._pending)

    def _follow_job_file(self):
        """A key rotation (``homagg rotate-key``) picked up between buckets,
        on the hook's thread: when the worker was made from the job file
        (HOMAGG_JOB_FILE) and that file changed since the last look (a
        stat: inode, mtime, size), its ``key_epoch`` and ``auth_file`` are
        read again and a new epoch is given to the worker
        (``Worker.rotate_key``).  Never fails the bucket: a file read
        mid-write is read again at the next bucket; a worker that cannot
        take the epoch (it missed one) fails over to the fallback, whose
        fresh worker reads the job file."""
        if self._make_worker is None or self.worker is None:
            return
        import os

        env = os.environ if self._env is None else self._env
        path = env.get("HOMAGG_JOB_FILE")
        try:
            st = os.stat(path) if path else None
        except OSError:
            return
        seen = st and (st.st_ino, st.st_mtime_ns, st.st_size)
        if not seen or seen == self._job_file_seen:
            return
        try:
            conf = job_config(env)
        except ConfigError as exc:
            _log.warning(
                "homagg.torch: job file %s not read (%s); read again next bucket", path, exc
            )
            return
        self._job_file_seen = seen
        epoch = conf["key_epoch"] & 255
        if not conf["auth_file"] or epoch == getattr(self.worker, "key_epoch", epoch):
            return
        try:
            self.worker.rotate_key(conf["auth_file"], epoch)
            _log.info("homagg.torch: key epoch %d from %s", epoch, conf["auth_file"])
        except Exception as exc:  # noqa: BLE001 - the bucket goes on; see above
            _log.warning("homagg.torch: key epoch %d not taken: %s", epoch, exc)

    # -- the path of one bucket (on the hook's thread, buckets in order) -----

    @property
    def cost(self):
        """The cost model the choice of path predicts with: the one given
        (or the job's), with the job's payload per packet, as the worker's
        client takes it (homagg.cost.for_payload), the same on every rank.
        A job of 8192-byte payloads on jumbo links pays a packet's costs
        over 8 times the bytes of a 1024-byte one.  Made once per payload
        (it is read several times a bucket)."""
        payload = getattr(self.worker, "payload", 0)
        if self._cost_for[0] != payload:
            self._cost_for = (payload, _cost.for_payload(self._cost, payload))
        return self._cost_for[1]

    @cost.setter
    def cost(self, value):
        self._cost = _cost.as_cost(value)
        self._cost_for = (None, self._cost)

    def _choice(self, n):
        """(rule applies, the count must be agreed) for a bucket of n elements."""
        if not (self.baseline and self.cost.timed and self.method in _cost.BASELINE_METHODS):
            return False, False
        block = self.block or _cost_block()
        return True, _cost.needs_density(self.cost, self.world_size, n, self.method, block)

    def _direct(self, index, n, info, call=0, steps=False):
        """True when the cost model sends this bucket to the group with no
        agreement due: DDP's thread then starts the group's allreduce
        itself, as DDP's own hook does, instead of handing the bucket to the
        hook's thread first.  Every rank decides the same: the rule's inputs
        are the bucket's size, the job's cost model, the count last agreed
        for this bucket and the times last agreed for it (touched only by
        this bucket's calls, one after the other)."""
        rule, need_nnz = self._choice(n)
        if not rule:
            return False
        key = (index, int(n))
        tm = self._steps(key) if steps else None
        if tm is not None and (tm.trial_from is not None or call < tm.held_until):
            # a trial's or a hold's call to the group starts here; HomAgg's
            # and a trial's verdict (agreed) run on the hook's thread
            if self._trial_call(tm, call) != "baseline":
                return False
            self._count_trial_call(tm, info)
            return True
        if tm is not None and self._trial_may_start(key, call):
            return False  # whether a trial starts is decided on the hook's thread
        nnz_max = None
        if need_nnz:
            cached = self._nnz_cache.get(key)
            if cached is None or cached[1] + 1 >= self.density_every:
                return False  # the count is agreed first, on the hook's thread
            nnz_max = cached[0]
        tm = self._timing_for(key)
        if tm is not None and self._baseline_due(tm, call):
            return False  # the group's time is agreed first, on the hook's thread
        c = _cost.choose_path(
            self.cost, self.world_size, n, nnz_max, self.method, self.block or _cost_block()
        )
        if self._path(c, tm, call, info) != "baseline":
            return False
        if need_nnz:
            self._nnz_cache[key] = (nnz_max, cached[1] + 1)
        return True

    # -- measured times (``measure``) -----------------------------------------

    def _timing_for(self, key):
        """The bucket's measured times, or None when not measuring."""
        if not self.measure:
            return None
        tm = self._timing.get(key)
        if tm is None:
            tm = self._timing[key] = _Timing()
        return tm

    def _elapsed(self, path, t0):
        """Seconds since ``t0`` (perf_counter) of a ``path`` ("homagg" or
        "baseline") that just gave its result: the measured time."""
        return time.perf_counter() - t0

    def _baseline_due(self, tm, call):
        """Whether this call agrees this rank's time of the group's
        allreduce (measured at an earlier call): at the first call after
        one ran when none is agreed yet, then every density_every calls
        (remeasure, if fewer: before the agreed one expires).
        The same on every rank: every rank ran the same paths."""
        return tm.local is not None and (
            tm.baseline is None or call - tm.baseline_at >= min(self.density_every, self.remeasure)
        )

    def _path(self, c, tm, call, info):
        """The path of a bucket from the model's choice ``c``
        (homagg.cost.choose_path) and the agreed measured times: each
        path's time is its measured one where a measurement younger than
        ``remeasure`` calls exists, else the model's prediction; the
        group's allreduce when its time is strictly smaller."""
        if c["homagg_ps"] is not None:
            info["predicted_homagg_seconds"] = c["homagg_ps"] * 1e-12
            info["predicted_baseline_seconds"] = c["baseline_ps"] * 1e-12
        if tm is None or c["homagg_ps"] is None:
            return c["path"]
        h = tm.homagg if tm.homagg is not None and call - tm.homagg_at < self.remeasure else None
        b = (
            tm.baseline
            if tm.baseline is not None and call - tm.baseline_at < self.remeasure
            else None
        )
        info["measured_homagg_seconds"], info["measured_baseline_seconds"] = h, b
        th = round(h * 1e12) if h is not None else c["homagg_ps"]
        tb = round(b * 1e12) if b is not None else c["baseline_ps"]
        info["choice_ps"] = (th, tb)  # a trial's margin (_trial)
        return "baseline" if tb < th else "homagg"

    # -- whole steps (``trial_calls``) --------------------------------------

    def _steps(self, key):
        """The bucket's _Timing where trials of whole steps apply (the
        rule and its measured times on, ``trial_calls`` > 0), else None."""
        if not (self.baseline and self.measure and self.trial_calls):
            return None
        return self._timing_for(key)

    def _step_clock(self, key, call):
        """The time (seconds) at which DDP handed over call ``call`` of
        bucket ``key``: the step periods of a trial."""
        return time.perf_counter()

    def _trial_may_start(self, key, call):
        """Whether a trial of bucket ``key`` may start at ``call``: its
        calls ``T + 1 + index (2T + 1) + m trial_every`` (the buckets'
        trials one after another)."""
        T = self.trial_calls
        first = T + 1 + int(key[0]) * (2 * T + 1)
        return call >= first and (call - first) % self.trial_every == 0

    def _trial_call(self, tm, call):
        """The path of a call of a trial under way or of a verdict's hold,
        None at a trial's verdict (agreed on the hook's thread)."""
        if tm.trial_from is not None:
            return tm.trial_path if call < tm.trial_from + self.trial_calls else None
        return tm.held_path

    def _count_trial_call(self, tm, info):
        """The log's and the counters' note of a trial's or a hold's call."""
        if tm.trial_from is not None:
            info["trial"], counter = "trial", "trial_calls"
        else:
            info["trial"], counter = "held", "held_calls"
        with self._log_lock:  # DDP's thread and the hook's both count here
            self.counters[counter] += 1

    def _trial(self, tm, key, call, path, info):
        """The path of a call of a bucket whose rule chose ``path``, with
        trials of whole steps (on the hook's thread, DDP's calls only;
        docs/TRAINING.md "Whole steps, where a bucket's time is not its
        cost").  Every input is the same on every rank: the call numbers,
        the paths taken, the times that chose ``path`` and the verdicts
        agreed over the ranks."""
        T = self.trial_calls
        if tm.trial_from is not None and call >= tm.trial_from + T:
            self._verdict(tm, call, info)
        if tm.trial_from is not None or call < tm.held_until:
            self._count_trial_call(tm, info)
            return self._trial_call(tm, call)
        if not self._trial_may_start(key, call):
            return path
        th, tb = info.get("choice_ps", (None, None))
        if th is None or max(th, tb) >= self.trial_margin * min(th, tb):
            return path  # one path at least trial_margin times faster: no trial
        if any(tm.paths.get(k) != path for k in range(call - T, call)):
            return path  # the reference steps must be the rule's path
        tm.trial_from, tm.ref_path = call, path
        tm.trial_path = "baseline" if path == "homagg" else "homagg"
        self.counters["trials"] += 1
        self._count_trial_call(tm, info)
        return tm.trial_path

    def _verdict(self, tm, call, info):
        """A trial's verdict at the call after its last: the median step
        period after its T reference calls (the rule's path) and after its
        T calls (the other path), each the MAX over the ranks (the slowest
        rank's); the path of the strictly shorter steps (the rule's on a
        tie) held until T calls before the bucket's next trial."""
        T, s = self.trial_calls, tm.trial_from
        tm.trial_from = None
        t = tm.starts
        try:
            ref = float(np.median([t[k] - t[k - 1] for k in range(s - T + 1, s + 1)]))
            trial = float(np.median([t[k] - t[k - 1] for k in range(s + 1, s + T + 1)]))
            mine = (0, _micros(ref), _micros(trial))
        except KeyError:  # a call's time is missing (not DDP's): no verdict
            mine = (1, 0, 0)
        missing, ref_us, trial_us = self._agree_max(*mine)
        if missing:
            return
        tm.held_path = tm.trial_path if trial_us < ref_us else tm.ref_path
        tm.held_until = s + self.trial_every - T
        median = {tm.ref_path: ref_us * 1e-6, tm.trial_path: trial_us * 1e-6}
        info["trial_step_seconds"] = {
            "homagg": median["homagg"],
            "baseline": median["baseline"],
            "held": tm.held_path,
        }
        self.counters["trials_to_group" if tm.held_path == "baseline" else "trials_to_homagg"] += 1

    def _reduce_sum(
        self, index, x, seed, info, in_place=True, call=0, out=None, forced=None, steps=False
    ):
        """The sum of x over the ranks (the group's paths; in x itself when
        ``in_place``) or its average (HomAgg's: its decoder divides; into
        ``out`` when given, else a new array), and the path that made it
        (``forced``: the one ``paths`` names for this bucket)."""
        if forced == "baseline":
            return self._group_sum_async(x, info, in_place), "baseline"
        if forced == "fallback":
            return self._group_sum(x, info, "fallback_buckets"), "fallback"
        rule, need_nnz = self._choice(x.size) if forced is None else (False, False)
        backing = self.fallback and self._retry_at is not None
        nnz_max = None
        # the count of a bucket (index and size) is agreed on its first call
        # and every density_every-th after; between those the last agreed one
        # (the same on every rank: every rank makes the same calls)
        key = (index, int(x.size))
        cached = self._nnz_cache.get(key) if need_nnz else None
        agree_nnz = need_nnz and (cached is None or cached[1] + 1 >= self.density_every)
        if need_nnz and not agree_nnz:
            nnz_max = cached[0]
            self._nnz_cache[key] = (nnz_max, cached[1] + 1)
        tm = self._timing_for(key) if rule else None
        agree_time = tm is not None and self._baseline_due(tm, call)
        if agree_nnz or backing or agree_time:
            # one allreduce MAX: the back-off flag, this rank's non-zero
            # count and (negated: the MIN) its time of the group's
            # allreduce (microseconds)
            a0 = time.perf_counter()
            if agree_nnz:
                info["nnz"] = _count_nonzero(x)  # the log's too: one pass
            waiting, agreed, baseline_us = self._agree_max(
                int(backing and time.monotonic() < self._retry_at),
                info.get("nnz", 0),
                -_micros(tm.local) if agree_time else 0,
            )
            baseline_us = -baseline_us  # the MIN over the ranks (_micros: >= 1)
            info["agree_seconds"] = time.perf_counter() - a0
            if agree_nnz:
                nnz_max = agreed
                self._nnz_cache[key] = (nnz_max, 0)
                self.counters["density_agreements"] += 1
            if agree_time and baseline_us > 0:
                tm.baseline, tm.baseline_at, tm.local = baseline_us * 1e-6, call, None
            if backing and waiting:
                return self._group_sum(x, info, "fallback_buckets"), "fallback"
        if rule:
            c = _cost.choose_path(
                self.cost,
                self.world_size,
                x.size,
                nnz_max,
                self.method,
                self.block or _cost_block(),
            )
            path = self._path(c, tm, call, info)
            if steps and self._steps(key) is not None:
                path = self._trial(tm, key, call, path, info)
            if path == "baseline":
                return self._group_sum_async(x, info, in_place), "baseline"
        if not self.fallback:  # no agreement after it: HomAgg's time is not measured
            return self._homagg(x, seed, info, out), "homagg"
        if backing:
            self.counters["retries"] += 1
        error, h0 = None, time.perf_counter()
        try:
            if self.worker is None:
                self.worker = self._make_worker()
            y = self._homagg(x, seed, info, out)
        except Exception as exc:  # noqa: BLE001 - every rank must reach the agreement
            error = exc
        homagg_s = self._elapsed("homagg", h0)
        # one allreduce MAX: whether any rank failed, and (negated: the
        # MIN) the shortest rank's time of this HomAgg allreduce, the last
        # one to reach it (when measuring, from the bucket's second one
        # on: the first is a cold start; 0: none)
        if tm is not None:
            tm.homagg_runs += 1
        timed = tm is not None and tm.homagg_runs > 1
        a0 = time.perf_counter()
        failed, homagg_us = self._agree_max(
            int(error is not None), -_micros(homagg_s) if timed else 0
        )
        homagg_us = -homagg_us
        info["agree_seconds"] = info.get("agree_seconds", 0.0) + time.perf_counter() - a0
        if not failed:
            if timed and homagg_us > 0:
                tm.homagg, tm.homagg_at = homagg_us * 1e-6, call
            self._failures, self._retry_at = 0, None
            return y, "homagg"
        self._failures += 1
        self.counters["homagg_failures"] += 1
        if self.metrics is not None:
            self.metrics.failed()
        wait = min(self.backoff_max, self.backoff * 2 ** (self._failures - 1))
        self._retry_at = time.monotonic() + wait
        why = f"{type(error).__name__}: {error}" if error else "another rank's HomAgg failed"
        self.last_failure = f"bucket {index}: {why}"
        _log.warning(
            "homagg.torch: bucket %d reduced with the process group's allreduce "
            "(%s); HomAgg tried again in %.3g s",
            index,
            why,
            wait,
        )
        if self._make_worker is not None and self.worker is not None:
            # a fresh worker (new incarnation) for the retry
            worker, self.worker = self.worker, None
            try:
                worker.close()
            except Exception as exc:  # noqa: BLE001 - it failed already
                _log.debug("closing the failed HomAgg worker: %s", exc)
        for k in ("method", "bytes_sent"):
            info.pop(k, None)
        return self._group_sum(x, info, "fallback_buckets"), "fallback"

    def _homagg(self, x, seed, info, out=None):
        """HomAgg's average of x: the decoder divides each block by the
        world size while it is in cache (bit for bit numpy's float32
        division of the sum), instead of a pass over the result."""
        y = self.worker.allreduce(
            x,
            self.method,
            out=out,
            block=self.block,
            nc_levels=self.nc_levels,
            seed=seed,
            info=info,
            divide_by=self.world_size,
        )
        if "nnz" not in info and info.get("nonzeros") is not None:
            info["nnz"] = info["nonzeros"]  # the C scan's count: the log's, no pass here
        return y

    def _agree_max(self, *values):
        """Every rank's values (integers), each reduced with MAX over the
        hook's group in one allreduce (a MIN where the ranks send -v)."""
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._group)
        return [int(v) for v in t.tolist()]

    def _group_sum_async(self, x, info, in_place=True, group=None):
        """The group's allreduce of x, started: a torch Future of the
        float32 sum (a tensor sharing memory with the array it summed).  In
        place on x (the bucket's own memory when it is float32) unless
        ``in_place`` is false (the recorder keeps x).  No pass over x
        before the allreduce starts: the log's non-zero count is the agreed
        one, or counted from the recorder's copy after the result."""
        import torch.distributed as dist

        with self._log_lock:  # DDP's thread and the hook's both count here
            self.counters["baseline_buckets"] += 1
        info["in_place"] = bool(in_place)
        t = torch.from_numpy(x if in_place else x.copy())
        info["path_t0"] = time.perf_counter()
        work = dist.all_reduce(
            t,
            op=dist.ReduceOp.SUM,
            async_op=True,
            group=self._baseline_group if group is None else group,
        )
        info["method"] = self._baseline_backend
        info["bytes_sent"] = None
        return work.get_future().then(lambda f: t)

    def _group_sum(self, x, info, counter):
        import torch.distributed as dist

        self.counters[counter] += 1
        t = torch.from_numpy(np.array(x, dtype=np.float32, copy=True))
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self._group)
        info["method"] = dist.get_backend(self._group)
        info["bytes_sent"] = None
        return t.numpy()


_log = logging.getLogger("homagg.torch")


def threads_per_rank(local_ranks=1, cores=None):
    """torch intra-op threads for one of ``local_ranks`` ranks sharing the
    cores this process may run on (``cores``: default its CPU affinity),
    leaving one core per rank to the hook's thread, which encodes and
    decodes while the backward pass goes on: max(1, cores // local_ranks - 1).
    Call ``torch.set_num_threads(threads_per_rank(...))`` before training;
    torch's default (every core in every rank) makes the ranks' and the
    hook's threads compete."""
    import os

    if cores is None:
        cores = len(os.sched_getaffinity(0))
    if local_ranks < 1:
        raise InvalidArgument(f"local_ranks {local_ranks} must be >= 1")
    return max(1, int(cores) // int(local_ranks) - 1)


def _count_nonzero(a):
    """The elements of float32 ``a`` that are not 0 (-0.0 is 0, NaN is
    not), as np.count_nonzero counts them: torch's vectorised count, 3.4x
    less thread CPU than numpy's on a 3.85 M-element NCF bucket (2.3 ms
    against 7.9 ms median of 15, thread_time, one torch thread, 2-vCPU
    Xeon under load 5)."""
    return int(torch.count_nonzero(torch.from_numpy(a)))


def _cost_block():
    from homagg._native import lib

    return int(lib.HG_DEFAULT_BLOCK)


def _takes_keyword(fn, name):
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _fallback_group(process_group):
    """A Gloo group of the ranks of ``process_group`` (default: every rank)
    for the fallback's agreement and allreduce, or None without
    torch.distributed.  Collective: every rank of the default group calls it."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    ranks = None if process_group is None else dist.get_process_group_ranks(process_group)
    return dist.new_group(ranks=ranks, backend="gloo")


def allreduce_hook(state: HookState, bucket) -> torch.futures.Future[torch.Tensor]:
    """The DDP communication hook: the bucket's exact average through
    HomAgg (see the module doc)."""
    return state.reduce(bucket.index(), bucket.buffer(), bucket.parameters(), bucket.gradients())
