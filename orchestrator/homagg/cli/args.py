"""One validation layer for the numeric options of every ``homagg`` command.

Each option that several commands share (``--workers``, ``--elements``,
``--density``, ``--link-mbit``, ``--payload-bytes``, ...) has one checker
here, an argparse ``type=`` that turns the text into a number or raises
argparse.ArgumentTypeError with a sentence naming the allowed range, what
the option means and an example of a good value.  ``harden(parser)`` walks a
parser and its subcommands and gives every ``type=int`` / ``type=float``
option the checker of its name (OPTIONS), so a command module declares
``type=int`` as usual and the check is the same on every command.  An
option missing from OPTIONS still refuses NaN and infinity (tests/
test_cli_args.py fails on a numeric option OPTIONS does not list).

``Parser`` prints argparse's errors as one line, ``homagg demo: argument
--elements: ...``, and exits with code 2 (argparse's code for a usage
error), never a traceback.  Checks that need more than one option (a
payload that must fit the testbed's MTU, leaves that must fit its
aggregators) stay with the command, which reports them the same way.

This module imports nothing heavy: ``homagg COMMAND --bogus`` answers
before numpy, the C bindings or torch load.
"""

from __future__ import annotations

import argparse
import math
import sys

# Limits of the data path (dataplane_c/include/homagg: codec.h, wire.h),
# written out so that checking arguments loads no C library.
MAX_WORKERS = 256  # HG_MAX_WORKERS
MAX_BLOCK = 65536  # HG_MAX_BLOCK
MAX_PAYLOAD = 8192  # HG_MAX_PAYLOAD
MAX_ELEMENTS = 2**31 - 1  # element counts and indices are 32-bit on the wire
MAX_SECONDS = 10**6
MAX_MBIT = 10**7  # 10 Tbit/s: a value above is a typo


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``PROG: MESSAGE (PROG --help)``, exit 2."""

    def error(self, message):
        sys.stderr.write(f"{self.prog}: {message} (see `{self.prog} --help`)\n")
        sys.exit(2)


def _fail(text, what, example):
    raise argparse.ArgumentTypeError(f"{text!r} is not {what}; e.g. {example}")


def integer(lo, hi=None, what="", example=None, multiple=1):
    """A type= accepting integers lo..hi (hi None: no upper bound) that are
    multiples of ``multiple``; ``what`` says what the number is."""
    rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
    mult = f" and a multiple of {multiple}" if multiple > 1 else ""
    desc = f"an integer {rng}{mult}" + (f" ({what})" if what else "")
    ex = example if example is not None else lo

    def check(text):
        try:
            v = int(str(text).strip(), 10)
        except ValueError:
            _fail(text, desc, ex)
        if v < lo or (hi is not None and v > hi) or v % multiple:
            _fail(text, desc, ex)
        return v

    check.__name__ = "integer"
    check.description = desc
    return check


def number(lo, hi, what="", example=None, lo_open=False, hi_open=False):
    """A type= accepting finite floats in the interval lo..hi (open at an
    end when lo_open / hi_open)."""
    left, right = "(" if lo_open else "[", ")" if hi_open else "]"
    desc = f"a number in {left}{lo:g}, {hi:g}{right}" + (f" ({what})" if what else "")
    ex = example if example is not None else hi

    def check(text):
        try:
            v = float(str(text).strip())
        except ValueError:
            _fail(text, desc, ex)
        if (
            not math.isfinite(v)
            or v < lo
            or v > hi
            or (lo_open and v == lo)
            or (hi_open and v == hi)
        ):
            _fail(text, desc, ex)
        return v

    check.__name__ = "number"
    check.description = desc
    return check


def finite(text):
    """The fallback for a float option OPTIONS does not list: any finite number."""
    try:
        v = float(str(text).strip())
    except ValueError:
        v = math.nan
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return v


WORKERS = integer(1, MAX_WORKERS, "workers", 4)
ELEMENTS = integer(1, MAX_ELEMENTS, "elements per worker", 1000000)
DENSITY = number(0.0, 1.0, "fraction of non-zero elements", 0.05)
LINK_MBIT = number(0.0, MAX_MBIT, "link rate in Mbit/s", 1000, lo_open=True)
PAYLOAD = integer(4, MAX_PAYLOAD, "payload bytes per packet", 1024, multiple=4)
SECONDS = number(0.0, MAX_SECONDS, "seconds", 10, lo_open=True)
SEED = integer(0, 2**64 - 1, "seed", 1)
COUNT = integer(1, 10**9, "", 1)

# The checker of each option, by its argparse dest; ``(command, dest)`` keys
# override for one command (its prog without the leading "homagg ").
OPTIONS = {
    "workers": WORKERS,
    "elements": ELEMENTS,
    "min_elements": ELEMENTS,
    "max_elements": ELEMENTS,
    "density": DENSITY,
    "link_mbit": LINK_MBIT,
    "agg_link_mbit": LINK_MBIT,
    "link_gbps": number(0.0, MAX_MBIT / 1000, "link rate in Gbit/s", 100, lo_open=True),
    "payload_bytes": PAYLOAD,
    "payload": PAYLOAD,
    "slots": integer(1, 65536, "aggregator slots, the window", 64),
    "block": integer(1, MAX_BLOCK, "elements per block", 4096),
    "seed": SEED,
    "timeout": SECONDS,
    "ready_timeout": SECONDS,
    "grace": number(0.0, 86400.0, "grace period in seconds", 10, lo_open=True),
    "pickup": number(0.0, 3600.0, "seconds", 2),
    "rto": number(0.0, 60.0, "retransmission timeout in seconds", 0.005, lo_open=True),
    "seconds": SECONDS,
    "restart_every": SECONDS,
    "progress": SECONDS,
    "minutes": number(0.0, 10**4, "minutes", 1, lo_open=True),
    "drop_rate": number(0.0, 1.0, "probability of dropping a frame", 0.01, hi_open=True),
    "repeat": integer(1, 10**6, "repetitions", 3),
    "rounds": integer(1, 1000, "alternating rounds", 5),
    "warmup": integer(0, 10**6, "untimed repetitions first", 1),
    "steps": integer(1, 10**7, "timed training steps", 10),
    "ranks": integer(1, MAX_WORKERS, "training ranks", 2),
    "world": integer(1, MAX_WORKERS, "ranks", 2),
    "rank": integer(0, MAX_WORKERS - 1, "this rank", 0),
    "lr": number(0.0, 1e6, "learning rate", 0.01, lo_open=True),
    "bucket_mb": number(0.0, 1e5, "DDP bucket size in MB", 4, lo_open=True),
    "aggregators": integer(1, 9, "aggregator hosts", 2),
    "leaves": integer(1, 8, "leaf aggregators of a two-level tree", 2),
    ("testbed up", "leaves"): integer(0, 8, "leaf aggregators of a two-level tree, 0: none", 2),
    ("up", "leaves"): integer(0, 8, "leaf aggregators of a two-level tree, 0: none", 2),
    ("run allreduce", "leaves"): integer(0, 8, "leaf aggregators of a tree, 0: a flat job", 2),
    ("train", "leaves"): integer(0, 8, "leaf aggregators of a tree, 0: a flat job", 2),
    ("testbed up", "workers"): integer(1, 1000, "worker hosts", 4),
    "switch_lcores": integer(1, 128, "aggregator lcores", 1),
    "pipeline_groups": integer(0, 2**32 - 1, "0 automatic, 1 not pipelined, N block groups", 1),
    "mtu": integer(576, 9000, "link MTU in bytes", 1500),
    "threads": integer(1, 1024, "threads", 1),
    "calls": COUNT,
    "frames": COUNT,
    "burst": integer(1, 4096, "frames per burst", 32),
    "length": integer(1, 65535, "frame length in bytes", 1066),
    "port": integer(0, 65535, "TCP port, 0: any free port", 9477),
    "metrics": integer(0, 65535, "TCP port of the metrics, 0: any free port", 9477),
    "interval": number(0.0, 3600.0, "seconds between refreshes", 1, lo_open=True),
    "rtt_us": number(0.0, 10**6, "round trip in microseconds", 100, lo_open=True),
    "sample_elements": integer(1024, MAX_ELEMENTS, "elements simulated at most", 1048576),
}


# Other names accepted for a choice (the workload ``random`` was called
# ``independent`` by ``homagg demo``; homagg.bench.workloads.ALIASES).
ALIASES = {"workload": {"independent": "random"}}


def _alias(dest):
    names = ALIASES[dest]

    def name(text):
        return names.get(text, text)

    return name


def checker(command, dest):
    """The type= OPTIONS gives option ``dest`` of ``command`` ("demo",
    "testbed up", ...), or None."""
    return OPTIONS.get((command, dest)) or OPTIONS.get(dest)


# Commands whose arguments their own module checks.
OWN_CHECKS = ("bench codec",)


def _command(parser):
    return parser.prog.split(" ", 1)[1] if " " in parser.prog else ""


def harden(parser):
    """Give every type=int / type=float option of parser and its subparsers
    the checker OPTIONS lists for it (float options it does not list: at
    least finite).  Returns parser."""
    command = _command(parser)
    if command in OWN_CHECKS:
        return parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                harden(sub)
        elif action.dest in ALIASES and action.choices and action.type is None:
            action.type = _alias(action.dest)
        elif action.type in (int, float):
            action.type = checker(command, action.dest) or (
                finite if action.type is float else action.type
            )
    return parser


def numeric_options(parser):
    """(command, option string, dest, type) of every numeric option under parser."""
    out = []
    command = _command(parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                out += numeric_options(sub)
        elif (
            action.option_strings
            and action.type is not None
            and getattr(action.type, "__name__", "")
            in ("int", "float", "integer", "number", "finite")
        ):
            out.append((command, action.option_strings[-1], action.dest, action.type))
    return out
