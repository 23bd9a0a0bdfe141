"""The engine's per-worker counters and open sets (what `job_stats`, the
exporter and `homagg top` report per worker), against a hand-counted
sequence of frames."""

import errno

import numpy as np
import pytest

from homagg.engine import FLAG_RETRANS
from homagg.errors import HomAggError, OutOfRange

from engine_rig import EngineRig, frame
from helpers import be32

pytestmark = pytest.mark.sanitize


def test_worker_counters_and_open_sets():
    rig = EngineRig(workers=3, slots=4)
    pay = be32(np.arange(64))
    assert rig.eng.job_open_sets(1) == 0
    rig.send(frame(0, seq=0, payload=pay), frame(0, seq=0, payload=pay))  # w0: 1 dup
    assert rig.eng.job_open_sets(1) == 1
    rig.send(frame(1, seq=0, payload=pay, flags=FLAG_RETRANS))  # w1: retrans, summed
    rig.send(frame(1, seq=0, payload=pay))  # w1: dup
    rig.send(frame(2, seq=0, payload=pay))  # complete
    assert rig.eng.job_open_sets(1) == 0
    rig.send(frame(0, seq=1, payload=pay), frame(0, seq=8, payload=pay))  # two open sets
    assert rig.eng.job_open_sets(1) == 2
    rig.send(frame(1, seq=0, payload=pay))  # w1: stale (set holds 8)
    want = {
        0: dict(summed=3, duplicates=1, retransmissions=0, dropped=0),
        1: dict(summed=1, duplicates=1, retransmissions=1, dropped=1),
        2: dict(summed=1, duplicates=0, retransmissions=0, dropped=0),
    }
    for w, c in want.items():
        assert rig.eng.worker_counters(1, w) == c
    job = rig.eng.job_counters(1)
    assert job["summed"] == sum(c["summed"] for c in want.values())
    assert job["duplicates"] == sum(c["duplicates"] for c in want.values())
    assert job["stale"] == 1
    with pytest.raises(OutOfRange):
        rig.eng.worker_counters(1, 3)
    with pytest.raises(HomAggError) as e:
        rig.eng.worker_counters(2, 0)
    assert e.value.code == -errno.ENOENT
    with pytest.raises(HomAggError) as e:
        rig.eng.job_open_sets(2)
    assert e.value.code == -errno.ENOENT
    rig.no_leak()
