"""Measure this host's cost-model coefficients and write the calibration file.

Times the codec's own calls per ISA path this CPU runs (a few seconds) and
writes the coefficients of docs/PROTOCOL.md "The cost model" to
$HOMAGG_CALIBRATION, else ~/.config/homagg/calibration.json (--out names
another).  A job created on this host registers them with its link rate
(`homagg testbed up --link-mbit`, an inventory's link_mbit); every rank of
the job decides with the job's numbers, never with its own host's.

examples:
  homagg calibrate
  homagg calibrate --json --out /tmp/calibration.json
"""
import json

from homagg import cost
from homagg.bench import calibrate as measure


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print the calibration as JSON")
    p.add_argument("--out", metavar="PATH", default=None,
                   help="file to write (default: $HOMAGG_CALIBRATION, else "
                   "~/.config/homagg/calibration.json)")
    p.add_argument("--elements", type=int, default=1 << 20,
                   help="tensor size of the codec timings (default: %(default)s)")
    p.add_argument("--repeat", type=int, default=5,
                   help="runs of each timing, the best is kept (default: %(default)s)")


def main(args) -> int:
    cal = measure.calibrate(args.elements, args.repeat)
    path = measure.write(cal, args.out or cost.calibration_path())
    if args.json:
        print(json.dumps({**cal, "file": path}, indent=1))
    else:
        print(f"calibrated {cal['cpu']} in {cal['seconds']} s, ISA paths "
              f"{', '.join(cal['paths'])} (jobs use {cal['isa']}): {path}")
        for isa, c in cal["paths"].items():
            print(f"  {isa:9s} " + "  ".join(f"{k} {v}" for k, v in c.items()))
    return 0
