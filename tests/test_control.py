"""homagg-switch's control socket: every request type, malformed requests,
and clean shutdown.  The daemon runs on a net_ring vdev (no traffic) with
--no-huge; every test checks the daemon survives what it was sent."""

import errno
import json
import signal
import socket
import stat

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from homagg._native import lib
from homagg.switch.control import ControlClient, ControlError
from homagg.errors import InvalidArgument, OutOfRange, PeerTimeout
from homagg.runs.session import accounting

from helpers import wait_for
from switch_helpers import SWITCH, Daemon

pytestmark = [pytest.mark.dpdk, pytest.mark.root]


@pytest.fixture
def daemon(tmp_path):
    if not SWITCH.exists():
        pytest.fail(f"{SWITCH} is not built (make switch)")
    d = Daemon(tmp_path / "sw", ["--vdev", "net_ring0"])
    try:
        d.wait_ready()
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One daemon for the many requests that must leave it unchanged."""
    if not SWITCH.exists():
        pytest.fail(f"{SWITCH} is not built (make switch)")
    d = Daemon(tmp_path_factory.mktemp("shared"), ["--vdev", "net_ring0"])
    try:
        d.wait_ready()
        yield d
    finally:
        d.stop()


JOB = dict(job=7, token=0xC0FFEE, workers=4, slots=32, payload=1024, group="239.1.1.1")
# IPv4 + UDP + HomAgg header + payload + the optional 16-byte MAC <= MTU
PAYLOAD_AT_1500 = (1500 - 20 - 8 - lib.HG_HDR_LEN - 16) // 4 * 4
PARENT = dict(ip="10.0.0.9", mac="02:00:00:00:00:09", worker=1)


def test_stats_names_every_counter(daemon):
    with daemon.client() as c:
        st = c.stats()
    counters = st["stats"]
    assert counters, "no engine counters"
    assert all(isinstance(v, int) and v >= 0 for v in counters.values())
    for name in ("received", "summed", "results_sent", "unknown_job", "bad_token"):
        assert name in counters
    assert set(st["port"]) >= {"ipackets", "rx", "tx", "drop_injected", "arp_replies", "arp_other"}
    assert accounting(st)["consistent"]


def test_add_and_remove_job(daemon):
    with daemon.client() as c:
        assert c.add_job(**JOB)["job"] == 7
        # without a group (unicast results) and with the default payload
        assert c.add_job(job=8, token=1, workers=1, slots=1)["job"] == 8
        with pytest.raises(ControlError) as ei:
            c.add_job(**JOB)
        assert ei.value.code == -errno.EEXIST
        assert "job 7 already exists" in str(ei.value)
        assert c.remove_job(7)["job"] == 7
        with pytest.raises(ControlError) as ei:
            c.remove_job(7)
        assert ei.value.code == -errno.ENOENT
        # the id is free again; the job's incarnation is given or from the clock
        assert c.add_job(**JOB, shard=5, incarnation=4242)["incarnation"] == 4242
        c.remove_job(7)
        assert c.add_job(**JOB)["incarnation"] > 0
        c.remove_job(7)
        c.remove_job(8)
    assert daemon.alive()


def test_add_job_with_a_parent(shared):
    """A tree leaf's job: its parent with every optional field."""
    with shared.client() as c:
        c.add_job(
            **JOB,
            parent=dict(
                PARENT, port=48879, shard=0, group="239.2.0.1", rto_us=2000, base=4, leaves=3
            ),
        )
        with pytest.raises(Exception, match="already exists"):
            c.add_job(**JOB)
        c.remove_job(JOB["job"])
    assert shared.alive()


