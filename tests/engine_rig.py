"""One aggregation engine on an in-memory port, with job 1 (token 77) added:
frames in, frames out, for the engine tests (test_engine, test_auth,
test_ops_engine); and worker w's frames to it."""

from homagg.engine import (
    FLAG_RESULT,
    FLAG_SHADOW,
    UDP_PORT,
    Addr,
    Engine,
    MemPort,
    build_frame,
    parse_frame,
)

AGG = Addr.of("02:00:00:00:00:01", "10.0.0.254", UDP_PORT)


def waddr(w):
    """Worker w's MAC, IPv4 address and UDP port."""
    return Addr.of(bytes([2, 0, 0, 1, w >> 8, w & 0xFF]), (10 << 24) | (1 << 16) | w, 40000 + w)


def frame(w, *, op="sum32", job=1, token=77, seq=0, slots=4, payload=b"", flags=0, slot=None, **kw):
    """Worker w's frame of chunk seq to AGG (slot seq % slots, the shadow
    flag of its half unless slot is given)."""
    if slot is None:
        slot = seq % slots
    if (seq // slots) % 2:
        flags |= FLAG_SHADOW
    return build_frame(
        waddr(w),
        AGG,
        op=op,
        job=job,
        token=token,
        worker=w,
        seq=seq,
        slot=slot,
        flags=flags,
        payload=payload,
        **kw,
    )


class EngineRig:
    def __init__(self, *, replicate=False, isa="best", port_kw=None, **job):
        self.port = MemPort(can_replicate=replicate, **(port_kw or {}))
        self.eng = Engine(self.port, isa=isa)
        self.eng.add_job(job=1, token=77, **job)
        self.pool = self.port.free_count

    def send(self, *frames):
        """Inject the frames, poll the engine, return what it sent, parsed."""
        for f in frames:
            self.port.inject(f)
        self.eng.poll_all()
        return [parse_frame(f) for f in self.port.pop_all()]

    def results(self, out):
        return [f for f in out if not isinstance(f, str) and f.flags & FLAG_RESULT]

    def no_leak(self):
        assert self.port.free_count == self.pool
