"""Bindings of homagg/kernels.h (the aggregation ALU) and the op accessors
of homagg/protocol.h.

Accumulators and inputs are 1-D C-contiguous numpy arrays of wire lanes:
``'>i4'`` (or raw ``uint8``) for 4-byte lanes, ``int8`` or ``uint8`` for
byte lanes.  Ops are wire codes (``homagg.protocol.OPS[name].code``).
"""

import errno

import numpy as np

from homagg._native import ffi, lib
from homagg.bindings._args import BE32, I8, U8, _array, _buf, _wbuf
from homagg.errors import InvalidArgument, check

OP_SUM32 = lib.HG_OP_SUM32
OP_OR = lib.HG_OP_OR
OP_MAX8 = lib.HG_OP_MAX8
OP_NC8 = lib.HG_OP_NC8

ISA_PORTABLE = lib.HG_ISA_PORTABLE
ISA_AVX2 = lib.HG_ISA_AVX2
ISA_AVX512 = lib.HG_ISA_AVX512
ISA_BEST = lib.HG_ISA_BEST


def isa_supported(isa):
    return bool(lib.hg_isa_supported(isa))


def isa_best():
    return int(lib.hg_isa_best())


def isa_name(isa):
    s = lib.hg_isa_name(isa)
    return "?" if s == ffi.NULL else ffi.string(s).decode()


def op_in_lane_bytes(op):
    return int(lib.hg_op_in_lane_bytes(op))


def op_acc_lane_bytes(op):
    return int(lib.hg_op_acc_lane_bytes(op))


def op_valid(op):
    return isinstance(op, (int, np.integer)) and bool(lib.hg_op_valid(op))


def _lane_dtypes(op, which):
    """Accepted dtypes of op's accumulator or input buffer, from the lane
    width of the op table (homagg/protocol.h): big-endian int32 (or raw
    bytes) for 4-byte lanes, int8 or uint8 for byte lanes.  The first one
    is what a new buffer gets: int8 when the identity is -128 (MAX8)."""
    width = op_acc_lane_bytes(op) if which == "acc" else op_in_lane_bytes(op)
    if width == 4:
        return (BE32, U8)
    signed = which == "acc" and lib.hg_op_get(op).identity == 0x80
    return (I8, U8) if signed else (U8, I8)


def _op(op):
    if not op_valid(op):
        raise InvalidArgument(f"unknown aggregation op {op!r}", -errno.EINVAL)
    return int(op)


def _op_lanes(op, a, name, which):
    """Lanes of a buffer of op (acc or in), checking dtype and size."""
    dtypes = _lane_dtypes(op, which)
    _array(a, name, dtypes, writable=(which == "acc"))
    lane = op_acc_lane_bytes(op) if which == "acc" else op_in_lane_bytes(op)
    if a.nbytes % lane:
        raise InvalidArgument(
            f"{name}: {a.nbytes} bytes is not a whole number of {lane}-byte lanes"
        )
    return a.nbytes // lane


def op_identity(op, acc):
    """hg_op_identity: fill acc with the op's identity."""
    op = _op(op)
    lanes = _op_lanes(op, acc, "acc", "acc")
    check(lib.hg_op_identity(op, _wbuf("uint8_t[]", acc), lanes), "hg_op_identity")
    return acc


def op_identity_new(op, lanes):
    """A new accumulator of lanes lanes holding op's identity."""
    op = _op(op)
    dtype = _lane_dtypes(op, "acc")[0]
    return op_identity(op, np.empty(lanes, dtype=dtype))


def _aggregate_args(op, acc, inp):
    op = _op(op)
    lanes = _op_lanes(op, inp, "in", "in")
    acc_lanes = _op_lanes(op, acc, "acc", "acc")
    if acc_lanes != lanes:
        raise InvalidArgument(f"acc has {acc_lanes} lanes, in has {lanes}")
    if np.shares_memory(acc, inp) and acc.ctypes.data != inp.ctypes.data:
        raise InvalidArgument("acc and in overlap partially")
    return op, lanes


def aggregate(op, acc, inp, top=0):
    """hg_aggregate: acc = acc (op) inp, lane by lane, in place."""
    op, lanes = _aggregate_args(op, acc, inp)
    rc = lib.hg_aggregate(op, _wbuf("uint8_t[]", acc), _buf("uint8_t[]", inp), lanes, int(top))
    check(rc, f"hg_aggregate({op})")
    return acc


def aggregate_isa(isa, op, acc, inp, top=0):
    """hg_aggregate_isa: the same with a forced ISA (ResourceError if missing)."""
    op, lanes = _aggregate_args(op, acc, inp)
    rc = lib.hg_aggregate_isa(
        isa, op, _wbuf("uint8_t[]", acc), _buf("uint8_t[]", inp), lanes, int(top)
    )
    check(rc, f"hg_aggregate_isa({isa_name(isa)}, {op})")
    return acc
