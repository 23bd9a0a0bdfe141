"""The cost model of a job (docs/PROTOCOL.md Part 1, "The cost model").

With a link rate registered, the codec chooses each block's index kind and
auto's method by predicted time (wire bytes at the link rate plus the CPU
they cost on the workers and the aggregator, plus round trips) instead of
bytes.  The inputs must be the same on every worker, so they belong to the
job: :class:`Cost` is registered with it (the job file's ``cost`` field,
``Worker(cost=...)``, ``sim.Cluster(cost=...)``) and a worker never
replaces it by its own measurements.

Where the coefficients come from: ``homagg calibrate`` times the codec's
own calls on this host, per ISA path, and writes a calibration file:
``$HOMAGG_CALIBRATION`` if set, else ``$XDG_CONFIG_HOME/homagg/calibration.json``
(``~/.config/homagg/calibration.json``).  :func:`job_cost` builds a job's
model from a link rate and that file (built-in defaults when there is none),
taken once where the job is created; :func:`slowest` combines the
calibrations of several hosts (the largest of each coefficient).

A job without a link rate (``Cost()``, ``link_mbit`` 0) decides by bytes,
exactly as before the model existed.
"""
from __future__ import annotations

import dataclasses
import json
import os

from homagg.errors import InvalidArgument

CALIBRATION_ENV = "HOMAGG_CALIBRATION"
CALIBRATION_VERSION = 1

# CPU coefficients of the model (picoseconds) and their bounds (hg_params_check)
ELEM_FIELDS = ("value_ps", "lane_ps", "bitmap_ps", "probe_ps")
PKT_FIELDS = ("pkt_ps", "agg_pkt_ps")
COEFFICIENTS = PKT_FIELDS + ELEM_FIELDS
MAX_ELEM_PS = 1_000_000
MAX_PKT_PS = 100_000_000
# a phase round trip when the job names none: the testbed's veth + bridge
# path and a step's start, measured as the RTT estimator's SRTT there
DEFAULT_RTT_NS = 100_000

# Used when no calibration file exists: `homagg calibrate` on a 2-vCPU Intel
# Xeon VM under load, 2026-12-01, its AVX2 path (HOMAGG_CODEC_ISA=avx2),
# rounded up: a host without AVX-512 is the common case.
DEFAULT_COEFFICIENTS = {
    "pkt_ps": 2_000_000, "agg_pkt_ps": 150_000, "value_ps": 1_000,
    "lane_ps": 7_000, "bitmap_ps": 400, "probe_ps": 2_100,
}


@dataclasses.dataclass(frozen=True)
class Cost:
    """``struct hg_cost``.  ``link_mbit`` 0: no model, the bytes rules.
    ``payload_bytes`` matters only to the codec's own calls (0: 1024): a
    worker's client replaces it by the job's payload."""

    link_mbit: int = 0
    rtt_ns: int = 0
    payload_bytes: int = 0
    pkt_ps: int = 0
    agg_pkt_ps: int = 0
    value_ps: int = 0
    lane_ps: int = 0
    bitmap_ps: int = 0
    probe_ps: int = 0

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise InvalidArgument(f"cost.{f.name}: expected an integer, got {v!r}")
            bound = (MAX_ELEM_PS if f.name in ELEM_FIELDS else
                     MAX_PKT_PS if f.name in PKT_FIELDS else 2**32 - 1)
            if not 0 <= v <= bound:
                raise InvalidArgument(f"cost.{f.name}: {v} is outside 0..{bound}"
                                      + (" picoseconds" if f.name.endswith("_ps") else ""))

    @property
    def timed(self) -> bool:
        return self.link_mbit > 0

    def fields(self) -> dict:
        """The ``struct hg_cost`` fields."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d, context="cost") -> "Cost":
        """From a job file's ``cost`` object (None or {} = no model)."""
        if not d:
            return cls()
        if not isinstance(d, dict):
            raise InvalidArgument(f"{context}: expected an object of "
                                  f"{[f.name for f in dataclasses.fields(cls)]}, got {d!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise InvalidArgument(f"{context}: unknown fields {sorted(unknown)} "
                                  f"(known: {sorted(names)})")
        return cls(**{k: int(v) for k, v in d.items()})


