"""PyTorch DDP communication hook: gradients summed by HomAgg.

One line in a torch.distributed program (any backend for rendezvous; Gloo
is enough)::

    import homagg.torch
    model = torch.nn.parallel.DistributedDataParallel(model)
    model.register_comm_hook(homagg.torch.HookState(), homagg.torch.allreduce_hook)

Every gradient bucket DDP hands to the hook goes through a HomAgg
``homagg.worker.Worker`` on the worker's background thread (the C call
runs without the GIL), and the hook returns a ``torch.futures.Future``
completed from that thread, so DDP overlaps communication with the rest of
the backward pass.  The bucket's average is the exact fixed-point sum
(docs/PROTOCOL.md) divided by the world size in float32: bit-identical on
every rank.  float16 / bfloat16 buckets are reduced in float32 and cast
back.

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

A missing aggregator is an error naming the variable to set; an aggregator
that does not answer makes the backward pass raise PeerTimeout naming it
within HOMAGG_TIMEOUT seconds.
"""

import dataclasses
import math
import threading
import time

import numpy as np
import torch

from homagg import protocol
from homagg.errors import InvalidArgument
from homagg.switch.job_file import (JOB_FIELDS, UDP_PORT, ConfigError, job_config,  # noqa: F401
                                    write_job_file)
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
        keep = np.argpartition(np.abs(v), v.size - k)[v.size - k:]
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


class HookState:
    """What the hook keeps between calls: the HomAgg worker, the options,
    the error-feedback residuals and a per-bucket log.

    ``worker``: a homagg.worker.Worker to use (default: made from the
    environment, see the module doc, with rank = worker id and world size
    = workers of ``process_group``).  ``log`` collects one dict per bucket
    reduced (index, numel, nnz, method run, bytes sent, seconds); read it
    with ``take_log()``.  ``recorder(bucket, x, y, params)``, when given,
    is called on the background thread with each bucket's float32 input as
    summed (after sparsification), its averaged result and the bucket's
    parameters (their gradients lie in x in this order)."""

    def __init__(self, worker=None, *, method="auto", sparsify=None, process_group=None,
                 block=None, nc_levels=0, seed=0, recorder=None, env=None):
        protocol.method(method)  # InvalidArgument naming the choices
        if sparsify is not None and not hasattr(sparsify, "mask"):
            raise InvalidArgument("sparsify must be homagg.torch.TopK(...) or Threshold(...)")
        self.method = method
        self.sparsify = sparsify
        self.block = block
        self.nc_levels = nc_levels
        self.seed = seed
        self.recorder = recorder
        self.residuals = {}  # parameter -> float32 residual (error feedback)
        self.log = []
        self._log_lock = threading.Lock()
        self._calls = 0
        if worker is None:
            worker = self._worker_from_environment(process_group, env)
        self.worker = worker
        self.world_size = worker.workers
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
            raise ConfigError("torch.distributed is not initialised: call "
                              "init_process_group before HookState() (rank and world "
                              "size of the HomAgg job come from it)")
        if conf["workers"] and conf["workers"] != world:
            raise ConfigError(f"the HomAgg job {conf['job']} has {conf['workers']} workers "
                              f"(HOMAGG_WORKERS or the job file), the world size is {world}: "
                              "start as many ranks as the job has workers")
        return Worker(job=conf["job"], token=conf["token"], worker=rank, workers=world,
                      aggregators=conf["aggregators"], group=conf["group"] or None,
                      bind=(conf["bind"], 0), timeout=conf["timeout"], slots=conf["slots"],
                      payload=conf["payload"], auth_file=conf["auth_file"] or None,
                      mac=conf["mac"] or None, key_epoch=conf["key_epoch"],
                      cost=conf["cost"])

    def take_log(self):
        with self._log_lock:
            out, self.log = self.log, []
        return out

    def close(self):
        self.worker.close()
        if self.metrics is not None:
            self.metrics.close()

    # -- per bucket ----------------------------------------------------------

    def _sparsified(self, x, params, grads):
        """x + residual, masked; the new residual is what was not sent."""
        offsets = np.cumsum([0] + [g.numel() for g in grads])
        if offsets[-1] != x.size:
            raise InvalidArgument(f"bucket layout: gradients hold {offsets[-1]} "
                                  f"elements, the buffer {x.size}")
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
        if self.sparsify is not None:
            x = self._sparsified(x, params, list(grads))
        elif dtype == torch.float32 and self.recorder is not None:
            x = x.copy()  # the recorder keeps it; DDP refills the bucket next step
        info = {}
        t0 = time.perf_counter()
        seed = self.seed + self._calls
        self._calls += 1
        cf = self.worker.allreduce_async(x, self.method, block=self.block,
                                         nc_levels=self.nc_levels, seed=seed, info=info)
        world = np.float32(self.world_size)

        def done(f):
            try:
                y = f.result()
                np.divide(y, world, out=y)
                if self.recorder is not None:
                    self.recorder(index, x, y, params)
                seconds = time.perf_counter() - t0
                if self.metrics is not None:   # between calls: the client is idle
                    self.metrics.observe(seconds, info.get("method"), self.worker.counters())
                with self._log_lock:
                    self.log.append({
                        "bucket": index, "numel": int(x.size),
                        "nnz": int(np.count_nonzero(x)), "method": info.get("method"),
                        "bytes_sent": info.get("bytes_sent"),
                        "seconds": seconds, "dtype": str(dtype)})
                out = torch.from_numpy(y).to(dtype).reshape(buffer.shape)
                fut.set_result(out)
            except BaseException as exc:
                if self.metrics is not None:
                    self.metrics.failed()
                if in_backward:  # check() below raises it, its type intact
                    fut.set_result(buffer)
                else:
                    fut.set_exception(exc)

        # DDP's reducer reads the Future from C++: an exception set on it
        # reaches the user as "Unable to cast ... to Tensor", and one raised
        # in a then() callback as a RuntimeError quoting it.  A callback
        # queued on the autograd engine runs before the reducer's own (which
        # is queued once every bucket is handed out) and raises the
        # worker's exception itself: loss.backward() raises PeerTimeout,
        # InvalidArgument, ... as the worker did.
        def check():
            exc = cf.exception()
            if exc is not None:
                raise exc

        try:
            torch.autograd.Variable._execution_engine.queue_callback(check)
            in_backward = True
        except RuntimeError:  # called outside a backward pass: the Future carries it
            in_backward = False
        cf.add_done_callback(done)
        return fut


def allreduce_hook(state: HookState, bucket) -> torch.futures.Future[torch.Tensor]:
    """The DDP communication hook: the bucket's exact average through
    HomAgg (see the module doc)."""
    return state.reduce(bucket.index(), bucket.buffer(), bucket.parameters(),
                        bucket.gradients())
