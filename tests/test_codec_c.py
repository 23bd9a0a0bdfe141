"""The C codec (homagg/codec.h) through the raw cffi module.

Every exact claim is checked against a small numpy formula of
docs/PROTOCOL.md ("Codec"): exponent codes, the fixed-point round trip,
stochastic rounding streams, and the lhc pipeline against the dense sum,
with worker contributions summed in numpy (int32 wrapping, OR).
"""

import errno
import os
import subprocess
import sys

import numpy as np
import pytest

from homagg._native import ffi, lib

from reference import DOM_NC, DOM_ROUND, hash_u32, stream_key

pytestmark = pytest.mark.sanitize


# ---- numpy reference of the protocol formulas -----------------------------
# (the random streams, stream_key and hash_u32, are reference.py's)


def log2w(w):
    return (w - 1).bit_length()


def ref_codes(x, block):
    codes = []
    for b in range(0, len(x), block):
        m = float(np.max(np.abs(x[b : b + block].astype(np.float64))))
        if m == 0.0:
            codes.append(-128)
        else:
            e = min(max(np.frexp(m)[1], -126), 128)
            codes.append(e - 1)
    return np.array(codes, dtype=np.int8)


def shifts(codes, w):
    c = codes.astype(np.int64)
    return np.where(c == -128, 0, 30 - log2w(w) - (c + 1))


def ref_quantize(x, gcodes, block, w, worker=0, seed=0, stochastic=False):
    s = np.repeat(shifts(gcodes, w), block)[: len(x)]
    v = np.ldexp(x.astype(np.float64), s)
    if not stochastic:
        return np.rint(v).astype(np.int64).astype(np.int32)
    u = hash_u32(stream_key(seed, DOM_ROUND, worker), np.arange(len(x)))
    f = np.floor(v)
    return (f + (u * 2.0**-32 < v - f)).astype(np.int64).astype(np.int32)


def ref_decode(sum_q, gcodes, block, w):
    s = np.repeat(shifts(gcodes, w), block)[: len(sum_q)]
    with np.errstate(over="ignore"):  # float32 overflow rounds to +-inf
        return np.ldexp(sum_q.astype(np.float64), -s).astype(np.float32)


# ---- thin call helpers ----------------------------------------------------


def params(block=256, workers=1, worker=0, flags=0, seed=0, nc_levels=0, cpc=0.0):
    p = ffi.new("struct hg_params *")
    p.block, p.workers, p.worker, p.flags = block, workers, worker, flags
    p.seed, p.nc_levels, p.sketch_cells_per_candidate = seed, nc_levels, cpc
    return p


def buf(a):
    return ffi.from_buffer(a)


def exp_encode(p, x):
    codes = np.zeros(lib.hg_nblocks(p, len(x)), np.int8)
    bad = ffi.new("size_t *")
    rc = lib.hg_exp_encode(
        p, ffi.cast("float *", buf(x)), len(x), ffi.cast("int8_t *", buf(codes)), bad
    )
    return rc, codes, bad[0]


def nnz_counts(p, x):
    c = np.zeros(lib.hg_nblocks(p, len(x)), ">i4")
    assert (
        lib.hg_nnz_counts(p, ffi.cast("float *", buf(x)), len(x), ffi.cast("uint8_t *", buf(c)))
        == 0
    )
    return c


def quantize(p, x, gcodes, qflags=0):
    out = np.zeros(
        lib.hg_quantized_lanes(p, len(x), ffi.cast("int8_t *", buf(gcodes)), qflags), ">i4"
    )
    rc = lib.hg_quantize(
        p,
        ffi.cast("float *", buf(x)),
        len(x),
        ffi.cast("int8_t *", buf(gcodes)),
        qflags,
        ffi.cast("uint8_t *", buf(out)),
    )
    return rc, out


def dequantize(p, lanes, n, gcodes, qflags=0):
    y = np.full(n, np.nan, np.float32)
    rc = lib.hg_dequantize(
        p,
        ffi.cast("uint8_t *", buf(lanes)),
        n,
        ffi.cast("int8_t *", buf(gcodes)),
        qflags,
        ffi.cast("float *", buf(y)),
    )
    assert rc == 0
    return y


