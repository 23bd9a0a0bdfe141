"""The codec benchmark at a small size: its figures are consistent, and its
numpy baseline does the same work as the C codec (same sketch, same result)."""

import argparse
import os
import subprocess
import sys

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
    for k in (
        "encode_gbps",
        "decode_gbps",
        "memcpy_gbps",
        "numpy_speedup",
        "wire_bytes",
        "wire_bound_bytes",
        "auto_bytes",
        "smallest_exact_bytes",
        "union_encode_gbps",
        "union_decode_gbps",
        "union_decode_vs_memcpy",
        "union_wire_bytes",
    ):
        assert out[k] > 0, k
    assert out["numpy_sketch_identical"] and out["numpy_decode_bit_identical"]
    assert out["numpy_union_values_identical"] and out["numpy_union_decode_bit_identical"]
    assert out["lhc_decode_matches_bench_decode"] and out["union_decode_matches_lhc_decode"]
    assert out["wire_bytes"] == sum(out["wire_bytes_by_phase"].values())
    assert out["method_bytes"]["dense"] >= 4 * 2**16
    assert out["method_bytes"]["union"] == out["union_wire_bytes"] < out["wire_bytes"]
    assert set(bench.targets(out)) == {
        "encode_vs_memcpy",
        "decode_vs_memcpy",
        "numpy_speedup",
        "wire_vs_bound",
        "auto_vs_smallest",
        "union_encode_vs_memcpy",
        "union_decode_vs_memcpy",
        "union_wire_vs_lhc",
    }


def test_bench_with_shared_positions():
    """--positions shared: every worker's non-zeros at the same places, so
    the union's candidates are one worker's non-zeros; the numpy baseline
    still agrees bit for bit."""
    n, density = 2**16, 0.05
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    for positions in ("shared", "independent"):
        args = p.parse_args(
            ["--elements", str(n), "--repeat", "1", "--positions", positions, "--json"]
        )
        out = bench.run(args)
        assert out["positions"] == positions
        assert out["numpy_union_values_identical"] and out["numpy_union_decode_bit_identical"]
        for row in out["paths"]:
            if positions == "shared":
                assert row["candidates"] == round(density * n)
            else:  # the union of four independent patterns
                assert row["candidates"] > 3 * round(density * n)


@pytest.mark.parametrize("workers,density", [(1, 0.01), (4, 0.05), (3, 0.5)])
def test_numpy_lhc_matches_c(workers, density):
    rng = np.random.default_rng(workers)
    n = 4096 * 8
    grads = [
        np.where(rng.random(n) < density, rng.standard_normal(n), 0).astype(np.float32)
        for _ in range(workers)
    ]
    y = npc.allreduce(grads, 4096)
    r = codec.simulate_allreduce(grads, method="lhc")
    assert np.array_equal(y.view(np.uint32), r.sum.view(np.uint32))
    yu = npc.allreduce_union(grads, 4096)
    assert np.array_equal(yu.view(np.uint32), r.sum.view(np.uint32))


def _args(*argv):
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    return p.parse_args(list(argv) + ["--repeat", "1", "--json"])


@pytest.mark.parametrize(
    "elements,block,density",
    [
        (192 * 331, "192", 0.0068),  # an odd number of blocks, not a multiple of 4096
        (4096 * 13, None, 0.0068),  # the NCF bucket's density: Bloom blocks
        (1024 * 37, "1024", 0.001),  # some blocks zero on every worker
        (64 * 257, "64", 1.0),
    ],
)
def test_bench_odd_sizes_low_density_with_numpy(elements, block, density):
    """Any multiple of the block, low densities (Bloom blocks, blocks zero
    everywhere), the numpy baseline on, one row per ISA path."""
    argv = ["--elements", str(elements), "--density", str(density), "--workers", "3"]
    if block:
        argv += ["--block", block]
    out = bench.run(_args(*argv))
    assert [r["isa"] for r in out["paths"]] == bench.parse_isas(None)
    assert out["paths_bit_identical"]
    for r in out["paths"]:
        assert r["encode_seconds"] > 0 and r["union_decode_vs_memcpy"] > 0, r["isa"]
        assert r["union_decode_matches_lhc_decode"], r["isa"]
    assert out["numpy_sketch_identical"] and out["numpy_decode_bit_identical"]
    assert out["numpy_union_values_identical"] and out["numpy_union_decode_bit_identical"]
    assert out["lhc_decode_matches_bench_decode"]


