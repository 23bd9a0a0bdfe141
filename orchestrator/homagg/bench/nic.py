"""NIC model throughput: frames per second of wall time the fabric simulates.

Scenarios (one core, one thread, virtual time):

- ``unicast``: one port sends to another at 100 Gbit/s, no faults.
- ``faults``: the same with loss 1%, duplication 1%, reordering 5% (bound 8)
  and 1 us jitter on both directions.
- ``incast``: W senders to one receiver, whose frames go back by multicast to
  all W (the aggregator's traffic pattern).

Each frame crosses two links and the switch (two events); the figure
includes building frames in the senders' buffers (memcpy) and copying them
out of the receivers' rx rings.  The baseline in the same run is a memcpy of
the same bytes (what any software path costs at least).
"""

import time

import numpy as np

from homagg.bindings import nic as _nb
from homagg.nic import Fabric, Faults


def add_arguments(parser):
    parser.add_argument("--frames", type=int, default=500_000, help="frames per scenario")
    parser.add_argument("--length", type=int, default=1066, help="frame length in bytes")
    parser.add_argument("--workers", type=int, default=8, help="senders of the incast scenario")
    parser.add_argument("--seed", type=int, default=1)


def _frame(dst, src, length):
    return dst + src + b"\x08\x00" + bytes(length - 14)


class _Sink:
    """Drain a port's rx ring through the C bulk helper into one buffer."""

    def __init__(self, port, n, length):
        self.port = port
        self.cap = n * length
        self.buf, self.lens = _nb.recv_buffers(n, self.cap)
        self.n = n

    def drain(self):
        total = 0
        while True:
            got = _nb.port_recv_frames_into(self.port._p, self.buf, self.cap, self.lens, self.n)
            total += got
            if got < self.n:
                return total


def _pump(fab, senders, sinks, per_sender, length, chunk):
    """Every sender sends per_sender frames in chunks; the clock runs until
    the fabric is idle after each round.  Returns (frames delivered, seconds)."""
    data = {
        s: (_frame(d, s.mac, length) * chunk, np.full(chunk, length, np.uint16)) for s, d in senders
    }
    delivered = 0
    t0 = time.perf_counter()
    sent = 0
    while sent < per_sender:
        k = min(chunk, per_sender - sent)
        for s, _ in senders:
            buf, lens = data[s]
            s.send_packed(buf, lens[:k])
        while True:
            t = fab.next_event()
            if t is None:
                break
            fab.advance_to(t + 1_000_000)
            for sink in sinks:
                delivered += sink.drain()
        sent += k
    return delivered, time.perf_counter() - t0


def _unicast(args, faults):
    fab = Fabric(seed=args.seed, pool_size=16384, trace_hash=False)
    a = fab.add_port("02:00:00:00:00:01", rate_bps=100 * 10**9, prop_delay_ns=500)
    b = fab.add_port("02:00:00:00:00:02", rate_bps=100 * 10**9, prop_delay_ns=500, rx_ring=4096)
    if faults:
        flt = Faults(loss=0.01, dup=0.01, reorder=0.05, reorder_max=8, jitter_ns=1000)
        a.set_faults("out", flt)
        b.set_faults("in", flt)
    sink = _Sink(b, 4096, args.length)
    return _pump(fab, [(a, b.mac)], [sink], args.frames, args.length, 1024)


def _incast(args):
    w = args.workers
    fab = Fabric(seed=args.seed, pool_size=32768, trace_hash=False)
    workers = [
        fab.add_port(f"02:00:00:00:01:{i:02x}", rate_bps=100 * 10**9, rx_ring=4096)
        for i in range(w)
    ]
    agg = fab.add_port("02:00:00:00:00:aa", rate_bps=100 * 10**9, rx_ring=8192)
    group = (239 << 24) | 1
    for p in workers:
        p.join(group)
    gmac = bytes([0x01, 0x00, 0x5E, 0, 0, 1])
    per = max(1, args.frames // (2 * w))
    sinks = [_Sink(p, 4096, args.length) for p in workers] + [_Sink(agg, 8192, args.length)]
    senders = [(p, agg.mac) for p in workers] + [(agg, gmac)]
    # the aggregator sends one multicast result per W uplink frames
    d, s = _pump(fab, senders, sinks, per, args.length, 512)
    return d, s


def _baseline(n, length):
    src = np.zeros(length * 1024, np.uint8)
    dst = np.empty_like(src)
    t0 = time.perf_counter()
    for _ in range(max(1, n // 1024)):
        np.copyto(dst, src)
        np.copyto(src, dst)
    return time.perf_counter() - t0


def main(args):
    print(f"NIC model, {args.length}-byte frames, one core")
    for name, fn in (
        ("unicast", lambda: _unicast(args, False)),
        ("faults", lambda: _unicast(args, True)),
        (f"incast W={args.workers} + multicast", lambda: _incast(args)),
    ):
        delivered, secs = fn()
        print(
            f"  {name:28s} {delivered:9d} frames delivered in {secs:6.3f} s = "
            f"{delivered / secs / 1e6:6.2f} M frames/s"
        )
    base = _baseline(args.frames, args.length)
    print(
        f"  {'baseline: 2 x memcpy':28s} {args.frames:9d} frames in {base:6.3f} s = "
        f"{args.frames / base / 1e6:6.2f} M frames/s"
    )
    return 0