def gradients(rng, workers, n, density, scale=1.0):
    xs = []
    for _ in range(workers):
        x = (rng.standard_normal(n) * scale).astype(np.float32)
        x[rng.random(n) >= density] = 0.0
        xs.append(x)
    return xs


def global_meta(xs, block):
    ps = [params(block=block, workers=len(xs), worker=w) for w in range(len(xs))]
    codes = []
    counts = np.zeros(lib.hg_nblocks(ps[0], len(xs[0])), np.int64)
    for p, x in zip(ps, xs):
        rc, c, _ = exp_encode(p, x)
        assert rc == 0
        codes.append(c)
        counts += nnz_counts(p, x).astype(np.int64)
    return np.maximum.reduce(codes), counts.astype(">i4")


def lhc_allreduce(xs, block, flags=0, seed=0, cpc=0.0):
    """Runs the lhc phases for every worker; returns y per worker and info."""
    W = len(xs)
    n = len(xs[0])
    ps = [
        params(block=block, workers=W, worker=w, flags=flags, seed=seed, cpc=cpc) for w in range(W)
    ]
    gcodes, gcounts = global_meta(xs, block)
    ls = [
        ffi.gc(
            lib.hg_lhc_create(
                p, n, ffi.cast("int8_t *", buf(gcodes)), ffi.cast("uint8_t *", buf(gcounts))
            ),
            lib.hg_lhc_destroy,
        )
        for p in ps
    ]
    info = ffi.new("struct hg_lhc_info *")
    assert lib.hg_lhc_get_info(ls[0], info) == 0
    gindex = np.zeros(info.index_bytes, np.uint8)
    for l, x in zip(ls, xs):
        idx = np.zeros(info.index_bytes, np.uint8)
        assert (
            lib.hg_lhc_index_encode(l, ffi.cast("float *", buf(x)), ffi.cast("uint8_t *", buf(idx)))
            == 0
        )
        gindex |= idx
    for l in ls:
        assert lib.hg_lhc_set_index(l, ffi.cast("uint8_t *", buf(gindex))) == 0
    assert lib.hg_lhc_get_info(ls[0], info) == 0
    gcells = np.zeros(info.sketch_lanes, np.int32)
    sketches = []
    for l, x in zip(ls, xs):
        cells = np.zeros(info.sketch_lanes, ">i4")
        assert (
            lib.hg_lhc_sketch_encode(
                l, ffi.cast("float *", buf(x)), ffi.cast("uint8_t *", buf(cells))
            )
            == 0
        )
        sketches.append(cells.astype(np.int32))
        gcells += cells.astype(np.int32)  # int32 wrapping
    gcells_be = gcells.astype(">i4")
    for l in ls:
        assert lib.hg_lhc_peel(l, ffi.cast("uint8_t *", buf(gcells_be))) == 0
    assert lib.hg_lhc_get_info(ls[0], info) == 0
    gfb = np.zeros(info.fallback_lanes, np.int32)
    for l, x in zip(ls, xs):
        fb = np.zeros(info.fallback_lanes, ">i4")
        assert (
            lib.hg_lhc_fallback_encode(
                l, ffi.cast("float *", buf(x)), ffi.cast("uint8_t *", buf(fb))
            )
            == 0
        )
        gfb += fb.astype(np.int32)
    gfb_be = gfb.astype(">i4")
    ys = []
    for l in ls:
        y = np.full(n, np.nan, np.float32)
        assert (
            lib.hg_lhc_decode(l, ffi.cast("uint8_t *", buf(gfb_be)), ffi.cast("float *", buf(y)))
            == 0
        )
        ys.append(y)
    infos = []
    for l in ls:
        i = ffi.new("struct hg_lhc_info *")
        lib.hg_lhc_get_info(l, i)
        infos.append({k: getattr(i, k) for k in dir(i)})
    return ys, infos, gcodes, sketches, ls


def dense_reference(xs, block, flags=0, seed=0):
    gcodes, _ = global_meta(xs, block)
    W = len(xs)
    total = np.zeros(len(xs[0]), np.int32)
    for w, x in enumerate(xs):
        q = ref_quantize(
            x, gcodes, block, W, worker=w, seed=seed, stochastic=bool(flags & lib.HG_F_STOCHASTIC)
        )
        total += q
    return ref_decode(total, gcodes, block, W)


