"""The demo's three runs of one realistic sparse allreduce, each checked bit
for bit against the fixed-point reference (numpy) and printed as a table:

- ``main_testbed``: a local testbed built and torn down here
  (homagg.deploy.local.testbed), one ``homagg run allreduce`` per method and
  workload (homagg.runs.allreduce);
- ``main_sim``: the in-process NIC-model cluster (homagg.sim.Cluster),
  virtual time;
- ``main_codec``: the protocol in one process without a network
  (homagg.codec.simulate_allreduce).

``homagg demo`` (homagg.cli.demo) chooses the mode and calls one of them.
"""

import logging
import os
import sys
import time

import numpy as np

from homagg.protocol import METHODS

# The methods the testbed mode runs by default (each one costs a daemon run).
NET_METHODS = ("dense", "lhc", "union")


_log = logging.getLogger("homagg.runs.demo")


def progress(msg):
    _log.info("[demo] %s", msg)


def realistic_gradients(n, workers, density, shared, seed):
    """Layers of log-uniform scale, Student-t values, top-k style masks."""
    rng = np.random.default_rng(seed)
    # Layer boundaries: ~12 layers of varied sizes.
    cuts = np.sort(rng.choice(np.arange(1, n), size=min(11, max(n - 1, 0)), replace=False))
    bounds = np.concatenate([[0], cuts, [n]]).astype(np.int64)
    scale = np.empty(n, dtype=np.float32)
    for a, z in zip(bounds[:-1], bounds[1:]):
        scale[a:z] = 10.0 ** rng.uniform(-5, -2)
    k = int(round(density * n))
    shared_pos = rng.choice(n, size=k, replace=False) if k else np.empty(0, dtype=np.int64)
    grads = []
    for _ in range(workers):
        pos = shared_pos if shared else (rng.choice(n, size=k, replace=False) if k else shared_pos)
        g = np.zeros(n, dtype=np.float32)
        g[pos] = (rng.standard_t(3, size=pos.size) * scale[pos]).astype(np.float32)
        grads.append(g)
    return grads


def parse_methods(args, default):
    ms = tuple(m.strip() for m in args.methods.split(",")) if args.methods else default
    bad = [m for m in ms if m not in METHODS]
    if bad:
        raise SystemExit(f"homagg demo: unknown method(s) {bad}; choose from {', '.join(METHODS)}")
    return ms


def _default_block():
    from homagg.bindings.codec import DEFAULT_BLOCK

    return DEFAULT_BLOCK


def _format_table(head, rows, right):
    """Lines of a table whose columns are as wide as their widest cell;
    columns whose index is in ``right`` are right-aligned (numbers)."""
    cells = [list(head)] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    return [
        "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))
        ).rstrip()
        for r in cells
    ]


def _duration(seconds):
    """A duration with its unit, readable from microseconds to minutes."""
    return f"{seconds * 1e3:.3f} ms" if seconds < 1 else f"{seconds:.3f} s"


def _table(title, rows):
    print(title)
    head = (
        "method",
        "workload",
        "time",
        "sent/worker",
        "vs fp32",
        "retransmissions",
        "bit-exact",
        "",
    )
    body = [
        (
            r["method"],
            r["workload"],
            _duration(r["seconds"]),
            f"{r['bytes']} B",
            f"{r['bytes'] / r['dense']:.3f}",
            r["retrans"],
            r["exact"],
            r.get("note", ""),
        )
        for r in rows
    ]
    for line in _format_table(head, body, right={2, 3, 4, 5}):
        print(line)


def _exact_word(method, same):
    if method == "nc":
        return "lossy"
    return "yes" if same else "NO"


def machine_line():
    """The CPU model, its vCPUs and the codec's ISA path, for every table
    that shows a time (a figure holds for the CPU it was measured on)."""
    from homagg.bindings.codec import codec_isa

    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu
            )
    except OSError:
        pass
    return f"{cpu} ({os.cpu_count()} vCPU), codec ISA path {codec_isa()}"


