"""Serve Prometheus metrics of homagg-switch daemons over HTTP.

    homagg exporter --socket /run/homagg-switch.sock [--socket NAME=PATH ...]
                    [--port 9477] [--bind 127.0.0.1]

Each scrape of ``/metrics`` reads every daemon's control socket then and
there; a daemon that does not answer is ``homagg_up{daemon=...} 0`` and the
others are served as usual (homagg.ops.exporter).  The first line on stdout
names the URL (--port 0: any free port).  Stops on SIGTERM or SIGINT.
docs/OPERATIONS.md lists every metric; needs the ``metrics`` extra.
"""

import argparse
import signal
import sys
import threading

from homagg.ops.exporter import DEFAULT_PORT, serve
from homagg.ops.source import parse_socket_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--socket",
        action="append",
        required=True,
        metavar="[NAME=]PATH",
        help="a daemon's control socket (repeat for several daemons); the "
        "daemon label is NAME, or PATH",
    )
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help="HTTP port (default %(default)s; 0: any free port, printed)",
    )
    p.add_argument(
        "--bind",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="address to listen on (default %(default)s: this host only)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=2.0,
        metavar="S",
        help="control socket timeout per daemon and scrape (default %(default)s)",
    )


def main(args) -> int:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        print(
            "homagg exporter: needs prometheus_client: pip install 'homagg[metrics]'",
            file=sys.stderr,
        )
        return 2
    if not 0 <= args.port <= 65535:
        print(f"homagg exporter: --port {args.port}: must be 0..65535", file=sys.stderr)
        return 2
    daemons = dict(parse_socket_arg(s) for s in args.socket)
    try:
        server, _ = serve(daemons, args.port, args.bind, args.timeout)
    except OSError as e:
        print(f"homagg exporter: --bind {args.bind} --port {args.port}: {e}", file=sys.stderr)
        return 1
    host, port = server.server_address[:2]
    print(
        f"homagg exporter: http://{host}:{port}/metrics for {len(daemons)} "
        f"daemon{'s' if len(daemons) > 1 else ''}",
        flush=True,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(3600):
        pass
    server.shutdown()
    return 0
