"""The aggregation kernels against numpy, for every op and every ISA."""

import errno

import numpy as np
import pytest

from homagg import kernels
from homagg._native import ffi, lib
from homagg.errors import HomAggError

from helpers import be32_buffer as be32, from_be32, wrap32

pytestmark = pytest.mark.sanitize

LANES = [0, 1, 31, 32, 33, 63, 64, 65, 255, 256, 257]
ALL_ISAS = ["portable", "avx2", "avx512"]
ISAS = [i for i in ALL_ISAS if kernels.isa_supported(i)] + ["best"]


def nc8_ref(codes, top):
    codes = codes.astype(np.int64)
    m = codes & 0x7F
    k = top - m
    val = np.where((m >= 1) & (k >= 0) & (k <= 31), np.left_shift(1, np.clip(k, 0, 31)), 0)
    val = np.where(codes & 0x80, -val, val)
    return val


@pytest.fixture(params=ISAS)
def isa(request):
    return request.param


@pytest.mark.parametrize("lanes", LANES)
def test_sum32(isa, lanes):
    rng = np.random.default_rng(lanes)
    a = rng.integers(-(2**31), 2**31, lanes, dtype=np.int64)
    b = rng.integers(-(2**31), 2**31, lanes, dtype=np.int64)
    # Force wrap-around in both directions.
    if lanes >= 2:
        a[0], b[0] = 2**31 - 1, 5
        a[1], b[1] = -(2**31), -1
    acc = be32(a)
    kernels.aggregate("sum32", acc, be32(b), isa=isa)
    np.testing.assert_array_equal(
        wrap32(from_be32(acc).astype(np.uint32).view(np.int32)), wrap32(a + b)
    )


@pytest.mark.parametrize("lanes", LANES)
def test_or(isa, lanes):
    rng = np.random.default_rng(100 + lanes)
    a = rng.integers(0, 256, lanes, dtype=np.uint8)
    b = rng.integers(0, 256, lanes, dtype=np.uint8)
    acc = a.copy()
    kernels.aggregate("or", acc, b, isa=isa)
    np.testing.assert_array_equal(acc, a | b)


@pytest.mark.parametrize("lanes", LANES)
def test_max8(isa, lanes):
    rng = np.random.default_rng(200 + lanes)
    a = rng.integers(-128, 128, lanes).astype(np.int8)
    b = rng.integers(-128, 128, lanes).astype(np.int8)
    if lanes >= 4:
        a[:4] = [-128, 127, -128, 0]
        b[:4] = [127, -128, -128, -1]
    acc = a.view(np.uint8).copy()
    kernels.aggregate("max8", acc, b.view(np.uint8), isa=isa)
    np.testing.assert_array_equal(acc.view(np.int8), np.maximum(a, b))


@pytest.mark.parametrize("lanes", LANES)
@pytest.mark.parametrize("top", [0, 1, 23, 30, 31, 40, -3])
def test_nc8(isa, lanes, top):
    rng = np.random.default_rng(300 + lanes + 7 * top)
    a = rng.integers(-(2**31), 2**31, lanes, dtype=np.int64)
    codes = rng.integers(0, 256, lanes).astype(np.uint8)
    # Include m = 0, m = 1, m = top, m = top + 1, m = 127 with both signs.
    special = [
        0x00,
        0x80,
        0x01,
        0x81,
        top & 0x7F,
        0x80 | (top & 0x7F),
        (top + 1) & 0x7F,
        0x80 | ((top + 1) & 0x7F),
        0x7F,
        0xFF,
    ]
    n = min(lanes, len(special))
    codes[:n] = special[:n]
    acc = be32(a)
    kernels.aggregate("nc8", acc, codes, top=top, isa=isa)
    got = wrap32(from_be32(acc))
    np.testing.assert_array_equal(got, wrap32(a + nc8_ref(codes, top)))


