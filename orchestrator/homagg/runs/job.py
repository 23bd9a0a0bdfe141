"""One allreduce job, wherever it runs (local testbed or remote hosts):
what every worker computes, the worker process itself, the check of the
results and the report.

- ``gradient`` builds worker w's input from the seed (homagg.bench.workloads),
  so the checker rebuilds every worker's input; ``reference`` is the
  bit-exact result (homagg.reference).
- ``worker_spec`` is the JSON spec of one worker process, which runs as
  ``python -m homagg.runs.job --child SPEC`` (``child``): build the gradient,
  wait for "go", run the allreduce through homagg.worker.Worker, save the
  result, print one JSON line of stats.
- ``verify`` compares every worker's result bit for bit with the reference;
  ``counter_deltas`` and ``print_report`` make the report.

``homagg.runs.allreduce`` (local testbed) and ``homagg.deploy.remote.hosts`` (hosts over SSH) both
use this module; neither imports the other.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

from homagg import protocol
from homagg._native import lib
from homagg.bench import workloads
from homagg.errors import RunError  # noqa: F401 - RunError importable from here
from homagg.protocol import PIPELINE_GROUPS
from homagg.switch.job_file import tree_leaf  # noqa: F401 - the tree's layout, importable from here

METHODS = protocol.METHODS
WORKLOADS = workloads.WORKLOADS  # shared, random, zipf, dense
UDP_PORT = lib.HG_UDP_PORT
DEFAULT_BLOCK = lib.HG_DEFAULT_BLOCK


# --------------------------------------------------------------------------
# The aggregator's link


def mbuf_data_room(mtu: int) -> int:
    """homagg-switch's mbuf data room for a link of this MTU (switch_main.c:
    the MTU + 128 rounded up to 1 KiB, at least 2048)."""
    return max(2048, -(-(int(mtu) + 128) // 1024) * 1024)


AF_PACKET_FRAMES = 512  # DPDK net_af_packet's default framecnt: its kernel ring


def vdev_for_mtu(vdev: str, mtu: int, frames: int = 0) -> str:
    """A DPDK vdev argument that receives whole frames of ``mtu`` and holds
    ``frames`` of them at once.  net_af_packet copies each frame into one
    slot of ``framesz`` bytes (2048 unless told) of a kernel ring of
    ``framecnt`` slots (512 unless told), and the daemon's mbufs must hold a
    slot (framesz <= data room + 32): above MTU 1500 the slot is the
    daemon's data room and a block (a multiple of the page size) holds
    whole slots; a ring for more than 512 frames (W x S of the jobs the
    daemon takes: homagg-switch refuses a job whose frames in flight its
    ring cannot hold) gets that framecnt, a multiple of the slots per
    block.  Other vdevs, and what the vdev names itself, are left alone."""
    if not vdev.startswith(("net_af_packet", "eth_af_packet")):
        return vdev
    named = dict(kv.split("=", 1) for kv in vdev.split(",")[1:] if "=" in kv)
    parts = []
    frame, block = int(named.get("framesz", 2048)), int(named.get("blocksz", 4096))
    if mtu > 1500 and "framesz" not in named:
        frame = mbuf_data_room(mtu)
        block = frame * 4096 // math.gcd(frame, 4096)
        parts += [f"framesz={frame}", f"blocksz={block}"]
    if "framecnt" not in named and (parts or frames > AF_PACKET_FRAMES):
        per_block = max(1, block // frame)
        count = -(-max(AF_PACKET_FRAMES, int(frames)) // per_block) * per_block
        parts.append(f"framecnt={count}")
    return ",".join([vdev, *parts])


# --------------------------------------------------------------------------
# Gradients, workers, the check and the report


def gradient(
    elements: int, density: float, workload: str, seed: int, worker: int, workers: int | None = None
) -> np.ndarray:
    """Worker ``worker``'s float32 gradient: homagg.bench.workloads.generate
    (the same arrays the benchmarks' Gloo ranks build).  A pure function of
    its arguments, so the checker rebuilds every worker's input.  ``workers``
    only bounds ``worker`` (the generators do not depend on it)."""
    if workload not in WORKLOADS:
        raise RunError(f"workload {workload!r} not in {WORKLOADS}")
    if workers is None:
        workers = worker + 1
    return workloads.generate(workload, workers, elements, density, seed, worker)


def save_gradients(directory: str, grads: list[np.ndarray]) -> list[str]:
    """Write the W gradients of a job as .npy files into ``directory`` (one
    per worker, in worker order) and return their paths: every process of a
    benchmark that runs several methods on the same gradients loads them
    instead of generating them again (the ``gradient_file`` of a worker spec)."""
    paths = []
    for i, g in enumerate(grads):
        paths.append(os.path.join(directory, f"gradient-{i}.npy"))
        np.save(paths[-1], np.ascontiguousarray(g, dtype=np.float32))
    return paths


def load_gradient(path: str, elements: int) -> np.ndarray:
    """One gradient written by save_gradients(); it must hold ``elements`` float32."""
    x = np.load(path)
    if x.dtype != np.float32 or x.shape != (elements,):
        raise RunError(f"gradient file {path}: {x.dtype} {x.shape}, expected float32 ({elements},)")
    return x


def reference(grads: list[np.ndarray], block: int) -> np.ndarray:
    """The bit-exact result of an exact method (homagg.reference: the
    fixed-point contract in numpy, independent of the C codec)."""
    from homagg import reference as ref

    return ref.allreduce(grads, block)


def open_worker(spec: dict):
    """The homagg.worker.Worker a worker spec (worker_spec()) describes."""
    from homagg.worker import Worker

    aggs = spec.get("aggregators") or [(spec["agg_ip"], spec["udp_port"])]
    return Worker(
        job=spec["job"],
        token=spec["token"],
        worker=spec["worker"],
        workers=spec["workers"],
        aggregators=[tuple(a) for a in aggs],
        group=spec["group"],
        bind=(spec["ip"], 0),
        timeout=spec["timeout"],
        slots=spec["slots"],
        payload=spec["payload"],
        rto=spec["rto"],
        mtu=spec.get("mtu"),
        auth_file=spec.get("auth_file"),
        mac=spec.get("mac") if spec.get("auth_file") else None,
        leaf_ids=spec.get("leaf_ids"),
        pipeline_groups=spec.get("pipeline_groups", PIPELINE_GROUPS),
        cost=spec.get("cost"),
        udp_gso=bool(spec.get("udp_gso")),
    )


def _numeric_delta(before: dict, after: dict) -> dict:
    """after - before for the integer counters of a worker's stats."""
    return {
        k: v - before.get(k, 0)
        for k, v in after.items()
        if isinstance(v, int) and not isinstance(v, bool)
    }


def machine_cpu_times() -> list[int]:
    """The machine's CPU time counters (/proc/stat "cpu" line, all cores, in
    ticks): user, nice, system, idle, iowait, irq, softirq, steal, ... ."""
    with open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1:]]


