"""The local testbed (homagg.deploy.local.testbed): namespaces, bridge, veth, tc, teardown.

Every testbed here has a unique name and its own state directory, and a
fixture removes it whatever happens.  Traffic only flows inside the
namespaces these tests create.
"""

import json
import os
import secrets
import subprocess
import sys
import textwrap

import pytest

from helpers import require

from homagg.deploy.local import testbed as tbmod
from homagg.deploy.local.testbed import RootRequired, Testbed, TestbedError, TestbedExists

pytestmark = [pytest.mark.root, pytest.mark.netns, pytest.mark.timeout(120)]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORCH = os.path.join(REPO, "orchestrator")


def unique_name():
    return "t" + secrets.token_hex(5)


def netns_with_prefix(name):
    out = subprocess.run(
        ["ip", "-j", "netns", "list"], capture_output=True, text=True, check=True
    ).stdout
    names = [n["name"] for n in json.loads(out or "[]")]
    return sorted(n for n in names if n.startswith(f"hg-{name}-"))


def ip_json(ns, *args):
    out = subprocess.run(
        ["ip", "-n", ns, "-j", *args], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out or "[]")


def tc_qdiscs(ns, dev):
    out = subprocess.run(
        ["tc", "-n", ns, "-j", "-s", "qdisc", "show", "dev", dev],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out or "[]")


def host_links():
    """Interface names of the namespace the tests run in."""
    return sorted(
        link["ifname"]
        for link in json.loads(
            subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True).stdout
        )
    )


def pid_alive(pid):
    return tbmod._proc_starttime(pid) is not None


@pytest.fixture
def state_dir(tmp_path):
    return str(tmp_path / "testbeds")


@pytest.fixture
def make_testbed(state_dir):
    """make_testbed(workers, **kw) -> Testbed with a unique name; every
    testbed made is removed at the end, even if the test failed."""
    names = []

    def make(workers=2, name=None, **kw):
        name = name or unique_name()
        names.append(name)
        return Testbed.up(name, workers=workers, state_dir=state_dir, **kw)

    yield make
    for n in names:
        Testbed.down(n, state_dir=state_dir)
        assert netns_with_prefix(n) == []


@pytest.fixture(scope="module")
def shaped(tmp_path_factory):
    """One shaped testbed shared by the traffic tests: 3 workers, 20 Mbit/s."""
    require(os.geteuid() == 0, "needs root")
    sd = str(tmp_path_factory.mktemp("shared") / "testbeds")
    tb = Testbed.up(unique_name(), workers=3, link_mbit=20, state_dir=sd)
    try:
        yield tb
    finally:
        Testbed.down(tb.name, state_dir=sd)
        assert netns_with_prefix(tb.name) == []


# --------------------------------------------------------------------------


