"""The cost model on a testbed (docs/PROTOCOL.md "The cost model", "Shared
cores" and "Calibration through the port"): the fit of the per-frame costs
and the round trip gives back the coefficients of runs the model itself
produced, the sharing of a host's cores scales every CPU coefficient of a
testbed's job, a bad "ports" entry is named, and on a real testbed
`homagg calibrate --testbed` writes a well-formed entry that the testbed's
jobs then register."""

import json
import os
from fractions import Fraction

import pytest

from helpers import require
from homagg import cost
from homagg.errors import InvalidArgument

CODEC = {
    "pkt_ps": 2_000_000,
    "agg_pkt_ps": 150_000,
    "value_ps": 1_000,
    "lane_ps": 7_000,
    "bitmap_ps": 400,
    "probe_ps": 2_100,
    "sbbf_ps": 7_200,
}


# a port calibration of 4 workers and a daemon on 2 cores
PORT_ENTRY = {
    "workers": 4,
    "processes": 5,
    "cores": 2,
    "coefficients": {"pkt_ps": 4_398_373, "agg_pkt_ps": 946_239, "rtt_ns": 481_452},
}


def _calibration(ports=None):
    cal = {"version": cost.CALIBRATION_VERSION, "isa": "portable", "paths": {"portable": CODEC}}
    if ports is not None:
        cal["ports"] = ports
    return cal


def _synthetic(pkt, agg, rtt_ns, *, W, factor, link, P=1024):
    """Runs as the model of homagg.cost.fit_port describes them, with the
    CPU each process would report: a worker its elements and pkt per chunk,
    the daemon W * agg per chunk (a core each)."""
    f = Fraction(factor)
    runs = []
    # (payload bytes per worker, steps, element CPU ps): two dense sizes, a union
    for nbytes, steps, elem in (
        (266_240, 2, 65_536_000),
        (1_064_960, 2, 262_144_000),
        (270_000, 4, 140_000_000),
    ):
        chunks = Fraction(nbytes, P)
        ps = (
            nbytes * Fraction(8 * 10**6, link) * (1 + Fraction(98) / P)
            + f * elem
            + chunks * f * (pkt + W * agg)
            + steps * 1000 * rtt_ns
        )
        runs.append(
            {
                "seconds": float(ps / 10**12),
                "bytes": nbytes,
                "steps": steps,
                "elem_ps": elem,
                "worker_cpu_s": float((elem + chunks * pkt) / 10**12),
                "daemon_cpu_s": float(chunks * W * agg / 10**12),
            }
        )
    return runs


@pytest.mark.parametrize(
    "pkt,agg,rtt_ns,W,factor,link",
    [
        (4_300_000, 950_000, 480_000, 4, Fraction(5, 2), 1000),
        (2_000_000, 150_000, 100_000, 2, 1, 10000),
        (7_123_457, 1_234_567, 2_345_678, 8, Fraction(9, 2), 100),
    ],
)
def test_fit_gives_back_the_coefficients_of_model_made_runs(pkt, agg, rtt_ns, W, factor, link):
    runs = _synthetic(pkt, agg, rtt_ns, W=W, factor=factor, link=link)
    fit = cost.fit_port(runs, workers=W, payload_bytes=1024, link_mbit=link, factor=factor)
    assert (fit["pkt_ps"], fit["agg_pkt_ps"], fit["rtt_ns"]) == (pkt, agg, rtt_ns)
    assert fit["worker_share"] == pytest.approx(pkt / (pkt + W * agg), rel=1e-9)


def test_fit_never_gives_a_negative_round_trip():
    # runs that shrink with their steps: the round trip is 0, F fitted alone
    runs = _synthetic(3_000_000, 500_000, 0, W=4, factor=2, link=1000)
    runs[2]["seconds"] *= 0.5
    fit = cost.fit_port(runs, workers=4, payload_bytes=1024, link_mbit=1000, factor=2)
    assert fit["rtt_ns"] == 0 and fit["pkt_ps"] > 0 and fit["agg_pkt_ps"] > 0
    with pytest.raises(InvalidArgument, match="at least two runs"):
        cost.fit_port(runs[:1], workers=4, payload_bytes=1024, link_mbit=1000)


