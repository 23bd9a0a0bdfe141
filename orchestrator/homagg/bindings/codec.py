"""Bindings of homagg/codec.h.

One function per C function.  Every buffer is a 1-D C-contiguous numpy
array of the exact dtype the C side expects, passed without a copy:

- gradients and results: ``float32`` (native byte order);
- exponent codes (MAX8 lanes): ``int8``;
- int32 wire lanes (counts, quantised values, sketch cells, fallback,
  NC8 results): ``'>i4'`` (big-endian, exactly as on the wire), or raw
  ``uint8`` bytes whose length is a multiple of 4;
- index bytes (OR lanes) and NC8 codes: ``uint8``.

Functions returning a new array have an ``*_into(..., out)`` variant, or
an optional ``out`` argument (the lhc encoders), that writes a
caller-owned buffer instead.  Return codes become exceptions of
``homagg.errors``; a NaN or an infinity becomes ``NonFiniteValue`` naming
the first bad index and the worker (``p.worker``).
"""

import errno
import math

import numpy as np

from homagg._native import ffi, lib
from homagg.bindings._args import (
    BE32,
    F32,
    I8,
    U8,
    _be32,
    _buf,
    _f32,
    _fill,
    _i8,
    _length,
    _u8,
    _wbuf,
)
from homagg.errors import HomAggError, InvalidArgument, NonFiniteValue, OutOfRange, check


MAX_WORKERS = lib.HG_MAX_WORKERS
MIN_BLOCK = lib.HG_MIN_BLOCK
MAX_BLOCK = lib.HG_MAX_BLOCK
DEFAULT_BLOCK = lib.HG_DEFAULT_BLOCK
EXP_ZERO = lib.HG_EXP_ZERO
F_STOCHASTIC = lib.HG_F_STOCHASTIC
Q_SKIP_ZERO = lib.HG_Q_SKIP_ZERO

_U64_MAX = 2**64 - 1


def _first_bad(x):
    bad = np.flatnonzero(~np.isfinite(x))
    return int(bad[0]) if bad.size else None


def _raise_nonfinite(x, index, worker, context):
    if index is None:
        index = _first_bad(x)
    value = x[index] if index is not None and 0 <= index < x.size else "?"
    who = f"worker {worker}: " if worker is not None else ""
    raise NonFiniteValue(
        f"{context}: {who}element {index} is {value} (gradients must be finite)", index, worker
    )


def _check_x(rc, p, x, context, index=None):
    """check(rc), with -EDOM turned into NonFiniteValue about x."""
    if rc == -errno.EDOM:
        _raise_nonfinite(x, index, int(p.worker) if p is not None else None, context)
    return check(rc, context)


# ---- ISA path ----------------------------------------------------------------

CODEC_ISAS = ("portable", "avx2", "avx512")


def _codec_isa_value(rc):
    """The path name of hg_codec_isa's result, or InvalidArgument /
    InvalidArgument naming HOMAGG_CODEC_ISA and the fix."""
    import os

    if rc >= 0:
        return CODEC_ISAS[rc]
    value = os.environ.get("HOMAGG_CODEC_ISA", "")
    if rc == -errno.EINVAL:
        raise InvalidArgument(
            f"HOMAGG_CODEC_ISA={value!r} names no codec path: set it to one of "
            f"{', '.join(CODEC_ISAS)}, or unset it for the best this CPU has",
            rc,
        )
    raise InvalidArgument(
        f"HOMAGG_CODEC_ISA={value!r}: this CPU lacks that path "
        f"({'AVX2 and BMI2' if value == 'avx2' else 'AVX-512 F, DQ, BW'}): force a "
        f"lower one or unset it",
        rc,
    )


def codec_isa():
    """hg_codec_isa: the codec's ISA path ("portable", "avx2", "avx512"), read
    from HOMAGG_CODEC_ISA at the first codec call of the process;
    InvalidArgument when that names no path or one the CPU lacks."""
    return _codec_isa_value(int(lib.hg_codec_isa()))


def codec_isa_reload():
    """hg_codec_isa_reload: read HOMAGG_CODEC_ISA again (tests, after
    changing it); the path, or InvalidArgument as codec_isa()."""
    return _codec_isa_value(int(lib.hg_codec_isa_reload()))


