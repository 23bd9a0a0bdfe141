"""Every ISA path of the codec gives the portable path's bits.

HOMAGG_CODEC_ISA=portable|avx2|avx512 forces the path of every hot loop
(read once per process; helpers.codec_isa sets it and has the library read
it again).  For random gradients (hypothesis: workers, block, the last
block's length 1, 31, 32, 33 or 257 for the vector loops' tails, density,
layout, rounding) each path must produce, byte for byte, what the portable
path produces: the one-pass scan (codes, counts, index bytes), the sketch
cells, the union values, the candidates set_index finds (Bloom probing
included), the peel and both decodes.  The candidates are also checked
against the numpy implementation of the protocol's index (Bloom probes
included), and the results against the numpy oracle.
"""

import errno
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import reference as ref
from helpers import CODEC_ISAS, RUNNABLE_ISAS, codec_isa, codec_isa_env
from homagg import codec
from homagg.bench import numpy_codec as npc
from homagg.bindings import codec as b
from homagg.errors import InvalidArgument
from helpers import make_grads

pytestmark = pytest.mark.sanitize

VECTOR_ISAS = tuple(i for i in RUNNABLE_ISAS if i != "portable")
TAILS = (0, 1, 31, 32, 33, 257)


def _agg(op, parts, empty_dtype):
    got = codec.aggregate(op, None, parts)
    return np.zeros(0, dtype=empty_dtype) if got is None else got


def pipeline(grads, block, stochastic=False, seed=0, cpc=0.0, cost=None):
    """Every codec output of one lhc and one union allreduce, as bytes, in
    this process's current ISA path (C kernels for the sums); cost: the
    job's cost model (None: the bytes rules)."""
    W, n = len(grads), grads[0].size
    params = codec.Params(
        block_elements=block,
        workers=W,
        seed=seed,
        stochastic=stochastic,
        sketch_cells_per_candidate=cpc,
        cost=cost,
    )
    cps = [params.c(w) for w in range(W)]
    out = {}
    scans, codes, counts = [], [], []
    for w in range(W):
        s, c, k = b.scan_encode(cps[w], grads[w])
        scans.append(s)
        codes.append(c)
        counts.append(k)
        out[f"scan{w}"] = c.tobytes() + k.tobytes()
        # the tensor-reading meta pass (its own AVX2 loop)
        c2, k2 = b.exp_nnz_encode(cps[w], grads[w])
        out[f"meta{w}"] = c2.tobytes() + k2.tobytes()
    gcodes = _agg("max8", codes, np.int8)
    gcounts = _agg("sum32", counts, ">i4")
    plans = [b.lhc_create(cps[w], n, gcodes, gcounts) for w in range(W)]
    idx = [b.lhc_index_encode_scan(plans[w], scans[w]) for w in range(W)]
    for w in range(W):
        out[f"index{w}"] = idx[w].tobytes()
        out[f"index_x{w}"] = b.lhc_index_encode(plans[w], grads[w]).tobytes()
    gindex = _agg("or", idx, np.uint8)
    for pl in plans:
        b.lhc_set_index(pl, gindex)
    info = plans[0].info()
    out["info_indexed"] = repr(sorted(info.items())).encode()
    # the candidates: decode ranks 1..C, so candidate j holds j + 1
    lanes = b.union_lanes(plans[0])
    ranks = np.arange(1, lanes + 1, dtype=">i4")
    probe = b.union_decode(plans[0], ranks)
    out["candidates"] = np.flatnonzero(probe).tobytes()
    out["candidate_ranks"] = probe.tobytes()
    with np.errstate(over="ignore"):
        cells = [b.lhc_sketch_encode_scan(plans[w], scans[w]) for w in range(W)]
        for w in range(W):
            out[f"cells{w}"] = cells[w].tobytes()
            out[f"cells_x{w}"] = b.lhc_sketch_encode(plans[w], grads[w]).tobytes()
        gcells = _agg("sum32", cells, ">i4")
        uvals = [b.union_encode(plans[w], scans[w]) for w in range(W)]
        for w in range(W):
            out[f"union{w}"] = uvals[w].tobytes()
        gvals = _agg("sum32", uvals, ">i4")
        for pl in plans:
            b.lhc_peel(pl, gcells)
        info = plans[0].info()
        out["info_peeled"] = repr(sorted(info.items())).encode()
        fall = [b.lhc_fallback_encode(plans[w], grads[w]) for w in range(W)]
        gfall = codec.aggregate("sum32", np.zeros(info["fallback_lanes"], dtype=">i4"), fall)
        out["lhc_sum"] = b.lhc_decode(plans[0], gfall).tobytes()
        out["union_sum"] = b.union_decode(plans[0], gvals).tobytes()
        # quantise / dequantise (their own AVX2 loops)
        q = b.quantize(cps[0], grads[0], gcodes)
        out["quant"] = q.tobytes()
        out["dequant"] = b.dequantize(cps[0], q, n, gcodes).tobytes()
    return out, gcodes, gcounts, gindex, info


