"""The comparative benchmarks: ``homagg bench scale`` and ``homagg bench allreduce``.

scale runs on the simulated cluster (no root): its outputs must be valid
JSON/CSV/PNG, its byte counts must equal the codec-level accounting of
homagg.codec.simulate_allreduce on the same gradients, and every exact
method must be exact.  allreduce needs root and network namespaces (a
2-worker testbed) and torch for the Gloo baseline.  No timing thresholds.
"""

import csv
import importlib.util
import json
import os

import numpy as np

import pytest

from helpers import require, run_testbed_bench

from homagg import cli, codec
from homagg.bench import scale, workloads

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _check_outputs(out_dir, name, pngs=None):
    with open(os.path.join(out_dir, f"{name}.json")) as f:
        report = json.load(f)
    with open(os.path.join(out_dir, f"{name}.csv")) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(report["results"]) > 0
    for png in pngs or [f"{name}.png"]:
        with open(os.path.join(out_dir, png), "rb") as f:
            assert f.read(8) == PNG_MAGIC
    with open(os.path.join(out_dir, f"{name}.md")) as f:
        md = f.read()
    assert md.count("\n|") >= len(rows) + 1
    for key in ("machine", "versions", "command", "results"):
        assert key in report
    return report, rows


# ---- workloads ------------------------------------------------------------


@pytest.mark.parametrize("name", workloads.WORKLOADS)
def test_workloads_seeded_and_dense_as_asked(name):
    a = workloads.generate_all(name, 3, 4096, 0.05, seed=5)
    b = workloads.generate_all(name, 3, 4096, 0.05, seed=5)
    c = workloads.generate_all(name, 3, 4096, 0.05, seed=6)
    for x, y in zip(a, b):
        assert x.dtype == np.float32 and x.size == 4096
        assert np.array_equal(x, y)
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    nz = [np.count_nonzero(x) for x in a]
    if name == "dense":
        assert nz == [4096] * 3
    else:
        assert all(0 < k <= 0.05 * 4096 + workloads.ROW_DIM for k in nz)
    pats = [x != 0 for x in a]
    if name == "shared":
        assert all(np.array_equal(p, pats[0]) for p in pats)
    if name == "random":
        assert not np.array_equal(pats[0], pats[1])
    if name == "zipf":  # whole rows
        rows = pats[0].reshape(-1, workloads.ROW_DIM)
        assert np.all(rows.all(axis=1) | ~rows.any(axis=1))


# ---- scale ----------------------------------------------------------------


