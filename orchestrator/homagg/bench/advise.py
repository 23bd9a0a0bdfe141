"""The advisor's predictions against allreduces measured on the local testbed.

Needs root.  Per link rate (--link-mbit, default 100 and 1000 Mbit/s) it
builds a testbed as ``homagg bench allreduce`` does (one namespace per
host, tc-shaped veth links at the rate, the testbed's homagg-switch
daemons, Gloo ranks in the worker namespaces), and per case (workload,
density; the gradients built once, homagg.bench.allreduce.Case) and method
it:

- measures: a HomAgg method by the one run path,
  homagg.runs.allreduce.run_allreduce (through
  homagg.bench.allreduce.homagg_row: --warmup untimed and --repeat timed
  calls by the same workers and daemon, the median of the slowest
  worker's time, checked bit for bit); ``gloo``: torch.distributed's ring
  all-reduce on the same links (homagg.bench.allreduce.gloo_row);
- calibrates: each testbed through its port before each case
  (homagg.bench.calibrate.calibrate_port, as ``homagg calibrate --testbed``;
  its entry written into the calibration file, so the runs' jobs register
  it; ``--calibrate-every testbed`` once per testbed, ``--no-calibrate``
  never).  On a loaded host the same run's time moves by 1.2-3x within
  minutes; a calibration of the minute before the case follows that;
- predicts: ``homagg advise`` (homagg.ops.advise.advise) for the same W,
  elements, density, workload, seed and link rate, with the coefficients
  and round trip of the testbed's job (homagg.deploy.local.testbed_job.
  job_cost: the port's calibration, the codec's, the sharing of the host's
  cores), the cost model the runs register; ``gloo`` is predicted by the
  advisor's ring, charged the ring's CPU the port's calibration fitted
  (calibrated for ``gloo`` alone too, which starts the daemons);
- reports per configuration: predicted_s, measured_s, error
  (predicted / measured - 1) and within_target (|error| <= 25 %), the
  predicted and measured speedup against Gloo, the term the model says
  binds, and the payload bytes the model expects next to the bytes the
  worker's interface sent.  Never asserted: a report.  A run on a loaded
  machine measures the machine too (``machine_busy``, ``cpu_bound`` per
  row, as homagg bench allreduce).

A configuration is (link rate, workload, density, method): the defaults
give 2 x 1 x 3 x 4 = 24.  Outputs: a table on stderr, --json the report,
--out DIR advise.json/.csv/.md and advise_predicted_vs_measured.png
(predicted against measured time, log-log, the 25 % band).
"""

import json
import sys
import time

from homagg.bench import report as rep

TARGET = 0.25
METHODS = ("gloo", "dense", "blocks", "lhc", "union", "auto")


def _list(conv):
    def parse(text):
        return [conv(v) for v in text.split(",") if v.strip()]

    return parse


def add_arguments(parser):
    parser.add_argument(
        "--methods",
        type=_list(str),
        default=["gloo", "dense", "union", "auto"],
        help="comma-separated, of " + ",".join(METHODS) + " (default gloo,dense,union,auto)",
    )
    parser.add_argument(
        "--workloads",
        type=_list(str),
        default=["shared"],
        help="comma-separated, of shared,zipf,random (default shared)",
    )
    parser.add_argument(
        "--densities",
        type=_list(float),
        default=[1.0, 0.05, 0.0068],
        help="comma-separated non-zero fractions (default 1,0.05,0.0068)",
    )
    parser.add_argument(
        "--link-mbit",
        type=_list(float),
        default=[1000.0, 10000.0],
        help="comma-separated link rates, one testbed each (default 1000,10000)",
    )
    parser.add_argument("--workers", type=int, default=4, help="workers W (default 4)")
    parser.add_argument(
        "--elements", type=int, default=2**20, help="float32 elements per worker (default 2^20)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed runs (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first (default 1)")
    parser.add_argument("--seed", type=int, default=1, help="gradient seed")
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="give-up time of one allreduce, seconds (default 30)",
    )
    parser.add_argument(
        "--testbed-name",
        default="benchadv",
        help="name of the testbed this benchmark builds and removes (default benchadv)",
    )
    parser.add_argument("--state-dir", default=None, help="testbed state directory")
    parser.add_argument(
        "--calibrate-every",
        choices=("testbed", "case"),
        default="case",
        help="calibrate through the port once per testbed, or again before each case "
        "(workload, density), so the calibration sees the host's load of the minute "
        "the case is measured in (default case)",
    )
    parser.add_argument(
        "--no-calibrate",
        dest="calibrate",
        action="store_false",
        help="do not calibrate each testbed through its port first (the jobs then "
        "register this host's calibration alone, shared)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    parser.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="write advise.json/.csv/.md and the plot into DIR",
    )


