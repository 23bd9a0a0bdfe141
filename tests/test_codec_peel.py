"""lhc count sketch and peeling against a straightforward reference.

The reference follows docs/PROTOCOL.md "Count sketch" and "Peeling" word
for word (one element at a time, per-cell count and XOR of ranks, FIFO
seeded in cell order), in plain Python integers.  The C code computes the
same things in batches, branch-free and vectorised; these tests pin that
down bit for bit: the sketch cells, the peeled values, which candidates
stall, and -EPROTO, also with sums that are inconsistent with the index
(where a different peeling order could give different values).  The
AVX-512, AVX2 and portable builds of the same calls must agree too.
"""

import errno
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from homagg._native import ffi, lib

from reference import DOM_SKETCH, GOLDEN, mix64_int, stream_key

pytestmark = pytest.mark.sanitize


def ref_cells(key, g, t):
    h = mix64_int(key + (g + 1) * GOLDEN)
    cells = [r * t + ((((h >> (21 * r)) & 0x1FFFFF) * t) >> 21) for r in range(3)]
    return cells, h >> 63


def ref_sketch(q, cand, key, g0, t):
    """Cells (uint32) of one block: q[i] is the quantised value of element i."""
    cells = [0] * (3 * t)
    for i in np.flatnonzero(q):
        c, neg = ref_cells(key, g0 + int(i), t)
        v = (-int(q[i]) if neg else int(q[i])) & 0xFFFFFFFF
        for k in c:
            cells[k] = (cells[k] + v) & 0xFFFFFFFF
    return cells


def ref_peel(cells, cand, key, g0, t, order="fifo"):
    """(values per candidate or None if unresolved) or -EPROTO.  order:
    "fifo" (the protocol's), "lifo" or "reverse" (FIFO seeded in reverse
    cell order): any order must give the same outcome."""
    cell = list(cells)
    n = len(cand)
    cnt = [0] * (3 * t)
    ids = [0] * (3 * t)
    cc, sign = [], []
    for j, pos in enumerate(cand):
        c, neg = ref_cells(key, g0 + pos, t)
        cc.append(c)
        sign.append(neg)
        for k in c:
            cnt[k] += 1
            ids[k] ^= j
    queue = [k for k in range(3 * t) if cnt[k] == 1]
    if order == "reverse":
        queue.reverse()
    val = [None] * n
    head = 0
    while head < len(queue):
        if order == "lifo":
            k = queue.pop()
        else:
            k = queue[head]
            head += 1
        if cnt[k] != 1:
            continue
        j = ids[k]
        v = cell[k]
        val[j] = (-v if sign[j] else v) & 0xFFFFFFFF
        for q in cc[j]:
            cell[q] = (cell[q] - v) & 0xFFFFFFFF
            cnt[q] -= 1
            ids[q] ^= j
            if cnt[q] == 1:
                queue.append(q)
    if any(cnt[k] == 0 and cell[k] != 0 for k in range(3 * t)):
        return -errno.EPROTO
    return val