# ---- parameters ------------------------------------------------------------


def params_new(
    block=None,
    workers=1,
    worker=0,
    flags=0,
    seed=0,
    nc_levels=0,
    sketch_cells_per_candidate=0.0,
    cost=None,
    divisor=0.0,
):
    """A ``struct hg_params *`` (checked in Python, then by hg_params_check);
    ``cost``: the fields of its ``struct hg_cost`` (a dict), None = none;
    ``divisor``: the decoders' result is the sum / divisor in float32 (0: the
    sum)."""
    block = DEFAULT_BLOCK if block is None else block
    for name, v in (
        ("block", block),
        ("workers", workers),
        ("worker", worker),
        ("flags", flags),
        ("nc_levels", nc_levels),
    ):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise InvalidArgument(f"{name}: expected an integer, got {v!r}")
    if not 1 <= workers <= MAX_WORKERS:
        raise OutOfRange(f"workers: W = {workers} is outside 1..{MAX_WORKERS}", -errno.ERANGE)
    if not 0 <= worker < workers:
        raise OutOfRange(f"worker: id {worker} is outside 0..{workers - 1}", -errno.ERANGE)
    if not (MIN_BLOCK <= block <= MAX_BLOCK and block % 64 == 0):
        raise InvalidArgument(
            f"block: {block} elements is not a multiple of 64 in {MIN_BLOCK}..{MAX_BLOCK}",
            -errno.EINVAL,
        )
    if not 0 <= seed <= _U64_MAX:
        raise OutOfRange(f"seed: {seed} is not a 64-bit unsigned integer", -errno.ERANGE)
    if not 0 <= nc_levels < 2**32:
        raise OutOfRange(f"nc_levels: {nc_levels} is out of range", -errno.ERANGE)
    if flags & ~F_STOCHASTIC:
        raise InvalidArgument(f"flags: unknown bits {flags:#x}", -errno.EINVAL)
    cells = float(sketch_cells_per_candidate)
    if not math.isfinite(cells) or cells < 0:
        raise InvalidArgument(f"sketch_cells_per_candidate: {cells} must be finite and >= 0")
    p = _fill(
        ffi.new("struct hg_params *"),
        dict(
            block=block,
            workers=workers,
            worker=worker,
            flags=flags,
            seed=seed,
            nc_levels=nc_levels,
            sketch_cells_per_candidate=cells,
            cost=dict(cost or {}),
            divisor=float(divisor),
        ),
    )
    codec_isa()  # a bad HOMAGG_CODEC_ISA refuses here, by name
    params_check(p)
    return p


def params_check(p):
    """hg_params_check: 0, or InvalidArgument / OutOfRange."""
    return check(lib.hg_params_check(p), "hg_params_check")


def nblocks(p, n):
    return int(lib.hg_nblocks(p, n))


def log2_workers(p):
    return check(lib.hg_log2_workers(p), "hg_log2_workers")


def scale_shift(p, code):
    if not -128 <= code <= 127:
        raise OutOfRange(f"code: {code} is not an int8", -errno.ERANGE)
    return int(lib.hg_scale_shift(p, code))


# ---- exponents, quantisation, counts ---------------------------------------


def exp_encode_into(p, x, codes):
    """hg_exp_encode: this worker's block exponent codes into codes (int8)."""
    _f32(x)
    _i8(codes, "codes", writable=True)
    _length(codes, nblocks(p, x.size), "codes", "blocks")
    bad = ffi.new("size_t *", _U64_MAX)
    rc = lib.hg_exp_encode(p, _buf("float[]", x), x.size, _wbuf("int8_t[]", codes), bad)
    index = None if bad[0] == _U64_MAX else int(bad[0])
    _check_x(rc, p, x, "hg_exp_encode", index)
    return codes


def exp_encode(p, x):
    _f32(x)
    return exp_encode_into(p, x, np.empty(nblocks(p, x.size), dtype=I8))


def quantized_lanes(p, n, gcodes, qflags=0):
    _i8(gcodes, "gcodes")
    _length(gcodes, nblocks(p, n), "gcodes", "blocks")
    return int(lib.hg_quantized_lanes(p, n, _buf("int8_t[]", gcodes), qflags))