def _progress(msg):
    rep.progress("advise", msg)


def check(args):
    """Refuse bad lists before anything starts (one line naming the option)."""
    bad = [m for m in args.methods if m not in METHODS]
    if bad or not args.methods:
        raise SystemExit(
            f"homagg bench advise: --methods {','.join(bad)}: each one of {','.join(METHODS)}"
        )
    bad = [w for w in args.workloads if w not in ("shared", "zipf", "random")]
    if bad or not args.workloads:
        raise SystemExit(
            f"homagg bench advise: --workloads {','.join(bad)}: each one of shared,zipf,random"
        )
    bad = [d for d in args.densities if not 0 < d <= 1]
    if bad or not args.densities:
        raise SystemExit(f"homagg bench advise: --densities {bad}: each in (0, 1]")
    bad = [r for r in args.link_mbit if not r >= 1]
    if bad or not args.link_mbit:
        raise SystemExit(f"homagg bench advise: --link-mbit {bad}: each at least 1 Mbit/s")


def compare(pred, measured_s):
    """(error, within_target) of a predicted against a measured time."""
    if not pred or not measured_s:
        return None, None
    err = pred / measured_s - 1
    return err, abs(err) <= TARGET


def predicted(a, method):
    """(seconds, binds, payload bytes per worker) the advice ``a`` gives ``method``."""
    r = a["ring"] if method == "gloo" else a["methods"][method]
    return r["time_s"], r["binds"], r["bytes_per_worker"]


def run(args):
    from homagg.bench import allreduce as ar
    from homagg.deploy.local.testbed import Testbed, require_root
    from homagg.ops import advise as adv

    check(args)
    require_root("homagg bench advise")
    W, n = args.workers, args.elements
    # homagg_row / gloo_row read these from the allreduce benchmark's arguments
    args.payload_bytes, args.pipeline_groups, args.auth = [1024], [ar.PIPELINE_GROUPS], False
    homagg_methods = [m for m in args.methods if m != "gloo"]
    results, torch_version, calibrations = [], None, []
    case = ar.Case(args)
    try:
        for link in args.link_mbit:
            name = args.testbed_name
            _progress(f"testbed {name}: {W} workers, links {link:g} Mbit/s")
            tb = Testbed.up(name, W, link_mbit=link, state_dir=args.state_dir)
            try:
                # the port's calibration (HomAgg runs through the daemons)
                # also fits the ring's CPU that Gloo's prediction charges
                need = bool(homagg_methods) or (args.calibrate and "gloo" in args.methods)
                no_daemon = ar._start_daemons(tb, args) if need else None
                calibrate = need and not no_daemon

                def model_now(case_name):
                    port = _calibrate(args, name) if calibrate else None
                    if port:
                        calibrations.append({"link_mbit": link, "case": case_name, **port})
                    return _job_model(tb, name, port)

                model = model_now(None) if args.calibrate_every == "testbed" else None
                gloo = None
                if "gloo" in args.methods:
                    try:
                        gloo = ar.GlooGroup(tb, args.timeout)
                        torch_version = gloo.torch_version
                    except Exception as exc:
                        gloo = f"unavailable: {type(exc).__name__}: {exc}"[:500]
                        _progress(f"gloo {gloo}")
                try:
                    for wl in args.workloads:
                        for d in args.densities:
                            if args.calibrate_every == "case":
                                model = model_now(f"{wl} {d:g}")
                            results += _case(
                                args, case, tb, name, link, wl, d, gloo, no_daemon, ar, adv, model
                            )
                finally:
                    if gloo is not None and not isinstance(gloo, str):
                        gloo.close()
            finally:
                Testbed.down(name, state_dir=args.state_dir)
                _progress(f"testbed {name} removed")
    finally:
        case.close()
    ok = [r for r in results if r.get("error") is not None]
    return rep.header(
        benchmark="advise",
        link_mbit=args.link_mbit,
        workers=W,
        elements=n,
        repeat=args.repeat,
        warmup=args.warmup,
        seed=args.seed,
        target=TARGET,
        _extra_versions=("torch", "pyroute2"),
        torch_runtime=torch_version,
        configurations=len(results),
        measured=len(ok),
        within_target=sum(bool(r["within_target"]) for r in ok),
        cpu_bound=sum(bool(r["cpu_bound"]) for r in ok),
        within_target_not_cpu_bound=sum(
            bool(r["within_target"]) for r in ok if r["cpu_bound"] is False
        ),
        port_calibrations=calibrations,
        results=results,
    )