def test_up_creates_namespaces_links_addresses_and_qdiscs(make_testbed):
    before = host_links()
    tb = make_testbed(workers=3, link_mbit=50, subnet="10.78.0.0/24")
    n = tb.name
    assert netns_with_prefix(n) == sorted(
        [f"hg-{n}-sw", f"hg-{n}-agg", f"hg-{n}-w0", f"hg-{n}-w1", f"hg-{n}-w2"]
    )
    # nothing appeared in the namespace the program runs in
    assert host_links() == before

    hosts = tb.hosts()
    assert [h.name for h in hosts] == ["agg", "w0", "w1", "w2"]
    assert [h.ip for h in hosts] == ["10.78.0.1", "10.78.0.10", "10.78.0.11", "10.78.0.12"]
    for h in hosts:
        links = {link["ifname"]: link for link in ip_json(h.netns, "link")}
        assert set(links) == {"lo", "eth0"}
        assert "UP" in links["lo"]["flags"] and "UP" in links["eth0"]["flags"]
        assert links["eth0"]["address"] == h.mac
        addrs = ip_json(h.netns, "addr", "show", "dev", "eth0")[0]["addr_info"]
        assert {(a["local"], a["prefixlen"]) for a in addrs if a["family"] == "inet"} == {
            (h.ip, 24)
        }
        routes = [r["dst"] for r in ip_json(h.netns, "route")]
        assert "224.0.0.0/4" in routes

    sw = f"hg-{n}-sw"
    sw_links = {link["ifname"]: link for link in ip_json(sw, "-d", "link")}
    assert set(sw_links) == {"lo", "br0", "agg", "w0", "w1", "w2"}
    br = sw_links["br0"]["linkinfo"]["info_data"]
    assert br["mcast_snooping"] == 0 and br["stp_state"] == 0
    for port in ("agg", "w0", "w1", "w2"):
        assert sw_links[port]["master"] == "br0"
        assert "UP" in sw_links[port]["flags"]

    # tbf on both ends of every worker link, none on the aggregator's
    for h in hosts:
        for ns, dev in ((h.netns, "eth0"), (sw, h.switch_port)):
            tbf = [q for q in tc_qdiscs(ns, dev) if q["kind"] == "tbf"]
            if h.role == "worker":
                assert len(tbf) == 1, (ns, dev)
                assert tbf[0]["root"] is True
                assert tbf[0]["options"]["rate"] == 50_000_000 // 8
            else:
                assert tbf == []

    st = tb.state()
    assert st["complete"] is True
    kinds = [(o["kind"], o.get("netns", o.get("name")), o.get("ifname")) for o in st["objects"]]
    assert ("netns", f"hg-{n}-sw", None) in kinds
    assert sum(1 for k in kinds if k[0] == "qdisc") == 6
    assert sum(1 for k in kinds if k[0] == "netns") == 5