def sketch_t(nc, cpc):
    if nc == 0:
        return 0
    if cpc > 0:
        return max(1, int(np.ceil(nc * np.float64(np.float32(cpc)) / 3.0)))
    return max(1, nc * 11 // 27 + 3 * math.isqrt(nc) // 5)


def buf(a):
    return ffi.from_buffer(a)


class Plan:
    """One worker (W = 1), every block bitmap-indexed: the candidates of a
    block are exactly its non-zero elements."""

    def __init__(self, x, block, cpc=0.0, seed=5, flags=0):
        self.x, self.block, self.cpc, self.seed = x, block, cpc, seed
        n = len(x)
        self.p = ffi.new(
            "struct hg_params *",
            dict(
                block=block,
                workers=1,
                worker=0,
                seed=seed,
                flags=flags,
                sketch_cells_per_candidate=cpc,
            ),
        )
        nb = (n + block - 1) // block
        self.codes = np.zeros(nb, np.int8)
        counts = np.full(nb, block, ">i4")  # declared full: bitmaps everywhere
        xp = ffi.cast("float *", buf(x))
        assert (
            lib.hg_exp_encode(self.p, xp, n, ffi.cast("int8_t *", buf(self.codes)), ffi.NULL) == 0
        )
        self.l = ffi.gc(
            lib.hg_lhc_create(
                self.p, n, ffi.cast("int8_t *", buf(self.codes)), ffi.cast("uint8_t *", buf(counts))
            ),
            lib.hg_lhc_destroy,
        )
        self.info = ffi.new("struct hg_lhc_info *")
        lib.hg_lhc_get_info(self.l, self.info)
        idx = np.zeros(self.info.index_bytes, np.uint8)
        assert lib.hg_lhc_index_encode(self.l, xp, ffi.cast("uint8_t *", buf(idx))) == 0
        assert lib.hg_lhc_set_index(self.l, ffi.cast("uint8_t *", buf(idx))) == 0
        lib.hg_lhc_get_info(self.l, self.info)
        self.cells = np.zeros(self.info.sketch_lanes, ">i4")
        assert lib.hg_lhc_sketch_encode(self.l, xp, ffi.cast("uint8_t *", buf(self.cells))) == 0
        # the same layout in Python
        self.blocks = []
        off = 0
        for b in range(nb):
            xb = x[b * block : (b + 1) * block]
            cand = [int(i) for i in np.flatnonzero(xb)]
            t = sketch_t(len(cand), cpc) if self.codes[b] != -128 else 0
            self.blocks.append((b * block, cand, t, off))
            off += 3 * t
        assert off == self.info.sketch_lanes

    def quantised(self, b):
        g0, cand, t, _ = self.blocks[b]
        xb = self.x[g0 : g0 + self.block].astype(np.float64)
        s = lib.hg_scale_shift(self.p, int(self.codes[b]))
        return np.round(xb * 2.0**s).astype(np.int64), s

    def peel(self, gcells):
        rc = lib.hg_lhc_peel(self.l, ffi.cast("uint8_t *", buf(gcells)))
        if rc:
            return rc
        lib.hg_lhc_get_info(self.l, self.info)
        fb = np.zeros(self.info.fallback_lanes, ">i4")
        y = np.empty(len(self.x), np.float32)
        assert (
            lib.hg_lhc_decode(self.l, ffi.cast("uint8_t *", buf(fb)), ffi.cast("float *", buf(y)))
            == 0
        )
        return y


def ref_result(plan, gcells):
    """Reference peel of every block: y (unresolved = 0) and the stall
    counts, or -EPROTO."""
    key = stream_key(plan.seed, DOM_SKETCH, 0)
    y = np.zeros(len(plan.x), np.float32)
    stalled = lanes = 0
    for b, (g0, cand, t, off) in enumerate(plan.blocks):
        if not cand:
            continue
        cells = [int(c) & 0xFFFFFFFF for c in gcells[off : off + 3 * t]]
        val = ref_peel(cells, cand, key, g0, t)
        if isinstance(val, int):
            return val, None
        s = lib.hg_scale_shift(plan.p, int(plan.codes[b]))
        unresolved = [v is None for v in val]
        stalled += any(unresolved)
        lanes += sum(unresolved)
        for pos, v in zip(cand, val):
            sv = 0 if v is None else (v - (1 << 32) if v >= 1 << 31 else v)
            y[g0 + pos] = np.float32(np.float64(sv) * 2.0**-s)
    return y, (stalled, lanes)


def make_x(rng, n, density):
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-8, 8, n))).astype(np.float32)
    x[rng.random(n) >= density] = 0
    return x


@pytest.mark.parametrize(
    "block,density,cpc",
    [
        (256, 0.3, 0.0),
        (1024, 0.05, 0.0),
        (1024, 0.2, 1.1),
        (64, 0.9, 1.2),
        (4096, 0.02, 0.0),
    ],
)
def test_sketch_cells_equal_reference(block, density, cpc):
    rng = np.random.default_rng(block + int(density * 100))
    x = make_x(rng, block * 3 - 17, density)  # a short last block: vector tail
    plan = Plan(x, block, cpc)
    key = stream_key(plan.seed, DOM_SKETCH, 0)
    for b, (g0, cand, t, off) in enumerate(plan.blocks):
        if not cand:
            continue
        q, _ = plan.quantised(b)
        want = ref_sketch(q, cand, key, g0, t)
        got = plan.cells[off : off + 3 * t].astype(np.int64) & 0xFFFFFFFF
        assert list(got) == want, f"block {b}"


