"""The protocol's vocabulary: aggregation ops, phases and allreduce methods.

Everything here is read at import from the C library's tables
(dataplane_c/include/homagg/protocol.h, through cffi), so C stays the one
place that defines them; no other module keeps its own list.

- ``OPS``: op name -> :class:`Op` (wire code, lane widths, identity byte).
- ``PHASES``: phase names in index order (the index of the per-phase byte
  counters of a worker); ``PHASE``: name -> :class:`Phase` (with its op).
- ``METHODS``: method names in wire-code order; ``METHOD``: name ->
  :class:`Method` (its steps, each a tuple of phase names, and its flags).
- ``EXACT_METHODS``: methods whose result is bit-exact (auto included);
  ``AUTO_CANDIDATES``: the methods auto chooses from.

Example::

    >>> from homagg import protocol
    >>> protocol.METHOD["lhc"].steps[0]
    ('exponents', 'counts')
    >>> protocol.PHASE["index"].op
    'or'
"""
import dataclasses
import errno

from homagg._native import ffi, lib
from homagg.errors import InvalidArgument


@dataclasses.dataclass(frozen=True)
class Op:
    name: str
    code: int
    in_lane_bytes: int
    acc_lane_bytes: int
    identity: int
    exp_max: int
    doc: str


@dataclasses.dataclass(frozen=True)
class Phase:
    name: str
    index: int
    op: str
    doc: str


@dataclasses.dataclass(frozen=True)
class Method:
    name: str
    code: int
    exact: bool
    skip_zero: bool
    auto_candidate: bool
    chooses: bool
    steps: tuple
    doc: str

    @property
    def phases(self):
        """Every phase of the method, in the order they are sent."""
        return tuple(ph for step in self.steps for ph in step)


def _s(p):
    return ffi.string(p).decode()


def _ops():
    out = {}
    for i in range(lib.hg_op_count()):
        o = lib.hg_op_at(i)
        out[_s(o.name)] = Op(_s(o.name), o.code, o.in_lane, o.acc_lane, o.identity,
                             o.exp_max, _s(o.doc))
    return out


OPS = _ops()
OP_BY_CODE = {o.code: o for o in OPS.values()}


def _phases():
    out = {}
    for i in range(lib.hg_phase_count()):
        p = lib.hg_phase_at(i)
        out[_s(p.name)] = Phase(_s(p.name), p.index, OP_BY_CODE[p.op].name, _s(p.doc))
    return out


PHASE = _phases()
PHASES = tuple(sorted(PHASE, key=lambda n: PHASE[n].index))


def _methods():
    out = {}
    for i in range(lib.hg_method_count()):
        m = lib.hg_method_at(i)
        steps = tuple(tuple(ph for ph in PHASES if m.steps[k] >> PHASE[ph].index & 1)
                      for k in range(m.nsteps))
        out[_s(m.name)] = Method(
            _s(m.name), m.code, bool(m.flags & lib.HG_MF_EXACT),
            bool(m.flags & lib.HG_MF_SKIP_ZERO), bool(m.flags & lib.HG_MF_CANDIDATE),
            bool(m.flags & lib.HG_MF_CHOOSES), steps, _s(m.doc))
    return out


METHOD = _methods()
METHODS = tuple(sorted(METHOD, key=lambda n: METHOD[n].code))
METHOD_BY_CODE = {m.code: m for m in METHOD.values()}
EXACT_METHODS = tuple(m for m in METHODS if METHOD[m].exact)
AUTO_CANDIDATES = tuple(m for m in METHODS if METHOD[m].auto_candidate)


def method(name):
    """The Method called name; InvalidArgument naming the choices otherwise."""
    try:
        return METHOD[name]
    except (KeyError, TypeError):
        raise InvalidArgument(f"unknown method {name!r} (one of {', '.join(METHODS)})",
                              -errno.EINVAL) from None


def method_name(code, default="none"):
    """The name of a method's wire code (default for 0 or an unknown one)."""
    m = METHOD_BY_CODE.get(code)
    return m.name if m else default


def op_code(op):
    """The wire code of an op given by name ('sum32', ...) or code."""
    if isinstance(op, str):
        try:
            return OPS[op.lower()].code
        except KeyError:
            raise InvalidArgument(f"unknown aggregation op {op!r} (one of {', '.join(OPS)})",
                                  -errno.EINVAL) from None
    return op


def run_steps(name, chosen=None):
    """The steps an allreduce of method name sends: for a method that
    chooses (auto), its first step then the chosen method's later steps."""
    m = method(name)
    if not m.chooses:
        return m.steps
    if chosen is None:
        raise InvalidArgument(f"{name}: the steps after the first depend on the method it chose")
    return m.steps[:1] + method(chosen).steps[1:]