# ---- parameters, exponents, counts ---------------------------------------


def test_params_check_and_basics():
    assert lib.hg_params_check(params()) == 0
    assert lib.hg_params_check(ffi.NULL) == -errno.EINVAL
    assert lib.hg_params_check(params(block=100)) == -errno.EINVAL
    assert lib.hg_params_check(params(block=32)) == -errno.EINVAL
    assert lib.hg_params_check(params(block=65536 + 64)) == -errno.EINVAL
    assert lib.hg_params_check(params(workers=0)) == -errno.ERANGE
    assert lib.hg_params_check(params(workers=257)) == -errno.ERANGE
    assert lib.hg_params_check(params(workers=4, worker=4)) == -errno.ERANGE
    for w, l in [(1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (256, 8)]:
        assert lib.hg_log2_workers(params(workers=w)) == l
        assert lib.hg_nc_top(params(workers=w)) == 31 - l
    p = params(block=64)
    assert lib.hg_nblocks(p, 0) == 0 and lib.hg_nblocks(p, 65) == 2
    assert lib.hg_scale_shift(params(workers=4), -128) == 0
    assert lib.hg_scale_shift(params(workers=4), 0) == 27
    names = {m: ffi.string(lib.hg_method_name(m)).decode() for m in range(1, 7)}
    assert names == {1: "dense", 2: "blocks", 3: "lhc", 4: "nc", 5: "auto", 6: "union"}


def test_exponent_codes_special_blocks():
    block = 64
    blocks = [
        np.zeros(block, np.float32),
        np.full(block, -0.0, np.float32),
        np.full(block, np.float32(1e-45), np.float32),  # smallest subnormal
        np.full(block, np.float32(1.1754942e-38), np.float32),  # largest subnormal
        np.full(block, np.float32(1.1754944e-38), np.float32),  # smallest normal
        np.full(block, np.float32(3.4028235e38), np.float32),  # FLT_MAX
        np.full(block, np.float32(1.0), np.float32),  # exact power of two
        np.full(block, np.float32(-0.75), np.float32),
    ]
    x = np.concatenate(blocks + [np.float32([0.5, 0, 0])])  # short last block
    rc, codes, _ = exp_encode(params(block=block), x)
    assert rc == 0
    assert codes.tolist() == ref_codes(x, block).tolist()
    assert codes.tolist() == [-128, -128, -127, -127, -126, 127, 0, -1, -1]


def test_exponent_codes_random_and_portable_path_identical():
    rng = np.random.default_rng(1)
    x = (
        rng.standard_normal(64 * 100 + 17) * np.exp2(rng.integers(-140, 120, 64 * 100 + 17))
    ).astype(np.float32)
    x[rng.random(len(x)) < 0.3] = 0
    x[640:704] = 0
    rc, codes, _ = exp_encode(params(block=64), x)
    assert rc == 0
    np.testing.assert_array_equal(codes, ref_codes(x, 64))
    counts = nnz_counts(params(block=64), x)
    ref = [np.count_nonzero(x[b : b + 64]) for b in range(0, len(x), 64)]
    assert counts.tolist() == ref


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [0, 7, 1000, 4097])
def test_nonfinite_reports_first_index(bad, where):
    x = np.ones(4200, np.float32)
    x[where] = bad
    x[4150] = np.nan
    rc, _, idx = exp_encode(params(block=128), x)
    assert rc == -errno.EDOM and idx == where
    codes = np.zeros(lib.hg_nblocks(params(block=128), len(x)), np.int8)
    counts = np.zeros(len(codes), ">i4")
    bad_i = ffi.new("size_t *")
    rc = lib.hg_exp_nnz_encode(
        params(block=128),
        ffi.cast("float *", buf(x)),
        len(x),
        ffi.cast("int8_t *", buf(codes)),
        ffi.cast("uint8_t *", buf(counts)),
        bad_i,
    )
    assert rc == -errno.EDOM and bad_i[0] == where