def machine_busy(before: list[int], after: list[int]) -> dict:
    """Between two ``machine_cpu_times``: the fraction of all cores' time
    that was busy (not idle or iowait; every process on the machine, the
    kernel's packet processing too) and the part of it in softirq (the
    kernel's network stack), and the cores."""
    d = [b - a for a, b in zip(before, after)]
    total = sum(d[:8]) or 1
    return {"busy": (total - d[3] - d[4]) / total, "softirq": d[6] / total, "cores": os.cpu_count()}


def _barrier(spec: dict, stage: str) -> bool:
    """Say "ready" and wait for "go": over stdout and stdin (a local
    testbed), or with files on a remote host (``ready_file`` + ``stage`` is
    created, ``go_file`` + ``stage`` awaited: homagg.deploy.remote.placement).
    False when no "go" came."""
    if not spec.get("go_file"):
        print("ready", flush=True)
        return sys.stdin.readline().strip() == "go"
    open(spec["ready_file"] + stage, "w").close()
    deadline = time.monotonic() + spec.get("start_timeout", 120.0)
    while not os.path.exists(spec["go_file"] + stage):
        if time.monotonic() > deadline:
            print(f"no go file {spec['go_file'] + stage} within the start timeout", file=sys.stderr)
            return False
        time.sleep(0.005)
    return True