def test_sharing_scales_every_cpu_coefficient():
    assert cost.sharing(5, 2) == Fraction(5, 2)
    assert cost.sharing(3, 4) == 1  # a core each: nothing to scale
    with pytest.raises(InvalidArgument, match="sharing"):
        cost.sharing(0, 2)
    assert cost.shared(CODEC, Fraction(5, 2)) == {
        "pkt_ps": 5_000_000,
        "agg_pkt_ps": 375_000,
        "value_ps": 2_500,
        "lane_ps": 17_500,
        "bitmap_ps": 1_000,
        "probe_ps": 5_250,
        "sbbf_ps": 18_000,
    }
    assert cost.shared({**CODEC, "value_ps": 999_999}, 3)["value_ps"] == cost.MAX_ELEM_PS
    job = cost.job_cost(1000, 50_000, coeffs=CODEC, sharing=Fraction(3, 2))
    assert (job.pkt_ps, job.value_ps, job.rtt_ns) == (3_000_000, 1_500, 50_000)
    assert cost.job_cost(1000, coeffs=CODEC) == cost.Cost(link_mbit=1000, rtt_ns=100_000, **CODEC)


class _Testbed:
    """What testbed_job.job_cost reads of a testbed."""

    def __init__(self, name, workers, aggregators=1, link=1000):
        self.name = name
        self.workers = [f"w{i}" for i in range(workers)]
        self.aggregators = [f"agg{i}" for i in range(aggregators)]
        self._link = link

    def state(self):
        return {"link_mbit": self._link}


def test_a_testbed_job_registers_its_port_calibration_shared(tmp_path, monkeypatch):
    from homagg.deploy.local import testbed_job

    entry = PORT_ENTRY
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(_calibration({"tb1": entry})))
    monkeypatch.setenv(cost.CALIBRATION_ENV, str(path))
    monkeypatch.delenv("HOMAGG_CODEC_ISA", raising=False)
    monkeypatch.setattr(cost, "host_cores", lambda: 2)
    job = testbed_job.job_cost(_Testbed("tb1", 4))
    want = cost.shared({**CODEC, "pkt_ps": 4_398_373, "agg_pkt_ps": 946_239}, Fraction(5, 2))
    assert {k: getattr(job, k) for k in cost.COEFFICIENTS} == want
    assert (job.link_mbit, job.rtt_ns) == (1000, 481_452)
    # another testbed, or this one with other workers: the codec's, shared
    for tb, factor in ((_Testbed("tb2", 4), Fraction(5, 2)), (_Testbed("tb1", 2), Fraction(3, 2))):
        job = testbed_job.job_cost(tb)
        assert {k: getattr(job, k) for k in cost.COEFFICIENTS} == cost.shared(CODEC, factor)
        assert job.rtt_ns == cost.DEFAULT_RTT_NS
    # a core each: nothing scaled
    monkeypatch.setattr(cost, "host_cores", lambda: 64)
    job = testbed_job.job_cost(_Testbed("tb2", 4))
    assert {k: getattr(job, k) for k in cost.COEFFICIENTS} == CODEC
    assert testbed_job.job_cost(_Testbed("tb1", 4), cost_model=False) == cost.Cost()
    assert job.ring() == {"ring_byte_ps": 0, "ring_step_ns": 0}  # none calibrated
    # with the ring's calibration: its coefficients as measured (not scaled)
    ring = {"ring_byte_ps": 6_250, "ring_step_ns": 180_000, "runs": []}
    path.write_text(json.dumps(_calibration({"tb1": {**entry, "ring": ring}})))
    monkeypatch.setattr(cost, "host_cores", lambda: 2)
    job = testbed_job.job_cost(_Testbed("tb1", 4))
    assert {k: getattr(job, k) for k in cost.COEFFICIENTS} == want
    assert job.ring() == {"ring_byte_ps": 6_250, "ring_step_ns": 180_000}
    assert job.to_dict() == {**job.fields(), **job.ring()}
    # another number of workers: no port calibration, so no ring either
    assert testbed_job.job_cost(_Testbed("tb1", 2)).ring() == {
        "ring_byte_ps": 0,
        "ring_step_ns": 0,
    }