def test_fused_exp_nnz_matches_separate_calls():
    rng = np.random.default_rng(2)
    x = gradients(rng, 1, 10_000, 0.1)[0]
    p = params(block=512)
    codes = np.zeros(lib.hg_nblocks(p, len(x)), np.int8)
    counts = np.zeros(len(codes), ">i4")
    assert (
        lib.hg_exp_nnz_encode(
            p,
            ffi.cast("float *", buf(x)),
            len(x),
            ffi.cast("int8_t *", buf(codes)),
            ffi.cast("uint8_t *", buf(counts)),
            ffi.NULL,
        )
        == 0
    )
    np.testing.assert_array_equal(codes, exp_encode(p, x)[1])
    np.testing.assert_array_equal(counts, nnz_counts(p, x))


def test_bad_arguments():
    x = np.ones(128, np.float32)
    codes = np.zeros(2, np.int8)
    assert (
        lib.hg_exp_encode(
            params(block=96),
            ffi.cast("float *", buf(x)),
            128,
            ffi.cast("int8_t *", buf(codes)),
            ffi.NULL,
        )
        == -errno.EINVAL
    )
    assert (
        lib.hg_exp_encode(
            params(workers=300),
            ffi.cast("float *", buf(x)),
            128,
            ffi.cast("int8_t *", buf(codes)),
            ffi.NULL,
        )
        == -errno.ERANGE
    )
    assert (
        lib.hg_exp_encode(
            params(block=64), ffi.NULL, 128, ffi.cast("int8_t *", buf(codes)), ffi.NULL
        )
        == -errno.EINVAL
    )
    assert lib.hg_lhc_create(ffi.NULL, 128, ffi.NULL, ffi.NULL) == ffi.NULL
    assert (
        lib.hg_lhc_create(
            params(block=100),
            128,
            ffi.cast("int8_t *", buf(codes)),
            ffi.cast("uint8_t *", buf(np.zeros(2, ">i4"))),
        )
        == ffi.NULL
    )
    # a value outside the global code's range is refused
    rc, _ = quantize(params(block=64), x, np.array([-1, -1], np.int8))
    assert rc == -errno.ERANGE


# ---- quantisation round trip ---------------------------------------------


@pytest.mark.parametrize("W", [1, 3, 4, 256])
@pytest.mark.parametrize("qflags", [0, 1])
def test_quantize_dequantize_matches_float64_formula(W, qflags):
    rng = np.random.default_rng(W)
    block = 128
    n = block * 40 + 33
    x = (
        rng.standard_normal(n) * np.exp2(np.repeat(rng.integers(-150, 127, 41), block)[:n])
    ).astype(np.float32)
    x[block * 3 : block * 5] = 0  # zero blocks
    x[rng.random(n) < 0.2] = 0
    x[7] = np.float32(0.5)  # ties: 0.5 * 2^s exact halves appear below
    p = params(block=block, workers=W)
    rc, codes, _ = exp_encode(p, x)
    assert rc == 0
    rc, q = quantize(p, x, codes, qflags)
    assert rc == 0
    ref = ref_quantize(x, codes, block, W)
    keep = np.repeat(codes != -128, block)[:n] if qflags else np.ones(n, bool)
    np.testing.assert_array_equal(q.astype(np.int32), ref[keep])
    # the decode of W identical contributions equals the float64 formula
    total = (q.astype(np.int64) * W).astype(np.int32).astype(">i4")
    y = dequantize(p, total, n, codes, qflags)
    expect = ref_decode(ref.astype(np.int64) * W, codes, block, W)
    np.testing.assert_array_equal(y.view(np.uint32), expect.view(np.uint32))


def test_round_half_even_ties():
    p = params(block=64, workers=1)
    # code 0 (E = 1): s = 29, so 2^-30 * k quantises to k / 2
    x = (np.arange(64, dtype=np.float64) * 2.0**-30).astype(np.float32)
    x[63] = 1.5
    codes = np.array([0], np.int8)
    rc, q = quantize(p, x, codes)
    assert rc == 0
    assert q[:8].tolist() == [0, 0, 1, 2, 2, 2, 3, 4]


