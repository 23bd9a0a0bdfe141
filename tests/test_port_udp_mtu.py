"""The worker's UDP socket never fragments (IP_PMTUDISC_DO): a payload
larger than the path's MTU fails with an error naming the MTU and the
payload.  Runs in a network namespace of its own (unshare --net) whose
loopback has MTU 1500, with the engine on a UdpPort there."""
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import require

pytestmark = [pytest.mark.root, pytest.mark.netns, pytest.mark.timeout(60)]

CHILD = textwrap.dedent("""
    import subprocess
    import threading

    import numpy as np
    from homagg.engine import Engine
    from homagg.errors import InvalidArgument
    from homagg.worker import UdpPort, Worker

    subprocess.run("ip link set lo mtu 1500 up".split(), check=True)
    port = UdpPort(("127.0.0.1", 0), mtu=9000)
    engine = Engine(port, udp_port=port.local_address[1])
    engine.add_job(job=1, token=1, workers=1, slots=8, payload_bytes=8192)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            if engine.poll() == 0:
                port.wait(0.002)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
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
    stop.set()
    t.join(5)
""")


def test_payload_over_the_path_mtu_fails_naming_mtu_and_payload():
    require(shutil.which("unshare") is not None, "needs unshare (util-linux)")
    p = subprocess.run(["unshare", "--net", sys.executable, "-c", CHILD],
                       capture_output=True, text=True, timeout=50)
    assert p.returncode == 0, p.stderr
    first, message = p.stdout.splitlines()[:2]
    counts = dict(kv.split("=") for kv in first.split())
    # the first phase's small frames went out, the 8 KB ones never
    assert int(counts["too_big"]) > 0 and int(counts["tx"]) > 0, first
    assert int(counts["bytes"]) > 8192 + 28, first  # IPv4 + UDP + HomAgg headers + payload
    assert "payload 8192 bytes" in message and "MTU 1500" in message, message
    assert "at most" in message and "MTU >= " in message, message
