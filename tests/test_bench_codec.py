"""The codec benchmark at a small size: its figures are consistent, and its
numpy baseline does the same work as the C codec (same sketch, same result)."""
import argparse

import numpy as np
import pytest

from homagg.bench import codec as bench
from homagg.bench import numpy_codec as npc
from homagg import codec

pytestmark = pytest.mark.sanitize


def test_bench_small_run():
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args(["--elements", str(2**16), "--repeat", "1", "--json"])
    out = bench.run(args)
    for k in ("encode_gbps", "decode_gbps", "memcpy_gbps", "numpy_speedup", "wire_bytes",
              "wire_bound_bytes", "auto_bytes", "smallest_exact_bytes", "union_encode_gbps",
              "union_decode_gbps", "union_decode_vs_memcpy", "union_wire_bytes"):
        assert out[k] > 0, k
    assert out["numpy_sketch_identical"] and out["numpy_decode_bit_identical"]
    assert out["numpy_union_values_identical"] and out["numpy_union_decode_bit_identical"]
    assert out["lhc_decode_matches_bench_decode"] and out["union_decode_matches_lhc_decode"]
    assert out["wire_bytes"] == sum(out["wire_bytes_by_phase"].values())
    assert out["method_bytes"]["dense"] >= 4 * 2**16
    assert out["method_bytes"]["union"] == out["union_wire_bytes"] < out["wire_bytes"]
    assert set(bench.targets(out)) == {"encode_vs_memcpy", "decode_vs_memcpy", "numpy_speedup",
                                       "wire_vs_bound", "auto_vs_smallest",
                                       "union_encode_vs_memcpy", "union_decode_vs_memcpy",
                                       "union_wire_vs_lhc"}


@pytest.mark.parametrize("workers,density", [(1, 0.01), (4, 0.05), (3, 0.5)])
def test_numpy_lhc_matches_c(workers, density):
    rng = np.random.default_rng(workers)
    n = 4096 * 8
    grads = [np.where(rng.random(n) < density, rng.standard_normal(n), 0).astype(np.float32)
             for _ in range(workers)]
    y = npc.allreduce(grads, 4096)
    r = codec.simulate_allreduce(grads, method="lhc")
    assert np.array_equal(y.view(np.uint32), r.sum.view(np.uint32))
    yu = npc.allreduce_union(grads, 4096)
    assert np.array_equal(yu.view(np.uint32), r.sum.view(np.uint32))
