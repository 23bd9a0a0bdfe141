"""Measure this host's cost-model coefficients, per ISA path of the codec
(the layer below ``homagg calibrate``, homagg.cli.calibrate).

:func:`calibrate` times the codec's own calls (the same C functions a
worker runs) on a 2^20-element tensor and returns the coefficients of
docs/PROTOCOL.md "The cost model" in picoseconds, one set per ISA path this
CPU runs (``HOMAGG_CODEC_ISA`` forces each in turn); :func:`write` stores
them in the calibration file (homagg.cost.calibration_path), where a job
created on this host takes them from (homagg.cost.job_cost); workers never
read it for a job that registered a model.  It takes a few seconds.

What each coefficient times (CPU time of the thread, best of a few runs):
value_ps, quantise and dequantise per dense lane; bitmap_ps, a
bitmap-indexed block's candidate list and union decode per element (a
nearly empty tensor); lane_ps, union encode and decode per candidate above
that; probe_ps, a Bloom-indexed block's candidate test and decode per
element and probe; sbbf_ps, the same per element of a split-block filter
(at least 1: 0 would mean none); agg_pkt_ps, the engine's per-frame cost
(hg_bench_engine, 4 workers, 1 KB); pkt_ps, one 1 KB UDP datagram sent and
received on loopback by this process (kernel and Python call, so an upper
bound of the C worker's cost).

:func:`calibrate_port` (``homagg calibrate --testbed NAME``) replaces the
last two for the jobs of one local testbed: it times allreduces through
that testbed's veth, bridge and daemon port and fits them, with the round
trip, by homagg.cost.fit_port, then times the ring all-reduce (Gloo) on
the same path and fits its CPU by homagg.cost.fit_ring; :func:`add_port` puts the result into the
calibration's "ports" section.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import socket
import time

import numpy as np

from homagg import cost as _cost

ISAS = ("portable", "avx2", "avx512")
# Bloom options of docs/PROTOCOL.md "lhc: index": (bits per element, probes)
_BLOOM = ((8, 6), (12, 8), (16, 8), (20, 8), (24, 8))


def _best(fn, repeat):
    best = None
    for _ in range(max(1, repeat)):
        t0 = time.thread_time_ns()
        fn()
        dt = time.thread_time_ns() - t0
        best = dt if best is None else min(best, dt)
    return max(best, 1)


@contextlib.contextmanager
def environ(name, value):
    """$name set to ``value`` inside, then back to what it was (unset if
    it was)."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


@contextlib.contextmanager
def _isa_env(isa):
    """The codec forced onto one ISA path (HOMAGG_CODEC_ISA, read again),
    then back to the process's own."""
    from homagg.bindings import codec as _bc

    try:
        with environ("HOMAGG_CODEC_ISA", isa):
            _bc.codec_isa_reload()
            yield
    finally:  # the process's own path again, the variable restored first
        _bc.codec_isa_reload()


def _sparse(n, block, per_block, rng):
    """A tensor with exactly per_block non-zeros in every block."""
    x = np.zeros(n, np.float32)
    for b0 in range(0, n, block):
        ln = min(block, n - b0)
        pos = rng.choice(ln, size=min(per_block, ln), replace=False)
        x[b0 + pos] = rng.standard_normal(pos.size).astype(np.float32) + 2.0
    return x


def _union_time(params, x, repeat):
    """(CPU ns of set_index + encode_union + decode_union, plan info)."""
    from homagg import codec

    sc, codes, counts = codec.scan(params, x)
    plan = codec.plan_lhc(params, x.size, codes, counts)
    gindex = plan.encode_index(sc)
    out = np.empty_like(x)

    def run():
        p2 = codec.plan_lhc(params, x.size, codes, counts)
        p2.set_index(gindex)
        vals = p2.encode_union(sc)
        p2.decode_union(vals, out)

    plan.set_index(gindex)
    return _best(run, repeat), plan.info


def _plan_time(params, x, repeat):
    from homagg import codec

    _, codes, counts = codec.scan(params, x)
    return _best(lambda: codec.plan_lhc(params, x.size, codes, counts), repeat)


