"""The exporter's job "" series (what no registered job accounts for) on
readings made by hand: never down while the daemon runs, never above the
true rest, back to the daemon's count after a restart; homagg_up 0 for a
daemon that did not answer."""

from homagg.ops.exporter import Collector
from homagg.ops.source import DaemonSnapshot, JobSnapshot


def reading(total, jobs, up=True):
    s = DaemonSnapshot(
        name="d",
        path="/x",
        t=0.0,
        up=up,
        stats={"summed": total},
        engine_ns=[10],
        engine_busy_ns=[5],
    )
    s.jobs = [
        JobSnapshot(
            job=j,
            workers=1,
            slots=1,
            payload=4,
            incarnation=1,
            shard=0,
            sets_open=0,
            counters={"summed": v},
            worker_counters={"summed": [v]},
        )
        for j, v in jobs.items()
    ]
    return s


def served(col, snap):
    col.snapshots = lambda: [snap]
    out = {}
    for fam in col.collect():
        for x in fam.samples:
            out[(x.name, tuple(sorted(x.labels.items())))] = x.value
    return out


def rest(out):
    return out[("homagg_frames_summed_total", (("daemon", "d"), ("job", "")))]


def test_rest_series_is_monotonic_and_bounded_by_the_truth():
    col = Collector({"d": "/x"})
    # (total read first, jobs read after it, the true rest at the total's reading)
    steps = [
        (10, {7: 7}, 3),  # consistent
        (12, {7: 11}, 3),  # the job read ahead of the total: computed 1
        (15, {}, 15),  # job 7 removed: its frames join the rest
        (2, {}, 2),
    ]  # the daemon restarted
    for total, jobs, truth in steps:
        out = served(col, reading(total, jobs))
        assert rest(out) == truth
        for j, v in jobs.items():
            assert out[("homagg_frames_summed_total", (("daemon", "d"), ("job", str(j))))] == v
    down = served(col, reading(0, {}, up=False))
    assert down[("homagg_up", (("daemon", "d"),))] == 0
    assert [k for k in down if k[0] != "homagg_up"] == []
