"""The fixed-point reference result of an exact allreduce, in numpy.

Used at run time (``homagg demo``, ``homagg run``, job replay, the training
replay, the scale benchmark) to check the codec's results bit for bit.  It is
computed from docs/PROTOCOL.md's fixed-point contract with numpy only (no C
code), so the check is independent of the codec it checks.

It differs in approach on purpose from the test suite's oracle
(tests/reference.py).  The oracle is the obvious per-worker float64 reading
of the contract (frexp for the block exponents, ldexp then rint for the
quantisation).  This module works on the float32 bit fields with integer
arithmetic, all workers at once as one (W, n) matrix:

- |x| = M * 2^k with M the 24-bit significand (implicit bit added for
  normal numbers) and k = max(field, 1) - 150 from the exponent field.
- The block maximum is taken on the magnitude bits (monotone in |x| for
  finite floats); its frexp exponent is bit_length(M) + k, clamped to
  [-126, 128]; the wire code is that minus one, -128 for an all-zero block.
- E_b = max over workers of the codes plus one; s_b = 30 - ceil(log2 W) - E_b.
- q = round_half_even(M * 2^(k + s_b)) as an integer shift: a left shift, or
  a right shift that rounds on the bits shifted out (ties to the even q).
- y = float32(sum_w q * 2^-s_b): the sum is exact in int64 (|sum| <= 2^30)
  and in float64, scaled by a power-of-two table, rounded once to float32.
  A block that is zero on every worker decodes to +0.

tests/test_reference.py checks that both agree bit for bit on random inputs,
so a slip in either formulation shows up as a disagreement.
"""

import numpy as np

EXP_ZERO = -128
EXP_MIN = -126
EXP_MAX = 128


def _bit_length(m):
    """bit_length of non-negative int64 values below 2^24, vectorised."""
    m = np.asarray(m, dtype=np.int64)
    out = np.zeros(m.shape, dtype=np.int64)
    for step in (16, 8, 4, 2, 1):
        big = (m >> step) > 0
        out += np.where(big, step, 0)
        m = np.where(big, m >> step, m)
    return out + (m > 0)


def _fields(x):
    """(sign, M, k) of finite float32 values: x = (-1)^sign * M * 2^k."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.int32)
    field = (bits >> 23) & 0xFF
    if np.any(field == 0xFF):
        raise ValueError(
            "grads: a gradient holds inf or NaN; "
            "the fixed-point contract covers finite float32 values only"
        )
    mant = (bits & 0x7FFFFF) | np.where(field > 0, np.int32(1 << 23), np.int32(0))
    return (bits >> 31) & 1, mant, np.maximum(field, 1) - 150


# Columns per pass of allreduce(): whole blocks, so that a pass's
# temporaries (a few int32/int64 arrays of W x COLUMNS) stay in the cache.
COLUMNS = 1 << 18


def allreduce(grads, block):
    """The bit-exact result every exact method must decode (float32).
    Blocks are independent, so it runs over whole blocks at a time."""
    x = np.stack([np.asarray(g, dtype=np.float32).ravel() for g in grads]) if grads else None
    if x is None or x.shape[1] == 0:
        return np.zeros(0, dtype=np.float32)
    n = x.shape[1]
    step = max(1, COLUMNS // block) * block
    out = np.empty(n, dtype=np.float32)
    for a in range(0, n, step):
        out[a : a + step] = _allreduce_blocks(x[:, a : a + step], block)
    return out


def _allreduce_blocks(x, block):
    """allreduce() of the (W, n) float32 matrix x, n up to whole blocks."""
    workers, n = x.shape
    nb = (n + block - 1) // block
    sign, mant, k = _fields(x)

    # Block maxima on the magnitude bits, zero-padded to whole blocks.
    mag = np.zeros((workers, nb * block), dtype=np.int32)
    mag[:, :n] = np.ascontiguousarray(x).view(np.int32) & 0x7FFFFFFF
    top = mag.reshape(workers, nb, block).max(axis=2)
    tfield = top >> 23
    tmant = (top & 0x7FFFFF) | np.where(tfield > 0, 1 << 23, 0)
    e = np.clip(_bit_length(tmant) + np.maximum(tfield, 1) - 150, EXP_MIN, EXP_MAX)
    codes = np.where(top == 0, EXP_ZERO, e - 1).max(axis=0)  # MAX8 over workers
    zero = codes == EXP_ZERO
    shift = np.where(zero, 0, 30 - (workers - 1).bit_length() - (codes + 1))

    t = k + np.repeat(shift, block)[:n]  # q = round_half_even(M * 2^t)
    # int32 suffices: |q| <= 2^30 by the contract, M < 2^24 <= 2^(d-1) for
    # d >= 25 (q = 0 there, as for any larger right shift).
    t = t.astype(np.int32)
    left = mant << np.clip(t, 0, 30)
    d = np.clip(-t, 1, 30)
    # Ties to even: add half - 1, plus 1 more when the kept part is odd.
    q = (mant + ((np.int32(1) << (d - 1)) - 1) + ((mant >> d) & 1)) >> d
    q = np.where(t >= 0, left, q)
    q = (q ^ -sign) + sign  # two's complement negation where the sign bit is set
    total = q.sum(axis=0, dtype=np.int64)
    total[np.repeat(zero, block)[:n]] = 0
    # The contract's bound: the int32 lanes never overflow.
    assert np.all(np.abs(total) <= 2**30), "fixed-point bound violated"

    scale = np.exp2(-np.repeat(shift, block)[:n].astype(np.float64))
    return (total.astype(np.float64) * scale).astype(np.float32)
