"""The ``homagg`` command: argument parsing and ``main`` (the console
script's entry point; ``python -m homagg.cli`` is the same).

Subcommands live in their own modules, listed in COMMANDS; each module
provides ``add_arguments(parser)`` and ``main(args) -> int`` and a module
docstring whose first line is the subcommand's help.  Start here to find
which module implements a subcommand.  This package holds the commands that
are only a command line: ``homagg.cli.testbed`` (``homagg testbed``) and
``homagg.cli.demo`` (``homagg demo``); the others sit next to what they run
(homagg.runs, homagg.train, homagg.deploy.remote, homagg.bench).
"""
import argparse
import importlib
import sys

from homagg import log
from homagg.ops import logfmt

COMMANDS = {
    "demo": "homagg.cli.demo",
    "bench": "homagg.bench",
    "testbed": "homagg.cli.testbed",
    "run": "homagg.runs.allreduce",
    "train": "homagg.train.train",
    "provision": "homagg.deploy.remote.provision",
    "ansible-inventory": "homagg.deploy.remote.ansible_inventory",
    "up": "homagg.deploy.remote.up",
    "down": "homagg.deploy.remote.down",
    "exporter": "homagg.cli.exporter",
    "top": "homagg.cli.top",
}


def add_subcommands(parser, dest, metavar, modules, key):
    """One subcommand per module of modules ({name: module path}): its
    arguments from the module's add_arguments, its help from the first line
    of the module docstring; the parsed args carry the module as args.<key>."""
    sub = parser.add_subparsers(dest=dest, metavar=metavar)
    sub.required = True
    for name, modname in modules.items():
        mod = importlib.import_module(modname)
        doc = (mod.__doc__ or "").strip()
        p = sub.add_parser(
            name,
            help=doc.splitlines()[0] if doc else None,
            description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_arguments(p)
        p.set_defaults(**{key: mod})


def build_parser():
    parser = argparse.ArgumentParser(
        prog="homagg",
        description="HomAgg: in-network gradient aggregation with lossless "
        "homomorphic compression. Run `homagg COMMAND --help` for details.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more detail on stderr (debug log of every step)")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress lines on stderr, only warnings and errors")
    parser.add_argument("--log-format", choices=("text", "json"), default="text",
                        help="stderr log as text lines or one JSON object per line "
                        "(docs/OPERATIONS.md)")
    add_subcommands(parser, "command", "COMMAND", COMMANDS, "_module")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    log.setup(-1 if args.quiet else args.verbose)
    if args.log_format == "json":
        logfmt.use_json()
    try:
        return args._module.main(args) or 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

