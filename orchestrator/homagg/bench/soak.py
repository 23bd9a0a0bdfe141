"""Soak: back-to-back allreduces on the local testbed under loss and daemon restarts.

Needs root: it builds a testbed (W worker namespaces, tc-shaped veth links,
homagg-switch on a DPDK virtual PMD), keeps one job and its W worker
processes for --minutes (homagg.runs.session.Session), and runs allreduces one
after the other, each with a random method (from --methods), a random size
(log-uniform in --min-elements..--max-elements), a random density and
workload, while the daemon's port drops --drop-rate of what it receives and
the daemon is restarted (SIGTERM, a new daemon, the job added again) every
--restart-every seconds, between allreduces.  It reports:

- allreduces done, how many were bit-exact against the fixed-point
  reference (nc: the workers agree), failures (with their errors; after one
  the job is re-added and the workers' clients are reset);
- retransmissions (the workers' total) and frames the port dropped;
- the daemon's resident set (VmRSS) at the start and the end of every
  daemon life (it must stay flat);
- counter consistency at the end of every life: every frame the ethdev
  received is in exactly one port counter, every frame handed to the engine
  in exactly one engine outcome counter (homagg.runs.session.accounting).

Progress goes to stderr every --progress seconds; --json prints the
report.  Exit status 0 when every allreduce was exact and every life's
counters were consistent.
"""

import math
import random
import secrets
import sys
import tempfile
import time

from homagg import protocol
from homagg.bench.workloads import WORKLOADS

DENSITIES = (0.01, 0.05, 0.2, 1.0)


def add_arguments(parser):
    parser.add_argument(
        "--minutes", type=float, required=True, metavar="M", help="how long to run allreduces"
    )
    parser.add_argument("--workers", type=int, default=4, metavar="W")
    parser.add_argument(
        "--link-mbit",
        type=float,
        default=1000,
        metavar="R",
        help="worker link rate (default: %(default)s)",
    )
    parser.add_argument(
        "--drop-rate",
        type=float,
        default=0.01,
        metavar="P",
        help="fraction of received frames the daemon drops (default: %(default)s)",
    )
    parser.add_argument(
        "--restart-every",
        type=float,
        default=20.0,
        metavar="S",
        help="restart the daemon every S seconds, between allreduces "
        "(0: never; default: %(default)s)",
    )
    parser.add_argument(
        "--methods",
        default=",".join(protocol.METHODS),
        help="comma-separated methods to draw from (default: all)",
    )
    parser.add_argument("--min-elements", type=int, default=1000, metavar="N")
    parser.add_argument("--max-elements", type=int, default=200_000, metavar="N")
    parser.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="S",
        help="a worker gives up on a chunk after S seconds (default: %(default)s)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the random choices (default: random, reported)",
    )
    parser.add_argument(
        "--progress",
        type=float,
        default=10.0,
        metavar="S",
        help="a progress line on stderr every S seconds (default: %(default)s)",
    )
    parser.add_argument("--pmd", choices=("auto", "af_xdp", "af_packet"), default="auto")
    parser.add_argument("--state-dir", default=None, metavar="DIR", help="testbed state directory")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


class _Life:
    """Figures of one daemon life."""

    def __init__(self, session):
        from homagg.runs.session import rss_kb

        self.pid = session.switch_pid()
        self.rss_start_kb = rss_kb(self.pid)
        self.allreduces = 0

    def end(self, session) -> dict:
        from homagg.runs.session import accounting, rss_kb

        stats = session.stats()
        return {
            "pid": self.pid,
            "allreduces": self.allreduces,
            "rss_start_kb": self.rss_start_kb,
            "rss_end_kb": rss_kb(self.pid),
            "accounting": accounting(stats),
            "port": stats["port"],
        }


