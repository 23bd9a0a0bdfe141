"""One rank of the Gloo ring all-reduce baseline (torch.distributed).

Started by ``homagg bench allreduce`` inside a worker namespace of the
testbed::

    python -m homagg.bench.gloo_worker --rank R --world W --init tcp://IP:PORT

It joins the process group (Gloo backend, TCP rendezvous at rank 0's
address inside the testbed), prints ``{"ready": ...}``, then reads one JSON
job per line from stdin and answers each with one JSON line on stdout:

    {"workload", "elements", "density", "seed", "repeat", "warmup", "gradient_files"}

For each job it generates its gradient (homagg.bench.workloads, so every
rank knows every other rank's input), or loads the W gradients from
"gradient_files" when the benchmark wrote them (homagg.runs.job.save_gradients), runs ``warmup`` untimed and
``repeat`` timed all_reduce calls of a fresh float32 tensor (a barrier
before each one, so every rank starts together), and reports the seconds
of each timed call, the process CPU time (user + system, every thread)
spent in them, and whether the result equals the float64 sum within the
float32 summation bound W * 2^-23 * sum_w |x_w| (+ the final rounding).
A line ``"quit"`` ends the process.
"""

import argparse
import datetime
import json
import sys
import time

import numpy as np


def _check(y, grads, step=1 << 18):
    """y against the float64 sum, within float32 summation error (``step``
    elements at a time, so the float64 temporaries stay small)."""
    ok, worst = True, 0.0
    for a in range(0, y.size, step):
        xs = np.stack([g[a : a + step].astype(np.float64) for g in grads])
        exact_sum = xs.sum(axis=0)
        bound = (len(grads) + 1) * 2.0**-23 * np.abs(xs).sum(axis=0)
        err = np.abs(y[a : a + step].astype(np.float64) - exact_sum)
        ok = ok and bool(np.all(err <= bound))
        worst = max(worst, float(err.max()))
    return ok, worst


def run_job(dist, torch, job, rank, world):
    from homagg.bench import workloads
    from homagg.runs.job import machine_busy, machine_cpu_times

    if job.get("gradient_files"):  # written by the benchmark, one per rank
        grads = [np.load(f) for f in job["gradient_files"]]
    else:
        grads = [
            workloads.generate(
                job["workload"], world, job["elements"], job["density"], job["seed"], w
            )
            for w in range(world)
        ]
    x = torch.from_numpy(grads[rank])
    for _ in range(job["warmup"]):
        buf = x.clone()
        dist.barrier()
        dist.all_reduce(buf)
    seconds, cpu = [], 0.0
    result = None
    machine = None  # the machine's CPU counters moved by the timed calls
    for _ in range(job["repeat"]):
        buf = x.clone()
        dist.barrier()
        # process_time: user + system CPU of every thread of this process
        m0 = machine_cpu_times()
        c0, t0 = time.process_time(), time.perf_counter()
        dist.all_reduce(buf)
        t1, c1 = time.perf_counter(), time.process_time()
        m1 = machine_cpu_times()
        moved = [b - a for a, b in zip(m0, m1)]
        machine = moved if machine is None else [a + b for a, b in zip(machine, moved)]
        seconds.append(t1 - t0)
        cpu += c1 - c0
        result = buf
    ok, err = _check(result.numpy(), grads) if result is not None else (None, None)
    return {
        "rank": rank,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "machine_cpu": machine_busy([0] * len(machine), machine) if machine else None,
        "within_tolerance": ok,
        "max_abs_error": err,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m homagg.bench.gloo_worker")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--init", required=True, help="tcp://IP:PORT of rank 0")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    dist.init_process_group(
        "gloo",
        init_method=args.init,
        rank=args.rank,
        world_size=args.world,
        timeout=datetime.timedelta(seconds=args.timeout),
    )
    print(json.dumps({"ready": args.rank, "torch": torch.__version__}), flush=True)
    try:
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            if line == "quit":
                break
            job = json.loads(line)
            try:
                out = run_job(dist, torch, job, args.rank, args.world)
            except Exception as exc:  # report, keep the protocol line-based
                out = {"rank": args.rank, "error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(out), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
