"""A training worker's own Prometheus endpoint: HOMAGG_METRICS_PORT.

``homagg.torch.HookState`` serves one when the variable is set (the
``metrics`` extra): rank ``LOCAL_RANK`` of a host listens on
``HOMAGG_METRICS_PORT + LOCAL_RANK`` (torchrun sets LOCAL_RANK; 0 when
unset), on ``HOMAGG_METRICS_BIND`` (default 127.0.0.1); port 0 takes any
free port (``HookState.metrics.url`` names it).  Each allreduce the hook
completes adds to the series below, labelled with the job and the worker
id; the client counters are read between allreduces (on the worker's
thread, as each call completes), so a scrape never waits for the network.

    homagg_client_allreduces_total{job,worker,method}
    homagg_client_allreduce_failures_total{job,worker}
    homagg_client_allreduce_seconds{job,worker}            histogram
    homagg_client_bytes_sent_total{job,worker,phase}       payload bytes
    homagg_client_bytes_received_total{job,worker,phase}
    homagg_client_packets_sent_total{job,worker}
    homagg_client_retransmissions_total{job,worker}
    homagg_client_timeouts_total{job,worker}
    homagg_client_spurious_timeouts_total{job,worker}

docs/OPERATIONS.md shows how Prometheus finds them.
"""

from __future__ import annotations

import os
import threading

from homagg.errors import InvalidArgument

SCALARS = ("packets_sent", "retransmissions", "timeouts", "spurious_timeouts")
PER_PHASE = ("bytes_sent", "bytes_received")
# allreduce times from a small bucket on a fast link to a large one on a slow link
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class WorkerMetrics:
    """The series of one worker in a private registry, served over HTTP by
    ``serve``.  ``observe`` after each allreduce with the worker's counters
    (``Worker.counters()``): the differences since the last call are added."""

    def __init__(self, job: int, worker: int):
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        self.labels = {"job": str(job), "worker": str(worker)}
        lab = ["job", "worker"]
        self.calls = Counter(
            "homagg_client_allreduces",
            "allreduces completed",
            lab + ["method"],
            registry=self.registry,
        )
        self.failures = Counter(
            "homagg_client_allreduce_failures",
            "allreduces that raised (PeerTimeout, ...)",
            lab,
            registry=self.registry,
        )
        self.seconds = Histogram(
            "homagg_client_allreduce_seconds",
            "time of each allreduce, submission to result",
            lab,
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.scalars = {
            k: Counter(
                f"homagg_client_{k}",
                f"client counter {k} (homagg/client.h)",
                lab,
                registry=self.registry,
            )
            for k in SCALARS
        }
        self.phased = {
            k: Counter(
                f"homagg_client_{k}",
                f"client counter {k} per phase (homagg/client.h)",
                lab + ["phase"],
                registry=self.registry,
            )
            for k in PER_PHASE
        }
        self._last: dict | None = None
        self._lock = threading.Lock()
        self.server = None
        self.url = None

    def observe(self, seconds: float, method: str | None, counters: dict) -> None:
        """One allreduce done: its time, the method that ran, and the client's
        counters after it."""
        with self._lock:
            last, self._last = self._last or {}, counters
        self.calls.labels(**self.labels, method=method or "unknown").inc()
        self.seconds.labels(**self.labels).observe(seconds)
        for k in SCALARS:
            self.scalars[k].labels(**self.labels).inc(max(0, counters[k] - last.get(k, 0)))
        for k in PER_PHASE:
            before = last.get(k, {})
            for phase, v in counters[k].items():
                d = v - before.get(phase, 0)
                if d > 0:
                    self.phased[k].labels(**self.labels, phase=phase).inc(d)

    def failed(self) -> None:
        self.failures.labels(**self.labels).inc()

    def serve(self, port: int, bind: str = "127.0.0.1") -> str:
        from prometheus_client import start_http_server

        self.server, _ = start_http_server(port, addr=bind, registry=self.registry)
        host, port = self.server.server_address[:2]
        self.url = f"http://{host}:{port}/metrics"
        return self.url

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def from_environment(job: int, worker: int, env=None) -> WorkerMetrics | None:
    """A served WorkerMetrics when HOMAGG_METRICS_PORT is set, else None."""
    env = os.environ if env is None else env
    raw = env.get("HOMAGG_METRICS_PORT", "").strip()
    if not raw:
        return None
    try:
        base, local = int(raw), int(env.get("LOCAL_RANK", "0") or 0)
    except ValueError:
        raise InvalidArgument(
            f"HOMAGG_METRICS_PORT={raw!r}: must be a TCP port (or LOCAL_RANK not an integer)"
        ) from None
    port = base + local if base else 0
    if not 0 <= port <= 65535:
        raise InvalidArgument(
            f"HOMAGG_METRICS_PORT={raw} + LOCAL_RANK={local}: port {port} "
            "is not 0..65535: choose a lower HOMAGG_METRICS_PORT"
        )
    try:
        m = WorkerMetrics(job, worker)
    except ImportError:
        raise InvalidArgument(
            "HOMAGG_METRICS_PORT is set but prometheus_client is not "
            "installed: pip install 'homagg[metrics]'"
        ) from None
    bind = env.get("HOMAGG_METRICS_BIND", "127.0.0.1")
    try:
        m.serve(port, bind)
    except OSError as e:
        raise InvalidArgument(f"HOMAGG_METRICS_PORT: cannot listen on {bind}:{port}: {e}") from None
    return m
