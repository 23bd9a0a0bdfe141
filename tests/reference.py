"""numpy oracle of HomAgg's fixed-point contract (docs/PROTOCOL.md).

Written from the specification alone: it never imports homagg, so a bug in
the C codec or in the bindings cannot hide in the oracle too.  It is the
obvious per-worker float64 reading of the contract (frexp, ldexp, rint); the
package's runtime reference (orchestrator/homagg/reference.py) reaches the
same bits another way on purpose (integer arithmetic on the float32 bit
fields, all workers as one matrix), and tests/test_reference.py checks that
the two agree.

For a quantisation block b of W workers' float32 gradients:

- e_wb: the frexp exponent of max |x_w| over the block (max < 2^e),
  clamped to [-126, 128]; a block that is all +-0 has no exponent.  The
  wire code is e - 1 as int8, -128 for an all-zero block.
- E_b = max over workers of e_wb (the MAX8 phase over the codes).
- s_b = 30 - ceil(log2 W) - E_b.
- q_wb = round_half_even(x * 2^s_b), computed in float64 (exact: a float32
  times a power of two), so |sum_w q_wb| <= 2^30.
- y = float32(sum_w q_wb * 2^-s_b): one rounding, from float64 (exact).
  A block that is zero on every worker decodes to +0.

It also implements the protocol's random streams (splitmix64 in numpy
uint64 arithmetic): stochastic rounding and NC8 / natural dithering, bit
for bit.
"""

import numpy as np

EXP_ZERO = -128
EXP_MIN = -126
EXP_MAX = 128


def log2_ceil(workers):
    """ceil(log2(W)) for W >= 1."""
    return int(workers - 1).bit_length()


def nblocks(n, block):
    return (n + block - 1) // block


def _block_max_abs(x, block):
    """max |x| of every block, as float64 (the last block may be short)."""
    x = np.asarray(x, dtype=np.float32)
    n = x.size
    nb = nblocks(n, block)
    out = np.zeros(nb, dtype=np.float64)
    if n == 0:
        return out
    full = n // block
    a = np.abs(x.astype(np.float64))
    if full:
        out[:full] = a[: full * block].reshape(full, block).max(axis=1)
    if full < nb:
        out[full] = a[full * block :].max()
    return out


def exponent_codes(x, block):
    """The local block exponent codes of one worker (int8 array)."""
    m = _block_max_abs(x, block)
    _, e = np.frexp(m)
    e = np.clip(e.astype(np.int64), EXP_MIN, EXP_MAX)
    codes = (e - 1).astype(np.int64)
    codes[m == 0] = EXP_ZERO
    return codes.astype(np.int8)


def global_codes(codes_per_worker):
    """The MAX8 of every worker's codes."""
    return np.max(np.stack([np.asarray(c, dtype=np.int8) for c in codes_per_worker]), axis=0)


def scale_shifts(gcodes, workers):
    """s_b per block (int64); 0 for blocks zero on every worker."""
    g = np.asarray(gcodes, dtype=np.int64)
    s = 30 - log2_ceil(workers) - (g + 1)
    s[g == EXP_ZERO] = 0
    return s


def _per_element(values, n, block):
    return np.repeat(np.asarray(values), block)[:n]


def quantize(x, gcodes, workers, block):
    """q = round_half_even(x * 2^s_b) as int64 (the int32 lanes' values)."""
    x = np.asarray(x, dtype=np.float32)
    n = x.size
    s = _per_element(scale_shifts(gcodes, workers), n, block)
    z = _per_element(np.asarray(gcodes) == EXP_ZERO, n, block)
    # Exact in float64: a float32 mantissa scaled by a power of two whose
    # result lies far inside float64's range.
    scaled = np.ldexp(x.astype(np.float64), s)
    q = np.rint(scaled).astype(np.int64)
    q[z] = 0
    return q


def dequantize(sums, gcodes, workers, block):
    """y = float32(sum * 2^-s_b); sums are exact int64 sums."""
    sums = np.asarray(sums, dtype=np.int64)
    n = sums.size
    s = _per_element(scale_shifts(gcodes, workers), n, block)
    z = _per_element(np.asarray(gcodes) == EXP_ZERO, n, block)
    y = np.ldexp(sums.astype(np.float64), -s).astype(np.float32)
    y[z] = np.float32(0.0)
    return y


def allreduce(grads, block):
    """The bit-exact result every exact method must decode (float32)."""
    grads = [np.asarray(g, dtype=np.float32) for g in grads]
    workers = len(grads)
    n = grads[0].size if grads else 0
    if n == 0:
        return np.zeros(0, dtype=np.float32)
    gcodes = global_codes([exponent_codes(g, block) for g in grads])
    total = np.zeros(n, dtype=np.int64)
    for g in grads:
        total += quantize(g, gcodes, workers, block)
    # The contract's bound: the int32 lanes never overflow.
    assert np.all(np.abs(total) <= 2**30), "fixed-point bound violated"
    return dequantize(total, gcodes, workers, block)


def nnz_counts(x, block):
    """Per-block count of non-zero elements (+-0 are zero)."""
    x = np.asarray(x, dtype=np.float32)
    nz = (x != 0).astype(np.int64)
    nb = nblocks(x.size, block)
    pad = np.zeros(nb * block, dtype=np.int64)
    pad[: x.size] = nz
    return pad.reshape(nb, block).sum(axis=1) if nb else np.zeros(0, dtype=np.int64)


# ---- random streams (docs/PROTOCOL.md "Random streams and hashes") -----------