def _job_model(tb, name, port):
    """The coefficients and round trip the testbed's jobs register now
    (homagg.deploy.local.testbed_job.job_cost), for the predictions."""
    from homagg import cost as _cost
    from homagg.deploy.local import testbed_job

    job = testbed_job.job_cost(tb)
    return {
        "rtt_ns": job.rtt_ns,
        "coeffs": {k: getattr(job, k) for k in _cost.COEFFICIENTS + _cost.RING_FIELDS},
        "from": (
            f"testbed {name}'s job: calibrated through its port, sharing {port['sharing']:g}"
            if port
            else f"testbed {name}'s job: {_cost.calibration_path()}, no port calibration"
        ),
    }


def _calibrate(args, name):
    """The testbed's calibration through its port (homagg.bench.calibrate.
    calibrate_port), written into the calibration file as its entry, so
    that every job of the benchmark on it registers it; None with
    --no-calibrate or when it failed (the jobs then register this host's
    calibration alone, shared)."""
    from homagg import cost as _cost
    from homagg.bench import calibrate as cal_mod

    if not args.calibrate:
        return None
    path = _cost.calibration_path()
    try:
        cal = cal_mod.host_or_measured(path)
        entry = cal_mod.calibrate_port(
            name,
            args.state_dir,
            calibration=cal,
            timeout=args.timeout,
            progress=lambda m: _progress(f"calibrate {name}: {m}"),
        )
        cal_mod.write(cal_mod.add_port(cal, name, entry), path)
    except Exception as exc:
        _progress(f"calibration through the port failed: {type(exc).__name__}: {exc}"[:500])
        return None
    co = entry["coefficients"]
    _progress(
        f"calibrated {name} through its port (sharing {entry['sharing']:g}): "
        f"pkt_ps {co['pkt_ps']} agg_pkt_ps {co['agg_pkt_ps']} rtt_ns {co['rtt_ns']} -> {path}"
    )
    return entry


