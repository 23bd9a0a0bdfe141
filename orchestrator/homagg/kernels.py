"""The aggregation ALU (homagg/kernels.h) from Python.

``aggregate(op, acc, inp, top=0, isa="best")`` combines one payload into an
accumulator in place, lane by lane, exactly as the aggregator does: both are
uint8 arrays of big-endian wire lanes.  Ops are named as in
``homagg.protocol.OPS`` ("sum32", ...) or given by wire code; ISAs by name.
Used by tests, the codec's reference paths and benchmarks.
"""

import numpy as np

from homagg import protocol
from homagg.bindings import kernels as _k
from homagg.errors import InvalidArgument

OPS = {name: op.code for name, op in protocol.OPS.items()}
ISAS = {
    "portable": _k.ISA_PORTABLE,
    "avx2": _k.ISA_AVX2,
    "avx512": _k.ISA_AVX512,
    "best": _k.ISA_BEST,
}


def _op(op):
    return int(protocol.op_code(op))


def _isa(isa):
    if isinstance(isa, str):
        try:
            return ISAS[isa.lower()]
        except KeyError:
            raise InvalidArgument(f"unknown ISA {isa!r} (one of {', '.join(ISAS)})") from None
    return int(isa)


def isa_supported(isa):
    """Whether this CPU supports ``isa`` ("portable", "avx2", "avx512", "best")."""
    return _k.isa_supported(_isa(isa))


def isa_best():
    """Name of the ISA hg_aggregate() uses on this CPU."""
    return _k.isa_name(_k.isa_best())


def in_lane_bytes(op):
    return _k.op_in_lane_bytes(_op(op))


def acc_lane_bytes(op):
    return _k.op_acc_lane_bytes(_op(op))


def identity(op, lanes):
    """A new accumulator of ``lanes`` lanes holding the op's identity (uint8)."""
    o = _op(op)
    acc = np.empty(lanes * max(_k.op_acc_lane_bytes(o), 1), dtype=np.uint8)
    return _k.op_identity(o, acc)


def aggregate(op, acc, inp, top=0, isa="best"):
    """acc = acc (op) inp, in place.  ``acc``/``inp``: contiguous uint8 arrays
    of wire lanes; the lane count is taken from ``inp``."""
    for name, a in (("acc", acc), ("inp", inp)):
        if not isinstance(a, np.ndarray) or a.dtype != np.uint8:
            raise InvalidArgument(f"{name} must be a C-contiguous uint8 array")
    return _k.aggregate_isa(_isa(isa), _op(op), acc, inp, top)
