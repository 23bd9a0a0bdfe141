"""Allreduce time on the local testbed: HomAgg methods next to Gloo ring all-reduce.

Needs root: it builds a testbed (homagg.deploy.local.testbed: one namespace per host,
a bridge, tc-shaped veth links at --link-mbit), runs every method there,
and tears the testbed down; with several --link-mbit rates (a sweep, e.g.
100,1000,2500,10000) one testbed per rate.  Per (W, link rate, method,
workload, density):

- the time of one allreduce over --repeat runs after --warmup untimed ones
  by the same processes (HomAgg: one ``homagg run`` with repeat/warmup, the
  same workers and daemon; the slowest worker's time of each run; Gloo: the
  slowest rank's time of each all_reduce): median, min and max;
- algorithm bandwidth 4n / median time, and bytes on the wire per worker
  (the kernel's tx bytes of the worker's interface, per allreduce);
- speedup_vs_gloo: Gloo's median / the method's median, both measured in
  this invocation on the same testbed, workload and density;
- exact: HomAgg's exact methods bit for bit against the fixed-point
  reference on every worker (checked by ``homagg run allreduce``); nc is
  lossy by design (None); Gloo: the float32 result against the float64 sum
  within the float32 summation bound;
- cpu_bound: Gloo: the ranks' process CPU time over the timed calls vs
  their wall time (flagged when the ranks together kept more than 80 % of
  the machine's cores busy, or one rank more than 90 % of a core, i.e. the
  run measured the CPU rather than the links); HomAgg: the same from the
  workers' CPU seconds plus the homagg-switch daemon's (``homagg run``'s
  "worker_cpu_seconds" and "daemon_cpu_seconds": the daemon shares the
  machine's cores with the workers), else None; also flagged when the
  whole machine was more than 80 % busy over the timed calls
  (machine_busy: the kernel's packet processing for the testbed's links
  runs outside these processes); link_utilisation (bytes x 8 / time /
  link rate) and link_bound (utilisation >= 0.5) for every row;
  worker_cpu_seconds (mean over workers) and daemon_cpu_seconds per
  allreduce;
- HomAgg: the workers' retransmission timer expiries, spurious ones, fast
  retransmissions and all retransmissions per allreduce, summed over the
  workers (timeouts_per_allreduce, ...; Gloo: None, TCP repairs its own).

The baseline: torch.distributed with the Gloo backend, one process per
worker namespace (homagg.bench.gloo_worker, started with the testbed's
run_in and stopped by PID), rendezvous over TCP at worker 0's address
inside the testbed.  torch: ``pip install torch==2.13.0`` (the ``bench``
extra).  HomAgg methods run through ``homagg run allreduce`` (its Python
function homagg.runs.allreduce.run_allreduce); where that is missing or fails, the row
says ``unavailable: <reason>`` / ``failed: <reason>`` and carries no numbers.

--payload-bytes 1024,4096,8192 runs every HomAgg method once per job
payload size (rows carry ``payload_bytes`` and ``mtu``).  Payloads an MTU
of 1500 holds run on a testbed with MTU 1500 links; larger ones (jumbo
frames) on a second testbed with MTU 9000 links, where Gloo runs again:
each row's speedup_vs_gloo is against Gloo on links of its own MTU (TCP
gains from jumbo frames too).  Every HomAgg row also reports
``cpu_ms_per_mb``: the workers' and the daemon's CPU time per MB the
workers put on their links (median over the runs), and every row
``machine_busy``: the fraction of all the machine's cores busy during the
timed calls (the testbed's kernel networking and every other process on
the host included; near 1: the run measured the CPU, not the links).

--pipeline-groups 0,1 runs every pipelined method (all of them; auto
chooses per group) once per value of the job option pipeline_groups (0
automatic block groups, 1 not pipelined, N groups; docs/PROTOCOL.md
"Pipelined block groups"), one right after the other on the same testbed;
rows carry ``pipeline_groups`` and, next to a row with 1,
``speedup_vs_unpipelined`` (its median / this row's).  Gloo runs once.

Workloads (homagg.bench.workloads): shared, random, zipf, dense.  The Gloo
ranks generate them with homagg.bench.workloads; HomAgg's workers generate
theirs inside ``homagg run`` (homagg.runs.job.gradient, which calls the same
generator), recorded per row as ``generator``.

Outputs with --out DIR: allreduce.json/.csv/.md and allreduce_time.png,
allreduce_speedup.png (vs density, one panel per workload), and
allreduce_workers.png (speedup vs W), at 1000 Mbit/s (else the first rate);
with several rates allreduce_linkrate.png (speedup vs link rate).  --json
prints the report.
"""

import json
import os
import platform
import secrets
import subprocess
import sys
import time

import numpy as np

from homagg import auth as _auth
from homagg.bench import report as rep
from homagg.bench import workloads
from homagg.protocol import AUTO_CANDIDATES, EXACT_METHODS, PIPELINE_GROUPS, PIPELINED_METHODS
from homagg.protocol import METHODS as HOMAGG_METHODS

