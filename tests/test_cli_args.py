"""Bad input gets a sentence, not a traceback: every numeric option of every
``homagg`` command, and the public Python entry points, fed zero, negative,
huge, NaN, infinite and wrong-type values.

The CLI runs in-process (homagg.cli.main with SystemExit captured): the
error is one line on stderr that names the option and gives an example of a
good value, the exit code is 2, nothing else is printed.  The list of
options comes from the parser itself, so a new numeric option is tested the
day it is added (and fails here until homagg.cli.args.OPTIONS gives it a
checker).
"""

import math
import subprocess
import sys

import numpy as np
import pytest

from homagg import cli, codec, sim
from homagg.cli import args as cli_args
from homagg.errors import InvalidArgument

PARSER = cli.build_parser()
OPTIONS = [o for o in cli_args.numeric_options(PARSER) if o[0] not in cli_args.OWN_CHECKS]

# Options for which 0 is a meaningful value (a seed, a fraction, "none").
ZERO_OK = {
    "seed",
    "warmup",
    "density",
    "drop_rate",
    "pipeline_groups",
    "rank",
    "port",
    "metrics",
    "pickup",
}
ZERO_OK_IN = {
    ("testbed up", "leaves"),
    ("up", "leaves"),
    ("run allreduce", "leaves"),
    ("train", "leaves"),
}

BAD = {
    "negative": "-1",
    "huge": "1" + "0" * 30,
    "nan": "nan",
    "infinite": "inf",
    "wrong type": "abc",
    "empty": "",
}


def _cases():
    for command, opt, dest, _ in OPTIONS:
        values = dict(BAD)
        if dest not in ZERO_OK and (command, dest) not in ZERO_OK_IN:
            values["zero"] = "0"
        for kind, value in values.items():
            yield pytest.param(command, opt, value, id=f"{command}-{opt}-{kind}")


def test_every_numeric_option_has_a_checker():
    assert len(OPTIONS) > 40
    missing = [(c, o) for c, o, d, t in OPTIONS if cli_args.checker(c, d) is None]
    assert not missing, f"add these options to homagg.cli.args.OPTIONS: {missing}"
    # harden() put the checker in place (not argparse's bare int / float)
    assert all(t.__name__ in ("integer", "number") for _, _, _, t in OPTIONS)


def _run(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    out, err = capsys.readouterr()
    return e.value.code, out, err


@pytest.mark.parametrize("command,opt,value", list(_cases()))
def test_bad_value_is_one_line_naming_the_option(command, opt, value, capsys):
    code, out, err = _run([*command.split(), f"{opt}={value}"], capsys)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith(f"homagg {command}: argument "), err
    assert opt in lines[0]
    assert "e.g." in lines[0]  # the fix: an example of a good value


@pytest.mark.parametrize("command,opt,dest", [(c, o, d) for c, o, d, _ in OPTIONS])
def test_checker_accepts_its_example_and_bounds(command, opt, dest):
    """The checkers against an independent reading of their description:
    the example they print is accepted, one past each end is refused."""
    check = cli_args.checker(command, dest)
    desc = check.description
    if check.__name__ == "integer":
        lo, hi = desc.split("integer ", 1)[1].split(" ", 1)[0].split("..")
        lo, hi = int(lo), int(hi)
        step = int(desc.split("multiple of ")[1].split(" ")[0]) if "multiple of" in desc else 1
        assert check(str(lo)) == lo and check(str(hi - hi % step)) == hi - hi % step
        for v in (lo - 1, hi + 1):
            with pytest.raises(Exception):
                check(str(v))
    else:
        interval = (
            desc.split("number in ", 1)[1].split(" ", 1)[0]
            + desc.split("number in ", 1)[1].split(" ", 2)[1]
        )
        lo, hi = (float(x) for x in interval[1:-1].split(","))
        for v, included in ((lo, interval[0] == "["), (hi, interval[-1] == "]")):
            if included:
                assert check(repr(v)) == v
            else:
                with pytest.raises(Exception):
                    check(repr(v))
        for v in (math.nextafter(lo, -math.inf), math.nextafter(hi, math.inf)):
            with pytest.raises(Exception):
                check(repr(v))


def test_choices_and_unknown_options_are_one_line(capsys):
    for argv, word in (
        (["demo", "--mode", "bogus"], "--mode"),
        (["train", "--testbed", "t", "--bogus"], "--bogus"),
        (["run", "allreduce", "--method", "bogus"], "--method"),
        (["testbed", "frob"], "frob"),
    ):
        code, out, err = _run(argv, capsys)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
        assert word in err


def test_workload_independent_is_random(capsys):
    """The one workload has one name, random; independent is accepted."""
    p = cli.build_parser(["run", "allreduce"])
    a = p.parse_args(
        [
            "run",
            "allreduce",
            "--testbed",
            "t",
            "--method",
            "lhc",
            "--elements",
            "8",
            "--density",
            "0.5",
            "--workload",
            "independent",
        ]
    )
    assert a.workload == "random"
    from homagg.bench import workloads

    np.testing.assert_array_equal(
        workloads.generate("independent", 2, 4096, 0.1, 3, 1),
        workloads.generate("random", 2, 4096, 0.1, 3, 1),
    )


def test_argument_errors_do_not_load_torch():
    """`homagg train --steps 0` answers before torch loads (and the other
    commands' modules are not imported at all)."""
    code = (
        "import sys\nfrom homagg import cli\n"
        "try:\n    cli.main(['train', '--steps', '0'])\nexcept SystemExit as e:\n"
        "    assert e.code == 2\n"
        "heavy = [m for m in ('torch', 'homagg.runs.demo', 'homagg.deploy.remote.hosts')\n"
        "         if m in sys.modules]\n"
        "print(heavy)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"
    assert "--steps" in p.stderr


# ---------------------------------------------------------------------------
# Public Python entry points

G32 = [np.ones(64, np.float32), np.ones(64, np.float32)]


@pytest.mark.parametrize(
    "bad",
    [
        [g.astype(np.float64) for g in G32],
        [g.astype(np.float16) for g in G32],
        [g.astype(np.int32) for g in G32],
        [list(g) for g in G32],
    ],
    ids=["float64", "float16", "int32", "list"],
)
def test_entry_points_refuse_non_float32(bad):
    with pytest.raises(
        InvalidArgument, match=r"worker 0: grads\[0\]: expected .*(float32|numpy array)"
    ):
        codec.simulate_allreduce(bad, method="dense")
    with sim.Cluster(workers=2, slots=8) as c:
        with pytest.raises(InvalidArgument, match=r"worker 0: grads\[0\]: expected .*float32"):
            c.allreduce(bad, method="dense")
        # and the cluster still works after the refusal
        r = c.allreduce(G32, method="dense")
    np.testing.assert_array_equal(r.sum, np.full(64, 2, np.float32))


@pytest.mark.parametrize(
    "name,value",
    [
        (n, v)
        for n in ("workers", "slots", "payload")
        for v in (0, -1, 10**12, 2.5, "4", True, math.nan)
    ]
    + [
        (n, v)
        for n in ("link_gbps", "timeout", "rto", "max_time")
        for v in (-1.0, math.nan, math.inf, 1e30, "1")
    ]
    + [("timeout", 0.0), ("payload", 1023)],
)
def test_cluster_refuses_bad_numbers_naming_them(name, value):
    with pytest.raises(InvalidArgument) as e:
        sim.Cluster(**{"workers": 2, name: value})
    msg = str(e.value)
    assert msg.startswith(f"{name} must be") and "e.g." in msg and "\n" not in msg
