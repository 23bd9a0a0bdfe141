"""Measure this host's cost-model coefficients and write the calibration file.

Times the codec's own calls per ISA path this CPU runs (a few seconds) and
writes the coefficients of docs/PROTOCOL.md "The cost model" to
$HOMAGG_CALIBRATION, else ~/.config/homagg/calibration.json (--out names
another).  A job created on this host registers them with its link rate
(`homagg testbed up --link-mbit`, an inventory's link_mbit); every rank of
the job decides with the job's numbers, never with its own host's.

With -i INVENTORY it runs on every worker host of the inventory instead,
one after the other, into INSTALL_DIR/calibration.json on each host; a job
that `homagg up -i` / `run -i` / `train -i` then creates registers the
slowest of those calibrations, coefficient by coefficient (while every
worker host has one; else the calibration of the host creating the job),
and the running job of `homagg up -i`, when it has a cost model, gets it
in every host's job file.

With --testbed NAME (root) it times allreduces through that local
testbed's real path instead (the worker client, veth, bridge and the
daemon's port: two dense allreduces and two union ones, about half a
minute) and fits the per-frame worker and aggregator costs and the round
trip, so that the model's prediction matches them on that testbed, then
two ring all-reduces of the process group (Gloo, when torch is installed)
and fits the ring's CPU per byte and per step, which the choice between
HomAgg and the process group (and `homagg advise`'s ring) then charges;
they go into the same file, as the testbed's entry of its "ports" section
(keeping the codec's coefficients; measured first when there are none),
and every job created on that testbed afterwards registers them, scaled by
the sharing of this host's cores among the job's processes; the standing
job of `homagg testbed up` gets them in its job file (the ranks read it
when they start).

examples:
  homagg calibrate
  sudo homagg calibrate --testbed demo
  homagg calibrate --json --out /tmp/calibration.json
  homagg calibrate -i testbed.toml
"""

import json
import sys

from homagg import cost
from homagg.bench import calibrate as measure


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print the calibration as JSON")
    p.add_argument(
        "--out",
        metavar="PATH",
        default=None,
        help="file to write (default: $HOMAGG_CALIBRATION, else ~/.config/homagg/calibration.json)",
    )
    p.add_argument(
        "--elements",
        type=int,
        default=1 << 20,
        help="tensor size of the codec timings (default: %(default)s)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="runs of each timing, the best is kept (default: %(default)s)",
    )
    p.add_argument(
        "--testbed",
        metavar="NAME",
        default=None,
        help="calibrate the per-frame costs through this local testbed's port (root)",
    )
    p.add_argument("--state-dir", default=None, help="testbed state directory (with --testbed)")
    p.add_argument(
        "-i",
        "--inventory",
        metavar="TOML",
        default=None,
        help="calibrate every worker host of this inventory (over SSH) instead of this machine",
    )


def main(args) -> int:
    if args.inventory:
        return _remote(args)
    if args.testbed:
        return _port(args)
    cal = measure.calibrate(args.elements, args.repeat)
    path = measure.write(cal, args.out or cost.calibration_path())
    if args.json:
        print(json.dumps({**cal, "file": path}, indent=1))
    else:
        print(
            f"calibrated {cal['cpu']} in {cal['seconds']} s, ISA paths "
            f"{', '.join(cal['paths'])} (jobs use {cal['isa']}): {path}"
        )
        for isa, c in cal["paths"].items():
            print(f"  {isa:9s} " + "  ".join(f"{k} {v}" for k, v in c.items()))
    return 0


def _remote(args) -> int:
    from homagg.deploy.remote import hosts
    from homagg.deploy.remote import inventory as inv
    from homagg.errors import HomAggError

    if args.out:
        print(
            "homagg calibrate: --out is for this machine; with -i each worker host keeps its "
            "own calibration in INSTALL_DIR/calibration.json",
            file=sys.stderr,
        )
        return 2
    try:
        inventory = inv.load(args.inventory)
        cals = hosts.calibrate(
            inventory, sys.stderr if args.json else sys.stdout, args.elements, args.repeat
        )
    except HomAggError as e:
        print(f"homagg calibrate: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(
            json.dumps(
                {
                    name: {**cal, "file": hosts.calibration_file(inventory.host(name))}
                    for name, cal in cals.items()
                },
                indent=1,
            )
        )
    else:
        print(
            f"jobs on {args.inventory} will register the slowest of {len(cals)} worker "
            "hosts' calibrations"
        )
    return 0


def _port(args) -> int:
    from homagg.errors import HomAggError

    path = args.out or cost.calibration_path()
    try:
        cal = measure.host_or_measured(path, args.elements, args.repeat)
        entry = measure.calibrate_port(
            args.testbed,
            args.state_dir,
            calibration=cal,
            progress=lambda m: print(f"calibrate {args.testbed}: {m}", file=sys.stderr),
        )
        measure.write(measure.add_port(cal, args.testbed, entry), path)
        job_path = _refresh_job(args)
    except HomAggError as e:
        print(f"homagg calibrate: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({**entry, "file": path, "job_file": job_path}, indent=1))
        return 0
    co = entry["coefficients"]
    print(
        f"testbed {args.testbed}: {entry['workers']} workers and {entry['processes'] - entry['workers']} "
        f"daemon(s) on {entry['cores']} cores (sharing {entry['sharing']:g}): pkt_ps "
        f"{co['pkt_ps']} agg_pkt_ps {co['agg_pkt_ps']} rtt_ns {co['rtt_ns']} "
        f"(a core each): {path}"
    )
    for r in entry["runs"]:
        print(
            f"  {r['method']:6s} {r['elements']:8d} at {r['density']:<6g} measured "
            f"{r['seconds'] * 1e3:8.2f} ms, predicted {r['predicted_s'] * 1e3:8.2f} ms"
            f"{_machine_cpu(r)}"
        )
    ring = entry.get("ring")
    if ring:
        print(
            f"  ring all-reduce (gloo): ring_byte_ps {ring['ring_byte_ps']} "
            f"ring_step_ns {ring['ring_step_ns']} (as measured, shared)"
        )
        for r in ring["runs"]:
            print(
                f"  gloo   {r['elements']:8d}            measured "
                f"{r['seconds'] * 1e3:8.2f} ms, predicted {r['predicted_s'] * 1e3:8.2f} ms"
                f"{_machine_cpu(r)}"
            )
    else:
        print(f"  no ring coefficients: {entry.get('ring_unavailable')}")
    if job_path:
        print(f"the testbed's job registers it from now on: {job_path}")
    return 0


def _machine_cpu(run) -> str:
    """The text ", machine CPU X ms" of a run (every process and the kernel, per call)."""
    v = run.get("machine_cpu_s")
    return "" if v is None else f", machine CPU {v * 1e3:7.2f} ms"


def _refresh_job(args):
    """The testbed's standing job given the new cost model (its job file)."""
    from homagg.deploy.local import testbed_job
    from homagg.deploy.local.testbed import Testbed

    return testbed_job.refresh_cost(Testbed.open(args.testbed, args.state_dir))