METHODS = ("gloo",) + HOMAGG_METHODS
GLOO_PORT = 29511
CPU_BOUND_MACHINE = 0.8
CPU_BOUND_RANK = 0.9
LINK_BOUND = 0.5  # link_bound: the median run kept the link at least half busy


def _list(conv):
    def parse(text):
        return [conv(v) for v in text.split(",") if v.strip()]

    return parse


def add_arguments(parser):
    parser.add_argument(
        "--methods",
        type=_list(str),
        default=list(METHODS),
        help=f"comma-separated (default {','.join(METHODS)})",
    )
    parser.add_argument(
        "--workloads",
        type=_list(str),
        default=list(workloads.WORKLOADS),
        help=f"comma-separated (default {','.join(workloads.WORKLOADS)})",
    )
    parser.add_argument(
        "--workers",
        type=_list(int),
        default=[4],
        help="comma-separated worker counts, one testbed each (default 4)",
    )
    parser.add_argument(
        "--elements", type=int, default=2**20, help="float32 elements per worker (default 2^20)"
    )
    parser.add_argument(
        "--densities",
        type=_list(float),
        default=[0.001, 0.01, 0.1],
        help="comma-separated non-zero fractions (default 0.001,0.01,0.1; "
        "the dense workload runs once at 1)",
    )
    parser.add_argument(
        "--link-mbit",
        type=_list(float),
        default=[1000.0],
        help="comma-separated rates of every worker link, both directions, "
        "one testbed each: a link-rate sweep, e.g. 100,1000,2500,10000 "
        "(default 1000)",
    )
    parser.add_argument(
        "--payload-bytes",
        type=_list(int),
        default=None,
        metavar="B[,B...]",
        help="HomAgg job payload bytes per packet, a multiple of 4 up to 8192 "
        "(default: the largest MTU 1500 carries, 1424; several: rows for each; "
        "payloads above what MTU 1500 holds run on a second testbed with MTU 9000 "
        "links, Gloo too)",
    )
    parser.add_argument(
        "--pipeline-groups",
        type=_list(int),
        default=[PIPELINE_GROUPS],
        metavar="N[,N...]",
        help="block groups of the pipelined methods (all; auto chooses per group): 0 "
        "automatic, 1 not pipelined, N groups; several: rows for each, with "
        f"speedup_vs_unpipelined next to 1 (default {PIPELINE_GROUPS})",
    )
    parser.add_argument("--repeat", type=int, default=5, help="timed runs (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first (default 1)")
    parser.add_argument("--seed", type=int, default=1, help="gradient seed")
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="give-up time of one allreduce, seconds (default 30)",
    )
    parser.add_argument(
        "--testbed-name",
        default="bench",
        help="name of the testbed this benchmark builds and removes (default bench)",
    )
    parser.add_argument("--state-dir", default=None, help="testbed state directory")
    parser.add_argument(
        "--auth",
        action="store_true",
        help="also run every HomAgg method with per-worker authentication "
        "(rows METHOD+auth, with time_vs_unauthenticated)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="with --auth: measure each method without and with authentication "
        "this many times, alternating, and give time_vs_unauthenticated as the "
        "median of the rounds' ratios (time_vs_unauthenticated_rounds: each "
        "round's); the rows' other figures are the first round's (default 1)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    parser.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="write allreduce.json/.csv/.md and the plots into DIR",
    )


def _progress(msg):
    rep.progress("allreduce", msg)


def auth_rounds(again, plain_row, rounds, key=""):
    """The +auth row of a method whose row without authentication is
    ``plain_row``: ``again(auth)`` measures one row; the first authenticated
    row follows ``plain_row``, then ``rounds - 1`` more pairs alternate,
    without then with.  ``time_vs_unauthenticated`` is the median of the
    rounds' ratios (a ratio of two rows measured one after the other; a
    failed row gives none), ``time_vs_unauthenticated_rounds`` each
    round's when there are several; the row's other figures are its first
    round's."""

    def ratio(plain, authed):
        a, b = plain.get("seconds_median"), authed.get("seconds_median")
        return b / a if a and b else None

    row = again(True)
    ratios = [ratio(plain_row, row)]
    for r in range(1, rounds):
        plain = again(False)
        ratios.append(ratio(plain, again(True)))
        x = ratios[-1]
        _progress(
            f"{key}: round {r + 1} of {rounds}, time with auth over without "
            + ("-" if x is None else f"{x:.2f}x")
        )
    got = [x for x in ratios if x is not None]
    row["time_vs_unauthenticated"] = float(np.median(got)) if got else None
    if rounds > 1:
        row["time_vs_unauthenticated_rounds"] = ratios
    return row


# --------------------------------------------------------------------------
# Gloo