def test_a_training_run_on_an_uncalibrated_testbed_is_told_how_to_calibrate_it(
    tmp_path, monkeypatch
):
    # `homagg train --testbed NAME` prints this line when the job's model
    # has no calibration through the testbed's port (with as many workers)
    from homagg.deploy.local import testbed_job
    from homagg.deploy.local.placement import TestbedPlacement

    entry = PORT_ENTRY
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(_calibration({"tb1": entry})))
    monkeypatch.setenv(cost.CALIBRATION_ENV, str(path))
    assert testbed_job.port_calibrated(_Testbed("tb1", 4)) is True
    assert testbed_job.port_calibrated(_Testbed("tb1", 2)) is False  # other workers
    assert testbed_job.port_calibrated(_Testbed("tb2", 4)) is False
    assert testbed_job.port_calibrated(_Testbed("tb2", 4, link=None)) is None  # unshaped
    pl = object.__new__(TestbedPlacement)
    pl.tb = _Testbed("tb2", 4)
    hint = pl.cost_hint()
    assert "testbed tb2 is not calibrated through its port" in hint, hint
    assert "`homagg calibrate --testbed tb2`" in hint, hint
    assert pl.cost_hint(cost_model=False) is None  # no model: nothing to calibrate
    pl.tb = _Testbed("tb1", 4)
    assert pl.cost_hint() is None
    pl.tb = _Testbed("tb2", 4, link=None)
    assert pl.cost_hint() is None


