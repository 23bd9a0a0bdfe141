"""lhc codec throughput and wire bytes, next to memcpy and numpy baselines.

Single core.  Encode = one worker's exponents + counts + index + sketch
(the worker-side cost of one lhc allreduce: the one-pass scan, then the
index and sketch from the scan's non-zeros); decode = one worker's
set_index + peel + output of the float32 result.  union_encode = the scan
+ index + union values; union_decode = set_index + the scatter of the
summed values.  All as GB/s of float32 input (4 bytes per element), best of
--repeat runs, on each ISA path of the codec (--isa, every path this CPU
has by default: each row names its path, HOMAGG_CODEC_ISA forced for it;
every path gives the same bits, "paths_bit_identical"), next to:

- memcpy: numpy copyto of the same buffer into a preallocated array,
  measured in the same run, right after each path's timings (the speed of
  touching the data once; on a shared machine read the ratios, not the
  GB/s);
- numpy: a plain numpy implementation of the same encode and decode
  (homagg.bench.numpy_codec), on the same gradients.

Wire: lhc bytes per worker (all phases) against the bound index bytes +
1.23 x 4 x global non-zeros (distinct non-zero positions), union's bytes
against lhc's, and auto's bytes against the smallest exact method (dense,
blocks, lhc, union) run on the same data.

The top-level figures are those of the path the codec takes by default
(the best this CPU has) when it is measured, else of the last one listed;
"paths" holds one row per path.

Targets (reported, not asserted; on every path): encode >= 0.5x memcpy, lhc decode >=
0.25x memcpy, union decode >= 0.5x memcpy, >= 20x numpy, lhc wire <= 1.10x
bound, union wire <= 0.85x lhc's, auto <= 1.05x the smallest exact method.
"""

import json
import time

import numpy as np

from homagg.bench import report as rep


POSITIONS = ("independent", "shared")