def _gloo_times(tb, workloads, n, density, link_mbit, seed, timeout):
    """Gloo ring all-reduce (torch.distributed) of the same gradients on the
    same testbed and links: {workload: seconds} of one timed call after one
    warmup, or a string saying why Gloo could not run."""
    from types import SimpleNamespace

    try:
        from homagg.bench.allreduce import GlooGroup, gloo_row

        group = GlooGroup(tb, timeout)
    except Exception as e:  # noqa: BLE001 - the demo still shows HomAgg's rows
        return f"unavailable: {type(e).__name__}: {e}"[:300]
    try:
        out = {}
        for wl in workloads:
            progress(f"gloo / {wl}: ring all-reduce of the same gradients ...")
            row = gloo_row(
                group,
                len(tb.workers),
                n,
                wl,
                density,
                link_mbit,
                SimpleNamespace(seed=seed, repeat=1, warmup=1),
            )
            out[wl] = row["seconds_median"]
            progress(f"  {row['seconds_median']:.3f} s")
        return out
    finally:
        group.close()


def main_testbed(args, methods):
    from homagg.deploy.local.testbed import Testbed
    from homagg.runs import allreduce as run

    n, W = args.elements, args.workers
    name = f"demo{os.getpid() % 100000}"
    workloads = ("shared", "random")
    progress(f"testbed {name}: {W} workers, links {args.link_mbit:g} Mbit/s each way")
    Testbed.up(name, workers=W, link_mbit=args.link_mbit)
    rows = []
    try:
        for wl in workloads:
            for m in methods:
                progress(f"{m} / {wl}: {W} x {n} float32, density {args.density} ...")
                r = run.run_allreduce(
                    name, m, n, args.density, workload=wl, seed=args.seed + 1, warmup=1
                )
                retrans = sum(s.get("retransmissions", 0) for s in r["worker_stats"])
                rows.append(
                    dict(
                        method=m,
                        workload=wl,
                        seconds=r["seconds"],
                        bytes=max(r["bytes_per_worker"]),
                        dense=4 * n,
                        retrans=retrans,
                        exact=_exact_word(m, r["exact"]),
                        note=f"pmd {r['pmd']}",
                    )
                )
                progress(
                    f"  {r['seconds']:.3f} s, {max(r['bytes_per_worker'])} B sent per worker, "
                    f"exact {r['exact']}"
                )
        gloo = _gloo_times(
            Testbed.open(name),
            workloads,
            n,
            args.density,
            args.link_mbit,
            args.seed + 1,
            timeout=60.0,
        )
    finally:
        progress(f"tearing down testbed {name}")
        Testbed.down(name)
    if isinstance(gloo, dict):
        for r in rows:
            r["note"] = f"{gloo[r['workload']] / r['seconds']:.2f}x Gloo; " + r["note"]
    _table(
        f"HomAgg allreduce on a local testbed: W={W}, n={n} float32 per worker "
        f"(dense fp32 = {4 * n} B), density {args.density}, links {args.link_mbit:g} Mbit/s; "
        "bytes = what each worker sent on its link (headers included); "
        "times: one allreduce after one warmup",
        rows,
    )
    if isinstance(gloo, dict):
        print(
            "Gloo ring all-reduce (torch.distributed) of the same gradients on the same links: "
            + ", ".join(f"{wl} {_duration(t)}" for wl, t in gloo.items())
            + "; speedup = Gloo's time / the method's, in the last column"
        )
    else:
        print(f"Gloo ring all-reduce: {gloo}")
    print(f"measured on {machine_line()}")
    return 1 if any(r["exact"] == "NO" for r in rows) else 0