def test_stochastic_rounding_stream_and_unbiased():
    rng = np.random.default_rng(5)
    block, W = 256, 2
    x = (rng.standard_normal(block * 8) * 1e-3).astype(np.float32)
    codes = ref_codes(x, block)
    for worker in range(W):
        p = params(block=block, workers=W, worker=worker, flags=1, seed=1234)
        rc, q = quantize(p, x, codes)
        assert rc == 0
        ref = ref_quantize(x, codes, block, W, worker=worker, seed=1234, stochastic=True)
        np.testing.assert_array_equal(q.astype(np.int32), ref)
    # unbiased: v = 7 + about 1/3 in every block (element 0 = 1.0 sets E = 1)
    x = np.full(64 * 400, np.float32((7 + 1 / 3) * 2.0**-29), np.float32)
    x[::64] = 1.0
    codes = ref_codes(x, 64)
    assert set(codes.tolist()) == {0}
    p = params(block=64, flags=1, seed=99)
    rc, q = quantize(p, x, codes)
    assert rc == 0
    v = np.ldexp(x.astype(np.float64), 29)
    frac = (v - np.floor(v))[1:64].mean()
    up = (q.astype(np.int64) - np.floor(v).astype(np.int64)).reshape(400, 64)[:, 1:]
    assert set(np.unique(up)) <= {0, 1}
    assert abs(up.mean() - frac) < 4 * np.sqrt(frac * (1 - frac) / up.size)


def test_portable_and_avx2_paths_identical(tmp_path):
    """The same script under HOMAGG_CODEC_ISA=portable and the default."""
    script = tmp_path / "run.py"
    script.write_text(
        "import numpy as np, sys\n"
        "from homagg._native import ffi, lib\n"
        "rng = np.random.default_rng(7)\n"
        "n = 4096 * 3 + 45\n"
        "x = (rng.standard_normal(n) * np.exp2(rng.integers(-60, 60, n))).astype(np.float32)\n"
        "x[rng.random(n) < 0.7] = 0\n"
        "p = ffi.new('struct hg_params *', dict(block=4096, workers=3, worker=1))\n"
        "codes = np.zeros(4, np.int8); counts = np.zeros(4, '>i4')\n"
        "assert lib.hg_exp_nnz_encode(p, ffi.cast('float *', ffi.from_buffer(x)), n, ffi.cast('int8_t *', ffi.from_buffer(codes)), ffi.cast('uint8_t *', ffi.from_buffer(counts)), ffi.NULL) == 0\n"
        "q = np.zeros(n, '>i4')\n"
        "assert lib.hg_quantize(p, ffi.cast('float *', ffi.from_buffer(x)), n, ffi.cast('int8_t *', ffi.from_buffer(codes)), 0, ffi.cast('uint8_t *', ffi.from_buffer(q))) == 0\n"
        "y = np.zeros(n, np.float32)\n"
        "assert lib.hg_dequantize(p, ffi.cast('uint8_t *', ffi.from_buffer(q)), n, ffi.cast('int8_t *', ffi.from_buffer(codes)), 0, ffi.cast('float *', ffi.from_buffer(y))) == 0\n"
        "l = lib.hg_lhc_create(p, n, ffi.cast('int8_t *', ffi.from_buffer(codes)), ffi.cast('uint8_t *', ffi.from_buffer(counts)))\n"
        "i = ffi.new('struct hg_lhc_info *'); lib.hg_lhc_get_info(l, i)\n"
        "idx = np.zeros(i.index_bytes, np.uint8)\n"
        "assert lib.hg_lhc_index_encode(l, ffi.cast('float *', ffi.from_buffer(x)), ffi.cast('uint8_t *', ffi.from_buffer(idx))) == 0\n"
        "assert lib.hg_lhc_set_index(l, ffi.cast('uint8_t *', ffi.from_buffer(idx))) == 0\n"
        "lib.hg_lhc_get_info(l, i)\n"
        "cells = np.zeros(i.sketch_lanes, '>i4')\n"
        "assert lib.hg_lhc_sketch_encode(l, ffi.cast('float *', ffi.from_buffer(x)), ffi.cast('uint8_t *', ffi.from_buffer(cells))) == 0\n"
        "lib.hg_lhc_destroy(l)\n"
        "sys.stdout.write(str(hash(codes.tobytes() + counts.tobytes() + q.tobytes() + y.tobytes() + idx.tobytes() + cells.tobytes())))\n"
    )
    env = dict(os.environ, PYTHONHASHSEED="0")
    a = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    env["HOMAGG_CODEC_ISA"] = "portable"
    b = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert a.returncode == 0, a.stderr
    assert b.returncode == 0, b.stderr
    assert a.stdout == b.stdout and a.stdout


