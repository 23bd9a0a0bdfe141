"""A plain numpy implementation of the lhc and union encode and decode (the
baseline ``homagg bench codec`` compares the C codec with).

It follows docs/PROTOCOL.md step by step, written for reading, not speed:
block exponents and non-zero counts, an index per block (a bitmap, or the
Bloom filter the protocol's integer rule picks from the global counts when
they are given; without them every block has a bitmap), the count sketch
(3 cells and a sign per element from the protocol's splitmix64 hash, k = 3
sub-tables of t cells, t from the default sizing rule), and peeling,
vectorised over all blocks one round at a time.  Peeling keeps a sum of
candidate ids per cell instead of an XOR (same information for a cell with
one candidate left).
"""

import numpy as np

GOLDEN = 0x9E3779B97F4A7C15
DOM_ROUND = 0x524F554E44000001
DOM_SKETCH = 0x534B455443480003
DOM_BLOOM = 0x424C4F4F4D000004
# Bloom options (docs/PROTOCOL.md "Index"): bits per counted element,
# probes, expected false-positive rate scaled by 2^20; 40 sketch bits are
# charged per expected false positive.
BLOOM_OPTS = ((8, 6, 22625), (12, 8, 3295), (16, 8, 602), (20, 8, 146), (24, 8, 44))
FP_COST_BITS = 40
_M64 = 2**64 - 1


def mix64(z):
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic)."""
    z = np.asarray(z, dtype=np.uint64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _mix64_int(z):
    return int(mix64(np.array([z & _M64], dtype=np.uint64))[0])


def stream_key(seed, domain, worker):
    return _mix64_int(_mix64_int((seed + domain) & _M64) + worker)


def element_hash(key, g):
    """hash(key, g) = mix64(key + (g + 1) * GOLDEN) for global indices g."""
    g = np.asarray(g, dtype=np.uint64)
    return mix64(np.uint64(key) + (g + np.uint64(1)) * np.uint64(GOLDEN))


def sketch_t(ncand):
    """T(N) = max(1, floor(11 N / 27) + floor(3 isqrt(N) / 5)) (0 for N = 0):
    3t cells, ~1.22 per candidate plus a margin that minimises the expected
    sketch and fallback bytes."""
    ncand = np.asarray(ncand, dtype=np.int64)
    isqrt = np.floor(np.sqrt(ncand)).astype(np.int64)  # exact for N <= 2^16
    t = np.maximum(1, ncand * 11 // 27 + 3 * isqrt // 5)
    return np.where(ncand == 0, 0, t)


def plan_index(length, count):
    """The index of a block of length elements with count global non-zeros:
    ("bitmap", bits, 0) or ("bloom", bits, k), whichever costs the fewest
    bits (a Bloom filter charged for its expected false positives)."""
    c = min(int(count), length)
    best = 8 * ((length + 7) // 8)
    kind = ("bitmap", best, 0)
    for bpe, k, fp in BLOOM_OPTS:
        bits = (bpe * c + 63) // 64 * 64 or 64
        cost = bits + ((fp * (length - c) * FP_COST_BITS) >> 20)
        if cost < best:
            best, kind = cost, ("bloom", bits, k)
    return kind


def bloom_probes(key, g, k, bits):
    """The k probe positions (int64 arrays) of elements g: 21-bit fields of
    the chain w0 = hash(key, g), w(j+1) = mix64(w(j) + GOLDEN), probe i from
    field i mod 3 of word i // 3, times bits, >> 21."""
    w = element_hash(key, g)
    out = []
    for i in range(k):
        if i and i % 3 == 0:
            w = mix64(w + np.uint64(GOLDEN))
        f = (w >> np.uint64(21 * (i % 3))) & np.uint64(0x1FFFFF)
        out.append(((f * np.uint64(bits)) >> np.uint64(21)).astype(np.int64))
    return out