def _case(args, case, tb, name, link, wl, d, gloo, no_daemon, ar, adv, model):
    """The rows of one (link rate, workload, density): every method measured
    and predicted."""
    W, n = args.workers, args.elements
    files, expect = case.prepare(W, wl, d, exact_check=any(m != "gloo" for m in args.methods))
    shared = {"gradient_files": files, "expect": expect}
    a = adv.advise(
        W, n, d, link, wl, seed=args.seed, rtt_ns=model["rtt_ns"], coeffs=model["coeffs"]
    )
    a["coefficients_from"] = model["from"]
    rows = []
    for m in args.methods:
        base = {
            "workers": W,
            "elements": n,
            "link_mbit": link,
            "workload": wl,
            "density": d,
            "method": m,
        }
        if m == "gloo":
            if isinstance(gloo, str):
                row = {"status": gloo}
            else:
                try:
                    row = ar.gloo_row(gloo, W, n, wl, d, link, args, gradient_files=files)
                except Exception as exc:
                    row = {"status": f"failed: {type(exc).__name__}: {exc}"[:500]}
        else:
            row = (
                {"status": no_daemon}
                if no_daemon
                else ar.homagg_row(name, m, W, n, wl, d, link, args, shared=shared)
            )
        p_s, binds, p_bytes = predicted(a, m)
        meas = row.get("seconds_median") if row.get("status") == "ok" else None
        err, within = compare(p_s, meas)
        out = {
            **base,
            "predicted_s": p_s,
            "measured_s": meas,
            "error": err,
            "within_target": within,
            "predicted_binds": binds,
            "predicted_payload_bytes_per_worker": p_bytes,
            "measured_bytes_per_worker": row.get("bytes_per_worker"),
            "bytes_ratio": (
                row["bytes_per_worker"] / p_bytes
                if row.get("bytes_per_worker") and p_bytes
                else None
            ),
            "predicted_speedup_vs_gloo": (a["ring"]["time_s"] / p_s if m != "gloo" else 1.0),
            "auto_choice_predicted": a["methods"]["auto"]["choice"] if m == "auto" else None,
            "seconds_min": row.get("seconds_min"),
            "seconds_max": row.get("seconds_max"),
            "exact": row.get("exact"),
            "cpu_bound": row.get("cpu_bound"),
            "machine_busy": row.get("machine_busy"),
            "status": row.get("status"),
            "coefficients_from": a["coefficients_from"],
            "rtt_ns": a["rtt_ns"],
        }
        rows.append(out)
        _progress(line(out))
    g = next((r["measured_s"] for r in rows if r["method"] == "gloo"), None)
    for r in rows:
        r["measured_speedup_vs_gloo"] = g / r["measured_s"] if g and r["measured_s"] else None
    return rows


def _ms(v):
    return "-" if v is None else f"{v * 1e3:.2f}"


def line(r):
    head = f"{r['link_mbit']:g} Mbit/s {r['workload']:6s} d={r['density']:<5g} {r['method']:6s}"
    if r["measured_s"] is None:
        return f"{head} predicted {_ms(r['predicted_s'])} ms, {r['status']}"
    return (
        f"{head} predicted {_ms(r['predicted_s'])} ms, measured {_ms(r['measured_s'])} ms, "
        f"error {r['error']:+.0%}{'' if r['within_target'] else ' (outside 25 %)'}, "
        f"binds {r['predicted_binds']}"
    )


def table(report):
    """The report as text: one line per configuration and the summary."""
    lines = [
        f"{'link':>6s} {'workload':8s} {'density':>7s} {'method':6s} {'pred ms':>9s} "
        f"{'meas ms':>9s} {'error':>7s} {'pred x':>7s} {'meas x':>7s} {'bytes':>6s}  binds"
    ]
    for r in report["results"]:
        err = "-" if r["error"] is None else f"{r['error']:+.0%}"
        px = f"{r['predicted_speedup_vs_gloo']:.2f}" if r["predicted_speedup_vs_gloo"] else "-"
        mx = f"{r['measured_speedup_vs_gloo']:.2f}" if r["measured_speedup_vs_gloo"] else "-"
        br = f"{r['bytes_ratio']:.3f}" if r["bytes_ratio"] else "-"
        lines.append(
            f"{r['link_mbit']:6g} {r['workload']:8s} {r['density']:7g} "
            f"{r['method']:6s} {_ms(r['predicted_s']):>9s} {_ms(r['measured_s']):>9s} "
            f"{err:>7s} {px:>7s} {mx:>7s} {br:>6s}  {r['predicted_binds']}"
            + ("  cpu-bound" if r.get("cpu_bound") else "")
            + ("" if r["status"] == "ok" else f"  [{r['status']}]")
        )
    lines.append(
        f"{report['within_target']} of {report['measured']} measured configurations "
        f"within {TARGET:.0%} ({report['configurations']} configurations); "
        f"{report['cpu_bound']} cpu-bound (the run measured the machine's CPU, not "
        f"the links), {report['within_target_not_cpu_bound']} within {TARGET:.0%} of "
        "those that were not"
    )
    lines.append(
        "pred x / meas x: speedup against Gloo; bytes: the bytes the interface sent "
        "over the payload bytes the model expects"
    )
    return "\n".join(lines)