class GlooGroup:
    """W gloo_worker processes, one per worker namespace of the testbed."""

    def __init__(self, tb, timeout):
        self.tb = tb
        self.timeout = timeout
        self.procs = []
        hosts = tb.workers
        port = GLOO_PORT + secrets.randbelow(2000)
        init = f"tcp://{hosts[0].ip}:{port}"
        env = dict(os.environ, GLOO_SOCKET_IFNAME=hosts[0].ifname, OMP_NUM_THREADS="1")
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = pkg_root + (
            os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
        )
        try:
            for r, h in enumerate(hosts):
                argv = [
                    sys.executable,
                    "-m",
                    "homagg.bench.gloo_worker",
                    "--rank",
                    str(r),
                    "--world",
                    str(len(hosts)),
                    "--init",
                    init,
                    "--timeout",
                    str(timeout),
                ]
                self.procs.append(
                    tb.run_in(
                        h.name,
                        argv,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                        env=env,
                    )
                )
            for h, p in zip(hosts, self.procs):
                line = p.readline(timeout + 60)
                if not line.startswith("{"):
                    raise RuntimeError(
                        f"gloo rank on {h.name} did not start: {line!r} {self._stderr(p)}"
                    )
                self.torch_version = json.loads(line).get("torch")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _stderr(p):
        if p.poll() is None:
            return ""
        return p.popen.stderr.read()[-800:]

    def run(self, job):
        """One job on every rank; returns the per-rank answers and bytes."""
        hosts = self.tb.workers
        before = [self.tb.link_stats(h.name) for h in hosts]
        line = json.dumps(job) + "\n"
        for p in self.procs:
            p.popen.stdin.write(line)
            p.popen.stdin.flush()
        answers = []
        budget = self.timeout * (job["repeat"] + job["warmup"]) + 60
        for h, p in zip(hosts, self.procs):
            out = p.readline(budget)
            if not out:
                raise RuntimeError(f"gloo rank on {h.name}: no answer {self._stderr(p)}")
            a = json.loads(out)
            if "error" in a:
                raise RuntimeError(f"gloo rank on {h.name}: {a['error']}")
            answers.append(a)
        after = [self.tb.link_stats(h.name) for h in hosts]
        calls = job["repeat"] + job["warmup"]
        tx = [(b["tx_bytes"] - a["tx_bytes"]) / calls for a, b in zip(before, after)]
        return answers, tx

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.popen.stdin.write("quit\n")
                    p.popen.stdin.flush()
                    p.wait(10)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            p.stop()
        self.procs = []


def gloo_row(group, W, n, workload, density, link_mbit, args, gradient_files=None):
    job = {
        "workload": workload,
        "elements": n,
        "density": density,
        "seed": args.seed,
        "repeat": args.repeat,
        "warmup": args.warmup,
        "gradient_files": gradient_files,
    }
    answers, tx = group.run(job)
    per_call = np.max([a["seconds"] for a in answers], axis=0)  # slowest rank per call
    wall = float(np.sum(per_call))
    row = _timing(per_call, n, link_mbit, float(np.mean(tx)))
    row.update(_cpu_fields([a["cpu_seconds"] for a in answers], wall, W))
    _machine_bound(row, answers[0].get("machine_cpu"))
    row.update(
        {
            "worker_cpu_seconds": [a["cpu_seconds"] / args.repeat for a in answers],
            "daemon_cpu_seconds": None,
            "machine_busy": _busy(answers[0].get("machine_cpu")),
        }
    )
    # TCP repairs Gloo's losses itself: no client counters
    row.update({f"{k}_per_allreduce": None for k in WORKER_COUNTERS})
    row.update(
        {
            "exact": all(a["within_tolerance"] for a in answers),
            "exact_kind": "float64 sum within float32 bound",
            "max_abs_error": max(a["max_abs_error"] for a in answers),
            "generator": "homagg.bench.workloads",
            "status": "ok",
        }
    )
    return row


def _cpu_bound(machine_busy, rank_busy):
    return bool(machine_busy > CPU_BOUND_MACHINE or rank_busy > CPU_BOUND_RANK)


def _cpu_fields(cpu, wall, W, daemon=None):
    """cpu: per worker CPU seconds over wall seconds of timed calls; daemon:
    the aggregator daemon's CPU seconds over the same calls (HomAgg), which
    runs on the same machine: it counts toward the machine's busy fraction
    (over min(cores, W + 1) cores) and, as one more process, toward the
    busiest process."""
    if not cpu or not wall or wall <= 0:
        return {
            "cpu_fraction_machine": None,
            "cpu_fraction_rank_max": None,
            "cpu_fraction_daemon": None,
            "cpu_bound": None,
        }
    procs = list(cpu) + ([daemon] if daemon is not None else [])
    machine_busy = sum(procs) / (wall * min(os.cpu_count() or 1, len(procs)))
    rank_busy = max(c / wall for c in procs)
    return {
        "cpu_fraction_machine": machine_busy,
        "cpu_fraction_rank_max": rank_busy,
        "cpu_fraction_daemon": daemon / wall if daemon is not None else None,
        "cpu_bound": _cpu_bound(machine_busy, rank_busy),
    }


