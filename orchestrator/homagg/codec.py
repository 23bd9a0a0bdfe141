"""The codec as users see it: parameters, one function per protocol phase,
and ``simulate_allreduce``, the whole protocol in one process.

A tensor of n float32 elements is cut into blocks of
``Params.block_elements``.  Every method starts with the exponent phase
(MAX8 of the block exponent codes); then (docs/PROTOCOL.md "Methods"):

===========  ==============================================================
dense        SUM32 of every block's fixed-point values
blocks       SUM32 of the blocks that are non-zero on some worker
lhc          SUM32 of the non-zero counts, OR of the index (bitmap or
             Bloom filter), SUM32 of the count sketch, peeling, then SUM32
             of the candidates whose peeling stalled (the fallback)
union        lhc's counts and index phases, then SUM32 of every worker's
             value at every global candidate (0 where it has none), and a
             scatter: no sketch, no peeling, no fallback
nc           NC8 codes (natural compression, unbiased, lossy by design)
auto         the exact method with the fewest bytes, chosen by every worker
             alike on exact byte counts: after the lhc meta phase (exponents
             + counts) when that settles it, else after the index phase
===========  ==============================================================

lhc, union and auto read each gradient once (``scan``, the one-pass
encode); their later phases read only the scan's non-zeros.

The exact methods decode bit-identically to the fixed-point reference
(``homagg.reference``).  ``simulate_allreduce`` runs every phase for every
worker, combines the W payloads with the aggregator's own kernels
(``hg_aggregate``) and checks that every worker decodes the same bits.

Example::

    >>> import numpy as np
    >>> from homagg.codec import simulate_allreduce
    >>> g = [np.ones(1000, dtype=np.float32) for _ in range(4)]
    >>> r = simulate_allreduce(g, method="lhc")
    >>> float(r.sum[0]), r.stats["bytes_per_worker"] < r.stats["dense_fp32_bytes"]
    (4.0, True)
"""
import dataclasses
import errno

import numpy as np

from homagg.bindings import codec as _b
from homagg.errors import HomAggError, InvalidArgument, NonFiniteValue, OutOfRange

DEFAULT_BLOCK = _b.DEFAULT_BLOCK
MAX_WORKERS = _b.MAX_WORKERS
EXP_ZERO = _b.EXP_ZERO

METHODS = ("dense", "blocks", "lhc", "union", "nc", "auto")
EXACT_METHODS = ("dense", "blocks", "lhc", "union")
PHASES = ("exponents", "counts", "index", "sketch", "fallback", "values")

_METHOD_BY_CODE = {_b.M_DENSE: "dense", _b.M_BLOCKS: "blocks", _b.M_LHC: "lhc",
                   _b.M_NC: "nc", _b.M_AUTO: "auto", _b.M_UNION: "union"}

OPS = {"sum32": _b.OP_SUM32, "or": _b.OP_OR, "max8": _b.OP_MAX8, "nc8": _b.OP_NC8}


@dataclasses.dataclass(frozen=True)
class Params:
    """What every worker of one allreduce agrees on.

    ``sketch_cells_per_candidate`` 0 means the protocol's default sketch
    sizing; a positive value overrides it (small values force stalls).
    """

    block_elements: int = DEFAULT_BLOCK
    workers: int = 1
    seed: int = 0
    stochastic: bool = False
    nc_levels: int = 0
    sketch_cells_per_candidate: float = 0.0

    def __post_init__(self):
        self.c(0)  # validate now: raises InvalidArgument / OutOfRange

    def c(self, worker=0):
        """The ``struct hg_params *`` of one worker."""
        return _b.params_new(
            block=self.block_elements, workers=self.workers, worker=worker,
            flags=_b.F_STOCHASTIC if self.stochastic else 0, seed=self.seed,
            nc_levels=self.nc_levels,
            sketch_cells_per_candidate=self.sketch_cells_per_candidate)

    def nblocks(self, n):
        return (n + self.block_elements - 1) // self.block_elements


def _p(params, worker):
    if isinstance(params, Params):
        return params.c(worker)
    return params  # already a struct hg_params *


def _op(op):
    if isinstance(op, str):
        try:
            return OPS[op.lower()]
        except KeyError:
            raise InvalidArgument(f"unknown aggregation op {op!r} (one of {', '.join(OPS)})",
                                  -errno.EINVAL) from None
    return op


# ---- phases ----------------------------------------------------------------

def encode_exponents(params, x, worker=0):
    """Exponent phase: this worker's block exponent codes (int8, MAX8)."""
    return _b.exp_encode(_p(params, worker), x)


