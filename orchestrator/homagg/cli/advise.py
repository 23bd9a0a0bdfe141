"""Predict whether HomAgg beats ring all-reduce on given links, workers and gradients.

From the cost model (docs/PROTOCOL.md "The cost model") and this host's
calibration (`homagg calibrate`; built-in defaults without one): the
time of ring all-reduce and of each exact HomAgg method, the speedup
against ring and what binds each method (link, worker CPU, aggregator
CPU, round trips).  The bytes of each method come from running the codec
on generated gradients of the workload (scaled down for a large tensor,
and said so).  A prediction, not a measurement.  docs/OPERATIONS.md.

--model ncf|lstm|bert|vgg|path/to/file.py:factory predicts for a model
instead (homagg.ops.advise_model): built as `homagg train --model` builds
it, wrapped in DDP (--bucket-mb, DDP's default 25), one forward and
backward pass per worker on generated data; per DDP bucket its size, its
density and the prediction on its gradients, and per iteration each
method on every bucket against ring (W default 4, links default 1000
Mbit/s; --elements, --density and --workload come from the model).

examples:
  homagg advise --workers 8 --elements 25000000 --density 0.01 --link-mbit 10000
  homagg advise --workers 4 --elements 1000000 --density 0.05 --link-mbit 100 --workload zipf --json
  homagg advise --model ncf --workers 8 --link-mbit 1000
  homagg advise --model mymodel.py:build --bucket-mb 4 --json
  homagg advise --testbed demo --workers 4 --elements 1000000 --density 1 --link-mbit 1000

--testbed NAME predicts for a job on that local testbed as it registers
its cost model: the testbed's calibration through its port (`homagg
calibrate --testbed NAME`) and its CPU coefficients scaled by the sharing
of the host's cores recorded with it.
"""

import json
import sys

from homagg.errors import HomAggError


def add_arguments(p) -> None:
    p.add_argument(
        "--model",
        default=None,
        metavar="NAME|FILE.py:factory",
        help="predict for a model's DDP buckets: ncf, lstm, bert, vgg or "
        "path/to/file.py:factory (as homagg train --model)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="workers W (required without --model; with it default 4)",
    )
    p.add_argument(
        "--elements",
        type=int,
        default=None,
        help="float32 elements per worker N (one allreduce; required without --model)",
    )
    p.add_argument(
        "--density",
        type=float,
        default=None,
        help="fraction of non-zero elements per worker (required without --model)",
    )
    p.add_argument(
        "--link-mbit",
        type=float,
        default=None,
        help="link rate of every worker and the aggregator, Mbit/s (required "
        "without --model; with it default 1000)",
    )
    p.add_argument(
        "--workload",
        choices=("shared", "zipf", "random"),
        default=None,
        help="where the non-zeros are (homagg.bench.workloads; default shared; not with --model)",
    )
    p.add_argument(
        "--bucket-mb",
        type=float,
        default=None,
        help="with --model: DDP's bucket_cap_mb, for every bucket (left out: "
        "DDP's default, 25 MB and a first bucket of 1 MiB; homagg train gives 4)",
    )
    p.add_argument(
        "--rtt-us",
        type=float,
        default=None,
        help="one round trip plus a step's start, microseconds (default 100)",
    )
    p.add_argument(
        "--payload-bytes", type=int, default=1024, help="payload per packet (default %(default)s)"
    )
    p.add_argument(
        "--block", type=int, default=None, help="elements per block (default: the codec's)"
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the generated gradients")
    p.add_argument(
        "--sample-elements",
        type=int,
        default=None,
        help="simulate at most this many elements and scale (default 2097152, "
        "and W x sample <= 8388608)",
    )
    p.add_argument(
        "--testbed",
        metavar="NAME",
        default=None,
        help="predict for a job on this local testbed: its calibration through the port "
        "(`homagg calibrate --testbed NAME`) and the sharing of its host's cores",
    )
    p.add_argument("--json", action="store_true", help="print the prediction as JSON")


def _usage(text):
    """A usage error as argparse reports one: one line, exit status 2."""
    print(f"homagg advise: {text} (see `homagg advise --help`)", file=sys.stderr)
    raise SystemExit(2)


def main(args) -> int:
    from homagg.ops import advise as adv

    if args.model is not None:
        bad = [
            o
            for o, v in (
                ("--elements", args.elements),
                ("--density", args.density),
                ("--workload", args.workload),
            )
            if v is not None
        ]
        if bad:
            _usage(
                f"{', '.join(bad)}: not with --model (the model's buckets give "
                "sizes and densities); drop them"
            )
        return _main_model(args, adv)
    if args.bucket_mb is not None:
        _usage("--bucket-mb: only with --model")
    missing = [
        o
        for o, v in (
            ("--workers", args.workers),
            ("--elements", args.elements),
            ("--density", args.density),
            ("--link-mbit", args.link_mbit),
        )
        if v is None
    ]
    if missing:
        _usage(f"the following arguments are required without --model: {', '.join(missing)}")
    try:
        coeffs, rtt_ns, source = _testbed(args, adv, args.workers)
        a = adv.advise(
            args.workers,
            args.elements,
            args.density,
            args.link_mbit,
            args.workload or "shared",
            payload_bytes=args.payload_bytes,
            block=args.block,
            seed=args.seed,
            sample_elements=args.sample_elements or adv.DEFAULT_SAMPLE,
            rtt_ns=rtt_ns,
            coeffs=coeffs,
        )
    except HomAggError as e:
        print(f"homagg advise: {e}", file=sys.stderr)
        return 2
    if source:
        a["coefficients_from"] = source
    print(json.dumps(a, indent=1) if args.json else adv.render(a))
    return 0


def _testbed(args, adv, workers):
    """(coefficients, round trip, where from) of --testbed's job; without
    it (None, --rtt-us or None, None): this host's calibration.  --rtt-us
    wins over the testbed's round trip."""
    rtt = None if args.rtt_us is None else round(args.rtt_us * 1000)
    if not args.testbed:
        return None, rtt, None
    coeffs, rtt_ns, source = adv.testbed_model(args.testbed, workers)
    return coeffs, rtt_ns if rtt is None else rtt, source


def _main_model(args, adv) -> int:
    from homagg.ops import advise_model as am

    try:
        coeffs, rtt_ns, source = _testbed(args, adv, args.workers or 4)
        a = am.advise_model(
            args.model,
            args.workers or 4,
            args.link_mbit or 1000.0,
            coeffs=coeffs,
            rtt_ns=rtt_ns,
            payload_bytes=args.payload_bytes,
            block=args.block,
            seed=args.seed,
            bucket_cap_mb=args.bucket_mb,
            sample_elements=args.sample_elements or adv.DEFAULT_SAMPLE,
        )
    except HomAggError as e:
        print(f"homagg advise: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(
            f"homagg advise: --model needs torch ({e}; pip install torch==2.13.0, "
            "as make build does)",
            file=sys.stderr,
        )
        return 2
    if source:
        a["coefficients_from"] = source
    print(json.dumps(a, indent=1) if args.json else am.render(a))
    return 0
