"""The simulated-cluster rig: gradients with varied magnitudes and zero
blocks, and the bit-for-bit check of a result against the numpy oracle
(tests/reference.py), shared by the NIC-model tests."""

import numpy as np

from reference import allreduce as oracle_allreduce

BLOCK = 256


def make_grads(workers, n, density=0.1, seed=0, zero_blocks=True):
    """Sparse gradients with varied magnitudes and some all-zero blocks."""
    rng = np.random.default_rng(seed)
    grads = []
    for w in range(workers):
        x = np.zeros(n, dtype=np.float32)
        nz = rng.random(n) < density
        x[nz] = (rng.standard_normal(nz.sum()) * 10.0 ** rng.integers(-6, 3, nz.sum())).astype(
            np.float32
        )
        if zero_blocks and n >= 4 * BLOCK:
            x[BLOCK : 2 * BLOCK] = 0  # a block zero on every worker
        grads.append(x)
    return grads


def assert_bits_equal(got, want):
    got = np.asarray(got, dtype=np.float32)
    want = np.asarray(want, dtype=np.float32)
    assert got.shape == want.shape
    diff = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert diff.size == 0, (
        f"{diff.size} elements differ, first at {diff[:5]}: {got[diff[:5]]} vs {want[diff[:5]]}"
    )


def check_result(res, grads):
    want = oracle_allreduce(grads, BLOCK)
    assert_bits_equal(res.sum, want)
    for out in res.outputs:
        assert_bits_equal(out, res.sum)