def quantize_into(p, x, gcodes, qflags, out):
    """hg_quantize: the fixed-point lanes of x ('>i4'), into out."""
    _f32(x)
    _be32(out, "out", writable=True)
    _length(out, quantized_lanes(p, x.size, gcodes, qflags), "out", "lanes")
    rc = lib.hg_quantize(
        p, _buf("float[]", x), x.size, _buf("int8_t[]", gcodes), qflags, _wbuf("uint8_t[]", out)
    )
    _check_x(rc, p, x, "hg_quantize")
    return out


def quantize(p, x, gcodes, qflags=0):
    _f32(x)
    out = np.empty(quantized_lanes(p, x.size, gcodes, qflags), dtype=BE32)
    return quantize_into(p, x, gcodes, qflags, out)


def dequantize_into(p, sums, n, gcodes, qflags, y):
    """hg_dequantize: y (float32, n) from the aggregated lanes."""
    _be32(sums, "sums")
    _f32(y, "y", writable=True)
    _length(y, n, "y")
    _length(sums, quantized_lanes(p, n, gcodes, qflags), "sums", "lanes")
    rc = lib.hg_dequantize(
        p, _buf("uint8_t[]", sums), n, _buf("int8_t[]", gcodes), qflags, _wbuf("float[]", y)
    )
    check(rc, "hg_dequantize")
    return y


def dequantize(p, sums, n, gcodes, qflags=0):
    return dequantize_into(p, sums, n, gcodes, qflags, np.empty(n, dtype=F32))


def nnz_counts_into(p, x, counts):
    """hg_nnz_counts: per-block non-zero counts ('>i4', one lane per block)."""
    _f32(x)
    _be32(counts, "counts", writable=True)
    _length(counts, nblocks(p, x.size), "counts", "lanes")
    rc = lib.hg_nnz_counts(p, _buf("float[]", x), x.size, _wbuf("uint8_t[]", counts))
    _check_x(rc, p, x, "hg_nnz_counts")
    return counts


def nnz_counts(p, x):
    _f32(x)
    return nnz_counts_into(p, x, np.empty(nblocks(p, x.size), dtype=BE32))


def _meta_call(name, fn, p, x, codes, counts):
    """A call writing codes (int8) and counts ('>i4') of x, with its
    first non-finite index turned into NonFiniteValue."""
    _f32(x)
    nb = nblocks(p, x.size)
    _i8(codes, "codes", writable=True)
    _be32(counts, "counts", writable=True)
    _length(codes, nb, "codes", "blocks")
    _length(counts, nb, "counts", "lanes")
    bad = ffi.new("size_t *", _U64_MAX)
    rc = fn(_buf("float[]", x), x.size, _wbuf("int8_t[]", codes), _wbuf("uint8_t[]", counts), bad)
    index = None if bad[0] == _U64_MAX else int(bad[0])
    _check_x(rc, p, x, name, index)
    return codes, counts


def exp_nnz_encode_into(p, x, codes, counts):
    """hg_exp_nnz_encode: exponent codes and non-zero counts in one pass."""
    return _meta_call(
        "hg_exp_nnz_encode", lambda *a: lib.hg_exp_nnz_encode(p, *a), p, x, codes, counts
    )


def exp_nnz_encode(p, x):
    _f32(x)
    nb = nblocks(p, x.size)
    return exp_nnz_encode_into(p, x, np.empty(nb, dtype=I8), np.empty(nb, dtype=BE32))


# ---- the one-pass scan -------------------------------------------------------


class Scan:
    """A scan of one gradient (struct hg_scan): codes, counts, the local
    bitmap and the non-zeros, read by the *_scan functions.  Freed by
    hg_scan_destroy when collected; keeps the parameters it was made with."""

    __slots__ = ("ptr", "params", "n", "__weakref__")

    def __init__(self, ptr):
        self.ptr = ptr
        self.params = None
        self.n = None

    def nonzeros(self):
        return int(lib.hg_scan_nonzeros(self.ptr))


def scan_new():
    ptr = lib.hg_scan_create()
    if ptr == ffi.NULL:
        raise HomAggError("hg_scan_create: out of memory", -errno.ENOMEM)
    return Scan(ffi.gc(ptr, lib.hg_scan_destroy))


