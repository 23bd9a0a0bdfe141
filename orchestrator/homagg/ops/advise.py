"""Will HomAgg help here?  Predicted allreduce times from the cost model.

:func:`advise` predicts, for W workers allreducing N float32 elements of a
workload's gradients over links of L Mbit/s, the time of ring all-reduce
and of each exact HomAgg method (dense, blocks, lhc, union, auto), the
speedup of each against ring, and which term of its time is the largest
(what binds: the link, the workers' CPU, the aggregator's CPU, round
trips).  It is the cost model of docs/PROTOCOL.md Part 1 ("The cost
model") applied to whole methods:

- bytes per phase come from a real run of the codec
  (:func:`homagg.codec.simulate_allreduce`) on the workload's generated
  gradients (:mod:`homagg.bench.workloads`), with the job's cost model
  registered so that index kinds and auto's choice are the ones a job with
  that link rate makes; a tensor larger than ``sample_elements`` is
  simulated on its first ``sample_elements`` (a whole number of blocks)
  and every byte and element count is scaled by N / sample;
- a phase of B bytes per worker costs ``B * xb`` (its wire time with the
  framing of each packet, the worker's CPU per packet and the aggregator's
  CPU per frame, split into those three terms), plus the per-element CPU
  of its lanes (``value_ps`` per dense or blocks value, ``lane_ps`` per
  union lane, the index time of each block by the model's rule); each step
  costs one round trip ``rtt_ns``.  lhc's sketch cells and fallback lanes
  are costed as union lanes (the model has no coefficient of their own);
- the terms add up: the model assumes no overlap between the link, the
  CPUs and the round trips, so "binds" names the largest term;
- ring all-reduce sends and receives ``2 (W-1)/W * 4 N`` bytes per worker
  at the link rate in ``2 (W-1)`` steps, each costing half a round trip
  (one hop to the next worker); where the job's model carries the ring's
  coefficients (fitted by ``homagg calibrate --testbed``) each byte costs
  ``ring_byte_ps`` more (the kernel's TCP, the process group's copies and
  additions) and each step ``ring_step_ns`` in place of half the round
  trip; without them neither framing nor CPU is charged, which favours
  ring.

The coefficients are the job's as :func:`homagg.cost.job_cost` takes them:
this host's calibration file (``homagg calibrate``), built-in defaults
when there is none.
"""

from __future__ import annotations

import dataclasses

from homagg import cost as _cost
from homagg.errors import InvalidArgument

METHODS = ("dense", "blocks", "lhc", "union", "auto")
# framing bytes per packet: Ethernet preamble, gap and FCS, IPv4, UDP, HomAgg
# header (docs/PROTOCOL.md "The cost model")
FRAMING = 98
# Bloom options of "lhc: index": (bits per element, probes, fp * 2^20)
BLOOM = ((8, 6, 22625), (12, 8, 3295), (16, 8, 602), (20, 8, 146), (24, 8, 44))
# split-block options 5-9 (bits per element, fp * 2^20), only with sbbf_ps
SPLIT = ((8, 34825), (12, 5683), (16, 1379), (24, 171), (32, 38))
EXP_ZERO = -128
DEFAULT_SAMPLE = 1 << 21
# W x sample elements simulated at most (float32: 4 bytes each)
MAX_SIMULATED = 1 << 23

ASSUMPTIONS = (
    "terms add up: no overlap of the link, the CPUs and the round trips",
    "one round trip (rtt_ns) per HomAgg step; ring: 2(W-1) steps of half a round trip",
    "ring: 2(W-1)/W x 4N payload bytes per worker at the link rate, no framing, "
    "its CPU only from ring_byte_ps, a step ring_step_ns in place of half the round trip "
    "(0 unless calibrated through the port: favours ring)",
    "HomAgg bytes: the codec run on the workload's generated gradients, "
    "scaled by N / simulated elements when N is larger",
    "lhc's sketch cells and fallback lanes cost lane_ps each, as union lanes",
    "every worker and the aggregator on links of the same rate; one aggregator",
)


def _xb_terms(c: _cost.Cost, workers: int):
    """The picoseconds of one byte of a phase, as (link, worker, aggregator)."""
    byte_ps = 8 * 10**6 / c.link_mbit
    P = c.payload_bytes or 1024
    return (byte_ps * (1 + FRAMING / P), c.pkt_ps / P, workers * c.agg_pkt_ps / P)


def _xb_int(c: _cost.Cost, workers: int) -> int:
    """The model's xb, integer as the C code computes it."""
    byte_ps = 8 * 10**6 // c.link_mbit
    P = c.payload_bytes or 1024
    return byte_ps + (c.pkt_ps + workers * c.agg_pkt_ps + FRAMING * byte_ps) // P


