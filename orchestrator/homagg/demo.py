"""Allreduce a realistic sparse gradient with every method, in one process.

W workers each hold a gradient of --elements float32 values cut into
"layers" of different scales, with heavy-tailed values and --density
non-zeros (top-k style sparsity), in two workloads: the same non-zero
positions on every worker ("shared", e.g. embedding rows every worker
touched) and independent positions ("independent").  Each method runs the
whole protocol with the real C codec and aggregation kernels
(homagg.codec.simulate_allreduce); the table shows the bytes each worker
sends, the ratio to sending dense float32 (4 n bytes), whether the result
is bit-identical to the fixed-point reference (homagg.reference, numpy
only), and the time.
"""
import sys
import time

import numpy as np

METHODS = ("dense", "blocks", "lhc", "nc", "auto")


def add_arguments(parser):
    parser.add_argument("--elements", type=int, default=2**24,
                        help="elements per worker (default 2^24)")
    parser.add_argument("--workers", type=int, default=4, help="workers W (default 4)")
    parser.add_argument("--density", type=float, default=0.05,
                        help="fraction of non-zeros per worker (default 0.05)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the gradients")


def _progress(msg):
    print(f"[demo] {msg}", file=sys.stderr, flush=True)


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


def main(args):
    from homagg import codec, reference

    n, W = args.elements, args.workers
    rows = []
    for wl in ("shared", "independent"):
        _progress(f"workload {wl}: {W} workers x {n} float32, density {args.density}")
        grads = realistic_gradients(n, W, args.density, wl == "shared", args.seed)
        t = time.perf_counter()
        want = reference.allreduce(grads, codec.DEFAULT_BLOCK)
        _progress(f"  reference (numpy, fixed point) in {time.perf_counter() - t:.1f} s")
        exact64 = np.sum([g.astype(np.float64) for g in grads], axis=0)
        for m in METHODS:
            _progress(f"  {m} ...")
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
            rows.append((name, wl, s["bytes_per_worker"], s["bytes_per_worker"] / (4 * n),
                         exact, dt, extra))
            _progress(f"  {m}: {s['bytes_per_worker']} B/worker, exact {exact}, {dt:.1f} s")
            del r
        del grads

    head = ("method", "workload", "bytes/worker", "vs dense fp32", "bit-exact", "time", "")
    print(f"HomAgg in-process allreduce: W={W}, n={n} float32 per worker "
          f"(dense fp32 = {4 * n} B), density {args.density}")
    fmt = "{:<14} {:<12} {:>13} {:>14} {:<28} {:>7} {}"
    print(fmt.format(*head))
    for name, wl, by, ratio, exact, dt, extra in rows:
        print(fmt.format(name, wl, by, f"{ratio:.3f}", exact, f"{dt:.1f} s", extra))
    bad = [r for r in rows if r[4] == "NO"]
    if bad:
        print(f"{len(bad)} exact method(s) did not match the reference", file=sys.stderr)
        return 1
    return 0
