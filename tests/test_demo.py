"""`homagg demo`, the main job, in its network modes, with small sizes.

The table must list every requested method and say "yes" for the exact ones
(the demo exits non-zero when an exact method disagrees with the reference).
"""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def _demo(*args, timeout=600):
    env = dict(os.environ)
    return subprocess.run(
        [sys.executable, "-m", "homagg.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _rows(out):
    return [
        line.split()
        for line in out.splitlines()
        if line.split()
        and line.split()[0] in ("dense", "lhc", "union", "blocks", "nc")
        or line.startswith("auto->")
    ]


def test_demo_sim_mode_is_exact():
    p = _demo("--mode", "sim", "--elements", "65536", "--methods", "dense,lhc,union,blocks")
    assert p.returncode == 0, p.stderr
    rows = _rows(p.stdout)
    assert {r[0] for r in rows} == {"dense", "lhc", "union", "blocks"}
    assert len(rows) == 8  # two workloads
    assert all("yes" in r for r in rows), p.stdout
    # lhc sends fewer bytes than dense at 5% density, union fewer than lhc
    by = {(r[0], r[1]): int(r[4]) for r in rows}
    assert by[("union", "shared")] < by[("lhc", "shared")] < by[("dense", "shared")]


@pytest.mark.root
@pytest.mark.netns
@pytest.mark.dpdk
def test_demo_testbed_mode_is_exact_and_tears_down():
    before = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    p = _demo("--mode", "testbed", "--elements", "65536", "--link-mbit", "200")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = _rows(p.stdout)
    assert {r[0] for r in rows} == {"dense", "lhc", "union"}
    assert all("yes" in r for r in rows), p.stdout
    # Gloo ran on the same testbed: each row carries its speedup against it,
    # and the machine the figures hold for is named
    assert "Gloo ring all-reduce (torch.distributed)" in p.stdout, p.stdout
    assert all(any(c == "Gloo;" for c in r) for r in rows), p.stdout
    machine = [ln for ln in p.stdout.splitlines() if ln.startswith("measured on ")]
    assert machine and "vCPU" in machine[0] and "codec ISA path" in machine[0], p.stdout
    after = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    assert not {n for n in after - before if n.startswith("hg-demo")}


def test_demo_rejects_unknown_method():
    p = _demo("--mode", "sim", "--methods", "dense,bogus")
    assert p.returncode != 0
    assert "bogus" in p.stderr
