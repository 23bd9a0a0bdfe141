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
from fractions import Fraction

from homagg.errors import InvalidArgument

CALIBRATION_ENV = "HOMAGG_CALIBRATION"
CALIBRATION_VERSION = 1

# CPU coefficients of the model (picoseconds) and their bounds (hg_params_check)
ELEM_FIELDS = ("value_ps", "lane_ps", "bitmap_ps", "probe_ps", "sbbf_ps")
PKT_FIELDS = ("pkt_ps", "agg_pkt_ps")
COEFFICIENTS = PKT_FIELDS + ELEM_FIELDS
# the ring all-reduce's CPU (the process group's, Python only: the C code
# never predicts the ring, so they are not fields of struct hg_cost):
# picoseconds per byte a rank sends, nanoseconds per step
RING_FIELDS = ("ring_byte_ps", "ring_step_ns")
# a calibration made before version 3 has no sbbf_ps: read as 0 (no
# split-block option), so its jobs decide as they did
OPTIONAL_FIELDS = ("sbbf_ps",)
MAX_ELEM_PS = 1_000_000
MAX_PKT_PS = 100_000_000
# a phase round trip when the job names none: the testbed's veth + bridge
# path and a step's start, measured as the RTT estimator's SRTT there
DEFAULT_RTT_NS = 100_000

# Used when no calibration file exists: `homagg calibrate` on a 2-vCPU Intel
# Xeon VM under load, 2026-12-01, its AVX2 path (HOMAGG_CODEC_ISA=avx2),
# rounded up: a host without AVX-512 is the common case.
DEFAULT_COEFFICIENTS = {
    "pkt_ps": 2_000_000,
    "agg_pkt_ps": 150_000,
    "value_ps": 1_000,
    "lane_ps": 7_000,
    "bitmap_ps": 400,
    "probe_ps": 2_100,
    # not measured on that host: its probe_ps times the AVX2 path's
    # sbbf_ps / probe_ps on a 2-vCPU AMD EPYC (Zen 4), 204 / 153, rounded up
    "sbbf_ps": 2_800,
}


