"""The union method, the one-pass scan and auto's exact choice.

- The one-pass encode (hg_scan_encode, then the index, sketch and union
  phases from the scan) gives byte-identical wire buffers to the previous
  implementation, which read the tensor in every phase and is kept
  callable (hg_exp_nnz_encode, hg_lhc_index_encode, hg_lhc_sketch_encode);
  union's lanes and result equal the numpy oracle's (tests/reference.py),
  on the vector and the portable paths.
- A hostile global index gives -EPROTO, hostile summed values decode to
  some numbers: never a crash.
- auto sends at most 1.05x the bytes of the smallest exact method (dense,
  blocks, lhc, union, each run on its own) on a grid of workloads and W,
  at most 1.01x when the meta phase settles the choice.
"""

import errno

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reference as ref
from homagg import codec
from homagg.bindings import codec as b
from homagg.errors import HomAggError, InvalidArgument, NonFiniteValue
from helpers import CODEC_ISAS, RUNNABLE_ISAS, codec_isa
from helpers import assert_bits_equal, make_grads, run

pytestmark = pytest.mark.sanitize

ISAS = CODEC_ISAS


@pytest.fixture(params=ISAS)
def isa(request):
    """Run the C codec on each ISA path (HOMAGG_CODEC_ISA, read again)."""
    with codec_isa(request.param):
        yield request.param


def _global(cps, grads, n):
    """Global codes and counts of W workers (the meta phase, C kernels)."""
    gcodes = codec.aggregate("max8", None, [b.exp_encode(p, g) for p, g in zip(cps, grads)])
    gcounts = codec.aggregate("sum32", None, [b.nnz_counts(p, g) for p, g in zip(cps, grads)])
    return gcodes, gcounts


# ---- one pass == the previous implementation ------------------------------------


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    workers=st.sampled_from([1, 2, 3, 8, 64]),
    n=st.integers(0, 9000),
    block=st.sampled_from([64, 192, 1024, 4096]),
    density=st.sampled_from([0.0, 1e-3, 0.01, 0.05, 0.3, 1.0]),
    positions=st.sampled_from(["independent", "shared", "clustered"]),
    magnitude=st.sampled_from(["normal", "tiny", "huge", "subnormal", "mixed"]),
    stochastic=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_one_pass_equals_previous_path(
    isa, workers, n, block, density, positions, magnitude, stochastic, seed
):
    rng = np.random.default_rng(seed)
    grads = make_grads(rng, workers, n, density, positions, magnitude)
    params = codec.Params(block_elements=block, workers=workers, seed=seed, stochastic=stochastic)
    cps = [params.c(w) for w in range(workers)]
    gcodes, gcounts = _global(cps, grads, n)
    plans = [b.lhc_create(cps[w], n, gcodes, gcounts) for w in range(workers)]
    scans = []
    for w in range(workers):
        scan, codes, counts = b.scan_encode(cps[w], grads[w])
        old_codes, old_counts = b.exp_nnz_encode(cps[w], grads[w])
        assert np.array_equal(codes, old_codes) and np.array_equal(counts, old_counts)
        assert scan.nonzeros() == np.count_nonzero(grads[w])
        new = b.lhc_index_encode_scan(plans[w], scan)
        assert np.array_equal(new, b.lhc_index_encode(plans[w], grads[w])), "index"
        scans.append(scan)
    gindex = codec.aggregate(
        "or", None, [b.lhc_index_encode_scan(plans[w], scans[w]) for w in range(workers)]
    )
    if gindex is None:
        gindex = np.zeros(0, np.uint8)
    for pl in plans:
        b.lhc_set_index(pl, gindex)
    for w in range(workers):
        with np.errstate(over="ignore"):
            new = b.lhc_sketch_encode_scan(plans[w], scans[w])
            old = b.lhc_sketch_encode(plans[w], grads[w])
        assert np.array_equal(new, old), "sketch"


@pytest.mark.parametrize(
    "workers,n,block,density,positions",
    [
        (4, 4096 * 6 + 100, 4096, 0.05, "independent"),
        (3, 20000, 512, 0.001, "independent"),  # Bloom blocks
        (8, 9000, 64, 0.3, "clustered"),
    ],
)
def test_decode_paths_identical(workers, n, block, density, positions):
    """lhc and union decode on the vector path (one write per element by
    64-bit index words) and on the portable path (the previous
    implementation's zero fill and scatter) give the same bits, equal to
    the oracle; a forced stall exercises the fallback's patching."""
    rng = np.random.default_rng(n)
    grads = make_grads(rng, workers, n, density, positions)
    want = ref.allreduce(grads, block)
    for isa in RUNNABLE_ISAS:
        with codec_isa(isa):
            for m, kw in (("lhc", {}), ("lhc", {"sketch_cells_per_candidate": 1.0}), ("union", {})):
                r = run(grads, m, block, **kw)
                assert_bits_equal(r.sum, want, f"{m} {kw} {isa}")
    stalled = run(grads, "lhc", block, sketch_cells_per_candidate=1.0).stats
    assert stalled["fallback_lanes"] > 0