def test_scale_outputs_and_accounting(tmp_path, capsys):
    out = tmp_path / "scale"
    rc = cli.main(
        [
            "bench",
            "scale",
            "--workers",
            "2,5",
            "--elements",
            "8192",
            "--block",
            "1024",
            "--density",
            "0.05",
            "--workload",
            "zipf",
            "--seed",
            "3",
            "--json",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    report, csv_rows = _check_outputs(out, "scale")
    assert printed["results"] == report["results"]
    assert {(r["workers"], r["method"]) for r in report["results"]} == {
        (w, m) for w in (2, 5) for m in scale.METHODS
    }

    for W in (2, 5):
        grads = workloads.generate_all("zipf", W, 8192, 0.05, 3)
        for m in scale.METHODS:
            row = next(r for r in report["results"] if r["workers"] == W and r["method"] == m)
            st = codec.simulate_allreduce(grads, method=m, block_elements=1024).stats
            assert row["method_chosen"] == st["method"]
            assert row["bytes_sent_per_worker"] == st["bytes_per_worker"]
            assert row["bytes_received_per_worker"] == st["bytes_received_per_worker"]
            assert row["ring_bytes_per_worker"] == pytest.approx(2 * (W - 1) / W * 4 * 8192)
            assert row["retransmissions"] == 0
            assert row["workers_agree"] is True
            assert row["agg_frames_received"] == W * row["packets_per_worker"]
            assert row["virtual_seconds"] > 0
            if m == "nc":
                assert row["exact"] is None
                assert 0 <= row["rel_l2_error"] < 1
            else:
                assert row["exact"] is True
    # The CSV carries the same numbers.
    for r, c in zip(report["results"], csv_rows):
        assert int(c["workers"]) == r["workers"] and c["method"] == r["method"]
        assert float(c["bytes_sent_per_worker"]) == r["bytes_sent_per_worker"]


def test_scale_tree_rows(tmp_path, capsys):
    """--leaves adds tree rows: exact, the same bytes per worker as the
    flat row, every leaf's and the root's link load reported, the root's
    link carrying one partial sum per leaf and set."""
    out = tmp_path / "scale"
    rc = cli.main(
        [
            "bench",
            "scale",
            "--workers",
            "8",
            "--elements",
            "30000",
            "--density",
            "0.05",
            "--methods",
            "dense,lhc",
            "--aggregators",
            "1",
            "--leaves",
            "W/4,3",
            "--json",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert (out / "scale.png").exists()
    flat = {r["method"]: r for r in report["results"] if not r["leaves"]}
    trees = [r for r in report["results"] if r["leaves"]]
    assert sorted((r["leaves"], r["method"]) for r in trees) == [
        (2, "dense"),
        (2, "lhc"),
        (3, "dense"),
        (3, "lhc"),
    ]
    for r in trees:
        assert r["exact"] is True and r["retransmissions"] == 0
        assert r["aggregators"] == r["leaves"] + 1
        assert len(r["agg_link_rx_bytes"]) == r["leaves"] + 1
        assert r["bytes_sent_per_worker"] == flat[r["method"]]["bytes_sent_per_worker"]
        *leaf_rx, root_rx = r["agg_link_rx_bytes"]
        assert 0 < root_rx < max(leaf_rx)
    assert report["leaves"] == ["W/4", "3"]


def test_scale_counts_drops_and_retransmissions_per_drop(tmp_path, capsys, caplog):
    """--drop-rate rows carry the frames the links dropped (the fabric's
    count) and retransmissions per drop, in the JSON, the markdown and the
    progress line; a lossless row has 0 drops and no ratio."""
    out = tmp_path / "scale"
    with caplog.at_level("INFO", logger="homagg.bench"):
        rc = cli.main(
            [
                "bench",
                "scale",
                "--workers",
                "4",
                "--elements",
                "20000",
                "--density",
                "0.05",
                "--methods",
                "dense,lhc",
                "--drop-rate",
                "0.02",
                "--seed",
                "2",
                "--json",
                "--out",
                str(out),
            ]
        )
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    for r in report["results"]:
        assert r["exact"] is True
        # every link drops: the workers' frames, the aggregator's results
        sent = 4 * r["packets_per_worker"] + r["agg_results_sent"]
        assert 0 < r["drops_injected"] < sent
        assert r["retransmissions"] > 0
        assert r["retransmissions_per_drop"] == r["retransmissions"] / r["drops_injected"]
        assert (
            f"drops {r['drops_injected']}, retx {r['retransmissions']} "
            f"({r['retransmissions_per_drop']:.2f} per drop)"
        ) in caplog.text
    md = (out / "scale.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| workers"))
    assert "| drops_injected | retransmissions | retransmissions_per_drop |" in header
    grads = workloads.generate_all("shared", 3, 4096, 0.1, 1)
    row, _ = scale.run_one(grads, "dense", 100.0, 1024, 16, 0)
    assert row["drops_injected"] == 0 and row["retransmissions_per_drop"] is None


def test_scale_runs_each_shape_with_the_defaults_a_user_gets(capsys):
    """Without --slots every row runs the job sim.Cluster makes for its
    shape, and reports that job's slots and pipe cap: beyond W = 128 a
    flat job holds 32 slots with its pipe capped at 8, a tree of 16
    senders per aggregator its full window of 256 with the pipe capped at
    128.  --slots sets them for every row."""
    from homagg.sim import Cluster

    args = ["bench", "scale", "--workers", "4,256", "--elements", "4096"]
    args += ["--methods", "dense", "--aggregators", "1,W/16", "--leaves", "W/16", "--json"]
    assert cli.main(args) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    shapes = {(r["workers"], r["aggregators"], r["leaves"]) for r in rows}
    assert shapes == {(4, 1, 0), (256, 1, 0), (256, 16, 0), (256, 17, 16)}
    for r in rows:
        assert r["exact"] is True
        flat = 0 if r["leaves"] else r["aggregators"]
        with Cluster(workers=r["workers"], aggregators=flat or 1, leaves=r["leaves"]) as cl:
            assert (r["slots"], r["pipe_max"]) == (cl.job.slots, cl.job.pipe_max)
    by = {(r["workers"], r["aggregators"]): r for r in rows}
    assert (by[256, 16]["slots"], by[256, 16]["pipe_max"]) == (32, 8)
    assert (by[256, 17]["slots"], by[256, 17]["pipe_max"]) == (256, 128)
    assert (by[4, 1]["slots"], by[4, 1]["pipe_max"]) == (256, 0)

    assert (
        cli.main(args[:2] + ["--workers", "4", "--elements", "4096", "--slots", "8"] + args[6:])
        == 0
    )
    rows = json.loads(capsys.readouterr().out)["results"]
    assert rows and all((r["slots"], r["pipe_max"]) == (8, 0) for r in rows)


def test_scale_flags_an_inexact_result(monkeypatch):
    """The exactness check can fail: a wrong reference is caught."""
    grads = workloads.generate_all("shared", 3, 4096, 0.1, 1)
    want = codec.simulate_allreduce(grads, method="dense", block_elements=1024).sum.copy()
    row, _ = scale.run_one(grads, "dense", 100.0, 1024, 16, 0, want=want)
    assert row["exact"] is True
    k = int(np.flatnonzero(want)[0])
    want[k] = np.nextafter(want[k], np.float32(np.inf))
    row, _ = scale.run_one(grads, "dense", 100.0, 1024, 16, 0, want=want)
    assert row["exact"] is False


# ---- allreduce on the testbed ---------------------------------------------


def _homagg_available():
    from homagg.bench import allreduce

    return allreduce.homagg_run_available()[0]


@pytest.mark.root
@pytest.mark.netns
@pytest.mark.slow
def test_allreduce_on_a_two_worker_testbed(tmp_path, capsys):
    require(os.geteuid() == 0, "needs root (network namespaces)")
    require(
        importlib.util.find_spec("torch") is not None,
        "the Gloo baseline needs torch==2.13.0 (make build installs it)",
    )
    name = f"tb{os.getpid() % 100000}"
    out = tmp_path / "ar"
    methods = ["gloo", "dense", "lhc", "nc"]
    rc = cli.main(
        [
            "bench",
            "allreduce",
            "--methods",
            ",".join(methods),
            "--workloads",
            "shared,dense",
            "--workers",
            "2",
            "--elements",
            "16384",
            "--densities",
            "0.05",
            "--repeat",
            "2",
            "--warmup",
            "1",
            "--link-mbit",
            "1000",
            "--testbed-name",
            name,
            "--state-dir",
            str(tmp_path / "state"),
            "--json",
            "--out",
            str(out),
        ]
    )
    printed = json.loads(capsys.readouterr().out)
    report, _rows = _check_outputs(
        out, "allreduce", ["allreduce_time.png", "allreduce_speedup.png", "allreduce_workers.png"]
    )
    assert printed["results"] == report["results"]
    assert report["link_mbit"] == [1000.0]
    assert rc == 0
    rows = report["results"]
    assert {(r["method"], r["workload"], r["density"]) for r in rows} == {
        (m, w, d) for m in methods for w, d in (("shared", 0.05), ("dense", 1.0))
    }
    homagg = _homagg_available()
    for r in rows:
        assert r["workers"] == 2 and r["elements"] == 16384
        if r["method"] == "gloo" or homagg:
            assert r["status"] == "ok", r["status"]
            assert r["runs"] == 2
            assert r["seconds_min"] <= r["seconds_median"] <= r["seconds_max"]
            assert r["bytes_per_worker"] > 0
            assert r["link_mbit"] == 1000.0 and 0 < r["link_utilisation"]
            assert len(r["worker_cpu_seconds"]) == 2
            assert all(c > 0 for c in r["worker_cpu_seconds"])
            if r["method"] == "gloo":
                assert r["timeouts_per_allreduce"] is None
            else:
                # reported for every HomAgg row; how many there are on a
                # lossless testbed is the host's scheduling (none in the
                # seeded NIC model: tests/test_sim.py)
                assert r["timeouts_per_allreduce"] >= 0
                assert r["retransmissions_per_allreduce"] >= 0
                assert r["daemon_cpu_seconds"] is None or r["daemon_cpu_seconds"] >= 0
            if r["method"] == "nc":
                assert r["exact"] is None
            else:
                assert r["exact"] is True
            assert r["speedup_vs_gloo"] == pytest.approx(
                next(
                    g
                    for g in rows
                    if g["method"] == "gloo"
                    and g["workload"] == r["workload"]
                    and g["density"] == r["density"]
                )["seconds_median"]
                / r["seconds_median"]
            )
        else:  # never numbers without a run
            assert r["status"].startswith("unavailable: ")
            assert "seconds_median" not in r and r["speedup_vs_gloo"] is None
    gloo = [r for r in rows if r["method"] == "gloo"]
    assert all(isinstance(r["cpu_bound"], bool) for r in gloo)
    # The testbed is gone.
    from homagg.deploy.local.testbed import Testbed

    assert name not in Testbed.list(str(tmp_path / "state"))


def test_allreduce_needs_root(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    rc = cli.main(["bench", "allreduce", "--methods", "gloo", "--workers", "2"])
    assert rc == 2
    assert "root" in capsys.readouterr().err


# ---- allreduce harness logic (no testbed) ----------------------------------


def _args(**kw):
    import argparse

    ns = dict(warmup=1, repeat=3, link_mbit=1000.0, seed=1, timeout=5.0, state_dir=None)
    ns.update(kw)
    return argparse.Namespace(**ns)


def test_homagg_rows_never_carry_numbers_without_a_run(monkeypatch):
    from homagg.bench import allreduce

    monkeypatch.setattr(allreduce, "homagg_run_available", lambda: (False, "no daemon"))
    row = allreduce.homagg_row("x", "lhc", 2, 1024, "shared", 0.1, 1000.0, _args())
    assert row == {"status": "unavailable: no daemon"}

    def boom(*a, **k):
        raise RuntimeError("switch did not start")

    monkeypatch.setattr(allreduce, "homagg_run_available", lambda: (True, None))
    monkeypatch.setattr(allreduce, "homagg_via_run_allreduce", boom)
    row = allreduce.homagg_row("x", "lhc", 2, 1024, "shared", 0.1, 1000.0, _args())
    assert row["status"].startswith("failed: RuntimeError: switch did not start")
    assert "seconds_median" not in row


def _run_report(**kw):
    """What homagg.runs.allreduce.run_allreduce returns for repeat timed calls."""
    r = {
        "seconds_each": [0.3, 0.1, 0.2],
        "bytes_per_worker": [200, 200],
        "exact": True,
        "workers_agree": True,
        "worker_cpu_seconds": [0.135, 0.135],
        "daemon_cpu_seconds": None,
        "worker_stats_timed": [
            {
                "timeouts": 1,
                "spurious_timeouts": 1,
                "fast_retransmissions": 2,
                "retransmissions": 3,
            },
            {
                "timeouts": 0,
                "spurious_timeouts": 0,
                "fast_retransmissions": 3,
                "retransmissions": 3,
            },
        ],
        "worker_stats": [{"auto_dense_groups": 2, "auto_blocks_groups": 1, "auto_union_groups": 5}]
        * 2,
    }
    r.update(kw)
    return r


def test_homagg_row_statistics_and_exactness(monkeypatch):
    """median/min/max/IQR come from the timed calls, an inexact result makes
    the row inexact, CPU time gives cpu_bound, the workers' counters are
    summed per allreduce."""
    from homagg.bench import allreduce

    monkeypatch.setattr(allreduce, "homagg_run_available", lambda: (True, None))
    monkeypatch.setattr(
        allreduce, "homagg_via_run_allreduce", lambda *a, **k: _run_report(exact=False)
    )
    row = allreduce.homagg_row("x", "dense", 2, 1000, "shared", 0.1, 1000.0, _args())
    assert row["status"] == "ok" and row["runs"] == 3
    assert (row["seconds_min"], row["seconds_median"], row["seconds_max"]) == (0.1, 0.2, 0.3)
    assert row["seconds_q1"] == pytest.approx(0.15) and row["seconds_q3"] == pytest.approx(0.25)
    assert row["bytes_per_worker"] == 200
    assert row["algbw_gbps"] == pytest.approx(8 * 4000 / 0.2 / 1e9)
    assert row["link_utilisation"] == pytest.approx(8 * 200 / 0.2 / 1e9)
    assert row["link_bound"] is False
    assert row["exact"] is False
    # 3 calls x 0.135 CPU-seconds of 2 workers over 0.6 s on min(cores, 2) cores
    assert row["cpu_fraction_machine"] == pytest.approx(0.81 / (0.6 * min(os.cpu_count(), 2)))
    assert row["cpu_bound"] is (
        row["cpu_fraction_machine"] > 0.8 or row["cpu_fraction_rank_max"] > 0.9
    )
    assert row["worker_cpu_seconds"] == pytest.approx([0.135, 0.135])
    assert row["timeouts_per_allreduce"] == pytest.approx(1 / 3)
    assert row["spurious_timeouts_per_allreduce"] == pytest.approx(1 / 3)
    assert row["fast_retransmissions_per_allreduce"] == pytest.approx(5 / 3)
    assert row["retransmissions_per_allreduce"] == pytest.approx(2)
    monkeypatch.setattr(allreduce, "homagg_via_run_allreduce", lambda *a, **k: _run_report())
    assert (
        allreduce.homagg_row("x", "dense", 2, 1000, "shared", 0.1, 1000.0, _args())["exact"] is True
    )


def test_homagg_row_counts_the_daemons_cpu(monkeypatch):
    """The aggregator daemon shares the machine's cores with the workers: its
    CPU seconds count toward cpu_bound (workers alone would not flag it)."""
    from homagg.bench import allreduce

    def run(daemon):
        return _run_report(
            seconds_each=[0.5], worker_cpu_seconds=[0.15, 0.15], daemon_cpu_seconds=daemon
        )

    monkeypatch.setattr(allreduce, "homagg_run_available", lambda: (True, None))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(allreduce, "homagg_via_run_allreduce", lambda *a, **k: run(None))
    alone = allreduce.homagg_row(
        "x", "lhc", 2, 1000, "shared", 0.1, 1000.0, _args(warmup=1, repeat=1)
    )
    assert alone["cpu_fraction_machine"] == pytest.approx(0.3 / (0.5 * 2))
    assert alone["cpu_fraction_daemon"] is None and alone["cpu_bound"] is False
    monkeypatch.setattr(allreduce, "homagg_via_run_allreduce", lambda *a, **k: run(0.4))
    with_daemon = allreduce.homagg_row(
        "x", "lhc", 2, 1000, "shared", 0.1, 1000.0, _args(warmup=1, repeat=1)
    )
    assert with_daemon["cpu_fraction_machine"] == pytest.approx(0.7 / (0.5 * 2))
    assert with_daemon["cpu_fraction_daemon"] == pytest.approx(0.8)
    assert with_daemon["cpu_fraction_rank_max"] == pytest.approx(0.8)
    assert with_daemon["daemon_cpu_seconds"] == pytest.approx(0.4)
    assert with_daemon["cpu_bound"] is False  # 0.7 of 2 cores, 0.8 of one
    monkeypatch.setattr(allreduce, "homagg_via_run_allreduce", lambda *a, **k: run(0.6))
    assert (
        allreduce.homagg_row("x", "lhc", 2, 1000, "shared", 0.1, 1000.0, _args(warmup=1, repeat=1))[
            "cpu_bound"
        ]
        is True
    )


def test_link_rate_sweep_plot(tmp_path):
    """Several --link-mbit rates: the density plots use 1000 Mbit/s, and
    allreduce_linkrate.png plots the speedup against the rate."""
    from homagg.bench import allreduce

    rows = []
    for rate, g, m in ((100.0, 8.0, 0.5), (1000.0, 1.0, 0.4), (10000.0, 0.2, 0.3)):
        for meth, t in (("gloo", g), ("lhc", m)):
            rows.append(
                {
                    "method": meth,
                    "workers": 4,
                    "link_mbit": rate,
                    "workload": "shared",
                    "density": 0.05,
                    "status": "ok",
                    "seconds_median": t,
                    "speedup_vs_gloo": g / t,
                }
            )
    report = {"link_mbit": [100.0, 1000.0, 10000.0], "elements": 1024, "results": rows}
    assert allreduce.reference_rate(report) == 1000.0
    assert allreduce.reference_rate({"link_mbit": [100.0, 2500.0]}) == 100.0
    paths = allreduce.plot(report, str(tmp_path))
    names = sorted(os.path.basename(p) for p in paths)
    assert names == [
        "allreduce_linkrate.png",
        "allreduce_speedup.png",
        "allreduce_time.png",
        "allreduce_workers.png",
    ]
    for p in paths:
        assert os.path.getsize(p) > 1000


def test_homagg_row_payload_and_cpu_per_mb(monkeypatch):
    """--payload-bytes reaches homagg run; cpu_ms_per_mb is the workers' and
    the daemon's CPU per MB on the workers' links, per allreduce."""
    from homagg.bench import allreduce

    seen = []

    def fake(*a, payload=1024, **k):
        seen.append(payload)
        return _run_report(
            seconds_each=[0.5, 0.5, 0.5],
            bytes_per_worker=[2_000_000, 2_000_000],
            worker_cpu_seconds=[0.1, 0.1],
            daemon_cpu_seconds=0.2,
        )

    monkeypatch.setattr(allreduce, "homagg_run_available", lambda: (True, None))
    monkeypatch.setattr(allreduce, "homagg_via_run_allreduce", fake)
    row = allreduce.homagg_row("x", "dense", 2, 1000, "shared", 0.1, 1000.0, _args(), payload=8192)
    assert seen == [8192] and row["payload_bytes"] == 8192
    assert row["cpu_ms_per_mb"] == pytest.approx(1e3 * 0.4 / 4.0)
    assert row["worker_cpu_seconds"] == pytest.approx([0.1, 0.1])
    assert row["daemon_cpu_seconds"] == pytest.approx(0.2)


@pytest.mark.root
@pytest.mark.netns
@pytest.mark.dpdk
@pytest.mark.timeout(300)
def test_bench_lcores_outputs(tmp_path, capsys):
    """`homagg bench lcores`: one job on a daemon with 1 and 2 engine
    lcores, exact both ways, the 2-lcore runs spread over both engines
    (each sums half the contributions: consecutive slots alternate);
    timing is reported, not judged."""
    require(os.geteuid() == 0, "needs root (network namespaces)")
    report = run_testbed_bench(
        tmp_path,
        capsys,
        "lcores",
        "--workers",
        "2",
        "--elements",
        "60000",
        "--repeat",
        "1",
        "--calls",
        "1",
    )
    one, two = report["results"]
    assert (one["lcores"], two["lcores"]) == (1, 2)
    assert one["exact"] is True and two["exact"] is True
    assert len(one["engine_summed"]) == 1 and len(two["engine_summed"]) == 2
    # the summed contributions are the same work, split evenly by slot
    assert sum(two["engine_summed"]) == sum(one["engine_summed"]) > 0
    assert abs(two["engine_summed"][0] - two["engine_summed"][1]) <= 0.1 * sum(two["engine_summed"])
    assert report["summary"]["1"]["speedup_vs_1"] == 1.0


def test_pipeline_groups_rows_and_speedup_vs_unpipelined(monkeypatch):
    """--pipeline-groups 0,1: the pipelined methods (all, auto too) run once
    per value, the value reaches homagg run, and every row of the method
    gets the unpipelined row's median / its own."""
    from homagg.bench import allreduce

    seen = []
    times = {0: [0.2, 0.2, 0.2], 1: [0.3, 0.3, 0.3]}

    def fake(testbed, method, *a, pipeline_groups=0, **k):
        seen.append((method, pipeline_groups))
        return _run_report(seconds_each=times[pipeline_groups])

    monkeypatch.setattr(allreduce, "homagg_run_available", lambda: (True, None))
    monkeypatch.setattr(allreduce, "homagg_via_run_allreduce", fake)
    row = allreduce.homagg_row(
        "x", "dense", 2, 1000, "shared", 0.1, 1000.0, _args(), pipeline_groups=0
    )
    assert seen == [("dense", 0)] and row["pipeline_groups"] == 0
    auto = allreduce.homagg_row(
        "x", "auto", 2, 1000, "shared", 0.1, 1000.0, _args(), pipeline_groups=0
    )
    assert seen[-1] == ("auto", 0) and auto["pipeline_groups"] == 0
    # auto's choices per group, from the last call's worker stats
    assert auto["auto_groups"] == {"dense": 2, "blocks": 1, "union": 5}
    assert row["auto_groups"] is None
    rows = {
        f"dense/groups{g}": {
            "method": "dense",
            **allreduce.homagg_row(
                "x", "dense", 2, 1000, "shared", 0.1, 1000.0, _args(), pipeline_groups=g
            ),
        }
        for g in (0, 1)
    }
    allreduce._pipeline_ratios(rows, "dense", 1024, [0, 1], False)
    assert rows["dense/groups0"]["speedup_vs_unpipelined"] == pytest.approx(1.5)
    assert rows["dense/groups1"]["speedup_vs_unpipelined"] == pytest.approx(1.0)


def test_gloo_check_in_passes():
    """The Gloo ranks' check (float32 result vs the float64 sum within the
    summation bound) gives the same verdict in passes as in one: the
    float32 sum passes, one element off in a later pass fails."""
    from homagg.bench import gloo_worker

    rng = np.random.default_rng(3)
    grads = [rng.standard_normal(10_000).astype(np.float32) for _ in range(4)]
    y = grads[0] + grads[1] + grads[2] + grads[3]
    ok, err = gloo_worker._check(y, grads, step=1000)
    assert ok and err == gloo_worker._check(y, grads, step=1 << 20)[1]
    y[7777] += 1e-3
    ok, err = gloo_worker._check(y, grads, step=1000)
    assert not ok and err >= 1e-3 * 0.99


def test_jumbo_payloads_get_a_testbed_of_their_own():
    """Payloads an MTU of 1500 holds run on MTU 1500 links, larger ones on a
    second testbed with MTU 9000 (Gloo runs on each, so every speedup is
    against Gloo on links of the same MTU); the plot series name them."""
    from homagg.bench import allreduce
    from homagg.worker import max_payload

    assert allreduce.mtu_groups([1024]) == [(1500, [1024])]
    assert allreduce.mtu_groups([8192]) == [(9000, [8192])]
    edge = max_payload(1500)
    assert allreduce.mtu_groups([8192, 1024, edge + 4, edge]) == [
        (1500, [1024, edge]),
        (9000, [8192, edge + 4]),
    ]
    report = {"payload_bytes": [1024, 8192]}
    assert (
        allreduce.series({"method": "auto", "payload_bytes": 8192, "mtu": 9000}, report)
        == "auto 8192 B MTU 9000"
    )
    assert (
        allreduce.series({"method": "gloo", "payload_bytes": None, "mtu": 9000}, report)
        == "gloo MTU 9000"
    )
    assert (
        allreduce.series(
            {"method": "auto", "payload_bytes": 1024, "mtu": 1500}, {"payload_bytes": [1024]}
        )
        == "auto"
    )
    line = allreduce._line(
        {
            "workers": 4,
            "link_mbit": 1000.0,
            "method": "auto",
            "workload": "shared",
            "density": 0.05,
            "payload_bytes": 8192,
            "mtu": 9000,
            "status": "ok",
            "seconds_median": 0.1,
            "seconds_min": 0.1,
            "seconds_max": 0.1,
            "bytes_per_worker": 1e6,
            "link_utilisation": 0.08,
            "exact": True,
            "cpu_bound": False,
            "machine_busy": 0.5,
        }
    )
    assert "8192 B MTU 9000" in line and "machine 50% busy" in line


def test_machine_busy_counts_every_core_and_softirq():
    """homagg.runs.job.machine_busy: busy = all but idle and iowait over the
    eight /proc/stat fields, softirq its own share; a live reading is a
    fraction."""
    from homagg.runs import job

    before = [100, 0, 50, 1000, 10, 0, 20, 0, 0, 0]
    after = [200, 0, 150, 1100, 10, 0, 120, 0, 0, 0]  # 100 user, 100 sys, 100 idle, 100 softirq
    m = job.machine_busy(before, after)
    assert m["busy"] == pytest.approx(0.75) and m["softirq"] == pytest.approx(0.25)
    t0 = job.machine_cpu_times()
    sum(i * i for i in range(200_000))
    live = job.machine_busy(t0, job.machine_cpu_times())
    assert 0 <= live["softirq"] <= live["busy"] <= 1 and live["cores"] >= 1


def test_a_busy_machine_makes_a_row_cpu_bound(monkeypatch):
    """A row whose processes used little CPU is still cpu_bound when the
    whole machine was busy over its timed calls (machine_busy)."""
    from homagg.bench import allreduce

    def run(busy):
        r = _run_report(
            seconds_each=[1.0, 1.0, 1.0], worker_cpu_seconds=[0.1, 0.1], daemon_cpu_seconds=0.1
        )
        r["machine_cpu"] = {"busy": busy, "softirq": 0.2, "cores": 2}
        return r

    monkeypatch.setattr(allreduce, "homagg_run_available", lambda: (True, None))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    for busy, bound in ((0.5, False), (0.95, True)):
        monkeypatch.setattr(allreduce, "homagg_via_run_allreduce", lambda *a, **k: run(busy))
        row = allreduce.homagg_row("x", "dense", 2, 1000, "shared", 0.1, 1000.0, _args())
        assert row["machine_busy"] == busy and row["cpu_bound"] is bound


def test_scale_recovery_rows_for_drop_rates_and_stragglers(tmp_path, capsys):
    """--drop-rate and --straggler-ms take lists: one row per combination,
    flat and tree, each exact, with timeouts, start probes and its time
    over the loss-free punctual row; a straggler alone costs the punctual
    workers no timeout (seeded NIC model), and scale_recovery.png plots
    them."""
    out = tmp_path / "scale"
    rc = cli.main(
        [
            "bench",
            "scale",
            "--workers",
            "4",
            "--elements",
            "20000",
            "--density",
            "0.05",
            "--methods",
            "dense",
            "--leaves",
            "2",
            "--drop-rate",
            "0,0.02",
            "--straggler-ms",
            "0,5",
            "--seed",
            "2",
            "--json",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    rows = report["results"]
    assert len(rows) == 2 * 2 * 2  # (flat, tree) x drop rates x stragglers
    for r in rows:
        assert r["exact"] is True
        assert r["start_probes"] <= r["retransmissions"]
        if not r["drop_rate"] and not r["straggler_ms"]:
            assert r["vs_clean"] == 1.0 and r["retransmissions"] == 0
        if r["straggler_ms"] and not r["drop_rate"]:
            assert r["timeouts_punctual"] == 0
            assert r["virtual_seconds"] >= r["straggler_ms"] / 1e3
            assert r["retransmissions"] == r["start_probes"]
    assert (out / "scale_recovery.png").stat().st_size > 0
    assert report["straggler_ms"] == [0.0, 5.0]


def test_scale_pipe_gain_rows_each_over_its_own_loss_free_row(capsys):
    """--pipe-gain takes a list: one row per gain, each row's vs_clean over
    the loss-free row of its own gain (docs/PROTOCOL.md Part 3, "The
    pipe").  W = 16 on 1 Gbit/s links at 1 % loss (seeded NIC model): the
    loss-free time is the same with and without the bound, and the lossy
    allreduce is shorter with it; a gain outside 0..10 is refused with
    the option named."""
    rc = cli.main(
        [
            "bench",
            "scale",
            "--workers",
            "16",
            "--elements",
            "65536",
            "--workload",
            "dense",
            "--methods",
            "dense",
            "--drop-rate",
            "0,0.01",
            "--link-gbps",
            "1",
            "--pipe-gain",
            "0,2",
            "--seed",
            "3",
            "--json",
        ]
    )
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    rows = {(r["pipe_gain"], r["drop_rate"]): r for r in report["results"]}
    assert sorted(rows) == [(0.0, 0.0), (0.0, 0.01), (2.0, 0.0), (2.0, 0.01)]
    assert report["pipe_gain"] == [0.0, 2.0]
    for (gain, drop), r in rows.items():
        assert r["exact"] is True
        clean = rows[(gain, 0.0)]
        assert r["vs_clean"] == pytest.approx(r["virtual_seconds"] / clean["virtual_seconds"])
    assert rows[(2.0, 0.0)]["virtual_seconds"] == pytest.approx(
        rows[(0.0, 0.0)]["virtual_seconds"], rel=1e-3
    )
    assert rows[(2.0, 0.01)]["virtual_seconds"] < rows[(0.0, 0.01)]["virtual_seconds"]
    with pytest.raises(SystemExit):
        cli.main(["bench", "scale", "--pipe-gain", "0,11"])
    assert "--pipe-gain" in capsys.readouterr().err


def test_auth_rounds_alternate_and_give_the_median_ratio():
    """--auth --rounds R: after the method's row, its authenticated row, then
    R - 1 more pairs without then with authentication; the ratio is the
    median of the rounds' (a failed row gives none), each round's kept."""
    from homagg.bench import allreduce

    seen = []
    plain_times = iter([0.10, 0.20, 0.10])
    auth_times = iter([0.11, 0.30, None, 0.12])

    def again(auth):
        seen.append(auth)
        t = next(auth_times) if auth else next(plain_times)
        return {"seconds_median": t, "status": "ok" if t else "failed: x"}

    row = allreduce.auth_rounds(again, {"seconds_median": 0.10}, 4)
    assert seen == [True, False, True, False, True, False, True]
    assert row["time_vs_unauthenticated_rounds"] == pytest.approx([1.1, 3.0, None, 1.2])
    assert row["time_vs_unauthenticated"] == pytest.approx(1.2)
    assert row["seconds_median"] == 0.11  # the first round's row
    one = allreduce.auth_rounds(lambda auth: {"seconds_median": 0.3}, {"seconds_median": 0.2}, 1)
    assert one["time_vs_unauthenticated"] == pytest.approx(1.5)
    assert "time_vs_unauthenticated_rounds" not in one


def test_rounds_without_auth_is_refused(capsys):
    from homagg import cli

    rc = cli.main(["bench", "allreduce", "--methods", "dense", "--rounds", "3"])
    assert rc == 2 and "--rounds alternates the runs without and with" in capsys.readouterr().err


def test_plot_without_gloo_rows_marks_the_empty_panels(tmp_path):
    """`--methods dense,auto` (no Gloo): the speedup panels have no line;
    each says why instead of an empty legend's warning."""
    import warnings

    from homagg.bench import allreduce

    rows = [
        {
            "method": m,
            "workers": 4,
            "link_mbit": 1000.0,
            "workload": "shared",
            "density": 0.05,
            "status": "ok",
            "seconds_median": t,
        }
        for m, t in (("dense", 0.05), ("auto", 0.007))
    ]
    report = {"link_mbit": [1000.0], "elements": 1024, "results": rows}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        paths = allreduce.plot(report, str(tmp_path))
    assert sorted(os.path.basename(p) for p in paths) == [
        "allreduce_speedup.png",
        "allreduce_time.png",
        "allreduce_workers.png",
    ]
    plt = allreduce.rep.pyplot()
    fig, ax = plt.subplots()
    allreduce._legend(ax)
    fig_texts = [t.get_text() for t in ax.texts]
    plt.close(fig)
    assert fig_texts and "gloo" in fig_texts[0]
