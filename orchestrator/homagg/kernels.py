"""The aggregation ALU (homagg/kernels.h) from Python.

``aggregate(op, acc, inp, top=0, isa="best")`` combines one payload into an
accumulator in place, lane by lane, exactly as the aggregator does: both are
uint8 arrays of big-endian wire lanes.  Used by tests, the codec's reference
paths and benchmarks.
"""
import numpy as np

from homagg import protocol
from homagg._native import ffi, lib
from homagg.errors import InvalidArgument, check

OPS = {name: op.code for name, op in protocol.OPS.items()}
ISAS = {"portable": lib.HG_ISA_PORTABLE, "avx2": lib.HG_ISA_AVX2,
        "avx512": lib.HG_ISA_AVX512, "best": lib.HG_ISA_BEST}


def _op(op):
    return int(protocol.op_code(op))


def _isa(isa):
    if isinstance(isa, str):
        try:
            return ISAS[isa.lower()]
        except KeyError:
            raise InvalidArgument(f"unknown ISA {isa!r}") from None
    return int(isa)


def isa_supported(isa):
    """Whether this CPU supports ``isa`` ("portable", "avx2", "avx512", "best")."""
    return bool(lib.hg_isa_supported(_isa(isa)))


def isa_best():
    """Name of the ISA hg_aggregate() uses on this CPU."""
    return ffi.string(lib.hg_isa_name(lib.hg_isa_best())).decode()


def in_lane_bytes(op):
    return int(lib.hg_op_in_lane_bytes(_op(op)))


def acc_lane_bytes(op):
    return int(lib.hg_op_acc_lane_bytes(_op(op)))


def identity(op, lanes):
    """A new accumulator of ``lanes`` lanes holding the op's identity."""
    o = _op(op)
    lb = acc_lane_bytes(o)
    if lb == 0:
        raise InvalidArgument(f"unknown op {op!r}")
    acc = np.empty(lanes * lb, dtype=np.uint8)
    check(lib.hg_op_identity(o, ffi.from_buffer("uint8_t[]", acc), lanes), "hg_op_identity")
    return acc


def aggregate(op, acc, inp, top=0, isa="best"):
    """acc = acc (op) inp, in place.  ``acc``/``inp``: contiguous uint8 arrays
    of wire lanes; the lane count is taken from ``inp``."""
    o = _op(op)
    ib, ab = in_lane_bytes(o), acc_lane_bytes(o)
    if ib == 0:
        raise InvalidArgument(f"unknown op {op!r}")
    for name, a in (("acc", acc), ("inp", inp)):
        if not isinstance(a, np.ndarray) or a.dtype != np.uint8 or not a.flags.c_contiguous:
            raise InvalidArgument(f"{name} must be a C-contiguous uint8 array")
    if not acc.flags.writeable:
        raise InvalidArgument("acc must be writeable")
    if inp.size % ib:
        raise InvalidArgument(f"inp length {inp.size} is not a multiple of {ib}")
    lanes = inp.size // ib
    if acc.size != lanes * ab:
        raise InvalidArgument(f"acc has {acc.size} bytes, expected {lanes * ab}")
    check(lib.hg_aggregate_isa(_isa(isa), o, ffi.from_buffer("uint8_t[]", acc, require_writable=True),
                               ffi.from_buffer("uint8_t[]", inp), lanes, int(top)),
          "hg_aggregate")
    return acc
