"""Build, inspect and remove local testbeds (network namespaces, needs root).

A testbed is one network namespace per host (hg-NAME-agg for the aggregator,
hg-NAME-w0, hg-NAME-w1, ... for the workers), each with an eth0 linked by a
veth pair to a bridge in hg-NAME-sw that plays the switch (multicast is
flooded to every port).  Addresses: aggregator .1, workers .10, .11, ... of
the subnet (default 10.77.0.0/24); with --aggregators K, aggregators
hg-NAME-agg, hg-NAME-agg1, ... at .1 .. .K (a job spread over K); with
--leaves L, L + 1 aggregator hosts for a two-level tree (the first L leaves,
the last the root; `homagg run allreduce` then runs its job over the tree,
docs/PROTOCOL.md "Tree").  With --link-mbit every worker link is
shaped in both directions (tbf).  What was created is recorded in
/run/homagg/testbeds/NAME.json (--state-dir or $HOMAGG_TESTBED_DIR), and
`down` removes exactly that.

`up` also starts homagg-switch in every aggregator namespace and registers
one job for all the workers, spread over the aggregators, with its job file
(HOMAGG_JOB_FILE of homagg.torch; --no-daemon: the network only); with
--leaves the job is a tree over the leaves and the root, with one job file
per worker (its leaf, the leaf's result group).  `homagg
run` and `homagg train` use these daemons; `down` stops them by PID.  With
--auth the job authenticates every frame (a new secret in the testbed's
files, mode 0600, named by the job file; in a tree one per leaf, and the
root's own, which no file holds); `homagg rotate-key --testbed NAME`
gives it a new one while it runs, every level of a tree.
Successive runs of new ranks share the job without renewing it (the first
frame of each new rank process empties what its last run left); `job`
registers it afresh, its counters at 0, when you want them counted from 0.

examples:
  sudo homagg testbed up --workers 4 --link-mbit 1000 --name demo
  sudo homagg testbed show --name demo
  sudo ip netns exec hg-demo-w0 ping -c 1 10.77.0.11   # worker to worker (homagg-switch
                                                        # owns the aggregator's eth0)
  sudo homagg testbed job --name demo
  sudo homagg testbed down --name demo
"""

import argparse
import json
import sys