def scan_encode_into(scan, p, x, codes, counts):
    """hg_scan_encode: one pass over x; codes (int8) and counts ('>i4')
    as hg_exp_nnz_encode writes them."""
    scan.n = None
    _meta_call(
        "hg_scan_encode", lambda *a: lib.hg_scan_encode(scan.ptr, p, *a), p, x, codes, counts
    )
    scan.params = p
    scan.n = x.size
    return codes, counts


def scan_encode(p, x, scan=None):
    """(scan, codes, counts) of x in one pass."""
    _f32(x)
    nb = nblocks(p, x.size)
    scan = scan_new() if scan is None else scan
    codes, counts = scan_encode_into(scan, p, x, np.empty(nb, dtype=I8), np.empty(nb, dtype=BE32))
    return scan, codes, counts


def _lhc_scan(lhc, scan, what):
    if not isinstance(scan, Scan) or scan.n is None:
        raise InvalidArgument(f"{what}: expected a successful scan (scan_encode)", -errno.EINVAL)
    if scan.n != lhc.n or int(scan.params.block) != int(lhc.params.block):
        raise InvalidArgument(
            f"{what}: the scan is of {scan.n} elements in blocks of "
            f"{int(scan.params.block)}, the plan of {lhc.n} in blocks of "
            f"{int(lhc.params.block)}",
            -errno.EINVAL,
        )


# ---- lhc -------------------------------------------------------------------


class Lhc:
    """An lhc plan (struct hg_lhc), freed by hg_lhc_destroy when collected."""

    __slots__ = ("ptr", "params", "n", "nblocks", "state", "__weakref__")

    PLANNED, INDEXED, PEELED = 0, 1, 2
    _STEP = {INDEXED: "lhc_set_index", PEELED: "lhc_peel"}

    def __init__(self, ptr, params, n, nb):
        self.ptr = ptr
        self.params = params  # kept alive as long as the plan
        self.n = n
        self.nblocks = nb
        self.state = Lhc.PLANNED

    def need(self, state, what):
        """Raise unless the plan went through the phase a call needs."""
        if self.state < state:
            raise InvalidArgument(
                f"{what}: call {Lhc._STEP[state]} before it (phases run "
                "in order: index, sketch, peel, fallback, decode)",
                -errno.EINVAL,
            )

    def info(self):
        return lhc_get_info(self)


def _global_meta(p, n, gcodes, gcounts):
    """The global codes (int8) and counts ('>i4') of n elements, checked,
    as the buffers the C calls take."""
    nb = nblocks(p, n)
    _i8(gcodes, "gcodes")
    _be32(gcounts, "gcounts")
    _length(gcodes, nb, "gcodes", "blocks")
    _length(gcounts, nb, "gcounts", "lanes")
    return _buf("int8_t[]", gcodes), _buf("uint8_t[]", gcounts)


def lhc_create(p, n, gcodes, gcounts):
    """hg_lhc_create from the global codes and global counts."""
    nb = nblocks(p, n)
    ptr = lib.hg_lhc_create(p, n, *_global_meta(p, n, gcodes, gcounts))
    if ptr == ffi.NULL:
        raise InvalidArgument(
            "hg_lhc_create failed: bad global codes / counts (a count above the "
            "block length or a non-zero count in an all-zero block) or out of memory",
            -errno.EINVAL,
        )
    return Lhc(ffi.gc(ptr, lib.hg_lhc_destroy), p, n, nb)


_INFO_FIELDS = (
    "index_bytes",
    "bitmap_blocks",
    "bloom_blocks",
    "split_blocks",
    "candidates",
    "sketch_lanes",
    "stalled_blocks",
    "fallback_lanes",
)


def lhc_get_info(lhc):
    info = ffi.new("struct hg_lhc_info *")
    check(lib.hg_lhc_get_info(lhc.ptr, info), "hg_lhc_get_info")
    return {f: int(getattr(info, f)) for f in _INFO_FIELDS}


def _lhc_x(lhc, x):
    _f32(x)
    if x.size != lhc.n:
        raise InvalidArgument(f"x: the plan is for {lhc.n} elements, got {x.size}")