@pytest.mark.parametrize(
    "block,density,cpc",
    [
        (256, 0.3, 0.0),
        (1024, 0.1, 1.15),
        (512, 0.2, 0.9),
        (64, 1.0, 1.3),
    ],
)
def test_peel_equals_reference_consistent_and_stalling(block, density, cpc):
    rng = np.random.default_rng(100 + block)
    x = make_x(rng, block * 6, density)
    plan = Plan(x, block, cpc)
    gcells = plan.cells.copy()
    want, stalls = ref_result(plan, gcells)
    got = plan.peel(gcells)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert (plan.info.stalled_blocks, plan.info.fallback_lanes) == stalls


def test_peel_equals_reference_on_inconsistent_sums():
    """Perturbed cells: either both report -EPROTO or both peel the same
    (wrong) values, the same stalls -- the order of peeling is the
    protocol's."""
    rng = np.random.default_rng(7)
    block = 256
    x = make_x(rng, block * 4, 0.25)
    plan = Plan(x, block, 1.2)
    outcomes = set()
    for trial in range(60):
        gcells = plan.cells.copy()
        k = rng.integers(len(gcells), size=int(rng.integers(1, 4)))
        gcells[k] = gcells[k] + rng.integers(1, 1000, len(k)).astype(np.int32)
        want, stalls = ref_result(plan, gcells)
        got = plan.peel(gcells)
        if isinstance(want, int):
            assert got == want, f"trial {trial}"
            outcomes.add("eproto")
        else:
            assert not isinstance(got, int), f"trial {trial}: C returned {got}"
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
            assert (plan.info.stalled_blocks, plan.info.fallback_lanes) == stalls
            outcomes.add("peeled")
    assert outcomes == {"eproto", "peeled"}  # both branches were exercised


def test_peel_outcome_is_order_free():
    """docs/PROTOCOL.md "Peeling": on consistent and perturbed sums, LIFO
    and reversed FIFO peeling give the FIFO's values, unresolved set and
    -EPROTO outcome block by block."""
    rng = np.random.default_rng(11)
    block = 256
    x = make_x(rng, block * 6, 0.3)
    plan = Plan(x, block, 1.3)
    key = stream_key(plan.seed, DOM_SKETCH, 0)
    seen = set()
    for trial in range(40):
        gcells = plan.cells.copy()
        if trial:
            k = rng.integers(len(gcells), size=int(rng.integers(1, 3)))
            gcells[k] = gcells[k] + rng.integers(1, 1000, len(k)).astype(np.int32)
        for g0, cand, t, off in plan.blocks:
            if not cand:
                continue
            cells = [int(c) & 0xFFFFFFFF for c in gcells[off : off + 3 * t]]
            want = ref_peel(cells, cand, key, g0, t)
            seen.add("eproto" if isinstance(want, int) else "stall" if None in want else "peeled")
            for order in ("lifo", "reverse"):
                assert ref_peel(cells, cand, key, g0, t, order) == want, (trial, order)
    assert seen == {"eproto", "stall", "peeled"}


# candidates per block around the widths of the vector paths (4 and 8
# cells per hash step, 32-position bitmap words) and the smallest tables
SMALL_COUNTS = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65)


def make_counts_x(rng, block, counts):
    """One block per count, with exactly that many non-zeros."""
    x = np.zeros(block * len(counts), np.float32)
    for b, c in enumerate(counts):
        pos = rng.choice(block, size=c, replace=False)
        x[b * block + pos] = make_x(rng, c, 1.0)
    return x


def ref_unresolved(plan, gcells):
    """Global element indices of the unresolved candidates, in block then
    position order (the fallback lanes' order)."""
    key = stream_key(plan.seed, DOM_SKETCH, 0)
    out = []
    for g0, cand, t, off in plan.blocks:
        if not cand:
            continue
        cells = [int(c) & 0xFFFFFFFF for c in gcells[off : off + 3 * t]]
        val = ref_peel(cells, cand, key, g0, t)
        out += [g0 + pos for pos, v in zip(cand, val) if v is None]
    return out


