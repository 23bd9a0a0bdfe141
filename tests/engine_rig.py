"""One aggregation engine on an in-memory port, with job 1 (token 77) added:
frames in, frames out, for the engine tests (test_engine, test_auth)."""
from homagg.engine import FLAG_RESULT, Engine, MemPort, parse_frame


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