def _lhc_buf(a, name, size, dtype, writable=False):
    """a checked as size index bytes (dtype U8) or int32 lanes (BE32)."""
    if dtype == U8:
        _u8(a, name, writable)
        _length(a, size, name, "bytes")
    else:
        _be32(a, name, writable)
        _length(a, size, name, "lanes")
    return a


def _lhc_out(out, name, size, dtype):
    """out, or a new array when None, checked as an output (_lhc_buf)."""
    out = np.empty(size, dtype=dtype) if out is None else out
    return _lhc_buf(out, name, size, dtype, writable=True)


def _lhc_advance(fn, lhc, gin, name, field, dtype, before, after):
    """fn(lhc, gin) with the aggregated info[field] bytes or lanes gin,
    taking the plan from state before to after (left at before when the
    call fails)."""
    _lhc_buf(gin, name, lhc_get_info(lhc)[field], dtype)
    lhc.state = before
    rc = check(getattr(lib, fn)(lhc.ptr, _buf("uint8_t[]", gin)), fn)
    lhc.state = after
    return rc


def _lhc_encode(fn, lhc, x, out, name, field, dtype, state=None):
    """fn(lhc, x, out), an encoder of x into info[field] bytes or lanes:
    arguments checked, -EDOM as NonFiniteValue about x."""
    what = fn[3:]
    _lhc_x(lhc, x)
    if state is not None:
        lhc.need(state, what)
    out = _lhc_out(out, name, lhc_get_info(lhc)[field], dtype)
    rc = getattr(lib, fn)(lhc.ptr, _buf("float[]", x), _wbuf("uint8_t[]", out))
    _check_x(rc, lhc.params, x, fn)
    return out


def _lhc_encode_scan(fn, lhc, scan, out, name, size, dtype, state=None):
    """fn(lhc, scan, out), an encoder reading a scan of x into size bytes
    or lanes (size: an info field, or a function of the plan)."""
    what = fn[3:]
    _lhc_scan(lhc, scan, what)
    if state is not None:
        lhc.need(state, what)
    size = size(lhc) if callable(size) else lhc_get_info(lhc)[size]
    out = _lhc_out(out, name, size, dtype)
    check(getattr(lib, fn)(lhc.ptr, scan.ptr, _wbuf("uint8_t[]", out)), fn)
    return out


def lhc_index_encode(lhc, x, index=None):
    """hg_lhc_index_encode: this worker's index bytes (uint8)."""
    return _lhc_encode("hg_lhc_index_encode", lhc, x, index, "index", "index_bytes", U8)


def lhc_index_encode_scan(lhc, scan, index=None):
    """hg_lhc_index_encode_scan: the index bytes from a scan of x."""
    return _lhc_encode_scan(
        "hg_lhc_index_encode_scan", lhc, scan, index, "index", "index_bytes", U8
    )


def lhc_set_index(lhc, gindex):
    """hg_lhc_set_index: the OR of every worker's index."""
    return _lhc_advance(
        "hg_lhc_set_index", lhc, gindex, "gindex", "index_bytes", U8, Lhc.PLANNED, Lhc.INDEXED
    )


def lhc_sketch_encode(lhc, x, cells=None):
    """hg_lhc_sketch_encode: this worker's count sketch ('>i4' cells)."""
    return _lhc_encode(
        "hg_lhc_sketch_encode", lhc, x, cells, "cells", "sketch_lanes", BE32, Lhc.INDEXED
    )


def lhc_sketch_encode_scan(lhc, scan, cells=None):
    """hg_lhc_sketch_encode_scan: the count sketch from a scan of x."""
    return _lhc_encode_scan(
        "hg_lhc_sketch_encode_scan", lhc, scan, cells, "cells", "sketch_lanes", BE32, Lhc.INDEXED
    )


def lhc_peel(lhc, gcells):
    """hg_lhc_peel: peel the summed sketch (stalls are in the info)."""
    lhc.need(Lhc.INDEXED, "lhc_peel")
    return _lhc_advance(
        "hg_lhc_peel", lhc, gcells, "gcells", "sketch_lanes", BE32, Lhc.INDEXED, Lhc.PEELED
    )