def test_rotate_key_of_a_tree_leaf(shared):
    """A leaf of an authenticated tree takes the root's next keys
    (``parent``: up_epoch 1, then 1 again: given again they replace the
    first) and its own next secret (epoch 1); a job that is no leaf, or
    without auth, is refused naming why; a malformed ``parent`` names the
    field and the fix."""
    key = "ab" * 32
    leaf = dict(JOB, job=71, auth=bytes([1]) * 32, mac="blake2b")
    leaf_parent = dict(PARENT, key=key, reply_key="cd" * 32)
    with shared.client() as c:
        c.add_job(**leaf, parent=leaf_parent)
        c.add_job(**dict(JOB, job=72, auth=bytes([2]) * 32, mac="blake2b"))
        c.add_job(**dict(JOB, job=73), parent=PARENT)
        try:
            nk, nr = bytes(range(32)), bytes(range(32, 64))
            assert c.rotate_up_key(71, nk, nr)["up_epoch"] == 1
            assert c.rotate_up_key(71, nr, nk)["up_epoch"] == 1
            assert c.rotate_key(71, bytes(32), grace=1.0)["epoch"] == 1
            for job in (72, 73):
                with pytest.raises(ControlError, match="is no authenticated tree leaf") as ei:
                    c.rotate_up_key(job, nk, nr)
                assert ei.value.code == -errno.EPERM
            with pytest.raises(ControlError, match="no job 74"):
                c.rotate_up_key(74, nk, nr)
            for fields, message in [
                (dict(parent={"key": key}), "field 'parent.reply_key': missing"),
                (dict(parent={"key": key, "reply_key": "xy"}), "field 'parent.reply_key': must be"),
                (dict(parent={"key": key, "reply_key": key, "ip": "1.2.3.4"}), "field 'ip'"),
                (dict(parent=[key]), "field 'parent': must be an object"),
                (
                    dict(parent={"key": key, "reply_key": key}, auth="03" * 32),
                    "without 'auth' or 'grace_ms'",
                ),
                (dict(), "or 'parent' with a tree leaf's keys"),
            ]:
                reply = c.send_line(json.dumps(dict(cmd="rotate_key", job=71, **fields)).encode())
                assert reply["ok"] is False and message in reply["error"], (fields, reply)
        finally:
            for job in (71, 72, 73):
                c.remove_job(job)
    assert shared.alive()


@pytest.mark.parametrize(
    "fields, exc, message",
    [
        (dict(JOB, workers=0), OutOfRange, "field 'workers': must be 1..256"),
        (dict(JOB, workers=100000), OutOfRange, "field 'workers': must be 1.."),
        (dict(JOB, slots=0), OutOfRange, "field 'slots': must be 1.."),
        (dict(JOB, job=-1), OutOfRange, "field 'job': must be 0..4294967295"),
        (dict(JOB, token=2**32), OutOfRange, "field 'token': must be 0..4294967295"),
        (dict(JOB, workers="4"), InvalidArgument, "field 'workers': must be an integer"),
        (dict(JOB, slots=1.5), InvalidArgument, "field 'slots': must be an integer"),
        (dict(JOB, payload=1022), InvalidArgument, "field 'payload': must be a multiple of 4"),
        (dict(JOB, payload=10**6), OutOfRange, "field 'payload': must be 4.."),
        # a packet is one datagram of the port's MTU (1500 on net_ring), MAC included
        (
            dict(JOB, payload=PAYLOAD_AT_1500 + 4),
            OutOfRange,
            f"field 'payload': {PAYLOAD_AT_1500 + 4} bytes do not fit this aggregator's frames: "
            f"at most {PAYLOAD_AT_1500} bytes at MTU 1500",
        ),
        (dict(JOB, payload=8192), OutOfRange, "--mtu 9000"),
        (dict(JOB, group="10.0.0.1"), InvalidArgument, "is not a multicast address"),
        (dict(JOB, group="239.1.1"), InvalidArgument, "field 'group': must be an IPv4"),
        (dict(JOB, group=5), InvalidArgument, "field 'group': must be an IPv4"),
        (dict(JOB, colour="red"), InvalidArgument, "field 'colour': unknown"),
        (dict(JOB, shard=64), OutOfRange, "field 'shard': must be 0..63"),
        (dict(JOB, incarnation=0), OutOfRange, "field 'incarnation': must be 1..4294967295"),
        (dict(JOB, incarnation=-1), OutOfRange, "field 'incarnation': must be 1.."),
        ({k: v for k, v in JOB.items() if k != "token"}, InvalidArgument, "field 'token': missing"),
        # a tree leaf's parent (docs/PROTOCOL.md "Tree")
        (dict(JOB, parent=5), InvalidArgument, "field 'parent': must be an object"),
        (dict(JOB, parent=dict(PARENT, ip=None)), InvalidArgument, "field 'ip': missing"),
        (
            dict(JOB, parent=dict(PARENT, mac="02:00:00:00:00")),
            InvalidArgument,
            "field 'parent.mac': must be a MAC address",
        ),
        (dict(JOB, parent=dict(PARENT, worker=256)), OutOfRange, "field 'worker': must be 0..255"),
        (
            dict(JOB, parent=dict(PARENT, group="10.0.0.9")),
            InvalidArgument,
            "is not a multicast address",
        ),
        (dict(JOB, parent=dict(PARENT, colour=1)), InvalidArgument, "field 'colour': unknown"),
        # who is missing in a tree: the leaf's first worker and L
        (dict(JOB, parent=dict(PARENT, leaves=257)), OutOfRange, "field 'leaves': must be 0..256"),
        (dict(JOB, parent=dict(PARENT, base=256)), OutOfRange, "field 'base': must be 0..255"),
        (
            dict(JOB, parent=dict(PARENT, base=253)),  # its 4 workers: 253..256
            OutOfRange,
            "field 'parent.base': the leaf's workers base..base+workers-1 must be job workers below 256",
        ),
        (
            dict(JOB, parent=dict(PARENT, worker=2, leaves=2)),
            InvalidArgument,
            "field 'parent.worker': must be below 'parent.leaves'",
        ),
        # an authenticated leaf: its key at the root and the root's aggregator key, both required
        (
            dict(JOB, parent=PARENT, auth="00" * 32),
            InvalidArgument,
            "field 'parent.key': missing: an authenticated leaf needs its own key at the root",
        ),
        (
            dict(JOB, parent=dict(PARENT, key="11" * 32), auth="00" * 32),
            InvalidArgument,
            "field 'parent.reply_key': missing",
        ),
        (
            dict(JOB, parent=dict(PARENT, key="11" * 31, reply_key="22" * 32), auth="00" * 32),
            InvalidArgument,
            "field 'parent.key': must be a key as a string of 64 hexadecimal digits",
        ),
        (
            dict(JOB, parent=dict(PARENT, key="11" * 32, reply_key="zz" * 32), auth="00" * 32),
            InvalidArgument,
            "field 'parent.reply_key': must be a key as a string of 64 hexadecimal",
        ),
        (
            dict(JOB, parent=dict(PARENT, key="11" * 32, reply_key="22" * 32)),
            InvalidArgument,
            "field 'parent.key': only with 'auth'",
        ),
    ],
)
def test_add_job_rejects_bad_fields(shared, fields, exc, message):
    daemon = shared
    with daemon.client() as c:
        with pytest.raises(exc) as ei:
            c.request("add_job", **fields)
        assert message in str(ei.value)
        # nothing was added: the valid job can still be created
        c.add_job(**JOB)
        c.remove_job(JOB["job"])
    assert daemon.alive()


