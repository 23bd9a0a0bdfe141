"""Prometheus metrics of homagg-switch daemons, read at scrape time.

``Collector`` turns each scrape into control requests to every daemon
(``stats``, and ``job_stats`` of each job: homagg.ops.source) and the
replies into metric families: nothing is cached, so the numbers are the
daemon's at that moment.  A daemon that does not answer is
``homagg_up{daemon=...} 0``, its other series are absent, and the others
are served as usual.  ``serve`` runs the HTTP endpoint (``homagg
exporter``: homagg.cli.exporter), ``start_for_testbed`` the exporter of
``homagg testbed up --metrics``.  docs/OPERATIONS.md lists every metric;
needs the ``metrics`` extra (``pip install 'homagg[metrics]'``).
"""

from __future__ import annotations

import logging
import sys
import threading

from homagg.ops.source import DaemonSnapshot, drop_reasons, snapshot

log = logging.getLogger("homagg.ops.exporter")

DEFAULT_PORT = 9477

# Engine counters (homagg/counters.h) that are not drop reasons, by metric
# name: homagg_<name>_total{daemon, job}.
EVENT_METRICS = {
    "received": ("frames_received", "frames handed to the engine"),
    "summed": ("frames_summed", "payloads combined into a slot"),
    "completed": ("slots_completed", "slots that reached W contributions"),
    "duplicates": ("duplicates", "frames of a worker already counted (retransmissions seen)"),
    "replays": ("replays", "results sent again to one worker"),
    "results_sent": ("results_sent", "result frames queued for transmission"),
    "status_sent": ("status_sent", "STATUS frames queued"),
    "status_repeats": ("status_repeats", "STATUS frames the group already had"),
    "incarnation_resets": ("incarnation_resets", "sets emptied by a worker's new incarnation"),
    "up_sent": ("up_sent", "tree leaf: partial sums sent up"),
    "up_retransmissions": ("up_retransmissions", "tree leaf: partial sums sent up again"),
    "up_resent_timer": ("up_resent_timer", "tree leaf: sent up again at their timer"),
    "up_resent_overtaken": (
        "up_resent_overtaken",
        "tree leaf: sent up again, overtaken by later sets' results",
    ),
    "up_resent_lacking": ("up_resent_lacking", "tree leaf: sent up again, a root STATUS lacked it"),
    "up_resent_worker": ("up_resent_worker", "tree leaf: sent up again for a worker's resend"),
    "up_results": ("up_results", "tree leaf: root results accepted"),
    "up_status": ("up_status", "tree leaf: STATUS frames from the root"),
    "up_abandoned": ("up_abandoned", "tree leaf: forwarded sets no longer resent"),
    "up_root_restarts": ("up_root_restarts", "tree leaf: root incarnation changes"),
    "up_reports": ("up_reports", "tree leaf: reports of its missing workers sent up"),
    "leaf_reports": ("leaf_reports", "tree root: leaf reports of missing workers taken"),
}

WORKER_METRICS = {
    "summed": ("worker_frames_summed", "payloads of the worker combined into a slot"),
    "duplicates": ("worker_duplicates", "frames of a chunk the worker already counted"),
    "retransmissions": ("worker_retransmissions", "frames the worker flagged RETRANS"),
    "dropped": ("worker_frames_dropped", "frames of the worker dropped by the set logic"),
}

# The job label of what no registered job accounts for: frames dropped
# before their job was known (unknown_job, bad_csum, ...) and the counts of
# jobs removed since.  Summed over job, every counter is the daemon's.
NO_JOB = ""