def encode_counts(params, x, worker=0):
    """Counts phase (lhc, auto): non-zero counts per block ('>i4', SUM32)."""
    return _b.nnz_counts(_p(params, worker), x)


def encode_meta(params, x, worker=0):
    """Exponent and counts phases of lhc / auto in one pass over x:
    (codes int8, counts '>i4')."""
    return _b.exp_nnz_encode(_p(params, worker), x)


def encode_values(params, x, gcodes, kind="dense", worker=0):
    """Values phase of dense / blocks: fixed-point int32 lanes ('>i4', SUM32)."""
    return _b.quantize(_p(params, worker), x, gcodes, _qflags(kind))


def decode_values(params, sums, n, gcodes, kind="dense", worker=0):
    """The float32 result of dense / blocks / nc from the aggregated lanes."""
    return _b.dequantize(_p(params, worker), sums, n, gcodes, _qflags(kind))


def _qflags(kind):
    if kind in ("dense", "nc"):
        return 0
    if kind == "blocks":
        return _b.Q_SKIP_ZERO
    raise InvalidArgument(f"unknown values kind {kind!r} (dense, blocks, nc)", -errno.EINVAL)


def encode_nc(params, x, gcodes, worker=0):
    """NC phase: one NC8 code per element (uint8), aggregated with op nc8."""
    return _b.nc_encode(_p(params, worker), x, gcodes)


def nc_top(params):
    """The NC8 shift (the packets' exponent field) for these parameters."""
    return _b.nc_top(_p(params, 0))


def choose_auto(params, n, gcodes, gcounts):
    """auto's choice from the meta phase: 'dense' or 'blocks' when that is
    certainly the smallest, else 'union' (run the index phase, then
    ``choose_auto_indexed``)."""
    m = _b.auto_choose(_p(params, 0), n, gcodes, gcounts)
    return _METHOD_BY_CODE[m]


def choose_auto_indexed(plan):
    """auto's final choice after the index phase: 'dense', 'blocks' or 'union'."""
    return _METHOD_BY_CODE[_b.auto_choose_indexed(plan._l)]


def scan(params, x, worker=0):
    """The one-pass encode: (scan, codes int8, counts '>i4') of x; the
    scan feeds ``LhcPlan.encode_index / encode_sketch / encode_union``."""
    return _b.scan_encode(_p(params, worker), x)


class LhcPlan:
    """One worker's lhc state, planned from the global codes and counts."""

    def __init__(self, params, n, gcodes, gcounts, worker=0):
        self._l = _b.lhc_create(_p(params, worker), n, gcodes, gcounts)
        self.n = n

    @property
    def info(self):
        """index_bytes, bitmap_blocks, bloom_blocks, candidates,
        sketch_lanes, stalled_blocks, fallback_lanes."""
        return self._l.info()

    def encode_index(self, x):
        """From the tensor x, or from its scan (``scan``)."""
        if isinstance(x, _b.Scan):
            return _b.lhc_index_encode_scan(self._l, x)
        return _b.lhc_index_encode(self._l, x)

    def set_index(self, gindex):
        _b.lhc_set_index(self._l, gindex)

    def encode_sketch(self, x):
        """From the tensor x, or from its scan (``scan``)."""
        if isinstance(x, _b.Scan):
            return _b.lhc_sketch_encode_scan(self._l, x)
        return _b.lhc_sketch_encode(self._l, x)

    def encode_union(self, scan):
        """union values phase: this worker's value at every candidate ('>i4')."""
        return _b.union_encode(self._l, scan)

    def decode_union(self, gvals, out=None):
        if out is None:
            return _b.union_decode(self._l, gvals)
        return _b.union_decode_into(self._l, gvals, out)

    def peel(self, gcells):
        _b.lhc_peel(self._l, gcells)

    def encode_fallback(self, x):
        return _b.lhc_fallback_encode(self._l, x)

    def decode(self, gfallback, out=None):
        if out is None:
            return _b.lhc_decode(self._l, gfallback)
        return _b.lhc_decode_into(self._l, gfallback, out)


def plan_lhc(params, n, gcodes, gcounts, worker=0):
    """lhc planning (after the exponent and counts phases)."""
    return LhcPlan(params, n, gcodes, gcounts, worker)


def encode_index(plan, x):
    """Index phase: this worker's bitmap / Bloom bytes (uint8, OR)."""
    return plan.encode_index(x)