@dataclasses.dataclass(frozen=True)
class Cost:
    """``struct hg_cost``.  ``link_mbit`` 0: no model, the bytes rules.
    ``payload_bytes`` (0: 1024): a worker's client replaces it by the
    job's payload, and so does homagg.torch's choice of path
    (``for_payload``)."""

    link_mbit: int = 0
    rtt_ns: int = 0
    payload_bytes: int = 0
    pkt_ps: int = 0
    agg_pkt_ps: int = 0
    value_ps: int = 0
    lane_ps: int = 0
    bitmap_ps: int = 0
    probe_ps: int = 0
    sbbf_ps: int = 0
    # Python only (RING_FIELDS): not in fields(), in to_dict() when set
    ring_byte_ps: int = 0
    ring_step_ns: int = 0

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise InvalidArgument(f"cost.{f.name}: expected an integer, got {v!r}")
            bound = (
                MAX_ELEM_PS
                if f.name in ELEM_FIELDS or f.name == "ring_byte_ps"
                else MAX_PKT_PS
                if f.name in PKT_FIELDS
                else 2**32 - 1
            )
            if not 0 <= v <= bound:
                raise InvalidArgument(
                    f"cost.{f.name}: {v} is outside 0..{bound}"
                    + (" picoseconds" if f.name.endswith("_ps") else "")
                )

    @property
    def timed(self) -> bool:
        return self.link_mbit > 0

    def fields(self) -> dict:
        """The ``struct hg_cost`` fields (the ring's are not among them)."""
        d = dataclasses.asdict(self)
        for k in RING_FIELDS:
            del d[k]
        return d

    def ring(self) -> dict:
        """The ring all-reduce's CPU coefficients (RING_FIELDS)."""
        return {k: getattr(self, k) for k in RING_FIELDS}

    def to_dict(self) -> dict:
        """A job file's ``cost`` object: the ``struct hg_cost`` fields and
        the ring's where they are set (a job without them reads as before)."""
        return {**self.fields(), **{k: v for k, v in self.ring().items() if v}}

    @classmethod
    def from_dict(cls, d, context="cost") -> "Cost":
        """From a job file's ``cost`` object (None or {} = no model)."""
        if not d:
            return cls()
        if not isinstance(d, dict):
            raise InvalidArgument(
                f"{context}: expected an object of "
                f"{[f.name for f in dataclasses.fields(cls)]}, got {d!r}"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise InvalidArgument(
                f"{context}: unknown fields {sorted(unknown)} (known: {sorted(names)})"
            )
        return cls(**{k: int(v) for k, v in d.items()})


def for_payload(c: Cost, payload_bytes: int) -> Cost:
    """``c`` with the job's payload per packet, as a worker's client uses
    it (docs/PROTOCOL.md Part 1, "The cost model": ``P`` is the job's
    payload), so a prediction made outside the client (homagg.torch's
    choice of path) charges each packet over the bytes the job's packets
    really carry.  ``payload_bytes`` 0: ``c`` unchanged."""
    if not payload_bytes or c.payload_bytes == payload_bytes:
        return c
    return dataclasses.replace(c, payload_bytes=int(payload_bytes))


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
        raise InvalidArgument(
            f"{where}: not a version {CALIBRATION_VERSION} calibration "
            "(run `homagg calibrate` again)"
        )
    paths = cal.get("paths")
    if not isinstance(paths, dict) or not paths:
        raise InvalidArgument(f"{where}: no 'paths' (coefficients per ISA path)")
    for isa, coeffs in paths.items():
        for name in COEFFICIENTS:
            v = coeffs.get(name) if isinstance(coeffs, dict) else None
            if v is None and name in OPTIONAL_FIELDS and isinstance(coeffs, dict):
                continue
            bound = MAX_ELEM_PS if name in ELEM_FIELDS else MAX_PKT_PS
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= bound:
                raise InvalidArgument(
                    f"{where}: paths.{isa}.{name} = {v!r}: expected an "
                    f"integer number of picoseconds in 0..{bound}"
                )
    if not isinstance(cal.get("ports", {}), dict):
        raise InvalidArgument(f"{where}: 'ports' must be an object of testbed names")
    for name, entry in (cal.get("ports") or {}).items():
        check_port(entry, f"{where}: ports.{name}")
    if cal.get("isa") not in paths:
        raise InvalidArgument(
            f"{where}: 'isa' {cal.get('isa')!r} names none of the paths {sorted(paths)}"
        )
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
        raise InvalidArgument(
            f"calibration file {path}: cannot read it ({e}); run `homagg calibrate` again"
        ) from e
    return check_calibration(cal, f"calibration file {path}")


def coefficients(cal=None, isa=None) -> dict:
    """The coefficients of one ISA path of a calibration (default: the path
    the codec runs here, $HOMAGG_CODEC_ISA or the calibration's own);
    DEFAULT_COEFFICIENTS without a calibration."""
    if cal is None:
        return dict(DEFAULT_COEFFICIENTS)
    isa = isa or os.environ.get("HOMAGG_CODEC_ISA") or cal["isa"]
    paths = cal["paths"]
    return {k: int(v) for k, v in paths.get(isa, paths[cal["isa"]]).items() if k in COEFFICIENTS}


def slowest(*coeffs: dict) -> dict:
    """The largest of each coefficient over several hosts' coefficients."""
    return {k: max(int(c.get(k, 0)) for c in coeffs) for k in COEFFICIENTS}


def job_cost(link_mbit, rtt_ns=None, calibration=None, coeffs=None, sharing=1) -> Cost:
    """The cost model to register with a job: its link rate (Mbit/s; None or
    0: no model, the bytes rules), a phase round trip (default
    DEFAULT_RTT_NS) and the coefficients (``coeffs``, else the
    ``calibration`` given, else this host's calibration file, else the
    built-in defaults), every CPU coefficient multiplied by ``sharing``
    (:func:`sharing`: processes of the job per core of a host they share;
    1: a core each).  The ring's coefficients (RING_FIELDS), where
    ``coeffs`` has them, are taken as they are: the port's calibration
    measured them with the testbed's own sharing."""
    if not link_mbit:
        return Cost()
    if float(link_mbit) < 1:
        raise InvalidArgument(f"link rate {link_mbit} Mbit/s: at least 1 Mbit/s")
    if coeffs is None:
        coeffs = coefficients(calibration if calibration is not None else load_calibration())
    return Cost(
        link_mbit=int(link_mbit),
        rtt_ns=int(DEFAULT_RTT_NS if rtt_ns is None else rtt_ns),
        **shared(coeffs, sharing),
        **{k: int(coeffs[k]) for k in RING_FIELDS if k in coeffs},
    )


# --------------------------------------------------------------------------
# Shared cores and the calibration through a testbed's port (docs/PROTOCOL.md
# Part 1, "The cost model": "Shared cores" and "Calibration through the port")


def host_cores() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def sharing(processes: int, cores: int) -> Fraction:
    """How many processes of a job share one core: ``processes / cores``
    when a host runs more busy processes of the job (its ranks and its
    daemons) than it has cores, else 1 (a core each)."""
    if processes < 1 or cores < 1:
        raise InvalidArgument(f"sharing: {processes} processes on {cores} cores: both at least 1")
    return max(Fraction(1), Fraction(int(processes), int(cores)))


def shared(coeffs: dict, factor=1) -> dict:
    """The CPU coefficients multiplied by ``factor`` (rounded to the
    nearest picosecond, capped at their bounds): a process that has
    1/factor of a core takes factor times as long for the same work."""
    f = Fraction(factor)
    if f < 1:
        raise InvalidArgument(f"sharing {factor}: at least 1 (a core each)")
    out = {}
    for k in COEFFICIENTS:
        bound = MAX_ELEM_PS if k in ELEM_FIELDS else MAX_PKT_PS
        out[k] = min(bound, round(int(coeffs.get(k, 0) if k in OPTIONAL_FIELDS else coeffs[k]) * f))
    return out


PORT_FIELDS = ("pkt_ps", "agg_pkt_ps", "rtt_ns")


def check_port(entry, where="port calibration") -> dict:
    """One testbed's calibration through its port, if well formed."""
    if not isinstance(entry, dict):
        raise InvalidArgument(f"{where}: expected an object, got {entry!r}")
    for k in ("workers", "processes", "cores"):
        v = entry.get(k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InvalidArgument(f"{where}.{k} = {v!r}: expected a positive integer")
    co = entry.get("coefficients")
    if not isinstance(co, dict):
        raise InvalidArgument(f"{where}.coefficients: expected an object of {list(PORT_FIELDS)}")
    for k in PORT_FIELDS:
        v = co.get(k)
        bound = 2**32 - 1 if k == "rtt_ns" else MAX_PKT_PS
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= bound:
            raise InvalidArgument(
                f"{where}.coefficients.{k} = {v!r}: expected an integer in 0..{bound} "
                "(run `homagg calibrate --testbed NAME` again)"
            )
    ring = entry.get("ring")
    if ring is not None:
        if not isinstance(ring, dict):
            raise InvalidArgument(f"{where}.ring: expected an object of {list(RING_FIELDS)}")
        for k in RING_FIELDS:
            v = ring.get(k)
            bound = MAX_ELEM_PS if k == "ring_byte_ps" else 2**32 - 1
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= bound:
                raise InvalidArgument(
                    f"{where}.ring.{k} = {v!r}: expected an integer in 0..{bound} "
                    "(run `homagg calibrate --testbed NAME` again)"
                )
    return entry


def port_calibration(cal, testbed: str):
    """The calibration of ``testbed``'s port in ``cal`` (its "ports"
    section), or None."""
    if not cal:
        return None
    return (cal.get("ports") or {}).get(testbed)


def port_coefficients(cal, testbed: str, workers: int, isa=None):
    """(coefficients, rtt_ns) of a job on ``testbed``: the codec's
    coefficients of ``cal`` with the per-frame ones (``pkt_ps``,
    ``agg_pkt_ps``, per process with a core of its own) and the round trip
    fitted through the testbed's port, and the ring all-reduce's CPU
    (RING_FIELDS) when the entry has it; None when the testbed has no such
    calibration or it was made with another number of workers."""
    entry = port_calibration(cal, testbed)
    if entry is None or entry["workers"] != int(workers):
        return None
    co = coefficients(cal, isa)
    co["pkt_ps"] = entry["coefficients"]["pkt_ps"]
    co["agg_pkt_ps"] = entry["coefficients"]["agg_pkt_ps"]
    for k in RING_FIELDS if entry.get("ring") else ():
        co[k] = entry["ring"][k]
    return co, entry["coefficients"]["rtt_ns"]


def _least_squares_2(rows) -> tuple[Fraction, Fraction]:
    """The least-squares (a, b) of ``y = a u + b v`` over rows ``(u, v, y)``
    (Fractions, exact), both at least 0: where the free fit gives a negative
    b, b is 0 and a refitted alone, and where a is then negative, a is 0
    and b refitted alone (and at least 0)."""
    suu = sum(u * u for u, _, _ in rows)
    suv = sum(u * v for u, v, _ in rows)
    svv = sum(v * v for _, v, _ in rows)
    suy = sum(u * y for u, _, y in rows)
    svy = sum(v * y for _, v, y in rows)
    det = suu * svv - suv * suv
    a = b = None
    if det != 0:
        a = (suy * svv - svy * suv) / det
        b = (suu * svy - suv * suy) / det
    if b is None or b < 0:
        a, b = (suy / suu if suu else Fraction(0)), Fraction(0)
    if a < 0:
        a, b = Fraction(0), max(Fraction(0), svy / svv if svv else Fraction(0))
    return a, b


def fit_port(runs, *, workers: int, payload_bytes: int, link_mbit, factor=1) -> dict:
    """The per-frame costs and the round trip that make the model's
    prediction match allreduces measured through a testbed's port.

    Each run is a dict: ``seconds`` (measured), ``bytes`` (payload bytes
    per worker the model counts), ``steps`` (its round trips), ``elem_ps``
    (the worker CPU of its elements by the codec's coefficients, one core
    each), ``worker_cpu_s`` (a worker's CPU time per call) and
    ``daemon_cpu_s`` (the daemons' per call).  The model of a run
    (``factor`` the runs' sharing, link term as homagg.ops.advise):

        seconds = bytes * byte_ps * (1 + 98/P) + factor * elem_ps
                  + (bytes / P) * F + steps * rtt        (picoseconds)

    with ``F = factor * (pkt_ps + W * agg_pkt_ps)`` the wall time of one
    chunk's frames.  F and rtt are the least-squares fit of the runs'
    relative errors (both at least 0); F is split between the worker (``pkt_ps``) and the
    aggregator (``W * agg_pkt_ps``: W frames a chunk) in the proportion of
    the CPU they spent per call (a worker's above its elements' against the
    daemons'), and divided by the sharing, so the coefficients are those of
    a process with a core of its own, as the codec's are.  A dict: ``pkt_ps``, ``agg_pkt_ps``,
    ``rtt_ns`` (integers) and ``worker_share``."""
    runs = list(runs)
    if len(runs) < 2:
        raise InvalidArgument("fit_port: at least two runs (a dense and a union allreduce)")
    f = Fraction(factor)
    P = Fraction(int(payload_bytes or 1024))
    link_b = Fraction(8 * 10**6) / Fraction(link_mbit) * (1 + 98 / P)
    rows = []
    for r in runs:
        y = Fraction(r["seconds"]) * 10**12 - Fraction(r["bytes"]) * link_b
        y -= f * Fraction(r["elem_ps"])
        # each run weighed by its time: the fit minimises the relative errors,
        # so a short run counts as much as a long one
        t = Fraction(r["seconds"]) * 10**12
        if t <= 0:
            raise InvalidArgument(f"fit_port: a run of {r['seconds']!r} seconds; measure it again")
        rows.append((Fraction(r["bytes"]) / P / t, Fraction(int(r["steps"])) / t, y / t))
    F, rt = _least_squares_2(rows)
    w = sum(
        max(Fraction(0), Fraction(r["worker_cpu_s"]) * 10**12 - Fraction(r["elem_ps"]))
        for r in runs
    )
    d = sum(Fraction(r["daemon_cpu_s"]) * 10**12 for r in runs)
    share = w / (w + d) if w + d > 0 else Fraction(1, 2)
    return {
        "pkt_ps": min(MAX_PKT_PS, round(F * share / f)),
        "agg_pkt_ps": min(MAX_PKT_PS, round(F * (1 - share) / (f * workers))),
        "rtt_ns": min(2**32 - 1, round(rt / 1000)),
        "worker_share": float(share),
    }


def ring_bytes(workers: int, n: int) -> int:
    """The bytes a rank of a ring all-reduce of ``n`` float32 elements
    over ``workers`` ranks sends: ``ceil(2 (W-1) 4n / W)``."""
    return _ceil(2 * (workers - 1) * 4 * n, workers)


def fit_ring(runs, *, workers: int, link_mbit) -> dict:
    """The ring all-reduce's CPU coefficients that make :func:`ring_ps`
    match ring all-reduces (the process group's, Gloo) measured through a
    testbed's port.  Each run is a dict: ``seconds`` (measured) and
    ``elements`` (float32 elements).  The model of a run, with B =
    :func:`ring_bytes` and S = 2 (W-1) its steps (picoseconds):

        seconds = B * (byte_ps + ring_byte_ps) + S * ring_step

    ``byte_ps`` the link's (8e6 // link_mbit).  ``ring_step`` is a step's
    whole fixed cost (its hop and its start), in place of the half round
    trip of an uncalibrated ring: HomAgg's fitted round trip is the fixed
    cost of one of its phases, not of a ring's hop.  ``ring_byte_ps`` and
    ``ring_step`` are the least-squares fit of the runs' relative errors,
    ``ring_byte_ps`` at least 0 and ``ring_step_ns`` at least 1 (0 means
    no calibration); they are as measured, with the testbed's sharing of
    the cores (not divided by it).  A dict: ``ring_byte_ps``,
    ``ring_step_ns`` (integers)."""
    runs = list(runs)
    if len(runs) < 2 or len({int(r["elements"]) for r in runs}) < 2:
        raise InvalidArgument("fit_ring: at least two runs of different sizes")
    if workers < 2:
        raise InvalidArgument(f"fit_ring: {workers} workers; a ring has at least 2")
    byte_ps = 8 * 10**6 // int(link_mbit)
    S = 2 * (workers - 1)
    rows = []
    for r in runs:
        t = Fraction(r["seconds"]) * 10**12
        if t <= 0:
            raise InvalidArgument(f"fit_ring: a run of {r['seconds']!r} seconds; measure it again")
        B = ring_bytes(workers, int(r["elements"]))
        rows.append((Fraction(B) / t, Fraction(S) / t, (t - B * byte_ps) / t))
    a, b = _least_squares_2(rows)
    return {
        "ring_byte_ps": min(MAX_ELEM_PS, round(a)),
        "ring_step_ns": min(2**32 - 1, max(1, round(b / 1000))),
    }


# --------------------------------------------------------------------------
# HomAgg or the process group's allreduce (docs/TRAINING.md "Never slower
# than the baseline"; docs/PROTOCOL.md Part 1 "The cost model")

# methods whose bucket may go through the process group instead: the exact
# ones (a lossy method's result differs from the group's by design)
BASELINE_METHODS = ("auto", "dense", "blocks", "lhc", "union")
FRAMING_BYTES = 98  # per packet: Ethernet preamble, gap and FCS, IPv4, UDP, header


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def ring_ps(c: Cost, workers: int, n: int) -> int:
    """Ring all-reduce of ``n`` float32 elements over ``workers`` ranks
    (picoseconds): ``B = ceil(2 (W-1) 4n / W)`` bytes per rank at the link
    rate plus ``ring_byte_ps`` each, in ``2 (W-1)`` steps of
    ``ring_step_ns`` each (:func:`fit_ring`), or of half a round trip when
    the ring is not calibrated (``ring_step_ns`` 0); its framing and CPU
    are then not charged either (this favours the baseline)."""
    if workers < 2 or n < 1:
        return 0
    byte_ps = 8 * 10**6 // c.link_mbit
    step_ps = 1000 * c.ring_step_ns if c.ring_step_ns else 500 * c.rtt_ns
    return ring_bytes(workers, n) * (byte_ps + c.ring_byte_ps) + 2 * (workers - 1) * step_ps


def homagg_ps(
    c: Cost, workers: int, n: int, nnz_max: int | None, method: str = "auto", block: int = 4096
) -> int:
    """An upper bound of the predicted time (picoseconds) of ``method`` on a
    bucket of ``n`` float32 elements whose ranks hold at most ``nnz_max``
    non-zeros each (None: unknown, only dense's and blocks' bound; union
    and lhc are then not bounded and the result is dense's).  Every term
    is the cost model's (docs/PROTOCOL.md Part 1), integers only:

    - dense (and blocks, which sends at most dense's values): the exponents
      (one byte per block) and ``4n`` value bytes at ``xb`` each, ``n *
      value_ps``, two round trips;
    - union (and lhc, which sends at least union's bytes): the exponents,
      the counts (4 bytes per block), a bitmap index of every element
      (``ceil(n/8)`` bytes, ``n * bitmap_ps``; a Bloom filter is taken only
      where the model predicts it faster) and ``N = min(n, W * nnz_max)``
      candidate lanes (no position shared by two ranks: the most there can
      be) at ``4 xb + lane_ps`` each, four round trips;
    - auto: the smaller of the two (auto's rule picks the fastest by the
      same model, plus at most the counts' step).
    """
    if method not in BASELINE_METHODS:
        raise InvalidArgument(
            f"method {method!r}: the choice of path covers {', '.join(BASELINE_METHODS)}"
        )
    byte_ps = 8 * 10**6 // c.link_mbit
    P = c.payload_bytes or 1024
    xb = byte_ps + (c.pkt_ps + workers * c.agg_pkt_ps + FRAMING_BYTES * byte_ps) // P
    rt = 1000 * c.rtt_ns
    nb = _ceil(n, block)
    dense = (nb + 4 * n) * xb + n * c.value_ps + 2 * rt
    if method in ("dense", "blocks") or nnz_max is None:
        return dense
    lanes = min(n, workers * int(nnz_max))
    union = (
        (nb + 4 * nb + _ceil(n, 8)) * xb + n * c.bitmap_ps + lanes * (4 * xb + c.lane_ps) + 4 * rt
    )
    if method in ("union", "lhc"):
        return union
    return min(dense, union)


def choose_path(
    c: Cost, workers: int, n: int, nnz_max: int | None, method: str = "auto", block: int = 4096
) -> dict:
    """The path of one bucket: {"path": "homagg" or "baseline",
    "homagg_ps", "baseline_ps"}.  "baseline" (the process group's own
    allreduce) only when its predicted time is strictly below HomAgg's
    bound; a job without a link rate, a lossy method or one rank: "homagg".
    Every input is the same on every rank, so every rank chooses alike."""
    if not c.timed or method not in BASELINE_METHODS or workers < 2 or n < 1:
        return {"path": "homagg", "homagg_ps": None, "baseline_ps": None}
    h = homagg_ps(c, workers, n, nnz_max, method, block)
    g = ring_ps(c, workers, n)
    return {"path": "baseline" if g < h else "homagg", "homagg_ps": h, "baseline_ps": g}


def needs_density(c: Cost, workers: int, n: int, method: str = "auto", block: int = 4096) -> bool:
    """Whether the choice of ``choose_path`` depends on the ranks' non-zero
    counts: only when dense's bound alone loses to the baseline and the
    method may run union.  Otherwise the hook decides without agreeing on
    a count (no extra collective)."""
    if not c.timed or method not in ("auto", "union", "lhc") or workers < 2 or n < 1:
        return False
    if method == "auto":
        return choose_path(c, workers, n, None, method, block)["path"] == "baseline"
    return True
