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
worker host has one; else the calibration of the host creating the job).

examples:
  homagg calibrate
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
        "-i",
        "--inventory",
        metavar="TOML",
        default=None,
        help="calibrate every worker host of this inventory (over SSH) instead of this machine",
    )


def main(args) -> int:
    if args.inventory:
        return _remote(args)
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