# ---- lhc -----------------------------------------------------------------


@pytest.mark.parametrize(
    "W,density,block", [(1, 0.3, 256), (3, 0.05, 1024), (4, 0.01, 4096), (2, 1.0, 64)]
)
def test_lhc_pipeline_equals_dense(W, density, block):
    rng = np.random.default_rng(W * 100 + block)
    n = block * 9 + 37
    xs = gradients(rng, W, n, density)
    xs[0][block : 2 * block] = 0  # a block zero on worker 0 only
    for x in xs:
        x[2 * block : 3 * block] = 0  # a block zero everywhere
    ys, infos, _, _, _ = lhc_allreduce(xs, block)
    expect = dense_reference(xs, block)
    for y in ys:
        np.testing.assert_array_equal(y.view(np.uint32), expect.view(np.uint32))
    assert all(i == infos[0] for i in infos)


def test_lhc_stochastic_equals_dense_stochastic():
    rng = np.random.default_rng(11)
    xs = gradients(rng, 3, 4096 * 3, 0.1, scale=1e-6)
    ys, _, _, _, _ = lhc_allreduce(xs, 1024, flags=1, seed=77)
    expect = dense_reference(xs, 1024, flags=1, seed=77)
    np.testing.assert_array_equal(ys[0].view(np.uint32), expect.view(np.uint32))


def test_lhc_bloom_blocks_at_low_density_are_exact():
    rng = np.random.default_rng(12)
    block, n, W = 4096, 4096 * 8, 3
    xs = gradients(rng, W, n, 0.002)
    ys, infos, _, _, _ = lhc_allreduce(xs, block)
    assert infos[0]["bloom_blocks"] == 8 and infos[0]["bitmap_blocks"] == 0
    assert infos[0]["index_bytes"] < 8 * block // 8
    union = np.count_nonzero(np.logical_or.reduce([x != 0 for x in xs]))
    assert infos[0]["candidates"] >= union
    expect = dense_reference(xs, block)
    np.testing.assert_array_equal(ys[0].view(np.uint32), expect.view(np.uint32))


def test_forced_stalls_are_exact_through_fallback_and_deterministic():
    rng = np.random.default_rng(13)
    block, W = 512, 3
    xs = gradients(rng, W, block * 12, 0.2)
    ys, infos, _, _, ls = lhc_allreduce(xs, block, cpc=0.5)
    assert infos[0]["stalled_blocks"] > 0 and infos[0]["fallback_lanes"] > 0
    assert infos[0]["fallback_lanes"] < infos[0]["candidates"]
    expect = dense_reference(xs, block)
    for y in ys:
        np.testing.assert_array_equal(y.view(np.uint32), expect.view(np.uint32))
    ys2, infos2, _, _, _ = lhc_allreduce(xs, block, cpc=0.5)
    assert infos2 == infos
    np.testing.assert_array_equal(ys2[1].view(np.uint32), ys[1].view(np.uint32))


def test_default_sizing_lanes():
    """The default sizing minimises sketch + fallback lanes, so some blocks
    stall (their 2-core goes to the fallback), but the lanes stay near the
    simulated 1.36 per candidate at ~190 candidates per block
    (docs/PROTOCOL.md "Sketch sizing measurements"); the result is exact."""
    rng = np.random.default_rng(14)
    xs = gradients(rng, 2, 1024 * 64, 0.1)
    ys, infos, _, _, _ = lhc_allreduce(xs, 1024)
    info = infos[0]
    assert 0 < info["stalled_blocks"] <= 16  # of 64 blocks
    assert info["fallback_lanes"] <= 0.05 * info["candidates"]
    assert info["sketch_lanes"] + info["fallback_lanes"] <= 1.45 * info["candidates"]
    np.testing.assert_array_equal(ys[0].view(np.uint32), dense_reference(xs, 1024).view(np.uint32))


