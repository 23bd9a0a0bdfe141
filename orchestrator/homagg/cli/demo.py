"""The main job: allreduce a realistic sparse gradient, exactly, over the network.

Modes (--mode, default "auto"):

  testbed   4 worker namespaces and an aggregator namespace on this machine
            (homagg.deploy.local.testbed), rate-limited veth links (--link-mbit), the DPDK
            aggregator homagg-switch on a virtual PMD, one worker process per
            namespace (homagg run allreduce); every method of --methods runs
            on the same testbed, then the testbed is torn down.  Needs root.
  sim       the same allreduce on the in-process cluster: C worker clients and
            the C aggregation engine over the software NIC model, virtual time
            at --link-mbit (homagg.sim.Cluster).  No root needed.
  codec     the protocol in one process without a network: every method,
            shared and random positions (homagg.codec.simulate_allreduce).
  auto      testbed when running as root with homagg-switch built, else sim
            (saying why).

Each method runs on two workloads: ``shared`` (the same non-zero positions
on every worker) and ``random`` (independent positions per worker; the name
``independent`` is accepted for it wherever a workload is named).  The table
shows the time, the bytes each worker put on the wire, the ratio to
sending dense float32 (4 n bytes), and whether every worker's result is
bit-identical to the fixed-point reference (numpy).
"""

import os


def add_arguments(parser):
    parser.add_argument(
        "--mode",
        choices=("auto", "testbed", "sim", "codec"),
        default="auto",
        help="where the allreduce runs (default auto: testbed as root, else sim)",
    )
    parser.add_argument(
        "--methods",
        default=None,
        help="comma-separated methods (default dense,lhc,union on the network, "
        "every method in codec mode)",
    )
    parser.add_argument(
        "--link-mbit",
        type=float,
        default=1000.0,
        help="worker link rate in Mbit/s (testbed and sim; default 1000)",
    )
    parser.add_argument(
        "--elements",
        type=int,
        default=None,
        help="elements per worker (default 2^22 on the network, 2^24 in codec mode)",
    )
    parser.add_argument("--workers", type=int, default=4, help="workers W (default 4)")
    parser.add_argument(
        "--density",
        type=float,
        default=0.05,
        help="fraction of non-zeros per worker (default 0.05)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the gradients")


def _switch_built():
    from homagg.switch.daemon import find_switch

    try:
        find_switch()
        return True
    except Exception:  # noqa: BLE001 - any failure means "not available"
        return False


def main(args):
    from homagg.runs import demo

    mode = args.mode
    if mode == "auto":
        if os.geteuid() != 0:
            demo.progress(
                "not running as root: network namespaces need root, so the allreduce "
                "runs on the in-process NIC-model cluster instead (sudo make demo for "
                "the testbed)"
            )
            mode = "sim"
        elif not _switch_built():
            demo.progress(
                "homagg-switch is not built (make build): using the in-process "
                "NIC-model cluster instead"
            )
            mode = "sim"
        else:
            mode = "testbed"
    if mode == "codec":
        return demo.main_codec(args)
    if args.elements is None:
        args.elements = 2**22
    methods = demo.parse_methods(args, demo.NET_METHODS)
    if mode == "testbed":
        return demo.main_testbed(args, methods)
    return demo.main_sim(args, methods)
