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

    HOMAGG_JOB_FILE   JSON written by `homagg train` (fields below, lower case)
    HOMAGG_AGGREGATOR ip[:port] of the aggregator (homagg-switch), port 48879
    HOMAGG_JOB, HOMAGG_TOKEN  the job registered on the aggregator
    HOMAGG_GROUP      multicast group of the results (optional)
    HOMAGG_BIND       this rank's local address (default: any)
    HOMAGG_TIMEOUT    seconds without progress before an allreduce fails (10)
    HOMAGG_SLOTS, HOMAGG_PAYLOAD  the job's slots and payload bytes (64, 1024)

A missing aggregator is an error naming the variable to set; an aggregator
that does not answer makes the backward pass raise PeerTimeout naming it
within HOMAGG_TIMEOUT seconds.
"""

import dataclasses
import json
import math
import os
import threading
import time

import numpy as np
import torch

from homagg.errors import HomAggError, InvalidArgument
from homagg import protocol
from homagg.worker import Worker

UDP_PORT = 48879  # HG_UDP_PORT (wire.h)

# Fields of the job configuration: name -> (type, default).  None: required.
JOB_FIELDS = {
    "aggregator": (str, None),
    "job": (int, None),
    "token": (int, None),
    "group": (str, ""),
    "bind": (str, "0.0.0.0"),
    "timeout": (float, 10.0),
    "slots": (int, 64),
    "payload": (int, 1024),
}


class ConfigError(HomAggError):
    """The HomAgg job of a training process is not configured correctly."""


def job_config(env=None):
    """The job configuration from HOMAGG_JOB_FILE and HOMAGG_* variables
    (a variable wins over the file's field); ConfigError names what is
    missing or malformed."""
    env = os.environ if env is None else env
    conf = {}
    path = env.get("HOMAGG_JOB_FILE")
    if path:
        try:
            with open(path) as f:
                conf = json.load(f)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"HOMAGG_JOB_FILE={path}: cannot read the job file: {exc}") from exc
        if not isinstance(conf, dict):
            raise ConfigError(f"HOMAGG_JOB_FILE={path}: not a JSON object")
    out = {}
    for name, (kind, default) in JOB_FIELDS.items():
        var = "HOMAGG_" + name.upper()
        value = env.get(var, conf.get(name, default))
        if value is None:
            raise ConfigError(
                f"no {name} configured for the HomAgg job: set {var} "
                f"(or HOMAGG_JOB_FILE, a job file written by `homagg train`)")
        try:
            out[name] = kind(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{var}={value!r}: not a valid {kind.__name__}") from exc
    host, _, port = out["aggregator"].partition(":")
    try:
        out["aggregator"] = (host, int(port) if port else UDP_PORT)
    except ValueError as exc:
        raise ConfigError(f"HOMAGG_AGGREGATOR={out['aggregator']!r}: expected ip[:port]") from exc
    if out["timeout"] <= 0:
        raise ConfigError("HOMAGG_TIMEOUT must be positive")
    for key in ("rank", "world_size"):
        if key in conf:
            out[key] = int(conf[key])
    return out


def write_job_file(path, **fields):
    """Write a job file HOMAGG_JOB_FILE can name (the JOB_FIELDS)."""
    unknown = set(fields) - set(JOB_FIELDS)
    if unknown:
        raise InvalidArgument(f"unknown job file fields {sorted(unknown)}")
    agg = fields.get("aggregator")
    if isinstance(agg, (tuple, list)):
        fields["aggregator"] = f"{agg[0]}:{agg[1]}"
    with open(path, "w") as f:
        json.dump(fields, f)
    return path


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
        return Worker(job=conf["job"], token=conf["token"], worker=rank, workers=world,
                      aggregator=conf["aggregator"], group=conf["group"] or None,
                      bind=(conf["bind"], 0), timeout=conf["timeout"], slots=conf["slots"],
                      payload=conf["payload"])

    def take_log(self):
        with self._log_lock:
            out, self.log = self.log, []
        return out

    def close(self):
        self.worker.close()

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
                with self._log_lock:
                    self.log.append({
                        "bucket": index, "numel": int(x.size),
                        "nnz": int(np.count_nonzero(x)), "method": info.get("method"),
                        "bytes_sent": info.get("bytes_sent"),
                        "seconds": time.perf_counter() - t0, "dtype": str(dtype)})
                out = torch.from_numpy(y).to(dtype).reshape(buffer.shape)
                fut.set_result(out)
            except BaseException as exc:  # the backward pass raises it
                fut.set_exception(exc)

        cf.add_done_callback(done)
        return fut


def allreduce_hook(state: HookState, bucket) -> torch.futures.Future[torch.Tensor]:
    """The DDP communication hook: the bucket's exact average through
    HomAgg (see the module doc)."""
    return state.reduce(bucket.index(), bucket.buffer(), bucket.parameters(),
                        bucket.gradients())