def test_sketch_is_homomorphic():
    """sum_w sketch(q_w) == sketch(sum_w q_w) through a one-worker encode of
    values whose quantisation is the sum (powers of two keep it exact)."""
    rng = np.random.default_rng(15)
    block, W = 256, 2
    n = block * 4
    mask = rng.random(n) < 0.3
    k = rng.integers(-3, 4, (W, n))
    xs = [np.where(mask, kw, 0).astype(np.float32) for kw in k]
    xs[0][::block] = 4.0  # global exponent E = 3 in every block
    xs[1][::block] = 0.0  # so the summed values stay below 2^3
    _, _, gcodes, sketches, ls = lhc_allreduce(xs, block)
    summed = np.sum(sketches, axis=0, dtype=np.int64).astype(np.int32)
    # one worker holding the sum, with the same index and global codes
    total = (xs[0] + xs[1]).astype(np.float32)
    l = ls[0]
    cells = np.zeros(len(summed), ">i4")
    # re-encode with the sum: quantised with the same s (exact integers)
    assert (
        lib.hg_lhc_sketch_encode(
            l, ffi.cast("float *", buf(total)), ffi.cast("uint8_t *", buf(cells))
        )
        == 0
    )
    np.testing.assert_array_equal(cells.astype(np.int32), summed)


def test_lhc_wrong_order_is_einval():
    x = np.ones(256, np.float32)
    p = params(block=256)
    codes = np.array([0], np.int8)
    counts = np.array([256], ">i4")
    l = ffi.gc(
        lib.hg_lhc_create(
            p, 256, ffi.cast("int8_t *", buf(codes)), ffi.cast("uint8_t *", buf(counts))
        ),
        lib.hg_lhc_destroy,
    )
    out = np.zeros(4096, ">i4")
    xp = ffi.cast("float *", buf(x))
    op = ffi.cast("uint8_t *", buf(out))
    assert lib.hg_lhc_sketch_encode(l, xp, op) == -errno.EINVAL
    assert lib.hg_lhc_peel(l, op) == -errno.EINVAL
    assert lib.hg_lhc_fallback_encode(l, xp, op) == -errno.EINVAL
    assert lib.hg_lhc_decode(l, op, xp) == -errno.EINVAL
    assert lib.hg_lhc_index_encode(ffi.NULL, xp, op) == -errno.EINVAL
    assert lib.hg_lhc_get_info(l, ffi.NULL) == -errno.EINVAL
    lib.hg_lhc_destroy(ffi.NULL)


def test_peel_detects_inconsistent_sums():
    rng = np.random.default_rng(16)
    xs = gradients(rng, 1, 1024, 0.1)
    _, _, _, _, ls = lhc_allreduce(xs, 1024)
    info = ffi.new("struct hg_lhc_info *")
    lib.hg_lhc_get_info(ls[0], info)
    junk = np.arange(info.sketch_lanes, dtype=">i4") * 7919
    assert lib.hg_lhc_peel(ls[0], ffi.cast("uint8_t *", buf(junk))) == -errno.EPROTO


# ---- auto ------------------------------------------------------------------


def test_auto_choice():
    block = 1024
    p = params(block=block, workers=4)
    nb = 64
    n = nb * block

    def choose(codes, counts):
        return lib.hg_auto_choose(
            p, n, ffi.cast("int8_t *", buf(codes)), ffi.cast("uint8_t *", buf(counts.astype(">i4")))
        )

    full = np.zeros(nb, np.int8)
    assert choose(full, np.full(nb, 4 * block)) == lib.HG_M_DENSE
    half = full.copy()
    half[::2] = -128
    assert choose(half, np.full(nb, 4 * block)) == lib.HG_M_BLOCKS
    # union's least bytes (index + 4 x ceil(20 / 4) per block) are below
    # dense and blocks: the index phase decides (hg_auto_choose_indexed)
    assert choose(full, np.full(nb, 20)) == lib.HG_M_UNION
    # 4 workers with 1024 non-zeros each in a block of 1024: at least 1024
    # candidates, so union sends at least dense plus its index
    assert choose(full, np.full(nb, 4 * block)) == lib.HG_M_DENSE
    assert lib.hg_auto_choose(params(workers=0), n, ffi.NULL, ffi.NULL) == -errno.ERANGE