class Collector:
    """A prometheus_client collector over daemons {name: socket path}."""

    def __init__(self, daemons: dict, timeout: float = 2.0):
        self.daemons = dict(daemons)
        self.timeout = timeout
        self._busy_prev: dict = {}  # (daemon, lcore) -> (engine_ns, busy_ns)
        self._rest: dict = {}  # (daemon, counter) -> (total, rest served)
        self._lock = threading.Lock()

    def describe(self):
        return []  # collected at scrape time only (no registration probe)

    def snapshots(self) -> list[DaemonSnapshot]:
        return [snapshot(n, p, self.timeout) for n, p in self.daemons.items()]

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snaps = self.snapshots()
        up = GaugeMetricFamily(
            "homagg_up", "1: the daemon answered on its control socket", labels=["daemon"]
        )
        for s in snaps:
            up.add_metric([s.name], 1 if s.up else 0)
            if not s.up:
                log.warning("daemon %s (%s): %s", s.name, s.path, s.error)
        yield up
        live = [s for s in snaps if s.up]

        def counter(name, doc, labels):
            return CounterMetricFamily(f"homagg_{name}", doc, labels=labels)

        def gauge(name, doc, labels):
            return GaugeMetricFamily(f"homagg_{name}", doc, labels=labels)

        events = {k: counter(m, d, ["daemon", "job"]) for k, (m, d) in EVENT_METRICS.items()}
        dropped = counter(
            "frames_dropped",
            "frames dropped, by reason (homagg/counters.h); "
            'job "": before their job was known, or of jobs since removed',
            ["daemon", "job", "reason"],
        )
        for s in live:
            for key, fam in events.items():
                for job, v in self._job_split(s, key):
                    fam.add_metric([s.name, job], v)
            for reason in drop_reasons(s.stats):
                for job, v in self._job_split(s, reason):
                    dropped.add_metric([s.name, job, reason], v)
        yield from events.values()
        yield dropped

        wfams = {
            k: counter(m, d, ["daemon", "job", "worker"]) for k, (m, d) in WORKER_METRICS.items()
        }
        jobs = gauge("jobs", "jobs registered", ["daemon"])
        jw = gauge("job_workers", "W of the job", ["daemon", "job"])
        js = gauge(
            "job_slots", "S of the job: slots (chunks in flight per worker)", ["daemon", "job"]
        )
        jo = gauge(
            "job_slots_in_use", "sets holding a chunk not answered yet (0..2 S)", ["daemon", "job"]
        )
        jf = gauge(
            "job_frames_in_flight_max",
            "W x S: the job's share of the receive ring",
            ["daemon", "job"],
        )
        ji = gauge(
            "job_incarnation",
            "the job's incarnation (changes when it is registered afresh)",
            ["daemon", "job"],
        )
        for s in live:
            jobs.add_metric([s.name], len(s.jobs))
            for j in s.jobs:
                lab = [s.name, str(j.job)]
                jw.add_metric(lab, j.workers)
                js.add_metric(lab, j.slots)
                jo.add_metric(lab, j.sets_open)
                jf.add_metric(lab, j.workers * j.slots)
                ji.add_metric(lab, j.incarnation)
                for key, fam in wfams.items():
                    for w, v in enumerate(j.worker_counters.get(key, [])):
                        fam.add_metric([*lab, str(w)], v)
        yield from wfams.values()
        yield from (jobs, jw, js, jo, jf, ji)

        ring = gauge(
            "rx_ring_frames",
            "frames the receive ring holds (the limit of the jobs' W x S summed)",
            ["daemon"],
        )
        busy = counter(
            "engine_busy_seconds",
            "time each engine lcore spent in polls that received frames",
            ["daemon", "lcore"],
        )
        run = counter(
            "engine_seconds", "time since each engine lcore's loop started", ["daemon", "lcore"]
        )
        ratio = gauge(
            "engine_busy_ratio",
            "busy fraction of each engine lcore since "
            "the previous scrape (since the start at the first)",
            ["daemon", "lcore"],
        )
        port = {}
        for s in live:
            ring.add_metric([s.name], s.rx_ring)
            for i, (t, b) in enumerate(zip(s.engine_ns, s.engine_busy_ns)):
                lab = [s.name, str(i)]
                busy.add_metric(lab, b / 1e9)
                run.add_metric(lab, t / 1e9)
                ratio.add_metric(lab, self._ratio((s.name, i), t, b))
            for k, v in s.port.items():
                if k not in port:
                    port[k] = counter(f"port_{k}", f"port counter {k} (docs/SWITCH.md)", ["daemon"])
                port[k].add_metric([s.name], v)
        yield from (ring, busy, run, ratio)
        yield from port.values()

    def _job_split(self, snap: DaemonSnapshot, name: str):
        """(job label, value) of engine counter ``name``: each job's, then the
        rest of the daemon's total under NO_JOB.

        ``stats`` is read before the jobs' ``job_stats``, so during traffic
        the jobs' counts may already hold frames the total does not: the
        rest computed then is at most the true one.  The series keeps the
        largest value it served (a counter never goes down), which is
        still at most the true rest; a total that went down means the
        daemon restarted, and the series starts over with it."""
        total = snap.stats.get(name, 0)
        rest = total
        for j in snap.jobs:
            v = j.counters.get(name, 0)
            rest -= v
            yield str(j.job), v
        key = (snap.name, name)
        with self._lock:
            last_total, last_rest = self._rest.get(key, (0, 0))
            if total >= last_total:
                rest = max(rest, last_rest)
            rest = max(rest, 0)
            self._rest[key] = (total, rest)
        yield NO_JOB, rest

    def _ratio(self, key, t, b) -> float:
        with self._lock:
            t0, b0 = self._busy_prev.get(key, (0, 0))
            if t < t0:  # the daemon restarted
                t0, b0 = 0, 0
            self._busy_prev[key] = (t, b)
        return (b - b0) / (t - t0) if t > t0 else 0.0