def _timing(seconds, n, link_mbit, bytes_per_worker):
    s = np.asarray(seconds, dtype=np.float64)
    med = float(np.median(s))
    out = {
        "seconds_median": med,
        "seconds_min": float(s.min()),
        "seconds_max": float(s.max()),
        "seconds_q1": float(np.percentile(s, 25)),
        "seconds_q3": float(np.percentile(s, 75)),
        "runs": int(s.size),
        "algbw_gbps": 8 * 4 * n / med / 1e9 if med > 0 else None,
        "bytes_per_worker": bytes_per_worker,
        "link_utilisation": (
            8 * bytes_per_worker / med / (link_mbit * 1e6) if med > 0 and link_mbit else None
        ),
    }
    out["link_bound"] = (
        out["link_utilisation"] >= LINK_BOUND if out["link_utilisation"] is not None else None
    )
    return out


# --------------------------------------------------------------------------
# HomAgg methods, through `homagg run allreduce`


def homagg_run_available():
    """(True, None) when `homagg run allreduce` can be called, else (False, why)."""
    try:
        from homagg.runs import allreduce as _run  # noqa: F401
    except ImportError as exc:
        return False, f"homagg run allreduce is not in this build ({exc})"
    if not hasattr(_run, "run_allreduce"):
        return False, "homagg.runs.allreduce has no run_allreduce"
    return True, None


def homagg_via_run_allreduce(
    testbed_name,
    method,
    n,
    workload,
    density,
    args,
    payload=1024,
    auth=False,
    pipeline_groups=PIPELINE_GROUPS,
    shared=None,
):
    """One HomAgg allreduce on the testbed, by homagg.runs.allreduce.run_allreduce (the
    function behind `homagg run allreduce --testbed NAME`); returns its report.
    ``shared``: run_allreduce's gradient_files / expect, what every method
    of a case shares (Case)."""
    from homagg.runs import allreduce as hrun
    from homagg.runs import job

    if workload in job.WORKLOADS:
        run_workload, run_density = workload, density  # the same generator as the Gloo ranks
    else:
        run_workload, run_density = ("shared", 1.0) if workload == "dense" else (workload, density)
    return hrun.run_allreduce(
        testbed_name,
        method,
        n,
        run_density,
        workload=run_workload,
        seed=args.seed,
        timeout=args.timeout,
        state_dir=args.state_dir,
        repeat=args.repeat,
        warmup=args.warmup,
        payload=payload,
        auth=auth,
        pipeline_groups=pipeline_groups,
        **(shared or {}),
    )


def homagg_row(
    testbed_name,
    method,
    W,
    n,
    workload,
    density,
    link_mbit,
    args,
    payload=1024,
    auth=False,
    pipeline_groups=PIPELINE_GROUPS,
    shared=None,
):
    """One row: --warmup untimed and --repeat timed allreduces by the same
    worker processes and daemon (homagg run's repeat/warmup), checked bit
    for bit once (every call sums the same gradients)."""
    ok, why = homagg_run_available()
    if not ok:
        return {"status": f"unavailable: {why}"}
    try:
        r = homagg_via_run_allreduce(
            testbed_name,
            method,
            n,
            workload,
            density,
            args,
            payload=payload,
            auth=auth,
            pipeline_groups=pipeline_groups,
            shared=shared,
        )
    except Exception as exc:  # a failed method is a result, not a crash of the whole run
        return {"status": f"failed: {type(exc).__name__}: {exc}"[:500]}
    seconds = r["seconds_each"]
    row = _timing(seconds, n, link_mbit, float(np.mean(r["bytes_per_worker"])))
    calls = len(seconds)
    cpu = r.get("worker_cpu_seconds")  # per worker, per call
    daemon = r.get("daemon_cpu_seconds")  # per call
    row.update(
        _cpu_fields(
            [c * calls for c in cpu] if cpu else None,
            float(np.sum(seconds)),
            W,
            daemon=daemon * calls if daemon is not None else None,
        )
    )
    _machine_bound(row, r.get("machine_cpu"))
    row.update(_worker_counters(r["worker_stats_timed"], calls))
    row.update(
        {
            # per worker: CPU seconds of one allreduce (mean over the timed calls)
            "worker_cpu_seconds": [float(c) for c in cpu] if cpu else None,
            "daemon_cpu_seconds": daemon,
            "exact": (
                None if method not in EXACT_METHODS else r["exact"] is True and r["workers_agree"]
            ),
            "exact_kind": (
                "bit-exact vs fixed-point reference"
                if method in EXACT_METHODS
                else "lossy by design"
            ),
            "workers_agree": r["workers_agree"],
            "generator": r.get("generator", "homagg.runs.job.gradient"),
            "payload_bytes": payload,
            "udp_gso": r.get("udp_gso"),
            "pipeline_groups": pipeline_groups if method in PIPELINED_METHODS else None,
            # auto: the block groups that chose each method (the last call; one
            # group without pipelining)
            "auto_groups": (
                {m: r["worker_stats"][0].get(f"auto_{m}_groups") for m in AUTO_CANDIDATES}
                if method == "auto"
                else None
            ),
            "cpu_ms_per_mb": _cpu_ms_per_mb(r),
            "machine_busy": _busy(r.get("machine_cpu")),
            "status": "ok",
        }
    )
    return row