def child(spec: dict) -> int:
    """One worker process: build the gradient, wait for "go" on stdin, run
    ``warmup`` untimed allreduces, then (after a second "ready"/"go" when
    there were any) ``repeat`` timed ones, save the result, print one JSON
    line of stats: the time and CPU of each timed call and the counters
    they moved ("stats_timed"; "stats" is the client's total)."""
    if spec.get("gradient_file"):
        x = load_gradient(spec["gradient_file"], spec["elements"])
    else:
        x = gradient(
            spec["elements"],
            spec["density"],
            spec["workload"],
            spec["seed"],
            spec["worker"],
            spec["workers"],
        )
    with open_worker(spec) as w:
        if not _barrier(spec, ""):
            return 2
        y = np.empty_like(x)
        for _ in range(spec.get("warmup", 0)):
            w.allreduce(x, method=spec["method"], block=spec["block"], out=y)
        if spec.get("warmup", 0) and not _barrier(spec, ".timed"):
            return 2  # the timed calls start together
        st0 = w.stats()
        m0 = machine_cpu_times()
        seconds, cpu = [], []
        for _ in range(spec.get("repeat", 1)):
            c0, t0 = time.process_time(), time.perf_counter()
            w.allreduce(x, method=spec["method"], block=spec["block"], out=y)
            seconds.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)  # this process's CPU (all its threads)
        st1 = w.stats()
        machine = machine_busy(m0, machine_cpu_times())
        np.save(spec["out"], y)
        line = json.dumps(
            {
                "worker": spec["worker"],
                "seconds": seconds[0],
                "seconds_each": seconds,
                "cpu_seconds": sum(cpu) / len(cpu),
                "machine_cpu": machine,
                "stats": st1,
                "stats_timed": _numeric_delta(st0, st1),
            }
        )
        if spec.get("report"):
            with open(spec["report"], "w") as f:
                f.write(line + "\n")
        print(line, flush=True)
    return 0


def check_arguments(method: str, elements: int, density: float) -> None:
    if method not in METHODS:
        raise RunError(f"method {method!r} not in {METHODS}")
    if elements < 1:
        raise RunError("elements must be >= 1")
    if not 0.0 <= density <= 1.0:
        raise RunError("density must be in [0, 1]")


def worker_spec(
    *,
    job,
    token,
    worker,
    workers,
    agg_ip,
    group,
    ip,
    timeout,
    slots,
    payload,
    rto,
    method,
    block,
    elements,
    density,
    workload,
    seed,
    out,
    mtu=None,
    aggregators=None,
    auth_file=None,
    mac=None,
    leaf_ids=None,
    pipeline_groups=PIPELINE_GROUPS,
    gradient_file=None,
    cost=None,
    udp_gso=False,
) -> dict:
    """The JSON spec of one worker process (``python -m homagg.runs.job --child SPEC``);
    ``mtu`` None: the worker asks the kernel for its path's MTU; ``aggregators``:
    the job's K aggregator addresses in shard order (default: agg_ip alone);
    ``auth_file``: the path of the job secret's file (never the secret),
    ``mac`` the job's MAC algorithm (None: the worker host's default);
    ``leaf_ids``: (i, n) below a tree leaf; ``pipeline_groups``: the job's
    block groups (homagg.worker.Worker); ``gradient_file``: this worker's
    gradient from save_gradients() (default: the worker generates it from
    the seed); ``cost``: the job's cost model as the job file holds it
    (homagg.cost; None: none); ``udp_gso``: the worker sends runs of frames
    as UDP_SEGMENT messages (only where the network cuts them before the
    aggregators: Testbed.udp_gso)."""
    return dict(
        job=job,
        token=token,
        worker=worker,
        workers=workers,
        agg_ip=agg_ip,
        udp_port=UDP_PORT,
        group=group,
        ip=ip,
        timeout=timeout,
        slots=slots,
        payload=payload,
        rto=rto,
        method=method,
        block=block,
        elements=elements,
        density=density,
        workload=workload,
        seed=seed,
        out=out,
        mtu=mtu,
        aggregators=[list(a) for a in (aggregators or [(agg_ip, UDP_PORT)])],
        auth_file=auth_file,
        mac=mac,
        leaf_ids=list(leaf_ids) if leaf_ids else None,
        pipeline_groups=pipeline_groups,
        gradient_file=gradient_file,
        cost=dict(cost or {}),
        udp_gso=bool(udp_gso),
    )