def test_bridge_forwards_without_netfilter(make_testbed):
    """With br_netfilter loaded, the switch namespace turns its hooks off
    (every frame would go through iptables, ip6tables and arptables); the
    namespace the program runs in keeps its own setting."""
    keys = ("bridge-nf-call-iptables", "bridge-nf-call-ip6tables", "bridge-nf-call-arptables")
    if not os.path.isdir("/proc/sys/net/bridge"):
        tb = make_testbed(workers=1)
        assert tb.state()["bridge_netfilter"] == "absent"
        return
    before = {k: open(f"/proc/sys/net/bridge/{k}").read() for k in keys}
    tb = make_testbed(workers=1)
    sw = f"hg-{tb.name}-sw"
    got = subprocess.run(
        ["ip", "netns", "exec", sw, "cat", *(f"/proc/sys/net/bridge/{k}" for k in keys)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.split()
    assert got == ["0", "0", "0"]
    assert tb.state()["bridge_netfilter"] == "off"
    assert {k: open(f"/proc/sys/net/bridge/{k}").read() for k in keys} == before


def test_switch_ports_cut_udp_segmentation_offload(make_testbed):
    """Every switch port cuts a UDP_SEGMENT frame into its datagrams before
    it sends it to a host (tx-udp-segmentation off on the bridge side of
    each veth), so the testbed offers the workers UDP GSO; the hosts' own
    interfaces keep the offload."""
    tb = make_testbed(workers=2)
    sw = f"hg-{tb.name}-sw"

    def feature(ns, dev):
        out = subprocess.run(
            ["ip", "netns", "exec", ns, "ethtool", "-k", dev],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        return [
            ln.split(":")[1].split()[0] for ln in out.splitlines() if "tx-udp-segmentation:" in ln
        ]

    assert tb.state()["udp_gso"] == "switch" and tb.udp_gso is True
    for h in tb.hosts():
        assert feature(sw, h.switch_port) == ["off"], h.name
        assert feature(h.netns, h.ifname) == ["on"], h.name


def test_unshaped_testbed_has_no_tbf(make_testbed):
    tb = make_testbed(workers=1)
    for h in tb.hosts():
        assert all(q["kind"] != "tbf" for q in tc_qdiscs(h.netns, "eth0"))
        assert h.rate_mbit is None
        assert tb.qdisc_stats(h.name) is None


def test_ping_between_workers_and_aggregator(shaped):
    agg, w = shaped.aggregator, shaped.workers
    pairs = [(x.name, agg.ip) for x in w] + [("w0", w[1].ip), ("w2", w[0].ip), ("agg", w[2].ip)]
    for src, dst in pairs:
        r = shaped.exec(src, ["ping", "-c", "1", "-W", "3", dst], timeout=15)
        assert r.returncode == 0, (src, dst, r.stdout, r.stderr)
        assert "1 received" in r.stdout


RECEIVER = textwrap.dedent("""
    import socket, struct, sys
    group, port, ifaddr = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", port))
    s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                 socket.inet_aton(group) + socket.inet_aton(ifaddr))
    s.settimeout(20)
    print("ready", flush=True)
    data, src = s.recvfrom(2048)
    print(data.decode(), src[0], flush=True)
""")

SENDER = textwrap.dedent("""
    import socket, sys, time
    group, port, ifaddr, msg = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(ifaddr))
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
    for _ in range(int(sys.argv[5])):
        s.sendto(msg.encode(), (group, port))
        time.sleep(0.1)
""")


def test_udp_multicast_from_aggregator_reaches_every_worker(shaped):
    group, port = "239.77.1.1", 47001
    msg = "result-" + secrets.token_hex(4)
    receivers = []
    try:
        for w in shaped.workers:
            p = shaped.run_in(
                w.name,
                [sys.executable, "-c", RECEIVER, group, port, w.ip],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            receivers.append(p)
        for p in receivers:  # each has joined the group before anything is sent
            line = p.readline(30)  # "" after 30 s without a line
            assert line.strip() == "ready", p.stderr.read() if p.poll() is not None else line
        # one sender in the aggregator; a few copies in case the first one
        # races the bridge learning (every worker needs one)
        r = shaped.exec(
            "agg",
            [sys.executable, "-c", SENDER, group, port, shaped.aggregator.ip, msg, 5],
            timeout=20,
        )
        assert r.returncode == 0, r.stderr
        for w, p in zip(shaped.workers, receivers):
            out, err = p.communicate(timeout=25)
            assert p.returncode == 0, (w.name, err)
            assert out.splitlines()[-1].split() == [msg, shaped.aggregator.ip], (w.name, out)
    finally:
        for p in receivers:
            p.stop()


TCP_SINK = textwrap.dedent("""
    import socket, sys, time
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(20)
    print("ready", flush=True)
    c, _ = s.accept(); c.settimeout(20)
    n, t0 = 0, None
    while True:
        b = c.recv(1 << 16)
        if not b:
            break
        if t0 is None:
            t0 = time.monotonic()
        n += len(b)
    print(n, time.monotonic() - t0, flush=True)
""")

TCP_SOURCE = textwrap.dedent("""
    import socket, sys
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20)
    c.sendall(b"x" * int(sys.argv[3])); c.shutdown(socket.SHUT_WR)
    c.recv(1)
""")


def test_rate_limit_is_in_effect(shaped):
    """A 2.5 MB TCP transfer over 20 Mbit/s links takes about a second; an
    unshaped veth does it in milliseconds.  The check is loose (at most 3x
    the configured rate), bounded (the transfer takes ~1 s), and the tbf
    qdiscs on both sides must have carried the bytes and hit their limit."""
    nbytes = 2_500_000
    src, dst = shaped.host("w0"), shaped.host("w1")
    up0 = shaped.qdisc_stats("w0", "host")
    down0 = shaped.qdisc_stats("w1", "switch")
    assert up0["rate_bytes_per_s"] == down0["rate_bytes_per_s"] == 20_000_000 // 8
    sink = shaped.run_in(
        "w1",
        [sys.executable, "-c", TCP_SINK, dst.ip, 47002],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert sink.readline(30).strip() == "ready"
        r = shaped.exec("w0", [sys.executable, "-c", TCP_SOURCE, dst.ip, 47002, nbytes], timeout=30)
        assert r.returncode == 0, r.stderr
        out, err = sink.communicate(timeout=30)
        got, seconds = out.split()
        assert int(got) == nbytes
        mbit = nbytes * 8 / float(seconds) / 1e6
        assert mbit <= 3 * 20, f"{mbit:.1f} Mbit/s through a 20 Mbit/s link"
    finally:
        sink.stop()
    up1 = shaped.qdisc_stats("w0", "host")
    down1 = shaped.qdisc_stats("w1", "switch")
    assert up1["bytes"] - up0["bytes"] >= nbytes
    assert down1["bytes"] - down0["bytes"] >= nbytes
    assert up1["overlimits"] > up0["overlimits"]
    assert src.rate_mbit == dst.rate_mbit == 20


def test_run_in_records_pid_and_down_stops_it(state_dir, make_testbed):
    tb = make_testbed(workers=2)
    p1 = tb.run_in("w0", ["sleep", "600"])
    # a process that ignores SIGTERM: down must fall back to SIGKILL
    p2 = tb.run_in(
        "w1",
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p2.readline(30).strip() == "ready"
    recorded = {r["pid"]: r for r in tb.state()["processes"]}
    assert set(recorded) == {p1.pid, p2.pid}
    assert recorded[p1.pid]["host"] == "w0" and recorded[p1.pid]["argv"] == ["sleep", "600"]
    # the process really runs inside the worker's namespace
    own = os.readlink(f"/proc/{p1.pid}/ns/net")
    assert own != os.readlink("/proc/self/ns/net")
    assert Testbed.down(tb.name, state_dir=state_dir, timeout=1.0) is True
    for p in (p1, p2):
        p.popen.wait(10)
        assert not pid_alive(p.pid)
    assert p2.returncode == -9
    assert netns_with_prefix(tb.name) == []
    assert not os.path.exists(tb.state_path)
    # idempotent
    assert Testbed.down(tb.name, state_dir=state_dir) is False


def test_process_stop_forgets_it(make_testbed):
    tb = make_testbed(workers=1)
    p = tb.run_in("w0", ["sleep", "600"])
    assert [r["pid"] for r in tb.state()["processes"]] == [p.pid]
    p.stop(timeout=5)
    assert not pid_alive(p.pid)
    assert tb.state()["processes"] == []
    r = tb.exec("agg", ["ip", "-j", "addr", "show", "dev", "eth0"], timeout=10, check=True)
    assert json.loads(r.stdout)[0]["addr_info"][0]["local"] == tb.aggregator.ip
    assert tb.state()["processes"] == []


def test_down_leaves_nothing(state_dir):
    name = unique_name()
    before = host_links()
    Testbed.up(name, workers=2, link_mbit=100, state_dir=state_dir)
    assert len(netns_with_prefix(name)) == 4
    assert Testbed.list(state_dir) == [name]
    assert Testbed.down(name, state_dir=state_dir) is True
    assert netns_with_prefix(name) == []
    assert Testbed.list(state_dir) == []
    assert host_links() == before
    assert Testbed.down(name, state_dir=state_dir) is False


class Boom(RuntimeError):
    pass


@pytest.mark.parametrize("fail_at", [1, 2, 4])
def test_failed_up_removes_what_it_built(state_dir, monkeypatch, fail_at):
    """The fail_at-th tbf qdisc fails: up raises the original error and
    leaves no namespace, link or state file behind."""
    name = unique_name()
    real = Testbed._step_rate_limit
    calls = []

    def step(self, *a, **kw):
        calls.append(a)
        if len(calls) == fail_at:
            # the half-built testbed is really there when the failure happens
            assert len(netns_with_prefix(name)) >= 2
            raise Boom("injected")
        return real(self, *a, **kw)

    monkeypatch.setattr(Testbed, "_step_rate_limit", step)
    before = host_links()
    try:
        with pytest.raises(Boom):
            Testbed.up(name, workers=3, link_mbit=10, state_dir=state_dir)
    finally:
        leftover = netns_with_prefix(name)
        for ns in leftover:  # never leave anything, even if the test fails
            subprocess.run(["ip", "netns", "del", ns])
    assert leftover == []
    assert len(calls) == fail_at
    assert not os.path.exists(os.path.join(state_dir, f"{name}.json"))
    assert host_links() == before


def test_down_removes_a_half_built_testbed(state_dir, monkeypatch):
    """As if `up` had been killed midway: the state file records part of a
    testbed; down removes exactly that."""
    name = unique_name()

    def step_host(self, h, sw, sw_ns, bridge, hname, *a):
        if hname == "w1":
            raise Boom("injected")
        return real_step_host(self, h, sw, sw_ns, bridge, hname, *a)

    real_step_host = Testbed._step_host
    real_down = Testbed.down
    monkeypatch.setattr(Testbed, "_step_host", step_host)
    monkeypatch.setattr(Testbed, "down", classmethod(lambda cls, *a, **kw: None))
    try:
        with pytest.raises(Boom):
            Testbed.up(name, workers=3, state_dir=state_dir)
        st = json.load(open(os.path.join(state_dir, f"{name}.json")))
        assert st["complete"] is False
        # w1's namespace was created (and recorded) before its step failed
        assert netns_with_prefix(name) == sorted(
            [f"hg-{name}-sw", f"hg-{name}-agg", f"hg-{name}-w0", f"hg-{name}-w1"]
        )
        assert [h["name"] for h in st["hosts"]] == ["agg", "w0"]
    finally:
        monkeypatch.setattr(Testbed, "down", real_down)
        removed = Testbed.down(name, state_dir=state_dir)
    assert removed is True
    assert netns_with_prefix(name) == []
    assert Testbed.down(name, state_dir=state_dir) is False


def test_existing_name_is_an_error_and_touches_nothing(state_dir, make_testbed):
    tb = make_testbed(workers=1)
    path = tb.state_path
    before = open(path).read()
    with pytest.raises(TestbedExists, match="already exist"):
        Testbed.up(tb.name, workers=2, state_dir=state_dir)
    assert open(path).read() == before
    assert len(netns_with_prefix(tb.name)) == 3
    r = tb.exec("w0", ["ping", "-c", "1", "-W", "3", tb.aggregator.ip], timeout=15)
    assert r.returncode == 0


def test_existing_namespace_without_state_is_an_error(state_dir):
    name = unique_name()
    stray = f"hg-{name}-w0"
    subprocess.run(["ip", "netns", "add", stray], check=True)
    try:
        with pytest.raises(TestbedExists, match=stray):
            Testbed.up(name, workers=2, state_dir=state_dir)
        assert netns_with_prefix(name) == [stray]
        assert not os.path.exists(os.path.join(state_dir, f"{name}.json"))
        # down has no state file, so it must not touch the stray namespace
        assert Testbed.down(name, state_dir=state_dir) is False
        assert netns_with_prefix(name) == [stray]
    finally:
        subprocess.run(["ip", "netns", "del", stray], check=True)


def test_bad_arguments(state_dir):
    for kw, match in (
        ({"workers": 0}, "workers"),
        ({"workers": 2, "link_mbit": -1}, "link_mbit"),
        ({"workers": 300}, "too small"),
        ({"workers": 2, "subnet": "10.1.2.3/24"}, "subnet"),
    ):
        with pytest.raises(TestbedError, match=match):
            Testbed.up(unique_name(), state_dir=state_dir, **kw)
    with pytest.raises(TestbedError, match="bad testbed name"):
        Testbed.up("Bad-Name", workers=1, state_dir=state_dir)
    assert not os.path.exists(state_dir) or os.listdir(state_dir) == []


def test_not_root_is_a_clear_error(state_dir, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    name = unique_name()
    with pytest.raises(RootRequired, match="needs root.*sudo"):
        Testbed.up(name, workers=2, state_dir=state_dir)
    with pytest.raises(RootRequired, match="needs root"):
        Testbed.down(name, state_dir=state_dir)
    monkeypatch.undo()
    assert netns_with_prefix(name) == []
    assert not os.path.exists(state_dir)


def cli(*args, user=None, state_dir=None):
    env = dict(os.environ, PYTHONPATH=ORCH)
    pre = (
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if user == "nobody" else []
    )
    sd = ["--state-dir", state_dir] if state_dir else []
    return subprocess.run(
        [*pre, sys.executable, "-m", "homagg.cli.testbed", *sd, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd="/",
    )


def test_cli_as_nobody_says_root_is_needed(state_dir):
    name = unique_name()
    r = cli("up", "--workers", "2", "--name", name, user="nobody", state_dir=state_dir)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "needs root" in r.stderr and "sudo" in r.stderr
    assert "Traceback" not in r.stderr
    assert netns_with_prefix(name) == []
    r = cli("down", "--name", name, user="nobody", state_dir=state_dir)
    assert r.returncode == 1 and "needs root" in r.stderr


def test_cli_up_show_list_down(state_dir):
    name = unique_name()
    try:
        r = cli("up", "--workers", "2", "--link-mbit", "100", "--name", name, state_dir=state_dir)
        assert r.returncode == 0, r.stderr
        assert f"hg-{name}-w1" in r.stdout and "100 Mbit/s" in r.stdout
        r = cli("show", "--name", name, state_dir=state_dir)
        assert r.returncode == 0, r.stderr
        for s in ("10.77.0.1/24", "10.77.0.10/24", "10.77.0.11/24", f"hg-{name}-agg", "unshaped"):
            assert s in r.stdout
        r = cli("show", "--name", name, "--json", state_dir=state_dir)
        assert r.returncode == 0
        st = json.loads(r.stdout)
        assert [h["ip"] for h in st["hosts"]] == ["10.77.0.1", "10.77.0.10", "10.77.0.11"]
        assert len(st["namespaces_present"]) == 4
        r = cli("list", state_dir=state_dir)
        assert r.returncode == 0 and r.stdout.split()[0] == name
        r = cli("up", "--workers", "1", "--name", name, state_dir=state_dir)
        assert r.returncode == 1 and "already exists" in r.stderr
    finally:
        r = cli("down", "--name", name, state_dir=state_dir)
    assert r.returncode == 0 and "removed" in r.stdout
    assert netns_with_prefix(name) == []
    r = cli("down", "--name", name, state_dir=state_dir)
    assert r.returncode == 0 and "nothing to remove" in r.stdout
    r = cli("show", "--name", name, state_dir=state_dir)
    assert r.returncode == 1 and "no testbed state file" in r.stderr


def test_cli_is_registered_and_has_help():
    from homagg.cli import COMMANDS

    assert COMMANDS["testbed"] == "homagg.cli.testbed"
    for args in ((), ("up",), ("down",), ("show",), ("list",), ("job",)):
        r = cli(*args, "--help")
        assert r.returncode == 0 and "usage:" in r.stdout
    up = cli("up", "--help").stdout
    assert "--link-mbit" in up and "--no-daemon" in up and "--payload-bytes" in up


def test_refresh_cost_rewrites_every_job_file_of_a_tree(tmp_path, monkeypatch):
    """`homagg calibrate --testbed` gives the standing job the new cost
    model in its job file; a tree's workers each have one (their leaf),
    and every one of them gets the same cost, so every worker decides
    alike (the cost model's rule).  Only the cost changes."""
    from types import SimpleNamespace

    from homagg import cost
    from homagg.deploy.local import testbed_job
    from homagg.switch import job_file

    monkeypatch.setenv("HOMAGG_CALIBRATION", str(tmp_path / "none.json"))
    old = cost.job_cost(100).to_dict()
    files = []
    for w in range(3):
        files.append(
            job_file.write_job_file(
                str(tmp_path / f"job-w{w}.json"),
                aggregator=f"10.77.0.{1 + w // 2}:48879",
                job=5,
                token=9,
                workers=3,
                group="239.77.0.3",
                timeout=10.0,
                slots=64,
                payload=1424,
                cost=old,
                leaf_ids=[w % 2, 2 - w // 2],
            )
        )
    state = {
        "link_mbit": 1000.0,
        "job": {"job": 5, "file": files[0], "files": files, "leaves": 2},
    }
    tb = SimpleNamespace(
        name="t",
        state=lambda: state,
        workers=[SimpleNamespace(name=f"w{w}") for w in range(3)],
        aggregators=[SimpleNamespace(name=n) for n in ("agg", "agg1", "agg2")],
    )
    before = [json.load(open(p)) for p in files]
    assert testbed_job.refresh_cost(tb) == files[0]
    after = [json.load(open(p)) for p in files]
    want = testbed_job.job_cost(tb).to_dict()
    assert want != old and all(a["cost"] == want for a in after)
    for b, a in zip(before, after):
        assert {k: v for k, v in a.items() if k != "cost"} == {
            k: v for k, v in b.items() if k != "cost"
        }