def _busy(machine):
    """The busy fraction of homagg.runs.job.machine_busy's answer (None: not measured)."""
    return machine.get("busy") if machine else None


def _machine_bound(row, machine):
    """cpu_bound also when the whole machine was busy over the timed calls."""
    busy = _busy(machine)
    if busy is not None and busy > CPU_BOUND_MACHINE:
        row["cpu_bound"] = True


def _cpu_ms_per_mb(r):
    """The workers' and the daemon's CPU ms per MB the workers sent, per
    allreduce (None when a CPU time is unknown)."""
    moved = sum(r["bytes_per_worker"])
    if not r.get("worker_cpu_seconds") or r.get("daemon_cpu_seconds") is None or moved <= 0:
        return None
    return 1e3 * (sum(r["worker_cpu_seconds"]) + r["daemon_cpu_seconds"]) / (moved / 1e6)


WORKER_COUNTERS = ("timeouts", "spurious_timeouts", "fast_retransmissions", "retransmissions")


def _worker_counters(stats, calls):
    """Per allreduce, summed over the workers: the client's timer expiries,
    the spurious ones, fast retransmissions and all retransmissions."""
    return {f"{k}_per_allreduce": sum(s.get(k, 0) for s in stats) / calls for k in WORKER_COUNTERS}


# --------------------------------------------------------------------------


def _start_daemons(tb, args):
    """homagg-switch on the testbed's aggregators for every HomAgg row on
    it (homagg.deploy.local.testbed_job.start, as `homagg testbed up`: each row's
    run_allreduce adds and removes its own job there); None, or the reason
    they did not start."""
    from homagg.deploy.local import testbed_job

    try:
        testbed_job.start(tb, timeout=args.timeout)
    except Exception as exc:
        why = f"failed: {type(exc).__name__}: {exc}"[:500]
        _progress(f"homagg-switch {why}")
        return why
    return None


class Case:
    """The gradients of one case (W, workload, density), built once for every
    method and link rate that runs it: written to files the HomAgg workers
    and the Gloo ranks load, and the expected results (bit-exact reference
    and float64 sum, homagg.runs.job.expected) the HomAgg rows are checked with.
    Holds the latest case only."""

    def __init__(self, args):
        self.args = args
        self.key = None
        self.dir = None
        self.files = None
        self.expect = None

    def prepare(self, W, workload, density, exact_check=True):
        """(gradient files, expected results or None) of this case."""
        import tempfile

        from homagg.runs import job

        key = (W, workload, density, exact_check)
        if key != self.key:
            self.close()
            a = self.args
            grads = [job.gradient(a.elements, density, workload, a.seed, w, W) for w in range(W)]
            self.dir = tempfile.mkdtemp(prefix="homagg-bench-grads-")
            self.files = job.save_gradients(self.dir, grads)
            self.expect = (
                job.expected(a.elements, density, workload, a.seed, job.DEFAULT_BLOCK, W, grads)
                if exact_check
                else None
            )
            self.key = key
        return self.files, self.expect

    def close(self):
        import shutil

        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        self.key = self.dir = self.files = self.expect = None


JUMBO_MTU = 9000


def mtu_groups(payloads):
    """The testbeds a list of payload sizes needs: [(MTU, payloads)], MTU
    1500 for those it holds, then MTU 9000 (jumbo frames) for the rest; in
    the order given within each."""
    from homagg.worker import max_payload

    small = [p for p in payloads if p <= max_payload(1500)]
    jumbo = [p for p in payloads if p > max_payload(1500)]
    return [(m, ps) for m, ps in ((1500, small), (JUMBO_MTU, jumbo)) if ps]


def _cases(args):
    for wl in args.workloads:
        for d in [1.0] if wl == "dense" else args.densities:
            yield wl, d


def run(args):
    case = Case(args)
    try:
        return _run(args, case)
    finally:
        case.close()


