"""The ``homagg`` command: argument parsing and ``main`` (the console
script's entry point; ``python -m homagg.cli`` is the same).

Subcommands live in their own modules, listed in COMMANDS; each module
provides ``add_arguments(parser)`` and ``main(args) -> int`` and a module
docstring whose first line is the subcommand's help.  Start here to find
which module implements a subcommand.  This package holds the commands that
are only a command line: ``homagg.cli.testbed`` (``homagg testbed``),
``homagg.cli.demo`` (``homagg demo``), ``homagg.cli.rotate_key``
(``homagg rotate-key``, over homagg.deploy.rotate) and ``homagg.cli.calibrate``
(``homagg calibrate``, over homagg.bench.calibrate); the others sit next to what they run
(homagg.runs, homagg.train, homagg.deploy.remote, homagg.bench).
"""

import argparse
import ast
import functools
import importlib
import importlib.util
import sys

from homagg import log
from homagg.cli import args as cli_args
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
    "rotate-key": "homagg.cli.rotate_key",
    "calibrate": "homagg.cli.calibrate",
    "exporter": "homagg.cli.exporter",
    "top": "homagg.cli.top",
    "advise": "homagg.cli.advise",
}


# The argument list being parsed (build_parser's argv): only the modules
# of the subcommands it names are imported, so that an argument error is
# reported before numpy, the C bindings or torch load.  None: all of them.
_argv = None


@functools.lru_cache(maxsize=None)
def _docstring(modname):
    """A module's docstring, read without importing the module."""
    spec = importlib.util.find_spec(modname)
    with open(spec.origin, encoding="utf-8") as f:
        return ast.get_docstring(ast.parse(f.read())) or ""


def add_subcommands(parser, dest, metavar, modules, key):
    """One subcommand per module of modules ({name: module path}): its
    arguments from the module's add_arguments, its help from the first line
    of the module docstring; the parsed args carry the module as args.<key>.
    Only the module of the subcommand being parsed is imported (see _argv);
    the others get their help line only."""
    sub = parser.add_subparsers(dest=dest, metavar=metavar)
    sub.required = True
    chosen = next((a for a in _argv if a in modules), None) if _argv is not None else None
    for name, modname in modules.items():
        load = _argv is None or name == chosen
        mod = importlib.import_module(modname) if load else None
        doc = ((mod.__doc__ if mod else _docstring(modname)) or "").strip()
        p = sub.add_parser(
            name,
            help=doc.splitlines()[0] if doc else None,
            description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if mod is not None:
            mod.add_arguments(p)
            p.set_defaults(**{key: mod})


def build_parser(argv=None):
    """The whole ``homagg`` parser (argv None), or the one that parses argv:
    every subcommand listed, only argv's imported and given its arguments."""
    global _argv
    _argv = argv
    parser = cli_args.Parser(
        prog="homagg",
        description="HomAgg: in-network gradient aggregation with lossless "
        "homomorphic compression. Run `homagg COMMAND --help` for details.",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="more detail on stderr (debug log of every step)",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress lines on stderr, only warnings and errors",
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="stderr log as text lines or one JSON object per line (docs/OPERATIONS.md)",
    )
    try:
        add_subcommands(parser, "command", "COMMAND", COMMANDS, "_module")
    finally:
        _argv = None
    return cli_args.harden(parser)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    log.setup(-1 if args.quiet else args.verbose)
    if args.log_format == "json":
        logfmt.use_json()
    try:
        return args._module.main(args) or 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
