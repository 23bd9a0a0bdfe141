"""Bindings of homagg/protocol.h: the op, phase and method tables as lists
of plain dicts, one per row, in table order.  ``homagg.protocol`` builds the
typed view on them."""

from homagg._native import ffi, lib

MF_EXACT = lib.HG_MF_EXACT
MF_SKIP_ZERO = lib.HG_MF_SKIP_ZERO
MF_CANDIDATE = lib.HG_MF_CANDIDATE
MF_CHOOSES = lib.HG_MF_CHOOSES
MF_GROUPS = lib.HG_MF_GROUPS


def _s(p):
    return ffi.string(p).decode()


def op_table():
    return [
        {
            "code": o.code,
            "name": _s(o.name),
            "in_lane": o.in_lane,
            "acc_lane": o.acc_lane,
            "identity": o.identity,
            "exp_max": o.exp_max,
            "doc": _s(o.doc),
        }
        for o in (lib.hg_op_at(i) for i in range(lib.hg_op_count()))
    ]


def phase_table():
    return [
        {"index": p.index, "name": _s(p.name), "op": p.op, "doc": _s(p.doc)}
        for p in (lib.hg_phase_at(i) for i in range(lib.hg_phase_count()))
    ]


def method_table():
    """Rows with "steps": one phase bit mask per step."""
    return [
        {
            "code": m.code,
            "name": _s(m.name),
            "flags": m.flags,
            "steps": [m.steps[k] for k in range(m.nsteps)],
            "doc": _s(m.doc),
        }
        for m in (lib.hg_method_at(i) for i in range(lib.hg_method_count()))
    ]
