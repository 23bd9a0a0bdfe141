"""Per-step timing of the lhc and union codec (one worker), next to memcpy.

Times each library call of one allreduce on its own, single core.
lhc encode, one pass = hg_scan_encode, hg_lhc_index_encode_scan,
hg_lhc_sketch_encode_scan; the tensor-reading calls they replace
(hg_exp_nnz_encode, hg_lhc_index_encode, hg_lhc_sketch_encode) are timed
too ("previous").  lhc decode = hg_lhc_set_index, hg_lhc_peel,
hg_lhc_decode.  union encode = hg_scan_encode, hg_lhc_index_encode_scan,
hg_union_encode; union decode = hg_lhc_set_index, hg_union_decode.  Each step is the
best of --repeat runs (the machine may be shared: take the best, and read
every figure against the memcpy of the same run).  memcpy = numpy copyto
of the same float32 buffer.  Gradients as in ``homagg bench codec``
(independent random positions, the index's worst case).

    python -m homagg.bench.codec_steps [--elements 67108864] [--repeat 5]
"""

import argparse
import json
import sys
import time

import numpy as np

from homagg import log


def add_arguments(parser):
    from homagg.bench.codec import add_gradient_arguments

    add_gradient_arguments(parser, repeat=5)


def _best(fn, repeat):
    """Best wall time (perf_counter) of repeat runs.  The best CPU time of
    this thread (thread_time) is kept in _best.cpu: on a shared machine it
    leaves out the time the process was not running."""
    best = cpu = float("inf")
    for _ in range(repeat):
        c = time.thread_time()
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        cpu = min(cpu, time.thread_time() - c)
    _best.cpu = cpu
    return best


def run(args):
    from homagg.bench.codec import check_gradient_arguments, lhc_state, make_gradients
    from homagg.bindings import codec as b

    n, W = args.elements, args.workers
    block = check_gradient_arguments(args)
    grads = make_gradients(n, W, args.density, args.seed, args.positions)
    st = lhc_state(grads, block)
    cps, plans, gindex, gcells, gfall, gvals = (
        st.cps,
        st.plans,
        st.gindex,
        st.gcells,
        st.gfall,
        st.gvals,
    )
    params = st.params
    del st
    x, plan = grads[0], plans[0]
    del plans[1:]
    info = plan.info()
    codes = np.empty(params.nblocks(n), dtype=np.int8)
    counts = np.empty(params.nblocks(n), dtype=">i4")
    index = np.empty(info["index_bytes"], dtype=np.uint8)
    cells = np.empty(info["sketch_lanes"], dtype=">i4")
    uvals = np.empty(info["candidates"], dtype=">i4")
    scan = b.scan_encode(cps[0], x)[0]
    del grads[1:]
    y = np.empty(n, dtype=np.float32)
    dst = np.empty_like(x)
    np.copyto(dst, x)
    steps = {
        "previous exponents+counts": lambda: b.exp_nnz_encode_into(cps[0], x, codes, counts),
        "previous index": lambda: b.lhc_index_encode(plan, x, index),
        "previous sketch": lambda: b.lhc_sketch_encode(plan, x, cells),
        "scan": lambda: b.scan_encode_into(scan, cps[0], x, codes, counts),
        "index": lambda: b.lhc_index_encode_scan(plan, scan, index),
        "sketch": lambda: b.lhc_sketch_encode_scan(plan, scan, cells),
        "union values": lambda: b.union_encode(plan, scan, uvals),
        "set_index": lambda: b.lhc_set_index(plan, gindex),
        "peel": lambda: b.lhc_peel(plan, gcells),
        "output": lambda: b.lhc_decode_into(plan, gfall, y),
        "union scatter": lambda: b.union_decode_into(plan, gvals, y),
    }
    ms = {"memcpy": _best(lambda: np.copyto(dst, x), args.repeat) * 1e3}
    cpu_ms = {"memcpy": _best.cpu * 1e3}
    for name, fn in steps.items():
        ms[name] = _best(fn, args.repeat) * 1e3
        cpu_ms[name] = _best.cpu * 1e3
    ms["memcpy_after"] = _best(lambda: np.copyto(dst, x), args.repeat) * 1e3
    cpu_ms["memcpy_after"] = _best.cpu * 1e3
    mem = min(ms["memcpy"], ms["memcpy_after"])
    cmem = min(cpu_ms["memcpy"], cpu_ms["memcpy_after"])

    def total(d, keys):
        return sum(d[k] for k in keys)

    parts = {
        "previous_encode": ("previous exponents+counts", "previous index", "previous sketch"),
        "encode": ("scan", "index", "sketch"),
        "decode": ("set_index", "peel", "output"),
        "union_encode": ("scan", "index", "union values"),
        "union_decode": ("set_index", "union scatter"),
    }
    enc = total(ms, parts["encode"])
    dec = total(ms, parts["decode"])
    info = plan.info()
    return {
        "elements": n,
        "workers": W,
        "density": args.density,
        "block_elements": block,
        "candidates": info["candidates"],
        "stalled_blocks": info["stalled_blocks"],
        "fallback_lanes": info["fallback_lanes"],
        "ms": ms,
        "cpu_ms": cpu_ms,
        "encode_ms": enc,
        "decode_ms": dec,
        "encode_x_memcpy": mem / enc,
        "decode_x_memcpy": mem / dec,
        "totals_ms": {k: total(ms, v) for k, v in parts.items()},
        "totals_cpu_ms": {k: total(cpu_ms, v) for k, v in parts.items()},
        "cpu_x_memcpy": {k: cmem / total(cpu_ms, v) for k, v in parts.items()},
    }


def main(args):
    out = run(args)
    if args.json:
        print(json.dumps(out))
        return 0
    ms, cpu = out["ms"], out["cpu_ms"]
    print(
        f"{out['elements']} float32, block {out['block_elements']}, W={out['workers']}, "
        f"density {out['density']}: {out['candidates']} candidates, "
        f"{out['stalled_blocks']} stalled blocks, {out['fallback_lanes']} fallback lanes"
    )
    print("wall ms (best), CPU ms of the thread (best)")
    print(
        f"memcpy            {min(ms['memcpy'], ms['memcpy_after']):8.1f} "
        f"{min(cpu['memcpy'], cpu['memcpy_after']):8.1f}   "
        f"(wall before {ms['memcpy']:.1f}, after {ms['memcpy_after']:.1f})"
    )
    for k in ms:
        if not k.startswith("memcpy"):
            print(f"  {k:25s} {ms[k]:8.1f} {cpu[k]:8.1f}")
    for k, t in out["totals_ms"].items():
        print(
            f"{k:27s} {t:8.1f} {out['totals_cpu_ms'][k]:8.1f}   "
            f"{out['cpu_x_memcpy'][k]:.2f}x memcpy (CPU)"
        )
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    log.setup()
    add_arguments(ap)
    sys.exit(main(ap.parse_args()))
