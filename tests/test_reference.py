"""The package's runtime reference (homagg.reference, integer bit-field
formulation) against the test oracle (tests/reference.py, float64
frexp/ldexp formulation): both must give the same float32 bits on any
finite input, so each formulation checks the other."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as oracle
from homagg import reference as runtime


def _same_bits(grads, block):
    with np.errstate(over="ignore"):
        want = oracle.allreduce(grads, block)
        got = runtime.allreduce(grads, block)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@st.composite
def _gradients(draw):
    workers = draw(st.integers(1, 9))
    n = draw(st.integers(1, 400))
    block = draw(st.sampled_from([1, 2, 3, 8, 64, 256]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["bits", "scaled", "ties", "sparse"]))
    grads = []
    for _ in range(workers):
        if kind == "bits":  # any finite float32: every exponent, subnormals, +-0
            bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
            bits[((bits >> 23) & 0xFF) == 0xFF] &= np.uint32(0xBF800000)
            g = bits.view(np.float32)
        elif kind == "scaled":
            exp = draw(st.integers(-149, 100))
            g = (rng.standard_normal(n) * 2.0**exp).astype(np.float32)
        elif kind == "ties":  # small integers and halves: rounding ties
            g = (rng.integers(-8, 9, n) / 2.0 ** rng.integers(0, 30, n)).astype(np.float32)
        else:
            g = np.where(rng.random(n) < 0.05, rng.standard_normal(n), 0).astype(np.float32)
        g[rng.random(n) < 0.1] = -0.0
        grads.append(g)
    return grads, block


@settings(max_examples=300, deadline=None)
@given(_gradients())
def test_runtime_reference_agrees_with_oracle(case):
    _same_bits(*case)


@given(
    st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1, max_size=64),
    st.integers(1, 5),
    st.sampled_from([1, 4, 16]),
)
@settings(max_examples=200, deadline=None)
def test_runtime_reference_agrees_on_drawn_floats(values, workers, block):
    base = np.array(values, dtype=np.float32)
    _same_bits([np.roll(base, w) * np.float32(-1 if w % 2 else 1) for w in range(workers)], block)


def test_passes_over_whole_blocks_give_the_same_bits(monkeypatch):
    """allreduce() runs COLUMNS elements (whole blocks) at a time: over many
    passes and a last partial block it gives the oracle's bits."""
    rng = np.random.default_rng(11)
    grads = [
        (rng.standard_normal(5_000) * 2.0 ** rng.integers(-30, 30, 5_000)).astype(np.float32)
        for _ in range(4)
    ]
    monkeypatch.setattr(runtime, "COLUMNS", 100)
    for block in (1, 7, 64, 256):
        _same_bits(grads, block)


def test_zero_blocks_and_empty_input():
    g = np.zeros(1000, dtype=np.float32)
    g[:10] = 1.5
    h = np.zeros(1000, dtype=np.float32)
    h[200:210] = -0.0
    _same_bits([g, h], 256)
    assert runtime.allreduce([np.zeros(0, np.float32)] * 2, 256).size == 0
    assert runtime.allreduce([], 256).size == 0


def test_non_finite_input_is_refused_with_the_field_named():
    g = np.ones(8, dtype=np.float32)
    g[3] = np.inf
    with pytest.raises(ValueError, match="grads"):
        runtime.allreduce([g], 4)
