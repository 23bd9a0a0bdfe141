"""The engine benchmark runs and its frames are all valid and complete."""

import json

import pytest

from homagg.bench import engine as bench_engine


@pytest.mark.parametrize("multicast,udp_csum", [(True, False), (False, True)])
def test_bench_engine_runs_clean(multicast, udp_csum):
    r = bench_engine.run(
        4, payload_bytes=256, slots=4, seconds=0.05, multicast=multicast, udp_csum=udp_csum
    )
    assert r["dropped"] == 0
    assert r["packets"] > 0 and r["packets"] % 16 == 0
    # Every chunk completed: W frames each, one result (multicast) or W.
    assert r["completed"] == r["packets"] // 4
    assert r["results_sent"] == r["completed"] * (1 if multicast else 4)
    assert r["mpps"] > 0 and r["raw_kernel_mpps"] > 0


def test_bench_engine_cli_json(capsys):
    import argparse

    p = argparse.ArgumentParser()
    bench_engine.add_arguments(p)
    assert bench_engine.main(p.parse_args(["--workers", "2", "--seconds", "0.02", "--json"])) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["workers"] == 2 and rows[0]["payload_bytes"] == 1024
    assert {"mpps", "raw_kernel_mpps"} <= rows[0].keys()


def test_bench_engine_one_at_a_time_phase():
    """--one-at-a-time: the unstaged engine in the same run, every chunk of
    both engine phases completed, nothing dropped."""
    r = bench_engine.run(4, payload_bytes=8192, slots=4, seconds=0.05, one_at_a_time=True)
    assert r["dropped"] == 0
    assert r["one_at_a_time_mpps"] > 0 and r["mpps"] > 0
    assert r["staged_vs_one_at_a_time"] == pytest.approx(r["mpps"] / r["one_at_a_time_mpps"])
    # the engine's counters cover the frames of both phases
    assert r["completed"] * 4 == r["packets"] + r["one_at_a_time_packets"]