def serve(daemons: dict, port: int, bind: str, timeout: float = 2.0):
    """Start the HTTP server in a thread; returns (server, registry)."""
    from prometheus_client import CollectorRegistry, start_http_server

    reg = CollectorRegistry(auto_describe=False)
    reg.register(Collector(daemons, timeout))
    server, _thread = start_http_server(port, addr=bind, registry=reg)
    return server, reg


def start_for_testbed(tb, port: int, bind: str = "127.0.0.1", timeout: float = 20.0) -> dict:
    """``homagg testbed up --metrics PORT``: an exporter over the testbed's
    daemons, in the caller's namespace (so PORT is this machine's), started
    with the testbed's ``run_in`` so ``homagg testbed down`` stops it by
    PID.  Returns its record ({"pid", "url", "log"}), also kept in the state
    file under "exporter"; HomAggError (with its log) when it does not serve
    within ``timeout`` seconds."""
    import os
    import subprocess
    import time

    from homagg.errors import HomAggError

    daemons = tb.state().get("daemons", {})
    if not daemons:
        raise HomAggError(
            f"testbed {tb.name}: --metrics needs the testbed's daemons (drop --no-daemon)"
        )
    argv = [sys.executable, "-m", "homagg.cli", "exporter", "--port", str(port), "--bind", bind]
    for host, rec in daemons.items():
        argv += ["--socket", f"{host}={rec['control']}"]
    path = os.path.join(tb.files_dir, "exporter.log")
    with open(path, "wb") as logf:
        proc = tb.run_in(None, argv, stdout=logf, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    url = None
    while url is None:
        with open(path, errors="replace") as f:
            for line in f:
                if line.startswith("homagg exporter: http://"):
                    url = line.split()[2]
        if url:
            break
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.stop()
            with open(path, errors="replace") as f:
                tail = f.read()[-800:]
            raise HomAggError(
                f"testbed {tb.name}: homagg exporter did not start on "
                f"{bind}:{port}: {tail.strip() or 'no output'}"
            )
        time.sleep(0.05)
    rec = {"pid": proc.pid, "url": url, "log": path}
    tb.note(exporter=rec)
    return rec
