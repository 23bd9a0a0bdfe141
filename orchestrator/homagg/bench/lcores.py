"""One job over several engine lcores of one homagg-switch (needs root).

Builds a testbed of --workers worker namespaces and one aggregator, links
unshaped unless --link-mbit is given (the daemon's CPU, not a link, should
be the bottleneck), then runs the same allreduce of one job (homagg.runs.allreduce:
homagg-switch on a DPDK virtual PMD, one worker process per namespace) with
the daemon on each engine lcore count of --lcores (N > 1: a dispatcher lcore
hands each slot to engine (job + slot) mod N, docs/SWITCH.md "Several
engines"), --repeat times each, interleaved, after one untimed allreduce
of the same workers.  Every count runs on net_af_packet (homagg.runs.allreduce
refuses af_xdp with several engine lcores), so the PMD is the same.  Per run: the slowest worker's median time
over the timed allreduces, the daemon's CPU seconds, the contributions each
engine summed (the spread of the job's slots); every result must be
bit-exact.  The summary is the median time per lcore count and the speedup
against the first count, measured in the same run.

Outputs with --out DIR: lcores.json, lcores.csv, lcores.md.  --json prints
the report.
"""

import secrets
import tempfile

from homagg.bench import report as rep


def _counts(text):
    return [int(v) for v in text.split(",") if v.strip()]


def add_arguments(parser):
    parser.add_argument("--workers", type=int, default=4, help="worker namespaces (default 4)")
    parser.add_argument(
        "--lcores",
        type=_counts,
        default=[1, 2],
        help="comma-separated engine lcore counts (default 1,2)",
    )
    parser.add_argument(
        "--link-mbit",
        type=float,
        default=None,
        help="shape every link to this rate (default: unshaped)",
    )
    rep.add_allreduce_arguments(parser)
    parser.add_argument("--repeat", type=int, default=3, help="runs per lcore count (default 3)")
    parser.add_argument(
        "--calls",
        type=int,
        default=3,
        help="timed allreduces per run, after one warmup (default 3)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    parser.add_argument(
        "--out", metavar="DIR", default=None, help="write lcores.json/.csv/.md into DIR"
    )


def run(args):
    from homagg.deploy.local.testbed import Testbed
    from homagg.runs import allreduce as runmod

    if not args.lcores or min(args.lcores) < 1 or max(args.lcores) > 64:
        raise SystemExit("--lcores: counts in 1..64")
    sd = tempfile.mkdtemp(prefix="homagg-lcores-")
    name = "l" + secrets.token_hex(4)
    rep.progress(
        "lcores",
        f"testbed {name}: {args.workers} workers, links "
        f"{'unshaped' if args.link_mbit is None else f'{args.link_mbit:g} Mbit/s'}",
    )
    Testbed.up(
        name,
        workers=args.workers,
        link_mbit=args.link_mbit,
        agg_link_mbit=args.link_mbit,
        state_dir=sd,
    )
    rows = []
    try:
        for i in range(args.repeat):
            for n in args.lcores:
                r = runmod.run_allreduce(
                    name,
                    args.method,
                    args.elements,
                    args.density,
                    workload=args.workload,
                    seed=1,
                    state_dir=sd,
                    timeout=30.0,
                    repeat=args.calls,
                    warmup=1,
                    switch_lcores=n,
                    pmd="af_packet",
                )
                agg = r["aggregators"][0]
                row = {
                    "lcores": n,
                    "run": i,
                    "seconds": r["seconds"],
                    "seconds_each": r["seconds_each"],
                    "exact": r["exact"],
                    "workers_agree": r["workers_agree"],
                    "daemon_cpu_seconds": r["daemon_cpu_seconds"],
                    "engine_summed": agg["engine_summed"],
                    "retransmissions": sum(s["retransmissions"] for s in r["worker_stats_timed"]),
                }
                rows.append(row)
                rep.progress(
                    "lcores",
                    f"{n} lcore(s) run {i}: {row['seconds'] * 1e3:.1f} ms, "
                    f"engine_summed {row['engine_summed']}, exact {row['exact']}",
                )
    finally:
        Testbed.down(name, state_dir=sd)
    summary = rep.median_summary(rows, "lcores", args.lcores, f"speedup_vs_{args.lcores[0]}")
    return rep.header(
        benchmark="lcores",
        workers=args.workers,
        link_mbit=args.link_mbit,
        method=args.method,
        elements=args.elements,
        workload=args.workload,
        density=args.density,
        repeat=args.repeat,
        calls=args.calls,
        summary=summary,
        results=rows,
    )


MD_COLUMNS = (
    "lcores",
    "run",
    "seconds",
    "daemon_cpu_seconds",
    "engine_summed",
    "retransmissions",
    "exact",
)


def main(args):
    report = run(args)
    for n, s in report["summary"].items():
        rep.progress(
            "lcores",
            f"{n} lcore(s): median {s['median_seconds'] * 1e3:.1f} ms, "
            + ", ".join(f"{v:.2f}x" for k, v in s.items() if k.startswith("speedup")),
        )
    return rep.finish(
        "lcores",
        args,
        report,
        MD_COLUMNS,
        "One job over several engine lcores of one homagg-switch",
    )