# ---- nc --------------------------------------------------------------------


def nc_expand(codes, top):
    m = (codes & 0x7F).astype(np.int64)
    mag = np.where(
        (m >= 1) & (m <= top), np.ldexp(1.0, (top - np.clip(m, 1, top)).astype(np.int64)), 0.0
    )
    return np.where(codes & 0x80, -mag, mag)


@pytest.mark.parametrize("levels", [0, 3])
def test_nc_unbiased_and_powers_of_two(levels):
    block, W = 1024, 4
    rng = np.random.default_rng(17)
    base = (rng.standard_normal(block) * 0.3).astype(np.float32)
    base[0] = 0.99
    base[1] = 0.0
    reps = 200
    x = np.tile(base, reps)
    codes = ref_codes(x, block)
    top = lib.hg_nc_top(params(workers=W))
    nc = np.zeros(len(x), np.uint8)
    p = params(block=block, workers=W, worker=2, seed=5, nc_levels=levels)
    assert (
        lib.hg_nc_encode(
            p,
            ffi.cast("float *", buf(x)),
            len(x),
            ffi.cast("int8_t *", buf(codes)),
            ffi.cast("uint8_t *", buf(nc)),
        )
        == 0
    )
    units = nc_expand(nc, top)
    s = shifts(codes, W)[0]
    v = np.ldexp(base.astype(np.float64), s)
    # each unit value is 0 or a power of two with x's sign, bracketing |v|
    got = units.reshape(reps, block)
    assert np.all((got == 0) | (np.sign(got) == np.sign(v)))
    mean = got.mean(axis=0)
    sd = np.abs(v).max() / np.sqrt(reps)
    assert np.all(np.abs(mean - v) < 5 * sd)
    assert abs((mean - v).sum()) < 5 * sd * np.sqrt(block)
    assert nc[1] == 0
    if levels:
        m = nc & 0x7F
        assert m.max() <= levels
    # the same seed gives the same codes, another worker other codes
    nc2 = np.zeros_like(nc)
    lib.hg_nc_encode(
        p,
        ffi.cast("float *", buf(x)),
        len(x),
        ffi.cast("int8_t *", buf(codes)),
        ffi.cast("uint8_t *", buf(nc2)),
    )
    np.testing.assert_array_equal(nc, nc2)
    p.worker = 3
    lib.hg_nc_encode(
        p,
        ffi.cast("float *", buf(x)),
        len(x),
        ffi.cast("int8_t *", buf(codes)),
        ffi.cast("uint8_t *", buf(nc2)),
    )
    assert np.any(nc != nc2)


def test_nc_stream_matches_formula():
    block, W = 256, 2
    rng = np.random.default_rng(18)
    x = (rng.standard_normal(block * 2) * 1e-2).astype(np.float32)
    codes = ref_codes(x, block)
    top = 31 - log2w(W)
    p = params(block=block, workers=W, worker=1, seed=42)
    nc = np.zeros(len(x), np.uint8)
    assert (
        lib.hg_nc_encode(
            p,
            ffi.cast("float *", buf(x)),
            len(x),
            ffi.cast("int8_t *", buf(codes)),
            ffi.cast("uint8_t *", buf(nc)),
        )
        == 0
    )
    s = np.repeat(shifts(codes, W), block)
    v = np.abs(np.ldexp(x.astype(np.float64), s))
    u = hash_u32(stream_key(42, DOM_NC, 1), np.arange(len(x))) * 2.0**-32
    k = np.frexp(v)[1] - 1
    kmin = 0
    lo = np.maximum(k, kmin)
    p_up = np.where(v < 1, v, np.ldexp(v, -k) - 1)
    kk = np.where(v < 1, np.where(u < p_up, 0, -1), np.where(u < p_up, k + 1, k))
    m = np.where(kk < 0, 0, top - kk)
    expect = np.where(m == 0, 0, m | np.where(x < 0, 0x80, 0)).astype(np.uint8)
    del lo
    np.testing.assert_array_equal(nc, expect)
