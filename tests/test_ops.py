"""Operating a live homagg-switch: the Prometheus exporter, `homagg top`
and JSON logs, on a daemon in a namespace behind a veth pair (the set-up of
test_switch.py) with real workers running an allreduce.

The oracle of every number is independent of the code under test: the
daemon's own `stats` / `job_stats` replies, and the workers' chunk counts
(each chunk of each worker is summed exactly once at the one aggregator).
"""

import json
import os
import subprocess
import sys
import threading
import urllib.request

import numpy as np
import pytest

from homagg.switch.control import ControlClient
from homagg.switch.daemon import eal_args
from prometheus_client.parser import text_string_to_metric_families

from helpers import wait_for
from switch_helpers import ROOT, SWITCH
from switch_helpers import GROUP, gradients, join_all, run_workers, start_daemon

pytestmark = [pytest.mark.dpdk, pytest.mark.root, pytest.mark.netns]

JOB, TOKEN, W = 21, 0x5151, 3


@pytest.fixture
def daemon(link, tmp_path):
    d = start_daemon(link, tmp_path / "sw", "--log-format", "json")
    try:
        yield d
    finally:
        d.stop()


def homagg(*args):
    return [sys.executable, "-m", "homagg.cli", *args]


class Exporter:
    """`homagg exporter` on a free port, stopped by its PID."""

    def __init__(self, *sockets, log_format="text"):
        argv = homagg("--log-format", log_format, "exporter", "--port", "0")
        for s in sockets:
            argv += ["--socket", s]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        line = []
        t = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(30)
        assert line and line[0].startswith("homagg exporter: http://"), (line, self.proc.poll())
        self.url = line[0].split()[2]

    def scrape(self):
        with urllib.request.urlopen(self.url, timeout=30) as r:
            text = r.read().decode()
        out = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.stderr.read()


def metric(samples, name, **labels):
    return samples[(name, tuple(sorted((k, str(v)) for k, v in labels.items())))]


def quiet_job_stats(control, job):
    """job_stats once two readings 0.2 s apart agree (stragglers landed)."""
    last = [None]

    def settled():
        with ControlClient(control) as c:
            now = c.job_stats(job)
        same, last[0] = now == last[0], now
        return same

    wait_for(settled, 20, "the job's counters to settle", interval=0.2)
    return last[0]