def _run(args, case):
    from homagg.deploy.local.testbed import Testbed, require_root

    bad = [m for m in args.methods if m not in METHODS]
    bad += [w for w in args.workloads if w not in workloads.WORKLOADS]
    if bad:
        raise SystemExit(f"unknown method(s)/workload(s): {bad}")
    if args.repeat < 1 or args.warmup < 0 or args.elements < 1:
        raise SystemExit("--repeat >= 1, --warmup >= 0, --elements >= 1")
    from homagg.worker import max_payload

    # unset: the largest payload the MTU 1500 links carry (docs/PROTOCOL.md
    # "The payload of a job")
    payloads = list(dict.fromkeys(args.payload_bytes or [])) or [max_payload(1500)]
    bad = [p for p in payloads if not 4 <= p <= 8192 or p % 4]
    if bad:
        raise SystemExit(f"--payload-bytes: multiples of 4 in 4..8192, got {bad}")
    groups = mtu_groups(payloads)
    pgs = list(dict.fromkeys(args.pipeline_groups)) or [PIPELINE_GROUPS]
    if any(g < 0 for g in pgs):
        raise SystemExit(f"--pipeline-groups: integers >= 0, got {pgs}")
    require_root("homagg bench allreduce")
    results = []
    torch_version = None
    homagg_methods = [m for m in args.methods if m != "gloo"]
    for W, link_mbit, (mtu, on_it) in (
        (W, r, g) for W in args.workers for r in args.link_mbit for g in groups
    ):
        name = args.testbed_name
        _progress(f"testbed {name}: {W} workers, links {link_mbit:g} Mbit/s, MTU {mtu}")
        tb = Testbed.up(name, W, link_mbit=link_mbit, state_dir=args.state_dir, mtu=mtu)
        try:
            no_daemon = _start_daemons(tb, args) if homagg_methods else None
            gloo = None
            if "gloo" in args.methods:
                try:
                    gloo = GlooGroup(tb, args.timeout)
                    torch_version = gloo.torch_version
                except Exception as exc:
                    gloo = f"unavailable: {type(exc).__name__}: {exc}"[:500]
                    _progress(f"gloo {gloo}")
            try:
                for wl, d in _cases(args):
                    base = {
                        "workers": W,
                        "link_mbit": link_mbit,
                        "elements": args.elements,
                        "workload": wl,
                        "density": d,
                        "mtu": mtu,
                    }
                    files, expect = case.prepare(W, wl, d, exact_check=bool(homagg_methods))
                    shared = {"gradient_files": files, "expect": expect}
                    rows = {}
                    for m in args.methods:
                        if m == "gloo":
                            if isinstance(gloo, str):
                                row = {"status": gloo}
                            else:
                                try:
                                    row = gloo_row(
                                        gloo,
                                        W,
                                        args.elements,
                                        wl,
                                        d,
                                        link_mbit,
                                        args,
                                        gradient_files=files,
                                    )
                                except Exception as exc:
                                    row = {"status": f"failed: {type(exc).__name__}: {exc}"[:500]}
                            rows[m] = {"method": m, **base, **row}
                            _progress(_line(rows[m]))
                            continue
                        for p, pg in (
                            (p, pg)
                            for p in on_it
                            for pg in (pgs if m in PIPELINED_METHODS else pgs[:1])
                        ):

                            def again(auth, m=m, p=p, pg=pg):
                                return homagg_row(
                                    name,
                                    m,
                                    W,
                                    args.elements,
                                    wl,
                                    d,
                                    link_mbit,
                                    args,
                                    payload=p,
                                    auth=auth,
                                    pipeline_groups=pg,
                                    shared=shared,
                                )

                            row = {"status": no_daemon} if no_daemon else again(False)
                            key = (m if len(on_it) == 1 else f"{m}@{p}") + (
                                f"/groups{pg}" if len(pgs) > 1 and m in PIPELINED_METHODS else ""
                            )
                            rows[key] = {"method": m, **base, **row}
                            _progress(_line(rows[key]))
                            if pg == pgs[-1] and len(pgs) > 1 and m in PIPELINED_METHODS:
                                _pipeline_ratios(rows, m, p, pgs, len(on_it) > 1)
                            if args.auth:
                                # the same allreduce with per-worker MACs, right after;
                                # with --rounds R, R pairs alternating
                                row = auth_rounds(again, rows[key], args.rounds, key)
                                rows[key + "+auth"] = {
                                    "method": m + "+auth",
                                    "auth": True,
                                    "mac": _auth.default_mac_name(),  # the local testbed's
                                    **base,
                                    **row,
                                }
                                _progress(_line(rows[key + "+auth"]))
                    g = rows.get("gloo", {}).get("seconds_median")
                    for r in rows.values():
                        s = r.get("seconds_median")
                        r["speedup_vs_gloo"] = g / s if g and s else None
                        results.append(r)
            finally:
                if gloo is not None and not isinstance(gloo, str):
                    gloo.close()
        finally:
            Testbed.down(name, state_dir=args.state_dir)  # stops its daemons too
            _progress(f"testbed {name} removed")
    return rep.header(
        benchmark="allreduce",
        link_mbit=args.link_mbit,
        elements=args.elements,
        payload_bytes=payloads,
        mtu=[m for m, _ in groups],
        repeat=args.repeat,
        warmup=args.warmup,
        seed=args.seed,
        _extra_versions=("torch", "pyroute2"),
        torch_runtime=torch_version,
        kernel=platform.release(),
        results=results,
    )


