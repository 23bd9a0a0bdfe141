"""homagg-switch end to end on one machine, without the testbed.

Two network namespaces the test creates, joined by a veth pair: the daemon
runs in one on net_af_packet over its veth end, W workers (threads, each
in the other namespace) use the kernel UDP port backend and the C client.
Results are checked bit for bit against the numpy fixed-point oracle
(tests/reference.py); loss is injected by the daemon (--drop-rate) since
the kernel has no netem; a killed daemon makes every worker fail within its
timeout naming the aggregator; a restarted daemon serves a new job.
"""

import signal
import time

import pytest

from homagg.switch.control import ControlError
from homagg.errors import PeerTimeout

from reference import allreduce as oracle_allreduce
from helpers import cpu_flags, wait_for
from switch_helpers import BLOCK, GROUP, Daemon, gradients, join_all, run_workers

pytestmark = [pytest.mark.dpdk, pytest.mark.root, pytest.mark.netns]


def exact_allreduce(link, d, job, token, grads, method, **kw):
    """Register a job of len(grads) workers on daemon d, run them on link
    and check every result bit for bit against the oracle; the workers'
    stats."""
    W = len(grads)
    with d.client() as c:
        c.add_job(job=job, token=token, workers=W, slots=32, group=GROUP)
    threads, results, errors, stats = run_workers(link, job, token, grads, method, **kw)
    join_all(threads, 60)
    assert errors == [None] * W, errors
    expected = oracle_allreduce(grads, BLOCK)
    for y in results:
        assert y.tobytes() == expected.tobytes()
    return stats


@pytest.mark.parametrize(
    "method, pmd", [("dense", "af_packet"), ("lhc", "af_packet"), ("dense", "af_xdp")]
)
def test_exact_allreduce_through_the_daemon(link, daemons, method, pmd):
    d = daemons(pmd=pmd)
    exact_allreduce(link, d, 11, 0xABCD, gradients(3, 30000, seed=1), method)
    with d.client() as c:
        st = c.stats()
    assert st["port"]["arp_replies"] >= 1  # the workers resolved us
    assert st["stats"]["summed"] > 0 and st["stats"]["results_sent"] > 0
    assert st["stats"]["bad_csum"] == 0
    assert st["port"]["drop_injected"] == 0


def test_udp_gso_without_checksum_offload_sends_complete_checksums(link, daemons):
    """The workers' veth here has its checksum offload off, so the kernel
    takes UDP segmentation offload off it too: a worker with udp_gso still
    hands it runs of frames as UDP_SEGMENT messages, and the kernel cuts
    them at that interface with complete checksums (Linux 6.11 and later),
    or refuses the first one, which the port counts once before it sends
    frame by frame (older kernels).  Either way the daemon, on a packet
    socket at the other end of the veth and verifying every UDP checksum,
    sums every frame exact and never sees a segmentation frame."""
    assert link.csum_complete  # ethtool is one of the build's packages
    d = daemons()
    W, n = 2, 30000
    with d.client() as c:
        c.add_job(job=16, token=0xBEEF, workers=W, slots=32, group=GROUP)
    grads = gradients(W, n, seed=6)
    threads, results, errors, stats = run_workers(link, 16, 0xBEEF, grads, "dense", udp_gso=True)
    join_all(threads, 60)
    assert errors == [None] * W, errors
    expected = oracle_allreduce(grads, BLOCK)
    for y in results:
        assert y.tobytes() == expected.tobytes()
    for st in stats:
        p = st["port"]
        cut = p["tx_gso"] >= 1 and p["tx_gso_refused"] == 0
        refused = p["tx_gso_refused"] == 1 and p["tx_gso"] == 0
        assert cut or refused, p
        assert p["tx"] >= st["packets_sent"] > 0
    with d.client() as c:
        st = c.stats()
    assert st["port"].get("drop_segmented", 0) == 0 and st["stats"]["bad_csum"] == 0
    assert st["stats"]["summed"] > 0


def test_idle_backoff_daemon_is_exact_and_exits_on_sigterm(link, daemons):
    """Sleeping between polls once idle (--idle-us / --idle-polls) loses
    nothing: two allreduces with an idle gap between them (the daemon sleeps
    there) are bit-exact, and SIGTERM still stops the daemon with status 0."""
    d = daemons("--idle-us", "200", "--idle-polls", "8")
    W, n = 3, 50000
    for job, seed in ((13, 3), (14, 4)):
        exact_allreduce(link, d, job, 77, gradients(W, n, seed=seed), "lhc")
        time.sleep(0.2)  # idle: the daemon backs off to sleeping
    with d.client() as c:
        assert c.stats()["stats"]["results_sent"] > 0
    d.signal(signal.SIGTERM)
    assert d.wait_exit(20) == 0, d.output()
    assert not d.control.exists()