from homagg import log
from homagg.deploy.local import testbed_job
from homagg.deploy.local.testbed import DEFAULT_SUBNET, Testbed, TestbedError, state_dir_default
from homagg.errors import HomAggError
from homagg.switch import job_file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        default=None,
        metavar="DIR",
        help="where state files live (default $HOMAGG_TESTBED_DIR or /run/homagg/testbeds)",
    )
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True

    p = sub.add_parser(
        "up",
        help="create a testbed",
        description="Create the namespaces, the bridge, the veth links, "
        "the addresses and the rate limits of a testbed.  Fails, touching "
        "nothing, if the name is taken; removes what it built if a step fails.",
    )
    p.add_argument(
        "--workers",
        "-w",
        type=int,
        required=True,
        metavar="N",
        help="number of worker hosts (namespaces hg-NAME-w0 .. w{N-1})",
    )
    p.add_argument(
        "--aggregators",
        "-k",
        type=int,
        default=1,
        metavar="K",
        help="aggregator hosts (1..9; hg-NAME-agg, hg-NAME-agg1, ...) (default: %(default)s)",
    )
    p.add_argument(
        "--leaves",
        type=int,
        default=0,
        metavar="L",
        help="a two-level tree: L leaf aggregators and a root (L + 1 aggregator "
        "hosts, 1..8 leaves; excludes --aggregators)",
    )
    p.add_argument(
        "--link-mbit",
        type=float,
        default=None,
        metavar="R",
        help="shape every worker link to R Mbit/s in both directions "
        "(tbf on both veth ends); default: unshaped",
    )
    p.add_argument(
        "--agg-link-mbit",
        type=float,
        default=None,
        metavar="R",
        help="shape the aggregators' links too (default: unshaped)",
    )
    p.add_argument(
        "--name",
        "-n",
        default="default",
        help="testbed name: 1-16 of a-z 0-9 _ (default: %(default)s)",
    )
    p.add_argument(
        "--subnet", default=DEFAULT_SUBNET, help="IPv4 subnet of the testbed (default: %(default)s)"
    )
    p.add_argument(
        "--mtu",
        type=int,
        default=1500,
        help="MTU of every link, 576..9000 (9000: jumbo frames, job payloads up to "
        "8192 bytes; default: %(default)s)",
    )
    p.add_argument(
        "--no-daemon",
        action="store_true",
        help="build the network only: no homagg-switch, no job (`homagg run` and "
        "`homagg train` then start daemons of their own)",
    )
    job_file.add_job_arguments(p)  # the payload follows the MTU unless given
    p.add_argument("--switch", default=None, metavar="PATH", help="homagg-switch binary")
    p.add_argument(
        "--auth",
        action="store_true",
        help="the job authenticates every frame: a new secret in the testbed's files "
        "(job.secret, mode 0600) named by the job file (docs/SECURITY.md; "
        "`homagg rotate-key --testbed NAME` replaces it while the job runs)",
    )
    p.add_argument(
        "--mac",
        choices=("auto", "umac", "aes-gmac", "blake2b"),
        default="auto",
        help="with --auth: the MAC algorithm (default: this host's, umac "
        "where the CPU has AES-NI, else blake2b)",
    )
    p.add_argument(
        "--metrics",
        type=int,
        default=None,
        metavar="PORT",
        help="also serve the daemons' Prometheus metrics on PORT (homagg "
        "exporter, stopped with the testbed; 0: any free port)",
    )
    p.add_argument(
        "--metrics-bind",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="address of --metrics (default: %(default)s)",
    )

    p = sub.add_parser(
        "job",
        help="register the testbed's job afresh",
        description="Remove the job `up` registered and add it again (same id, "
        "token and job file), its counters at 0. Not needed between runs: the "
        "first frame of each new rank process empties what its last run left.",
    )
    p.add_argument("--name", "-n", default="default", help="testbed name (default: %(default)s)")

    p = sub.add_parser(
        "down",
        help="remove a testbed",
        description="Stop the processes recorded for the testbed (by PID), "
        "delete its links and namespaces and its state file.  Succeeds on "
        "a half-built testbed; does nothing if it is already gone.",
    )
    p.add_argument("--name", "-n", default="default", help="testbed name (default: %(default)s)")

    sub.add_parser(
        "list",
        help="list the testbeds that have a state file",
        description="List the testbeds recorded in the state directory.",
    )

    p = sub.add_parser(
        "show",
        help="show a testbed's hosts, addresses and rates",
        description="Show the hosts of a testbed: namespace, interface, "
        "address, MAC, switch port and link rate.",
    )
    p.add_argument("--name", "-n", default="default", help="testbed name (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the whole state as JSON")


def _rate(r):
    return "unshaped" if r is None else f"{r:g} Mbit/s"