def _compare(grads, block, **kw):
    with codec_isa("portable"):
        want, gcodes, gcounts, gindex, info = pipeline(grads, block, **kw)
    for isa in VECTOR_ISAS:
        with codec_isa(isa):
            got, _, _, _, _ = pipeline(grads, block, **kw)
        for k in want:
            assert got[k] == want[k], f"{isa}: {k} differs from the portable path"
    return want, gcodes, gcounts, gindex, info


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workers=st.sampled_from([1, 2, 3, 5]),
    block=st.sampled_from([64, 320, 1024, 4096]),
    full=st.integers(0, 3),
    tail=st.sampled_from(TAILS),
    density=st.sampled_from([0.001, 0.005, 0.02, 0.1, 0.5, 1.0]),
    positions=st.sampled_from(["independent", "shared", "clustered"]),
    stochastic=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    split=st.booleans(),
)
def test_every_path_gives_the_portable_bits(
    workers, block, full, tail, density, positions, stochastic, seed, split
):
    """split: a cost model under which every indexed block takes a
    split-block filter (version 3), else the bytes rules."""
    assume(tail < block and full * block + tail > 0)
    n = full * block + tail
    rng = np.random.default_rng(seed)
    grads = make_grads(rng, workers, n, density, positions)
    cost = SPLIT_COST if split else None
    want, gcodes, gcounts, gindex, info = _compare(
        grads, block, stochastic=stochastic, seed=seed, cost=cost
    )
    # the candidates are the protocol's (numpy, Bloom probes included) ...
    if split:
        plan = _split_plan(n, block, gcodes, gcounts.astype(np.int64), workers)
        assert info["split_blocks"] == len(plan)
    else:
        plan = npc.index_plan(n, block, gcodes, gcounts.astype(np.int64))
    cand = npc.candidates(gindex, plan, seed)
    assert np.frombuffer(want["candidates"], dtype=np.int64).tolist() == cand.tolist()
    # ... and the sums exact
    if not stochastic:
        with np.errstate(over="ignore"):
            expect = ref.allreduce(grads, block)
        assert want["union_sum"] == expect.tobytes()
        assert want["lhc_sum"] == expect.tobytes()


@pytest.mark.parametrize("tail", TAILS)
def test_bloom_blocks_and_stalls_on_every_path(tail):
    """Low density: Bloom blocks (set_index probes every element); a forced
    small sketch: stalled blocks, the fallback and the peel's every branch."""
    rng = np.random.default_rng(100 + tail)
    block = 4096
    n = 3 * block + tail
    grads = make_grads(rng, 4, n, 0.002)
    _, _, _, _, info = _compare(grads, block)
    assert info["bloom_blocks"] >= 3
    _, _, _, _, info = _compare(grads, block, cpc=1.0)
    assert info["stalled_blocks"] > 0 and info["fallback_lanes"] > 0


def test_bad_isa_is_refused_by_name():
    with codec_isa_env("sse9"):
        with pytest.raises(
            InvalidArgument, match="HOMAGG_CODEC_ISA='sse9'.*portable, avx2, avx512"
        ):
            b.codec_isa_reload()
        # every codec entry point refuses while it is set
        with pytest.raises(InvalidArgument, match="HOMAGG_CODEC_ISA"):
            b.params_new(block=64)
        from homagg._native import ffi, lib

        p = ffi.new("struct hg_params *", dict(block=64, workers=1, worker=0))
        assert lib.hg_params_check(p) == -errno.EINVAL
        assert lib.hg_codec_isa() == -errno.EINVAL
    assert b.codec_isa() in CODEC_ISAS


