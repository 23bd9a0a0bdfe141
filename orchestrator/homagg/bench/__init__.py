"""Benchmarks: report figures, each next to a baseline measured in the same run.

Each benchmark is a module of this package listed in BENCHMARKS, providing
``add_arguments(parser)`` and ``main(args) -> int``.
"""
import argparse
import importlib

BENCHMARKS = {
    "codec": "homagg.bench.codec",
    "engine": "homagg.bench.engine",
    "nic": "homagg.bench.nic",
    "switch": "homagg.bench.switch",
    "scale": "homagg.bench.scale",
    "allreduce": "homagg.bench.allreduce",
    "shards": "homagg.bench.shards",
    "soak": "homagg.bench.soak",
}


def add_arguments(parser):
    sub = parser.add_subparsers(dest="bench", metavar="BENCHMARK")
    sub.required = True
    for name, modname in BENCHMARKS.items():
        mod = importlib.import_module(modname)
        doc = (mod.__doc__ or "").strip()
        p = sub.add_parser(
            name,
            help=doc.splitlines()[0] if doc else None,
            description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_arguments(p)
        p.set_defaults(_bench=mod)


def main(args):
    return args._bench.main(args)