def test_exporter_counters_equal_the_daemons_replies(link, daemon):
    with daemon.client() as c:
        c.add_job(job=JOB, token=TOKEN, workers=W, slots=32, group=GROUP)
    ex = Exporter(f"sw={daemon.control}")
    try:
        grads = gradients(W, 60000, seed=5)
        scraped_during = []
        threads, results, errors, wstats = run_workers(
            link,
            JOB,
            TOKEN,
            grads,
            "dense",
            before_start=lambda: scraped_during.append(ex.scrape()),
        )
        join_all(threads, 60)
        assert errors == [None] * W, errors
        assert metric(scraped_during[0], "homagg_up", daemon="sw") == 1

        js = quiet_job_stats(daemon.control, JOB)
        samples = ex.scrape()
        with daemon.client() as c:
            after, js_after = c.stats(), c.job_stats(JOB)
        assert js_after == js  # nothing moved during the scrape
    finally:
        ex.stop()

    # the job's and each worker's counters are the daemon's replies ...
    assert metric(samples, "homagg_up", daemon="sw") == 1
    lab = dict(daemon="sw", job=JOB)
    assert metric(samples, "homagg_frames_summed_total", **lab) == js["counters"]["summed"]
    assert metric(samples, "homagg_results_sent_total", **lab) == js["counters"]["results_sent"]
    assert metric(samples, "homagg_slots_completed_total", **lab) == js["counters"]["completed"]
    assert metric(samples, "homagg_job_workers", **lab) == W
    assert metric(samples, "homagg_job_slots", **lab) == 32
    assert metric(samples, "homagg_job_slots_in_use", **lab) == js["sets_open"]
    assert metric(samples, "homagg_job_incarnation", **lab) == js["incarnation"]
    for reason in ("stale", "bad_token", "old_incarnation"):
        assert (
            metric(samples, "homagg_frames_dropped_total", reason=reason, **lab)
            == js["counters"][reason]
        )
    for w in range(W):
        for key, name in (
            ("summed", "homagg_worker_frames_summed_total"),
            ("duplicates", "homagg_worker_duplicates_total"),
            ("retransmissions", "homagg_worker_retransmissions_total"),
            ("dropped", "homagg_worker_frames_dropped_total"),
        ):
            assert metric(samples, name, worker=w, **lab) == js["worker_counters"][key][w]
    # ... and those agree with the workers: every chunk of every worker summed once
    chunks = [s["chunks"] for s in wstats]
    assert js["worker_counters"]["summed"] == chunks
    assert js["counters"]["summed"] == sum(chunks)
    assert js["counters"]["completed"] == chunks[0]
    # the daemon's totals: the job's plus job "" (the rest), equal to `stats`
    # (read after the scrape: only frames no job owns may have come since)
    for name, key in (
        ("homagg_frames_received_total", "received"),
        ("homagg_frames_summed_total", "summed"),
    ):
        total = sum(
            v for (n, labels), v in samples.items() if n == name and ("daemon", "sw") in labels
        )
        assert js["counters"][key] <= total <= after["stats"][key]
    assert (
        sum(v for (n, labels), v in samples.items() if n == "homagg_frames_summed_total")
        == after["stats"]["summed"]
    )
    busy = metric(samples, "homagg_engine_busy_seconds_total", daemon="sw", lcore=0)
    up = metric(samples, "homagg_engine_seconds_total", daemon="sw", lcore=0)
    assert 0 < busy <= up
    assert after["engine_busy_ns"][0] / 1e9 >= busy
    assert metric(samples, "homagg_rx_ring_frames", daemon="sw") == after["rx_ring"]

    # every series the Grafana dashboard queries is one the exporter or a
    # training worker's endpoint (homagg.ops.worker_metrics) serves
    import re

    from prometheus_client import generate_latest

    from homagg.ops.worker_metrics import WorkerMetrics

    wm = WorkerMetrics(JOB, 0)
    wm.observe(
        0.01,
        "lhc",
        {
            "packets_sent": 3,
            "retransmissions": 1,
            "timeouts": 1,
            "spurious_timeouts": 0,
            "bytes_sent": {"values": 8},
            "bytes_received": {"values": 8},
        },
    )
    wm.failed()
    served = {n for n, _ in samples}
    for fam in text_string_to_metric_families(generate_latest(wm.registry).decode()):
        served |= {x.name for x in fam.samples}
    dash = (ROOT / "docs" / "grafana-homagg.json").read_text()
    queried = set(re.findall(r"homagg_[a-z_]+", dash))
    assert queried and queried <= served, queried - served


def test_dead_daemon_is_up_0_not_a_crash(link, daemon, tmp_path):
    gone = tmp_path / "no-such-daemon.sock"
    ex = Exporter(f"sw={daemon.control}", f"gone={gone}", log_format="json")
    try:
        s = ex.scrape()
        assert metric(s, "homagg_up", daemon="sw") == 1
        assert metric(s, "homagg_up", daemon="gone") == 0
        assert not any(
            labels and ("daemon", "gone") in labels and n != "homagg_up" for (n, labels) in s
        )
        daemon.stop()
        s = ex.scrape()
        assert metric(s, "homagg_up", daemon="sw") == 0
        assert ex.proc.poll() is None  # still serving
    finally:
        err = ex.stop()
    # --log-format json: every stderr line one JSON event, the warnings named
    events = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert events and all(set(e) >= {"ts", "level", "logger", "msg"} for e in events)
    assert any(e["level"] == "warning" and "gone" in e["msg"] for e in events)