def encode_sketch(plan, x):
    """Sketch phase: this worker's count sketch ('>i4', SUM32)."""
    return plan.encode_sketch(x)


def encode_fallback(plan, x):
    """Fallback phase: quantised values at unresolved candidates ('>i4', SUM32)."""
    return plan.encode_fallback(x)


def decode_lhc(plan, gfallback):
    """The bit-exact lhc result (float32)."""
    return plan.decode(gfallback)


def aggregate(op, acc, inputs, top=0):
    """What the aggregator does: acc = acc (op) input for every input.

    op is 'sum32', 'or', 'max8', 'nc8' (or an HG_OP_* value).  With acc None
    a new accumulator holding the op's identity is made, sized from the
    first input.  Returns acc.
    """
    op = _op(op)
    for inp in inputs:
        if acc is None:
            lanes = inp.nbytes // max(_b.op_in_lane_bytes(op), 1)
            acc = _b.op_identity_new(op, lanes)
        _b.aggregate(op, acc, inp, top)
    if acc is None:
        raise InvalidArgument("aggregate: no inputs and no accumulator")
    return acc


# ---- the whole protocol in one process ---------------------------------------

@dataclasses.dataclass
class AllreduceResult:
    """``sum``: the decoded float32 result; ``stats``: what it cost."""

    sum: np.ndarray
    stats: dict


def _check_grads(grads):
    if isinstance(grads, np.ndarray):
        raise InvalidArgument("grads: expected a list of 1-D arrays (one per worker), "
                              "got a single array")
    grads = list(grads)
    if not 1 <= len(grads) <= MAX_WORKERS:
        raise OutOfRange(f"grads: W = {len(grads)} workers is outside 1..{MAX_WORKERS}",
                         -errno.ERANGE)
    for w, g in enumerate(grads):
        try:
            _b._f32(g, f"grads[{w}]")
        except InvalidArgument as exc:
            raise InvalidArgument(f"worker {w}: {exc}", -errno.EINVAL) from None
    n = grads[0].size
    for w, g in enumerate(grads):
        if g.size != n:
            raise InvalidArgument(
                f"grads: worker {w} has {g.size} elements, worker 0 has {n}", -errno.EINVAL)
    return grads, n


class _Ledger:
    """Payload bytes each worker sends and receives, per phase."""

    def __init__(self, workers):
        self.sent = [dict.fromkeys(PHASES, 0) for _ in range(workers)]
        self.received = [dict.fromkeys(PHASES, 0) for _ in range(workers)]

    def add(self, phase, worker, sent, received):
        self.sent[worker][phase] += int(sent)
        self.received[worker][phase] += int(received)