M64 = 2**64 - 1
GOLDEN = 0x9E3779B97F4A7C15
DOM_ROUND = 0x524F554E44000001
DOM_NC = 0x4E41544E43000002
DOM_SKETCH = 0x534B455443480003


def mix64(z):
    """splitmix64's finaliser on uint64 arrays (numpy wraps modulo 2^64)."""
    z = np.asarray(z, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def mix64_int(z):
    """mix64 of one Python integer, in Python integers (modulo 2^64)."""
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def stream_key(seed, domain, worker):
    """The key of worker ``worker``'s stream ``domain`` under ``seed`` (an int)."""
    return mix64_int(mix64_int(seed + domain) + worker)


def hash_u32(key, g):
    """hash(key, g) >> 32 for global indices g, as float64 (exact)."""
    g = np.asarray(g, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = mix64(np.uint64(key) + (g + np.uint64(1)) * np.uint64(GOLDEN))
    return (h >> np.uint64(32)).astype(np.float64)


def stream_u32(seed, domain, worker, n):
    """u = hash(key, g) >> 32 for g = 0..n-1, as float64 (exact)."""
    return hash_u32(stream_key(seed, domain, worker), np.arange(n, dtype=np.uint64))


def quantize_stochastic(x, gcodes, workers, block, seed, worker):
    """q = floor(v) + (u * 2^-32 < v - floor(v)), v = x * 2^s exact."""
    x = np.asarray(x, dtype=np.float32)
    n = x.size
    s = _per_element(scale_shifts(gcodes, workers), n, block)
    z = _per_element(np.asarray(gcodes) == EXP_ZERO, n, block)
    v = np.ldexp(x.astype(np.float64), s)
    f = np.floor(v)
    r = np.ldexp(stream_u32(seed, DOM_ROUND, worker, n), -32)
    q = (f + (r < v - f)).astype(np.int64)
    q[z] = 0
    return q


def allreduce_stochastic(grads, block, seed):
    """The result of an exact method with stochastic rounding."""
    grads = [np.asarray(g, dtype=np.float32) for g in grads]
    workers, n = len(grads), grads[0].size
    gcodes = global_codes([exponent_codes(g, block) for g in grads])
    total = np.zeros(n, dtype=np.int64)
    for w, g in enumerate(grads):
        total += quantize_stochastic(g, gcodes, workers, block, seed, w)
    return dequantize(total, gcodes, workers, block)


def nc_values(x, gcodes, workers, block, seed, worker, nc_levels=0):
    """One worker's NC value per element in fixed-point units (int64),
    docs/PROTOCOL.md "NC8 and natural dithering"."""
    x = np.asarray(x, dtype=np.float32)
    n = x.size
    top = 31 - log2_ceil(workers)
    levels = nc_levels if 1 <= nc_levels <= top else top
    kmin = top - levels
    s = _per_element(scale_shifts(gcodes, workers), n, block)
    v = np.abs(np.ldexp(x.astype(np.float64), s))
    r = np.ldexp(stream_u32(seed, DOM_NC, worker, n), -32)
    _, e = np.frexp(v)
    k = e.astype(np.int64) - 1  # 2^k <= v < 2^(k+1) for v > 0
    low = v < 2.0**kmin
    up_low = r < v / 2.0**kmin
    up = r < np.ldexp(v, -np.where(low, 0, k)) - 1
    mag = np.where(low, np.where(up_low, 2.0**kmin, 0.0), np.ldexp(1.0, np.where(low, 0, k + up)))
    mag[v == 0] = 0
    return (np.where(x < 0, -mag, mag)).astype(np.int64)


def allreduce_nc(grads, block, seed, nc_levels=0):
    grads = [np.asarray(g, dtype=np.float32) for g in grads]
    workers, n = len(grads), grads[0].size
    gcodes = global_codes([exponent_codes(g, block) for g in grads])
    total = np.zeros(n, dtype=np.int64)
    for w, g in enumerate(grads):
        total += nc_values(g, gcodes, workers, block, seed, w, nc_levels)
    return dequantize(total, gcodes, workers, block)


# ---- union (docs/PROTOCOL.md "union: candidate values") -----------------------


def union_candidates(grads):
    """The candidates of an all-bitmap index: positions non-zero on some
    worker, increasing (block order is position order)."""
    nz = np.zeros(np.asarray(grads[0]).size, dtype=bool)
    for g in grads:
        nz |= np.asarray(g, dtype=np.float32) != 0
    return np.flatnonzero(nz)


def union_lanes(x, gcodes, candidates, workers, block):
    """One worker's union lanes: its quantised value at every candidate
    (0 where it has none), as int64."""
    return quantize(x, gcodes, workers, block)[np.asarray(candidates, dtype=np.int64)]


def union_decode(sums, gcodes, candidates, n, workers, block):
    """The float32 result from the summed lanes (int32 wrap-around applied):
    +0 at non-candidates, sum * 2^-s_b at candidates."""
    sums = (np.asarray(sums, dtype=np.int64) + 2**31) % 2**32 - 2**31
    full = np.zeros(n, dtype=np.int64)
    full[np.asarray(candidates, dtype=np.int64)] = sums
    return dequantize(full, gcodes, workers, block)


def union_allreduce(grads, block):
    """The union method end to end (all-bitmap index); equals allreduce()."""
    grads = [np.asarray(g, dtype=np.float32) for g in grads]
    workers, n = len(grads), grads[0].size
    gcodes = global_codes([exponent_codes(g, block) for g in grads])
    cand = union_candidates(grads)
    total = sum(union_lanes(g, gcodes, cand, workers, block) for g in grads)
    return union_decode(total, gcodes, cand, n, workers, block)