def measure_path(elements=1 << 20, repeat=3, block=4096) -> dict:
    """The element coefficients of the codec path in use (ps, ints)."""
    from homagg import codec

    rng = np.random.default_rng(1)
    n = max(block, elements // block * block)
    p = codec.Params(block_elements=block, workers=1)
    dense = rng.standard_normal(n).astype(np.float32)
    codes = codec.encode_exponents(p, dense)
    t_q = _best(lambda: codec.encode_values(p, dense, codes), repeat)
    lanes = codec.encode_values(p, dense, codes)
    t_d = _best(lambda: codec.decode_values(p, lanes, n, codes), repeat)
    value_ps = (t_q + t_d) * 1000 // n

    # bitmap blocks: a model that makes the bitmap certain (probes dear)
    bitmap_only = codec.Params(
        block_elements=block,
        workers=1,
        cost=_cost.Cost(link_mbit=1_000_000, probe_ps=_cost.MAX_ELEM_PS),
    )
    nearly_empty = _sparse(n, block, 1, rng)
    t_empty, info = _union_time(bitmap_only, nearly_empty, repeat)
    t_empty -= _plan_time(bitmap_only, nearly_empty, repeat)
    bitmap_ps = max(0, t_empty) * 1000 // n
    five = _sparse(n, block, block // 4, rng)
    t_five, info = _union_time(bitmap_only, five, repeat)
    t_five -= _plan_time(bitmap_only, five, repeat)
    lane_ps = max(0, t_five * 1000 - n * bitmap_ps) // max(1, info["candidates"])

    # Bloom blocks: the bytes rule picks one option for every block of a
    # tensor with the same count in each (0.68 %)
    bloom = codec.Params(block_elements=block, workers=1)
    sparse = _sparse(n, block, max(1, block * 68 // 10000), rng)
    t_bloom, info = _union_time(bloom, sparse, repeat)
    t_bloom -= _plan_time(bloom, sparse, repeat)
    probe_ps = 0
    if info["bloom_blocks"]:
        bits = 8 * info["index_bytes"] // info["bloom_blocks"]
        c = max(1, block * 68 // 10000)
        k = next((k for bpe, k in _BLOOM if max(64, -(-bpe * c // 64) * 64) == bits), 8)
        probe_ps = max(0, t_bloom * 1000 - n * bitmap_ps) // (n * k)

    # split-block blocks: a model under which a split-block option is
    # certain (the bitmap and the other Bloom options dear), the same tensor
    split = codec.Params(
        block_elements=block,
        workers=1,
        cost=_cost.Cost(
            link_mbit=1_000_000,
            bitmap_ps=_cost.MAX_ELEM_PS,
            probe_ps=_cost.MAX_ELEM_PS,
            sbbf_ps=1,
        ),
    )
    t_split, info = _union_time(split, sparse, repeat)
    t_split -= _plan_time(split, sparse, repeat)
    sbbf_ps = 0
    if info["split_blocks"]:
        sbbf_ps = max(1, (t_split * 1000 - n * bitmap_ps) // n)
    return {
        "value_ps": int(min(value_ps, _cost.MAX_ELEM_PS)),
        "lane_ps": int(min(lane_ps, _cost.MAX_ELEM_PS)),
        "bitmap_ps": int(min(bitmap_ps, _cost.MAX_ELEM_PS)),
        "probe_ps": int(min(probe_ps, _cost.MAX_ELEM_PS)),
        "sbbf_ps": int(min(sbbf_ps, _cost.MAX_ELEM_PS)),
    }


def measure_packets(count=4000, payload=1024) -> dict:
    """pkt_ps (loopback UDP, this process) and agg_pkt_ps (the engine)."""
    from homagg.bindings import bench

    r = bench.bench_engine(workers=4, payload_bytes=payload, seconds=0.15)
    agg_pkt_ps = int(1e6 / r["mpps"]) if r["mpps"] > 0 else _cost.MAX_PKT_PS
    data = bytes(payload)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        rx.bind(("127.0.0.1", 0))
        rx.settimeout(2.0)
        addr = rx.getsockname()
        best = None
        for _ in range(3):
            t0 = time.process_time_ns()
            got = 0
            for _ in range(count // 64):
                for _ in range(64):
                    tx.sendto(data, addr)
                for _ in range(64):
                    rx.recv(payload + 64)
                    got += 1
            dt = (time.process_time_ns() - t0) / max(1, got)
            best = dt if best is None else min(best, dt)
    finally:
        rx.close()
        tx.close()
    return {
        "pkt_ps": int(min(best * 1000, _cost.MAX_PKT_PS)),
        "agg_pkt_ps": int(min(agg_pkt_ps, _cost.MAX_PKT_PS)),
    }


def _cpu_model():
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def calibrate(elements=1 << 20, repeat=5) -> dict:
    """The calibration of this host: one coefficient set per ISA path."""
    from homagg import kernels

    t0 = time.monotonic()
    pkts = measure_packets()
    paths = {}
    for isa in ISAS:
        if not kernels.isa_supported(isa):
            continue
        with _isa_env(isa):
            paths[isa] = {**pkts, **measure_path(elements, repeat)}
    forced = os.environ.get("HOMAGG_CODEC_ISA")
    isa = forced if forced in paths else list(paths)[-1]
    return {
        "version": _cost.CALIBRATION_VERSION,
        "host": socket.gethostname(),
        "cpu": _cpu_model(),
        "isa": isa,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "elements": int(elements),
        "seconds": round(time.monotonic() - t0, 3),
        "paths": paths,
    }


def host_or_measured(path=None, elements=1 << 20, repeat=5, progress=None) -> dict:
    """The calibration file at ``path`` (default: this host's), or, when
    there is none, the codec's coefficients measured now (:func:`calibrate`,
    seconds; not written): the codec's side of a calibration through a
    testbed's port."""
    cal = _cost.load_calibration(path)
    if cal is None:
        if progress:
            progress("calibrating the codec (this host has no calibration file)")
        cal = calibrate(elements, repeat)
    return cal


def write(cal, path) -> str:
    _cost.check_calibration(cal, "calibration")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(cal, f, indent=1)
    os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------
# Through a testbed's port (docs/PROTOCOL.md "The cost model", "Calibration
# through the port")

# (method, elements, density) of the runs: two dense sizes give the cost of a
# chunk's frames and the round trip apart, two union runs their index and
# lanes and, the sparse one, four steps that cost little more than their
# round trips.
# Sizes like those of the allreduces users time (starting the workers, not
# the allreduces, takes most of the half minute): under load a small run's
# time is mostly noise.
PORT_RUNS = (
    ("dense", 1 << 17, 1.0),
    ("dense", 1 << 20, 1.0),
    ("union", 1 << 20, 0.05),
    ("union", 1 << 20, 0.0068),
)
PORT_REPEAT = 5
PORT_WORKLOAD = "random"
# elements of the ring all-reduces (the process group's, Gloo) timed through
# the same path: two sizes give its CPU per byte and per step apart
RING_RUNS = (1 << 17, 1 << 20)


def model_run(workers, elements, density, link_mbit, method, coeffs, *, block=None, seed=1):
    """What the model counts for one allreduce before its per-frame terms:
    ``bytes`` (payload bytes per worker), ``steps`` and ``elem_ps`` (the
    worker CPU of its elements by ``coeffs``, a core each), from
    homagg.ops.advise on the same gradients as the run."""
    from homagg.ops import advise as adv

    bare = {**coeffs, "pkt_ps": 0, "agg_pkt_ps": 0}
    a = adv.advise(
        workers,
        elements,
        density,
        link_mbit,
        PORT_WORKLOAD,
        rtt_ns=0,
        coeffs=bare,
        block=block,
        seed=seed,
        methods=(method,),
    )
    m = a["methods"][method]
    return {
        "bytes": sum(m["bytes"].values()),
        "steps": m["steps"],
        "elem_ps": round(m["terms"]["worker_cpu"] * 1e12),
    }


def machine_cpu_per_call(machine, seconds_each):
    """The CPU seconds the whole machine spent per call (every process and
    the kernel's packet path: what a path takes from the ranks' compute on
    shared cores), from the busy fraction of all cores over the timed
    calls (homagg.runs.job.machine_busy) and their times; None where /proc
    could not tell.  /proc/stat counts in ticks of 10 ms, so a run of a few
    short calls reads within some ten per cent."""
    if not machine or not seconds_each:
        return None
    return round(machine["busy"] * machine["cores"] * sum(seconds_each) / len(seconds_each), 6)


def calibrate_port(
    testbed: str,
    state_dir=None,
    *,
    calibration=None,
    runs=PORT_RUNS,
    repeat=PORT_REPEAT,
    warmup=1,
    timeout=30.0,
    progress=None,
    ring_runs=RING_RUNS,
) -> dict:
    """Time allreduces through ``testbed``'s real path (the worker client,
    veth, bridge and the daemon's port, as ``homagg run`` does) and fit the
    per-frame costs and the round trip (homagg.cost.fit_port).  Returns the
    entry of the calibration file's "ports" section for this testbed; the
    codec's coefficients are ``calibration``'s (this host's file, else the
    built-in defaults).  Then it times ring all-reduces of ``ring_runs``
    elements by the process group (Gloo, one rank per worker namespace, as
    the benchmarks run it) and fits the ring's CPU per byte and cost per
    step (homagg.cost.fit_ring) into the entry's "ring"; without torch (or with
    ``ring_runs`` empty) the entry has none and "ring_unavailable" says why."""
    import statistics

    from homagg.deploy.local import testbed_job
    from homagg.deploy.local.testbed import Testbed
    from homagg.errors import InvalidArgument
    from homagg.runs.allreduce import run_allreduce

    tb = Testbed.open(testbed, state_dir)
    link = testbed_job.link_mbit(tb)
    if not link:
        raise InvalidArgument(
            f"testbed {testbed}: its links are not shaped, so a job there has no cost "
            "model; build it with `homagg testbed up --link-mbit RATE`"
        )
    W = len(tb.workers)
    processes, cores = testbed_job.job_processes(tb), _cost.host_cores()
    factor = _cost.sharing(processes, cores)
    coeffs = _cost.coefficients(calibration)
    t0 = time.monotonic()
    measured = []
    for method, n, density in runs:
        r = run_allreduce(
            testbed,
            method,
            n,
            density,
            workload=PORT_WORKLOAD,
            state_dir=state_dir,
            repeat=repeat,
            warmup=warmup,
            timeout=timeout,
        )
        row = {
            "method": method,
            "elements": n,
            "density": density,
            "seconds": r.seconds,
            "worker_cpu_s": statistics.median(r.worker_cpu_seconds),
            "daemon_cpu_s": r.daemon_cpu_seconds or 0.0,
            "machine_cpu_s": machine_cpu_per_call(r.machine_cpu, r.seconds_each),
            **model_run(W, n, density, link, method, coeffs),
        }
        measured.append(row)
        if progress:
            progress(f"{method} {n} elements at {density:g}: {r.seconds * 1e3:.2f} ms")
    fit = _cost.fit_port(measured, workers=W, payload_bytes=1024, link_mbit=link, factor=factor)
    job = _cost.job_cost(
        link,
        fit["rtt_ns"],
        coeffs={**coeffs, "pkt_ps": fit["pkt_ps"], "agg_pkt_ps": fit["agg_pkt_ps"]},
        sharing=factor,
    )
    for row in measured:
        row["predicted_s"] = predicted_seconds(row, job, W)
    ring, why = _ring_calibration(tb, W, link, ring_runs, repeat, warmup, timeout, progress)
    return {
        "workers": W,
        "processes": processes,
        "cores": cores,
        "sharing": float(factor),
        "link_mbit": link,
        "payload_bytes": 1024,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - t0, 3),
        "coefficients": {k: fit[k] for k in _cost.PORT_FIELDS},
        "worker_share": round(fit["worker_share"], 4),
        "runs": measured,
        **({"ring": ring} if ring else {"ring_unavailable": why}),
    }


def _ring_calibration(tb, W, link, ring_runs, repeat, warmup, timeout, progress):
    """(the entry's "ring", None) or (None, why not): ring all-reduces of
    ``ring_runs`` elements timed through the testbed (the slowest rank of
    each call, the median of the calls) and fitted by homagg.cost.fit_ring."""
    import statistics

    if not ring_runs:
        return None, "no ring runs asked for"
    from homagg.bench.allreduce import GlooGroup

    try:
        group = GlooGroup(tb, timeout)
    except Exception as exc:  # noqa: BLE001 - the HomAgg entry stands without it
        why = f"ring all-reduce unavailable: {type(exc).__name__}: {exc}"[:300]
        if progress:
            progress(why)
        return None, why
    runs = []
    try:
        for n in ring_runs:
            answers, _ = group.run(
                {
                    "workload": PORT_WORKLOAD,
                    "elements": int(n),
                    "density": 1.0,
                    "seed": 1,
                    "repeat": repeat,
                    "warmup": warmup,
                    "gradient_files": None,
                }
            )
            per_call = [max(c) for c in zip(*(a["seconds"] for a in answers))]
            runs.append(
                {
                    "elements": int(n),
                    "seconds": statistics.median(per_call),
                    "machine_cpu_s": machine_cpu_per_call(
                        answers[0].get("machine_cpu"), answers[0]["seconds"]
                    ),
                }
            )
            if progress:
                progress(f"ring all-reduce of {n} elements: {runs[-1]['seconds'] * 1e3:.2f} ms")
    finally:
        group.close()
    fit = _cost.fit_ring(runs, workers=W, link_mbit=link)
    c = _cost.Cost(link_mbit=int(link), **fit)
    for r in runs:
        r["predicted_s"] = _cost.ring_ps(c, W, r["elements"]) / 1e12
    return {**fit, "runs": runs}, None


def predicted_seconds(row, c: _cost.Cost, workers, *, block=None, seed=1) -> float:
    """``homagg advise``'s time of a calibration run's allreduce under the
    job's cost model ``c`` (the one a job on the testbed registers)."""
    from homagg.ops import advise as adv

    a = adv.advise(
        workers,
        row["elements"],
        row["density"],
        c.link_mbit,
        PORT_WORKLOAD,
        rtt_ns=c.rtt_ns,
        coeffs={k: getattr(c, k) for k in _cost.COEFFICIENTS},
        block=block,
        seed=seed,
        methods=(row["method"],),
    )
    return a["methods"][row["method"]]["time_s"]


def add_port(cal, testbed: str, entry: dict) -> dict:
    """``cal`` with ``entry`` as its testbed's port calibration."""
    _cost.check_port(entry, f"ports.{testbed}")
    return {**cal, "ports": {**(cal.get("ports") or {}), testbed: entry}}
