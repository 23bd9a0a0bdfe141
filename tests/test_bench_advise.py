"""``homagg bench advise``: the advisor's predictions next to measured runs.

Run once at a tiny size on two testbeds (100 and 1000 Mbit/s links): it
must give a row for every configuration (link rate, workload, density,
method), each with the prediction ``homagg advise`` makes for it (computed
again here), the measured time from the run path, and the error between
them as defined.  The error itself is never asserted: a report, not a
threshold."""

import csv
import importlib.util
import json
import os

import pytest

from helpers import require

from homagg import cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.root
@pytest.mark.netns
@pytest.mark.slow
def test_bench_advise_rows_for_every_configuration(tmp_path, capsys, monkeypatch):
    require(os.geteuid() == 0, "needs root (network namespaces)")
    require(
        importlib.util.find_spec("torch") is not None,
        "the Gloo baseline needs torch==2.13.0 (make build installs it)",
    )
    # the codec's coefficients the built-in defaults; the port's fitted per testbed
    from homagg import cost

    cal_file = tmp_path / "cal.json"
    cal_file.write_text(
        json.dumps(
            {
                "version": cost.CALIBRATION_VERSION,
                "isa": "portable",
                "paths": {"portable": cost.DEFAULT_COEFFICIENTS},
            }
        )
    )
    monkeypatch.setenv("HOMAGG_CALIBRATION", str(cal_file))
    monkeypatch.delenv("HOMAGG_CODEC_ISA", raising=False)
    name = f"ad{os.getpid() % 100000}"
    out = tmp_path / "adv"
    W, n, seed = 2, 16384, 3
    rc = cli.main(
        [
            "bench",
            "advise",
            "--methods",
            "gloo,lhc",
            "--workloads",
            "shared",
            "--densities",
            "0.05,0.2",
            "--link-mbit",
            "100,1000",
            "--workers",
            str(W),
            "--elements",
            str(n),
            "--repeat",
            "1",
            "--warmup",
            "0",
            "--seed",
            str(seed),
            "--testbed-name",
            name,
            "--state-dir",
            str(tmp_path / "state"),
            "--json",
            "--out",
            str(out),
        ]
    )
    printed = json.loads(capsys.readouterr().out)
    assert rc == 0
    with open(out / "advise.json") as f:
        report = json.load(f)
    assert printed["results"] == report["results"]
    with open(out / "advise.csv") as f:
        assert len(list(csv.DictReader(f))) == len(report["results"])
    with open(out / "advise_predicted_vs_measured.png", "rb") as f:
        assert f.read(8) == PNG_MAGIC
    assert (out / "advise.md").read_text().count("\n|") >= len(report["results"]) + 1

    configs = {
        (L, "shared", d, m) for L in (100.0, 1000.0) for d in (0.05, 0.2) for m in ("gloo", "lhc")
    }
    rows = report["results"]
    assert len(configs) >= 8 and report["configurations"] == len(rows) == len(configs)
    assert {(r["link_mbit"], r["workload"], r["density"], r["method"]) for r in rows} == configs

    from homagg.ops import advise as adv

    # each case calibrated through the testbed's port first (the default,
    # --calibrate-every case); its jobs registered that, with the built-in
    # codec coefficients, shared by W ranks and a daemon
    ports = {(p["link_mbit"], p["case"]): p for p in report["port_calibrations"]}
    assert set(ports) == {(L, f"shared {d:g}") for L in (100.0, 1000.0) for d in (0.05, 0.2)}
    factor = cost.sharing(W + 1, cost.host_cores())
    for (L, _), p in ports.items():
        assert (p["workers"], p["processes"], p["sharing"]) == (W, W + 1, float(factor))
        fit = cost.fit_port(p["runs"], workers=W, payload_bytes=1024, link_mbit=L, factor=factor)
        assert {k: fit[k] for k in cost.PORT_FIELDS} == p["coefficients"]
        # and the ring's CPU, from the Gloo runs it timed on the same path
        ring = cost.fit_ring(p["ring"]["runs"], workers=W, link_mbit=L)
        assert {k: p["ring"][k] for k in cost.RING_FIELDS} == ring
    assert set(cost.load_calibration(str(cal_file))["ports"]) == {name}  # the last one's

    for L, wl, d in {(r["link_mbit"], r["workload"], r["density"]) for r in rows}:
        port = ports[(L, f"{wl} {d:g}")]
        co = port["coefficients"]
        coeffs = cost.shared(
            {**cost.DEFAULT_COEFFICIENTS, "pkt_ps": co["pkt_ps"], "agg_pkt_ps": co["agg_pkt_ps"]},
            factor,
        )
        # the ring's as measured (not scaled): Gloo's prediction charges them
        coeffs.update({k: port["ring"][k] for k in cost.RING_FIELDS})
        a = adv.advise(W, n, d, L, wl, seed=seed, rtt_ns=co["rtt_ns"], coeffs=coeffs)
        gloo, lhc = (
            next(
                r
                for r in rows
                if (r["link_mbit"], r["workload"], r["density"], r["method"]) == (L, wl, d, m)
            )
            for m in ("gloo", "lhc")
        )
        assert gloo["predicted_s"] == pytest.approx(a["ring"]["time_s"], rel=1e-12)
        assert lhc["predicted_s"] == pytest.approx(a["methods"]["lhc"]["time_s"], rel=1e-12)
        assert lhc["predicted_binds"] == a["methods"]["lhc"]["binds"]
        assert lhc["predicted_payload_bytes_per_worker"] == a["methods"]["lhc"]["bytes_per_worker"]
        assert lhc["predicted_speedup_vs_gloo"] == pytest.approx(
            a["ring"]["time_s"] / a["methods"]["lhc"]["time_s"], rel=1e-12
        )
        assert "calibrated through its port" in lhc["coefficients_from"]
        for r in (gloo, lhc):
            assert r["status"] == "ok", r["status"]
            assert r["measured_s"] > 0 and r["measured_bytes_per_worker"] > 0
            assert r["error"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1, rel=1e-12)
            assert r["within_target"] == (abs(r["error"]) <= 0.25)
            assert r["bytes_ratio"] == pytest.approx(
                r["measured_bytes_per_worker"] / r["predicted_payload_bytes_per_worker"], rel=1e-12
            )
            assert isinstance(r["cpu_bound"], bool)
        assert lhc["exact"] is True
        assert lhc["measured_speedup_vs_gloo"] == pytest.approx(
            gloo["measured_s"] / lhc["measured_s"], rel=1e-12
        )
    assert report["measured"] == len(rows)
    assert report["within_target"] == sum(r["within_target"] for r in rows)
    assert report["cpu_bound"] == sum(r["cpu_bound"] for r in rows)
    assert report["within_target_not_cpu_bound"] == sum(
        r["within_target"] for r in rows if not r["cpu_bound"]
    )
    from homagg.deploy.local.testbed import Testbed

    assert name not in Testbed.list(str(tmp_path / "state"))


def test_bench_advise_refuses_a_bad_method_before_anything_starts(capsys, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # the check comes before the root check
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "advise", "--methods", "gloo,ring"])
    assert "--methods ring" in str(e.value)


def test_bench_advise_needs_root(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    rc = cli.main(["bench", "advise", "--methods", "gloo", "--workers", "2"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "root" in err and len(err.strip().splitlines()) == 1