@pytest.mark.parametrize("cpc", [0.0, 0.8, 1.0, 1.23])
def test_peel_small_tables_values_and_fallback_order(cpc):
    """Blocks of 1 .. 65 candidates, with sizings that stall often: the
    peeled values, the stall counts and which candidates the fallback
    lanes carry, lane by lane, equal the reference."""
    rng = np.random.default_rng(int(cpc * 100) + 1)
    block = 128
    seen_stall = False
    for seed in range(4):
        x = make_counts_x(rng, block, SMALL_COUNTS)
        plan = Plan(x, block, cpc, seed=seed + 1)
        gcells = plan.cells.copy()
        want, stalls = ref_result(plan, gcells)
        got = plan.peel(gcells)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        assert (plan.info.stalled_blocks, plan.info.fallback_lanes) == stalls
        seen_stall |= stalls[0] > 0
        # fallback lane u carries the sum u + 1: decoded at the u-th
        # unresolved candidate of the reference, in its order
        unres = ref_unresolved(plan, gcells)
        assert len(unres) == plan.info.fallback_lanes
        fb = np.arange(1, len(unres) + 1, dtype=">i4")
        y = np.empty(len(x), np.float32)
        assert (
            lib.hg_lhc_decode(plan.l, ffi.cast("uint8_t *", buf(fb)), ffi.cast("float *", buf(y)))
            == 0
        )
        for u, g in enumerate(unres):
            s = lib.hg_scale_shift(plan.p, int(plan.codes[g // block]))
            assert y[g] == np.float32(np.float64(u + 1) * 2.0**-s), (seed, u, g)
    if cpc in (0.8, 1.0):
        assert seen_stall  # the fallback order was exercised


def test_peel_empty_table():
    """A tensor with no non-zero: no cells, nothing to peel, all +0."""
    x = np.zeros(3 * 64 + 5, np.float32)
    plan = Plan(x, 64)
    assert plan.info.sketch_lanes == 0 and plan.info.candidates == 0
    y = plan.peel(plan.cells)
    assert not isinstance(y, int)
    assert (plan.info.stalled_blocks, plan.info.fallback_lanes) == (0, 0)
    np.testing.assert_array_equal(y.view(np.uint32), np.zeros(len(x), np.uint32))


_ISA_SCRIPT = r"""
import hashlib, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from test_codec_peel import SMALL_COUNTS, Plan, make_counts_x, make_x
h = hashlib.sha256()
rng = np.random.default_rng(3)
for cpc in (0.8, 1.23):
    x = make_counts_x(rng, 128, SMALL_COUNTS)
    plan = Plan(x, 128, cpc)
    h.update(plan.cells.tobytes())
    r = plan.peel(plan.cells.copy())
    h.update(r.tobytes() + repr((plan.info.stalled_blocks, plan.info.fallback_lanes)).encode())
for block, n, density, cpc, flags in [(4096, 4096 * 3 - 40, 0.2, 0.0, 0), (256, 256 * 9, 0.5, 1.1, 0),
                                      (64, 64 * 30 - 3, 0.7, 1.2, 0), (1024, 1024 * 4, 0.1, 0.0, 1)]:
    x = make_x(rng, n, density)
    plan = Plan(x, block, cpc, flags=flags)
    h.update(plan.cells.tobytes())
    for trial in range(5):
        g = plan.cells.copy()
        if trial:
            g[rng.integers(len(g))] += 1
        r = plan.peel(g)
        h.update(repr(r).encode() if isinstance(r, int) else r.tobytes())
sys.stdout.write(h.hexdigest())
"""


def test_vector_and_portable_paths_identical(tmp_path):
    script = tmp_path / "isa.py"
    script.write_text(_ISA_SCRIPT)
    here = os.path.dirname(os.path.abspath(__file__))
    outs = []
    for isa in (None, "avx2", "portable"):
        env = dict(os.environ)
        env.pop("HOMAGG_CODEC_ISA", None)
        if isa:
            env["HOMAGG_CODEC_ISA"] = isa
        r = subprocess.run(
            [sys.executable, str(script), here],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout)
    assert outs[0] and outs[0] == outs[1] == outs[2]