def _pipeline_ratios(rows, m, p, pgs, by_payload):
    """speedup_vs_unpipelined of the rows of method m at payload p: the
    median of its pipeline_groups=1 row / each row's (both of this run)."""

    def key(pg):
        return (f"{m}@{p}" if by_payload else m) + f"/groups{pg}"

    plain = rows.get(key(1), {}).get("seconds_median")
    for pg in pgs:
        s = rows[key(pg)].get("seconds_median")
        rows[key(pg)]["speedup_vs_unpipelined"] = plain / s if plain and s else None


def _line(r):
    head = (
        f"W={r['workers']} {r['link_mbit']:g} Mbit/s {r['method']:6s} {r['workload']:6s} "
        f"d={r['density']:<6g}"
    )
    if r.get("payload_bytes"):
        head += f" {r['payload_bytes']} B"
    if r.get("mtu") == JUMBO_MTU:
        head += f" MTU {JUMBO_MTU}"
    if r.get("pipeline_groups") is not None:
        head += f" groups {r['pipeline_groups']}"
    if r.get("status") != "ok":
        return f"{head} {r.get('status')}"
    line = (
        f"{head} median {r['seconds_median'] * 1e3:9.2f} ms "
        f"[{r['seconds_min'] * 1e3:.2f}..{r['seconds_max'] * 1e3:.2f}], "
        f"{r['bytes_per_worker'] / 1e6:.3f} MB/worker, "
        f"link {r['link_utilisation'] or 0:.0%}, exact {r['exact']}, "
        f"cpu_bound {r['cpu_bound']}"
        + (f", machine {r['machine_busy']:.0%} busy" if r.get("machine_busy") is not None else "")
        + (f", {r['cpu_ms_per_mb']:.2f} CPU ms/MB" if r.get("cpu_ms_per_mb") is not None else "")
    )
    if r.get("timeouts_per_allreduce") is not None:
        line += (
            f", timeouts {r['timeouts_per_allreduce']:g} "
            f"retrans {r['retransmissions_per_allreduce']:g} per allreduce"
        )
    return line


MD_COLUMNS = (
    "workers",
    "link_mbit",
    "workload",
    "density",
    "method",
    "payload_bytes",
    "mtu",
    "status",
    "seconds_median",
    "seconds_min",
    "seconds_max",
    "speedup_vs_gloo",
    "algbw_gbps",
    "bytes_per_worker",
    "link_utilisation",
    "worker_cpu_seconds",
    "daemon_cpu_seconds",
    "timeouts_per_allreduce",
    "retransmissions_per_allreduce",
    "exact",
    "cpu_bound",
    "cpu_ms_per_mb",
    "link_bound",
    "time_vs_unauthenticated",
    "pipeline_groups",
    "speedup_vs_unpipelined",
    "machine_busy",
)


def reference_rate(report):
    """The link rate of the density and worker plots: 1000 Mbit/s when it
    was measured, else the first."""
    rates = list(report["link_mbit"])
    return 1000.0 if 1000.0 in rates else rates[0]


def series(r, report):
    """A row's line in the plots: its method, with the payload when the
    report has several, and "MTU 9000" on jumbo links."""
    name = r["method"]
    if len(report.get("payload_bytes") or []) > 1 and r.get("payload_bytes"):
        name += f" {r['payload_bytes']} B"
    if r.get("mtu") == JUMBO_MTU:
        name += f" MTU {JUMBO_MTU}"
    return name


def _legend(ax) -> None:
    """A legend where the panel has lines, else a word on why it is empty.

    A run without Gloo rows (``--methods dense,auto``) has no speedup to
    draw; the panel says so instead of leaving a blank frame.
    """
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    else:
        ax.text(
            0.5,
            0.5,
            "no rows for this panel\n(speedups need the gloo method)",
            ha="center",
            va="center",
            transform=ax.transAxes,
            fontsize=8,
        )