def job_payload(payload: int | None, mtu: int, where: str) -> int:
    """The payload of a job on links of MTU ``mtu``: ``payload`` when the
    user set one (checked: check_payload), else (None) the largest the MTU
    carries, 1424 bytes at MTU 1500: the cost model never predicts a larger
    payload slower (docs/PROTOCOL.md "The payload of a job")."""
    from homagg.worker import max_payload

    if payload is None:
        return max_payload(mtu)
    check_payload(payload, mtu, where)
    return payload


def check_payload(payload: int, mtu: int, where: str) -> None:
    """A job payload must be a multiple of 4 in 4..8192 whose frames fit the
    links' MTU (IPv4, UDP, HomAgg header and the optional MAC included)."""
    from homagg.worker import max_payload

    if not 4 <= payload <= 8192 or payload % 4:
        raise RunError(f"--payload-bytes must be a multiple of 4 in 4..8192, got {payload}")
    if payload > max_payload(mtu):
        raise RunError(
            f"--payload-bytes {payload} does not fit the MTU {mtu} of {where}: "
            f"at most {max_payload(mtu)} bytes (payloads up to 8192 need MTU 9000, "
            f"e.g. `homagg testbed up --mtu 9000`)"
        )


def expected(
    elements: int,
    density: float,
    workload: str,
    seed: int,
    block: int,
    workers: int,
    grads: list[np.ndarray] | None = None,
) -> dict:
    """What verify() compares results with, for every method of one job: the
    bit-exact reference and the float64 sum of the W gradients (rebuilt
    from the seed unless ``grads`` are those gradients).  Computed once, it
    serves every method run on the same gradients (``verify(expect=)``)."""
    if grads is None:
        grads = [gradient(elements, density, workload, seed, i, workers) for i in range(workers)]
    fsum = np.zeros(elements, dtype=np.float64)
    for g in grads:
        fsum += g
    return {
        "job": (elements, float(density), workload, seed, block, workers),
        "reference": reference(grads, block),
        "float64_sum": fsum,
    }


def verify(
    method: str,
    elements: int,
    density: float,
    workload: str,
    seed: int,
    block: int,
    results: list[np.ndarray],
    expect: dict | None = None,
) -> dict:
    """Compare every worker's result bit for bit with the reference built
    from the seed (or with ``expect``, expected() of the same job): the
    exactness part of the report ("result_sha256": of worker 0's result
    bytes, to compare runs)."""
    W = len(results)
    job = (elements, float(density), workload, seed, block, W)
    if expect is None:
        expect = expected(*job)
    elif expect["job"] != job:
        raise RunError(f"verify: the expected result is of job {expect['job']}, not {job}")
    ref = expect["reference"]
    bits = [r.view(np.uint32) for r in results]
    agree = all(np.array_equal(bits[0], b) for b in bits[1:])
    exact_each = [bool(np.array_equal(b, ref.view(np.uint32))) for b in bits]
    exact = all(exact_each) if method in protocol.EXACT_METHODS else None
    fsum = expect["float64_sum"]
    err = float(np.max(np.abs(results[0].astype(np.float64) - fsum))) if elements else 0.0
    return {
        "exact": exact,
        "exact_per_worker": exact_each,
        "workers_agree": agree,
        "max_abs_error_vs_float64_sum": err,
        "result_sha256": hashlib.sha256(results[0].tobytes()).hexdigest() if results else None,
    }


def counter_deltas(before: dict, after: dict) -> tuple[dict, dict]:
    """(engine counters, port counters) that moved between two stats replies."""
    counters = {
        k: after["stats"][k] - before["stats"].get(k, 0)
        for k in after["stats"]
        if isinstance(after["stats"][k], int)
    }
    port = {
        k: v - before.get("port", {}).get(k, 0)
        for k, v in after.get("port", {}).items()
        if isinstance(v, int)
    }
    return counters, port


def sum_dicts(ds: list[dict]) -> dict:
    out: dict = {}
    for d in ds:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def output_tail(text: str, n: int = 800) -> str:
    """The last six non-empty lines of a process's output, at most n characters."""
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return "\n".join(lines[-6:])[-n:]