def test_top_once_shows_the_job_and_its_workers(link, daemon):
    with daemon.client() as c:
        c.add_job(job=JOB, token=TOKEN, workers=W, slots=32, group=GROUP)
    grads = gradients(W, 30000, seed=6)
    threads, results, errors, wstats = run_workers(link, JOB, TOKEN, grads, "dense")
    join_all(threads, 60)
    assert errors == [None] * W, errors
    js = quiet_job_stats(daemon.control, JOB)
    r = subprocess.run(
        homagg("top", "--once", "--interval", "0.2", "--socket", f"sw={daemon.control}"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("sw: 1 job, 1 engine busy")
    jobrow = [ln.split() for ln in lines if ln.split()[:3] == [str(JOB), str(W), "32"]]
    assert len(jobrow) == 1
    assert jobrow[0][-2] == f"{js['counters']['summed']:,}"
    rows = [ln.split() for ln in lines if len(ln.split()) == 7 and ln.split()[0] == str(JOB)]
    assert [int(r[1]) for r in rows] == list(range(W))
    assert [int(r[3].replace(",", "")) for r in rows] == [s["chunks"] for s in wstats]


def test_daemon_log_format_json(link, daemon):
    with daemon.client() as c:
        c.shutdown()
    assert daemon.wait_exit(20) == 0
    lines = [ln for ln in daemon.output().splitlines() if ln.strip()]
    events = [json.loads(ln) for ln in lines]  # every line is one JSON object
    assert all(set(e) == {"ts", "level", "logger", "msg"} for e in events)
    ready = [
        e for e in events if e["logger"] == "homagg.switch" and e["msg"].startswith("ready port=")
    ]
    assert len(ready) == 1 and ready[0]["level"] == "notice"
    assert any(e["msg"] == "stopping (shutdown command)" for e in events)


def test_daemon_log_format_refuses_a_bad_value(tmp_path):
    eal = eal_args("0", file_prefix=f"hgbad{os.getpid()}", vdev="net_null0", memory_mb=64)
    r = subprocess.run(
        [str(SWITCH), *eal, "--", "--control", str(tmp_path / "c.sock"), "--log-format", "yaml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert r.returncode != 0
    assert "--log-format: must be text or json, not yaml" in r.stdout + r.stderr


def test_testbed_up_metrics_serves_its_daemon_and_down_stops_it(tmp_path):
    import secrets

    from homagg.runs.allreduce import run_allreduce
    from homagg.deploy.local.testbed import Testbed

    sd, name = str(tmp_path / "testbeds"), "m" + secrets.token_hex(5)

    def tb_cli(*args):
        return subprocess.run(
            homagg("testbed", "--state-dir", sd, *args), capture_output=True, text=True, timeout=120
        )

    r = tb_cli("up", "--workers", "2", "--name", name, "--metrics", "0")
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        st = Testbed.open(name, sd).state()
        ex, job = st["exporter"], st["job"]["job"]
        assert f"metrics: {ex['url']}" in r.stdout
        assert ex["pid"] in {p["pid"] for p in st["processes"]}

        def scrape():
            with urllib.request.urlopen(ex["url"], timeout=30) as resp:
                return {
                    (s.name, tuple(sorted(s.labels.items()))): s.value
                    for fam in text_string_to_metric_families(resp.read().decode())
                    for s in fam.samples
                }

        s = scrape()
        assert metric(s, "homagg_up", daemon="agg") == 1
        assert metric(s, "homagg_job_workers", daemon="agg", job=job) == 2

        during, stop = [], threading.Event()

        def keep_scraping():
            while not stop.is_set() and len(during) < 500:
                during.append(scrape())

        t = threading.Thread(target=keep_scraping, daemon=True)
        t.start()
        try:
            rep = run_allreduce(name, "lhc", 40000, 0.2, state_dir=sd)
        finally:
            stop.set()
            t.join(60)
        assert rep["exact"] is True
        assert during and all(metric(x, "homagg_up", daemon="agg") == 1 for x in during)
        s = scrape()
        with ControlClient(st["daemons"]["agg"]["control"]) as c:
            after = c.stats()
        summed = sum(v for (n, _), v in s.items() if n == "homagg_frames_summed_total")
        assert summed == after["stats"]["summed"] > 0
        top = subprocess.run(
            homagg("top", "--testbed", name, "--state-dir", sd, "--once", "--interval", "0.2"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert top.returncode == 0, top.stderr
        assert top.stdout.startswith(f"{name}/agg: 1 job, 1 engine busy")
        assert any(ln.split()[:3] == [str(job), "2", "64"] for ln in top.stdout.splitlines())
    finally:
        r = tb_cli("down", "--name", name)
    assert r.returncode == 0, r.stderr
    assert (
        not os.path.exists(f"/proc/{ex['pid']}")
        or open(f"/proc/{ex['pid']}/stat").read().split()[2] == "Z"
    )


def test_worker_metrics_endpoint_of_the_torch_hook(link, daemon):
    """HOMAGG_METRICS_PORT: each rank's hook serves its allreduces; the
    counters equal the client's own, the sums are exact."""
    import torch
    from pyroute2.netns import setns

    import homagg.torch as hgt
    from homagg.worker import Worker

    with daemon.client() as c:
        c.add_job(job=JOB, token=TOKEN, workers=2, slots=32, group=GROUP)
    grads = gradients(2, 20000, seed=8)
    out = [None, None]

    def rank(w):
        setns(link.ns_workers, flags=0)  # this thread only
        wk = Worker(
            job=JOB,
            token=TOKEN,
            worker=w,
            workers=2,
            aggregator=(link.switch_ip, 48879),
            group=GROUP,
            bind=(link.worker_ip, 0),
            timeout=10,
            slots=32,
        )
        state = hgt.HookState(wk, method="lhc", env={"HOMAGG_METRICS_PORT": "0"})
        try:
            ys = [state.reduce(0, torch.from_numpy(grads[w].copy())).wait() for _ in range(2)]
            # a call's metrics are observed after its result is handed
            # over; take_log waits until both calls are settled
            log = state.take_log()
            with urllib.request.urlopen(state.metrics.url, timeout=30) as r:
                text = r.read().decode()
            out[w] = (ys, text, wk.counters(), log)
        finally:
            state.close()

    threads = [threading.Thread(target=rank, args=(w,), daemon=True) for w in range(2)]
    for t in threads:
        t.start()
    join_all(threads, 120)
    from reference import allreduce as oracle_allreduce

    expected = oracle_allreduce(grads, 4096) / np.float32(2)
    for w in range(2):
        ys, text, cnt, log = out[w]
        assert all(y.numpy().tobytes() == expected.tobytes() for y in ys)
        s = {
            (x.name, tuple(sorted(x.labels.items()))): x.value
            for fam in text_string_to_metric_families(text)
            for x in fam.samples
        }
        lab = (("job", str(JOB)), ("worker", str(w)))
        assert s[("homagg_client_allreduces_total", (*lab[:1], ("method", "lhc"), lab[1]))] == 2
        assert s[("homagg_client_allreduce_seconds_count", lab)] == 2
        assert s[("homagg_client_retransmissions_total", lab)] == cnt["retransmissions"]
        assert s[("homagg_client_packets_sent_total", lab)] == cnt["packets_sent"]
        sent = sum(
            v
            for (n, lb), v in s.items()
            if n == "homagg_client_bytes_sent_total" and ("worker", str(w)) in lb
        )
        assert sent == sum(cnt["bytes_sent"].values()) == sum(e["bytes_sent"] for e in log)


def test_job_stats_sums_the_engine_lcores(link, tmp_path):
    """--lcores 2: job_stats sums each engine lcore's share of the job
    (every chunk of each worker summed once, on one lcore or the other);
    each lcore reports its busy and elapsed time."""
    from switch_helpers import Daemon

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
            c.add_job(job=JOB, token=TOKEN, workers=W, slots=32, group=GROUP)
        threads, results, errors, wstats = run_workers(
            link, JOB, TOKEN, gradients(W, 30000, seed=9), "dense"
        )
        join_all(threads, 60)
        assert errors == [None] * W, errors
        js = quiet_job_stats(d.control, JOB)
        with d.client() as c:
            st = c.stats()
        assert js["worker_counters"]["summed"] == [s["chunks"] for s in wstats]
        assert js["counters"]["summed"] == st["stats"]["summed"] == sum(st["engine_summed"])
        assert all(x > 0 for x in st["engine_summed"])  # both lcores took part
        assert len(st["engine_ns"]) == len(st["engine_busy_ns"]) == 2
        assert all(0 < b <= t for b, t in zip(st["engine_busy_ns"], st["engine_ns"]))
    finally:
        d.stop()


def test_log_format_json_reaches_the_daemons_the_orchestrator_starts(tmp_path):
    """`homagg --log-format json testbed up`: the homagg-switch it starts
    writes JSON lines too."""
    import secrets

    from homagg.deploy.local.testbed import Testbed

    sd, name = str(tmp_path / "testbeds"), "l" + secrets.token_hex(5)
    r = subprocess.run(
        homagg(
            "--log-format",
            "json",
            "testbed",
            "--state-dir",
            sd,
            "up",
            "--workers",
            "2",
            "--name",
            name,
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        events = [json.loads(ln) for ln in r.stderr.splitlines() if ln.strip()]
        assert all(set(e) >= {"ts", "level", "logger", "msg"} for e in events)
        rec = Testbed.open(name, sd).state()["daemons"]["agg"]
        with open(rec["log"]) as f:
            daemon = [json.loads(ln) for ln in f if ln.strip()]
        assert any(
            e["logger"] == "homagg.switch" and e["msg"].startswith("ready port=") for e in daemon
        )
    finally:
        Testbed.down(name, state_dir=sd)
