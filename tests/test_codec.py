"""The codec through its bindings, against the independent numpy oracle.

Every exact method (dense, blocks, lhc, union, auto) must decode bit-identically to
tests/reference.py, on every worker, for every length, density, worker count
and magnitude; nc must be unbiased with a bounded second moment; bad input
must raise a clear exception of homagg.errors and never crash.
"""

import errno

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reference as ref
from helpers import assert_bits_equal, make_grads, run
from homagg import codec
from homagg.bindings import codec as b
from homagg.bindings import kernels as k
from homagg.errors import InvalidArgument, NonFiniteValue, OutOfRange

pytestmark = pytest.mark.sanitize

EXACT = ("dense", "blocks", "lhc", "union", "auto")
LANES = 256  # int32 lanes of one default payload


def oracle(grads, block):
    with np.errstate(over="ignore"):
        return ref.allreduce(grads, block)


# ---- exactness: explicit cases -----------------------------------------------

B = 64  # smallest block: many boundaries for few elements

LENGTHS = sorted(
    {
        0,
        1,
        2,
        B - 1,
        B,
        B + 1,
        2 * B - 1,
        2 * B + 1,
        LANES - 1,
        LANES,
        LANES + 1,
        3 * LANES + 7,
        1000,
    }
)


@pytest.mark.parametrize("method", EXACT)
@pytest.mark.parametrize("n", LENGTHS)
def test_lengths_small_block(method, n):
    rng = np.random.default_rng(n)
    for density in (0.0, 0.3, 1.0):
        grads = make_grads(rng, 3, n, density)
        r = run(grads, method, B)
        assert_bits_equal(r.sum, oracle(grads, B), f"{method} n={n} d={density}")
        assert r.stats["elements"] == n and r.stats["workers"] == 3


@pytest.mark.parametrize("method", EXACT)
@pytest.mark.parametrize("n", [4095, 4096, 4097, 2 * 4096 + 255])
def test_lengths_default_block(method, n):
    rng = np.random.default_rng(n)
    grads = make_grads(rng, 2, n, 0.05)
    r = run(grads, method, codec.DEFAULT_BLOCK)
    assert_bits_equal(r.sum, oracle(grads, codec.DEFAULT_BLOCK), f"{method} n={n}")
    assert r.stats["block_elements"] == codec.DEFAULT_BLOCK


@pytest.mark.parametrize("method", EXACT)
@pytest.mark.parametrize("density", [0.0, 1e-4, 1e-2, 0.05, 0.3, 1.0])
@pytest.mark.parametrize("positions", ["independent", "shared", "clustered"])
def test_densities_positions(method, density, positions):
    rng = np.random.default_rng(int(density * 1e4) + len(positions))
    n = 20000
    grads = make_grads(rng, 4, n, density, positions)
    r = run(grads, method, 512)
    assert_bits_equal(r.sum, oracle(grads, 512), f"{method} {density} {positions}")


@pytest.mark.parametrize("method", EXACT)
@pytest.mark.parametrize(
    "workers,n", [(1, 3000), (2, 3000), (3, 3000), (8, 2000), (64, 700), (256, 300)]
)
def test_worker_counts(method, workers, n):
    rng = np.random.default_rng(workers)
    grads = make_grads(rng, workers, n, 0.05)
    r = run(grads, method, 128)
    assert_bits_equal(r.sum, oracle(grads, 128), f"{method} W={workers}")


@pytest.mark.parametrize("method", EXACT)
@pytest.mark.parametrize("magnitude", ["tiny", "huge", "max", "subnormal", "mixed", "zeros"])
@pytest.mark.parametrize("workers", [1, 3])
def test_magnitudes(method, magnitude, workers):
    rng = np.random.default_rng(len(magnitude) * 7 + workers)
    grads = make_grads(rng, workers, 1500, 0.3, "independent", magnitude)
    r = run(grads, method, 64)
    assert_bits_equal(r.sum, oracle(grads, 64), f"{method} {magnitude} W={workers}")


