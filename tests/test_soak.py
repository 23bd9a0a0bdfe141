"""`homagg bench soak`: back-to-back allreduces on the testbed with 1 % loss
and daemon restarts, about one minute; and the counter accounting it
checks every daemon life with."""

import json
import os
import subprocess
import sys

import pytest

from homagg.runs.session import accounting

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _stats(**port):
    """A consistent stats reply: 100 frames at the ethdev, 2 injected drops,
    1 ARP request, 97 to the engine: 90 summed, 5 duplicates, 2 stale."""
    p = dict(
        ipackets=100,
        drop_injected=2,
        drop_segmented=0,
        arp_replies=1,
        arp_other=0,
        rx=97,
        tx=40,
        tx_refused=0,
        alloc_fail=0,
        dispatch_full=0,
    )
    p.update(port)
    eng = dict(
        received=97,
        summed=90,
        duplicates=5,
        stale=2,
        completed=30,
        replays=1,
        results_sent=31,
        status_sent=3,
        not_ip=0,
    )
    return {"ok": True, "stats": eng, "port": p, "engines": 1}


def test_accounting_consistent_and_each_way_it_breaks():
    assert accounting(_stats())["consistent"] is True
    # a frame the ethdev counted that no port counter has
    assert accounting(_stats(ipackets=101))["consistent"] is False
    # the port handed on a frame the engine never counted
    assert accounting(_stats(rx=98, ipackets=101))["consistent"] is False
    # a frame the engine received without an outcome
    st = _stats()
    st["stats"]["summed"] -= 1
    assert accounting(st)["consistent"] is False
    # a frame with two outcomes
    st = _stats()
    st["stats"]["not_ip"] += 1
    assert accounting(st)["consistent"] is False
    # frames a full engine ring refused are accounted for by dispatch_full
    st = _stats(dispatch_full=3)
    st["stats"]["received"] -= 3
    st["stats"]["summed"] -= 3
    assert accounting(st)["consistent"] is True


@pytest.mark.root
@pytest.mark.netns
@pytest.mark.dpdk
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_soak_one_minute(tmp_path):
    proc = subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "homagg"),
            "bench",
            "soak",
            "--minutes",
            "1",
            "--restart-every",
            "20",
            "--progress",
            "15",
            "--drop-rate",
            "0.01",
            # its draws are reproducible: every method within the first 7
            "--seed",
            "2",
            "--state-dir",
            str(tmp_path / "tb"),
            "--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=380,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rep = json.loads(proc.stdout.strip().splitlines()[-1])
    # progress lines on stderr while it ran
    assert "soak: " in proc.stderr and "allreduces" in proc.stderr
    assert rep["allreduces"] > 0 and rep["all_good"] is True
    assert rep["failures"] == []
    assert rep["exact"] == rep["exact_checked"] > 0
    assert sum(rep["per_method"].values()) == rep["allreduces"]
    assert all(rep["per_method"].values()), rep["per_method"]
    # the restarts happened between allreduces and every life served some
    # (how many restarts fit into the minute depends on the host's load:
    # each takes an EAL start)
    assert rep["seed"] == 2
    assert rep["daemon_restarts"] >= 1
    assert all(lf["allreduces"] > 0 for lf in rep["lives"]), rep["lives"]
    # 1 % loss was injected and repaired by retransmission
    assert rep["frames_dropped_by_port"] > 0 and rep["retransmissions"] > 0
    # every frame accounted for by exactly one counter, in every life
    assert rep["counters_consistent"] is True
    for lf in rep["lives"]:
        a = lf["accounting"]
        assert a["ethdev_received"] == a["port_outcomes"] > 0
        assert a["engine_received"] == a["engine_outcomes"] > 0
        # the resident set stays flat within a life (pool, rings and job
        # tables are allocated at start; nothing grows per allreduce)
        assert lf["rss_end_kb"] <= lf["rss_start_kb"] * 1.05, lf
