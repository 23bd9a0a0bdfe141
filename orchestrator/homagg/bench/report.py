"""Writing benchmark results: JSON, CSV, a Markdown table, the run's context.

A report is one dict: ``machine``, ``versions``, ``command``, the
benchmark's parameters and ``results`` (a list of flat dicts, one row
each).  ``write_outputs`` writes <name>.json, <name>.csv and <name>.md into
an output directory; the plots are the benchmark's own.
"""

import csv
import json
import logging
import os
import platform
import shlex
import statistics
import sys
import time


_log = logging.getLogger("homagg.bench")


def progress(bench, msg):
    """One progress line (logger homagg.bench, stderr under the homagg command)."""
    _log.info("[bench %s] %s", bench, msg)


def machine():
    info = {
        "hostname": platform.node(),
        "system": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return info


def versions(extra=()):
    """Versions of homagg and the libraries a result depends on."""
    out = {}
    for name in ("homagg", "numpy", "matplotlib", *extra):
        try:
            from importlib.metadata import version

            out[name] = version(name)
        except Exception:  # not installed: say so instead of guessing
            out[name] = None
    return out


def command():
    return (
        " ".join(shlex.quote(a) for a in ["homagg", *sys.argv[1:]])
        if os.path.basename(sys.argv[0]) == "homagg"
        else " ".join(map(shlex.quote, sys.argv))
    )


def add_allreduce_arguments(parser):
    """The allreduce of a testbed benchmark: method, elements, workload, density."""
    parser.add_argument("--method", default="dense", help="allreduce method (default dense)")
    parser.add_argument(
        "--elements", type=int, default=2**20, help="float32 elements per worker (default 2^20)"
    )
    parser.add_argument("--workload", default="dense", help="see homagg.bench.workloads")
    parser.add_argument("--density", type=float, default=1.0)


def median_summary(rows, key, values, speedup_key):
    """Per value v of rows' key (in the order of values): the median of
    their "seconds" and, under speedup_key, the first value's median over it."""
    median = {v: statistics.median(r["seconds"] for r in rows if r[key] == v) for v in values}
    base = median[values[0]]
    return {str(v): {"median_seconds": t, speedup_key: base / t} for v, t in median.items()}


def header(**params):
    return {
        "machine": machine(),
        "versions": versions(params.pop("_extra_versions", ())),
        "command": command(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **params,
    }


def _cell(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    if v is None:
        return ""
    return str(v)


def columns(rows):
    """Every key of the rows, in first-seen order."""
    cols = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    return cols


def write_csv(path, rows):
    cols = columns(rows)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in cols})


def markdown_table(rows, cols):
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r.get(c)) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(out_dir, name, report, md_columns, title):
    """<name>.json, <name>.csv, <name>.md in out_dir; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    paths["json"] = os.path.join(out_dir, f"{name}.json")
    with open(paths["json"], "w") as f:
        json.dump(report, f, indent=2, default=str)
        f.write("\n")
    paths["csv"] = os.path.join(out_dir, f"{name}.csv")
    write_csv(paths["csv"], report["results"])
    paths["md"] = os.path.join(out_dir, f"{name}.md")
    with open(paths["md"], "w") as f:
        f.write(f"# {title}\n\n")
        f.write(f"Command: `{report['command']}`\n\n")
        m = report["machine"]
        f.write(
            f"Machine: {m.get('cpu', m.get('machine'))}, {m.get('cpus')} CPUs, "
            f"{m.get('system')}; {report['date']}\n\n"
        )
        f.write(markdown_table(report["results"], md_columns))
    return paths


def finish(name, args, report, md_columns, title):
    """The end of a testbed benchmark's main(): its outputs into args.out
    (when set), the report as JSON on stdout with args.json, and the exit
    status: 1 when a result was not exact or the workers disagreed."""
    if args.out:
        paths = write_outputs(args.out, name, report, md_columns, title)
        progress(name, "wrote " + ", ".join(paths.values()))
    if args.json:
        json.dump(report, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    bad = [r for r in report["results"] if r["exact"] is False or not r["workers_agree"]]
    return 1 if bad else 0


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