def _voluntary_switches(pid):
    """The main thread's voluntary context switches: one per sleep of the
    main lcore (its polls never block)."""
    with open(f"/proc/{pid}/task/{pid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError(f"no voluntary_ctxt_switches for {pid}")


def test_an_idle_daemon_sleeps_longer_the_longer_it_idles(link, daemons):
    """--idle-max-us (default 1000): once the port has been idle for a
    while, the sleep between polls is a sixteenth of the idle time, up to
    the bound, so an idle daemon wakes at most about a thousand times a
    second (not every --idle-us); no sleep is shorter than it asks, so the
    bound holds however loaded the host.  The first frames after the gap
    are served as before: the allreduce is bit-exact."""
    d = daemons("--idle-us", "20", "--idle-polls", "32")
    pid = d.proc.pid
    time.sleep(0.3)  # idle past 16 ms: the sleep has reached its bound
    w0, t0 = _voluntary_switches(pid), time.monotonic()
    time.sleep(1.0)
    w1, t1 = _voluntary_switches(pid), time.monotonic()
    # a stray frame on the link (the kernel's IPv6 solicitations) restarts
    # the climb, about 70 short sleeps each: room for several; a sleep
    # fixed at --idle-us wakes some ten thousand times a second
    assert w1 - w0 <= (t1 - t0) * 1000 + 500, (w1 - w0, t1 - t0)
    exact_allreduce(link, d, 15, 78, gradients(3, 50000, seed=5), "dense")


def test_injected_loss_is_repaired_by_retransmission(link, daemons):
    d = daemons("--drop-rate", "0.01", "--seed", "7")
    W, n = 3, 200000
    with d.client() as c:
        c.add_job(job=12, token=5, workers=W, slots=32, group=GROUP)
    grads = gradients(W, n, seed=2, density=1.0)
    threads, results, errors, stats = run_workers(link, 12, 5, grads, "dense", timeout=20)
    join_all(threads, 120)
    assert errors == [None] * W, errors
    expected = oracle_allreduce(grads, BLOCK)
    for y in results:
        assert y.tobytes() == expected.tobytes()
    with d.client() as c:
        st = c.stats()
    assert st["port"]["drop_injected"] > 0
    assert sum(s["retransmissions"] for s in stats) > 0
    # dropped results come back as duplicates answered from the slot
    eng = st["stats"]
    assert eng["duplicates"] + eng["replays"] + eng["status_sent"] > 0


def test_killed_daemon_fails_workers_then_restart_serves(link, daemons):
    d = daemons()
    W, n, timeout = 2, 4_000_000, 1.5
    with d.client() as c:
        c.add_job(job=13, token=9, workers=W, slots=16, group=GROUP)
    grads = gradients(W, n, seed=3, density=1.0)
    killed = {}

    def kill_when_busy():
        def busy():
            with d.client() as c:
                return c.stats()["stats"]["summed"] > 1000

        wait_for(busy, 60, "the allreduce to be under way")
        d.proc.send_signal(signal.SIGKILL)  # our own PID
        killed["t"] = time.monotonic()

    threads, results, errors, stats = run_workers(
        link, 13, 9, grads, "dense", timeout=timeout, slots=16, before_start=kill_when_busy
    )
    join_all(threads, 120)
    d.wait_exit(10)
    took = time.monotonic() - killed["t"]
    for e in errors:
        assert isinstance(e, PeerTimeout), errors
        assert link.switch_ip in str(e)
    # the workers gave up within their timeout, not at join_all's limit
    # (the slack is the host's scheduling, not measured here)
    assert took < timeout + 30.0

    # a new daemon on the same link serves a new job
    d2 = daemons()
    exact_allreduce(link, d2, 14, 10, gradients(3, 20000, seed=4), "dense")


def test_switch_benchmark_sums_every_frame():
    """homagg-switch-bench (the `homagg bench switch` figure): every frame
    the generator feeds is summed, the chunks complete, the zero-copy
    fan-out self-check passes, and the pull-only baseline of the same run
    received frames.  No timing is asserted."""
    from homagg.bench.switch import ROOT as BENCH_ROOT, run_one

    binary = BENCH_ROOT / "build" / "release" / "homagg-switch-bench"
    if not binary.exists():
        pytest.fail(f"{binary} is not built (make switch)")
    for W in (1, 3, 8):
        r = run_one(binary, W, 1024, 64, 0.2, "0")
        assert r["workers"] == W and r["fanout_checked"] is True
        assert r["drops"] == 0
        assert r["received"] > 0 and r["summed"] == r["received"]
        assert abs(r["summed"] - W * r["completed"]) <= 2 * W
        assert r["mpps"] > 0 and r["engine_mpps"] > 0
        assert r["pulled"] > 0 and r["pull_mpps"] > 0
        assert r["engine_vs_pull"] == pytest.approx(r["engine_mpps"] / r["pull_mpps"], rel=0.01)
    # authenticated: every frame verified (none dropped as bad_mac), with
    # each MAC algorithm, at 1 KB and 8 KB (on the portable path, libsodium's
    # AES-GCM and libcrypto's), AES-GMAC and UMAC on each path the CPU has
    from homagg import auth
    from homagg.bench.switch import _mac_isas

    runs = [("blake2b", None)]
    if {"aes", "pclmulqdq"} <= cpu_flags():  # every CPU here: never skipped
        assert auth.mac_available(auth.MAC_AES_GMAC) and auth.mac_available(auth.MAC_UMAC)
    if auth.mac_available(auth.MAC_AES_GMAC):
        runs += [(mac, isa) for mac in ("umac", "aes-gmac") for isa in _mac_isas(["all"])]
    for mac, isa in runs:
        for payload in (1024, 8192):
            r = run_one(binary, 3, payload, 64, 0.2, "0", auth=True, mac=mac, mac_isa=isa)
            assert r["auth"] is True and r["mac"] == mac
            assert r["mac_isa"] == (isa or "none")
            assert r["drops"] == 0 and r["received"] > 0 and r["summed"] == r["received"]
    # a bad HOMAGG_MAC_ISA: the benchmark refuses it in one line, by name
    with pytest.raises(RuntimeError, match="HOMAGG_MAC_ISA=sse: names no MAC path"):
        run_one(binary, 3, 1024, 64, 0.2, "0", auth=True, mac="aes-gmac", mac_isa="sse")
    with pytest.raises(SystemExit, match="--mac-isa sse: use portable"):
        _mac_isas(["sse"])


def test_switch_benchmark_rounds_end_with_each_mac_s_median(capsys):
    """`homagg bench switch --auth --rounds R`: R rounds, each with its own
    unauthenticated run first, then one summary row per MAC whose median
    and range are those of the rounds' ratios.  No timing is asserted."""
    import argparse
    import json
    import statistics

    from homagg.bench import switch as sb

    parser = argparse.ArgumentParser()
    sb.add_arguments(parser)
    args = parser.parse_args(
        "--workers 2 --payload 1024 --seconds 0.2 --lcores 0 --auth --mac umac blake2b "
        "--rounds 2 --json".split()
    )
    assert sb.main(args) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    runs = [r for r in rows if not r.get("summary")]
    sums = {r["mac"]: r for r in rows if r.get("summary")}
    assert [r["round"] for r in runs] == [1, 1, 1, 2, 2, 2]
    assert [(r["auth"], r["mac"]) for r in runs if r["round"] == 1] == [
        (False, "none"),
        (True, "umac"),
        (True, "blake2b"),
    ]
    assert set(sums) == {"umac", "blake2b"}
    for mac, srow in sums.items():
        ratios = [r["engine_mpps_vs_unauthenticated"] for r in runs if r["mac"] == mac]
        for r, base in zip([r for r in runs if r["mac"] == mac], runs[::3]):
            assert r["engine_mpps_vs_unauthenticated"] == pytest.approx(
                r["engine_mpps"] / base["engine_mpps"]
            )
        assert srow["rounds"] == 2 and srow["workers"] == 2 and srow["payload"] == 1024
        assert srow["median_vs_unauthenticated"] == pytest.approx(statistics.median(ratios))
        assert srow["min_vs_unauthenticated"] == min(ratios)
        assert srow["max_vs_unauthenticated"] == max(ratios)
    with pytest.raises(SystemExit, match="--rounds 0: a positive count"):
        sb.main(parser.parse_args(["--rounds", "0"]))


def test_two_engine_lcores_serve_two_jobs_at_once(link, tmp_path):
    """--lcores 2: a dispatcher lcore and two engine lcores; two jobs run at
    the same time, both exact, each spread over both lcores by slot
    ((job + slot) % 2): each lcore sums about half of the contributions;
    remove_job removes a job from both."""
    d = Daemon(
        tmp_path / "two",
        ["--vdev", f"net_af_packet0,iface={link.dev_switch}"],
        [
            "--port-ip",
            link.switch_ip,
            "--lcores",
            "2",
            *([] if link.csum_complete else ["--no-udp-csum"]),
        ],
        netns=link.ns_switch,
        lcores="0@0,1@1,2@1",
    )
    try:
        d.wait_ready()
        with d.client() as c:
            c.add_job(job=20, token=1, workers=2, slots=32, group=GROUP)
            c.add_job(job=21, token=2, workers=2, slots=32, group="239.7.7.8")
        runs = []
        for job, token, seed in ((20, 1, 5), (21, 2, 6)):
            grads = gradients(2, 20000, seed=seed)
            runs.append(
                (
                    grads,
                    run_workers(
                        link, job, token, grads, "dense", group=GROUP if job == 20 else "239.7.7.8"
                    ),
                )
            )
        for grads, (threads, results, errors, stats) in runs:
            join_all(threads, 60)
            assert errors == [None, None], errors
            expected = oracle_allreduce(grads, BLOCK)
            for y in results:
                assert y.tobytes() == expected.tobytes()
        with d.client() as c:
            st = c.stats()
            for job in (20, 21):
                c.remove_job(job)
                with pytest.raises(ControlError):
                    c.remove_job(job)
        assert st["engines"] == 2 and st["port"]["dispatch_full"] == 0
        summed = st["engine_summed"]
        assert len(summed) == 2 and sum(summed) == st["stats"]["summed"] > 0
        # consecutive slots alternate between the lcores: an even split
        assert abs(summed[0] - summed[1]) <= 0.1 * sum(summed), summed
    finally:
        d.stop()
    assert d.proc.returncode == 0
