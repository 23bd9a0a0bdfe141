"""The kernel UDP port backend (homagg/port_udp.h) and homagg.worker.Worker,
without root: the real C engine runs on a UdpPort on loopback (a thread
polling it), the real C clients run in worker threads, and the results are
checked bit for bit against the numpy fixed-point oracle."""

import os
import secrets
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from homagg.errors import InvalidArgument, PeerTimeout
from homagg.worker import UdpPort, Worker

from reference import allreduce as oracle_allreduce
from udp_rig import BLOCK, LoopbackAggregator, grads_of, run

pytestmark = pytest.mark.sanitize


@pytest.fixture
def agg():
    a = LoopbackAggregator()
    try:
        yield a
    finally:
        a.close()


@pytest.mark.parametrize("method", ["dense", "blocks", "lhc", "union", "auto"])
@pytest.mark.parametrize("W", [1, 3])
def test_exact_allreduce_over_loopback_udp(agg, method, W):
    job = 40 + W
    agg.engine.add_job(job=job, token=77, workers=W, slots=8)
    grads = grads_of(W, 5000 + 33, seed=W)
    out, err = run(agg, job, 77, grads, method)
    assert err == [None] * W
    expected = oracle_allreduce(grads, BLOCK)
    for y in out:
        assert y.tobytes() == expected.tobytes()
    c = agg.engine.counters()
    assert c["summed"] > 0 and c["bad_csum"] == 0 and c["not_ip"] == 0
    st = agg.port.stats()
    assert st["rx"] > 0 and st["tx"] > 0 and st["tx_bad"] == 0


@pytest.mark.parametrize("method", ["dense", "union"])
def test_udp_gso_sends_runs_of_frames_as_one_message(agg, method):
    """udp_gso: a worker sends a run of frames to its aggregator as one
    UDP_SEGMENT message, which the kernel cuts into the same datagrams: the
    engine parses every one (no malformed frame) and the sum is the
    oracle's bit for bit; the port counts the messages and the frames they
    carried, and every frame once in tx."""
    W, job = 3, 60 + len(method)
    agg.engine.add_job(job=job, token=79, workers=W, slots=8)
    grads = grads_of(W, 40 * BLOCK + 7, seed=21, density=0.3)
    stats = []
    out, err = run(agg, job, 79, grads, method, stats=stats, udp_gso=True)
    assert err == [None] * W
    expected = oracle_allreduce(grads, BLOCK)
    for y in out:
        assert y.tobytes() == expected.tobytes()
    for st in stats:
        port = st["port"]
        assert port["tx_gso_refused"] == 0 and port["tx_errors"] == 0
        # windows of 8 frames to one aggregator: runs of several frames
        assert port["tx_gso"] >= 1 and port["tx_gso_frames"] >= 2 * port["tx_gso"]
        assert port["tx"] >= st["packets_sent"] >= port["tx_gso_frames"]
    c = agg.engine.counters()
    assert c["summed"] > 0
    for k in ("truncated", "bad_lanes", "bad_csum", "not_ip", "not_udp", "unknown_job"):
        assert c[k] == 0, (k, c)


@pytest.mark.parametrize("gain", [0.0, 2.0])
def test_the_pipe_bound_on_kernel_udp(agg, gain):
    """Worker(pipe_gain=g) (docs/PROTOCOL.md Part 3, "The pipe"): the sum is
    the oracle's bit for bit either way; with g > 0 each aggregator's
    stats carry the bound, within its floor of 4 and S, and the least
    RTT sample it settles on; with 0 (the default) there is no bound."""
    W, S, job = 3, 32, 70 + int(gain)
    agg.engine.add_job(job=job, token=81, workers=W, slots=S)
    grads = grads_of(W, 200 * BLOCK, seed=23, density=1.0)
    stats = []
    out, err = run(agg, job, 81, grads, "dense", slots=S, stats=stats, pipe_gain=gain)
    assert err == [None] * W
    expected = oracle_allreduce(grads, BLOCK)
    for y in out:
        assert y.tobytes() == expected.tobytes()
    for st in stats:
        (a,) = st["aggregators"]
        assert a["rtt_samples"] > 0 and a["rtt_min_ns"] > 0
        if gain:
            assert 4 <= a["pipe_limit"] <= S, a
        else:
            assert a["pipe_limit"] == 0, a


