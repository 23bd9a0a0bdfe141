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
             alike on exact byte counts: after the exponents and the counts
             of the non-zero blocks when that settles it, else after
             union's index step
===========  ==============================================================

lhc, union and auto read each gradient once (``scan``, the one-pass
encode); their later phases read only the scan's non-zeros.

The methods, their phases and steps come from the C tables
(``homagg.protocol``).  The exact methods decode bit-identically to the
fixed-point reference (``homagg.reference``).  ``simulate_allreduce`` walks
the method's steps, runs every phase for every worker, combines the W
payloads with the aggregator's own kernels (``hg_aggregate``) and checks that
every worker decodes the same bits.

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

from homagg import protocol
from homagg.bindings import codec as _b
from homagg.bindings import kernels as _k
from homagg import cost as _cost
from homagg.errors import HomAggError, InvalidArgument, NonFiniteValue, OutOfRange

DEFAULT_BLOCK = _b.DEFAULT_BLOCK
MAX_WORKERS = _b.MAX_WORKERS
EXP_ZERO = _b.EXP_ZERO


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
    divisor: float = 0.0  # the decoders' result / divisor in float32 (0: the sum)
    cost: object = None  # homagg.cost.Cost (or its dict) of the job; None: bytes rules

    def __post_init__(self):
        self.c(0)  # validate now: raises InvalidArgument / OutOfRange

    def c(self, worker=0):
        """The ``struct hg_params *`` of one worker."""
        return _b.params_new(
            block=self.block_elements,
            workers=self.workers,
            worker=worker,
            flags=_b.F_STOCHASTIC if self.stochastic else 0,
            seed=self.seed,
            nc_levels=self.nc_levels,
            sketch_cells_per_candidate=self.sketch_cells_per_candidate,
            cost=_cost.as_cost(self.cost).fields(),
            divisor=self.divisor,
        )

    def nblocks(self, n):
        return (n + self.block_elements - 1) // self.block_elements


def _p(params, worker):
    if isinstance(params, Params):
        return params.c(worker)
    return params  # already a struct hg_params *


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
    """auto's choice from the exponents and counts: 'dense' or 'blocks' when
    that is certainly the smallest, else 'union' (run the index step, then
    ``choose_auto_indexed``)."""
    m = _b.auto_choose(_p(params, 0), n, gcodes, gcounts)
    return protocol.METHOD_BY_CODE[m].name


def choose_auto_indexed(plan):
    """auto's final choice after the index step: 'dense', 'blocks' or 'union'."""
    return protocol.METHOD_BY_CODE[_b.auto_choose_indexed(plan._l)].name


def scan(params, x, worker=0):
    """The one-pass encode: (scan, codes int8, counts '>i4') of x; the scan
    feeds ``LhcPlan.encode_index / encode_sketch / encode_union``."""
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
        """union phase: this worker's value at every candidate ('>i4')."""
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
    op = protocol.op_code(op)
    for inp in inputs:
        if acc is None:
            lanes = inp.nbytes // max(_k.op_in_lane_bytes(op), 1)
            acc = _k.op_identity_new(op, lanes)
        _k.aggregate(op, acc, inp, top)
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
        raise InvalidArgument(
            "grads: expected a list of 1-D arrays (one per worker), got a single array"
        )
    grads = list(grads)
    if not 1 <= len(grads) <= MAX_WORKERS:
        raise OutOfRange(
            f"grads: W = {len(grads)} workers is outside 1..{MAX_WORKERS}", -errno.ERANGE
        )
    for w, g in enumerate(grads):
        try:
            _b._f32(g, f"grads[{w}]")
        except InvalidArgument as exc:
            raise InvalidArgument(f"worker {w}: {exc}", -errno.EINVAL) from None
    n = grads[0].size
    for w, g in enumerate(grads):
        if g.size != n:
            raise InvalidArgument(
                f"grads: worker {w} has {g.size} elements, worker 0 has {n}", -errno.EINVAL
            )
    return grads, n


