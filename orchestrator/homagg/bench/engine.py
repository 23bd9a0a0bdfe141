"""Aggregation engine throughput on one core, next to the raw SUM32 kernel.

Pre-built SUM32 frames of W workers go through hg_engine_process() on the
calling thread (an in-memory null port: nothing else is measured); in the
same run the raw SUM32 kernel is timed over the same payload bytes in the
same order, in ten alternating phases (Mpps: the best phase of each; the
means are in --json).  The ratio engine/raw says how much of the kernel's speed the
whole data path (parsing, validation, slot state, results) keeps.  The
engine stages each burst (classify every frame, prefetch its slot, then
apply them in order); ``--one-at-a-time`` adds a third alternating phase in
which the same engine handles each frame completely before the next, with
the full parser only (``one_at_a_time_mpps``, ``staged_vs_one_at_a_time``):
the gain of staging and of the first pass's fast path, measured in the same
run.

    homagg bench engine                 # W = 2, 8, 32; 1024-byte payloads
    homagg bench engine --workers 8 --payload 4096 --json
"""

import json

from homagg.bindings.bench import bench_engine
from homagg.bindings.kernels import isa_best, isa_name
from homagg.kernels import _isa


def run(
    workers,
    payload_bytes=1024,
    slots=16,
    seconds=1.0,
    multicast=True,
    udp_csum=False,
    isa="best",
    burst=32,
    one_at_a_time=False,
):
    """One measurement: a dict with workers, payload_bytes, mpps, raw_kernel_mpps, ..."""
    r = bench_engine(
        workers=workers,
        payload_bytes=payload_bytes,
        slots=slots,
        burst=burst,
        seconds=seconds,
        multicast=multicast,
        udp_csum=udp_csum,
        isa=_isa(isa),
        one_at_a_time=one_at_a_time,
    )
    return {
        "workers": workers,
        "payload_bytes": payload_bytes,
        "slots": slots,
        "multicast": multicast,
        "udp_csum": udp_csum,
        "isa": isa if isa != "best" else isa_name(isa_best()),
        "packets": r["packets"],
        "seconds": r["seconds"],
        "mpps": r["mpps"],
        "gbit_s": r["mpps"] * payload_bytes * 8 / 1e3,
        "mpps_mean": r["mpps_mean"],
        "raw_kernel_mpps": r["raw_kernel_mpps"],
        "raw_kernel_mpps_mean": r["raw_kernel_mpps_mean"],
        "ratio": r["mpps"] / r["raw_kernel_mpps"] if r["raw_kernel_mpps"] else 0.0,
        "one_at_a_time_packets": r["one_packets"],
        "one_at_a_time_mpps": r["one_mpps"] if one_at_a_time else None,
        "one_at_a_time_mpps_mean": r["one_mpps_mean"] if one_at_a_time else None,
        "one_at_a_time_ratio": (
            r["one_mpps"] / r["raw_kernel_mpps"] if one_at_a_time and r["raw_kernel_mpps"] else None
        ),
        "staged_vs_one_at_a_time": (
            r["mpps"] / r["one_mpps"] if one_at_a_time and r["one_mpps"] else None
        ),
        "completed": r["completed"],
        "results_sent": r["results_sent"],
        "dropped": r["dropped"],
    }


def add_arguments(p):
    p.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[2, 8, 32],
        metavar="W",
        help="worker counts to measure (default 2 8 32)",
    )
    p.add_argument(
        "--payload",
        type=int,
        default=1024,
        metavar="BYTES",
        help="SUM32 payload bytes per frame (default 1024)",
    )
    p.add_argument("--slots", type=int, default=16, help="chunks in flight (default 16)")
    p.add_argument(
        "--seconds", type=float, default=1.0, help="time budget of each measurement (default 1)"
    )
    p.add_argument(
        "--unicast",
        action="store_true",
        help="one result frame per worker instead of one multicast frame",
    )
    p.add_argument(
        "--udp-csum",
        action="store_true",
        help="software UDP checksums (verify every frame, fill every result)",
    )
    p.add_argument("--isa", default="best", choices=["best", "portable", "avx2", "avx512"])
    p.add_argument(
        "--burst", type=int, default=32, help="frames per hg_engine_process() call (default 32)"
    )
    p.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="also time the engine frame by frame (unstaged), in the same run",
    )
    p.add_argument("--json", action="store_true", help="print a JSON list of results")


def main(args):
    rows = [
        run(
            w,
            args.payload,
            args.slots,
            args.seconds,
            not args.unicast,
            args.udp_csum,
            args.isa,
            args.burst,
            args.one_at_a_time,
        )
        for w in args.workers
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"engine on one core: SUM32, {args.payload}-byte payloads, "
        f"{'unicast' if args.unicast else 'multicast'} results, "
        f"UDP checksums {'in software' if args.udp_csum else 'offloaded'}, ISA {rows[0]['isa']}"
    )
    one = args.one_at_a_time
    print(
        f"{'W':>4} {'engine Mpps':>12} {'Gbit/s':>8} {'raw kernel Mpps':>16} {'ratio':>6} "
        + (f"{'1-at-a-time Mpps':>17} {'ratio':>6} {'staged/1':>8} " if one else "")
        + f"{'dropped':>8}"
    )
    for r in rows:
        print(
            f"{r['workers']:>4} {r['mpps']:>12.2f} {r['gbit_s']:>8.1f} "
            f"{r['raw_kernel_mpps']:>16.2f} {r['ratio']:>6.2f} "
            + (
                f"{r['one_at_a_time_mpps']:>17.2f} {r['one_at_a_time_ratio']:>6.2f} "
                f"{r['staged_vs_one_at_a_time']:>8.2f} "
                if one
                else ""
            )
            + f"{r['dropped']:>8}"
        )
    return 0