# ---- union against the oracle --------------------------------------------------


@pytest.mark.parametrize(
    "workers,n,block,density,positions",
    [
        (1, 1000, 64, 0.3, "independent"),
        (3, 4096 * 3 + 45, 4096, 0.05, "independent"),
        (4, 20000, 1024, 0.05, "shared"),
        (5, 20000, 512, 0.02, "clustered"),
        (64, 3000, 128, 0.05, "independent"),
        (256, 1000, 64, 0.5, "shared"),
        (2, 777, 64, 1.0, "independent"),
    ],
)
def test_union_lanes_and_result_match_oracle(isa, workers, n, block, density, positions):
    rng = np.random.default_rng(workers * 1000 + n)
    grads = make_grads(rng, workers, n, density, positions)
    params = codec.Params(block_elements=block, workers=workers)
    cps = [params.c(w) for w in range(workers)]
    gcodes, gcounts = _global(cps, grads, n)
    plans = [b.lhc_create(cps[w], n, gcodes, gcounts) for w in range(workers)]
    assert plans[0].info()["bloom_blocks"] == 0  # the oracle's candidates are a bitmap's
    scans = [b.scan_encode(cps[w], grads[w])[0] for w in range(workers)]
    gindex = codec.aggregate(
        "or", None, [b.lhc_index_encode_scan(plans[w], scans[w]) for w in range(workers)]
    )
    for pl in plans:
        b.lhc_set_index(pl, gindex)
    cand = ref.union_candidates(grads)
    assert b.union_lanes(plans[0]) == cand.size
    lanes = []
    for w in range(workers):
        got = b.union_encode(plans[w], scans[w])
        want = ref.union_lanes(grads[w], gcodes, cand, workers, block)
        assert np.array_equal(got.astype(np.int64), want), f"worker {w}'s lanes"
        lanes.append(got)
    gvals = codec.aggregate("sum32", None, lanes)
    y = b.union_decode(plans[0], gvals)
    assert_bits_equal(y, ref.union_allreduce(grads, block), "union decode")
    assert_bits_equal(y, ref.allreduce(grads, block), "union vs fixed-point reference")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workers=st.sampled_from([1, 2, 3, 8, 64, 256]),
    n=st.integers(0, 3000),
    density=st.sampled_from([0.0, 1e-3, 0.05, 0.5, 1.0]),
    positions=st.sampled_from(["independent", "shared", "clustered"]),
    seed=st.integers(0, 2**64 - 1),
)
def test_union_stochastic_matches_oracle(workers, n, density, positions, seed):
    rng = np.random.default_rng(seed % 2**32)
    grads = make_grads(rng, workers, n, density, positions)
    r = run(grads, "union", 64, stochastic=True, seed=seed)
    want = ref.allreduce_stochastic(grads, 64, seed) if n else np.zeros(0, np.float32)
    assert_bits_equal(r.sum, want, "stochastic union")


def test_union_bytes_formula():
    rng = np.random.default_rng(3)
    grads = make_grads(rng, 4, 10000, 0.02)
    s = run(grads, "union", 1024).stats
    nb = s["blocks"]
    assert s["bytes_sent"]["exponents"] == nb
    assert s["bytes_sent"]["counts"] == 4 * nb
    assert s["bytes_sent"]["index"] == s["index_bytes"]
    assert s["bytes_sent"]["union"] == 4 * s["candidates"] == 4 * s["union_lanes"]
    assert s["bytes_sent"]["sketch"] == s["bytes_sent"]["fallback"] == 0
    assert s["bytes_sent"]["values"] == 0
    assert s["bytes_per_worker"] == nb + 4 * nb + s["index_bytes"] + 4 * s["candidates"]
    lhc = run(grads, "lhc", 1024).stats
    assert s["bytes_per_worker"] < lhc["bytes_per_worker"]
    assert s["candidates"] == lhc["candidates"]


# ---- bad and hostile input ---------------------------------------------------------


def _planned(n=4096, block=1024, workers=2):
    rng = np.random.default_rng(1)
    grads = make_grads(rng, workers, n, 0.1)
    params = codec.Params(block_elements=block, workers=workers)
    cps = [params.c(w) for w in range(workers)]
    gcodes, gcounts = _global(cps, grads, n)
    plans = [b.lhc_create(cps[w], n, gcodes, gcounts) for w in range(workers)]
    scans = [b.scan_encode(cps[w], grads[w])[0] for w in range(workers)]
    return grads, cps, plans, scans