def as_cost(value) -> Cost:
    """A Cost from a Cost, a dict (job file) or None."""
    if isinstance(value, Cost):
        return value
    return Cost.from_dict(value)


# --------------------------------------------------------------------------
# Calibration files


def calibration_path(env=None) -> str:
    """$HOMAGG_CALIBRATION, else $XDG_CONFIG_HOME/homagg/calibration.json."""
    env = os.environ if env is None else env
    if env.get(CALIBRATION_ENV):
        return env[CALIBRATION_ENV]
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "homagg", "calibration.json")


def check_calibration(cal, where="calibration") -> dict:
    """The calibration if well formed, else InvalidArgument naming the field."""
    if not isinstance(cal, dict) or cal.get("version") != CALIBRATION_VERSION:
        raise InvalidArgument(f"{where}: not a version {CALIBRATION_VERSION} calibration "
                              "(run `homagg calibrate` again)")
    paths = cal.get("paths")
    if not isinstance(paths, dict) or not paths:
        raise InvalidArgument(f"{where}: no 'paths' (coefficients per ISA path)")
    for isa, coeffs in paths.items():
        for name in COEFFICIENTS:
            v = coeffs.get(name) if isinstance(coeffs, dict) else None
            bound = MAX_ELEM_PS if name in ELEM_FIELDS else MAX_PKT_PS
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= bound:
                raise InvalidArgument(f"{where}: paths.{isa}.{name} = {v!r}: expected an "
                                      f"integer number of picoseconds in 0..{bound}")
    if cal.get("isa") not in paths:
        raise InvalidArgument(f"{where}: 'isa' {cal.get('isa')!r} names none of the paths "
                              f"{sorted(paths)}")
    return cal


def load_calibration(path=None):
    """The calibration file's contents, or None when there is none."""
    path = path or calibration_path()
    try:
        with open(path) as f:
            cal = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise InvalidArgument(f"calibration file {path}: cannot read it ({e}); "
                              "run `homagg calibrate` again") from e
    return check_calibration(cal, f"calibration file {path}")


def coefficients(cal=None, isa=None) -> dict:
    """The coefficients of one ISA path of a calibration (default: the path
    the codec runs here, $HOMAGG_CODEC_ISA or the calibration's own);
    DEFAULT_COEFFICIENTS without a calibration."""
    if cal is None:
        return dict(DEFAULT_COEFFICIENTS)
    isa = isa or os.environ.get("HOMAGG_CODEC_ISA") or cal["isa"]
    paths = cal["paths"]
    return {k: int(v) for k, v in paths.get(isa, paths[cal["isa"]]).items()
            if k in COEFFICIENTS}


def slowest(*coeffs: dict) -> dict:
    """The largest of each coefficient over several hosts' coefficients."""
    return {k: max(int(c[k]) for c in coeffs) for k in COEFFICIENTS}


def job_cost(link_mbit, rtt_ns=None, calibration=None, coeffs=None) -> Cost:
    """The cost model to register with a job: its link rate (Mbit/s; None or
    0: no model, the bytes rules), a phase round trip (default
    DEFAULT_RTT_NS) and the coefficients (``coeffs``, else the
    ``calibration`` given, else this host's calibration file, else the
    built-in defaults)."""
    if not link_mbit:
        return Cost()
    if float(link_mbit) < 1:
        raise InvalidArgument(f"link rate {link_mbit} Mbit/s: at least 1 Mbit/s")
    if coeffs is None:
        coeffs = coefficients(calibration if calibration is not None else load_calibration())
    return Cost(link_mbit=int(link_mbit), rtt_ns=int(DEFAULT_RTT_NS if rtt_ns is None
                                                     else rtt_ns), **coeffs)
