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
  ``AUTO_CANDIDATES``: the methods auto chooses from; ``PIPELINED_METHODS``:
  those whose block groups go through the steps independently.
- ``PIPELINE_GROUPS``: the default of the job option ``pipeline_groups``
  (docs/PROTOCOL.md "Pipelined block groups"); :func:`check_pipeline_groups`.
- :func:`default_slots`: a job's slots when the user sets none, the same in
  ``homagg.worker.Worker``, ``homagg.sim.Cluster``, the job file and
  ``homagg run`` (docs/PROTOCOL.md Part 2, "Frames in flight").

Example::

    >>> from homagg import protocol
    >>> protocol.METHOD["lhc"].steps[0]
    ('exponents', 'counts')
    >>> protocol.PHASE["index"].op
    'or'
"""

import dataclasses
import errno

from homagg.bindings import protocol as _b
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
    pipelined: bool = False  # block groups go through its steps independently

    @property
    def phases(self):
        """Every phase of the method, in the order they are sent."""
        return tuple(ph for step in self.steps for ph in step)


OPS = {
    r["name"]: Op(
        r["name"], r["code"], r["in_lane"], r["acc_lane"], r["identity"], r["exp_max"], r["doc"]
    )
    for r in _b.op_table()
}
OP_BY_CODE = {o.code: o for o in OPS.values()}

PHASE = {
    r["name"]: Phase(r["name"], r["index"], OP_BY_CODE[r["op"]].name, r["doc"])
    for r in _b.phase_table()
}
PHASES = tuple(sorted(PHASE, key=lambda n: PHASE[n].index))


def _method(r):
    steps = tuple(tuple(ph for ph in PHASES if mask >> PHASE[ph].index & 1) for mask in r["steps"])
    f = r["flags"]
    return Method(
        r["name"],
        r["code"],
        bool(f & _b.MF_EXACT),
        bool(f & _b.MF_SKIP_ZERO),
        bool(f & _b.MF_CANDIDATE),
        bool(f & _b.MF_CHOOSES),
        steps,
        r["doc"],
        bool(f & _b.MF_GROUPS),
    )


METHOD = {r["name"]: _method(r) for r in _b.method_table()}
METHODS = tuple(sorted(METHOD, key=lambda n: METHOD[n].code))
METHOD_BY_CODE = {m.code: m for m in METHOD.values()}
EXACT_METHODS = tuple(m for m in METHODS if METHOD[m].exact)
AUTO_CANDIDATES = tuple(m for m in METHODS if METHOD[m].auto_candidate)
PIPELINED_METHODS = tuple(m for m in METHODS if METHOD[m].pipelined)

# Block groups of a job's pipelined methods: 0 = automatic (8 groups, each
# at least four windows of dense value chunks), 1 = not pipelined, N = N
# groups.
PIPELINE_GROUPS = 1


# The receive ring, in frames, that a job's default slots fit: the NIC
# model's aggregators (HG_SIM_AGG_RX_RING) and the largest ring the
# testbed's commands provision for a default job.
DEFAULT_RING_FRAMES = 4096
# The most slots a default job gets (a window of 64 chunks fills a
# 100 Gbit/s link's round trip at 1 KB payloads).
MAX_DEFAULT_SLOTS = 64
# The most a default job gets when its workers bound their pipe
# (docs/PROTOCOL.md Part 3, "The pipe"): the bound, not S, keeps the
# window out of the queues, so S only says how many chunks may wait for a
# repair while first transmissions go on; within half the ring, so that a
# job leaves room for others.
MAX_PIPE_DEFAULT_SLOTS = 256
# The least slots of a flat NIC-model job whose workers bound their pipe,
# which then cap the pipe at half the ring (docs/PROTOCOL.md Part 3,
# "Slots beyond the ring's share, in the NIC model"): at W = 256 and 1 %
# loss nearly every chunk waits for a repair, and 16 slots were held by
# them.
MIN_PIPE_SLOTS = 32


def tree_senders(workers, leaves):
    """The most senders any aggregator of a job hears: its ``workers`` at
    one aggregator, and in a tree of ``leaves`` leaves a leaf's
    ceil(W / L) workers or the root's L leaves, whichever is more."""
    return max(-(-int(workers) // int(leaves)), int(leaves)) if leaves else int(workers)


def default_slots(workers, ring=DEFAULT_RING_FRAMES, pipe=False):
    """The slots S of a job of ``workers`` workers when the user sets none:
    the most, up to 64, with W x S <= ``ring`` (each worker's window towards
    an aggregator fits its receive ring: 64 up to W = 64, 16 at W = 256).
    A function of W alone, so every worker, the simulator and the
    aggregators' registration compute the same S; a tree's aggregators
    each hear fewer than W senders, so the same S fits them too.

    ``pipe``: the job's workers bound their pipe (the NIC model's
    default): up to 256 while W x S stays within half the ring, and never
    fewer than without it (256 at W = 4, 128 at W = 16, 64 from W = 32 to
    64, 16 at W = 256)."""
    workers = int(workers)
    if workers < 1:
        raise InvalidArgument(f"field 'workers': must be at least 1, got {workers}")
    slots = max(1, min(MAX_DEFAULT_SLOTS, int(ring) // workers))
    if pipe:
        slots = max(slots, min(MAX_PIPE_DEFAULT_SLOTS, int(ring) // 2 // workers))
    return slots


def pipe_slots(workers, ring=DEFAULT_RING_FRAMES):
    """(S, pipe_max) of a flat NIC-model job of ``workers`` workers that
    bound their pipe, when the user sets no slots (docs/PROTOCOL.md Part 3,
    "Slots beyond the ring's share, in the NIC model"): default_slots(W,
    pipe=True) and no cap (0) while that is at least MIN_PIPE_SLOTS; else
    MIN_PIPE_SLOTS slots with the pipe capped at max(4, floor(ring / 2W)),
    so that the W x cap frames the ring holds stay within half of it."""
    slots = default_slots(workers, ring, pipe=True)
    if slots >= MIN_PIPE_SLOTS:
        return slots, 0
    return MIN_PIPE_SLOTS, max(4, int(ring) // 2 // int(workers))


def tree_pipe_slots(workers, leaves, ring=DEFAULT_RING_FRAMES):
    """(S, pipe_max) of a NIC-model tree job of ``workers`` workers over
    ``leaves`` leaves whose workers bound their pipe, when the user sets no
    slots (docs/PROTOCOL.md Part 3, "A tree's full window, in the NIC
    model"): MAX_PIPE_DEFAULT_SLOTS slots with the workers' pipe capped at
    max(4, floor(ring / 2 ceil(W / L))) when default_slots of the most
    senders an aggregator hears is below that and those senders x
    MAX_PIPE_DEFAULT_SLOTS fit the ring; else that default and no cap (0)."""
    senders = tree_senders(workers, leaves)
    slots = default_slots(senders, ring, pipe=True)
    if slots >= MAX_PIPE_DEFAULT_SLOTS or senders * MAX_PIPE_DEFAULT_SLOTS > int(ring):
        return slots, 0
    per_leaf = -(-int(workers) // int(leaves))
    return MAX_PIPE_DEFAULT_SLOTS, max(4, int(ring) // 2 // per_leaf)


def resolve_slots(slots, workers, pipe=False):
    """``slots`` when the user set it (a positive number), else
    :func:`default_slots` of ``workers`` (and ``pipe``)."""
    if slots is None or int(slots) == 0:
        return default_slots(workers, pipe=pipe)
    if int(slots) < 0:
        raise InvalidArgument(
            f"field 'slots': must be positive (or unset for the default), got {slots}"
        )
    return int(slots)


def check_pipeline_groups(value):
    """pipeline_groups as an int, or InvalidArgument naming the field."""
    try:
        v = int(value)
    except (TypeError, ValueError):
        v = -1
    if isinstance(value, bool) or v != value or not 0 <= v <= 2**32 - 1:
        raise InvalidArgument(
            f"pipeline_groups must be an integer >= 0 (0 automatic, 1 not "
            f"pipelined, N block groups), got {value!r}",
            errno.EINVAL,
        )
    return v


def method(name):
    """The Method called name; InvalidArgument naming the choices otherwise."""
    try:
        return METHOD[name]
    except (KeyError, TypeError):
        raise InvalidArgument(
            f"unknown method {name!r} (one of {', '.join(METHODS)})", -errno.EINVAL
        ) from None


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
            raise InvalidArgument(
                f"unknown aggregation op {op!r} (one of {', '.join(OPS)})", -errno.EINVAL
            ) from None
    return op


def run_steps(name, chosen=None, via=None):
    """The steps an allreduce of method name sends.  For a method that
    chooses (auto): its own steps, then, when its first choice ``via`` has an
    index step (union), that method's steps up to the index step, then the
    steps of the finally ``chosen`` method; a step whose phases were all sent
    already is skipped (docs/PROTOCOL.md "auto's rule")."""
    m = method(name)
    if not m.chooses:
        return m.steps
    if chosen is None:
        raise InvalidArgument(f"{name}: the steps after its own depend on the method it chose")
    steps = list(m.steps)
    sent = {ph for st in steps for ph in st}

    def unsent(meth, stop_at_index):
        for st in method(meth).steps:
            if set(st) - sent:
                steps.append(st)
                sent.update(st)
                if stop_at_index and "index" in st:
                    return

    if via is not None:
        unsent(via, True)
    unsent(chosen, False)
    return tuple(steps)