def lhc_fallback_encode(lhc, x, out=None):
    """hg_lhc_fallback_encode: quantised values at the unresolved candidates."""
    return _lhc_encode(
        "hg_lhc_fallback_encode", lhc, x, out, "out", "fallback_lanes", BE32, Lhc.PEELED
    )


def lhc_decode_into(lhc, gfallback, y):
    """hg_lhc_decode: the bit-exact result, n float32."""
    lhc.need(Lhc.PEELED, "lhc_decode")
    _be32(gfallback, "gfallback")
    _length(gfallback, lhc_get_info(lhc)["fallback_lanes"], "gfallback", "lanes")
    _f32(y, "y", writable=True)
    _length(y, lhc.n, "y")
    rc = lib.hg_lhc_decode(lhc.ptr, _buf("uint8_t[]", gfallback), _wbuf("float[]", y))
    check(rc, "hg_lhc_decode")
    return y


def lhc_decode(lhc, gfallback):
    return lhc_decode_into(lhc, gfallback, np.empty(lhc.n, dtype=F32))


# ---- union -------------------------------------------------------------------


def union_lanes(lhc):
    """hg_union_lanes: int32 lanes of the union values phase (the candidates)."""
    lhc.need(Lhc.INDEXED, "union_lanes")
    return int(lib.hg_union_lanes(lhc.ptr))


def union_encode(lhc, scan, out=None):
    """hg_union_encode: this worker's quantised value at every global
    candidate ('>i4'), 0 where it has none, from a scan of x."""
    return _lhc_encode_scan(
        "hg_union_encode", lhc, scan, out, "out", union_lanes, BE32, Lhc.INDEXED
    )


def union_decode_into(lhc, gvals, y):
    """hg_union_decode: the bit-exact result from the summed candidate values."""
    lhc.need(Lhc.INDEXED, "union_decode")
    _be32(gvals, "gvals")
    _length(gvals, union_lanes(lhc), "gvals", "lanes")
    _f32(y, "y", writable=True)
    _length(y, lhc.n, "y")
    check(
        lib.hg_union_decode(lhc.ptr, _buf("uint8_t[]", gvals), _wbuf("float[]", y)),
        "hg_union_decode",
    )
    return y


def union_decode(lhc, gvals):
    return union_decode_into(lhc, gvals, np.empty(lhc.n, dtype=F32))


# ---- auto, nc --------------------------------------------------------------


def auto_choose(p, n, gcodes, gcounts):
    """hg_auto_choose: M_DENSE or M_BLOCKS (clear from the meta phase), or
    M_UNION (run the index phase, then auto_choose_indexed)."""
    rc = lib.hg_auto_choose(p, n, *_global_meta(p, n, gcodes, gcounts))
    return check(rc, "hg_auto_choose")


def auto_choose_indexed(lhc):
    """hg_auto_choose_indexed: M_DENSE, M_BLOCKS or M_UNION after the index phase."""
    lhc.need(Lhc.INDEXED, "auto_choose_indexed")
    return check(lib.hg_auto_choose_indexed(lhc.ptr), "hg_auto_choose_indexed")


def method_name(m):
    s = lib.hg_method_name(m)
    if s == ffi.NULL:
        raise InvalidArgument(f"unknown method {m}", -errno.EINVAL)
    return ffi.string(s).decode()


def nc_top(p):
    return int(lib.hg_nc_top(p))


def nc_encode_into(p, x, gcodes, codes):
    """hg_nc_encode: one NC8 code per element (uint8)."""
    _f32(x)
    _i8(gcodes, "gcodes")
    _length(gcodes, nblocks(p, x.size), "gcodes", "blocks")
    _u8(codes, "codes", writable=True)
    _length(codes, x.size, "codes")
    rc = lib.hg_nc_encode(
        p, _buf("float[]", x), x.size, _buf("int8_t[]", gcodes), _wbuf("uint8_t[]", codes)
    )
    _check_x(rc, p, x, "hg_nc_encode")
    return codes


def nc_encode(p, x, gcodes):
    _f32(x)
    return nc_encode_into(p, x, gcodes, np.empty(x.size, dtype=U8))


__all__ = [
    n
    for n in dir()
    if not n.startswith("_") and n not in ("errno", "math", "np", "ffi", "lib", "HomAggError")
]