def test_bench_one_path():
    out = bench.run(_args("--elements", "4096", "--isa", "portable", "--no-numpy"))
    assert [r["isa"] for r in out["paths"]] == ["portable"]
    assert out["isa"] == "portable"


def test_bench_plans_by_the_cost_model_with_a_link_rate(tmp_path, monkeypatch):
    """--link-mbit plans the index as a job on that link with this host's
    calibration: with a split-block coefficient below the Bloom options'
    probes NCF-like blocks take split-block filters, every path gives the
    same bits and the lhc decode is the simulated allreduce's; without it
    the bytes rule (no split-block block)."""
    from homagg import cost
    from homagg.bindings import codec as b

    own = b.codec_isa()
    coeffs = dict(cost.DEFAULT_COEFFICIENTS, probe_ps=100, sbbf_ps=300)
    cal = {"version": cost.CALIBRATION_VERSION, "isa": "portable", "paths": {"portable": coeffs}}
    path = tmp_path / "calibration.json"
    path.write_text(__import__("json").dumps(cal))
    # one path in the file: every codec path plans with its coefficients
    monkeypatch.setenv("HOMAGG_CALIBRATION", str(path))
    argv = ("--elements", str(16 * 4096), "--density", "0.0068", "--workers", "4")
    timed = bench.run(_args(*argv, "--link-mbit", "1000"))
    plain = bench.run(_args(*argv, "--no-numpy"))
    assert timed["link_mbit"] == 1000 and timed["cost"]["sbbf_ps"] == 300
    assert timed["index_blocks"]["split_blocks"] == 16
    assert timed["paths_bit_identical"] and timed["lhc_decode_matches_bench_decode"]
    assert "numpy_speedup" not in timed  # the numpy baseline knows the bytes rule only
    assert plain["link_mbit"] == 0 and plain["index_blocks"]["split_blocks"] == 0
    assert plain["index_blocks"]["bloom_blocks"] == 16
    from homagg.bench import markdown

    for out, want in (
        (timed, "16 split-block blocks (cost model at 1000 Mbit/s)"),
        (plain, "16 Bloom, 0 split-block blocks (bytes rule)"),
    ):
        src, dst = tmp_path / "codec.json", tmp_path / "codec.md"
        src.write_text(__import__("json").dumps(out))
        assert markdown.main(["codec", str(src), str(dst), "homagg bench codec"]) == 0
        assert want in dst.read_text()
    assert b.codec_isa() == own  # the bench leaves the process on its own path


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--elements", "0"], "--elements 0: use a positive multiple of the block"),
        (["--elements", "3846305"], r"--elements 3846305: .* \(4096 elements\), e.g. 3846144"),
        (["--elements", "100", "--block", "64"], r"--elements 100: .*e.g. 128"),
        (["--density", "0"], r"--density 0.0: use a fraction in \(0, 1\]"),
        (["--density", "1.5"], r"--density 1.5: use a fraction in \(0, 1\]"),
        (["--workers", "0"], "--workers 0: use 1..256"),
        (["--block", "100"], "--block 100: use a multiple of 64"),
        (["--isa", "sse9"], "--isa sse9: use a comma-separated list of portable, avx2, avx512"),
        (["--link-mbit", "-5"], r"--link-mbit -5: use a link rate of at least 1 Mbit/s \(0: the"),
        (["--link-mbit", "0.5"], r"--link-mbit 0.5: use a link rate of at least 1 Mbit/s"),
    ],
)
def test_bench_refuses_bad_arguments(argv, msg):
    with pytest.raises(SystemExit, match=msg) as e:
        bench.run(_args("--elements", "4096", *argv))
    assert "\n" not in str(e.value)


def test_bench_refuses_a_bad_isa_variable():
    """HOMAGG_CODEC_ISA naming no path: one line, no traceback."""
    env = dict(os.environ, HOMAGG_CODEC_ISA="avx3")
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from homagg.cli import main; sys.exit(main(sys.argv[1:]))",
            "bench",
            "codec",
            "--elements",
            "4096",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("HOMAGG_CODEC_ISA='avx3' names no codec path")
    assert "Traceback" not in r.stderr
