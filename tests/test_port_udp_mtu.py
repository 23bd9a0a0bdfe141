"""The worker's UDP socket never fragments (IP_PMTUDISC_DO): a payload
larger than the path's MTU fails with an error naming the MTU and the
payload.  Runs in a network namespace of its own (unshare --net) whose
loopback has MTU 1500, with the engine on a UdpPort there."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from helpers import require

pytestmark = [pytest.mark.root, pytest.mark.netns, pytest.mark.timeout(60)]

# An engine on a UdpPort of the namespace's loopback, served by a thread
# (the first lines of every child script; LO_SETUP, then SLOTS filled in).
RIG = """
import json
import subprocess
import sys
import threading

import numpy as np
from homagg.engine import Engine
from homagg.errors import InvalidArgument
from homagg.worker import UdpPort, Worker

for cmd in LO_SETUP:
    subprocess.run(cmd.split(), check=True)
port = UdpPort(("127.0.0.1", 0), mtu=9000)
engine = Engine(port, udp_port=port.local_address[1])
engine.add_job(job=1, token=1, workers=1, slots=SLOTS, payload_bytes=8192)
stop = threading.Event()

def serve():
    while not stop.is_set():
        if engine.poll() == 0:
            port.wait(0.002)

t = threading.Thread(target=serve, daemon=True)
t.start()
"""


def child(lo_setup, slots, body):
    """A child script: RIG on a loopback set up by the lo_setup commands,
    a job of ``slots`` slots, then body."""
    return (
        f"LO_SETUP = {lo_setup!r}\nSLOTS = {slots}\n"
        + RIG
        + textwrap.dedent(body)
        + "\nstop.set()\nt.join(5)\n"
    )


CHILD = child(
    ["ip link set lo mtu 1500 up"],
    8,
    """
    # told MTU 9000, so the worker's own check passes; the kernel must refuse
    with Worker(job=1, token=1, worker=0, workers=1, aggregator=port.local_address,
                bind=("127.0.0.1", 0), timeout=0.5, slots=8, payload=8192, mtu=9000) as w:
        try:
            w.allreduce(np.ones(50_000, dtype=np.float32), method="dense")
        except InvalidArgument as e:
            st = w.stats()["port"]
            print(f"too_big={st['tx_too_big']} bytes={st['tx_too_big_bytes']} tx={st['tx']}")
            print(" ".join(str(e).split()))
        else:
            print("no error")
""",
)


def test_payload_over_the_path_mtu_fails_naming_mtu_and_payload():
    require(shutil.which("unshare") is not None, "needs unshare (util-linux)")
    p = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert p.returncode == 0, p.stderr
    first, message = p.stdout.splitlines()[:2]
    counts = dict(kv.split("=") for kv in first.split())
    # the first phase's small frames went out, the 8 KB ones never
    assert int(counts["too_big"]) > 0 and int(counts["tx"]) > 0, first
    assert int(counts["bytes"]) > 8192 + 28, first  # IPv4 + UDP + HomAgg headers + payload
    assert "payload 8192 bytes" in message and "MTU 1500" in message, message
    assert "at most" in message and "MTU >= " in message, message


# jumbo loopback shaped to 1 Gbit/s: a window of frames waits in the qdisc,
# charged to the sending socket until the link takes it
WINDOW_CHILD = child(
    [
        "ip link set lo mtu 9000 up",
        "tc qdisc add dev lo root tbf rate 1gbit burst 64kb latency 100ms",
    ],
    64,
    """
    sys.path.insert(0, sys.argv[1])
    from reference import allreduce as oracle_allreduce

    x = np.random.default_rng(5).standard_normal(1 << 20).astype(np.float32)
    with Worker(job=1, token=1, worker=0, workers=1, aggregator=port.local_address,
                bind=("127.0.0.1", 0), timeout=10.0, slots=64, payload=8192) as w:
        y = w.allreduce(x, method="dense")
        st = w.stats()
    print(json.dumps({"tx_refused": st["tx_refused"], "retransmissions": st["retransmissions"],
                      "packets_sent": st["packets_sent"], "window_full_ns": st["window_full_ns"],
                      "exact": bool(np.array_equal(y.view(np.uint32),
                                                   oracle_allreduce([x], 4096).view(np.uint32)))}))
""",
)


def test_a_window_of_jumbo_frames_fits_the_send_buffer():
    """64 slots of 8 KB frames behind a 1 Gbit/s link: the worker's socket
    takes every frame of the window (its send buffer holds them; with the
    kernel's default one third came back EAGAIN and went out late, out of
    order), so nothing is refused or resent, and the sum is exact."""
    require(
        shutil.which("unshare") is not None and shutil.which("tc") is not None,
        "needs unshare (util-linux) and tc (iproute2)",
    )
    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", WINDOW_CHILD, here],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert p.returncode == 0, p.stderr
    st = json.loads(p.stdout.splitlines()[-1])
    assert st["exact"] is True, st
    # the thing under test: the socket's send buffer took every frame of the
    # window (nothing came back EAGAIN).  Whether a timer fired while the
    # window waited behind the link depends on scheduling on a loaded host,
    # so retransmissions are not counted here; every chunk of 4 MiB of floats
    # in 8 KB frames went out at least once, and each send beyond that was a
    # retransmission.
    assert st["tx_refused"] == 0, st
    assert st["packets_sent"] - st["retransmissions"] == 512 + 1, st
    # the window of 64 filled up behind the link
    assert st["window_full_ns"] > 0, st