def index_plan(c: _cost.Cost, workers: int, n: int, block: int, gcodes, gcounts):
    """The index of every non-zero block by the model's rule: a list of
    (block, kind, index bytes, worker CPU ps) with kind "bitmap", "bloom" or
    "split" (a split-block filter)."""
    xb = _xb_int(c, workers)
    out = []
    for b, (code, count) in enumerate(zip(gcodes, gcounts)):
        if int(code) == EXP_ZERO:
            continue
        length = min(block, n - b * block)
        count = int(count)
        cnt = min(count, length)
        cw = min(length, -(-count // workers))
        nbytes = -(-length // 8)
        cpu = length * c.bitmap_ps
        best, choice = nbytes * xb + cpu, ("bitmap", nbytes, cpu)
        for bpe, k, fp in BLOOM:
            bits = max(64, -(-(bpe * cnt) // 64) * 64)
            bcpu = k * (length + cw) * c.probe_ps
            t = (bits // 8) * xb + bcpu
            fpn = fp * (length - cnt) >> 20
            t += fpn * (4 * xb + c.lane_ps)
            if t < best:
                best, choice = t, ("bloom", bits // 8, bcpu)
        for bpe, fp in SPLIT if c.sbbf_ps else ():
            nblk = max(1, -(-(bpe * cnt) // 256))
            bcpu = (length + cw) * c.sbbf_ps
            t = 32 * nblk * xb + bcpu + (fp * (length - cnt) >> 20) * (4 * xb + c.lane_ps)
            if t < best:
                best, choice = t, ("split", 32 * nblk, bcpu)
        out.append((b, *choice))
    return out


def _sample_size(elements, workers, block, sample_elements):
    cap = max(block, min(sample_elements, MAX_SIMULATED // workers))
    if elements <= cap:
        return elements
    return max(block, cap // block * block)


def _phase_cpu(phase, nbytes, index_cpu, c: _cost.Cost):
    """Per-element worker CPU (ps) of a phase of nbytes per worker."""
    lanes = nbytes / 4
    if phase == "values":
        return lanes * c.value_ps
    if phase in ("union", "sketch", "fallback"):
        return lanes * c.lane_ps
    if phase == "index":
        return index_cpu
    return 0.0


def _predict(phase_bytes, steps, index_cpu, c, workers):
    """Time and its terms (seconds) of phases of phase_bytes in steps."""
    link, wcpu, acpu = _xb_terms(c, workers)
    terms = {"link": 0.0, "worker_cpu": 0.0, "aggregator_cpu": 0.0, "round_trips": 0.0}
    phases = {}
    for phase, b in phase_bytes.items():
        cpu = b * wcpu + _phase_cpu(phase, b, index_cpu, c)
        terms["link"] += b * link
        terms["worker_cpu"] += cpu
        terms["aggregator_cpu"] += b * acpu
        phases[phase] = (b * (link + acpu) + cpu) * 1e-12
    terms["round_trips"] = steps * 1000 * c.rtt_ns
    terms = {k: v * 1e-12 for k, v in terms.items()}
    return sum(terms.values()), terms, phases


def ring(c: _cost.Cost, workers: int, elements: int) -> dict:
    """Ring all-reduce's predicted time (see the module docstring)."""
    nbytes = 2 * (workers - 1) / workers * 4 * elements
    steps = 2 * (workers - 1)
    terms = {
        "link": nbytes * 8e-6 / c.link_mbit,
        # the ring's CPU per byte (homagg.cost.RING_FIELDS; 0 without a
        # calibration of the ring through the port)
        "worker_cpu": nbytes * c.ring_byte_ps * 1e-12,
        "aggregator_cpu": 0.0,
        # a step: its calibrated cost, else half a round trip
        "round_trips": steps * (c.ring_step_ns if c.ring_step_ns else c.rtt_ns / 2) * 1e-9,
    }
    t = sum(terms.values())
    return {
        "time_s": t,
        "bytes_per_worker": round(nbytes),
        "steps": steps,
        "terms": terms,
        "binds": max(terms, key=terms.get) if t else "nothing",
    }


def job_model(link_mbit, rtt_ns=None, payload_bytes=1024, calibration=None, coeffs=None):
    """(the job's cost model as homagg.cost.Cost, where its coefficients
    came from): this host's calibration file, the one given, or the
    built-in defaults."""
    if not link_mbit or float(link_mbit) < 1:
        raise InvalidArgument(f"link rate {link_mbit} Mbit/s: at least 1 Mbit/s")
    source = "given"
    if coeffs is None:
        if calibration is None:
            path = _cost.calibration_path()
            calibration = _cost.load_calibration(path)
            source = path if calibration is not None else "built-in defaults (no calibration file)"
        else:
            source = "calibration given"
        coeffs = _cost.coefficients(calibration)
    job = _cost.job_cost(link_mbit, rtt_ns, coeffs=coeffs)
    return dataclasses.replace(job, payload_bytes=int(payload_bytes)), source


def testbed_model(testbed: str, workers: int, calibration=None):
    """(coefficients, rtt_ns, where from) of a job on the local testbed
    ``testbed`` with ``workers`` workers: this host's calibration with the
    testbed's entry of its "ports" section (``homagg calibrate --testbed``),
    every CPU coefficient scaled by the sharing recorded there, as the
    testbed's job creation does (homagg.deploy.local.testbed_job.job_cost);
    the ring's (RING_FIELDS), where the entry has them, as measured."""
    path = _cost.calibration_path()
    if calibration is None:
        calibration = _cost.load_calibration(path)
    entry = _cost.port_calibration(calibration, testbed)
    if entry is None:
        raise InvalidArgument(
            f"--testbed {testbed}: {path} has no calibration of that testbed; "
            f"run `homagg calibrate --testbed {testbed}` first"
        )
    port = _cost.port_coefficients(calibration, testbed, workers)
    if port is None:
        raise InvalidArgument(
            f"--testbed {testbed}: calibrated with {entry['workers']} workers, not {workers}; "
            f"give --workers {entry['workers']} or calibrate it again"
        )
    coeffs, rtt_ns = port
    factor = _cost.sharing(entry["processes"], entry["cores"])
    ring = {k: coeffs[k] for k in _cost.RING_FIELDS if k in coeffs}
    return (
        {**_cost.shared(coeffs, factor), **ring},
        rtt_ns,
        f"testbed {testbed} calibrated through its port ({path}), sharing {float(factor):g}",
    )


def predict(grads, elements, c: _cost.Cost, *, block, seed=1, methods=METHODS) -> dict:
    """Ring all-reduce and every method on the workers' float32 gradients
    ``grads`` (one array each, the same length n), standing for an
    allreduce of ``elements`` elements (n or fewer: bytes and element
    counts are scaled by elements / n).  A dict with "ring", "methods"
    (those of ``methods``, default all), "best", "index_plan",
    "simulated_elements" and "scale"."""
    import numpy as np

    from homagg import codec, protocol

    workers = len(grads)
    n = int(grads[0].size)
    scale = elements / n
    p = codec.Params(block_elements=block, workers=workers)
    gcodes = np.max([codec.encode_exponents(p, g) for g in grads], axis=0).astype(np.int8)
    gcounts = np.sum([codec.encode_counts(p, g).astype(np.int64) for g in grads], axis=0)
    plan = index_plan(c, workers, n, block, gcodes, gcounts)
    index_cpu = sum(cpu for *_, cpu in plan) * scale

    rg = ring(c, workers, elements)
    out = {
        "simulated_elements": n,
        "scale": scale,
        "index_plan": {
            "bitmap_blocks": sum(k == "bitmap" for _, k, *_ in plan),
            "bloom_blocks": sum(k in ("bloom", "split") for _, k, *_ in plan),
            "split_blocks": sum(k == "split" for _, k, *_ in plan),
            "index_bytes": sum(b for _, _, b, _ in plan),
        },
        "ring": rg,
        "methods": {},
    }
    for m in methods:
        if m not in METHODS:
            raise InvalidArgument(f"method {m!r}: one of {', '.join(METHODS)}")
        st = codec.simulate_allreduce(
            grads, m, seed=seed, block_elements=block, cost=c.fields()
        ).stats
        phase_bytes = {ph: b * scale for ph, b in st["bytes_sent"].items() if b}
        if m == "auto":
            via = "union" if st.get("auto_meta_choice") == "union" else None
            steps = protocol.run_steps(m, st["auto_choice"], via)
        else:
            steps = protocol.method(m).steps
        nsteps = sum(1 for s in steps if any(phase_bytes.get(ph) for ph in s))
        nsteps = max(nsteps, 1)  # the exponents' step is always sent
        t, terms, phase_s = _predict(phase_bytes, nsteps, index_cpu, c, workers)
        r = {
            "time_s": t,
            "speedup": (rg["time_s"] / t) if rg["time_s"] else None,
            "bytes_per_worker": round(sum(phase_bytes.values())),
            "bytes": {ph: round(b) for ph, b in phase_bytes.items()},
            "phase_s": phase_s,
            "steps": nsteps,
            "terms": terms,
            "binds": max(terms, key=terms.get),
        }
        if m == "auto":
            r["choice"] = st["auto_choice"]
            r["meta_choice"] = st["auto_meta_choice"]
        if "index" in phase_bytes:
            r["bitmap_blocks"], r["bloom_blocks"] = st["bitmap_blocks"], st["bloom_blocks"]
            r["split_blocks"] = st.get("split_blocks", 0)
        out["methods"][m] = r
    out["best"] = min(out["methods"], key=lambda k: out["methods"][k]["time_s"])
    return out


def advise(
    workers,
    elements,
    density,
    link_mbit,
    workload="shared",
    *,
    rtt_ns=None,
    payload_bytes=1024,
    block=None,
    seed=1,
    sample_elements=DEFAULT_SAMPLE,
    calibration=None,
    coeffs=None,
    methods=METHODS,
) -> dict:
    """The prediction as a dict (the JSON of ``homagg advise --json``);
    ``methods`` the HomAgg methods predicted (default all)."""
    from homagg import codec
    from homagg.bench import workloads

    workload = workloads.ALIASES.get(workload, workload)
    if workload not in ("shared", "zipf", "random"):
        raise InvalidArgument(f"workload {workload!r}: one of shared, zipf, random")
    if not 1 <= workers <= 256:
        raise InvalidArgument(f"workers {workers}: 1..256")
    if elements < 1:
        raise InvalidArgument(f"elements {elements}: at least 1")
    if not 0 <= density <= 1:
        raise InvalidArgument(f"density {density}: in [0, 1]")
    c, source = job_model(link_mbit, rtt_ns, payload_bytes, calibration, coeffs)
    block = int(block or codec.DEFAULT_BLOCK)
    n = _sample_size(int(elements), workers, block, int(sample_elements))
    grads = workloads.generate_all(workload, workers, n, density, seed)
    pred = predict(grads, int(elements), c, block=block, seed=seed, methods=methods)
    out = {
        "workers": workers,
        "elements": int(elements),
        "density": float(density),
        "workload": workload,
        "link_mbit": c.link_mbit,
        "rtt_ns": c.rtt_ns,
        "payload_bytes": c.payload_bytes,
        "block_elements": block,
        "seed": seed,
        "coefficients": {k: getattr(c, k) for k in _cost.COEFFICIENTS},
        "ring_coefficients": c.ring(),
        "coefficients_from": source,
        "assumptions": list(ASSUMPTIONS),
    }
    out.update(pred)
    return out


def _fmt_s(t):
    if t >= 1:
        return f"{t:.3g} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    return f"{t * 1e6:.3g} us"


def _fmt_b(b):
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= div:
            return f"{b / div:.3g} {unit}"
    return f"{b} B"


def render(a: dict) -> str:
    """The prediction as text lines."""
    lines = [
        f"W={a['workers']} workers, N={a['elements']} elements, density {a['density']:g} "
        f"({a['workload']}), {a['link_mbit']} Mbit/s links, round trip "
        f"{a['rtt_ns'] / 1000:g} us, payload {a['payload_bytes']} B, block "
        f"{a['block_elements']}",
        f"coefficients: {a['coefficients_from']}",
    ]
    rc = a.get("ring_coefficients") or {}
    if any(rc.values()):
        lines.append(
            f"ring's CPU (the port's calibration): {rc['ring_byte_ps']} ps a byte, "
            f"{rc['ring_step_ns'] / 1000:g} us a step"
        )
    if a["simulated_elements"] < a["elements"]:
        lines.append(
            f"bytes from the codec on {a['simulated_elements']} elements, scaled x{a['scale']:.4g}"
        )
    lines.append(
        f"{'':8s} {'time':>10s} {'speedup':>8s} {'bytes/worker':>13s} {'steps':>5s}  binds"
    )
    rg = a["ring"]
    lines.append(
        f"{'ring':8s} {_fmt_s(rg['time_s']):>10s} {'1':>8s} "
        f"{_fmt_b(rg['bytes_per_worker']):>13s} {rg['steps']:5d}  {rg['binds']}"
    )
    for m, r in a["methods"].items():
        sp = "-" if r["speedup"] is None else f"{r['speedup']:.2f}"
        extra = f" (chose {r['choice']})" if m == "auto" else ""
        lines.append(
            f"{m:8s} {_fmt_s(r['time_s']):>10s} {sp:>8s} "
            f"{_fmt_b(r['bytes_per_worker']):>13s} {r['steps']:5d}  "
            f"{r['binds'].replace('_', ' ')}{extra}"
        )
    best = a["methods"][a["best"]]
    if best["speedup"] is not None:
        verdict = "faster" if best["speedup"] > 1 else "not faster"
        lines.append(
            f"best: {a['best']}, {best['speedup']:.2f}x ring: HomAgg is predicted "
            f"{verdict} than ring here"
        )
    lines.append("assumes: " + "; ".join(a["assumptions"]))
    return "\n".join(lines)