@pytest.mark.parametrize("method", ["dense", "lhc", "union", "auto"])
def test_input_nonzeros_and_a_result_written_into_the_callers_array(agg, method):
    """info["nonzeros"] is the input's count of x != 0 (-0.0 counts as 0),
    from the C scan of lhc, union and auto (None for dense, which does not
    scan); a second allreduce into the same ``out`` (sparser gradients, no
    zeroing between) is the oracle's sum bit for bit, every element
    written (``out`` starts as NaN); ``divide_by`` gives that sum /
    np.float32(divide_by) bit for bit; an ``out`` overlapping the input
    and a divide_by not finite and positive are refused before anything is
    sent."""
    W, n, job = 2, 3 * BLOCK + 5, 50 + len(method)
    agg.engine.add_job(job=job, token=78, workers=W, slots=8)
    first = grads_of(W, n, seed=11, density=0.3)
    first[0][:9] = np.float32(-0.0)
    second = grads_of(W, n, seed=12, density=0.01)
    got, infos, err = [None] * W, [None] * W, [None] * W

    def work(w):
        try:
            with Worker(
                job=job,
                token=78,
                worker=w,
                workers=W,
                aggregators=[agg.address],
                bind=("127.0.0.1", 0),
                timeout=10.0,
                slots=8,
            ) as wk:
                with pytest.raises(InvalidArgument, match="overlap"):
                    wk.allreduce(first[w], method=method, block=BLOCK, out=first[w][::-1][::-1])
                for bad in (0, -2.0, float("nan"), float("inf"), 1e-40):
                    with pytest.raises(InvalidArgument, match="divide_by"):
                        wk.allreduce(first[w], method=method, divide_by=bad)
                out = np.full(n, np.nan, dtype=np.float32)
                i1, i2 = {}, {}
                y1 = wk.allreduce(first[w], method=method, block=BLOCK, out=out, info=i1)
                assert y1 is out
                y1 = y1.copy()
                y2 = wk.allreduce(second[w], method=method, block=BLOCK, out=out, info=i2)
                assert y2 is out
                y2 = y2.copy()
                y3 = wk.allreduce(second[w], method=method, block=BLOCK, out=out, divide_by=3)
                y4 = wk.allreduce(first[w], method=method, block=BLOCK, divide_by=W)
                got[w], infos[w] = (y1, y2, y3.copy(), y4), (i1, i2)
        except Exception as exc:  # noqa: BLE001 - reported below
            err[w] = exc

    threads = [threading.Thread(target=work, args=(w,)) for w in range(W)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert err == [None] * W, err
    want = (oracle_allreduce(first, BLOCK), oracle_allreduce(second, BLOCK))
    for w in range(W):
        assert got[w][2].tobytes() == (want[1] / np.float32(3)).tobytes()
        assert got[w][3].tobytes() == (want[0] / np.float32(W)).tobytes()
        for k, grads in enumerate((first, second)):
            assert got[w][k].tobytes() == want[k].tobytes(), (w, k)
            counted = infos[w][k]["nonzeros"]
            assert counted == (None if method == "dense" else int(np.count_nonzero(grads[w])))
    assert int(np.count_nonzero(first[0])) < int(np.count_nonzero(first[0].view(np.uint32)))


def test_small_payload_many_chunks(agg):
    agg.engine.add_job(job=5, token=1, workers=2, slots=4, payload_bytes=64)
    grads = grads_of(2, 3000, seed=9, density=1.0)
    out, err = run(agg, 5, 1, grads, "dense", slots=4, payload=64)
    assert err == [None, None]
    assert out[0].tobytes() == oracle_allreduce(grads, BLOCK).tobytes()


def test_oversized_datagram_is_counted_not_delivered(agg):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.sendto(b"\x01" * 9000, agg.address)  # larger than a packet
        s.sendto(b"\x01" * 10, agg.address)  # not a HomAgg frame
    finally:
        s.close()
    deadline = time.monotonic() + 10
    while agg.port.stats()["rx_truncated"] < 1 or agg.engine.counters()["received"] < 1:
        assert time.monotonic() < deadline, (agg.port.stats(), agg.engine.counters())
        time.sleep(0.01)
    assert agg.port.stats()["rx_truncated"] == 1
    c = agg.engine.counters()
    assert c["received"] == 1 and c["summed"] == 0 and c["truncated"] == 1


def test_missing_aggregator_times_out_naming_it():
    # a bound socket that never answers stands for a dead aggregator
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    try:
        addr = silent.getsockname()
        with Worker(
            job=1, token=2, worker=0, workers=2, aggregator=addr, bind=("127.0.0.1", 0), timeout=0.5
        ) as wk:
            t0 = time.monotonic()
            with pytest.raises(PeerTimeout) as ei:
                wk.allreduce(np.ones(100, np.float32))
            took = time.monotonic() - t0
        assert f"127.0.0.1:{addr[1]}" in str(ei.value)
        # gave up at its timeout, not at a hang (the slack is the host's)
        assert took < 30.0
    finally:
        silent.close()


def test_wait_wakes_on_a_datagram_and_keeps_its_deadline():
    port = UdpPort(("127.0.0.1", 0))
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        assert port.wait(0) is False  # nothing there: returns at once
        assert port.wait(0.0002) is False  # a sub-millisecond deadline
        st = port.stats()
        assert st["waits"] == 2 and st["wait_timeouts"] == 2
        s.sendto(b"x" * 40, port.local_address)
        assert port.wait(30.0) is True  # woken by the datagram
        st = port.stats()
        assert st["waits"] == 3 and st["wait_timeouts"] == 2
    finally:
        s.close()
        port.close()


def test_bad_arguments():
    with pytest.raises(InvalidArgument):
        Worker(job=1, token=1, worker=2, workers=2)
    with pytest.raises(InvalidArgument):
        Worker(job=1, token=1, worker=0, workers=2, aggregator=("10.0.0.300", 1))
    with pytest.raises(InvalidArgument):
        UdpPort(("not an address", 0))
    for gain in (-0.5, 11):
        with pytest.raises(InvalidArgument, match="pipe_gain"):
            Worker(job=1, token=1, worker=0, workers=1, bind=("127.0.0.1", 0), pipe_gain=gain)
    with Worker(job=1, token=1, worker=0, workers=1, bind=("127.0.0.1", 0)) as wk:
        with pytest.raises(InvalidArgument):
            wk.allreduce(np.ones(4, np.float32), method="ring")


def test_client_create_failure_carries_the_reason():
    """hg_client_create reports why it refused (errno): a payload that does
    not fit the port's MTU is EMSGSIZE, named as such, and a bad field is
    EINVAL; the binding raises the matching exception with the C text."""
    import errno

    from homagg.bindings.client import client_create
    from homagg.bindings.port_mem import port_mem_create, port_mem_port

    m = port_mem_create(mtu=1500)

    def create(**fields):
        return client_create(
            port_mem_port(m),
            [(0x0A000001, 0)],
            None,
            m,
            "worker 0",
            workers=2,
            worker=0,
            slots=8,
            **fields,
        )

    with pytest.raises(InvalidArgument) as e:
        create(payload_bytes=8192)
    assert e.value.code == -errno.EMSGSIZE
    assert "worker 0" in str(e.value) and "MTU" in str(e.value), str(e.value)
    with pytest.raises(InvalidArgument) as e:
        create(payload_bytes=1022)
    assert e.value.code == -errno.EINVAL and "invalid argument" in str(e.value)
    # a pipe gain above 10 (PROTOCOL.md Part 3, "The pipe") is refused in C too
    with pytest.raises(InvalidArgument) as e:
        create(payload_bytes=1024, pipe_gain_pct=1001)
    assert e.value.code == -errno.EINVAL
    # a timer granularity above rto_max ("Retransmission and backoff") too
    with pytest.raises(InvalidArgument) as e:
        create(payload_bytes=1024, rto_max_ns=10**6, rto_granularity_ns=10**6 + 1)
    assert e.value.code == -errno.EINVAL
    # the same port takes a client whose frames fit
    c = create(payload_bytes=1024, pipe_gain_pct=1000, rto_granularity_ns=5000)
    assert c is not None


def test_job_file_udp_gso_field(tmp_path):
    """The job file's ``udp_gso`` (what a testbed writes when its switch
    ports cut UDP_SEGMENT messages) reaches the ranks' job configuration;
    HOMAGG_UDP_GSO wins over the file; absent, it is off; a value that is
    not a boolean names the variable and the field."""
    from homagg.errors import ConfigError
    from homagg.switch import job_file

    fields = dict(aggregator=("10.0.0.1", 48879), job=7, token=9)
    plain = job_file.write_job_file(str(tmp_path / "plain.json"), **fields)
    gso = job_file.write_job_file(str(tmp_path / "gso.json"), udp_gso=True, **fields)
    assert job_file.job_config({"HOMAGG_JOB_FILE": plain})["udp_gso"] is False
    assert job_file.job_config({"HOMAGG_JOB_FILE": gso})["udp_gso"] is True
    env = {"HOMAGG_JOB_FILE": gso, "HOMAGG_UDP_GSO": "0"}
    assert job_file.job_config(env)["udp_gso"] is False
    env = {"HOMAGG_JOB_FILE": plain, "HOMAGG_UDP_GSO": "yes"}
    assert job_file.job_config(env)["udp_gso"] is True
    with pytest.raises(ConfigError, match="HOMAGG_UDP_GSO.*udp_gso.*boolean"):
        job_file.job_config({"HOMAGG_JOB_FILE": plain, "HOMAGG_UDP_GSO": "maybe"})


def test_testbed_reads_homagg_udp_gso_as_the_job_file_does(monkeypatch):
    """Testbed.udp_gso: on when the switch ports cut the messages, unless
    HOMAGG_UDP_GSO says no (0, off, false); a value that is not a boolean
    is a ConfigError naming the variable, not GSO left on in silence; a
    testbed whose ports do not cut never offers it."""
    from homagg.deploy.local.testbed import Testbed
    from homagg.errors import ConfigError

    class Bed:
        def __init__(self, how):
            self.how = how

        def state(self):
            return {"udp_gso": self.how}

    udp_gso = Testbed.udp_gso.fget
    monkeypatch.delenv("HOMAGG_UDP_GSO", raising=False)
    assert udp_gso(Bed("switch")) is True
    assert udp_gso(Bed("absent")) is False
    for off in ("0", "off", "False", " no "):
        monkeypatch.setenv("HOMAGG_UDP_GSO", off)
        assert udp_gso(Bed("switch")) is False, off
    monkeypatch.setenv("HOMAGG_UDP_GSO", "yes")
    assert udp_gso(Bed("switch")) is True
    assert udp_gso(Bed("off")) is False
    monkeypatch.setenv("HOMAGG_UDP_GSO", "maybe")
    with pytest.raises(ConfigError, match="HOMAGG_UDP_GSO.*boolean"):
        udp_gso(Bed("switch"))


# Run in a namespace whose ephemeral range is the group port and the next:
# every UdpPort's own port must be the other one, and the group socket's
# bind (SO_REUSEADDR on *:group port, as join_group does) must work while
# each port is open.
_EPHEMERAL_SCRIPT = textwrap.dedent(
    """
    import socket, sys
    sys.path.insert(0, sys.argv[1])
    from homagg.worker import UdpPort
    GROUP_PORT = int(sys.argv[2])
    for _ in range(8):
        p = UdpPort(bind=("127.0.0.1", 0))
        try:
            assert p.local_address[1] == GROUP_PORT + 1, p.local_address
            g = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            g.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            g.bind(("0.0.0.0", GROUP_PORT))
            g.close()
        finally:
            p.close()
    print("ok")
    """
)


@pytest.mark.root
@pytest.mark.netns
def test_an_ephemeral_port_never_takes_the_group_port():
    """A worker binds its unicast socket to an ephemeral port, and its group
    socket to the group port (48879, inside the kernel's default ephemeral
    range).  When the kernel hands out the group port itself, the port
    binds another one, so the group socket can still bind (before, the
    worker's client failed with EADDRINUSE about once in 28,000 workers)."""
    from homagg.bindings.wire import UDP_PORT

    ns = "hg-eph" + secrets.token_hex(3)
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=30)
    try:
        ex = ["ip", "netns", "exec", ns]
        subprocess.run([*ex, "ip", "link", "set", "lo", "up"], check=True, timeout=30)
        subprocess.run(
            [*ex, "sysctl", "-qw", f"net.ipv4.ip_local_port_range={UDP_PORT} {UDP_PORT + 1}"],
            check=True,
            timeout=30,
        )
        here = os.path.dirname(os.path.abspath(__file__))
        pkg = os.path.join(os.path.dirname(here), "orchestrator")
        r = subprocess.run(
            [*ex, sys.executable, "-c", _EPHEMERAL_SCRIPT, pkg, str(UDP_PORT)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False, timeout=30)
