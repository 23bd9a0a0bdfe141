"""Bindings of homagg/client.h: the worker client's stats structs as dicts
(per-phase byte counters keyed by the phase names of homagg.protocol)."""
from homagg._native import ffi
from homagg.protocol import PHASES


def client_stats_dict(st):
    """A ``struct hg_client_stats`` as a dict: every field of the C struct
    (read from the cdef, so a counter added in client.h appears here), the
    per-phase arrays as {phase name: bytes}."""
    out = {}
    for name, field in ffi.typeof("struct hg_client_stats").fields:
        v = getattr(st, name)
        if field.type.kind == "array":
            out[name] = {PHASES[i]: v[i] for i in range(len(PHASES))}
        else:
            out[name] = v
    return out


def agg_stats_dict(st):
    """A ``struct hg_client_agg_stats`` as a dict, every field."""
    return {name: getattr(st, name)
            for name, _ in ffi.typeof("struct hg_client_agg_stats").fields}