def test_union_index_without_a_workers_non_zero_is_eproto(isa):
    grads, cps, plans, scans = _planned()
    own = b.lhc_index_encode_scan(plans[0], scans[0])
    b.lhc_set_index(plans[0], own)  # worker 1's non-zeros are missing
    with pytest.raises(HomAggError) as ei:
        b.union_encode(plans[0], scans[1])  # a plan that is worker 0's, a scan worker 1's
    assert ei.value.code == -errno.EPROTO
    b.union_encode(plans[0], scans[0])  # its own non-zeros are all there


def test_union_hostile_index_and_values_never_crash(isa):
    grads, cps, plans, scans = _planned()
    rng = np.random.default_rng(2)
    nbytes = plans[0].info()["index_bytes"]
    for gindex in (
        np.full(nbytes, 0xFF, np.uint8),
        rng.integers(0, 256, nbytes, dtype=np.uint8),
        np.zeros(nbytes, np.uint8),
    ):
        b.lhc_set_index(plans[0], gindex)
        lanes = b.union_lanes(plans[0])
        assert lanes == int(np.unpackbits(gindex).sum())
        vals = rng.integers(-(2**31), 2**31, lanes, dtype=np.int64).astype(">i4")
        y = b.union_decode(plans[0], vals)
        assert y.shape == (4096,)
        assert np.count_nonzero(y.view(np.uint32)) <= lanes
    with pytest.raises(InvalidArgument, match="gvals: expected"):
        b.union_decode(plans[0], np.zeros(lanes + 1, ">i4"))


def test_union_bad_arguments():
    grads, cps, plans, scans = _planned()
    with pytest.raises(InvalidArgument, match="call lhc_set_index before"):
        b.union_encode(plans[0], scans[0])
    b.lhc_set_index(plans[0], b.lhc_index_encode_scan(plans[0], scans[0]))
    other = b.scan_encode(cps[0], np.zeros(100, np.float32))[0]
    with pytest.raises(InvalidArgument, match="scan is of 100 elements"):
        b.union_encode(plans[0], other)
    with pytest.raises(InvalidArgument, match="expected dtype"):
        b.union_encode(plans[0], scans[0], np.zeros(b.union_lanes(plans[0]), np.int32))
    with pytest.raises(InvalidArgument, match="expected a successful scan"):
        b.union_encode(plans[0], b.scan_new())
    x = grads[0].copy()
    x[1234] = np.nan
    with pytest.raises(NonFiniteValue) as ei:
        b.scan_encode(cps[1], x)
    assert ei.value.index == 1234 and ei.value.worker == 1 and "1234" in str(ei.value)


def test_union_out_of_range_value_is_erange():
    """A worker's value above the global exponent (inconsistent codes)."""
    grads, cps, plans, scans = _planned()
    b.lhc_set_index(
        plans[0],
        codec.aggregate(
            "or", None, [b.lhc_index_encode_scan(plans[w], scans[w]) for w in range(2)]
        ),
    )
    x = grads[0].copy()
    x[np.flatnonzero(x)[0]] = 1e30
    big = b.scan_encode(cps[0], x)[0]
    with pytest.raises(HomAggError) as ei:
        b.union_encode(plans[0], big)
    assert ei.value.code == -errno.ERANGE


# ---- auto: exact byte counts ------------------------------------------------------


def _workload(rng, kind, workers, n, block):
    if kind == "one-dense-block":  # one dense block among zero blocks
        grads = [np.zeros(n, np.float32) for _ in range(workers)]
        for g in grads:
            g[block : 2 * block] = rng.standard_normal(block).astype(np.float32)
        return grads
    density, positions = {
        "zero": (0.0, "independent"),
        "sparse": (1e-3, "independent"),
        "independent": (0.05, "independent"),
        "shared": (0.05, "shared"),
        "clustered": (0.05, "clustered"),
        "half": (0.5, "independent"),
        "dense": (1.0, "shared"),
    }[kind]
    return make_grads(rng, workers, n, density, positions)


@pytest.mark.parametrize("workers", [2, 4, 16, 64, 128, 256])
@pytest.mark.parametrize(
    "kind",
    ["zero", "sparse", "independent", "shared", "clustered", "half", "dense", "one-dense-block"],
)
def test_auto_within_5_percent_of_the_smallest_exact_method(workers, kind):
    block, n = 1024, 16 * 1024
    rng = np.random.default_rng(workers + len(kind))
    grads = _workload(rng, kind, workers, n, block)
    by = {
        m: run(grads, m, block).stats["bytes_per_worker"]
        for m in ("dense", "blocks", "lhc", "union")
    }
    a = run(grads, "auto", block)
    assert_bits_equal(a.sum, ref.allreduce(grads, block), f"auto {kind} W={workers}")
    smallest = min(by.values())
    got = a.stats["bytes_per_worker"]
    assert got <= 1.05 * smallest, (kind, workers, a.stats["auto_choice"], got, by)
    if a.stats["auto_meta_choice"] in ("dense", "blocks"):
        assert got <= 1.01 * smallest, (kind, workers, got, by)
    assert a.stats["auto_choice"] != "lhc"