def main(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except HomAggError as e:
        print(f"homagg testbed {args.action}: {e}", file=sys.stderr)
        return 1


def _run(args) -> int:
    sd = args.state_dir
    if args.action == "up":
        if args.metrics is not None and args.no_daemon:
            raise HomAggError(
                "--metrics: the testbed runs no daemon of its own with "
                "--no-daemon: drop one of them"
            )
        if args.auth and args.no_daemon:
            raise HomAggError(
                "--auth: the testbed registers no job of its own with --no-daemon "
                "(`homagg run allreduce --auth` authenticates its own): drop one of them"
            )
        if args.mac != "auto" and not args.auth:
            raise HomAggError("--mac: the MAC algorithm of an authenticated job: add --auth")
        if args.metrics is not None and not 0 <= args.metrics <= 65535:
            raise HomAggError(f"--metrics {args.metrics}: must be a TCP port 0..65535")
        tb = Testbed.up(
            args.name,
            workers=args.workers,
            link_mbit=args.link_mbit,
            agg_link_mbit=args.agg_link_mbit,
            subnet=args.subnet,
            mtu=args.mtu,
            state_dir=sd,
            aggregators=args.aggregators,
            leaves=args.leaves,
        )
        if not args.no_daemon:
            try:
                testbed_job.start(
                    tb,
                    slots=args.slots,
                    payload=args.payload_bytes,
                    timeout=args.timeout,
                    switch=args.switch,
                    cost_model=args.cost_model,
                    auth=args.auth,
                    mac=None if args.mac == "auto" else args.mac,
                )
                if args.metrics is not None:
                    from homagg.ops.exporter import start_for_testbed

                    start_for_testbed(tb, args.metrics, args.metrics_bind)
            except BaseException:
                Testbed.down(args.name, state_dir=sd)
                raise
        naggs = len(tb.aggregators)
        shape = (
            f"a tree of {args.leaves} leaves and a root"
            if args.leaves
            else f"{naggs} aggregator{'s' if naggs > 1 else ''}"
        )
        print(
            f"testbed {tb.name} is up ({args.workers} workers, {shape}, "
            f"links {_rate(args.link_mbit)}); state: {tb.state_path}"
        )
        _print_hosts(tb)
        for line in testbed_job.describe(tb):
            print(line)
        ex = tb.state().get("exporter")
        if ex:
            print(f"metrics: {ex['url']} (homagg exporter, pid {ex['pid']}, log {ex['log']})")
        return 0
    if args.action == "job":
        tb = Testbed.open(args.name, sd)
        j = testbed_job.renew(tb)
        leaves = testbed_job.tree_leaves(tb)
        if leaves:
            names = [h.name for h in tb.aggregators]
            print(
                f"job {j['job']} registered afresh on the tree (leaves {', '.join(names[:-1])}, "
                f"root {names[-1]}); job files: {', '.join(testbed_job.job_files(tb))}"
            )
        else:
            print(f"job {j['job']} registered afresh on {j['aggregator']}; job file: {j['file']}")
        return 0
    if args.action == "down":
        if Testbed.down(args.name, state_dir=sd):
            print(f"testbed {args.name} removed")
        else:
            print(
                f"testbed {args.name}: nothing to remove (no state file in "
                f"{sd or state_dir_default()})"
            )
        return 0
    if args.action == "list":
        names = Testbed.list(sd)
        if not names:
            print(
                f"no testbeds (no state file in {sd or state_dir_default()}; "
                "`homagg testbed up` makes one)"
            )
        for name in names:
            try:
                st = Testbed.open(name, sd).state()
                print(
                    f"{name}\t{st['workers']} workers\tlinks {_rate(st['link_mbit'])}\t"
                    f"{st['subnet']}\t{'complete' if st.get('complete') else 'incomplete'}"
                )
            except (TestbedError, ValueError, KeyError) as e:
                print(f"{name}\tunreadable state: {e}")
        return 0
    if args.action == "show":
        tb = Testbed.open(args.name, sd)
        if args.json:
            print(json.dumps(tb.describe(), indent=1))
            return 0
        st = tb.state()
        print(
            f"testbed {tb.name}: {st['workers']} workers, subnet {st['subnet']}, "
            f"mtu {st['mtu']}, switch: bridge {st['bridge']} in {st['switch_netns']}"
            f"{'' if st.get('complete') else ' (INCOMPLETE)'}"
        )
        _print_hosts(tb)
        for line in testbed_job.describe(tb):
            print(line)
        if st.get("exporter"):
            print(f"metrics: {st['exporter']['url']}")
        procs = st.get("processes", [])
        if procs:
            print("processes:")
            for r in procs:
                print(f"  pid {r['pid']} on {r['host']}: {' '.join(r['argv'])}")
        return 0
    raise AssertionError(args.action)


def _print_hosts(tb: Testbed) -> None:
    rows = [("HOST", "ROLE", "NAMESPACE", "IF", "ADDRESS", "MAC", "PORT", "RATE")]
    for h in tb.hosts():
        rows.append(
            (
                h.name,
                h.role,
                h.netns,
                h.ifname,
                f"{h.ip}/{h.prefixlen}",
                h.mac,
                h.switch_port,
                _rate(h.rate_mbit),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def _standalone(argv=None) -> int:
    """``python -m homagg.cli.testbed ...``: the same as ``homagg testbed ...``."""
    parser = argparse.ArgumentParser(
        prog="homagg testbed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    log.setup()
    add_arguments(parser)
    return main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(_standalone())
