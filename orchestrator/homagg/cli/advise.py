"""Predict whether HomAgg beats ring all-reduce on given links, workers and gradients.

From the cost model (docs/PROTOCOL.md "The cost model") and this host's
calibration (`homagg calibrate`; built-in defaults without one): the
time of ring all-reduce and of each exact HomAgg method, the speedup
against ring and what binds each method (link, worker CPU, aggregator
CPU, round trips).  The bytes of each method come from running the codec
on generated gradients of the workload (scaled down for a large tensor,
and said so).  A prediction, not a measurement.  docs/OPERATIONS.md.

examples:
  homagg advise --workers 8 --elements 25000000 --density 0.01 --link-mbit 10000
  homagg advise --workers 4 --elements 1000000 --density 0.05 --link-mbit 100 --workload zipf --json
"""
import json
import sys

from homagg.errors import HomAggError


def add_arguments(p) -> None:
    p.add_argument("--workers", type=int, required=True, help="workers W")
    p.add_argument("--elements", type=int, required=True,
                   help="float32 elements per worker N (one allreduce)")
    p.add_argument("--density", type=float, required=True,
                   help="fraction of non-zero elements per worker")
    p.add_argument("--link-mbit", type=float, required=True,
                   help="link rate of every worker and the aggregator, Mbit/s")
    p.add_argument("--workload", choices=("shared", "zipf", "random"), default="shared",
                   help="where the non-zeros are (homagg.bench.workloads; default %(default)s)")
    p.add_argument("--rtt-us", type=float, default=None,
                   help="one round trip plus a step's start, microseconds (default 100)")
    p.add_argument("--payload-bytes", type=int, default=1024,
                   help="payload per packet (default %(default)s)")
    p.add_argument("--block", type=int, default=None, help="elements per block (default: the codec's)")
    p.add_argument("--seed", type=int, default=1, help="seed of the generated gradients")
    p.add_argument("--sample-elements", type=int, default=None,
                   help="simulate at most this many elements and scale (default 2097152, "
                   "and W x sample <= 8388608)")
    p.add_argument("--json", action="store_true", help="print the prediction as JSON")


def main(args) -> int:
    from homagg.ops import advise as adv

    try:
        a = adv.advise(args.workers, args.elements, args.density, args.link_mbit, args.workload,
                       rtt_ns=None if args.rtt_us is None else round(args.rtt_us * 1000),
                       payload_bytes=args.payload_bytes, block=args.block, seed=args.seed,
                       sample_elements=args.sample_elements or adv.DEFAULT_SAMPLE)
    except HomAggError as e:
        print(f"homagg advise: {e}", file=sys.stderr)
        return 2
    print(json.dumps(a, indent=1) if args.json else adv.render(a))
    return 0