class _Ledger:
    """Payload bytes each worker sends and receives, per phase."""

    def __init__(self, workers):
        self.sent = [dict.fromkeys(protocol.PHASES, 0) for _ in range(workers)]
        self.received = [dict.fromkeys(protocol.PHASES, 0) for _ in range(workers)]

    def add(self, phase, worker, sent, received):
        self.sent[worker][phase] += int(sent)
        self.received[worker][phase] += int(received)


def _with_worker(w, fn):
    """Run fn(), naming worker w in a NonFiniteValue it raises."""
    try:
        return fn()
    except NonFiniteValue as exc:
        if exc.worker is None or exc.worker != w:
            raise NonFiniteValue(f"worker {w}: {exc}", exc.index, w) from None
        raise


class _Run:
    """The state of one simulated allreduce, shared by the phases below."""

    def __init__(self, params, grads, method):
        self.grads = grads
        self.W = len(grads)
        self.n = grads[0].size
        self.cps = [params.c(w) for w in range(self.W)]
        self.method = protocol.method(method)
        self.ledger = _Ledger(self.W)
        self.gcodes = self.gcounts = None
        self.qflags = 0
        self.top = 0
        self.plans = None
        self.scans = None
        self.sent = set()  # phases of the completed steps
        self.results = None
        self.stats = {}

    def all_reduce(self, phase):
        """Every worker encodes phase, the aggregator combines the W payloads
        with hg_aggregate and the phase's op, every worker receives the
        accumulator.  Returns it."""
        op = protocol.OPS[protocol.PHASE[phase].op]
        top = self.top if op.exp_max else 0
        op = op.code
        encode = _PHASES[phase][1]
        acc = None
        for w in range(self.W):
            payload = _with_worker(w, lambda w=w: encode(self, w))
            if acc is None:
                acc = _k.op_identity_new(op, payload.nbytes // _k.op_in_lane_bytes(op))
            _k.aggregate(op, acc, payload, top)
            self.ledger.add(phase, w, payload.nbytes, acc.nbytes)
        return acc


# Each phase: (plan, encode, decode).  plan(run) prepares what every worker
# needs before encoding; encode(run, w) is worker w's payload; decode(run,
# acc) takes the aggregated lanes (and sets run.results on the last step).


def _plan_none(r):
    pass


def _plan_values(r):
    r.qflags = _b.Q_SKIP_ZERO if r.method.skip_zero else 0


def _plan_codes(r):
    r.qflags = 0
    r.top = _b.nc_top(r.cps[0])


def _plan_index(r):
    r.plans = [_b.lhc_create(r.cps[w], r.n, r.gcodes, r.gcounts) for w in range(r.W)]
    want = r.plans[0].info()["index_bytes"]
    for w in range(1, r.W):
        if r.plans[w].info()["index_bytes"] != want:
            raise HomAggError(f"lhc: worker {w} planned another index than worker 0")


def _scan_all(r):
    """The one-pass encode of every worker (methods with a counts phase)."""
    if r.scans is None:
        meta = [
            _with_worker(w, lambda w=w: _b.scan_encode(r.cps[w], r.grads[w])) for w in range(r.W)
        ]
        r.scans = [m[0] for m in meta]
        r.lcodes = [m[1] for m in meta]
        r.lcounts = [m[2] for m in meta]


def _plan_exponents(r):
    if "counts" in r.method.phases:
        _scan_all(r)


def _encode_exponents(r, w):
    if r.scans is not None:
        return r.lcodes[w]
    return _b.exp_encode(r.cps[w], r.grads[w])


def _counts_compact(r):
    """A counts phase after the exponents' step (auto) sends one lane per
    block non-zero somewhere."""
    return "exponents" in r.sent


def _encode_counts(r, w):
    if _counts_compact(r):
        return np.ascontiguousarray(r.lcounts[w][r.gcodes != EXP_ZERO])
    return r.lcounts[w]


def _decode_exponents(r, acc):
    r.gcodes = acc
    r.stats["zero_blocks"] = int(np.count_nonzero(acc == EXP_ZERO))


def _decode_counts(r, acc):
    if _counts_compact(r):
        full = np.zeros(r.gcodes.size, dtype=_b.BE32)
        full[r.gcodes != EXP_ZERO] = acc
        acc = full
    r.gcounts = acc
    r.stats["global_nonzeros"] = int(acc.astype(np.int64).sum())


def _decode_values(r, acc):
    r.results = (_b.dequantize(r.cps[w], acc, r.n, r.gcodes, r.qflags) for w in range(r.W))


def _decode_index(r, acc):
    for pl in r.plans:
        _b.lhc_set_index(pl, acc)
    info = r.plans[0].info()
    for k in ("index_bytes", "bitmap_blocks", "bloom_blocks", "split_blocks", "candidates"):
        r.stats[k] = info[k]


def _decode_union(r, acc):
    r.stats["union_lanes"] = _b.union_lanes(r.plans[0])

    def each():
        for w in range(r.W):
            yield _b.union_decode(r.plans[w], acc)
            r.plans[w] = None  # free each plan once decoded

    r.results = each()


def _decode_sketch(r, acc):
    for pl in r.plans:
        _b.lhc_peel(pl, acc)
    info = r.plans[0].info()
    for w in range(1, r.W):
        if r.plans[w].info() != info:
            raise HomAggError(f"lhc: worker {w}'s peeling differs from worker 0's")
    for k in (
        "index_bytes",
        "bitmap_blocks",
        "bloom_blocks",
        "split_blocks",
        "candidates",
        "sketch_lanes",
        "stalled_blocks",
        "fallback_lanes",
    ):
        r.stats[k] = info[k]
    r.stats["fallback_blocks"] = info["stalled_blocks"]


def _decode_fallback(r, acc):
    def each():
        for w in range(r.W):
            yield _b.lhc_decode(r.plans[w], acc)
            r.plans[w] = None  # free each plan once decoded

    r.results = each()


_PHASES = {
    "exponents": (_plan_exponents, _encode_exponents, _decode_exponents),
    "counts": (_scan_all, _encode_counts, _decode_counts),
    "values": (
        _plan_values,
        lambda r, w: _b.quantize(r.cps[w], r.grads[w], r.gcodes, r.qflags),
        _decode_values,
    ),
    "codes": (
        _plan_codes,
        lambda r, w: _b.nc_encode(r.cps[w], r.grads[w], r.gcodes),
        _decode_values,
    ),
    "index": (
        _plan_index,
        lambda r, w: _b.lhc_index_encode_scan(r.plans[w], r.scans[w]),
        _decode_index,
    ),
    "sketch": (
        _plan_none,
        lambda r, w: _b.lhc_sketch_encode_scan(r.plans[w], r.scans[w]),
        _decode_sketch,
    ),
    "fallback": (
        _plan_none,
        lambda r, w: _b.lhc_fallback_encode(r.plans[w], r.grads[w]),
        _decode_fallback,
    ),
    "union": (_plan_none, lambda r, w: _b.union_encode(r.plans[w], r.scans[w]), _decode_union),
}


def _run_step(r, step):
    for phase in step:
        plan, _, decode = _PHASES[phase]
        plan(r)
        decode(r, r.all_reduce(phase))
    r.sent.update(step)


def _agreed(codes):
    """The method every worker chose (they decide alike), or HomAggError."""
    chosen = protocol.METHOD_BY_CODE[codes[0]]
    for w, code in enumerate(codes):
        other = protocol.METHOD_BY_CODE[code]
        if other != chosen:
            raise HomAggError(f"auto: worker {w} chose {other.name}, worker 0 {chosen.name}")
    return chosen


def _choose(r):
    """auto's choice after its own steps (exponents, counts)."""
    return _agreed([_b.auto_choose(r.cps[w], r.n, r.gcodes, r.gcounts) for w in range(r.W)])


def _choose_indexed(r):
    """auto's second choice, after the index step."""
    return _agreed([_b.auto_choose_indexed(pl) for pl in r.plans])


def _unsent(r, method):
    """The steps of method with a phase not sent yet."""
    return [st for st in method.steps if set(st) - r.sent]


def simulate_allreduce(grads, method="lhc", seed=0, **options):
    """Allreduce W workers' gradients in one process with the real codec.

    grads: a list of W equal-length 1-D float32 arrays (C-contiguous).
    method: one of ``homagg.protocol.METHODS``.  options: the other
    ``Params`` fields (block_elements, stochastic, nc_levels,
    sketch_cells_per_candidate, divisor).

    Every worker encodes every phase of the method's steps, the W payloads
    are combined with hg_aggregate (the aggregator's kernels), and every
    worker decodes; all decoded results must be bit-identical (HomAggError
    otherwise).  Returns an AllreduceResult; ``stats`` holds, per phase
    (``homagg.protocol.PHASES``), the payload bytes each worker sent and
    received ("bytes_sent", "bytes_received", identical for every worker;
    "bytes_sent_by_worker" lists them all), "bytes_per_worker" (sent),
    "dense_fp32_bytes" (4 n), the lhc counters ("union_lanes" for union)
    and "method" (for auto: the method auto chose, also in "auto_choice";
    "auto_meta_choice" is its choice after the counts, 'union' meaning that
    the index step decided).
    """
    protocol.method(method)
    unknown = set(options) - {f.name for f in dataclasses.fields(Params)} - {"workers", "seed"}
    if unknown:
        raise InvalidArgument(f"unknown option(s): {', '.join(sorted(unknown))}", -errno.EINVAL)
    if "workers" in options or "seed" in options:
        raise InvalidArgument("workers comes from len(grads), seed is an argument")
    grads, n = _check_grads(grads)
    W = len(grads)
    params = Params(workers=W, seed=seed, **options)
    nb = params.nblocks(n)
    r = _Run(params, grads, method)
    r.stats.update(
        {
            "method": method,
            "block_elements": params.block_elements,
            "workers": W,
            "elements": n,
            "blocks": nb,
            "dense_fp32_bytes": 4 * n,
            "candidates": 0,
            "index_bytes": 0,
            "bitmap_blocks": 0,
            "bloom_blocks": 0,
            "split_blocks": 0,
            "sketch_lanes": 0,
            "stalled_blocks": 0,
            "fallback_blocks": 0,
            "fallback_lanes": 0,
        }
    )
    for step in r.method.steps:
        _run_step(r, step)
    if r.method.chooses:
        # auto (docs/PROTOCOL.md "auto's rule"): the meta phase settles
        # it, or union's index step runs and the exact counts do
        r.method = _choose(r)
        r.stats["auto_meta_choice"] = r.method.name
        steps = _unsent(r, r.method)
        if steps and "index" in steps[0]:
            _run_step(r, steps[0])
            r.method = _choose_indexed(r)
            steps = _unsent(r, r.method)
        r.stats["auto_choice"] = r.method.name
        for step in steps:
            _run_step(r, step)
    r.stats["method"] = chosen = r.method.name

    y0 = None
    for w, y in enumerate(r.results):
        if y0 is None:
            y0 = y
        elif not np.array_equal(y.view(np.uint32), y0.view(np.uint32)):
            bad = int(np.flatnonzero(y.view(np.uint32) != y0.view(np.uint32))[0])
            raise HomAggError(
                f"{chosen}: worker {w} decoded {y[bad]!r} at element {bad}, worker 0 "
                f"{y0[bad]!r}: workers disagree"
            )

    stats, ledger = r.stats, r.ledger
    stats["bytes_sent_by_worker"] = ledger.sent
    stats["bytes_received_by_worker"] = ledger.received
    stats["bytes_sent"] = dict(ledger.sent[0])
    stats["bytes_received"] = dict(ledger.received[0])
    stats["bytes_per_worker"] = sum(ledger.sent[0].values())
    stats["bytes_received_per_worker"] = sum(ledger.received[0].values())
    stats["ratio_vs_dense_fp32"] = (stats["bytes_per_worker"] / (4 * n)) if n else 0.0
    return AllreduceResult(sum=y0, stats=stats)