def add_gradient_arguments(parser, repeat):
    """The gradients and timed runs (shared with homagg.bench.codec_steps)."""
    parser.add_argument(
        "--elements",
        type=int,
        default=2**26,
        help="elements per worker, a multiple of the block (default 2^26)",
    )
    parser.add_argument(
        "--density",
        type=float,
        default=0.05,
        help="fraction of non-zero elements per worker, in (0, 1] (default 0.05)",
    )
    parser.add_argument("--workers", type=int, default=4, help="workers W (default 4)")
    parser.add_argument(
        "--positions",
        choices=POSITIONS,
        default="independent",
        help="where the workers' non-zeros are: independent positions per "
        "worker (the index's worst case; default) or the same positions on "
        "every worker (the allreduce benchmark's 'shared' workload)",
    )
    parser.add_argument(
        "--block", type=int, default=None, help="block elements (default HG_DEFAULT_BLOCK)"
    )
    parser.add_argument(
        "--repeat", type=int, default=repeat, help=f"timed runs, best kept (default {repeat})"
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the gradients")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def check_gradient_arguments(args):
    """The block, or SystemExit with one line naming the bad option and the fix."""
    from homagg.bindings import codec

    block = args.block or codec.DEFAULT_BLOCK
    if not (codec.MIN_BLOCK <= block <= codec.MAX_BLOCK and block % 64 == 0):
        raise SystemExit(
            f"--block {block}: use a multiple of 64 in {codec.MIN_BLOCK}..{codec.MAX_BLOCK}"
        )
    n = args.elements
    if n <= 0 or n % block:
        fix = f"e.g. {max(1, round(n / block)) * block}" if n > 0 else f"e.g. {block}"
        raise SystemExit(
            f"--elements {n}: use a positive multiple of the block ({block} elements), {fix}"
        )
    if not 0.0 < args.density <= 1.0:
        raise SystemExit(f"--density {args.density}: use a fraction in (0, 1], e.g. 0.05")
    if not 1 <= args.workers <= codec.MAX_WORKERS:
        raise SystemExit(f"--workers {args.workers}: use 1..{codec.MAX_WORKERS}")
    if args.repeat < 1:
        raise SystemExit(f"--repeat {args.repeat}: use 1 or more")
    return block


def parse_isas(text):
    """--isa: a comma-separated list of codec paths; by default every path
    this CPU has (SystemExit naming a path that does not exist or that this
    CPU lacks)."""
    from homagg.bindings import codec as b

    if not text:
        return [i for i in b.CODEC_ISAS if _isa_available(i)]
    isas = [t.strip() for t in text.split(",") if t.strip()]
    for i in isas:
        if i not in b.CODEC_ISAS:
            raise SystemExit(f"--isa {i}: use a comma-separated list of {', '.join(b.CODEC_ISAS)}")
        if not _isa_available(i):
            raise SystemExit(
                f"--isa {i}: this CPU lacks that path; use one of "
                f"{', '.join(x for x in b.CODEC_ISAS if _isa_available(x))}"
            )
    return isas


def _isa_available(isa):
    from homagg.errors import InvalidArgument

    try:
        with forced_isa(isa):
            return True
    except InvalidArgument:
        return False


class forced_isa:
    """Run the codec on ISA path isa inside the block (HOMAGG_CODEC_ISA set
    and read again), restoring the previous setting after."""

    def __init__(self, isa):
        self.isa = isa

    def __enter__(self):
        import os

        from homagg.bindings import codec as b

        self.old = os.environ.get("HOMAGG_CODEC_ISA")
        os.environ["HOMAGG_CODEC_ISA"] = self.isa
        try:
            b.codec_isa_reload()
        except BaseException:
            self.__exit__()
            raise
        return self.isa

    def __exit__(self, *exc):
        import os

        from homagg.bindings import codec as b

        if self.old is None:
            os.environ.pop("HOMAGG_CODEC_ISA", None)
        else:
            os.environ["HOMAGG_CODEC_ISA"] = self.old
        try:
            b.codec_isa_reload()
        except Exception:
            pass  # the caller's own setting was bad: its next codec call says so
        return False


def add_arguments(parser):
    add_gradient_arguments(parser, repeat=3)
    parser.add_argument("--no-numpy", action="store_true", help="skip the numpy baseline")
    parser.add_argument(
        "--link-mbit",
        type=float,
        default=0,
        metavar="MBIT",
        help="plan the index by the cost model at this link rate with this host's "
        "calibration (`homagg calibrate`; built-in defaults without one), as a job "
        "that registers the link does: bitmap, Bloom or split-block per block by "
        "predicted time (default 0: the bytes rule; the numpy baseline follows "
        "the bytes rule only, so it is skipped)",
    )
    parser.add_argument(
        "--isa",
        default=None,
        metavar="PATHS",
        help="codec ISA paths to time, comma-separated, of portable, avx2, "
        "avx512 (default: every path this CPU has); the same as running "
        "with HOMAGG_CODEC_ISA=<path>, which forces the path of any "
        "homagg command",
    )


def _progress(msg):
    rep.progress("codec", msg)


def _best(fn, repeat):
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def make_gradients(n, workers, density, seed, positions="independent"):
    """W gradients, values ~ N(0, 1e-3), with independent non-zero
    positions (the index's worst case) or, positions "shared", the same
    ones on every worker."""
    rng = np.random.default_rng(seed)
    k = int(round(density * n))
    grads, pos = [], None
    for _ in range(workers):
        g = np.zeros(n, dtype=np.float32)
        if pos is None or positions != "shared":
            pos = rng.choice(n, size=k, replace=False) if k < n else np.arange(n)
        g[pos] = (rng.standard_normal(k) * 1e-3).astype(np.float32)
        grads.append(g)
    return grads


def lhc_state(grads, block, cost=None):
    """The global state of one lhc allreduce of grads (C kernels): the
    aggregated codes, counts, index, sketch cells and fallback lanes, and
    every worker's plan, set to the index and peeled.  cost: the job's
    cost model (struct hg_cost fields), None = the bytes rules."""
    from types import SimpleNamespace

    from homagg import codec
    from homagg.bindings import codec as b

    W, n = len(grads), grads[0].size
    params = codec.Params(block_elements=block, workers=W, cost=cost)
    cps = [params.c(w) for w in range(W)]
    gcodes = codec.aggregate("max8", None, [b.exp_encode(cps[w], grads[w]) for w in range(W)])
    gcounts = codec.aggregate("sum32", None, [b.nnz_counts(cps[w], grads[w]) for w in range(W)])
    plans = [b.lhc_create(cps[w], n, gcodes, gcounts) for w in range(W)]
    gindex = codec.aggregate("or", None, [b.lhc_index_encode(plans[w], grads[w]) for w in range(W)])
    for pl in plans:
        b.lhc_set_index(pl, gindex)
    gcells = codec.aggregate(
        "sum32", None, [b.lhc_sketch_encode(plans[w], grads[w]) for w in range(W)]
    )
    for pl in plans:
        b.lhc_peel(pl, gcells)
    gfall = codec.aggregate(
        "sum32",
        np.zeros(plans[0].info()["fallback_lanes"], dtype=">i4"),
        [b.lhc_fallback_encode(plans[w], grads[w]) for w in range(W)],
    )
    gvals = codec.aggregate(
        "sum32",
        None,
        [b.union_encode(plans[w], b.scan_encode(cps[w], grads[w])[0]) for w in range(W)],
    )
    return SimpleNamespace(
        params=params,
        cps=cps,
        plans=plans,
        gcodes=gcodes,
        gcounts=gcounts,
        gindex=gindex,
        gcells=gcells,
        gfall=gfall,
        gvals=gvals,
    )


def _time_path(isa, args, x, cps, plan, gindex, gcells, gfall, gvals, nb):
    """One ISA path's timings of worker 0 (its figures and outputs)."""
    from homagg.bindings import codec as b

    n, gb = x.size, 4 * x.size / 1e9
    info = plan.info()
    # Encode: worker 0, preallocated outputs, the one-pass scan first.
    scan = b.scan_new()
    codes = np.empty(nb, dtype=np.int8)
    counts = np.empty(nb, dtype=">i4")
    index = np.empty(info["index_bytes"], dtype=np.uint8)
    cells = np.empty(info["sketch_lanes"], dtype=">i4")
    uvals = np.empty(b.union_lanes(plan), dtype=">i4")
    enc_parts = {
        "exponents+counts": lambda: b.scan_encode_into(scan, cps[0], x, codes, counts),
        "index": lambda: b.lhc_index_encode_scan(plan, scan, index),
        "sketch": lambda: b.lhc_sketch_encode_scan(plan, scan, cells),
    }
    _progress(f"{isa}: timing encode (scan: exponents + counts; index + sketch from the scan)")

    def encode_all():
        for f in enc_parts.values():
            f()

    def union_encode_all():
        enc_parts["exponents+counts"]()
        enc_parts["index"]()
        b.union_encode(plan, scan, uvals)

    t_enc = _best(encode_all, args.repeat)
    enc_breakdown = {k: _best(f, args.repeat) for k, f in enc_parts.items()}
    t_uenc = _best(union_encode_all, args.repeat)
    enc_breakdown["union_values"] = _best(lambda: b.union_encode(plan, scan, uvals), args.repeat)

    # Decode: set_index + peel + output (fallback summed once, outside).
    y = np.empty(n, dtype=np.float32)
    _progress(f"{isa}: timing decode (set_index + peel + output)")

    def decode_all():
        b.lhc_set_index(plan, gindex)
        b.lhc_peel(plan, gcells)
        b.lhc_decode_into(plan, gfall, y)

    t_dec = _best(decode_all, args.repeat)
    dec_breakdown = {
        "set_index": _best(lambda: b.lhc_set_index(plan, gindex), args.repeat),
    }
    dec_breakdown["peel"] = _best(lambda: b.lhc_peel(plan, gcells), args.repeat)
    dec_breakdown["output"] = _best(lambda: b.lhc_decode_into(plan, gfall, y), args.repeat)
    info = plan.info()

    _progress(f"{isa}: timing union decode (set_index + scatter)")
    yu = np.empty(n, dtype=np.float32)

    def union_decode_all():
        b.lhc_set_index(plan, gindex)
        b.union_decode_into(plan, gvals, yu)

    t_udec = _best(union_decode_all, args.repeat)
    dec_breakdown["union_scatter"] = _best(
        lambda: b.union_decode_into(plan, gvals, yu), args.repeat
    )

    _progress(f"{isa}: timing memcpy (numpy copyto, same buffer)")
    dst = np.empty_like(x)
    np.copyto(dst, x)
    t_mem = _best(lambda: np.copyto(dst, x), args.repeat)
    row = {
        "isa": isa,
        "encode_seconds": t_enc,
        "decode_seconds": t_dec,
        "memcpy_seconds": t_mem,
        "encode_gbps": gb / t_enc,
        "decode_gbps": gb / t_dec,
        "memcpy_gbps": gb / t_mem,
        "encode_vs_memcpy": t_mem / t_enc,
        "decode_vs_memcpy": t_mem / t_dec,
        "encode_breakdown_seconds": enc_breakdown,
        "decode_breakdown_seconds": dec_breakdown,
        "candidates": info["candidates"],
        "stalled_blocks": info["stalled_blocks"],
        "fallback_lanes": info["fallback_lanes"],
        "union_encode_seconds": t_uenc,
        "union_decode_seconds": t_udec,
        "union_encode_gbps": gb / t_uenc,
        "union_decode_gbps": gb / t_udec,
        "union_encode_vs_memcpy": t_mem / t_uenc,
        "union_decode_vs_memcpy": t_mem / t_udec,
        "union_decode_matches_lhc_decode": bool(
            np.array_equal(yu.view(np.uint32), y.view(np.uint32))
        ),
    }
    outputs = (codes, counts, index, cells, uvals, y, yu)
    return row, outputs


def run(args):
    from homagg import codec
    from homagg.bench import numpy_codec as npc
    from homagg.bindings import codec as b

    from homagg.errors import InvalidArgument

    block = check_gradient_arguments(args)
    try:
        b.codec_isa()  # a bad HOMAGG_CODEC_ISA: one line, no traceback
    except InvalidArgument as e:
        raise SystemExit(str(e)) from None
    model = None
    if getattr(args, "link_mbit", 0):
        from homagg import cost as _cost

        if not args.link_mbit >= 1:
            raise SystemExit(
                f"--link-mbit {args.link_mbit:g}: use a link rate of at least 1 Mbit/s "
                "(0: the bytes rule)"
            )
        try:
            model = _cost.job_cost(args.link_mbit).fields()
        except InvalidArgument as e:  # a bad calibration file: one line
            raise SystemExit(str(e)) from None
        if not args.no_numpy:
            _progress("--link-mbit: the numpy baseline follows the bytes rule, skipped")
            args.no_numpy = True

    isas = parse_isas(getattr(args, "isa", None))
    n, W = args.elements, args.workers
    _progress(
        f"{W} gradients of {n} float32 ({4 * n / 2**20:.0f} MiB each), density {args.density}"
    )
    grads = make_gradients(n, W, args.density, args.seed, args.positions)

    # The global state every worker gets from the aggregator (C kernels).
    _progress("meta phase and index of every worker")
    st = lhc_state(grads, block, model)
    cps, plans, nb = st.cps, st.plans, st.params.nblocks(n)
    gcodes, gcounts, gindex, gcells, gfall, gvals = (
        st.gcodes,
        st.gcounts,
        st.gindex,
        st.gcells,
        st.gfall,
        st.gvals,
    )
    del st
    x = grads[0]
    plan = plans[0]
    del plans
    kinds = {k: plan.info()[k] for k in ("bitmap_blocks", "bloom_blocks", "split_blocks")}

    rows, first = [], None
    identical = True
    for isa in isas:
        with forced_isa(isa):
            row, outs = _time_path(isa, args, x, cps, plan, gindex, gcells, gfall, gvals, nb)
        rows.append(row)
        if first is None:
            first = outs
        else:
            identical &= all(
                np.array_equal(a.view(np.uint8), c.view(np.uint8)) for a, c in zip(first, outs)
            )
    default = b.codec_isa()
    top = next((r for r in rows if r["isa"] == default), rows[-1])
    y, yu = (first[5], first[6])
    uvals = first[4]
    out = {
        "elements": n,
        "workers": W,
        "density": args.density,
        "positions": args.positions,
        "block_elements": block,
        "default_isa": default,
        "link_mbit": args.link_mbit if model else 0,
        "cost": model,
        "index_blocks": kinds,
        "paths": rows,
        "paths_bit_identical": identical,
    }
    out.update(top)

    if not args.no_numpy:
        _progress("numpy baseline: encode")
        t_np_enc = _best(
            lambda: npc.encode(x, block, W, gcodes=gcodes, gindex=gindex, gcounts=gcounts),
            max(1, args.repeat - 2),
        )
        layout = npc.Layout(gindex, n, block, gcodes, W, 0, gcounts)
        # numpy's own summed sketch (equal to the C one when both follow
        # the protocol; "numpy_sketch_identical" says whether they do).
        np_cells = np.zeros(layout.lanes, dtype=np.int64)
        for g in grads:
            np_cells += npc.sketch_encode(g, layout)
        np_cells = ((np_cells + 2**31) % 2**32 - 2**31).astype(np.int32)
        out["numpy_sketch_identical"] = bool(np.array_equal(np_cells, gcells.astype(np.int32)))
        _progress("numpy baseline: decode (peeling)")
        _, done = npc.peel(np_cells, layout)
        miss = layout.cand[~done]
        fb = sum(npc.quantize_at(g, miss, layout) for g in grads) if miss.size else None
        t0 = time.perf_counter()
        y_np = npc.decode(np_cells, layout, fb)
        t_np_dec = time.perf_counter() - t0
        out.update(
            {
                "numpy_encode_seconds": t_np_enc,
                "numpy_decode_seconds": t_np_dec,
                "numpy_encode_speedup": t_np_enc / out["encode_seconds"],
                "numpy_decode_speedup": t_np_dec / out["decode_seconds"],
                "numpy_speedup": (t_np_enc + t_np_dec)
                / (out["encode_seconds"] + out["decode_seconds"]),
                "numpy_decode_bit_identical": bool(
                    np.array_equal(y_np.view(np.uint32), y.view(np.uint32))
                ),
            }
        )
        _progress("numpy baseline: union encode and decode")
        t0 = time.perf_counter()
        np_vals = npc.union_encode(x, layout)
        t_np_uenc = time.perf_counter() - t0
        np_gvals = sum(npc.union_encode(g, layout) for g in grads)
        t0 = time.perf_counter()
        y_np_u = npc.union_decode(np_gvals, layout)
        t_np_udec = time.perf_counter() - t0
        out.update(
            {
                "numpy_union_encode_seconds": t_np_uenc,
                "numpy_union_decode_seconds": t_np_udec,
                "numpy_union_values_identical": bool(
                    np.array_equal(np_vals, uvals.astype(np.int64))
                ),
                "numpy_union_decode_bit_identical": bool(
                    np.array_equal(y_np_u.view(np.uint32), yu.view(np.uint32))
                ),
            }
        )

    # Wire bytes of every method on the same gradients.
    union = np.zeros(n, dtype=bool)
    for g in grads:
        union |= g != 0
    global_nnz = int(np.count_nonzero(union))
    del union
    by = {}
    for m in ("dense", "blocks", "lhc", "union", "auto"):
        _progress(f"wire bytes: simulate_allreduce method={m}")
        r = codec.simulate_allreduce(grads, method=m, block_elements=block, cost=model)
        by[m] = r.stats
        if m == "lhc":
            lhc_sum = r.sum
        del r
    bound = by["lhc"]["index_bytes"] + 1.23 * 4 * global_nnz
    smallest = min(by[m]["bytes_per_worker"] for m in ("dense", "blocks", "lhc", "union"))
    out.update(
        {
            "wire_bytes": by["lhc"]["bytes_per_worker"],
            "wire_bytes_by_phase": by["lhc"]["bytes_sent"],
            "wire_bound_bytes": bound,
            "wire_vs_bound": by["lhc"]["bytes_per_worker"] / bound,
            "global_nonzeros": global_nnz,
            "dense_fp32_bytes": 4 * n,
            "method_bytes": {m: by[m]["bytes_per_worker"] for m in by},
            "auto_choice": by["auto"]["auto_choice"],
            "auto_bytes": by["auto"]["bytes_per_worker"],
            "smallest_exact_bytes": smallest,
            "auto_vs_smallest": by["auto"]["bytes_per_worker"] / smallest,
            "lhc_decode_matches_bench_decode": bool(
                np.array_equal(lhc_sum.view(np.uint32), y.view(np.uint32))
            ),
            "union_wire_bytes": by["union"]["bytes_per_worker"],
            "union_wire_vs_lhc": by["union"]["bytes_per_worker"] / by["lhc"]["bytes_per_worker"],
        }
    )
    return out


TARGETS = (
    ("encode_vs_memcpy", ">=", 0.5),
    ("union_encode_vs_memcpy", ">=", 0.5),
    ("decode_vs_memcpy", ">=", 0.25),
    ("union_decode_vs_memcpy", ">=", 0.5),
    ("union_wire_vs_lhc", "<=", 0.85),
    ("numpy_speedup", ">=", 20.0),
    ("wire_vs_bound", "<=", 1.10),
    ("auto_vs_smallest", "<=", 1.05),
)


def targets(out):
    res = {}
    for key, op, v in TARGETS:
        if key in out:
            res[key] = {
                "value": out[key],
                "target": f"{op} {v}",
                "met": out[key] >= v if op == ">=" else out[key] <= v,
            }
    return res


def main(args):
    out = run(args)
    out["targets"] = targets(out)
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    print(
        f"lhc codec, {out['elements']} elements, W={out['workers']}, density {out['density']} "
        f"({out['positions']} positions), "
        f"block {out['block_elements']}, ISA paths {', '.join(r['isa'] for r in out['paths'])} "
        f"(default {out['default_isa']}; same bits on every path: "
        f"{'yes' if out['paths_bit_identical'] else 'NO'})"
    )
    k = out["index_blocks"]
    print(
        f"  index   {k['bitmap_blocks']} bitmap, {k['bloom_blocks'] - k['split_blocks']} Bloom, "
        f"{k['split_blocks']} split-block blocks ("
        + (
            f"cost model at {out['link_mbit']:g} Mbit/s"
            if out["link_mbit"]
            else "bytes rule; --link-mbit plans by predicted time"
        )
        + ")"
    )
    for r in out["paths"]:
        print(
            f"  {r['isa']:8s} encode {r['encode_gbps']:6.2f} GB/s ({r['encode_vs_memcpy']:.2f}x "
            f"memcpy), decode {r['decode_gbps']:6.2f} GB/s ({r['decode_vs_memcpy']:.2f}x); union "
            f"encode {r['union_encode_vs_memcpy']:.2f}x, decode "
            f"{r['union_decode_vs_memcpy']:.2f}x; memcpy {r['memcpy_gbps']:.2f} GB/s"
        )
    print(
        f"  union   wire {out['union_wire_bytes']} B/worker ({out['union_wire_vs_lhc']:.3f}x lhc)"
    )
    if "numpy_speedup" in out:
        print(
            f"  numpy   encode {out['numpy_encode_seconds']:.2f} s, decode "
            f"{out['numpy_decode_seconds']:.2f} s: C is {out['numpy_speedup']:.1f}x faster"
        )
    print(
        f"  wire    {out['wire_bytes']} B/worker, bound {out['wire_bound_bytes']:.0f} B "
        f"({out['wire_vs_bound']:.3f}x); dense fp32 {out['dense_fp32_bytes']} B"
    )
    print(
        f"  auto    chose {out['auto_choice']}: {out['auto_bytes']} B vs smallest exact "
        f"{out['smallest_exact_bytes']} B ({out['auto_vs_smallest']:.3f}x)"
    )
    for k, t in out["targets"].items():
        print(f"  target  {k} {t['target']}: {t['value']:.3f} {'met' if t['met'] else 'NOT met'}")
    return 0