def test_jumbo_mtu_takes_8192_byte_payloads(tmp_path):
    """--mtu 9000: mbufs of a whole jumbo frame, jobs of up to HG_MAX_PAYLOAD
    bytes; past it the refusal names the limit."""
    if not SWITCH.exists():
        pytest.fail(f"{SWITCH} is not built (make switch)")
    d = Daemon(tmp_path / "sw", ["--vdev", "net_ring0"], ["--mtu", "9000"])
    try:
        d.wait_ready()
        assert "mtu=9000 max_payload=8192 mbuf_data_room=9216" in d.output()
        with d.client() as c:
            assert c.add_job(**dict(JOB, payload=8192))["job"] == 7
            with pytest.raises(OutOfRange) as ei:
                c.add_job(**dict(JOB, job=8, payload=8196))
            assert "field 'payload': must be 4..8192" in str(ei.value)
            c.remove_job(7)
        assert d.alive()
    finally:
        d.stop()


def test_mtu_option_is_checked(tmp_path):
    if not SWITCH.exists():
        pytest.fail(f"{SWITCH} is not built (make switch)")
    d = Daemon(tmp_path / "sw", ["--vdev", "net_ring0"], ["--mtu", "9001"])
    try:
        wait_for(lambda: not d.alive(), 30, "homagg-switch to refuse --mtu 9001")
        assert d.proc.returncode == 1
        assert "bad value for --mtu: 9001" in d.output()
    finally:
        d.stop()