def test_nc8_values():
    # Known answers: top 30, m 1 -> 2^29; m 30 -> 1; m 31 -> 0; top 31, m 0 -> 0.
    acc = be32([0, 0, 0, 0, 0])
    codes = np.array([1, 0x80 | 30, 31, 0, 0x80 | 1], dtype=np.uint8)
    kernels.aggregate("nc8", acc, codes, top=30)
    assert list(wrap32(from_be32(acc))) == [2**29, -1, 0, 0, -(2**29)]
    acc = be32([0])
    kernels.aggregate("nc8", acc, np.array([0x81], np.uint8), top=32)
    assert list(wrap32(from_be32(acc))) == [-(2**31)]


@pytest.mark.parametrize("op", ["sum32", "or", "max8", "nc8"])
def test_isas_identical(op):
    rng = np.random.default_rng(7)
    lanes = 1000
    ib, ab = kernels.in_lane_bytes(op), kernels.acc_lane_bytes(op)
    acc0 = rng.integers(0, 256, lanes * ab).astype(np.uint8)
    inp = rng.integers(0, 256, lanes * ib).astype(np.uint8)
    outs = []
    for isa in ISAS:
        acc = acc0.copy()
        kernels.aggregate(op, acc, inp, top=29, isa=isa)
        outs.append(acc)
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


def test_unaligned_buffers(isa):
    rng = np.random.default_rng(9)
    raw_a = rng.integers(0, 256, 4 * 77 + 3).astype(np.uint8)
    raw_b = rng.integers(0, 256, 4 * 77 + 1).astype(np.uint8)
    a, b = raw_a[3:], raw_b[1:]
    expect = wrap32(from_be32(a.copy()) + from_be32(b.copy()))
    acc = a  # a view at an odd address
    kernels.aggregate("sum32", acc, b, isa=isa)
    np.testing.assert_array_equal(wrap32(from_be32(acc.copy())), expect)


def test_identity():
    assert list(kernels.identity("max8", 3)) == [0x80] * 3
    assert list(kernels.identity("sum32", 2)) == [0] * 8
    assert list(kernels.identity("nc8", 2)) == [0] * 8
    acc = kernels.identity("max8", 4)
    kernels.aggregate("max8", acc, np.array([0x80, 0, 0xFF, 0x7F], np.uint8))
    assert list(acc.view(np.int8)) == [-128, 0, -1, 127]


def test_lane_sizes_and_validity():
    assert kernels.in_lane_bytes("sum32") == 4 and kernels.acc_lane_bytes("sum32") == 4
    assert kernels.in_lane_bytes("nc8") == 1 and kernels.acc_lane_bytes("nc8") == 4
    assert kernels.in_lane_bytes("or") == 1 and kernels.acc_lane_bytes("max8") == 1
    assert lib.hg_op_in_lane_bytes(0) == 0 and lib.hg_op_acc_lane_bytes(99) == 0
    assert not lib.hg_op_valid(0) and not lib.hg_op_valid(5) and lib.hg_op_valid(4)


def test_errors():
    buf = np.zeros(8, np.uint8)
    p = ffi.from_buffer("uint8_t[]", buf)
    assert lib.hg_aggregate(0, p, p, 2, 0) == -errno.EINVAL
    assert lib.hg_aggregate(9, p, p, 2, 0) == -errno.EINVAL
    assert lib.hg_aggregate(lib.HG_OP_SUM32, ffi.NULL, p, 2, 0) == -errno.EINVAL
    assert lib.hg_aggregate(lib.HG_OP_SUM32, ffi.NULL, ffi.NULL, 0, 0) == 0
    assert lib.hg_op_identity(7, p, 1) == -errno.EINVAL
    for isa in ALL_ISAS:
        rc = lib.hg_aggregate_isa(kernels.ISAS[isa], lib.HG_OP_SUM32, p, p, 2, 0)
        assert rc == (0 if kernels.isa_supported(isa) else -errno.ENOTSUP)
    with pytest.raises(HomAggError):
        kernels.aggregate("sum32", np.zeros(4, np.uint8), np.zeros(5, np.uint8))
    with pytest.raises(HomAggError):
        kernels.aggregate("bogus", buf, buf)


def test_isa_names():
    assert kernels.isa_best() in ("portable", "avx2", "avx512")
    assert kernels.isa_supported("portable") and kernels.isa_supported("best")