def _all_reduce_phase(ledger, phase, op, payloads_of, top=0):
    """Every worker encodes (payloads_of(w)), the aggregator combines them
    with hg_aggregate, every worker receives the accumulator."""
    acc = None
    opc = _op(op)
    for w, payload in payloads_of:
        if acc is None:
            acc = _b.op_identity_new(opc, payload.nbytes // _b.op_in_lane_bytes(opc))
        _b.aggregate(opc, acc, payload, top)
        ledger.add(phase, w, payload.nbytes, acc.nbytes)
    return acc


def _with_worker(w, fn):
    """Run fn(), naming worker w in a NonFiniteValue it raises."""
    try:
        return fn()
    except NonFiniteValue as exc:
        if exc.worker is None or exc.worker != w:
            raise NonFiniteValue(f"worker {w}: {exc}", exc.index, w) from None
        raise


def simulate_allreduce(grads, method="lhc", seed=0, **options):
    """Allreduce W workers' gradients in one process with the real codec.

    grads: a list of W equal-length 1-D float32 arrays (C-contiguous).
    method: 'dense', 'blocks', 'lhc', 'union', 'nc' or 'auto'.  options: the other
    ``Params`` fields (block_elements, stochastic, nc_levels,
    sketch_cells_per_candidate).

    Every worker encodes every phase, the W payloads are combined with
    hg_aggregate (the aggregator's kernels), and every worker decodes; all
    decoded results must be bit-identical (HomAggError otherwise).
    Returns an AllreduceResult; ``stats`` holds, per phase, the payload
    bytes each worker sent and received ("bytes_sent", "bytes_received",
    identical for every worker; "bytes_sent_by_worker" lists them all),
    "bytes_per_worker" (sent), "dense_fp32_bytes" (4 n), the lhc counters
    ("union_lanes" for union) and "method" (for auto: the method auto chose,
    also in "auto_choice"; "auto_meta_choice" is its choice after the meta
    phase, 'union' meaning that the index phase decided).
    """
    if method not in METHODS:
        raise InvalidArgument(f"unknown method {method!r} (one of {', '.join(METHODS)})",
                              -errno.EINVAL)
    unknown = set(options) - {f.name for f in dataclasses.fields(Params)} - {"workers", "seed"}
    if unknown:
        raise InvalidArgument(f"unknown option(s): {', '.join(sorted(unknown))}", -errno.EINVAL)
    if "workers" in options or "seed" in options:
        raise InvalidArgument("workers comes from len(grads), seed is an argument")
    grads, n = _check_grads(grads)
    W = len(grads)
    params = Params(workers=W, seed=seed, **options)
    cps = [params.c(w) for w in range(W)]
    nb = params.nblocks(n)
    ledger = _Ledger(W)
    stats = {
        "method": method, "block_elements": params.block_elements, "workers": W,
        "elements": n, "blocks": nb, "dense_fp32_bytes": 4 * n,
        "candidates": 0, "index_bytes": 0, "bitmap_blocks": 0, "bloom_blocks": 0,
        "sketch_lanes": 0, "stalled_blocks": 0, "fallback_blocks": 0, "fallback_lanes": 0,
    }

    chosen = method
    gcounts = None
    scans = None
    if method in ("lhc", "union", "auto"):
        # Meta phase: exponents (MAX8) and counts (SUM32) from the one-pass
        # scan; the later phases read the scans' non-zeros.
        meta = [_with_worker(w, lambda w=w: _b.scan_encode(cps[w], grads[w]))
                for w in range(W)]
        scans = [m[0] for m in meta]
        gcodes = _all_reduce_phase(ledger, "exponents", "max8",
                                   ((w, meta[w][1]) for w in range(W)))
        if method == "auto":
            # auto's counts follow the exponents, one lane per block that
            # is non-zero somewhere (the others are 0 on every worker).
            live = gcodes != EXP_ZERO
            gcounts = np.zeros(nb, dtype=_b.BE32)
            if live.any():
                gcounts[live] = _all_reduce_phase(
                    ledger, "counts", "sum32",
                    ((w, np.ascontiguousarray(meta[w][2][live])) for w in range(W)))
        else:
            gcounts = _all_reduce_phase(ledger, "counts", "sum32",
                                        ((w, meta[w][2]) for w in range(W)))
        del meta
        stats["global_nonzeros"] = int(gcounts.astype(np.int64).sum())
    else:
        # Exponent phase (every method).
        gcodes = _all_reduce_phase(
            ledger, "exponents", "max8",
            ((w, _with_worker(w, lambda w=w: _b.exp_encode(cps[w], grads[w])))
             for w in range(W)))
    stats["zero_blocks"] = int(np.count_nonzero(gcodes == EXP_ZERO))
    plans = None
    if method == "auto":
        chosen = _agreed("auto", [_b.auto_choose(cps[w], n, gcodes, gcounts)
                                  for w in range(W)])
        stats["auto_meta_choice"] = chosen
        if chosen == "union":
            # Not settled by the meta phase: the index phase, then exact counts.
            plans = _index_phase(cps, scans, n, gcodes, gcounts, ledger, stats)
            chosen = _agreed("auto", [_b.auto_choose_indexed(pl) for pl in plans])
        stats["auto_choice"] = chosen
    stats["method"] = chosen

    if chosen in ("dense", "blocks"):
        qflags = _qflags(chosen)
        sums = _all_reduce_phase(
            ledger, "values", "sum32",
            ((w, _b.quantize(cps[w], grads[w], gcodes, qflags)) for w in range(W)))
        if sums is None or sums.size == 0:
            sums = np.zeros(_b.quantized_lanes(cps[0], n, gcodes, qflags), dtype=_b.BE32)
        results = (_b.dequantize(cps[w], sums, n, gcodes, qflags) for w in range(W))
    elif chosen == "nc":
        top = _b.nc_top(cps[0])
        sums = _all_reduce_phase(
            ledger, "values", "nc8",
            ((w, _b.nc_encode(cps[w], grads[w], gcodes)) for w in range(W)), top=top)
        results = (_b.dequantize(cps[w], sums, n, gcodes, 0) for w in range(W))
    else:
        if plans is None:
            plans = _index_phase(cps, scans, n, gcodes, gcounts, ledger, stats)
        if chosen == "union":
            results = _simulate_union(plans, scans, ledger, stats)
        else:
            results = _simulate_lhc(plans, scans, grads, ledger, stats)
    del scans

    y0 = None
    for w, y in enumerate(results):
        if y0 is None:
            y0 = y
        elif not np.array_equal(y.view(np.uint32), y0.view(np.uint32)):
            bad = int(np.flatnonzero(y.view(np.uint32) != y0.view(np.uint32))[0])
            raise HomAggError(
                f"{chosen}: worker {w} decoded {y[bad]!r} at element {bad}, worker 0 "
                f"{y0[bad]!r}: workers disagree")

    stats["bytes_sent_by_worker"] = ledger.sent
    stats["bytes_received_by_worker"] = ledger.received
    stats["bytes_sent"] = dict(ledger.sent[0])
    stats["bytes_received"] = dict(ledger.received[0])
    stats["bytes_per_worker"] = sum(ledger.sent[0].values())
    stats["bytes_received_per_worker"] = sum(ledger.received[0].values())
    stats["ratio_vs_dense_fp32"] = (stats["bytes_per_worker"] / (4 * n)) if n else 0.0
    return AllreduceResult(sum=y0, stats=stats)


def _agreed(what, codes):
    """The method every worker chose (they decide alike), or HomAggError."""
    chosen = _METHOD_BY_CODE[codes[0]]
    for w, m in enumerate(codes):
        if _METHOD_BY_CODE[m] != chosen:
            raise HomAggError(f"{what}: worker {w} chose {_METHOD_BY_CODE[m]}, worker 0 {chosen}")
    return chosen


def _index_phase(cps, scans, n, gcodes, gcounts, ledger, stats):
    """lhc's planning and index phase (lhc, union, auto); returns the plans."""
    W = len(cps)
    plans = [_b.lhc_create(cps[w], n, gcodes, gcounts) for w in range(W)]
    info = plans[0].info()
    for w in range(1, W):
        if plans[w].info()["index_bytes"] != info["index_bytes"]:
            raise HomAggError(f"index: worker {w} planned another index than worker 0")
    gindex = _all_reduce_phase(
        ledger, "index", "or",
        ((w, _b.lhc_index_encode_scan(plans[w], scans[w])) for w in range(W)))
    if gindex is None or gindex.size == 0:
        gindex = np.zeros(info["index_bytes"], dtype=np.uint8)
    for pl in plans:
        _b.lhc_set_index(pl, gindex)
    info = plans[0].info()
    for k in ("index_bytes", "bitmap_blocks", "bloom_blocks", "candidates"):
        stats[k] = info[k]
    return plans


def _simulate_union(plans, scans, ledger, stats):
    """union's values phase after the index phase; yields each worker's result."""
    W = len(plans)
    lanes = _b.union_lanes(plans[0])
    gvals = _all_reduce_phase(
        ledger, "values", "sum32",
        ((w, _b.union_encode(plans[w], scans[w])) for w in range(W)))
    if gvals is None or gvals.size == 0:
        gvals = np.zeros(lanes, dtype=_b.BE32)
    stats["union_lanes"] = lanes
    for w in range(W):
        yield _b.union_decode(plans[w], gvals)
        plans[w] = None


def _simulate_lhc(plans, scans, grads, ledger, stats):
    """The lhc phases after the index phase; yields each worker's result."""
    W = len(plans)
    info = plans[0].info()
    gcells = _all_reduce_phase(
        ledger, "sketch", "sum32",
        ((w, _b.lhc_sketch_encode_scan(plans[w], scans[w])) for w in range(W)))
    if gcells is None or gcells.size == 0:
        gcells = np.zeros(info["sketch_lanes"], dtype=_b.BE32)
    for pl in plans:
        _b.lhc_peel(pl, gcells)

    info = plans[0].info()
    for w in range(1, W):
        if plans[w].info() != info:
            raise HomAggError(f"lhc: worker {w}'s peeling differs from worker 0's")
    gfall = _all_reduce_phase(
        ledger, "fallback", "sum32",
        ((w, _b.lhc_fallback_encode(plans[w], grads[w])) for w in range(W)))
    if gfall is None or gfall.size == 0:
        gfall = np.zeros(info["fallback_lanes"], dtype=_b.BE32)

    for k in ("index_bytes", "bitmap_blocks", "bloom_blocks", "candidates", "sketch_lanes",
              "stalled_blocks", "fallback_lanes"):
        stats[k] = info[k]
    stats["fallback_blocks"] = info["stalled_blocks"]
    for w in range(W):
        yield _b.lhc_decode(plans[w], gfall)
        plans[w] = None  # free each plan once decoded