def test_magnitude_extremes_in_one_block():
    """Huge and tiny values share a block: the tiny ones quantise to 0."""
    x = np.zeros(64, dtype=np.float32)
    x[0] = np.finfo(np.float32).max
    x[1] = np.float32(1e-30)
    x[2] = -np.float32(2**-149)
    x[3] = np.float32(-0.0)
    y = np.zeros(64, dtype=np.float32)
    y[5] = -np.finfo(np.float32).max
    y[6] = np.float32(3.0)
    for method in EXACT:
        r = run([x, y], method, 64)
        assert_bits_equal(r.sum, oracle([x, y], 64), method)
        assert r.sum[0] == x[0] and r.sum[5] == y[5]


def test_rounding_ties_to_even():
    """x * 2^s exactly halfway between integers rounds to the even one."""
    # One block, W = 1: E = 1 (max 1.5 < 2), s = 29; 2^-30 * k are ties.
    x = np.zeros(64, dtype=np.float32)
    x[0] = 1.5
    x[1:9] = np.float32(2.0**-30) * np.array([1, 3, 5, 7, -1, -3, -5, -7], dtype=np.float32)
    want = oracle([x], 64)
    assert list(np.ldexp(want[1:9].astype(np.float64), 29)) == [0, 2, 2, 4, 0, -2, -2, -4]
    for method in EXACT:
        assert_bits_equal(run([x], method, 64).sum, want, method)


