"""A live view of homagg-switch daemons: jobs, workers, engines.

    homagg top [--socket PATH ...] [--testbed NAME] [-i INVENTORY] [--once]

Refreshes once a second (--interval): per daemon its engines' busy
fraction, per job its slots in use and frames summed and dropped per
second, per worker its frames per second, retransmissions and drops.
Rates are the difference of two readings over the time between them.
``--once`` prints one frame (two readings --interval apart) and exits, for
scripts and tests.  A daemon that does not answer is shown as down.
Needs rich (the ``metrics`` extra).  docs/OPERATIONS.md.
"""

import argparse
import sys
import time

from homagg.errors import HomAggError
from homagg.ops.top import render, sources


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--socket",
        action="append",
        default=[],
        metavar="[NAME=]PATH",
        help="a local daemon's control socket (repeat for several)",
    )
    p.add_argument("--testbed", metavar="NAME", help="the daemons `homagg testbed up` started")
    p.add_argument("--state-dir", default=None, help="testbed state directory")
    p.add_argument(
        "-i",
        "--inventory",
        metavar="TOML",
        help="the daemons of an inventory's aggregator hosts (over SSH)",
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="print one frame (two readings --interval apart) and exit",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds between refreshes (default %(default)s)",
    )


def main(args) -> int:
    try:
        import rich  # noqa: F401
    except ImportError:
        print("homagg top: needs rich: pip install 'homagg[metrics]'", file=sys.stderr)
        return 2
    if not 0.05 <= args.interval <= 3600:
        print(
            f"homagg top: --interval {args.interval}: must be 0.05..3600 seconds", file=sys.stderr
        )
        return 2
    from rich.console import Console

    try:
        src = sources(args.socket, args.testbed, args.state_dir, args.inventory)
    except HomAggError as e:
        print(f"homagg top: {e}", file=sys.stderr)
        return 1
    try:
        if args.once:
            before = src.read()
            time.sleep(args.interval)
            Console(file=sys.stdout, width=120).print(render(src.read(), before))
            return 0
        from rich.live import Live

        before = src.read()
        with Live(render(before), refresh_per_second=4, screen=False) as live:
            while True:
                time.sleep(args.interval)
                now = src.read()
                live.update(render(now, before))
                before = now
    except KeyboardInterrupt:
        return 0
    finally:
        src.close()