def test_rx_ring_bounds_the_window(tmp_path):
    """add_job refuses W x S frames in flight beyond the port's ring
    (net_ring: its rx descriptors, --rx-ring), naming the job's figure, the
    limit and the fix; --rx-ring enlarges the ring."""
    if not SWITCH.exists():
        pytest.fail(f"{SWITCH} is not built (make switch)")
    for ring in (None, 64, 2048):
        d = Daemon(
            tmp_path / f"r{ring}",
            ["--vdev", "net_ring0"],
            ["--rx-ring", str(ring), "--mbufs", "1023"] if ring else [],
        )
        try:
            d.wait_ready()
            n = ring or 1024
            assert f"rx_ring={n}" in d.output()
            with d.client() as c:
                assert c.stats()["rx_ring"] == n and c.stats()["port"]["rx_missed"] == 0
                assert c.add_job(**dict(JOB, workers=4, slots=n // 4))["job"] == 7
                with pytest.raises(OutOfRange) as ei:
                    c.add_job(**dict(JOB, job=8, workers=8, slots=n // 4))
                assert (
                    f"field 'slots': 8 workers x {n // 4} slots = {2 * n} frames of "
                    f"1024-byte payloads in flight exceed this aggregator's receive "
                    f"ring of {n} frames (rx descriptors): use at most {n // 8} slots, "
                    "or a daemon with a larger ring"
                ) in str(ei.value)
                fix = f"at most {n // 256} slots" if n >= 256 else f"at most {n} workers"
                with pytest.raises(OutOfRange, match=fix):
                    c.add_job(**dict(JOB, job=9, workers=256, slots=n // 4))
        finally:
            d.stop()


def test_rx_ring_bounds_the_jobs_together(tmp_path):
    """Jobs on one daemon share its receive ring: add_job refuses a job that
    fits alone but not with the jobs already registered, naming the total,
    those jobs and the fix; remove_job gives a job's frames back."""
    if not SWITCH.exists():
        pytest.fail(f"{SWITCH} is not built (make switch)")
    d = Daemon(
        tmp_path / "total", ["--vdev", "net_ring0"], ["--rx-ring", "1024", "--mbufs", "1023"]
    )
    try:
        d.wait_ready()
        with d.client() as c:
            assert c.add_job(**dict(JOB, job=7, workers=4, slots=128))["job"] == 7
            assert c.add_job(**dict(JOB, job=8, workers=2, slots=192))["job"] == 8
            with pytest.raises(OutOfRange) as ei:
                c.add_job(**dict(JOB, job=9, workers=4, slots=64))
            assert str(ei.value).endswith(
                "field 'slots': 4 workers x 64 slots = 256 frames in flight, with the 896 "
                "held by the jobs already on this aggregator (job 7: 512, job 8: 384), make "
                "1152 frames, more than its receive ring of 1024 frames (rx descriptors): "
                "use at most 32 slots, remove one of those jobs first, or a daemon with a "
                "larger ring (af_packet: framecnt=N in its --vdev; other PMDs: --rx-ring N)"
            )
            # the refused job holds nothing: exactly the 128 frames left fit
            assert c.add_job(**dict(JOB, job=10, workers=4, slots=32))["job"] == 10
            with pytest.raises(OutOfRange) as ei:
                c.add_job(**dict(JOB, job=9, workers=1, slots=1))
            assert "with the 1024 held by" in str(ei.value)
            assert "(rx descriptors): remove one of those jobs first" in str(ei.value)
            # re-adding a registered job is still "already exists"
            with pytest.raises(ControlError) as ei:
                c.add_job(**dict(JOB, job=7, workers=4, slots=128))
            assert ei.value.code == -errno.EEXIST
            c.remove_job(10)
            c.remove_job(8)
            assert c.add_job(**dict(JOB, job=9, workers=4, slots=64))["job"] == 9
            # a failed remove_job gives nothing back
            with pytest.raises(ControlError):
                c.remove_job(8)
            with pytest.raises(
                OutOfRange,
                match="with the 768 held by the jobs already on "
                r"this aggregator \(job 7: 512, job 9: 256\)",
            ):
                c.add_job(**dict(JOB, job=11, workers=4, slots=128))
            # more than 8 jobs: the first 8 are named, then how many more
            c.remove_job(7)
            c.remove_job(9)
            for job in range(20, 30):
                c.add_job(**dict(JOB, job=job, workers=4, slots=25))
            with pytest.raises(OutOfRange) as ei:
                c.add_job(**dict(JOB, job=30, workers=4, slots=8))
            assert (
                "(job 20: 100, job 21: 100, job 22: 100, job 23: 100, job 24: 100, "
                "job 25: 100, job 26: 100, job 27: 100 and 2 more), make 1032 frames"
            ) in str(ei.value)
            assert "use at most 6 slots" in str(ei.value)
        assert d.alive()
    finally:
        d.stop()


@pytest.mark.parametrize(
    "line, message",
    [
        # jansson's messages, after the byte offset it stopped at
        (b"{", "bad JSON at byte 1: string or '}' expected near end of file"),
        (b"not json", "bad JSON at byte 3: '[' or '{' expected near 'not'"),
        (b"[1, 2]", "bad JSON at byte 0: expected an object"),
        (b'{"cmd": "stats"} trailing', "end of file expected near 'trailing'"),
        (b'{"cmd": "stats", "cmd": "stats"}', "duplicate object key near '\"cmd\"'"),
        (b'{"cmd": {"nested": 1}}', "field 'cmd': must be a string"),
        (b'{"cmd": "st\\ud800ats"}', "invalid Unicode '\\uD800'"),
        (b'{"cmd": "a\x01b"}', "control character 0x1"),
        (b'{"cmd": "stats", "x": "\\u0000"}', "\\u0000 is not allowed"),
        (b'{"job": 1}', "field 'cmd': missing"),
        (b'{"cmd": 3}', "field 'cmd': must be a string"),
        (b'{"cmd": "reboot"}', "field 'cmd': unknown command 'reboot'"),
        (b'{"cmd": "remove_job"}', "field 'job': missing"),
        (b'{"cmd": "remove_job", "job": "7"}', "field 'job': must be an integer"),
        (b'{"cmd": "remove_job", "job": 7.0}', "field 'job': must be an integer"),
        (b'{"cmd": "remove_job", "job": [7]}', "field 'job': must be an integer"),
        (b'{"cmd": "add_job", "job": 01}', "invalid token near '0'"),
        (b'{"cmd": "add_job", "job": 123456789012345678901234}', "too big integer"),
        (b'{"cmd": "stats", "verbose": true}', "field 'verbose': unknown"),
        (b"\xff\xfe{}", "bad JSON at byte 0: unable to decode byte 0xff"),
        (b'{"cmd": "st\xc3"}', "unable to decode byte 0xc3"),
    ],
)
def test_malformed_requests_are_answered(shared, line, message):
    daemon = shared
    with daemon.client() as c:
        reply = c.send_line(line)
        assert reply["ok"] is False
        assert message in reply["error"]
        assert reply["code"] < 0
        # the same connection still serves well-formed requests
        assert c.send_line(b'{"cmd":"stats"}')["ok"] is True
    assert daemon.alive()


@pytest.mark.parametrize(
    "name, echoed",
    [
        # 1 + 31 two-byte characters = 63 bytes: the 32nd would end at byte 65
        ("a" + "\u00e9" * 40, "a" + "\u00e9" * 31),
        # 16 four-byte characters are exactly 64 bytes
        ("\U0001d11e" * 20, "\U0001d11e" * 16),
        ("ab" + "\U0001d11e" * 20, "ab" + "\U0001d11e" * 15),
        ("\u20ac" * 30, "\u20ac" * 21),
    ],
)
def test_long_names_are_echoed_whole_characters(shared, name, echoed):
    """A client's string quoted in an error is cut at 64 bytes on a UTF-8
    character boundary: the reply stays JSON, the client raises the
    daemon's error (never ProtocolError)."""
    with shared.client() as c:
        with pytest.raises(InvalidArgument) as ei:
            c.request(name)
        assert f"unknown command '{echoed}' (add_job" in str(ei.value)
        with pytest.raises(InvalidArgument) as ei:
            c.request("stats", **{name: 1})
        assert f"field '{echoed}': unknown" in str(ei.value)


@settings(
    deadline=None, max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=st.text(min_size=1, max_size=120))
def test_any_unicode_request_gets_a_json_reply(shared, name):
    """Whatever the strings of a request, the reply is JSON: the client
    raises the daemon's own error for it, never ProtocolError.  (A name
    that is a multicast address is a valid group: that job is added, and
    removed again.)"""
    import ipaddress

    with shared.client() as c:
        for fields in (
            {"cmd": name},
            {"cmd": "stats", name: name},
            {"cmd": "add_job", "job": 1, "token": 1, "workers": 1, "slots": 1, "group": name},
        ):
            if fields["cmd"] in ("stats", "remove_job", "add_job", "shutdown") and len(fields) == 1:
                continue
            try:
                valid = ipaddress.IPv4Address(name).is_multicast and fields["cmd"] == "add_job"
            except ValueError:
                valid = False
            if valid:
                assert c.request(**fields)["job"] == 1
                c.remove_job(1)
                continue
            with pytest.raises((InvalidArgument, OutOfRange)):
                c.request(**fields)
    assert shared.alive()


def test_many_requests_in_one_write_and_split_writes(daemon):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(str(daemon.control))
    try:
        s.sendall(b'{"cmd":"stats"}\n{"cmd":"bogus"}\r\n\n{"cmd":"stats"}\n')
        # and one request split over writes
        s.sendall(b'{"cmd":"st')
        s.sendall(b'ats"}\n')
        buf = b""
        while buf.count(b"\n") < 4:
            chunk = s.recv(65536)
            assert chunk, "daemon closed the connection"
            buf += chunk
        replies = [json.loads(x) for x in buf.splitlines()]
        assert [r["ok"] for r in replies] == [True, False, True, True]
    finally:
        s.close()


def test_overlong_request_is_answered_and_skipped(daemon):
    with daemon.client() as c:
        c._sock.sendall(b'{"cmd":"' + b"x" * 10000)
        reply = c._read_reply()
        assert reply["ok"] is False and "request longer than" in reply["error"]
        # the rest of that line is skipped; the next line is served
        c._sock.sendall(b'x"}\n')
        assert c.send_line(b'{"cmd":"stats"}')["ok"] is True
    assert daemon.alive()


def test_abrupt_disconnects_and_concurrent_clients(daemon):
    for _ in range(20):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(daemon.control))
        s.sendall(b'{"cmd":"sta')  # half a request, then gone
        s.close()
    clients = [daemon.client() for _ in range(8)]
    try:
        for i, c in enumerate(clients):
            c.add_job(job=100 + i, token=i, workers=2, slots=4)
        for i, c in enumerate(clients):
            c.remove_job(100 + i)
    finally:
        for c in clients:
            c.close()
    assert daemon.alive()


def test_shutdown_command_exits_zero(daemon):
    with daemon.client() as c:
        assert c.shutdown()["ok"] is True
    assert daemon.wait_exit(timeout=20) == 0
    assert "stopping (shutdown command)" in daemon.output()
    assert not daemon.control.exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_exits_zero_and_removes_socket(daemon, sig):
    with daemon.client() as c:
        c.add_job(**JOB)  # a job still configured at exit
    daemon.signal(sig)
    assert daemon.wait_exit(timeout=20) == 0
    assert not daemon.control.exists()
    with pytest.raises(PeerTimeout):
        ControlClient(daemon.control, timeout=1).connect()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--drop-rate", "2"], "--drop-rate"),
        (["--port-ip", "10.0.0.300"], "--port-ip"),
        (["--lcores", "2"], "--lcores 2 needs 3 EAL lcores"),
        (["--queues", "2"], "--queues: only 1 is supported"),
        (["--port", "5"], "ethdev port 5 does not exist"),
        (["--rx-ring", "63"], "bad value for --rx-ring: 63"),
        (["--bogus"], "usage"),
    ],
)
def test_bad_command_line_fails(tmp_path, args, message):
    if not SWITCH.exists():
        pytest.fail(f"{SWITCH} is not built (make switch)")
    d = Daemon(tmp_path / "bad", ["--vdev", "net_ring0"], args)
    try:
        rc = d.wait_exit(timeout=30)
    finally:
        d.stop()
    assert rc != 0
    assert message in d.output()


@pytest.mark.parametrize("umask", [0o000, 0o022])
def test_control_socket_is_owner_only(tmp_path, umask):
    """The socket file is 0600 whatever the umask the daemon starts with."""
    if not SWITCH.exists():
        pytest.fail(f"{SWITCH} is not built (make switch)")
    d = Daemon(tmp_path / "mode", ["--vdev", "net_ring0"], umask=umask)
    try:
        d.wait_ready()
        assert stat.S_ISSOCK(d.control.stat().st_mode)
        assert stat.S_IMODE(d.control.stat().st_mode) == 0o600
    finally:
        d.stop()


def test_log_level_of_the_daemon(tmp_path):
    """The daemon logs through rte_log type homagg.switch: NOTICE by
    default (the ready line), --log-level homagg.switch:warning hides it,
    errors still show."""
    if not SWITCH.exists():
        pytest.fail(f"{SWITCH} is not built (make switch)")
    quiet = ["--vdev", "net_ring0", "--log-level", "homagg.switch:warning"]
    d = Daemon(tmp_path / "quiet", quiet)
    try:
        d.wait_ready()
        d.signal(signal.SIGTERM)
        assert d.wait_exit(20) == 0
    finally:
        d.stop()
    assert "homagg-switch:" not in d.output()
    d = Daemon(tmp_path / "quiet_bad", quiet, ["--drop-rate", "2"])
    try:
        assert d.wait_exit(30) != 0
    finally:
        d.stop()
    assert "homagg-switch: bad value for --drop-rate: 2" in d.output()


def test_telemetry_stats(tmp_path):
    """/homagg/stats over DPDK's telemetry socket (v2 protocol)."""
    if not SWITCH.exists():
        pytest.fail(f"{SWITCH} is not built (make switch)")
    d = Daemon(tmp_path / "tel", ["--vdev", "net_ring0"], telemetry=True)
    try:
        d.wait_ready()
        sock_path = wait_for(
            lambda: next(iter(d.runtime.rglob("dpdk_telemetry.v2")), None),
            10,
            "the telemetry socket",
        )
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.settimeout(5)
        s.connect(str(sock_path))
        try:
            json.loads(s.recv(16384))  # greeting
            s.send(b"/homagg/stats")
            reply = json.loads(s.recv(65536))
        finally:
            s.close()
        stats = reply["/homagg/stats"]
        assert "received" in stats and "results_sent" in stats
        assert all(isinstance(v, int) for v in stats.values())
    finally:
        d.stop()


def test_stats_interval_prints_counters(tmp_path):
    if not SWITCH.exists():
        pytest.fail(f"{SWITCH} is not built (make switch)")
    d = Daemon(tmp_path / "si", ["--vdev", "net_ring0"], ["--stats-interval", "0.05"])
    try:
        d.wait_ready()
        wait_for(lambda: "stats: port rx=" in d.output(), 20, "a stats line")
        assert "ready port=0" in d.output()
    finally:
        d.stop()
    assert d.proc.returncode == 0


# Arbitrary input never stops the daemon and always gets one JSON reply.

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=40),
)
_requests = st.dictionaries(
    st.sampled_from(["cmd", "job", "token", "workers", "slots", "payload", "group", "x"])
    | st.text(max_size=8),
    _scalars | st.lists(st.integers(), max_size=2),
    max_size=8,
).map(lambda d: d if d.get("cmd") != "shutdown" else {**d, "cmd": "stats"})
_garbage = st.binary(max_size=300).map(lambda b: b.replace(b"\n", b" ").strip() or b"x")


@settings(
    deadline=None, max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(line=st.one_of(_garbage, _requests.map(lambda d: json.dumps(d).encode())))
def test_any_line_gets_one_reply(shared, line):
    with shared.client() as c:
        reply = c.send_line(line)
        assert isinstance(reply["ok"], bool)
        if not reply["ok"]:
            assert reply["error"] and reply["code"] < 0
        else:
            # only a complete, valid request can succeed: undo it
            req = json.loads(line)
            if req["cmd"] == "add_job":
                c.remove_job(req["job"])
        assert c.send_line(b'{"cmd":"stats"}')["ok"] is True
    assert shared.alive()


def test_two_engine_lcores(tmp_path):
    """--lcores 2: jobs are spread over two engine lcores (job % 2) and
    managed through their mailboxes; stats add up; clean exit."""
    if not SWITCH.exists():
        pytest.fail(f"{SWITCH} is not built (make switch)")
    d = Daemon(tmp_path / "two", ["--vdev", "net_ring0"], ["--lcores", "2"], lcores="0@0,1@1,2@1")
    try:
        d.wait_ready()
        assert "engines=2" in d.output()
        with d.client() as c:
            assert c.stats()["engines"] == 2
            for job in (10, 11, 12, 13):
                c.add_job(job=job, token=job, workers=2, slots=4)
            for job in (10, 13):
                with pytest.raises(ControlError) as ei:
                    c.add_job(job=job, token=0, workers=2, slots=4)
                assert ei.value.code == -errno.EEXIST
            for job in (10, 11, 12, 13):
                c.remove_job(job)
            with pytest.raises(ControlError):
                c.remove_job(11)
            assert all(v == 0 for v in c.stats()["stats"].values())
        d.signal(signal.SIGTERM)
        assert d.wait_exit(20) == 0
    finally:
        d.stop()
    assert "stopping (Terminated)" in d.output()