MD_COLUMNS = (
    "link_mbit",
    "workload",
    "density",
    "method",
    "status",
    "predicted_s",
    "measured_s",
    "error",
    "within_target",
    "predicted_speedup_vs_gloo",
    "measured_speedup_vs_gloo",
    "predicted_binds",
    "predicted_payload_bytes_per_worker",
    "measured_bytes_per_worker",
    "bytes_ratio",
    "auto_choice_predicted",
    "cpu_bound",
    "machine_busy",
    "exact",
)


def plot(report, out_dir):
    """advise_predicted_vs_measured.png: predicted against measured time,
    one marker per method, one colour per link rate; the diagonal and the
    25 % band."""
    import os

    plt = rep.pyplot()
    rows = [r for r in report["results"] if r["measured_s"] and r["predicted_s"]]
    fig, ax = plt.subplots(figsize=(5.5, 5))
    markers = dict(zip(METHODS, "sodv^x"))
    rates = sorted({r["link_mbit"] for r in rows})
    for i, rate in enumerate(rates):
        for m in METHODS:
            rs = [r for r in rows if r["link_mbit"] == rate and r["method"] == m]
            if rs:
                ax.scatter(
                    [r["measured_s"] for r in rs],
                    [r["predicted_s"] for r in rs],
                    marker=markers[m],
                    color=f"C{i}",
                    label=f"{m}, {rate:g} Mbit/s",
                )
    if rows:
        lo = min(min(r["measured_s"], r["predicted_s"]) for r in rows) / 1.5
        hi = max(max(r["measured_s"], r["predicted_s"]) for r in rows) * 1.5
        ax.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8)
        ax.fill_between(
            [lo, hi],
            [lo * (1 - TARGET), hi * (1 - TARGET)],
            [lo * (1 + TARGET), hi * (1 + TARGET)],
            color="grey",
            alpha=0.15,
            label=f"within {TARGET:.0%}",
        )
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured allreduce time (s)")
    ax.set_ylabel("predicted (homagg advise) (s)")
    ax.set_title(f"W={report['workers']}, {report['elements']} float32")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    p = os.path.join(out_dir, "advise_predicted_vs_measured.png")
    fig.savefig(p, dpi=100)
    plt.close(fig)
    return p


def main(args):
    from homagg.deploy.local.testbed import RootRequired

    t0 = time.perf_counter()
    try:
        report = run(args)
    except RootRequired as exc:
        print(f"homagg bench advise: {exc}", file=sys.stderr)
        return 2
    report["seconds_total"] = time.perf_counter() - t0
    print(table(report), file=sys.stderr)
    if args.out:
        paths = rep.write_outputs(
            args.out,
            "advise",
            report,
            MD_COLUMNS,
            "The advisor's predictions against measured allreduces",
        )
        paths = list(paths.values()) + [plot(report, args.out)]
        _progress("wrote " + ", ".join(paths))
    if args.json:
        json.dump(report, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    bad = [r for r in report["results"] if r.get("exact") is False]
    if bad:
        _progress(f"NOT EXACT: {[(r['method'], r['workload'], r['density']) for r in bad]}")
        return 1
    return 0