def soak(args, out=sys.stderr) -> dict:
    """Run the soak; returns the report (see the module doc)."""
    from homagg.deploy.local.testbed import Testbed
    from homagg.runs.session import Session

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in protocol.METHODS]
    if not methods or unknown:
        raise SystemExit(
            f"homagg bench soak: --methods: unknown {unknown}; "
            f"choose from {','.join(protocol.METHODS)}"
        )
    if not 1 <= args.min_elements <= args.max_elements:
        raise SystemExit("homagg bench soak: need 1 <= --min-elements <= --max-elements")
    seed = args.seed if args.seed is not None else secrets.randbits(32)
    rng = random.Random(seed)
    name = "soak" + secrets.token_hex(3)
    tb = Testbed.up(name, args.workers, link_mbit=args.link_mbit, state_dir=args.state_dir)
    lives, runs, failures = [], [], []
    try:
        with (
            tempfile.TemporaryDirectory(prefix="homagg-soak-") as wd,
            Session(tb, wd, drop_rate=args.drop_rate, timeout=args.timeout, pmd=args.pmd) as s,
        ):
            # the soak's minutes count from when the daemon and the workers
            # are up (their start takes seconds on a loaded host)
            t_start = time.monotonic()
            life = _Life(s)
            end = t_start + args.minutes * 60.0
            next_restart = t_start + args.restart_every if args.restart_every > 0 else math.inf
            next_progress = t_start + args.progress
            while time.monotonic() < end:
                # a restart comes between allreduces, and an allreduce
                # follows it: every life of the daemon serves one at least
                if time.monotonic() >= next_restart and life.allreduces > 0:
                    lives.append(life.end(s))
                    s.restart_switch()
                    life = _Life(s)
                    next_restart = time.monotonic() + args.restart_every
                method = rng.choice(methods)
                n = int(
                    round(
                        math.exp(
                            rng.uniform(math.log(args.min_elements), math.log(args.max_elements))
                        )
                    )
                )
                density, workload = rng.choice(DENSITIES), rng.choice(WORKLOADS)
                r = s.allreduce(method, n, density, workload, seed=rng.randrange(1 << 30))
                life.allreduces += 1
                good = r["ok"] and r["exact"] is not False and r["workers_agree"]
                runs.append(
                    {
                        "method": method,
                        "elements": n,
                        "density": density,
                        "workload": workload,
                        "ok": r["ok"],
                        "exact": r["exact"],
                        "good": good,
                        "retransmissions": sum(w.get("retransmissions", 0) for w in r["workers"]),
                    }
                )
                if not r["ok"]:
                    failures.append(
                        {
                            "at_seconds": time.monotonic() - t_start,
                            "method": method,
                            "elements": n,
                            "errors": r["errors"],
                        }
                    )
                    s.recover()
                now = time.monotonic()
                if now >= next_progress:
                    next_progress = now + args.progress
                    print(
                        _progress_line(
                            now - t_start, args.minutes, runs, failures, len(lives), life
                        ),
                        file=out,
                        flush=True,
                    )
            lives.append(life.end(s))
    finally:
        Testbed.down(name, state_dir=args.state_dir)
    minutes = (time.monotonic() - t_start) / 60.0
    exact_runs = [r for r in runs if r["exact"] is not None]
    report = {
        "minutes": minutes,
        "seed": seed,
        "workers": args.workers,
        "link_mbit": args.link_mbit,
        "drop_rate": args.drop_rate,
        "methods": methods,
        "allreduces": len(runs),
        "exact": sum(1 for r in exact_runs if r["exact"]),
        "exact_checked": len(exact_runs),
        "all_good": all(r["good"] for r in runs) and bool(runs),
        "failures": failures,
        "retransmissions": sum(r["retransmissions"] for r in runs),
        "frames_dropped_by_port": sum(lf["port"]["drop_injected"] for lf in lives),
        "daemon_lives": len(lives),
        "daemon_restarts": len(lives) - 1,
        "rss_start_kb": lives[0]["rss_start_kb"],
        "rss_end_kb": lives[-1]["rss_end_kb"],
        "rss_max_growth_kb": max(
            (lf["rss_end_kb"] or 0) - (lf["rss_start_kb"] or 0) for lf in lives
        ),
        "counters_consistent": all(lf["accounting"]["consistent"] for lf in lives),
        "lives": lives,
        "per_method": {m: sum(1 for r in runs if r["method"] == m) for m in methods},
    }
    return report


def _progress_line(elapsed, minutes, runs, failures, restarts, life) -> str:
    from homagg.runs.session import rss_kb

    rss = rss_kb(life.pid)
    return (
        f"soak: {elapsed / 60:.1f}/{minutes:g} min, {len(runs)} allreduces, "
        f"{sum(1 for r in runs if r['good'])} good, {len(failures)} failed, "
        f"{restarts} daemon restarts, daemon RSS {rss / 1024 if rss else float('nan'):.1f} MiB"
    )


def _text(rep) -> str:
    lines = [
        f"soak: {rep['minutes']:.1f} min, {rep['workers']} workers, drop rate {rep['drop_rate']:g}, "
        f"seed {rep['seed']}",
        f"  allreduces: {rep['allreduces']} ({', '.join(f'{m} {k}' for m, k in rep['per_method'].items())})",
        f"  bit-exact: {rep['exact']} of {rep['exact_checked']} exact-method allreduces; "
        f"all good: {rep['all_good']}; failures: {len(rep['failures'])}",
        f"  retransmissions: {rep['retransmissions']}; frames dropped by the port: "
        f"{rep['frames_dropped_by_port']}",
        f"  daemon: {rep['daemon_lives']} lives ({rep['daemon_restarts']} restarts); RSS "
        f"{rep['rss_start_kb']} KiB at start, {rep['rss_end_kb']} KiB at end, largest growth "
        f"within a life {rep['rss_max_growth_kb']} KiB",
        f"  counters consistent in every life: {rep['counters_consistent']}",
    ]
    for f in rep["failures"]:
        lines.append(
            f"  failed at {f['at_seconds']:.1f} s ({f['method']}, {f['elements']}): "
            f"{f['errors'][0]}"
        )
    return "\n".join(lines)


def main(args) -> int:
    import json

    rep = soak(args)
    print(json.dumps(rep) if args.json else _text(rep))
    return 0 if rep["all_good"] and rep["counters_consistent"] else 1
