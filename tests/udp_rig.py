"""An aggregation engine on a kernel UDP port on loopback (a thread polls
it) and worker threads running the C client against it: the rig of
test_port_udp.py, also used by test_auth.py and test_scale.py.  No root."""

import threading

import numpy as np

from homagg.engine import Engine
from homagg.worker import UdpPort, Worker

BLOCK = 1024


class LoopbackAggregator:
    """An engine on a UdpPort bound to 127.0.0.1, polled by a thread."""

    def __init__(self):
        self.port = UdpPort(("127.0.0.1", 0))
        self.address = self.port.local_address
        # the engine accepts frames to its own UDP port only
        self.engine = Engine(self.port, udp_port=self.address[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            if self.engine.poll() == 0:
                self.port.wait(0.002)

    def close(self):
        self._stop.set()
        self._thread.join(10)
        assert not self._thread.is_alive()
        self.engine.close()
        self.port.close()


def run(
    agg,
    job,
    token,
    grads,
    method,
    slots=8,
    timeout=10.0,
    payload=1024,
    aggregators=None,
    stats=None,
    udp_gso=False,
    pipe_gain=0.0,
):
    """Every worker in its own thread; aggregators (a list of addresses)
    instead of agg's one; stats (a list) receives each worker's stats;
    udp_gso: the workers send runs of frames as UDP_SEGMENT messages;
    pipe_gain: the workers' Worker(pipe_gain=...)."""
    W = len(grads)
    out, err = [None] * W, [None] * W
    if stats is not None:
        stats[:] = [None] * W

    def work(w):
        try:
            with Worker(
                job=job,
                token=token,
                worker=w,
                workers=W,
                aggregators=aggregators or [agg.address],
                bind=("127.0.0.1", 0),
                timeout=timeout,
                slots=slots,
                payload=payload,
                udp_gso=udp_gso,
                pipe_gain=pipe_gain,
            ) as wk:
                out[w] = wk.allreduce(grads[w], method=method, block=BLOCK)
                assert wk.local_address[0] == "127.0.0.1"
                st = wk.stats()
                assert st["port"]["tx"] >= st["packets_sent"] > 0
                # The blocking form slept in ppoll: every wake that was not
                # a deadline brought a datagram (or room to send), no spin.
                p = st["port"]
                assert p["waits"] > 0
                assert p["waits"] - p["wait_timeouts"] <= p["rx"] + st["tx_refused"], p
                if stats is not None:
                    stats[w] = st
        except Exception as exc:  # noqa: BLE001 - reported below
            err[w] = exc

    threads = [threading.Thread(target=work, args=(w,)) for w in range(W)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    return out, err


def grads_of(W, n, seed, density=0.5):
    rng = np.random.default_rng(seed)
    g = []
    for _ in range(W):
        x = (rng.standard_normal(n) * 3).astype(np.float32)
        x[rng.random(n) > density] = 0
        g.append(x)
    return g