def fmix32(h):
    """MurmurHash3's 32-bit finaliser of a uint32 array."""
    h = h.astype(np.uint32)
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def split_probes(key, g, bits):
    """The eight bit positions (int64 arrays) of elements g in a split-block
    filter of ``bits`` bits (docs/PROTOCOL.md "Split-block Bloom options"):
    block (h1 * nblk) >> 32, in word w the 5-bit field w of h2 (w < 6) or
    w - 6 of h1."""
    key = int(key)
    ka, kb = np.uint32(key & 0xFFFFFFFF), np.uint32(key >> 32)
    g = np.asarray(g, dtype=np.uint64)
    with np.errstate(over="ignore"):
        s = fmix32((g >> np.uint64(32)).astype(np.uint32) ^ kb)
        h1 = fmix32(((g & np.uint64(0xFFFFFFFF)).astype(np.uint32) + ka) ^ s)
        h2 = fmix32(h1 ^ kb)
    blk = (h1.astype(np.uint64) * np.uint64(bits // 256)) >> np.uint64(32)
    base = blk.astype(np.int64) * 256
    out = []
    for w in range(8):
        f = (h2 >> np.uint32(5 * w)) if w < 6 else (h1 >> np.uint32(5 * (w - 6)))
        out.append(base + 32 * w + (f & np.uint32(31)).astype(np.int64))
    return out


def index_probes(kind, key, g, k, bits):
    """The probe positions of a Bloom ("bloom") or split-block ("split") block."""
    return split_probes(key, g, bits) if kind == "split" else bloom_probes(key, g, k, bits)


def log2_ceil(w):
    return int(w - 1).bit_length()


# ---- encode (one worker) -----------------------------------------------------


def exponent_codes(x, block):
    m = np.abs(x).reshape(-1, block).max(axis=1).astype(np.float64)
    _, e = np.frexp(m)
    codes = np.clip(e, -126, 128) - 1
    return np.where(m == 0, -128, codes).astype(np.int8)


def nnz_counts(x, block):
    return np.count_nonzero(x.reshape(-1, block), axis=1).astype(np.int64)


def bitmap_index(x, block):
    """One bit per element, LSB first, block after block."""
    return np.packbits(x != 0, bitorder="little")


def scale_shifts(gcodes, workers):
    s = 30 - log2_ceil(workers) - (gcodes.astype(np.int64) + 1)
    return np.where(gcodes == -128, 0, s)


def index_plan(n, block, gcodes, gcounts=None):
    """Per block (start, length, kind, bits, k, byte offset) for the blocks
    with an index (not zero on every worker): the protocol's choice from the
    global counts, or a bitmap for every block when they are not given."""
    plan, off = [], 0
    for b in range(-(-n // block)):
        length = min(block, n - b * block)
        if gcodes[b] == -128:
            continue
        kind, bits, k = (
            ("bitmap", 8 * ((length + 7) // 8), 0)
            if gcounts is None
            else plan_index(length, gcounts[b])
        )
        plan.append((b * block, length, kind, bits, k, off))
        off += bits // 8
    return plan


def index_encode(x, plan, seed=0):
    """This worker's index bytes under the plan: the bits of its non-zeros."""
    key = stream_key(seed, DOM_BLOOM, 0)
    parts = []
    for start, length, kind, bits, k, _ in plan:
        nz = np.flatnonzero(x[start : start + length])
        if kind == "bitmap":
            parts.append(np.packbits(x[start : start + length] != 0, bitorder="little"))
            continue
        bset = np.zeros(bits, dtype=bool)
        for p in index_probes(kind, key, (start + nz).astype(np.uint64), k, bits):
            bset[p] = True
        parts.append(np.packbits(bset, bitorder="little"))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)


def candidates(gindex, plan, seed=0):
    """The global candidates (ascending element indices) the summed index
    names: a bitmap's set bits, a Bloom (or split-block) filter's elements
    whose probes all hit."""
    key = stream_key(seed, DOM_BLOOM, 0)
    out = []
    for start, length, kind, bits, k, off in plan:
        have = np.unpackbits(gindex[off : off + bits // 8], bitorder="little")
        if kind == "bitmap":
            out.append(start + np.flatnonzero(have[:length]))
            continue
        ok = np.ones(length, dtype=bool)
        for p in index_probes(
            kind, key, np.arange(start, start + length, dtype=np.uint64), k, bits
        ):
            ok &= have[p] == 1
        out.append(start + np.flatnonzero(ok))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


class Layout:
    """What every worker derives from the OR of the indices (and, with
    gcounts, the index kind of each block)."""

    def __init__(self, gindex, n, block, gcodes, workers, seed, gcounts=None):
        self.n, self.block, self.workers = n, block, workers
        self.plan = index_plan(n, block, gcodes, gcounts)
        self.cand = candidates(np.asarray(gindex, dtype=np.uint8), self.plan, seed)
        self.shift = scale_shifts(gcodes, workers)
        nb = -(-n // block)
        per_block = np.bincount(self.cand // block, minlength=nb)
        self.t = sketch_t(per_block)
        self.cell_off = np.concatenate([[0], np.cumsum(3 * self.t)])
        self.lanes = int(self.cell_off[-1])
        self.key = stream_key(seed, DOM_SKETCH, 0)

    def cells_of(self, g):
        """The 3 global cell numbers and the sign (+-1) of elements g."""
        h = element_hash(self.key, g)
        b = g // self.block
        t = self.t[b].astype(np.uint64)
        cells = np.empty((g.size, 3), dtype=np.int64)
        for r in range(3):
            slot = ((h >> np.uint64(21 * r)) & np.uint64(0x1FFFFF)) * t >> np.uint64(21)
            cells[:, r] = self.cell_off[b] + r * self.t[b] + slot.astype(np.int64)
        sign = np.where(h >> np.uint64(63), -1, 1)
        return cells, sign


def quantize_at(x, g, layout):
    """round_half_even(x[g] * 2^s) as int64."""
    s = layout.shift[g // layout.block]
    return np.rint(np.ldexp(x[g].astype(np.float64), s)).astype(np.int64)


def sketch_encode(x, layout):
    """This worker's count sketch: int32 cells (wrapping)."""
    g = np.flatnonzero(x)
    q = quantize_at(x, g, layout)
    cells, sign = layout.cells_of(g)
    acc = np.zeros(layout.lanes, dtype=np.int64)
    for r in range(3):
        acc += np.bincount(
            cells[:, r], weights=(sign * q).astype(np.float64), minlength=layout.lanes
        ).astype(np.int64)
    return ((acc + 2**31) % 2**32 - 2**31).astype(np.int32)


def encode(x, block, workers, gcodes=None, gindex=None, seed=0, gcounts=None):
    """All of one worker's lhc encode: exponents, counts, index, sketch.

    The index and sketch need the global codes, counts and index (from the
    first phases); when they are not given, this worker's own are used."""
    codes = exponent_codes(x, block)
    counts = nnz_counts(x, block)
    gc = codes if gcodes is None else gcodes
    index = index_encode(
        x, index_plan(x.size, block, gc, counts if gcounts is None else gcounts), seed
    )
    layout = Layout(
        index if gindex is None else gindex,
        x.size,
        block,
        gc,
        workers,
        seed,
        counts if gcounts is None else gcounts,
    )
    return codes, counts, index, sketch_encode(x, layout), layout


# ---- decode (every worker) ------------------------------------------------------


def peel(gcells, layout):
    """Peels the summed sketch; returns (values int64, resolved bool)."""
    cand = layout.cand
    k = cand.size
    cells, sign = layout.cells_of(cand)
    val = gcells.astype(np.int64)
    cnt = np.zeros(layout.lanes, dtype=np.int64)
    ids = np.zeros(layout.lanes, dtype=np.int64)  # sum of candidate numbers
    for r in range(3):
        cnt += np.bincount(cells[:, r], minlength=layout.lanes)
        ids += np.bincount(
            cells[:, r], weights=np.arange(k, dtype=np.float64), minlength=layout.lanes
        ).astype(np.int64)
    values = np.zeros(k, dtype=np.int64)
    done = np.zeros(k, dtype=bool)
    while True:
        pure = np.flatnonzero(cnt == 1)
        if pure.size == 0:
            break
        j, first = np.unique(ids[pure], return_index=True)
        pure = pure[first]
        v = sign[j] * val[pure]
        v = (v + 2**31) % 2**32 - 2**31  # the int32 value, modulo 2^32
        values[j] = v
        done[j] = True
        for r in range(3):
            c = cells[j, r]
            np.subtract.at(val, c, sign[j] * v)
            np.subtract.at(cnt, c, 1)
            np.subtract.at(ids, c, j)
    return values, done


def decode(gcells, layout, fallback=None):
    """The float32 result: peel, take the unresolved candidates' sums from
    ``fallback`` (int64 values of the unresolved candidates, in order), and
    scale back."""
    values, done = peel(gcells, layout)
    if not done.all():
        if fallback is None:
            raise ValueError(f"{int((~done).sum())} candidates need the fallback")
        values[~done] = fallback
    s = layout.shift[layout.cand // layout.block]
    y = np.zeros(layout.n, dtype=np.float32)
    y[layout.cand] = np.ldexp(values.astype(np.float64), -s).astype(np.float32)
    return y


# ---- union (docs/PROTOCOL.md "union") -------------------------------------------


def union_encode(x, layout):
    """This worker's union lanes: its quantised value at every candidate
    (0 where it has none), int64, in candidate order."""
    return quantize_at(x, layout.cand, layout)


def union_decode(gvals, layout):
    """The float32 result from the summed union lanes (wrapped to int32)."""
    v = (np.asarray(gvals, dtype=np.int64) + 2**31) % 2**32 - 2**31
    s = layout.shift[layout.cand // layout.block]
    y = np.zeros(layout.n, dtype=np.float32)
    y[layout.cand] = np.ldexp(v.astype(np.float64), -s).astype(np.float32)
    return y


def _global_layout(grads, block, seed):
    """The meta and index phases in numpy: global codes and counts, each
    block's index kind, the OR of the indices, the layout."""
    gcodes = np.max([exponent_codes(g, block) for g in grads], axis=0)
    gcounts = np.sum([nnz_counts(g, block) for g in grads], axis=0)
    plan = index_plan(grads[0].size, block, gcodes, gcounts)
    gindex = np.bitwise_or.reduce([index_encode(g, plan, seed) for g in grads])
    return Layout(gindex, grads[0].size, block, gcodes, len(grads), seed, gcounts)


def allreduce_union(grads, block, seed=0):
    """The whole union allreduce in numpy."""
    layout = _global_layout(grads, block, seed)
    return union_decode(sum(union_encode(g, layout) for g in grads), layout)


def allreduce(grads, block, seed=0):
    """The whole lhc allreduce in numpy (sums with numpy), for checking."""
    layout = _global_layout(grads, block, seed)
    total = np.zeros(layout.lanes, dtype=np.int64)
    for g in grads:
        total += sketch_encode(g, layout)
    gcells = ((total + 2**31) % 2**32 - 2**31).astype(np.int32)
    _, done = peel(gcells, layout)
    miss = layout.cand[~done]
    fallback = sum(quantize_at(g, miss, layout) for g in grads) if miss.size else None
    return decode(gcells, layout, fallback)
