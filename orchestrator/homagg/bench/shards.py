"""K aggregators against one on the local testbed, every link shaped (needs root).

Builds a testbed of --workers worker namespaces and --aggregators K
aggregator namespaces with every link -- the aggregators' too -- shaped
to --link-mbit in both directions, so that an aggregator's link and not
the CPU is the bottleneck; then runs the same allreduce (homagg.runs.allreduce:
homagg-switch on a DPDK virtual PMD in each aggregator namespace, one
worker process per worker namespace) spread over 1 .. K of them, --repeat
times each, interleaved.  Per run: the slowest worker's time, the bytes
into and out of each aggregator's link (the kernel's counters), the
workers' retransmissions; every result must be bit-exact.  The summary is
the median time per K and the speedup against K = 1 measured in the same
run.

Outputs with --out DIR: shards.json, shards.csv, shards.md.  --json prints
the report.
"""

import secrets
import tempfile

from homagg.bench import report as rep


def add_arguments(parser):
    parser.add_argument("--workers", type=int, default=4, help="worker namespaces (default 4)")
    parser.add_argument(
        "--aggregators",
        type=int,
        default=2,
        help="aggregator namespaces K; runs use 1 .. K of them (default 2)",
    )
    parser.add_argument(
        "--link-mbit",
        type=float,
        default=200.0,
        help="rate of every link, both directions (default 200)",
    )
    rep.add_allreduce_arguments(parser)
    parser.add_argument("--repeat", type=int, default=3, help="runs per K (default 3)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    parser.add_argument(
        "--out", metavar="DIR", default=None, help="write shards.json/.csv/.md into DIR"
    )


def run(args):
    from homagg.deploy.local.testbed import Testbed
    from homagg.runs import allreduce as runmod

    sd = tempfile.mkdtemp(prefix="homagg-shards-")
    name = "s" + secrets.token_hex(4)
    rep.progress(
        "shards",
        f"testbed {name}: {args.workers} workers, {args.aggregators} "
        f"aggregators, every link {args.link_mbit:g} Mbit/s",
    )
    Testbed.up(
        name,
        workers=args.workers,
        link_mbit=args.link_mbit,
        agg_link_mbit=args.link_mbit,
        aggregators=args.aggregators,
        state_dir=sd,
    )
    rows = []
    try:
        for i in range(args.repeat):
            for K in range(1, args.aggregators + 1):
                r = runmod.run_allreduce(
                    name,
                    args.method,
                    args.elements,
                    args.density,
                    workload=args.workload,
                    seed=1,
                    state_dir=sd,
                    aggregators=K,
                    timeout=30.0,
                )
                row = {
                    "aggregators": K,
                    "run": i,
                    "seconds": r["seconds"],
                    "exact": r["exact"],
                    "workers_agree": r["workers_agree"],
                    "agg_rx_bytes": [a["rx_bytes"] for a in r["aggregators"]],
                    "agg_tx_bytes": [a["tx_bytes"] for a in r["aggregators"]],
                    "worker_tx_bytes": r["bytes_per_worker"],
                    "retransmissions": sum(s["retransmissions"] for s in r["worker_stats"]),
                }
                rows.append(row)
                rep.progress(
                    "shards",
                    f"K={K} run {i}: {row['seconds'] * 1e3:.1f} ms, "
                    f"aggregator rx bytes {row['agg_rx_bytes']}, exact {row['exact']}",
                )
    finally:
        Testbed.down(name, state_dir=sd)
    summary = rep.median_summary(
        rows, "aggregators", list(range(1, args.aggregators + 1)), "speedup_vs_k1"
    )
    return rep.header(
        benchmark="shards",
        workers=args.workers,
        link_mbit=args.link_mbit,
        method=args.method,
        elements=args.elements,
        workload=args.workload,
        density=args.density,
        repeat=args.repeat,
        summary=summary,
        results=rows,
    )


MD_COLUMNS = (
    "aggregators",
    "run",
    "seconds",
    "agg_rx_bytes",
    "agg_tx_bytes",
    "retransmissions",
    "exact",
)


def main(args):
    report = run(args)
    for K, s in report["summary"].items():
        rep.progress(
            "shards",
            f"K={K}: median {s['median_seconds'] * 1e3:.1f} ms, {s['speedup_vs_k1']:.2f}x K = 1",
        )
    return rep.finish(
        "shards", args, report, MD_COLUMNS, "K aggregators against one on the shaped local testbed"
    )
