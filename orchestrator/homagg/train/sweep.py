"""Training at several link rates: `homagg train --link-mbit 100,1000,10000`.

    sudo homagg train --link-mbit 100,1000,10000 --model ncf,lstm --steps 5 --out DIR
    sudo homagg train --link-mbit 1000 --mtu 9000 --model lstm      # jumbo frames

builds one local testbed per link rate (homagg.deploy.local.testbed, W
worker namespaces on tc-shaped links of that rate, named --testbed-name),
runs ``homagg train`` there for every model (Gloo DDP, then DDP with the
HomAgg hook: homagg.train.train.run_train, with its checks), takes the
testbed down, and reports per (rate, model) the speedup over Gloo DDP, the
two iteration times, the path each bucket took (homagg, or baseline: the
process group's allreduce chosen by the cost model, homagg.torch) and the
checks.  ``--out DIR`` writes train_sweep.json, train_sweep.md and
train_linkrate.png (speedup vs link rate, one line per model), as
``homagg bench allreduce`` does for the allreduce alone.

Each testbed is calibrated through its port first, as ``homagg calibrate
--testbed`` does (homagg.bench.calibrate.calibrate_port: HomAgg's per-frame
costs and round trip and the ring all-reduce's CPU, timed on that testbed at
that rate, about half a minute), so that each bucket's choice between HomAgg
and the process group's allreduce predicts with this host's figures rather
than the built-in ones, which miss the testbed's kernel path (at 10 Gbit/s
they put Gloo's ring at a fifth of its measured time).  The calibration goes
into a file of the sweep's own (``--out DIR``'s calibration-RATEmbit.json, else a
temporary one), never the host's calibration file; ``--no-calibrate`` keeps
this host's calibration (or the built-in figures) at every rate.

The testbeds share the machine with whatever else runs: every speedup is
the ratio of two phases measured one after the other in the same run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile

from homagg.errors import TrainError


def parse_rates(text: str) -> list[float]:
    """ "100,1000,10000" -> [100.0, 1000.0, 10000.0]; TrainError naming the flag."""
    try:
        rates = [float(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        rates = []
    if not rates or any(not r >= 1 for r in rates):
        raise TrainError(
            f"--link-mbit {text!r}: expected comma-separated link rates in "
            "Mbit/s, each at least 1, e.g. 100,1000,10000"
        )
    return list(dict.fromkeys(rates))


def parse_models(text: str) -> list[str]:
    """ "ncf,lstm" -> ["ncf", "lstm"] (a model file path:factory has no comma)."""
    models = [m.strip() for m in str(text).split(",") if m.strip()]
    if not models:
        raise TrainError(f"--model {text!r}: name at least one model")
    return list(dict.fromkeys(models))


def run_sweep(
    models,
    link_rates,
    *,
    workers: int = 4,
    testbed_name: str = "trainsweep",
    mtu: int = 1500,
    state_dir: str | None = None,
    out_dir: str | None = None,
    calibrate: bool = True,
    **train_kw,
) -> dict:
    """Every model at every link rate (module doc); returns the report."""
    from homagg.bench import calibrate as cal_mod
    from homagg.bench import report as bench_report
    from homagg.bindings.codec import codec_isa
    from homagg.deploy.local.testbed import require_root
    from homagg.train import train as trainmod

    if train_kw.get("method") == "gloo":
        raise TrainError(
            "--link-mbit with --method gloo: a sweep compares HomAgg with Gloo; "
            "choose a HomAgg method (default auto)"
        )
    if not train_kw.get("baseline", True):
        raise TrainError(
            "--link-mbit with --no-baseline: the sweep reports the speedup "
            "over Gloo DDP, which needs the baseline phase"
        )
    if workers < 2:
        raise TrainError(f"--workers {workers}: a sweep needs at least 2 ranks")
    if not 576 <= int(mtu) <= 9000:
        raise TrainError(f"--mtu {mtu}: 576..9000 (9000: jumbo frames)")
    for m in models:
        trainmod.check_arguments(
            train_kw.get("method", "auto"), m, train_kw.get("steps", 5), train_kw.get("warmup", 1)
        )
    require_root("homagg train --link-mbit")
    calibrate = calibrate and train_kw.get("cost_model", True)
    rows = []
    with contextlib.ExitStack() as stack:
        cal_dir = out_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="hg-cal-"))
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
        host = cal_mod.host_or_measured(progress=trainmod.progress) if calibrate else None
        if not calibrate and train_kw.get("cost_model", True):
            logging.getLogger("homagg.train").warning(
                "[train] --no-calibrate: the testbeds are not calibrated through their ports, so "
                "the choice between HomAgg and the process group's allreduce predicts "
                "with this host's codec figures alone"
            )
        for rate in link_rates:
            rows += _rate_rows(
                rate,
                models,
                workers,
                testbed_name,
                mtu,
                state_dir,
                os.path.join(cal_dir, f"calibration-{rate:g}mbit.json") if calibrate else None,
                host,
                train_kw,
            )
    out = bench_report.header(
        benchmark="train_sweep",
        link_mbit=list(link_rates),
        models=list(models),
        workers=workers,
        mtu=int(mtu),
        method=train_kw.get("method", "auto"),
        steps=train_kw.get("steps"),
        warmup=train_kw.get("warmup"),
        rounds=train_kw.get("rounds", 1),
        trials=bool(train_kw.get("trials", False)),
        calibrated=bool(calibrate),
        codec_isa=codec_isa(),
        _extra_versions=("torch",),
        results=rows,
    )
    if out_dir:
        import json

        with open(os.path.join(out_dir, "train_sweep.json"), "w") as f:
            json.dump(out, f, indent=1)
        with open(os.path.join(out_dir, "train_sweep.md"), "w") as f:
            f.write(render(out) + "\n")
        out["plots"] = [plot(out, out_dir)]
    return out


def _rate_rows(rate, models, workers, testbed_name, mtu, state_dir, cal_path, host, train_kw):
    """The rows of one link rate: its testbed built, calibrated through its
    port into ``cal_path`` (None: not calibrated) on top of the codec's
    calibration ``host`` (homagg.bench.calibrate.host_or_measured), every model trained
    there with that calibration, the testbed taken down."""
    from homagg.deploy.local.testbed import Testbed
    from homagg.train import train as trainmod

    trainmod.progress(
        f"testbed {testbed_name}: {workers} workers, links {rate:g} Mbit/s, MTU {mtu}"
    )
    rows = []
    tb = Testbed.up(testbed_name, workers, link_mbit=rate, mtu=mtu, state_dir=state_dir)
    try:
        port = _calibrate(tb.name, state_dir, cal_path, host, train_kw) if cal_path else None
        with _calibration_file(cal_path):
            for m in models:
                trainmod.progress(f"{m} at {rate:g} Mbit/s")
                # uncalibrated by --no-calibrate: the sweep said so once
                rep = trainmod.run_train(
                    tb.name, model=m, state_dir=state_dir, warn_uncalibrated=False, **train_kw
                )
                rows.append(_row(rate, m, rep, port))
                r = rows[-1]
                trainmod.progress(
                    f"{m} at {rate:g} Mbit/s: {_fmt_speedup(r['speedup_vs_gloo'])}"
                    f" Gloo (HomAgg {_ms(r['iteration_seconds'])}, Gloo "
                    f"{_ms(r['gloo_iteration_seconds'])})"
                )
    finally:
        Testbed.down(testbed_name, state_dir=state_dir)
    return rows


def _calibrate(name, state_dir, cal_path, cal, train_kw) -> dict:
    """The testbed's port calibration (homagg.bench.calibrate.calibrate_port),
    written with the codec's calibration ``cal`` into ``cal_path``; the
    entry, for the rows."""
    from homagg.bench import calibrate as cal_mod
    from homagg.train import train as trainmod

    trainmod.progress(f"calibrating testbed {name} through its port (about half a minute)")
    entry = cal_mod.calibrate_port(
        name,
        state_dir,
        calibration=cal,
        timeout=train_kw.get("timeout", 10.0),
        progress=lambda m: trainmod.progress(f"calibrate {name}: {m}"),
    )
    cal_mod.write(cal_mod.add_port(cal, name, entry), cal_path)
    co, ring = entry["coefficients"], entry.get("ring") or {}
    trainmod.progress(
        f"calibrated {name}: pkt_ps {co['pkt_ps']} agg_pkt_ps {co['agg_pkt_ps']} "
        f"rtt_ns {co['rtt_ns']}"
        + (
            f", ring_byte_ps {ring['ring_byte_ps']} ring_step_ns {ring['ring_step_ns']}"
            if ring
            else f" ({entry.get('ring_unavailable')})"
        )
    )
    return entry


def _calibration_file(path):
    """Jobs registered inside take their cost model from ``path`` (the
    sweep's own calibration, through $HOMAGG_CALIBRATION); None: as before."""
    from homagg import cost as _cost
    from homagg.bench import calibrate as cal_mod

    if path is None:
        return contextlib.nullcontext()
    return cal_mod.environ(_cost.CALIBRATION_ENV, path)


def _row(rate, model, rep, port=None) -> dict:
    paths = {}
    for b in rep.get("buckets", []):
        for p, n in b.get("paths", {}).items():
            paths[p] = paths.get(p, 0) + n
    return {
        "link_mbit": rate,
        "model": model,
        "ranks": rep["ranks"],
        "testbed_link_mbit": rep.get("link_mbit"),
        "payload_bytes": rep.get("payload_bytes"),
        "cost": rep.get("cost"),
        # the testbed's port calibration the job's cost model took (None: none)
        "calibration": _port_summary(port),
        "speedup_vs_gloo": rep.get("speedup_vs_gloo"),
        "speedup_rounds": rep.get("speedup_rounds"),
        # every timed step, the slowest rank's, rounds in order
        "step_seconds": rep.get("step_seconds"),
        "gloo_step_seconds": rep.get("gloo_step_seconds"),
        "iteration_seconds": rep.get("iteration_seconds"),
        "gloo_iteration_seconds": rep.get("gloo_iteration_seconds"),
        "compute_seconds": rep.get("compute_seconds"),
        "gloo_compute_seconds": rep.get("gloo_compute_seconds"),
        "exposed_comm_seconds": rep.get("exposed_comm_seconds"),
        "gloo_exposed_comm_seconds": rep.get("gloo_exposed_comm_seconds"),
        "hook_cpu_seconds": rep.get("hook_cpu_seconds"),
        "bytes_per_rank": sum(rep["bytes_per_rank"]) / len(rep["bytes_per_rank"]),
        "gloo_bytes_per_rank": (
            sum(rep["gloo_bytes_per_rank"]) / len(rep["gloo_bytes_per_rank"])
            if rep.get("gloo_bytes_per_rank")
            else None
        ),
        "bucket_paths": paths,
        "buckets": [
            {
                k: b.get(k)
                for k in (
                    "bucket",
                    "numel",
                    "density",
                    "methods",
                    "paths",
                    "seconds",
                    "cpu_seconds",
                    "predicted_homagg_seconds",
                    "predicted_baseline_seconds",
                    "measured_homagg_seconds",
                    "measured_baseline_seconds",
                    "arrival_spread_seconds",
                    "seconds_after_last_arrival",
                    "agree_seconds",
                    "trial_verdicts",
                )
            }
            for b in rep.get("buckets", [])
        ],
        "params_identical_across_ranks": rep.get("params_identical_across_ranks"),
        "replay_bit_identical": rep.get("replay_bit_identical"),
    }


def _port_summary(port):
    """A row's record of its testbed's port calibration: the fitted
    coefficients (a core each), the ring's when measured, the sharing."""
    if not port:
        return None
    ring = port.get("ring") or {}
    return {
        **port["coefficients"],
        **{k: ring[k] for k in ("ring_byte_ps", "ring_step_ns") if k in ring},
        "sharing": port["sharing"],
    }


def _ms(v):
    return "-" if v is None else f"{v * 1e3:.0f} ms"


def _fmt_speedup(v):
    return "-" if v is None else f"{v:.2f}x"


def _range(rounds) -> str:
    if not rounds or len(rounds) < 2:
        return ""
    return f" ({min(rounds):.2f}-{max(rounds):.2f})"


def render(report: dict) -> str:
    """The sweep as a Markdown table."""
    m = report.get("machine", {})
    rounds = report.get("rounds", 1)
    how = (
        f"the median of {rounds} rounds, the two phases alternating (range in brackets)"
        if rounds > 1
        else "two phases measured one after the other in the same run"
    )
    lines = [
        f"`{report.get('command', 'homagg train --link-mbit ...')}`: {report['workers']} "
        f"ranks, links of MTU {report.get('mtu', 1500)}, method {report['method']}, "
        f"{report['steps']} timed steps after "
        f"{report['warmup']} warmup; {m.get('cpu', 'CPU unknown')}, {m.get('cpus')} "
        f"vCPU, codec ISA path {report.get('codec_isa')}; "
        + (
            "each testbed calibrated through its port first; "
            if report.get("calibrated")
            else "the testbeds not calibrated through their ports; "
        )
        + f"each speedup is {how}",
        "",
        "| link | model | speedup vs Gloo | HomAgg iteration | Gloo iteration | "
        "buckets homagg / baseline | bytes/rank HomAgg / Gloo | exact |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        p = r["bucket_paths"]
        gb = r.get("gloo_bytes_per_rank")
        exact = r["params_identical_across_ranks"] and r["replay_bit_identical"] is not False
        lines.append(
            f"| {r['link_mbit']:g} Mbit/s | {r['model']} | "
            f"{_fmt_speedup(r['speedup_vs_gloo'])}{_range(r.get('speedup_rounds'))} | "
            f"{_ms(r['iteration_seconds'])} | "
            f"{_ms(r['gloo_iteration_seconds'])} | {p.get('homagg', 0)} / "
            f"{p.get('baseline', 0)} | {r['bytes_per_rank'] / 1e6:.2f} / "
            + (f"{gb / 1e6:.2f} MB" if gb is not None else "-")
            + f" | {'yes' if exact else 'NO'} |"
        )
    return "\n".join(lines)


def plot(report: dict, out_dir: str) -> str:
    """train_linkrate.png: speedup vs Gloo DDP against the link rate, one
    line per model."""
    from homagg.bench.report import pyplot

    plt = pyplot()
    from matplotlib.ticker import FuncFormatter  # after pyplot(): its backend

    fig, ax = plt.subplots(figsize=(6, 4))
    for model in report["models"]:
        rs = sorted(
            (
                r
                for r in report["results"]
                if r["model"] == model and r.get("speedup_vs_gloo") is not None
            ),
            key=lambda r: r["link_mbit"],
        )
        if rs:
            ax.plot(
                [r["link_mbit"] / 1000 for r in rs],
                [r["speedup_vs_gloo"] for r in rs],
                marker="o",
                label=os.path.basename(model),
            )
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xscale("log")
    # ratios on a log axis: 0.9x and 1.1x as far from 1 as 25x from 1 / 25,
    # so the models near Gloo are not squashed under a fast one
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.yaxis.set_minor_formatter(
        FuncFormatter(lambda v, _: f"{v:g}x" if round(v, 6) in (0.5, 2, 3, 5, 20, 30) else "")
    )
    ax.set_xlabel("link rate (Gbit/s)")
    ax.set_ylabel("speedup vs Gloo DDP (iteration time)")
    m = report.get("machine", {})
    ax.set_title(
        f"{m.get('cpu', 'CPU unknown')} ({m.get('cpus')} vCPU), codec {report.get('codec_isa')}\n"
        f"{report['workers']} ranks, HomAgg {report['method']}",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, "train_linkrate.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