@pytest.mark.parametrize("isa", CODEC_ISAS)
def test_variable_is_read_at_start(isa):
    """A new process takes the path the variable names, without a reload."""
    with codec_isa(isa):  # skips where this CPU lacks the path
        pass
    env = dict(os.environ, HOMAGG_CODEC_ISA=isa)
    r = subprocess.run(
        [sys.executable, "-c", "from homagg.bindings import codec as b; print(b.codec_isa())"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == isa


@pytest.mark.parametrize("tail", (8, 24, 40, 56, 64 + 24))
def test_scan_and_bitmap_candidates_at_vector_tails(tail):
    """The AVX2 scan does two 8-element vectors a step and one alone at the
    end of a block of 8 k elements with k odd; the AVX2 bitmap candidate
    list does whole 64-bit words and leaves a short last block's rest to
    the scalar loop.  Dense gradients (bitmap blocks), a last block of
    every such shape: each path's bits are the portable path's, the
    candidates the numpy index's, the sums the oracle's."""
    rng = np.random.default_rng(300 + tail)
    block = 128
    n = 2 * block + tail
    grads = make_grads(rng, 3, n, 0.4)
    want, gcodes, gcounts, gindex, info = _compare(grads, block)
    assert info["bitmap_blocks"] == 3 and info["bloom_blocks"] == 0
    plan = npc.index_plan(n, block, gcodes, gcounts.astype(np.int64))
    cand = npc.candidates(gindex, plan, 0)
    assert np.frombuffer(want["candidates"], dtype=np.int64).tolist() == cand.tolist()
    nz = np.flatnonzero(np.any(np.stack(grads) != 0, axis=0))
    assert cand.tolist() == nz.tolist()
    with np.errstate(over="ignore"):
        expect = ref.allreduce(grads, block)
    assert want["union_sum"] == expect.tobytes()
    assert want["lhc_sum"] == expect.tobytes()


@pytest.mark.parametrize("magnitude", [3e38, 1e37, 1e-30, 1e-38, 1e-44])
def test_blocks_at_the_ends_of_float32_s_range_give_the_portable_bits(magnitude):
    """A block whose largest value is near float32's largest or in its
    subnormals: its scale is outside the range where the vector paths'
    float32 quantisation (sketch values, union values, dense) and the
    decoders' float32 scaling give the float64 bits, so they take their
    float64 code there and the float32 one in the other blocks; both give
    the portable bits."""
    rng = np.random.default_rng(5)
    block = 1024
    grads = make_grads(rng, 3, 4 * block + 33, 0.05)
    for g in grads:
        head = g[:block].astype(np.float64)
        g[:block] = (head / np.abs(head).max() * magnitude).astype(np.float32)
    assert all(np.count_nonzero(g[:block]) for g in grads)
    with np.errstate(all="ignore"):
        _compare(grads, block)


@pytest.mark.parametrize("isa", CODEC_ISAS)
@pytest.mark.parametrize("method", ["dense", "blocks", "lhc", "union", "auto", "nc"])
def test_a_divisor_gives_numpys_division_of_the_sum_on_every_path(isa, method):
    """hg_params.divisor d: every decoder writes sum / np.float32(d) bit for
    bit (d = 3: a true division; 4 and 0.5: powers of two, a multiply),
    in blocks whose results reach the subnormals, at a vector tail, with
    Bloom blocks, and with a forced small sketch (lhc's stalls and fallback
    lanes); d = 0 and 1 leave the sum; a divisor not finite and positive is
    refused."""
    rng = np.random.default_rng(7)
    block = 1024
    n = 5 * block + 33
    grads = make_grads(rng, 3, n, 0.05)
    for g in grads:  # a block of tiny values: subnormal results
        g[:block] *= np.float32(1e-37)
    grads[1][block : 2 * block] = 0  # another mostly empty
    grads[2][2 * block : 3 * block] *= np.float32(0.003)
    cases = [{}, {"sketch_cells_per_candidate": 1.0}] if method == "lhc" else [{}]
    with codec_isa(isa):
        for kw in cases:
            plain = codec.simulate_allreduce(grads, method, seed=3, block_elements=block, **kw)
            if kw:
                assert plain.stats["fallback_lanes"] > 0
            with np.errstate(under="ignore"):
                for d in (3.0, 4.0, 0.5):
                    got = codec.simulate_allreduce(
                        grads, method, seed=3, block_elements=block, divisor=d, **kw
                    )
                    want = plain.sum / np.float32(d)
                    assert got.sum.tobytes() == want.tobytes(), (d, kw)
            sub = np.abs(plain.sum[:block] / np.float32(3))
            assert method == "nc" or np.any((sub > 0) & (sub < np.finfo(np.float32).tiny))
            for d in (0.0, 1.0):
                same = codec.simulate_allreduce(
                    grads, method, seed=3, block_elements=block, divisor=d, **kw
                )
                assert same.sum.tobytes() == plain.sum.tobytes()
    for bad in (-1.0, float("nan"), float("inf"), 1e-40):
        with pytest.raises(Exception, match="hg_params_check|divisor"):
            codec.Params(workers=2, divisor=bad)


def _bloom_gradient(per_block, block, tail, rng):
    """float32 of len(per_block) blocks plus ``tail`` elements, block i
    holding per_block[i] non-zeros at random places (the tail max(1,
    tail // 200))."""
    n = len(per_block) * block + tail
    x = np.zeros(n, dtype=np.float32)
    for blk, c in enumerate(tuple(per_block) + (max(1, tail // 200),)):
        start = blk * block
        pos = rng.choice(min(block, n - start), size=c, replace=False)
        x[start + pos] = rng.standard_normal(c).astype(np.float32) + 2
    return x


def _index_fills(own, rng):
    """A summed index that is the worker's own, every bit set, none, random."""
    return {
        "own": own,
        "ones": np.full_like(own, 0xFF),
        "zeros": np.zeros_like(own),
        "random": rng.integers(0, 256, own.size, dtype=np.uint8),
    }


def _assert_candidates_on_every_path(cp, n, gcodes, gcounts, gindex, want, name):
    """set_index + union_decode on every ISA path lists ``want``."""
    for isa in RUNNABLE_ISAS:
        with codec_isa(isa):
            pl = b.lhc_create(cp, n, gcodes, gcounts)
            b.lhc_set_index(pl, gindex)
            lanes = b.union_lanes(pl)
            got = np.flatnonzero(b.union_decode(pl, np.arange(1, lanes + 1, dtype=">i4")))
            assert got.tolist() == want.tolist(), f"{isa}, {name} index"


@pytest.mark.parametrize("tail", (17, 1023, 1024, 1025, 1047, 1056, 1072, 4095))
def test_bloom_probing_at_vector_tails_and_filter_sizes(tail):
    """set_index's Bloom probing on every path against the numpy index:
    filters of 1 to 4 segments of 1024 bits (the AVX-512 path's registers)
    and larger (gathered), 16 and 8 element vectors and their tails, chunks
    of 1024 elements, a last chunk of 16, 32 or 48 elements (the AVX-512
    path probes two vectors of 16 a step: one alone, a pair, a pair and
    one; with every bit set as many survivors in stage 2), and a summed
    index that is this worker's own, every bit set (every element passes
    every probe), no bit set (none passes) or random bits."""
    block = 16384
    per_block = (20, 80, 150, 230, 300, 600)
    rng = np.random.default_rng(500 + tail)
    x = _bloom_gradient(per_block, block, tail, rng)
    n = x.size
    params = codec.Params(block_elements=block, workers=1, seed=9)
    cp = params.c(0)
    scan, gcodes, gcounts = b.scan_encode(cp, x)
    plan = npc.index_plan(n, block, gcodes, gcounts.astype(np.int64))
    blooms = [p for p in plan if p[2] == "bloom"]
    # every block Bloom; a last block of 17 elements keeps a bitmap
    assert len(blooms) == len(plan) - (tail < 1000)
    nseg = sorted({-(-bits // 1024) for _, _, _, bits, _, _ in blooms})
    assert nseg[:4] == [1, 2, 3, 4] and nseg[-1] > 4
    own = np.asarray(b.lhc_index_encode_scan(b.lhc_create(cp, n, gcodes, gcounts), scan))
    fills = _index_fills(own, rng)
    for name, gindex in fills.items():
        want = npc.candidates(gindex, plan, 9)
        if name == "ones":
            assert want.size == n
        if name == "zeros":
            assert want.size == 0
        _assert_candidates_on_every_path(cp, n, gcodes, gcounts, gindex, want, name)


@pytest.mark.parametrize("tail", (1, 7, 9, 4095))
def test_bloom_probing_in_avx2_register_segments(tail):
    """The AVX2 path reads filters of up to 6 segments of 256 bits from
    registers (vpermd and a tree of blends on the segment) and gathers
    larger ones: filters of 64 bits, exactly 1, 2, 3 and 4 segments, 5,
    1344 bits (NCF's bucket at W = 4), exactly 6 (the largest in registers)
    and 1600 bits (the smallest gathered), and a last Bloom block of 4095
    elements (7 left to the portable loop), each checked on every path against the numpy
    index for the worker's own index, all bits set, none and random bits."""
    block = 4096
    per_block = (2, 10, 13, 25, 45, 61, 77, 81, 93, 97)
    want_bits = [64, 256, 320, 512, 768, 1024, 1280, 1344, 1536, 1600]
    rng = np.random.default_rng(700 + tail)
    x = _bloom_gradient(per_block, block, tail, rng)
    n = x.size
    params = codec.Params(block_elements=block, workers=1, seed=11)
    cp = params.c(0)
    scan, gcodes, gcounts = b.scan_encode(cp, x)
    plan = npc.index_plan(n, block, gcodes, gcounts.astype(np.int64))
    # a short last block keeps a bitmap, one of 4095 elements is Bloom
    assert [p[2] for p in plan] == ["bloom"] * len(per_block) + [
        "bloom" if tail > 1000 else "bitmap"
    ]
    assert [p[3] for p in plan[: len(per_block)]] == want_bits
    own = np.asarray(b.lhc_index_encode_scan(b.lhc_create(cp, n, gcodes, gcounts), scan))
    fills = _index_fills(own, rng)
    for name, gindex in fills.items():
        want = npc.candidates(gindex, plan, 11)
        if name == "own":
            assert want.size > np.count_nonzero(x)
        _assert_candidates_on_every_path(cp, n, gcodes, gcounts, gindex, want, name)


# a model under which every block with an index takes a split-block option
# (the bitmap and the other Bloom options dear, bytes nearly free)
SPLIT_COST = dict(
    link_mbit=1_000_000,
    rtt_ns=0,
    payload_bytes=1024,
    pkt_ps=0,
    agg_pkt_ps=0,
    value_ps=0,
    lane_ps=0,
    bitmap_ps=1_000_000,
    probe_ps=1_000_000,
    sbbf_ps=1,
)


def _split_plan(n, block, gcodes, gcounts, workers=1):
    """The numpy plan of a split-block index: each block's choice from the
    cost model written from the page (tests/cost_model.py)."""
    import cost_model as M

    plan, off = [], 0
    for bi, length in enumerate(M.block_lens(n, block)):
        if gcodes[bi] == -128:
            continue
        kind, nbytes, _ = M.plan_block(length, int(gcounts[bi]), workers, SPLIT_COST)
        plan.append((bi * block, length, kind, 8 * nbytes, 8 if kind != "bitmap" else 0, off))
        off += nbytes
    return plan


@pytest.mark.parametrize("tail", (1, 9, 17, 4095))
def test_split_block_probing_on_every_path(tail):
    """set_index's split-block probing on every path against the numpy
    index: filters of 1, 2 and 6 blocks of 256 bits (the AVX2 path's one
    register set, the AVX-512 path's one), 13 (two AVX2 sets), 19 and 32
    (three and four AVX2 sets, the AVX-512 path's two) and 33 and 71 (one
    load per element), vectors of 16 and 8 and their tails, for the
    worker's own index, all bits set, none and random bits; and the
    worker's index bytes are the numpy encoder's."""
    block = 16384
    per_block = (3, 20, 60, 200, 300, 500, 700, 1500)
    rng = np.random.default_rng(900 + tail)
    x = _bloom_gradient(per_block, block, tail, rng)
    n = x.size
    params = codec.Params(block_elements=block, workers=1, seed=13, cost=SPLIT_COST)
    cp = params.c(0)
    scan, gcodes, gcounts = b.scan_encode(cp, x)
    plan = _split_plan(n, block, gcodes, gcounts.astype(np.int64))
    splits = [p for p in plan if p[2] == "split"]
    assert len(splits) == len(plan) == len(per_block) + 1  # the tail too
    nblk = sorted({bits // 256 for _, _, _, bits, _, _ in splits})
    assert nblk[0] <= 8 and nblk[-1] > 32
    for lo, hi in ((8, 16), (16, 24), (24, 32)):  # every AVX2 register set count
        assert any(lo < v <= hi for v in nblk), (lo, nblk)
    pl = b.lhc_create(cp, n, gcodes, gcounts)
    assert b.lhc_get_info(pl)["split_blocks"] == len(splits)
    own = np.asarray(b.lhc_index_encode_scan(pl, scan))
    np.testing.assert_array_equal(own, npc.index_encode(x, plan, 13))
    for isa in RUNNABLE_ISAS:  # the scan's index, and the plain encoder's
        with codec_isa(isa):
            p2 = b.lhc_create(cp, n, gcodes, gcounts)
            assert np.asarray(b.lhc_index_encode(p2, x)).tobytes() == own.tobytes(), isa
    fills = _index_fills(own, rng)
    for name, gindex in fills.items():
        want = npc.candidates(gindex, plan, 13)
        if name == "own":  # every non-zero, and false positives
            assert set(np.flatnonzero(x)) <= set(want.tolist())
        if name == "ones":
            assert want.size == n
        if name == "zeros":
            assert want.size == 0
        _assert_candidates_on_every_path(cp, n, gcodes, gcounts, gindex, want, name)
