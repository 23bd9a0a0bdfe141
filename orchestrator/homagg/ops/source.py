"""One snapshot of a homagg-switch daemon, read over its control socket.

``snapshot(name, path)`` sends ``stats`` and then ``job_stats`` for every job
``stats`` lists (docs/SWITCH.md "Control socket").  A daemon that does not
answer gives a snapshot with ``up`` False and the reason in ``error``: the
callers (the exporter, ``homagg top``) report it and go on with the others.
"""

from __future__ import annotations

import dataclasses
import errno
import time

from homagg.switch.control import ControlClient, ControlError
from homagg.errors import HomAggError

# Engine counters (homagg/counters.h) that count events, not dropped frames;
# every other counter is a drop reason.
NOT_DROPS = frozenset(
    {
        "received",
        "summed",
        "completed",
        "duplicates",
        "replays",
        "results_sent",
        "status_sent",
        "status_repeats",
        "incarnation_resets",
        "up_sent",
        "up_retransmissions",
        "up_resent_timer",
        "up_resent_overtaken",
        "up_resent_lacking",
        "up_resent_worker",
        "up_results",
        "up_status",
        "up_abandoned",
        "up_root_restarts",
        "up_reports",
        "leaf_reports",
    }
)


def drop_reasons(counters: dict) -> dict:
    """The drop-reason counters of an engine counter dict."""
    return {k: v for k, v in counters.items() if k not in NOT_DROPS}


@dataclasses.dataclass
class JobSnapshot:
    job: int
    workers: int
    slots: int
    payload: int
    incarnation: int
    shard: int
    sets_open: int
    counters: dict  # engine counters of the job, by name
    worker_counters: dict  # {name: [value of worker 0, 1, ...]}


@dataclasses.dataclass
class DaemonSnapshot:
    name: str
    path: str
    t: float  # time.monotonic() of the reading
    up: bool = False
    error: str = ""
    stats: dict = dataclasses.field(default_factory=dict)  # engine counters
    port: dict = dataclasses.field(default_factory=dict)  # port counters
    engines: int = 0
    rx_ring: int = 0
    engine_ns: list = dataclasses.field(default_factory=list)
    engine_busy_ns: list = dataclasses.field(default_factory=list)
    jobs: list = dataclasses.field(default_factory=list)  # JobSnapshot


def snapshot(name: str, path: str, timeout: float = 2.0) -> DaemonSnapshot:
    """Read daemon ``name`` at control socket ``path``; never raises for a
    daemon that is gone, refuses or answers badly (``up`` False)."""

    def read(_):
        with ControlClient(str(path), timeout=timeout) as c:
            return read_with(name, path, c.request)

    return _guarded(name, path, read)


def read_with(name: str, path: str, request) -> DaemonSnapshot:
    """A snapshot through ``request(cmd, **fields)`` (a reply dict, or a
    HomAggError for an error reply: ControlClient.request, or a request
    over SSH); raises what it raises."""
    snap = DaemonSnapshot(name=name, path=str(path), t=time.monotonic())
    st = request("stats")
    for job in st.get("jobs", []):
        try:
            js = request("job_stats", job=job)
        except ControlError as e:
            if e.code == -errno.ENOENT:
                continue  # removed between the two requests
            raise
        snap.jobs.append(
            JobSnapshot(
                job=int(job),
                workers=js["workers"],
                slots=js["slots"],
                payload=js["payload"],
                incarnation=js["incarnation"],
                shard=js["shard"],
                sets_open=js["sets_open"],
                counters=js["counters"],
                worker_counters=js["worker_counters"],
            )
        )
    snap.t = time.monotonic()
    snap.up = True
    snap.stats = st.get("stats", {})
    snap.port = st.get("port", {})
    snap.engines = int(st.get("engines", 0))
    snap.rx_ring = int(st.get("rx_ring", 0))
    snap.engine_ns = list(st.get("engine_ns", []))
    snap.engine_busy_ns = list(st.get("engine_busy_ns", []))
    return snap


def _guarded(name, path, read) -> DaemonSnapshot:
    try:
        return read(None)
    except (HomAggError, OSError, KeyError, TypeError, ValueError) as e:
        snap = DaemonSnapshot(name=name, path=str(path), t=time.monotonic())
        snap.error = f"{type(e).__name__}: {e}"
        return snap


def guarded(name: str, path: str, request) -> DaemonSnapshot:
    """read_with, a failure turned into a snapshot with ``up`` False."""
    return _guarded(name, path, lambda _: read_with(name, path, request))


def parse_socket_arg(spec: str) -> tuple[str, str]:
    """``NAME=PATH`` or ``PATH`` (named by itself) -> (name, path)."""
    name, sep, path = spec.partition("=")
    if sep and name and path and "/" not in name:
        return name, path
    return spec, spec
