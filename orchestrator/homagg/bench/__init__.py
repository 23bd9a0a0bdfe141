"""Benchmarks: report figures, each next to a baseline measured in the same run.

Each benchmark is a module of this package listed in BENCHMARKS, providing
``add_arguments(parser)`` and ``main(args) -> int``.
"""

BENCHMARKS = {
    "codec": "homagg.bench.codec",
    "engine": "homagg.bench.engine",
    "nic": "homagg.bench.nic",
    "switch": "homagg.bench.switch",
    "scale": "homagg.bench.scale",
    "allreduce": "homagg.bench.allreduce",
    "shards": "homagg.bench.shards",
    "lcores": "homagg.bench.lcores",
    "soak": "homagg.bench.soak",
    "advise": "homagg.bench.advise",
}


def add_arguments(parser):
    from homagg.cli import add_subcommands

    add_subcommands(parser, "bench", "BENCHMARK", BENCHMARKS, "_bench")


def main(args):
    return args._bench.main(args)