def plot(report, out_dir):
    plt = rep.pyplot()
    rate = reference_rate(report)
    rows = [r for r in report["results"] if r.get("status") == "ok" and r["link_mbit"] == rate]
    paths = []
    wls = list(dict.fromkeys(r["workload"] for r in report["results"]))
    methods = list(dict.fromkeys(series(r, report) for r in report["results"]))
    wmax = max((r["workers"] for r in report["results"]), default=0)
    for key, fname, ylabel in (
        ("seconds_median", "allreduce_time.png", "allreduce time (s)"),
        ("speedup_vs_gloo", "allreduce_speedup.png", "speedup vs Gloo"),
    ):
        fig, axes = plt.subplots(
            1, max(1, len(wls)), figsize=(4.5 * max(1, len(wls)), 4), squeeze=False
        )
        for ax, wl in zip(axes[0], wls):
            for m in methods:
                rs = sorted(
                    (
                        r
                        for r in rows
                        if r["workload"] == wl
                        and series(r, report) == m
                        and r["workers"] == wmax
                        and r.get(key) is not None
                    ),
                    key=lambda r: r["density"],
                )
                if rs:
                    ax.plot([r["density"] for r in rs], [r[key] for r in rs], marker="o", label=m)
            ax.set_xscale("log")
            if key == "seconds_median":
                ax.set_yscale("log")
            ax.set_title(f"{wl}, W={wmax}")
            ax.set_xlabel("density")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
            _legend(ax)
        fig.suptitle(f"{report['elements']} float32, links {rate:g} Mbit/s")
        fig.tight_layout()
        p = os.path.join(out_dir, fname)
        fig.savefig(p, dpi=100)
        plt.close(fig)
        paths.append(p)
    fig, axes = plt.subplots(
        1, max(1, len(wls)), figsize=(4.5 * max(1, len(wls)), 4), squeeze=False
    )
    for ax, wl in zip(axes[0], wls):
        ds = sorted({r["density"] for r in rows if r["workload"] == wl})
        d = ds[len(ds) // 2] if ds else None
        for m in methods:
            rs = sorted(
                (
                    r
                    for r in rows
                    if r["workload"] == wl
                    and series(r, report) == m
                    and r["density"] == d
                    and r.get("speedup_vs_gloo") is not None
                ),
                key=lambda r: r["workers"],
            )
            if rs:
                ax.plot(
                    [r["workers"] for r in rs],
                    [r["speedup_vs_gloo"] for r in rs],
                    marker="o",
                    label=m,
                )
        ax.set_xscale("log", base=2)
        ax.set_title(f"{wl}, density {d}")
        ax.set_xlabel("workers W")
        ax.set_ylabel("speedup vs Gloo")
        ax.grid(True, which="both", alpha=0.3)
        _legend(ax)
    fig.tight_layout()
    p = os.path.join(out_dir, "allreduce_workers.png")
    fig.savefig(p, dpi=100)
    plt.close(fig)
    paths.append(p)
    if len(report["link_mbit"]) > 1:
        paths.append(plot_link_rates(report, out_dir))
    return paths


def plot_link_rates(report, out_dir):
    """allreduce_linkrate.png: speedup vs Gloo against the link rate, one
    panel per workload (its middle density, the most workers): where the
    links stop hiding the CPU, the speedup falls."""
    plt = rep.pyplot()
    rows = [
        r
        for r in report["results"]
        if r.get("status") == "ok"
        and r.get("speedup_vs_gloo") is not None
        and r["method"] != "gloo"
    ]
    wls = list(dict.fromkeys(r["workload"] for r in report["results"]))
    methods = list(dict.fromkeys(series(r, report) for r in rows))
    wmax = max((r["workers"] for r in report["results"]), default=0)
    fig, axes = plt.subplots(
        1, max(1, len(wls)), figsize=(4.5 * max(1, len(wls)), 4), squeeze=False
    )
    for ax, wl in zip(axes[0], wls):
        ds = sorted({r["density"] for r in rows if r["workload"] == wl})
        d = ds[len(ds) // 2] if ds else None
        for m in methods:
            rs = sorted(
                (
                    r
                    for r in rows
                    if r["workload"] == wl
                    and series(r, report) == m
                    and r["density"] == d
                    and r["workers"] == wmax
                ),
                key=lambda r: r["link_mbit"],
            )
            if rs:
                ax.plot(
                    [r["link_mbit"] / 1000 for r in rs],
                    [r["speedup_vs_gloo"] for r in rs],
                    marker="o",
                    label=m,
                )
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_title(f"{wl}, density {d}, W={wmax}")
        ax.set_xlabel("link rate (Gbit/s)")
        ax.set_ylabel("speedup vs Gloo")
        ax.grid(True, which="both", alpha=0.3)
        _legend(ax)
    fig.suptitle(f"{report['elements']} float32 per worker")
    fig.tight_layout()
    p = os.path.join(out_dir, "allreduce_linkrate.png")
    fig.savefig(p, dpi=100)
    plt.close(fig)
    return p


def main(args):
    from homagg.deploy.local.testbed import RootRequired

    if args.rounds > 1 and not args.auth:
        print(
            "homagg bench allreduce: --rounds alternates the runs without and with "
            "authentication: add --auth",
            file=sys.stderr,
        )
        return 2
    t0 = time.perf_counter()
    try:
        report = run(args)
    except RootRequired as exc:
        print(f"homagg bench allreduce: {exc}", file=sys.stderr)
        return 2
    report["seconds_total"] = time.perf_counter() - t0
    if args.out:
        paths = rep.write_outputs(
            args.out,
            "allreduce",
            report,
            MD_COLUMNS,
            "Allreduce on the local testbed: HomAgg vs Gloo",
        )
        paths = list(paths.values()) + plot(report, args.out)
        _progress("wrote " + ", ".join(paths))
    if args.json:
        json.dump(report, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    bad = [r for r in report["results"] if r.get("exact") is False]
    if bad:
        _progress(
            f"NOT EXACT: {[(r['workers'], r['method'], r['workload'], r['density']) for r in bad]}"
        )
        return 1
    return 0
