"""Restarts and failures on the DPDK testbed (docs/SWITCH.md, "Restarts and
failures"): one job, homagg-switch and 4 worker processes kept by a
homagg.runs.session.Session, and each case asserting its documented outcome:

- the daemon killed (SIGKILL) in the middle of an allreduce and restarted;
- one worker killed (SIGKILL) in the middle of an allreduce and restarted;
- the daemon restarted between allreduces.

Processes are started and killed by their PIDs; every allreduce that
completes is checked bit for bit against the fixed-point reference."""

import signal
import time

import pytest

from helpers import dpdk_testbed
from homagg.runs import allreduce as runmod
from homagg.runs.session import Session

pytestmark = [
    pytest.mark.root,
    pytest.mark.netns,
    pytest.mark.dpdk,
    pytest.mark.slow,
    pytest.mark.timeout(300),
]

TIMEOUT = 3.0  # the workers' give-up time (seconds)
RESTART_TIMEOUT = 20.0  # theirs while the daemon restarts
BIG = 2_000_000  # elements of an allreduce long enough to interrupt


@pytest.fixture(scope="module")
def testbed(tmp_path_factory):
    with dpdk_testbed(tmp_path_factory, "kchaos", workers=4, link_mbit=1000) as tb:
        yield tb


@pytest.fixture
def session(testbed, tmp_path):
    with Session(testbed, str(tmp_path), timeout=TIMEOUT) as s:
        yield s
    assert testbed.state()["processes"] == []


def _mid_allreduce(s, method="dense", seed=11):
    """Start a long allreduce and return once the daemon has summed some of
    it (so what follows happens in its middle)."""
    base = s.stats()["stats"]["summed"]
    a = s.begin_allreduce(method, BIG, 1.0, seed=seed)
    deadline = time.monotonic() + 30
    while s.stats()["stats"]["summed"] < base + 256:
        assert time.monotonic() < deadline, "the allreduce did not start"
        time.sleep(0.002)
    return a


def _assert_exact_allreduce(s, seed):
    r = s.allreduce("lhc", 100_000, 0.05, seed=seed)
    assert r["ok"], r["errors"]
    assert r["exact"] is True, r["exact_per_worker"]


def test_daemon_killed_mid_allreduce_and_restarted(testbed, tmp_path):
    """Documented outcome: the new daemon's replies carry the job's new
    incarnation, so every worker ends the allreduce within its timeout with
    PeerRestarted naming the aggregator and both incarnations (PeerTimeout
    if no reply of the new daemon reached it in time); nothing of the
    killed daemon's partial sums is used.  After recovery the next
    allreduce is exact."""
    # a give-up time that outlasts the daemon's restart (the reaping of the
    # killed one and an EAL start) on a loaded host: the workers see the
    # new incarnation
    with Session(testbed, str(tmp_path), timeout=RESTART_TIMEOUT) as s:
        a = _mid_allreduce(s)
        s.kill_switch(signal.SIGKILL)
        s.start_switch()  # a new daemon, the job added again
        old, new = s.incarnations[-2], s.incarnations[-1]
        assert old != new
        r = s.finish_allreduce(a)
        assert not r["ok"]
        kinds = [w["kind"] for w in r["workers"]]
        assert set(kinds) <= {"PeerRestarted", "PeerTimeout"}, r["workers"]
        assert "PeerRestarted" in kinds, r["workers"]
        agg = f"{s.tb.aggregator.ip}:{runmod.UDP_PORT}"
        for w in r["workers"]:
            if w["kind"] == "PeerRestarted":
                assert (
                    f"aggregator {agg} restarted during the allreduce (incarnation {old}, now {new})"
                ) in w["error"], w["error"]
            else:
                want = f"aggregator {agg}: timed out after {RESTART_TIMEOUT:g} s"
                assert want in w["error"], w["error"]
        s.recover()
        _assert_exact_allreduce(s, seed=31)
    assert testbed.state()["processes"] == []


def test_worker_killed_mid_allreduce_and_restarted(session):
    """Documented outcome: the other workers fail within their timeout with
    PeerTimeout naming the aggregator, the chunk they waited for and the
    missing worker: their stalled window is sent again whole, so every
    open chunk has a STATUS from the daemon.  After recovery (job re-added,
    every client new) the next allreduce is exact."""
    s = session
    victim = 1
    old_pid = s.worker_pid(victim)
    a = _mid_allreduce(s)
    s.kill_worker(victim)
    s.start_worker(victim)  # back at once, a new process
    assert s.worker_pid(victim) != old_pid
    r = s.finish_allreduce(a)
    assert not r["ok"]
    others = [w for i, w in enumerate(r["workers"]) if i != victim]
    assert [w["kind"] for w in others] == ["PeerTimeout"] * 3, r["workers"]
    agg = f"{s.tb.aggregator.ip}:{runmod.UDP_PORT}"
    for w in others:
        assert f"aggregator {agg}: timed out after {TIMEOUT:g} s waiting for chunk" in w["error"]
        assert f"reports workers 0,2,3 present, missing worker {victim}" in w["error"], w["error"]
    assert r["workers"][victim]["kind"] == "killed"
    s.recover()
    _assert_exact_allreduce(s, seed=12)


def test_daemon_restarted_between_allreduces(session):
    """Documented outcome: the next allreduce of the same worker clients
    completes exact on the new daemon once the job is added again."""
    s = session
    _assert_exact_allreduce(s, seed=21)
    old = s.switch_pid()
    s.restart_switch(signal.SIGKILL)
    assert s.switch_pid() != old
    _assert_exact_allreduce(s, seed=22)
    s.restart_switch(signal.SIGTERM)
    _assert_exact_allreduce(s, seed=23)