# ---- exactness: generated cases ------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    method=st.sampled_from(EXACT),
    workers=st.sampled_from([1, 2, 3, 5, 8, 17, 64, 256]),
    n=st.integers(0, 1500),
    block=st.sampled_from([64, 128, 192, 1024]),
    density=st.sampled_from([0.0, 1e-3, 0.02, 0.1, 0.5, 1.0]),
    positions=st.sampled_from(["independent", "shared", "clustered"]),
    magnitude=st.sampled_from(["normal", "tiny", "huge", "subnormal", "mixed"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_exact_matches_oracle(method, workers, n, block, density, positions, magnitude, seed):
    rng = np.random.default_rng(seed)
    grads = make_grads(rng, workers, n, density, positions, magnitude)
    r = run(
        grads,
        method,
        block,
    )
    assert_bits_equal(r.sum, oracle(grads, block), f"{method}")
    if method == "auto":
        assert r.stats["auto_choice"] in ("dense", "blocks", "union")


# ---- lhc: stalls and the fallback ------------------------------------------------


def test_forced_stall_is_still_exact():
    rng = np.random.default_rng(7)
    grads = make_grads(rng, 3, 16 * 1024, 0.3)
    r = run(grads, "lhc", 1024, sketch_cells_per_candidate=0.5)
    assert_bits_equal(r.sum, oracle(grads, 1024), "stalled lhc")
    s = r.stats
    assert s["stalled_blocks"] > 0 and s["fallback_blocks"] > 0
    assert s["fallback_lanes"] > 0
    assert s["bytes_sent"]["fallback"] == 4 * s["fallback_lanes"]


def test_default_sizing_rarely_stalls():
    """At the default ~1.23 cells per candidate, peeling succeeds for
    almost every block (the exactness never depends on it)."""
    rng = np.random.default_rng(11)
    grads = make_grads(rng, 4, 64 * 1024, 0.05)
    r = run(grads, "lhc", 4096)
    assert_bits_equal(r.sum, oracle(grads, 4096), "lhc")
    assert r.stats["stalled_blocks"] <= 2  # out of 16 blocks
    assert r.stats["candidates"] >= int(np.count_nonzero(sum(g != 0 for g in grads)))


def test_lhc_stats_are_consistent():
    rng = np.random.default_rng(3)
    grads = make_grads(rng, 2, 10000, 0.02)
    r = run(grads, "lhc", 1024)
    s = r.stats
    nb = s["blocks"]
    assert s["bitmap_blocks"] + s["bloom_blocks"] <= nb
    assert s["bytes_sent"]["exponents"] == nb
    assert s["bytes_sent"]["counts"] == 4 * nb
    assert s["bytes_sent"]["index"] == s["index_bytes"]
    assert s["bytes_sent"]["sketch"] == 4 * s["sketch_lanes"]
    assert s["bytes_sent"]["values"] == 0
    assert s["bytes_per_worker"] == sum(s["bytes_sent"].values())
    assert s["dense_fp32_bytes"] == 40000
    assert s["global_nonzeros"] == int(sum(np.count_nonzero(g) for g in grads))
    for w in range(2):
        assert s["bytes_sent_by_worker"][w] == s["bytes_sent"]


def test_dense_and_blocks_bytes():
    rng = np.random.default_rng(5)
    grads = make_grads(rng, 2, 64 * 10, 0.0)
    grads[0][64 * 3 + 5] = 1.0  # one non-zero block out of 10
    d = run(grads, "dense", 64).stats
    bl = run(grads, "blocks", 64).stats
    assert d["bytes_sent"]["values"] == 4 * 640
    assert bl["bytes_sent"]["values"] == 4 * 64
    assert d["bytes_received"]["values"] == 4 * 640
    assert d["bytes_sent"]["exponents"] == 10


# ---- homomorphism ------------------------------------------------------------


def _grid_grads(rng, workers, n, block, density):
    """Gradients on the fixed-point grid of known block exponents, so the sum
    of the workers' floats is exact and quantises to the sum of their q."""
    L = ref.log2_ceil(workers)
    nb = ref.nblocks(n, block)
    E = rng.integers(-20, 21, nb)
    s = 30 - L - E
    s_el = np.repeat(s, block)[:n]
    grads = []
    for w in range(workers):
        q = rng.integers(-(2**20), 2**20, n) * (rng.random(n) < density)
        # Worker 0 fixes the block exponent at E (2^(E-1)); the others leave
        # that element alone, so every sum stays within 24 bits.
        q[::block] = 2 ** (29 - L) if w == 0 else 0
        grads.append(np.ldexp(q.astype(np.float64), -s_el).astype(np.float32))
    total = np.sum([g.astype(np.float64) for g in grads], axis=0).astype(np.float32)
    assert np.array_equal(
        total.astype(np.float64), np.sum([g.astype(np.float64) for g in grads], axis=0)
    )
    return grads, total, (E - 1).astype(np.int8)


@pytest.mark.parametrize("workers", [1, 2, 5, 8])
def test_homomorphic_values_and_sketch(workers):
    rng = np.random.default_rng(workers)
    n, block = 5000, 256
    grads, total, want_codes = _grid_grads(rng, workers, n, block, 0.1)
    params = codec.Params(block_elements=block, workers=workers)
    gcodes = codec.aggregate(
        "max8", None, [codec.encode_exponents(params, g, w) for w, g in enumerate(grads)]
    )
    assert np.array_equal(gcodes, want_codes)

    # Quantised values: the sum of the encodings is the encoding of the sum.
    for kind in ("dense", "blocks"):
        summed = codec.aggregate(
            "sum32",
            None,
            [codec.encode_values(params, g, gcodes, kind, w) for w, g in enumerate(grads)],
        )
        assert np.array_equal(summed, codec.encode_values(params, total, gcodes, kind))

    # Count sketch: the same, cell by cell, on the plan every worker shares.
    gcounts = codec.aggregate("sum32", None, [codec.encode_counts(params, g) for g in grads])
    plan = codec.plan_lhc(params, n, gcodes, gcounts)
    gindex = codec.aggregate("or", None, [plan.encode_index(g) for g in grads])
    assert not np.any(plan.encode_index(total) & ~gindex)  # sum's support is covered
    plan.set_index(gindex)
    cells = [plan.encode_sketch(g) for g in grads]
    summed = codec.aggregate("sum32", None, cells)
    assert np.array_equal(summed, plan.encode_sketch(total))
    # Wrapping int32 arithmetic: the sum of the cells as int64 agrees mod 2^32.
    wide = np.sum([c.astype(np.int64) for c in cells], axis=0)
    assert np.array_equal(
        ((wide + 2**31) % 2**32 - 2**31).astype(np.int64), summed.astype(np.int64)
    )
    plan.peel(summed)
    y = plan.decode(
        codec.aggregate(
            "sum32",
            np.zeros(plan.info["fallback_lanes"], dtype=">i4"),
            [plan.encode_fallback(g) for g in grads],
        )
    )
    assert_bits_equal(y, oracle(grads, block), "lhc by phases")


def test_sum32_wraps_like_twos_complement():
    a = np.array([2**31 - 1, -(2**31), 5, -1], dtype=">i4")
    acc = a.copy()
    k.aggregate(k.OP_SUM32, acc, np.array([1, -1, -7, 1], dtype=">i4"))
    assert acc.tolist() == [-(2**31), 2**31 - 1, -2, 0]


# ---- kernels through the bindings ----------------------------------------------


def _nc8_expand(codes, top):
    sign = np.where(codes & 0x80, -1, 1).astype(np.int64)
    m = (codes & 0x7F).astype(np.int64)
    ok = (m >= 1) & (m <= top)
    return np.where(ok, sign * (np.int64(1) << np.clip(top - m, 0, 62)), 0)


@pytest.mark.parametrize("lanes", [0, 1, 31, 32, 33, 255, 256, 257, 1000])
def test_kernels_match_numpy(lanes):
    rng = np.random.default_rng(lanes)
    isas = [i for i in (k.ISA_PORTABLE, k.ISA_AVX2, k.ISA_AVX512, k.ISA_BEST) if k.isa_supported(i)]
    acc32 = rng.integers(-(2**31), 2**31, lanes).astype(">i4")
    in32 = rng.integers(-(2**31), 2**31, lanes).astype(">i4")
    want = (acc32.astype(np.int64) + in32.astype(np.int64) + 2**31) % 2**32 - 2**31
    a8 = rng.integers(-128, 128, lanes).astype(np.int8)
    i8 = rng.integers(-128, 128, lanes).astype(np.int8)
    au = rng.integers(0, 256, lanes).astype(np.uint8)
    iu = rng.integers(0, 256, lanes).astype(np.uint8)
    top = 28
    nc = rng.integers(0, 256, lanes).astype(np.uint8)
    nc_want = (acc32.astype(np.int64) + _nc8_expand(nc, top) + 2**31) % 2**32 - 2**31
    for isa in isas:
        acc = acc32.copy()
        k.aggregate_isa(isa, k.OP_SUM32, acc, in32)
        assert np.array_equal(acc.astype(np.int64), want), k.isa_name(isa)
        acc = a8.copy()
        k.aggregate_isa(isa, k.OP_MAX8, acc, i8)
        assert np.array_equal(acc, np.maximum(a8, i8)), k.isa_name(isa)
        acc = au.copy()
        k.aggregate_isa(isa, k.OP_OR, acc, iu)
        assert np.array_equal(acc, au | iu), k.isa_name(isa)
        acc = acc32.copy()
        k.aggregate_isa(isa, k.OP_NC8, acc, nc, top)
        assert np.array_equal(acc.astype(np.int64), nc_want), k.isa_name(isa)
    assert k.op_identity_new(k.OP_MAX8, 3).tolist() == [-128] * 3
    assert k.op_identity_new(k.OP_SUM32, 3).tolist() == [0] * 3


# ---- nc: unbiased, bounded second moment ---------------------------------------


def _cnat_variance(x):
    """Variance of unbiased rounding of |x| to its two bracketing powers of two."""
    a = np.abs(x.astype(np.float64))
    lo = np.where(a > 0, 2.0 ** np.floor(np.log2(np.where(a > 0, a, 1))), 0)
    hi = 2 * lo
    return (a - lo) * (hi - a)


def _nc_vector(rng, n):
    """Values in [2^-8, 1) whose mantissa fraction is in [0.1, 0.9] (so every
    element rounds either way with a probability that K samples resolve),
    plus exact powers of two, which NC must keep exactly."""
    k = rng.integers(-8, 0, n)
    frac = rng.uniform(0.1, 0.9, n)
    frac[::16] = 0.0
    x = (np.ldexp(1.0 + frac, k) * rng.choice([-1.0, 1.0], n)).astype(np.float32)
    x[0] = 0.75  # block max: E = 0
    return x


NC_SEEDS = 400


def _nc_samples(grads, **kw):
    return np.stack(
        [
            codec.simulate_allreduce(
                grads, method="nc", seed=s, block_elements=256, **kw
            ).sum.astype(np.float64)
            for s in range(NC_SEEDS)
        ]
    )


@pytest.mark.parametrize("workers", [1, 3])
def test_nc_unbiased(workers):
    """mean over NC_SEEDS seeds within 5 standard errors of the exact sum, per
    element, with the standard error from the variance of unbiased rounding
    to powers of two (sum over workers); exact powers of two stay exact."""
    rng = np.random.default_rng(100 + workers)
    grads = [_nc_vector(rng, 256) for _ in range(workers)]
    exact = np.sum([g.astype(np.float64) for g in grads], axis=0)
    ys = _nc_samples(grads)
    se = np.sqrt(np.sum([_cnat_variance(g) for g in grads], axis=0) / NC_SEEDS)
    err = np.abs(ys.mean(axis=0) - exact)
    det = se == 0
    assert np.array_equal(ys[:, det], np.broadcast_to(exact[det], ys[:, det].shape))
    z = err[~det] / se[~det]
    assert z.max() < 5, f"worst element {z.max():.2f} standard errors off"
    # The whole vector: the standardised errors average to ~N(0, 1/sqrt(N)).
    zs = ((ys.mean(axis=0) - exact)[~det] / se[~det]).mean() * np.sqrt((~det).sum())
    assert abs(zs) < 5


def test_nc_second_moment():
    """E[C(x)^2] <= 9/8 x^2 (Horvath et al.), per element: the sample mean of
    y^2 may exceed 9/8 x^2 by at most 5 of its standard errors (estimated
    from the samples) plus 1e-12 relative; over the whole vector the ratio
    sum E[y^2] / sum x^2 must stay <= 9/8 within 5 standard errors."""
    rng = np.random.default_rng(9)
    x = _nc_vector(rng, 256)
    ys = _nc_samples([x])
    x2 = x.astype(np.float64) ** 2
    m2 = (ys**2).mean(axis=0)
    se2 = (ys**2).std(axis=0, ddof=1) / np.sqrt(NC_SEEDS)
    assert np.all(m2 <= 9 / 8 * x2 * (1 + 1e-12) + 5 * se2)
    tot_se = (ys**2).sum(axis=1).std(ddof=1) / np.sqrt(NC_SEEDS)
    assert (ys**2).sum(axis=1).mean() <= 9 / 8 * x2.sum() + 5 * tot_se
    # Every sample is a sum of signed powers of two (or 0), one per element.
    a = np.abs(ys[ys != 0])
    assert np.array_equal(np.exp2(np.round(np.log2(a))), a)


def test_nc_dithering_unbiased():
    """Natural dithering (nc_levels = 4): unbiased, per element within 5
    standard errors estimated from the samples (every element rounds both
    ways with probability >= 0.1 by construction), and takes few values."""
    rng = np.random.default_rng(21)
    x = _nc_vector(rng, 256)
    ys = _nc_samples([x], nc_levels=4)
    se = ys.std(axis=0, ddof=1) / np.sqrt(NC_SEEDS)
    err = np.abs(ys.mean(axis=0) - x.astype(np.float64))
    det = se == 0
    assert np.array_equal(ys[:, det], np.broadcast_to(x[det].astype(np.float64), ys[:, det].shape))
    assert np.all(err[~det] < 5 * se[~det])
    assert len(np.unique(np.abs(ys))) <= 2 * 4 + 2


def test_nc_is_deterministic_per_seed():
    rng = np.random.default_rng(1)
    grads = [_nc_vector(rng, 300) for _ in range(2)]
    a = codec.simulate_allreduce(grads, method="nc", seed=5, block_elements=64)
    c = codec.simulate_allreduce(grads, method="nc", seed=5, block_elements=64)
    d = codec.simulate_allreduce(grads, method="nc", seed=6, block_elements=64)
    assert np.array_equal(a.sum, c.sum) and not np.array_equal(a.sum, d.sum)
    assert a.stats["bytes_sent"]["codes"] == 300
    assert a.stats["bytes_received"]["codes"] == 4 * 300


# ---- auto ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "density,positions",
    [
        (0.0, "independent"),
        (1e-3, "independent"),
        (0.02, "shared"),
        (0.05, "clustered"),
        (0.3, "independent"),
        (1.0, "shared"),
    ],
)
def test_auto_bytes(density, positions):
    """auto runs the method it names, whose bytes it then matches exactly,
    plus the counts phase (dense, blocks) and the index phase when the meta
    phase did not settle the choice (tests/test_codec_union.py checks the
    1.05x bound on a grid of workloads)."""
    rng = np.random.default_rng(int(density * 1000))
    grads = make_grads(rng, 4, 32 * 1024, density, positions)
    by = {m: run(grads, m, 1024).stats for m in ("dense", "blocks", "lhc", "union")}
    a = run(grads, "auto", 1024).stats
    counts = 4 * int(np.count_nonzero(sum(np.abs(g) for g in grads).reshape(-1, 1024).max(1)))
    assert a["bytes_sent"]["counts"] == counts  # one lane per non-zero block
    chosen = a["auto_choice"]
    assert a["method"] == chosen
    extra = counts - by[chosen]["bytes_sent"]["counts"]
    if chosen != "union" and a["auto_meta_choice"] == "union":
        extra += by["union"]["index_bytes"]
    assert a["bytes_per_worker"] == by[chosen]["bytes_per_worker"] + extra
    assert a["bytes_per_worker"] <= 1.05 * min(s["bytes_per_worker"] for s in by.values())


# ---- stochastic rounding ---------------------------------------------------------


def test_stochastic_rounding_is_unbiased_and_grid_exact():
    """With stochastic rounding every worker still decodes the same bits; on
    values already on the grid nothing is rounded (result equals the oracle)."""
    rng = np.random.default_rng(2)
    grads, _, _ = _grid_grads(rng, 3, 2000, 256, 0.2)
    for method in ("dense", "blocks", "lhc", "union"):
        r = run(
            grads,
            method,
            256,
            stochastic=True,
        )
        assert_bits_equal(r.sum, oracle(grads, 256), f"stochastic {method} on grid")
    # Off the grid: x = 0.3125 units of 2^-28 (E = 1, W = 2: s = 28) rounds
    # up with probability p = 0.3125 on each worker; the mean over 200 seeds
    # x 63 elements must be within 5 standard errors of the exact sum 2x.
    x = np.full(64, np.float32(1.25 * 2.0**-30), dtype=np.float32)
    x[0] = 1.5
    ys = np.stack(
        [run([x, x], "dense", 64, stochastic=True, seed=s).sum[1:] for s in range(200)]
    ).astype(np.float64)
    assert set(np.unique(ys)) <= {0.0, 2.0**-28, 2.0**-27} and len(np.unique(ys)) >= 2
    p = 0.3125
    se = np.sqrt(2 * p * (1 - p)) * 2.0**-28 / np.sqrt(ys.size)
    assert abs(ys.mean() - 2 * float(x[1])) < 5 * se


# ---- bad input ---------------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("method", ["dense", "blocks", "lhc", "union", "nc", "auto"])
def test_non_finite_names_index_and_worker(bad, method):
    grads = [np.zeros(500, dtype=np.float32) for _ in range(3)]
    grads[2][321] = bad
    grads[2][400] = bad
    with pytest.raises(NonFiniteValue) as ei:
        codec.simulate_allreduce(grads, method=method, block_elements=64)
    assert ei.value.index == 321 and ei.value.worker == 2
    assert "321" in str(ei.value) and "worker 2" in str(ei.value)
    assert ei.value.code == -errno.EDOM


def test_non_finite_through_the_binding():
    x = np.ones(100, dtype=np.float32)
    x[77] = np.nan
    with pytest.raises(NonFiniteValue) as ei:
        codec.encode_exponents(codec.Params(block_elements=64, workers=4), x, worker=3)
    assert ei.value.index == 77 and ei.value.worker == 3


def test_bad_inputs():
    g = np.ones(100, dtype=np.float32)
    with pytest.raises(InvalidArgument, match="worker 1 has 99"):
        codec.simulate_allreduce([g, g[:99].copy()])
    with pytest.raises(InvalidArgument, match="dtype"):
        codec.simulate_allreduce([g, g.astype(np.float64)])
    with pytest.raises(InvalidArgument, match="dtype"):
        codec.simulate_allreduce([g.astype(">f4")])
    with pytest.raises(InvalidArgument, match="contiguous"):
        codec.simulate_allreduce([np.ones(200, dtype=np.float32)[::2]])
    with pytest.raises(InvalidArgument, match="1-D"):
        codec.simulate_allreduce([np.ones((10, 10), dtype=np.float32)])
    with pytest.raises(InvalidArgument):
        codec.simulate_allreduce([[1.0, 2.0]])
    with pytest.raises(OutOfRange):
        codec.simulate_allreduce([])
    with pytest.raises(OutOfRange):
        codec.simulate_allreduce([g] * 257)
    with pytest.raises(InvalidArgument, match="unknown method"):
        codec.simulate_allreduce([g], method="zip")
    with pytest.raises(InvalidArgument, match="unknown option"):
        codec.simulate_allreduce([g], blocksize=64)
    with pytest.raises(InvalidArgument, match="block"):
        codec.simulate_allreduce([g], block_elements=100)
    with pytest.raises(InvalidArgument, match="block"):
        codec.simulate_allreduce([g], block_elements=32)
    with pytest.raises(InvalidArgument):
        codec.simulate_allreduce(g)  # one array, not a list of workers
    with pytest.raises(OutOfRange):
        codec.Params(workers=0)
    with pytest.raises(OutOfRange):
        codec.Params(workers=257)
    with pytest.raises(InvalidArgument):
        codec.Params(sketch_cells_per_candidate=float("nan"))
    with pytest.raises(InvalidArgument, match="unknown aggregation op"):
        codec.aggregate("xor", None, [np.zeros(4, dtype=np.uint8)])


def test_bad_binding_buffers():
    p = b.params_new(block=64, workers=2)
    x = np.ones(130, dtype=np.float32)
    with pytest.raises(InvalidArgument, match="3 blocks"):
        b.exp_encode_into(p, x, np.empty(2, dtype=np.int8))
    codes = b.exp_encode(p, x)
    with pytest.raises(InvalidArgument, match="read-only"):
        ro = np.empty(3, dtype=np.int8)
        ro.flags.writeable = False
        b.exp_encode_into(p, x, ro)
    with pytest.raises(InvalidArgument, match="gcodes"):
        b.quantize(p, x, codes[:2].copy())
    with pytest.raises(InvalidArgument):
        b.quantize(p, x, codes.astype(np.int16))
    with pytest.raises(InvalidArgument, match="lanes"):
        b.quantize_into(p, x, codes, 0, np.empty(129, dtype=">i4"))
    with pytest.raises(InvalidArgument, match="dtype"):
        b.quantize_into(p, x, codes, 0, np.empty(130, dtype="<i4"))
    with pytest.raises(InvalidArgument, match="whole number of 4-byte lanes"):
        k.aggregate(k.OP_SUM32, np.zeros(6, dtype=np.uint8), np.zeros(6, dtype=np.uint8))
    with pytest.raises(InvalidArgument, match="lanes"):
        k.aggregate(k.OP_SUM32, np.zeros(3, dtype=">i4"), np.zeros(4, dtype=">i4"))
    with pytest.raises(InvalidArgument, match="unknown aggregation op"):
        k.aggregate(99, np.zeros(3, dtype=">i4"), np.zeros(3, dtype=">i4"))
    counts = b.nnz_counts(p, x)
    lhc = b.lhc_create(p, 130, codes, counts)
    with pytest.raises(InvalidArgument, match="130 elements"):
        b.lhc_index_encode(lhc, x[:100].copy())
    with pytest.raises(InvalidArgument):
        b.lhc_set_index(lhc, np.zeros(lhc.info()["index_bytes"] + 1, dtype=np.uint8))
    with pytest.raises(InvalidArgument, match="lanes"):
        b.lhc_create(p, 130, codes, counts[:2].copy())
    with pytest.raises(InvalidArgument, match="before"):
        b.lhc_sketch_encode(lhc, x)  # the index phase comes first
    with pytest.raises(OutOfRange):
        b.params_new(block=64, workers=2, worker=2)


def test_public_constants():
    assert codec.DEFAULT_BLOCK == 4096
    assert codec.MAX_WORKERS == 256
    assert b.method_name(3) == "lhc"
    assert codec.Params().block_elements == codec.DEFAULT_BLOCK


# ---- random streams, bit for bit (docs/PROTOCOL.md specifies them) ----------


@settings(max_examples=40, deadline=None)
@given(
    method=st.sampled_from(("dense", "blocks", "lhc", "union", "auto")),
    workers=st.sampled_from([1, 2, 3, 8]),
    n=st.integers(0, 1200),
    density=st.sampled_from([0.0, 0.05, 0.5, 1.0]),
    magnitude=st.sampled_from(["normal", "tiny", "subnormal", "mixed"]),
    seed=st.integers(0, 2**64 - 1),
)
def test_stochastic_matches_oracle(method, workers, n, density, magnitude, seed):
    rng = np.random.default_rng(seed % 2**32)
    grads = make_grads(rng, workers, n, density, "independent", magnitude)
    r = run(grads, method, 64, stochastic=True, seed=seed)
    want = ref.allreduce_stochastic(grads, 64, seed) if n else np.zeros(0, np.float32)
    assert_bits_equal(r.sum, want, f"stochastic {method}")


@settings(max_examples=40, deadline=None)
@given(
    workers=st.sampled_from([1, 2, 3, 8, 64]),
    n=st.integers(0, 1200),
    density=st.sampled_from([0.0, 0.05, 0.5, 1.0]),
    magnitude=st.sampled_from(["normal", "tiny", "huge", "subnormal", "mixed"]),
    nc_levels=st.sampled_from([0, 1, 3, 8, 40]),
    seed=st.integers(0, 2**64 - 1),
)
def test_nc_matches_oracle(workers, n, density, magnitude, nc_levels, seed):
    rng = np.random.default_rng(seed % 2**32)
    grads = make_grads(rng, workers, n, density, "independent", magnitude)
    r = codec.simulate_allreduce(
        grads, method="nc", seed=seed, block_elements=64, nc_levels=nc_levels
    )
    want = ref.allreduce_nc(grads, 64, seed, nc_levels) if n else np.zeros(0, np.float32)
    assert_bits_equal(r.sum, want, f"nc levels={nc_levels}")