def collect_reports(hosts, procs, timeout: float) -> tuple[list, list]:
    """Wait for each host's process (at most timeout seconds each) and read
    the JSON report on the last line it printed: (reports, failures), a
    failure line "<host>: ..." for each process that timed out or failed.
    What each process wrote on stderr is kept as its ``stderr_text``."""
    reports, failures = [], []
    for h, p in zip(hosts, procs):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            failures.append(f"{h.name}: no answer within {timeout:.0f} s")
            continue
        p.stderr_text = err
        if p.returncode != 0:
            failures.append(f"{h.name}: exit {p.returncode}: {output_tail(err)}")
            continue
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports, failures


def print_report(rep: dict, as_json: bool = False) -> int:
    """Print the report (text or one JSON object); the exit status: 0 when
    exact (or, for nc, the workers agree), else 3."""
    ok = rep["exact"] is not False and rep["workers_agree"]
    if as_json:
        print(json.dumps(rep.as_dict() if hasattr(rep, "as_dict") else rep))
        return 0 if ok else 3
    W, n = rep["workers"], rep["elements"]
    ran = ""
    if rep["method"] == "auto":  # the method auto chose, as the workers report it
        chosen = sorted({str(w.get("method_chosen")) for w in rep.get("worker_stats", ())})
        ran = f" (ran {', '.join(chosen) or 'unknown'})"
    print(
        f"allreduce {rep['method']}{ran}: {W} workers x {n} float32 ({rep['workload']}, density "
        f"{rep['density']:g}), aggregator homagg-switch on {rep['pmd']}"
        f"{', authenticated' if rep.get('auth') else ''}, links "
        f"{'unshaped' if rep['link_mbit'] is None else format(rep['link_mbit'], 'g') + ' Mbit/s'}"
        + (
            f", {rep['payload_bytes']}-byte payloads (MTU {rep['mtu']})"
            if rep.get("payload_bytes")
            else ""
        )
    )
    print(
        f"  time: {rep['seconds'] * 1e3:.1f} ms (slowest worker), {rep['wall_seconds'] * 1e3:.1f} ms wall"
    )
    if len(rep.get("seconds_each", ())) > 1:
        print(
            f"  timed calls: {', '.join(f'{s * 1e3:.1f}' for s in rep['seconds_each'])} ms "
            f"(median above; after {rep['warmup']} untimed)"
        )
    b = [int(v) for v in rep["bytes_per_worker"]]
    dense = int(rep["dense_float32_bytes"])
    sent = f"{min(b)} B" if min(b) == max(b) else f"{min(b)}..{max(b)} B"
    print(
        f"  bytes sent per worker: {sent} (dense float32 would be {dense} B: "
        f"{max(b) / max(1, dense):.3f}x)"
    )
    if rep["exact"] is None:
        print(
            f"  exact: n/a (lossy method); workers agree: {rep['workers_agree']}; "
            f"max |error| vs float64 sum: {rep['max_abs_error_vs_float64_sum']:.3g}"
        )
    else:
        print(f"  bit-exact on every worker: {rep['exact']} {rep['exact_per_worker']}")
    ws = rep.get("worker_stats_timed") or rep["worker_stats"]
    print(
        "  worker counters (all workers): "
        + ", ".join(
            f"{k}={sum(w.get(k, 0) for w in ws)}"
            for k in ("timeouts", "spurious_timeouts", "fast_retransmissions", "retransmissions")
        )
    )
    print("  daemon counters: " + ", ".join(f"{k}={v}" for k, v in rep["counters"].items() if v))
    if len(rep.get("aggregators", [])) > 1:
        for a in rep["aggregators"]:
            print(
                f"  aggregator {a['host']} ({a['ip']}): received {a.get('rx_bytes', '?')} bytes, "
                f"sent {a.get('tx_bytes', '?')}, summed {a['counters'].get('summed', 0)}"
            )
    if rep.get("run_dir"):
        print(f"  results and logs: {rep['run_dir']}")
    return 0 if ok else 3


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":  # one worker process
        import faulthandler

        faulthandler.enable()  # a crash in C leaves its traceback on stderr for the error
        sys.exit(child(json.loads(sys.argv[2])))
    sys.exit("usage: python -m homagg.runs.job --child SPEC")
