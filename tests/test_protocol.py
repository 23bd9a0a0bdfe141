"""The protocol tables (homagg/protocol.h) as Python sees them, and that the
C client and the Python simulation walk the same phases of every method."""

import errno
import pathlib
import re

import numpy as np
import pytest

from homagg import codec, protocol
from homagg._native import ffi, lib
from homagg.errors import InvalidArgument
from homagg.sim import Cluster

import reference

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "PROTOCOL.md"


def test_wire_numbers_unchanged():
    """Op and method codes are wire numbers (docs/PROTOCOL.md)."""
    assert {n: o.code for n, o in protocol.OPS.items()} == {
        "sum32": 1,
        "or": 2,
        "max8": 3,
        "nc8": 4,
    }
    assert [protocol.METHOD[m].code for m in protocol.METHODS] == list(
        range(1, len(protocol.METHODS) + 1)
    )
    assert protocol.METHODS[:5] == ("dense", "blocks", "lhc", "nc", "auto")
    assert lib.HG_OP_NC8 == 4 and lib.HG_M_AUTO == 5


def test_op_codes_match_the_spec():
    text = DOC.read_text()
    row = re.search(r"\| 1 \| 1 \| op \| (.*?) \|", text).group(1)
    spec = {name.lower(): int(code) for code, name in re.findall(r"(\d+) (\w+)", row)}
    assert spec == {n: o.code for n, o in protocol.OPS.items()}


def test_op_facts_agree_with_the_c_accessors():
    for name, op in protocol.OPS.items():
        assert lib.hg_op_in_lane_bytes(op.code) == op.in_lane_bytes
        assert lib.hg_op_acc_lane_bytes(op.code) == op.acc_lane_bytes
        assert ffi.string(lib.hg_op_name(op.code)).decode() == name
        acc = np.empty(3 * op.acc_lane_bytes, dtype=np.uint8)
        assert lib.hg_op_identity(op.code, ffi.from_buffer("uint8_t[]", acc), 3) == 0
        assert set(acc.tolist()) == {op.identity}
    assert lib.hg_op_get(0) == ffi.NULL and lib.hg_op_get(len(protocol.OPS) + 1) == ffi.NULL
    assert lib.hg_op_at(-1) == ffi.NULL and lib.hg_method_at(len(protocol.METHODS)) == ffi.NULL
    assert ffi.string(lib.hg_method_name(99)).decode() == "unknown"


def test_client_stats_table_names_every_field():
    """hg_client_stat_name/per_phase (from HG_FOREACH_CLIENT_STAT) list the
    fields of struct hg_client_stats in order; per-phase ones are arrays of
    one entry per phase."""
    from homagg.bindings.client import client_stat_fields

    fields = client_stat_fields()
    struct = ffi.typeof("struct hg_client_stats").fields
    assert [n for n, _ in fields] == [n for n, _ in struct]
    assert len({n for n, _ in fields}) == len(fields)
    for (name, per_phase), (_, f) in zip(fields, struct):
        assert per_phase == (f.type.kind == "array"), name
        if per_phase:
            assert f.type.length == len(protocol.PHASES), name
    assert {n for n, p in fields if p} == {"bytes_sent", "bytes_received"}
    assert lib.hg_client_stat_name(len(fields)) == ffi.NULL
    assert not lib.hg_client_stat_per_phase(len(fields))


def test_phases_and_methods():
    assert protocol.PHASES == (
        "exponents",
        "counts",
        "values",
        "codes",
        "index",
        "sketch",
        "fallback",
        "union",
    )
    assert protocol.METHOD["union"].steps == (("exponents", "counts"), ("index",), ("union",))
    assert protocol.METHOD["lhc"].steps == (
        ("exponents", "counts"),
        ("index",),
        ("sketch",),
        ("fallback",),
    )
    assert protocol.METHOD["nc"].phases == ("exponents", "codes")
    assert protocol.PHASE["codes"].op == "nc8" and protocol.PHASE["index"].op == "or"
    assert "auto" in protocol.EXACT_METHODS and "nc" not in protocol.EXACT_METHODS
    # lhc never sends fewer bytes than union for the same index: not a candidate
    assert set(protocol.AUTO_CANDIDATES) == {"dense", "blocks", "union"}
    for name in protocol.METHODS:
        m = protocol.METHOD[name]
        assert m.steps[0][0] == "exponents", name
        if m.chooses:
            own = {ph for st in m.steps for ph in st}
            for c in protocol.AUTO_CANDIDATES:
                # the chosen method's first step was sent by the chooser
                assert set(protocol.METHOD[c].steps[0]) <= own
    assert protocol.run_steps("auto", "dense") == (("exponents",), ("counts",), ("values",))
    assert protocol.run_steps("auto", "dense", via="union") == (
        ("exponents",),
        ("counts",),
        ("index",),
        ("values",),
    )
    assert protocol.run_steps("auto", "union", via="union") == (
        ("exponents",),
        ("counts",),
        ("index",),
        ("union",),
    )
    with pytest.raises(InvalidArgument) as ei:
        protocol.method("zip")
    assert ei.value.code == -errno.EINVAL and "dense" in str(ei.value)


def _grads(W, n, density, seed):
    rng = np.random.default_rng(seed)
    grads = []
    for _ in range(W):
        g = np.zeros(n, np.float32)
        k = max(1, int(density * n))
        idx = rng.choice(n, k, replace=False)
        g[idx] = rng.standard_normal(k).astype(np.float32)
        grads.append(g)
    return grads


@pytest.mark.parametrize("method", protocol.METHODS)
def test_client_and_simulation_walk_the_same_phases(method):
    """The C client (through the simulated cluster) and codec.simulate_allreduce
    send the same bytes in every phase, and the exact methods are bit-exact."""
    W, n, block = 3, 3000, 256
    grads = _grads(W, n, 0.05, 7)
    sim = codec.simulate_allreduce(grads, method=method, block_elements=block)
    with Cluster(workers=W, seed=1) as cl:
        res = cl.allreduce(grads, method=method, block_elements=block)
    assert res.stats["method"] == sim.stats["method"]
    for w in range(W):
        got = res.stats["workers"][w]
        assert set(got["bytes_sent"]) == set(protocol.PHASES)
        assert got["bytes_sent"] == sim.stats["bytes_sent_by_worker"][w], w
        assert got["bytes_received"] == sim.stats["bytes_received_by_worker"][w], w
    want = protocol.run_steps(method, sim.stats["method"], sim.stats.get("auto_meta_choice"))
    sent = {ph for ph, b in sim.stats["bytes_sent"].items() if b}
    assert sent <= {ph for step in want for ph in step}
    if method in protocol.EXACT_METHODS:
        ref = reference.allreduce(grads, block)
        assert np.array_equal(res.sum.view(np.uint32), ref.view(np.uint32))
        assert np.array_equal(sim.sum.view(np.uint32), ref.view(np.uint32))