def _ring_runs(byte_ps, step_ns, *, W, link, sizes=(1 << 17, 1 << 20, 3_000_001)):
    """Ring all-reduces as fit_ring's model describes them, computed here
    from its terms: ceil(2 (W-1) 4n / W) bytes a rank at the link rate plus
    byte_ps each, 2 (W-1) steps of step_ns each."""
    runs = []
    for n in sizes:
        B = -(-2 * (W - 1) * 4 * n // W)
        ps = B * (8 * 10**6 // link + byte_ps) + 2 * (W - 1) * 1000 * step_ns
        runs.append({"elements": n, "seconds": ps / 1e12})
    return runs


@pytest.mark.parametrize(
    "byte_ps,step_ns,rtt_ns,W,link",
    [
        (6_250, 180_000, 480_000, 2, 10000),
        (1_337, 1, 100_000, 4, 1000),
        (0, 2_500_000, 2_345_678, 8, 100),
        (54_321, 3, 0, 3, 25000),
    ],
)
def test_ring_fit_gives_back_the_coefficients_of_model_made_runs(byte_ps, step_ns, rtt_ns, W, link):
    runs = _ring_runs(byte_ps, step_ns, W=W, link=link)
    for two in (runs[:2], runs):
        fit = cost.fit_ring(two, workers=W, link_mbit=link)
        assert fit == {"ring_byte_ps": byte_ps, "ring_step_ns": step_ns}
    # and ring_ps charges them (a step in place of half the job's round
    # trip): the runs' own times back, to the picosecond
    c = cost.Cost(link_mbit=link, rtt_ns=rtt_ns, ring_byte_ps=byte_ps, ring_step_ns=step_ns)
    for r in runs:
        assert cost.ring_ps(c, W, r["elements"]) == round(r["seconds"] * 1e12)


def test_ring_fit_is_never_negative_and_needs_two_sizes():
    # runs faster than the link alone: no CPU, not less, and a step of the
    # least that still says "calibrated" (1 ns; 0 is half the round trip)
    runs = _ring_runs(0, 0, W=2, link=10000)
    for r in runs:
        r["seconds"] *= 0.5
    assert cost.fit_ring(runs, workers=2, link_mbit=10000) == {
        "ring_byte_ps": 0,
        "ring_step_ns": 1,
    }
    # a larger run no slower than a smaller one: the per-byte cost 0, the
    # steps fitted alone
    runs = _ring_runs(1000, 5_000_000, W=2, link=10000)[:2]
    runs[1]["seconds"] = runs[0]["seconds"]
    fit = cost.fit_ring(runs, workers=2, link_mbit=10000)
    assert fit["ring_byte_ps"] == 0 and fit["ring_step_ns"] > 1
    with pytest.raises(InvalidArgument, match="two runs of different sizes"):
        cost.fit_ring(runs[:1] * 2, workers=2, link_mbit=10000)


def test_a_job_file_carries_the_ring_coefficients(tmp_path):
    from homagg.switch import job_file

    c = cost.Cost(link_mbit=10000, rtt_ns=480_000, **CODEC, ring_byte_ps=6_250, ring_step_ns=7)
    # struct hg_cost never sees them; the job file does
    assert set(c.fields()) & set(cost.RING_FIELDS) == set()
    assert c.to_dict() == {**c.fields(), "ring_byte_ps": 6_250, "ring_step_ns": 7}
    jf = job_file.write_job_file(
        str(tmp_path / "job.json"), aggregator="10.0.0.1", job=1, token=2, cost=c.to_dict()
    )
    got = job_file.job_config({"HOMAGG_JOB_FILE": jf})["cost"]
    assert got == c.to_dict() and cost.as_cost(got) == c
    # a job without them reads and writes as before
    plain = cost.Cost(link_mbit=10000, rtt_ns=480_000, **CODEC)
    assert plain.to_dict() == plain.fields()
    for bad, field in (
        ({"ring_byte_ps": -1}, "cost.ring_byte_ps"),
        ({"ring_byte_ps": cost.MAX_ELEM_PS + 1}, "cost.ring_byte_ps"),
        ({"ring_step_ns": 2**32}, "cost.ring_step_ns"),
    ):
        env = {"HOMAGG_JOB_FILE": jf, "HOMAGG_COST": json.dumps({**c.to_dict(), **bad})}
        with pytest.raises(job_file.ConfigError, match=field):
            job_file.job_config(env)
    with pytest.raises(InvalidArgument, match="cost.ring_step_ns: 4294967296 is outside"):
        cost.Cost(link_mbit=1, ring_step_ns=2**32)
    with pytest.raises(InvalidArgument, match="cost.ring_byte_ps: expected an integer"):
        cost.Cost(link_mbit=1, ring_byte_ps=1.5)
    os.unlink(jf)


def test_the_ring_coefficients_move_the_choice_of_path():
    """W = 2, link 10 Gbit/s (800 ps a byte), rtt 100 us, the codec's
    CODEC coefficients, method dense, n = 4096 k elements (k blocks).
    HomAgg's bound by hand: xb = 800 + (2_000_000 + 2 * 150_000 + 98 * 800)
    // 1024 = 800 + 2322 = 3122 ps a byte; (k + 4 * 4096 k) * 3122 + 4096 k
    * 1000 + 2 * 10^8 = 55_249_970 k + 200_000_000.  The ring without its
    CPU: 16384 k * 800 + 2 * 500 * 100_000 = 13_107_200 k +
    100_000_000 (two steps of half a round trip), below HomAgg's for every
    k.  With ring_byte_ps 3000 and ring_step_ns 20_000 (a step in place of
    half the round trip): 16384 k * 3800 + 2 * 2 * 10^7 = 62_259_200 k +
    40_000_000, below HomAgg's while 7_009_230 k < 160_000_000, i.e. up to
    k = 22."""
    base = cost.Cost(link_mbit=10000, rtt_ns=100_000, **CODEC)
    ring = cost.Cost(
        link_mbit=10000, rtt_ns=100_000, **CODEC, ring_byte_ps=3000, ring_step_ns=20_000
    )
    for k in (1, 22, 23, 1000):
        n = 4096 * k
        h = 55_249_970 * k + 200_000_000
        plain = cost.choose_path(base, 2, n, None, "dense")
        assert plain == {
            "path": "baseline",
            "homagg_ps": h,
            "baseline_ps": 13_107_200 * k + 100_000_000,
        }
        got = cost.choose_path(ring, 2, n, None, "dense")
        assert got == {
            "path": "baseline" if k <= 22 else "homagg",
            "homagg_ps": h,
            "baseline_ps": 62_259_200 * k + 40_000_000,
        }


def test_machine_cpu_per_call_is_the_busy_share_of_every_core():
    from homagg.bench.calibrate import machine_cpu_per_call

    # 2 cores, half busy, over calls of 10 and 30 ms: 20 ms of CPU a call
    busy = {"busy": 0.5, "softirq": 0.1, "cores": 2}
    assert machine_cpu_per_call(busy, [0.010, 0.030]) == pytest.approx(0.020)
    assert machine_cpu_per_call({**busy, "busy": 0.0}, [0.010]) == 0
    assert machine_cpu_per_call(None, [0.010]) is None  # /proc could not tell
    assert machine_cpu_per_call(busy, []) is None


def test_a_bad_port_entry_is_named(tmp_path):
    good = {
        "workers": 4,
        "processes": 5,
        "cores": 2,
        "coefficients": {"pkt_ps": 1, "agg_pkt_ps": 2, "rtt_ns": 3},
    }
    cost.check_calibration(_calibration({"tb": good}))
    for bad, field in (
        ({**good, "cores": 0}, "ports.tb.cores"),
        (
            {**good, "coefficients": {"pkt_ps": 1, "agg_pkt_ps": -2, "rtt_ns": 3}},
            "ports.tb.coefficients.agg_pkt_ps",
        ),
        ({**good, "coefficients": {"pkt_ps": 1, "agg_pkt_ps": 2}}, "ports.tb.coefficients.rtt_ns"),
        ({**good, "ring": {"ring_byte_ps": 1}}, "ports.tb.ring.ring_step_ns"),
        ({**good, "ring": {"ring_byte_ps": -1, "ring_step_ns": 0}}, "ports.tb.ring.ring_byte_ps"),
        ({**good, "ring": [1, 2]}, "ports.tb.ring"),
    ):
        p = tmp_path / "bad.json"
        p.write_text(json.dumps(_calibration({"tb": bad})))
        with pytest.raises(InvalidArgument, match=field.replace(".", r"\.")):
            cost.load_calibration(str(p))
    with pytest.raises(InvalidArgument, match="'ports' must be an object"):
        cost.check_calibration({**_calibration(), "ports": [good]})


@pytest.mark.root
@pytest.mark.netns
@pytest.mark.slow
def test_calibrate_testbed_writes_an_entry_its_jobs_register(tmp_path, monkeypatch, capsys):
    from homagg import cli
    from homagg.bench import calibrate
    from homagg.deploy.local import testbed_job
    from homagg.deploy.local.testbed import Testbed
    from homagg.ops import advise as adv

    require(os.geteuid() == 0, "needs root (network namespaces)")
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(_calibration()))
    monkeypatch.setenv(cost.CALIBRATION_ENV, str(path))
    monkeypatch.delenv("HOMAGG_CODEC_ISA", raising=False)
    name = f"pc{os.getpid() % 100000}"
    state = str(tmp_path / "state")
    W = 2
    tb = Testbed.up(name, W, link_mbit=1000, state_dir=state)
    try:
        testbed_job.start(tb)  # its standing job, as `homagg testbed up` registers it
        before = testbed_job.job(tb)["cost"]
        assert before == testbed_job.job_cost(tb).fields()  # the codec's, shared
        rc = cli.main(["calibrate", "--testbed", name, "--state-dir", state, "--json"])
        printed = json.loads(capsys.readouterr().out)
        assert rc == 0
        cal = cost.load_calibration(str(path))  # well formed, or it raises
        assert cal["paths"] == {"portable": CODEC}  # the codec's kept
        entry = cal["ports"][name]
        assert printed["file"] == str(path) and printed["coefficients"] == entry["coefficients"]
        assert (entry["workers"], entry["processes"], entry["cores"]) == (
            W,
            W + 1,
            cost.host_cores(),
        )
        factor = cost.sharing(W + 1, cost.host_cores())
        assert entry["sharing"] == float(factor) and entry["link_mbit"] == 1000
        runs = entry["runs"]
        assert [(r["method"], r["elements"], r["density"]) for r in runs] == list(
            calibrate.PORT_RUNS
        )
        # the fit is the one of the runs recorded
        fit = cost.fit_port(runs, workers=W, payload_bytes=1024, link_mbit=1000, factor=factor)
        assert {k: fit[k] for k in cost.PORT_FIELDS} == entry["coefficients"]
        # the jobs of the testbed register it, shared; its runs' predictions are advise's
        job = testbed_job.job_cost(Testbed.open(name, state))
        want = cost.shared(
            {
                **CODEC,
                "pkt_ps": entry["coefficients"]["pkt_ps"],
                "agg_pkt_ps": entry["coefficients"]["agg_pkt_ps"],
            },
            factor,
        )
        assert {k: getattr(job, k) for k in cost.COEFFICIENTS} == want
        assert job.rtt_ns == entry["coefficients"]["rtt_ns"]
        # the standing job's file now holds it too (the daemons keep no cost)
        assert printed["job_file"] == testbed_job.job(tb)["file"]
        assert testbed_job.job(tb)["cost"] == job.to_dict() != before
        # the ring all-reduce timed through the same path, its CPU fitted
        ring = entry["ring"]
        assert [r["elements"] for r in ring["runs"]] == list(calibrate.RING_RUNS)
        assert all(r["seconds"] > 0 for r in ring["runs"])
        assert {k: ring[k] for k in cost.RING_FIELDS} == cost.fit_ring(
            ring["runs"], workers=W, link_mbit=1000
        )
        assert printed["ring"] == ring
        assert job.ring() == {k: ring[k] for k in cost.RING_FIELDS}  # as measured
        for r in ring["runs"]:
            assert r["predicted_s"] == cost.ring_ps(job, W, r["elements"]) / 1e12
        # each path's CPU over the whole machine, per call (from /proc/stat)
        for r in ring["runs"] + runs:
            assert r["machine_cpu_s"] is not None and r["machine_cpu_s"] >= 0, r
        for r in runs:
            assert r["seconds"] > 0 and r["bytes"] > 0 and r["daemon_cpu_s"] >= 0
            a = adv.advise(
                W,
                r["elements"],
                r["density"],
                1000,
                "random",
                rtt_ns=job.rtt_ns,
                coeffs=want,
                methods=(r["method"],),
            )
            assert r["predicted_s"] == pytest.approx(a["methods"][r["method"]]["time_s"], rel=1e-12)
    finally:
        Testbed.down(name, state_dir=state)


def test_advise_for_a_testbed_predicts_with_its_jobs_coefficients(tmp_path, monkeypatch, capsys):
    from homagg import cli
    from homagg.ops import advise as adv

    entry = PORT_ENTRY
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(_calibration({"tb1": entry})))
    monkeypatch.setenv(cost.CALIBRATION_ENV, str(path))
    monkeypatch.delenv("HOMAGG_CODEC_ISA", raising=False)
    argv = ["advise", "--workers", "4", "--elements", "65536", "--density", "0.05"]
    argv += ["--link-mbit", "1000", "--json", "--testbed", "tb1"]
    assert cli.main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    coeffs = cost.shared({**CODEC, "pkt_ps": 4_398_373, "agg_pkt_ps": 946_239}, Fraction(5, 2))
    want = adv.advise(4, 65536, 0.05, 1000, "shared", rtt_ns=481_452, coeffs=coeffs)
    assert got["coefficients"] == coeffs and got["rtt_ns"] == 481_452
    assert {m: r["time_s"] for m, r in got["methods"].items()} == {
        m: r["time_s"] for m, r in want["methods"].items()
    }
    assert "testbed tb1" in got["coefficients_from"] and "sharing 2.5" in got["coefficients_from"]
    # no ring calibrated: the ring is the link and its round trips alone
    # (W = 4: 6 steps, 2 * 3/4 * 4 * 65536 = 393216 bytes a rank)
    assert got["ring_coefficients"] == {"ring_byte_ps": 0, "ring_step_ns": 0}
    assert got["ring"]["time_s"] == pytest.approx((393216 * 8000 + 6 * 240_726_000) / 1e12)
    # with it: its CPU per byte on top and its step in place of half the
    # round trip, as measured (not scaled)
    ring = {"ring_byte_ps": 6_250, "ring_step_ns": 180_000, "runs": []}
    path.write_text(json.dumps(_calibration({"tb1": {**entry, "ring": ring}})))
    assert cli.main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["ring_coefficients"] == {"ring_byte_ps": 6_250, "ring_step_ns": 180_000}
    assert got["ring"]["time_s"] == pytest.approx(
        (393216 * (8000 + 6_250) + 6 * 180_000_000) / 1e12
    )
    assert got["ring"]["terms"]["worker_cpu"] == pytest.approx(393216 * 6_250 / 1e12)
    assert {m: r["time_s"] for m, r in got["methods"].items()} == {
        m: r["time_s"] for m, r in want["methods"].items()
    }  # HomAgg's own predictions do not change
    assert cli.main([a for a in argv if a != "--json"]) == 0  # the text names them
    assert "ring's CPU (the port's calibration): 6250 ps a byte, 180 us a step" in (
        capsys.readouterr().out
    )
    # --rtt-us still wins
    assert cli.main(argv + ["--rtt-us", "50"]) == 0
    assert json.loads(capsys.readouterr().out)["rtt_ns"] == 50_000
    # not calibrated, or with other workers: one line naming the option and the fix
    assert cli.main(argv[:-1] + ["tb2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--testbed tb2" in err and "homagg calibrate --testbed tb2" in err
    assert len(err.splitlines()) == 1
    assert cli.main(["advise", "--workers", "2"] + argv[3:]) == 2
    assert "give --workers 4" in capsys.readouterr().err