def main_sim(args, methods):
    from homagg import reference, sim

    n, W = args.elements, args.workers
    rows = []
    for wl in ("shared", "random"):
        grads = realistic_gradients(n, W, args.density, wl == "shared", args.seed)
        want = reference.allreduce(grads, _default_block())
        for m in methods:
            progress(
                f"{m} / {wl}: {W} x {n} float32, density {args.density}, "
                f"simulated links {args.link_mbit:g} Mbit/s ..."
            )
            # the default window of 64, or less so that W x S fits the ring
            with sim.Cluster(
                workers=W,
                link_gbps=args.link_mbit / 1000.0,
                seed=args.seed,
                slots=min(64, sim.AGG_RX_RING // W),
            ) as c:
                r = c.allreduce(grads, method=m)
            st = r.stats
            sent = max(sum(w["bytes_sent"].values()) for w in st["workers"])
            retrans = sum(w["retransmissions"] for w in st["workers"])
            same = np.array_equal(r.sum.view(np.uint32), want.view(np.uint32))
            rows.append(
                dict(
                    method=m if m != "auto" else f"auto->{st['method']}",
                    workload=wl,
                    seconds=st["virtual_time"],
                    bytes=sent,
                    dense=4 * n,
                    retrans=retrans,
                    exact=_exact_word(m, same),
                    note="virtual time",
                )
            )
    _table(
        f"HomAgg allreduce on the in-process NIC-model cluster: W={W}, n={n} float32 per "
        f"worker (dense fp32 = {4 * n} B), density {args.density}; bytes = HomAgg payload "
        "per worker",
        rows,
    )
    return 1 if any(r["exact"] == "NO" for r in rows) else 0


def main_codec(args):
    from homagg import codec, reference

    if args.elements is None:
        args.elements = 2**24
    n, W = args.elements, args.workers
    rows = []
    for wl in ("shared", "random"):
        progress(f"workload {wl}: {W} workers x {n} float32, density {args.density}")
        grads = realistic_gradients(n, W, args.density, wl == "shared", args.seed)
        t = time.perf_counter()
        want = reference.allreduce(grads, codec.DEFAULT_BLOCK)
        progress(f"  reference (numpy, fixed point) in {time.perf_counter() - t:.1f} s")
        exact64 = np.sum([g.astype(np.float64) for g in grads], axis=0)
        for m in parse_methods(args, METHODS):
            progress(f"  {m} ...")
            t = time.perf_counter()
            r = codec.simulate_allreduce(grads, method=m, seed=args.seed)
            dt = time.perf_counter() - t
            s = r.stats
            same = np.array_equal(r.sum.view(np.uint32), want.view(np.uint32))
            if m == "nc":
                err = np.linalg.norm(r.sum - exact64) / max(np.linalg.norm(exact64), 1e-300)
                exact = f"no (lossy, rel. err {err:.1e})"
            else:
                exact = "yes" if same else "NO"
            name = m if m != "auto" else f"auto->{s['auto_choice']}"
            extra = ""
            if s["method"] == "lhc":
                extra = f"stalled {s['stalled_blocks']}/{s['blocks']} blocks"
            rows.append(
                (name, wl, s["bytes_per_worker"], s["bytes_per_worker"] / (4 * n), exact, dt, extra)
            )
            progress(f"  {m}: {s['bytes_per_worker']} B sent per worker, exact {exact}, {dt:.1f} s")
            del r
        del grads

    head = ("method", "workload", "sent/worker", "vs dense fp32", "bit-exact", "time", "")
    print(
        f"HomAgg in-process allreduce: W={W}, n={n} float32 per worker "
        f"(dense fp32 = {4 * n} B), density {args.density}; lhc's stalled blocks: "
        "blocks whose sketch peeling stalled, completed by a fallback SUM32 of their "
        "candidates (still exact)"
    )
    body = [
        (name, wl, f"{by} B", f"{ratio:.3f}", exact, _duration(dt), extra)
        for name, wl, by, ratio, exact, dt, extra in rows
    ]
    for line in _format_table(head, body, right={2, 3, 5}):
        print(line)
    bad = [r for r in rows if r[4] == "NO"]
    if bad:
        print(f"{len(bad)} exact method(s) did not match the reference", file=sys.stderr)
        return 1
    return 0
