"""`homagg up / run allreduce -i / down` against real sshd hosts (one network
namespace each, tests/sshrack.py).

The emulated hosts share this machine's filesystem.  Instead of provisioning
them (tests/test_provision.py does that), each host's install_dir gets a
`venv` symlink to this checkout's .venv and a host config whose source_dir is
this checkout, so the aggregator runs build/release/homagg-switch on a DPDK
virtual PMD (net_af_packet on its namespace's eth0) and the workers run this
checkout's homagg.  Everything else goes over SSH as on a real rack.
"""

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from helpers import gone, job_file_workers_exact, require

from homagg.deploy.remote import inventory as inv
from homagg.deploy.remote import provision as prov
from homagg.runs import job as localrun
from sshrack import host_table, running_rack, to_toml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.dirname(os.path.dirname(sys.executable))
SWITCH = os.path.join(REPO, "build", "release", "homagg-switch")

pytestmark = [
    pytest.mark.root,
    pytest.mark.netns,
    pytest.mark.ssh,
    pytest.mark.dpdk,
    pytest.mark.slow,
]


@pytest.fixture(scope="module")
def rack(tmp_path_factory):
    require(os.geteuid() == 0, "needs root")
    require(os.path.exists(SWITCH), "homagg-switch not built (make build)")
    with running_rack(tmp_path_factory.mktemp("rack")) as r:
        yield r


def make_testbed(rack, tmp, settings=None, **host_overrides):
    """testbed.toml for the rack, each host 'provisioned' with this checkout
    (``settings``: more [settings] fields)."""
    hosts = []
    for h in rack.hosts():
        d = host_table(
            h, rack.key, os.path.join(str(tmp), "{name}", "opt"), **host_overrides.get(h.name, {})
        )
        hosts.append({k: v for k, v in d.items() if v is not None})
    settings = {
        "config_file": os.path.join(str(tmp), "{name}", "etc", "host.toml"),
        "connect_timeout": 15,
        "command_timeout": 120,
        **(settings or {}),
    }
    path = os.path.join(str(tmp), "testbed.toml")
    with open(path, "w") as f:
        f.write(to_toml(settings, hosts))
    i = inv.load(path)
    for h in i.hosts:
        os.makedirs(h.install_dir, exist_ok=True)
        if not os.path.lexists(h.venv):
            os.symlink(VENV, h.venv)
        os.makedirs(os.path.dirname(h.config_file), exist_ok=True)
        with open(h.config_file, "w") as f:
            f.write(prov.host_config(h, i, REPO))
    return path, i


def cli(*args, timeout=300, env=None):
    return subprocess.run(
        [os.path.join(VENV, "bin", "homagg"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.mark.timeout(600)
def test_up_run_down(rack, tmp_path):
    path, i = make_testbed(rack, tmp_path)
    agg = i.host("agg")
    rundir = os.path.join(agg.install_dir, "run")

    up = cli("up", "-i", path, "--no-udp-csum")
    assert up.returncode == 0, up.stdout + up.stderr
    pid = int(open(os.path.join(rundir, "switch.pid")).read().split()[0])
    assert not gone(pid)
    # the daemon runs in the aggregator host's namespace, with the inventory's data plane
    ns = rack.tb.host("agg").netns
    assert os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{ns}").st_ino
    cmdline = open(f"/proc/{pid}/cmdline").read().split("\0")
    assert agg.vdev in cmdline and agg.address in cmdline
    assert os.path.exists(os.path.join(rundir, "control.sock"))

    again = cli("up", "-i", path)
    assert (
        again.returncode == 1 and "already runs" in again.stderr and "homagg down" in again.stderr
    )
    try:
        for method in ("lhc", "dense"):
            r = cli(
                "run",
                "allreduce",
                "-i",
                path,
                "--method",
                method,
                "--elements",
                "30000",
                "--density",
                "0.05",
                "--seed",
                "7",
                "--runs-dir",
                str(tmp_path / "runs"),
                "--json",
            )
            assert r.returncode == 0, r.stdout + r.stderr
            rep = json.loads(r.stdout)
            assert rep["exact"] is True and rep["exact_per_worker"] == [True, True], rep
            assert rep["workers"] == 2 and rep["worker_hosts"] == ["w0", "w1"]
            assert rep["counters"]["results_sent"] > 0, rep["counters"]
            assert all(b > 0 for b in rep["bytes_per_worker"])
            folder = rep["run_dir"]
            assert folder.startswith(str(tmp_path / "runs")) and folder.endswith("-" + method)
            names = set(os.listdir(folder))
            assert {
                "result-0.npy",
                "result-1.npy",
                "report-0.json",
                "report-1.json",
                "worker-w0.log",
                "worker-w1.log",
                "switch.log",
                "report.json",
            } <= names, names
            assert json.load(open(os.path.join(folder, "report.json")))["exact"] is True
            # the fetched results, checked here against the reference independently
            grads = [localrun.gradient(30000, 0.05, "random", 7, w) for w in range(2)]
            ref = localrun.reference(grads, localrun.DEFAULT_BLOCK).view(np.uint32)
            for w in range(2):
                got = np.load(os.path.join(folder, f"result-{w}.npy")).view(np.uint32)
                assert np.array_equal(got, ref)
            assert "homagg-switch: ready" in open(os.path.join(folder, "switch.log")).read()
            # the workers are gone, their PID files and remote run folders too
            assert all(gone(p) for p in rep["worker_pids"]), rep["worker_pids"]
            for h in ("w0", "w1"):
                left = os.listdir(os.path.join(i.host(h).install_dir, "run"))
                assert left == ["job.json"], left  # up's job file stays until down
            text = cli(
                "run",
                "allreduce",
                "-i",
                path,
                "--method",
                method,
                "--elements",
                "5000",
                "--density",
                "0.1",
                "--runs-dir",
                str(tmp_path / "runs"),
            )
            assert text.returncode == 0, text.stdout + text.stderr
            assert (
                "bit-exact on every worker: True" in text.stdout
                and "results and logs:" in text.stdout
            )
    finally:
        down = cli("down", "-i", path)
    assert down.returncode == 0, down.stdout + down.stderr
    assert re.search(rf"^agg: removed job \d+; stopped {pid} ", down.stdout, re.M), down.stdout
    assert gone(pid)
    assert not os.path.exists(rundir)
    # nothing left to stop
    down2 = cli("down", "-i", path)
    assert down2.returncode == 0 and "agg: nothing running" in down2.stdout
    run = cli(
        "run",
        "allreduce",
        "-i",
        path,
        "--method",
        "lhc",
        "--elements",
        "100",
        "--density",
        "0.1",
        "--runs-dir",
        str(tmp_path / "runs"),
    )
    assert run.returncode == 1 and "homagg-switch is not running" in run.stderr


@pytest.mark.timeout(600)
def test_failed_up_stops_the_daemons_it_started(rack, tmp_path):
    """`up` whose job cannot be made after homagg-switch started (a payload
    the links' MTU cannot carry) stops that daemon and removes its run
    directory: the next `up` starts cleanly instead of finding a daemon
    with no job."""
    path, i = make_testbed(rack, tmp_path)
    rundir = os.path.join(i.host("agg").install_dir, "run")
    bad = cli("up", "-i", path, "--no-udp-csum", "--payload-bytes", "8192")
    assert bad.returncode == 1 and "does not fit the MTU" in bad.stderr, bad.stdout + bad.stderr
    started = re.search(r"homagg-switch up on agg \(pid (\d+)", bad.stdout)
    assert started, bad.stdout  # it had started, so the job step failed after it
    assert "agg: stopped after the failed up" in bad.stdout, bad.stdout
    assert gone(int(started.group(1)))
    assert not os.path.exists(rundir)
    up = cli("up", "-i", path, "--no-udp-csum")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
    finally:
        down = cli("down", "-i", path)
    assert down.returncode == 0, down.stdout + down.stderr


@pytest.mark.timeout(600)
def test_calibrate_on_inventory_hosts_and_the_job_takes_the_slowest(rack, tmp_path):
    """`homagg calibrate -i` measures on every worker host into its
    INSTALL_DIR/calibration.json; the job `up -i` registers takes, field by
    field, the largest of the worker hosts' coefficients (computed here from
    the files), and this machine's calibration once a worker host has none."""
    from homagg import cost

    path, i = make_testbed(rack, tmp_path, settings={"link_mbit": 1000})
    r = cli("calibrate", "-i", path, "--elements", "65536", "--repeat", "1", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert sorted(rep) == ["w0", "w1"]
    files = {h: os.path.join(i.host(h).install_dir, "calibration.json") for h in ("w0", "w1")}
    for h, f in files.items():
        assert rep[h]["file"] == f and json.load(open(f))["paths"] == rep[h]["paths"]
    # known coefficients on each host, so that the slowest is checkable field by field
    names = cost.COEFFICIENTS
    mine = {
        "w0": {k: 1000 + 10 * n for n, k in enumerate(names)},
        "w1": {k: 1000 + 10 * (len(names) - n) for n, k in enumerate(names)},
    }
    for h, f in files.items():
        cal = json.load(open(f))
        cal["paths"] = {cal["isa"]: mine[h]}
        json.dump(cal, open(f, "w"))
    local = tmp_path / "local-calibration.json"
    json.dump({**cal, "paths": {cal["isa"]: {k: 7 for k in names}}}, open(local, "w"))
    env = {**os.environ, "HOMAGG_CALIBRATION": str(local)}
    env.pop("HOMAGG_CODEC_ISA", None)

    def job_cost_after_up():
        up = cli("up", "-i", path, "--no-udp-csum", env=env)
        try:
            assert up.returncode == 0, up.stdout + up.stderr
            job = json.load(open(os.path.join(i.host("w0").install_dir, "run", "job.json")))
            return job["cost"]
        finally:
            down = cli("down", "-i", path)
            assert down.returncode == 0, down.stdout + down.stderr

    got = job_cost_after_up()
    assert got["link_mbit"] == 1000
    assert {k: got[k] for k in names} == {k: max(mine["w0"][k], mine["w1"][k]) for k in names}
    os.remove(files["w1"])  # one worker host not calibrated: this machine's numbers
    got = job_cost_after_up()
    assert {k: got[k] for k in names} == {k: 7 for k in names}
    # `up`'s job running: `calibrate -i` gives every host's job file the new
    # model (the slowest of the hosts' new files), nothing else changed
    up = cli("up", "-i", path, "--no-udp-csum", env=env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        job_files = {h.name: os.path.join(h.install_dir, "run", "job.json") for h in i.hosts}
        before = {n: json.load(open(f)) for n, f in job_files.items()}
        assert all(b["cost"][k] == 7 for b in before.values() for k in names)
        r = cli("calibrate", "-i", path, "--elements", "65536", "--repeat", "1")
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"job {before['w0']['job']} of `homagg up -i`: every host's job file" in r.stdout
        cals = [json.load(open(f)) for f in files.values()]
        want = {k: max(int(c["paths"][c["isa"]][k]) for c in cals) for k in names}
        assert want != {k: 7 for k in names}
        for n, f in job_files.items():
            after = json.load(open(f))
            assert {k: after["cost"][k] for k in names} == want, n
            assert after["cost"]["link_mbit"] == 1000
            assert {k: v for k, v in after.items() if k != "cost"} == {
                k: v for k, v in before[n].items() if k != "cost"
            }
    finally:
        down = cli("down", "-i", path)
        assert down.returncode == 0, down.stdout + down.stderr


@pytest.mark.timeout(600)
def test_one_run_path_local_and_remote_reports_alike(rack, tmp_path):
    """The same job on the rack's namespaces as a local testbed and on its
    hosts over SSH: one report type (the same keys), the same exact result,
    and --repeat/--warmup honoured on both (three timed calls, their median
    the seconds)."""
    from homagg.runs import allreduce as runmod

    args = dict(elements=30000, density=0.05, seed=11, repeat=3, warmup=1)
    # local first: `up` below takes the aggregator's eth0
    loc = runmod.run_allreduce(
        rack.tb.name, "lhc", state_dir=rack.tb.state_dir, pmd="af_packet", **args
    )
    path, i = make_testbed(rack, tmp_path)
    up = cli("up", "-i", path, "--no-udp-csum")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        r = cli(
            "run",
            "allreduce",
            "-i",
            path,
            "--method",
            "lhc",
            "--elements",
            "30000",
            "--density",
            "0.05",
            "--seed",
            "11",
            "--repeat",
            "3",
            "--warmup",
            "1",
            "--runs-dir",
            str(tmp_path / "runs"),
            "--json",
        )
        assert r.returncode == 0, r.stdout + r.stderr
        rem = json.loads(r.stdout)
    finally:
        down = cli("down", "-i", path)
    assert down.returncode == 0, down.stdout + down.stderr
    assert (
        set(rem)
        == set(loc.as_dict())
        == {f.name for f in dataclasses.fields(runmod.AllreduceReport)}
    )
    assert [a.keys() for a in rem["aggregators"]] == [a.keys() for a in loc["aggregators"]]
    assert (loc["placement"], rem["placement"]) == ("testbed", "inventory")
    assert rem["inventory"] == path and loc["testbed"] == rack.tb.name
    for rep in (rem, loc.as_dict()):
        assert rep["exact"] is True and rep["exact_per_worker"] == [True, True], rep
        assert rep["repeat"] == 3 and rep["warmup"] == 1
        assert len(rep["seconds_each"]) == 3 and all(t > 0 for t in rep["seconds_each"])
        assert rep["seconds"] == float(np.median(rep["seconds_each"]))
        assert len(rep["worker_stats_timed"]) == 2 and len(rep["worker_cpu_seconds"]) == 2
        assert rep["worker_hosts"] == ["w0", "w1"] and rep["aggregator"] == "agg"
    # the same gradients, the same bits (and the reference's, independently)
    assert rem["result_sha256"] == loc["result_sha256"]
    grads = [localrun.gradient(30000, 0.05, "random", 11, w) for w in range(2)]
    ref = localrun.reference(grads, localrun.DEFAULT_BLOCK)
    assert hashlib.sha256(ref.tobytes()).hexdigest() == rem["result_sha256"]
    # the worker's own report, fetched into the run folder: three timings
    stats = json.load(open(os.path.join(rem["run_dir"], "report-0.json")))
    assert len(stats["seconds_each"]) == 3


@pytest.mark.timeout(300)
def test_options_a_placement_cannot_do_are_refused_before_anything_starts(rack, tmp_path):
    """Inventory hosts use the daemons `homagg up -i` started: an option that
    needs a daemon of the run's own is refused, each named with why, before
    any host is contacted; a local testbed refuses what it cannot do too."""
    path, i = make_testbed(rack, tmp_path)
    r = cli(
        "run",
        "allreduce",
        "-i",
        path,
        "--method",
        "lhc",
        "--elements",
        "100",
        "--density",
        "0.1",
        "--drop-rate",
        "0.1",
        "--switch-lcores",
        "2",
        "--runs-dir",
        str(tmp_path / "runs"),
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"not on inventory {path}" in r.stderr
    assert "drop_rate: " in r.stderr and "switch_lcores: " in r.stderr
    assert "homagg up -i" in r.stderr
    for opt, why in (
        ("--pmd", "pmd: "),
        ("--leaves", f"--leaves 1: inventory {path} has one aggregator host"),
    ):
        extra = {"--leaves": ["1"], "--pmd": ["af_xdp"]}.get(opt, [])
        r = cli(
            "run",
            "allreduce",
            "-i",
            path,
            "--method",
            "lhc",
            "--elements",
            "100",
            "--density",
            "0.1",
            opt,
            *extra,
            "--runs-dir",
            str(tmp_path / "runs"),
        )
        assert r.returncode == 1 and why in r.stderr, (opt, r.stderr)
    # training refuses the same, in the same place
    r = cli(
        "train",
        "-i",
        path,
        "--model",
        "ncf",
        "--method",
        "lhc",
        "--switch",
        SWITCH,
        "--runs-dir",
        str(tmp_path / "runs"),
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"not on inventory {path}: switch: " in r.stderr, r.stderr
    assert not os.path.exists(tmp_path / "runs")  # refused before the preflight
    # the local placement: an aggregator host it does not have
    from homagg.runs import allreduce as runmod
    from homagg.errors import RunError

    with pytest.raises(RunError, match=r"fail_aggregators: no aggregator host \['agg7'\]"):
        runmod.run_allreduce(
            rack.tb.name, "lhc", 100, 0.1, state_dir=rack.tb.state_dir, fail_aggregators=("agg7",)
        )


@pytest.mark.timeout(300)
def test_unreachable_host_named_before_anything_starts(rack, tmp_path):
    path, i = make_testbed(
        rack, tmp_path, w1={"ssh_host": rack.unused_ip}, w0={"ssh_key": rack.wrong_key}
    )
    up = cli("up", "-i", path, "--no-udp-csum")
    assert up.returncode == 1
    assert "host 'w1': step 'preflight'" in up.stderr and rack.unused_ip in up.stderr
    assert "check 'ssh_host'" in up.stderr
    assert "host 'w0': step 'preflight'" in up.stderr and "authorized_keys" in up.stderr
    assert "nothing was started" in up.stderr and "host 'agg'" not in up.stderr
    assert not os.path.exists(os.path.join(i.host("agg").install_dir, "run"))
    run = cli(
        "run",
        "allreduce",
        "-i",
        path,
        "--method",
        "lhc",
        "--elements",
        "100",
        "--density",
        "0.1",
        "--runs-dir",
        str(tmp_path / "runs"),
    )
    assert run.returncode == 1 and "host 'w1': step 'preflight'" in run.stderr
    assert not os.path.exists(tmp_path / "runs")


@pytest.mark.timeout(300)
def test_missing_pci_device_and_unprovisioned_host(rack, tmp_path):
    path, i = make_testbed(
        rack,
        tmp_path,
        agg={"pci": "0000:ff:1f.7", "vdev": None, "hugepages": {"count": 0, "size": "2M"}},
    )
    os.unlink(i.host("w0").config_file)
    up = cli("up", "-i", path)
    assert up.returncode == 1
    assert "host 'agg': step 'preflight': no PCI device 0000:ff:1f.7 on agg" in up.stderr
    assert "host 'w0': step 'preflight': no host config" in up.stderr
    assert "homagg provision -i" in up.stderr
    assert not os.path.exists(os.path.join(i.host("agg").install_dir, "run"))


TINY_MODEL = """
import torch


def factory(rank, world_size, seed):
    # not seeded before its layers (as most user code): DDP's broadcast and
    # the snapshot after it decide the parameters
    model = torch.nn.Sequential(torch.nn.EmbeddingBag(500, 8, mode="sum"),
                                torch.nn.Linear(8, 1))
    g = torch.Generator().manual_seed(seed * 100 + rank)

    def batches():
        while True:
            x = torch.randint(0, 500, (16, 4), generator=g)
            yield x, (x % 7).float().mean(dim=1, keepdim=True)
    return model, batches(), torch.nn.MSELoss()
"""


def tiny_model(tmp):
    """A user's model file, at the same path on every rack host (they share
    this machine's filesystem): two parameters, sparse embedding gradients."""
    path = os.path.join(str(tmp), "tiny.py")
    with open(path, "w") as f:
        f.write(TINY_MODEL)
    return f"{path}:factory"


def check_train(rep, ranks=2):
    """Exact training: every rank's parameters bit for bit the same, and the
    single-process replay of the fixed-point reference sum (numpy) equal."""
    assert rep["ranks"] == ranks and rep["params_identical_across_ranks"] is True, rep
    assert rep["replay_bit_identical"] is True, rep["replay"]
    assert rep["replay"]["first_mismatch"] is None and rep["fallback_buckets"] == 0
    assert rep["buckets"] and all(set(b["paths"]) == {"homagg"} for b in rep["buckets"])


@pytest.mark.timeout(600)
def test_train_on_inventory_hosts_and_testbed_reports_alike(rack, tmp_path):
    """`homagg train -i` after `homagg up -i`: one DDP rank per worker host
    over SSH, configured from the job files `up` wrote, gradients through
    the hook and the daemon `up` started; the fetched parameters are
    bit-identical across ranks and to the replay.  The same run on the
    rack's namespaces as a local testbed returns a report with the same
    keys (one TrainReport) and the same placement-independent results."""
    from homagg.train import train as trainmod

    model = tiny_model(tmp_path)
    # local first: `up` below takes the aggregator's eth0
    loc = trainmod.run_train(
        rack.tb.name,
        model=model,
        method="lhc",
        steps=2,
        warmup=1,
        baseline=False,
        state_dir=rack.tb.state_dir,
    )
    check_train(loc)
    path, i = make_testbed(rack, tmp_path)
    up = cli("up", "-i", path, "--no-udp-csum")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        r = cli(
            "train",
            "-i",
            path,
            "--model",
            model,
            "--method",
            "lhc",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--no-baseline",
            "--runs-dir",
            str(tmp_path / "runs"),
            "--json",
        )
        assert r.returncode == 0, r.stdout + r.stderr
        rep = json.loads(r.stdout)
        check_train(rep)
        assert rep["worker_hosts"] == ["w0", "w1"] == loc["worker_hosts"]
        # a rank per worker host: the ranks were configured from up's job files
        up_file = os.path.join(i.host("w0").install_dir, "run", "job.json")
        assert rep["job_file"] == up_file and rep["job"] == json.load(open(up_file))["job"]
        assert rep["replay"]["steps"] == 3 and rep["buckets"][0]["methods"] == {"lhc": 2}
        names = set(os.listdir(rep["run_dir"]))
        assert {
            "report-0.json",
            "report-1.json",
            "grads-0.npz",
            "params-lhc-1.npz",
            "worker-w0.log",
            "train.json",
        } <= names, names
        assert all(gone(p) for p in rep["rank_pids"])
        for h in ("w0", "w1"):
            assert os.listdir(os.path.join(i.host(h).install_dir, "run")) == ["job.json"]
    finally:
        down = cli("down", "-i", path)
    assert down.returncode == 0, down.stdout + down.stderr
    fields = {f.name for f in dataclasses.fields(trainmod.TrainReport)}
    assert set(rep) == set(loc.as_dict()) == fields
    assert (loc["placement"], rep["placement"]) == ("testbed", "inventory")
    assert rep["inventory"] == path and loc["testbed"] == rack.tb.name
    assert rep["aggregator_hosts"] == loc["aggregator_hosts"] == ["agg"]
    assert rep["aggregators"] == loc["aggregators"] == [i.host("agg").address]
    assert loc["run_dir"] is None and loc["job_file"] is not None


@pytest.mark.timeout(400)
def test_train_with_auth_on_inventory_hosts(rack, tmp_path):
    """`homagg train -i --auth` on `up`'s unauthenticated daemons: a job of
    the run's own, its new secret placed in every rank's folder on its host
    (mode 0600, gone with the folder), every frame authenticated, as exact
    as without."""
    model = tiny_model(tmp_path)
    path, i = make_testbed(rack, tmp_path)
    up = cli("up", "-i", path, "--no-udp-csum")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        r = cli(
            "train",
            "-i",
            path,
            "--model",
            model,
            "--method",
            "lhc",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--no-baseline",
            "--auth",
            "--runs-dir",
            str(tmp_path / "runs"),
            "--json",
        )
        assert r.returncode == 0, r.stdout + r.stderr
        rep = json.loads(r.stdout)
    finally:
        down = cli("down", "-i", path)
    assert down.returncode == 0, down.stdout + down.stderr
    check_train(rep)
    assert rep["auth"] is True and rep["mac"]
    assert rep["job_file"].endswith("/job-0.json")
    for h in ("w0", "w1"):  # the run's folder, with the secret, is gone
        assert not os.path.exists(
            os.path.join(i.host(h).install_dir, "run", os.path.basename(rep["run_dir"]))
        )


@pytest.fixture(scope="module")
def rack2(tmp_path_factory):
    require(os.geteuid() == 0, "needs root")
    require(os.path.exists(SWITCH), "homagg-switch not built (make build)")
    with running_rack(tmp_path_factory.mktemp("rack2"), workers=2, aggregators=2) as r:
        yield r


@pytest.mark.timeout(600)
def test_train_on_two_aggregators_and_a_tree(rack2, tmp_path):
    """`homagg train -i` with the testbed path's options: the job spread
    over two aggregator hosts (`up`'s job), then a tree (--leaves 1: agg a
    leaf below agg1, the root; every rank's job file names its leaf), then
    the tree with --auth (the leaf's secret in the ranks' folders), each
    exact: parameters identical across ranks and to the replay.  The same
    tree on the rack's namespaces as a local testbed (daemons of the run's
    own) is exact too."""
    from homagg.train import train as trainmod

    model = tiny_model(tmp_path)
    # local first: `up` below takes the aggregators' eth0
    loc = trainmod.run_train(
        rack2.tb.name,
        model=model,
        method="lhc",
        steps=2,
        warmup=1,
        baseline=False,
        state_dir=rack2.tb.state_dir,
        leaves=1,
    )
    check_train(loc)
    assert loc["leaves"] == 1 and loc["aggregator_hosts"] == ["agg", "agg1"]
    path, i = make_testbed(rack2, tmp_path)
    up = cli("up", "-i", path, "--no-udp-csum")
    assert up.returncode == 0, up.stdout + up.stderr
    reps = {}
    try:
        for name, extra in (
            ("two", []),
            ("tree", ["--leaves", "1"]),
            ("tree_auth", ["--leaves", "1", "--auth"]),
        ):
            r = cli(
                "train",
                "-i",
                path,
                "--model",
                model,
                "--method",
                "lhc",
                "--steps",
                "2",
                "--warmup",
                "1",
                "--no-baseline",
                *extra,
                "--runs-dir",
                str(tmp_path / "runs"),
                "--json",
            )
            assert r.returncode == 0, (name, r.stdout + r.stderr)
            reps[name] = json.loads(r.stdout)
    finally:
        down = cli("down", "-i", path)
    assert down.returncode == 0, down.stdout + down.stderr
    addrs = [h.address for h in i.aggregators]
    two, tree = reps["two"], reps["tree"]
    check_train(two)
    assert two["aggregator_hosts"] == ["agg", "agg1"] and two["aggregators"] == addrs
    assert two["leaves"] == 0
    assert two["job_file"] == os.path.join(i.host("w0").install_dir, "run", "job.json")
    check_train(tree)
    assert tree["leaves"] == 1 and tree["aggregator_hosts"] == ["agg", "agg1"]
    assert tree["job"] != two["job"] and tree["job_file"].endswith("/job-0.json")
    assert all(b > 0 for b in tree["bytes_per_rank"])
    # the tree authenticated: each leaf its own secret in the ranks' folders
    ta = reps["tree_auth"]
    check_train(ta)
    assert ta["leaves"] == 1 and ta["auth"] is True and ta["mac"], ta
    for h in ("w0", "w1"):  # the run's folder, with the leaf's secret, is gone
        assert not os.path.exists(
            os.path.join(i.host(h).install_dir, "run", os.path.basename(ta["run_dir"]))
        )


@pytest.mark.timeout(600)
def test_two_aggregators_up_run_down(rack2, tmp_path):
    """Every aggregator host of the inventory runs a daemon and holds a
    shard of the job (docs/PROTOCOL.md "Several aggregators")."""
    path, i = make_testbed(rack2, tmp_path)
    assert [h.name for h in i.aggregators] == ["agg", "agg1"]
    up = cli("up", "-i", path, "--no-udp-csum")
    assert up.returncode == 0, up.stdout + up.stderr
    pids = {}
    for h in i.aggregators:
        pids[h.name] = int(open(os.path.join(h.install_dir, "run", "switch.pid")).read().split()[0])
        ns = rack2.tb.host(h.name).netns
        assert os.stat(f"/proc/{pids[h.name]}/ns/net").st_ino == os.stat(f"/run/netns/{ns}").st_ino
    files = [os.path.join(i.host(w).install_dir, "run", "job.json") for w in ("w0", "w1")]
    try:
        r = cli(
            "run",
            "allreduce",
            "-i",
            path,
            "--method",
            "lhc",
            "--elements",
            "30000",
            "--density",
            "0.05",
            "--seed",
            "7",
            "--runs-dir",
            str(tmp_path / "runs"),
            "--json",
        )
        assert r.returncode == 0, r.stdout + r.stderr
        rep = json.loads(r.stdout)
        assert rep["exact"] is True and rep["exact_per_worker"] == [True, True], rep
        assert [a["host"] for a in rep["aggregators"]] == ["agg", "agg1"]
        for a in rep["aggregators"]:
            assert a["counters"]["completed"] > 0, a
        assert os.path.exists(os.path.join(rep["run_dir"], "switch-agg1.log"))
        # --aggregators 1: the job on the first aggregator only, as on a testbed
        r1 = cli(
            "run",
            "allreduce",
            "-i",
            path,
            "--method",
            "lhc",
            "--elements",
            "30000",
            "--density",
            "0.05",
            "--seed",
            "7",
            "--aggregators",
            "1",
            "--runs-dir",
            str(tmp_path / "runs"),
            "--json",
        )
        assert r1.returncode == 0, r1.stdout + r1.stderr
        rep1 = json.loads(r1.stdout)
        assert [a["host"] for a in rep1["aggregators"]] == ["agg"]
        assert rep1["exact"] is True and rep1["result_sha256"] == rep["result_sha256"]
        assert rep1["aggregators"][0]["counters"]["completed"] > 0
        # --leaves 1: agg a leaf below agg1, the root (its MAC read over SSH)
        rt = cli(
            "run",
            "allreduce",
            "-i",
            path,
            "--method",
            "lhc",
            "--elements",
            "30000",
            "--density",
            "0.05",
            "--seed",
            "7",
            "--leaves",
            "1",
            "--runs-dir",
            str(tmp_path / "runs"),
            "--json",
        )
        assert rt.returncode == 0, rt.stdout + rt.stderr
        rept = json.loads(rt.stdout)
        assert rept["exact"] is True and rept["result_sha256"] == rep["result_sha256"]
        assert [(a["host"], a["role"]) for a in rept["aggregators"]] == [
            ("agg", "leaf"),
            ("agg1", "root"),
        ]
        leaf, root = (a["counters"] for a in rept["aggregators"])
        assert leaf["completed"] > 0 and leaf["up_sent"] == leaf["completed"]
        assert root["summed"] == root["completed"] == leaf["completed"], (leaf, root)
        # the same tree authenticated (job_file.register_tree): the leaf's
        # own secret in the run's folder on the worker hosts, the root's
        # keys derived; exact, no bad_mac at either level, the secrets gone
        ra = cli(
            "run",
            "allreduce",
            "-i",
            path,
            "--method",
            "lhc",
            "--elements",
            "30000",
            "--density",
            "0.05",
            "--seed",
            "7",
            "--leaves",
            "1",
            "--auth",
            "--runs-dir",
            str(tmp_path / "runs"),
            "--json",
        )
        assert ra.returncode == 0, ra.stdout + ra.stderr
        repa = json.loads(ra.stdout)
        assert repa["auth"] is True and repa["leaves"] == 1
        assert repa["exact"] is True and repa["result_sha256"] == rep["result_sha256"]
        leaf, root = (a["counters"] for a in repa["aggregators"])
        assert leaf["completed"] > 0 and leaf["bad_mac"] == 0 and root["bad_mac"] == 0
        assert root["summed"] == root["completed"] == leaf["completed"], (leaf, root)
        for w in ("w0", "w1"):
            run = os.path.join(i.host(w).install_dir, "run")
            assert not [n for _, _, ns in os.walk(run) for n in ns if n.endswith(".secret")]
        # up's job: its file on every worker host names both aggregators and
        # the host's own address; two ranks configured from it alone are exact
        for w, f in zip(("w0", "w1"), files):
            job = json.load(open(f))
            assert os.stat(f).st_mode & 0o077 == 0
            assert job["aggregator"] == ",".join(
                f"{h.address}:{localrun.UDP_PORT}" for h in i.aggregators
            )
            assert job["workers"] == 2 and job["bind"] == i.host(w).address
        _allreduce_from_job_files(rack2, files, tmp_path)
    finally:
        down = cli("down", "-i", path)
    assert down.returncode == 0, down.stdout + down.stderr
    assert re.search(rf"^agg: removed job {job['job']}; ", down.stdout, re.M), down.stdout
    assert re.search(rf"^agg1: removed job {job['job']}; ", down.stdout, re.M), down.stdout
    assert not any(os.path.exists(f) for f in files)
    for name, pid in pids.items():
        assert gone(pid), name


RANK = """\
import sys
import numpy as np
from homagg.switch.job_file import job_config
from homagg.worker import Worker
conf = job_config({"HOMAGG_JOB_FILE": sys.argv[1]})
rank = int(sys.argv[2])
x = np.random.default_rng(rank).standard_normal(20000).astype(np.float32)
x[::3] = 0
with Worker(job=conf["job"], token=conf["token"], worker=rank, workers=conf["workers"],
            aggregators=conf["aggregators"], group=conf["group"], bind=(conf["bind"], 0),
            timeout=conf["timeout"], slots=conf["slots"], payload=conf["payload"]) as w:
    np.save(sys.argv[3], w.allreduce(x, method="union"))
"""


def _allreduce_from_job_files(rack, files, tmp):
    """One rank per worker namespace, each configured only from its job file
    (homagg.switch.job_file, what homagg.torch reads): bit-exact against the oracle."""
    from reference import allreduce as oracle

    procs, outs = [], []
    for rank, f in enumerate(files):
        outs.append(str(tmp / f"rank-{rank}.npy"))
        procs.append(
            rack.tb.run_in(
                f"w{rank}",
                [sys.executable, "-c", RANK, f, str(rank), outs[-1]],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err[-2000:]
    xs = []
    for rank in range(len(files)):
        x = np.random.default_rng(rank).standard_normal(20000).astype(np.float32)
        x[::3] = 0
        xs.append(x)
    want = oracle(xs, localrun.DEFAULT_BLOCK).view(np.uint32)
    for o in outs:
        assert np.array_equal(np.load(o).view(np.uint32), want)


@pytest.mark.timeout(300)
def test_up_starts_the_exporter_and_down_stops_it(rack, tmp_path):
    """Inventory field metrics_port: `homagg up` starts homagg exporter beside
    the daemon; its numbers are the daemon's, and `homagg down` stops it."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    ip = rack.tb.host("agg").ip
    path, i = make_testbed(rack, tmp_path, agg={"metrics_port": 19477, "metrics_bind": ip})
    rundir = os.path.join(i.host("agg").install_dir, "run")
    up = cli("up", "-i", path, "--no-udp-csum")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        url = f"http://{ip}:19477/metrics"
        assert "homagg exporter up on agg (pid " in up.stdout and url in up.stdout
        pid = int(open(os.path.join(rundir, "exporter.pid")).read().split()[0])
        job = json.load(open(os.path.join(rundir, "job.json")))["job"]
        with urllib.request.urlopen(url, timeout=30) as r:
            samples = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(r.read().decode())
                for s in fam.samples
            }
        assert samples[("homagg_up", (("daemon", "agg"),))] == 1
        assert samples[("homagg_job_workers", (("daemon", "agg"), ("job", str(job))))] == 2
        # homagg top over the inventory: the same daemon, read over SSH
        top = cli("top", "-i", path, "--once", "--interval", "0.2", timeout=120)
        assert top.returncode == 0, top.stdout + top.stderr
        assert top.stdout.startswith("agg: 1 job, 1 engine busy"), top.stdout
        assert any(ln.split()[:2] == [str(job), "2"] for ln in top.stdout.splitlines())
    finally:
        down = cli("down", "-i", path)
    assert down.returncode == 0, down.stdout + down.stderr
    assert gone(pid)


class _ProcScan:
    """Every process's command line and environment, read from /proc every
    20 ms in a thread while a command runs (what `ps e` would list), and
    the content of any file matching ``grab`` (a glob) seen meanwhile."""

    def __init__(self, grab):
        import threading

        self.grab, self.seen, self.grabbed = grab, set(), set()
        self.stop_ = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        import glob

        while not self.stop_.is_set():
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    for part in ("cmdline", "environ"):
                        try:
                            with open(f"/proc/{pid}/{part}", "rb") as f:
                                self.seen.add(f.read())
                        except OSError:
                            pass
            for path in glob.glob(self.grab):
                try:
                    with open(path) as f:
                        self.grabbed.add(f.read().strip())
                except OSError:
                    pass
            self.stop_.wait(0.02)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop_.set()
        self.t.join(10)

    def holds(self, text: str) -> bool:
        needles = (text.lower().encode(), text.upper().encode())
        return any(n in blob for blob in self.seen for n in needles)


def _files_holding(top: str, text: str) -> list[str]:
    """Every file under ``top`` whose bytes hold ``text`` (hex, either case)."""
    needles = (text.lower().encode(), text.upper().encode())
    out = []
    for d, _, names in os.walk(top):
        for n in names:
            p = os.path.join(d, n)
            try:
                with open(p, "rb") as f:
                    data = f.read()
            except OSError:
                continue
            if any(x in data for x in needles) and not n.endswith(".secret"):
                out.append(p)
    return out


@pytest.mark.timeout(900)
def test_auth_on_inventory_hosts_provision_up_run(rack, tmp_path):
    """Authentication on inventory hosts: `homagg provision`'s step secret
    copies the inventory's auth_secret (created here, mode 0600) to every
    worker host (mode 0600, root's; none on the aggregator) and repairs a
    copy whose mode was widened; `homagg up -i --auth` registers that
    secret and names each host's copy in its job file, and two workers of
    that job (from the job file) get the exact sum; `homagg run allreduce
    -i --auth` places a new secret per run in the run's folder (gone after
    the run) and is bit-exact.  No secret shows in any process's command
    line or environment while they run, nor in any log or file written."""
    from homagg import auth
    from homagg.deploy.remote import secret as hsecret

    path, i = make_testbed(rack, tmp_path, settings={"auth_secret": "secrets/job.secret"})
    local = i.settings.auth_secret
    assert local == str(tmp_path / "secrets" / "job.secret") and not os.path.exists(local)
    workers = [h for h in i.hosts if h.role == "worker"]

    # provision's step secret, on every host over SSH (the other steps: test_provision.py)
    runs = [prov.HostRun(h, i, None, None, False) for h in i.hosts]
    secret = hsecret.local_secret(i)  # created: mode 0600
    assert os.stat(local).st_mode & 0o777 == 0o600 and auth.load_secret(local) == secret
    try:
        for r in runs:
            r.connect()
            r.preflight()
            r.secret = secret
        status = {r.h.name: r.run_step("secret")[0] for r in runs}
        assert status == {"agg": "ok", "w0": "changed", "w1": "changed"}, status
        assert {r.h.name: r.run_step("secret")[0] for r in runs} == dict.fromkeys(status, "ok")
        for h in workers:
            st = os.stat(h.secret_file)
            assert st.st_mode & 0o777 == 0o600 and st.st_uid == 0, oct(st.st_mode)
            assert os.stat(os.path.dirname(h.secret_file)).st_mode & 0o777 == 0o700
            assert auth.load_secret(h.secret_file) == secret
        assert not os.path.exists(i.host("agg").secret_file)
        os.chmod(i.host("w1").secret_file, 0o644)
        w1 = next(r for r in runs if r.h.name == "w1")
        st, detail = w1.run_step("secret")
        assert st == "changed" and "mode 644" in detail, detail
        assert os.stat(i.host("w1").secret_file).st_mode & 0o777 == 0o600
    finally:
        for r in runs:
            r.close()

    runs_dir = tmp_path / "runs"
    grab = os.path.join(str(tmp_path), "w0", "opt", "run", "*", "job.secret")
    with _ProcScan(grab) as scan:
        up = cli("up", "-i", path, "--no-udp-csum", "--auth")
        assert up.returncode == 0, up.stdout + up.stderr
        assert "authenticated" in up.stdout, up.stdout
        try:
            files = {
                h.name: json.load(open(os.path.join(h.install_dir, "run", "job.json")))
                for h in i.hosts
            }
            for h in workers:
                assert files[h.name]["auth_file"] == h.secret_file
                assert files[h.name]["mac"] == auth.default_mac_name()  # this host's
            assert files["agg"]["auth_file"] == "" and files["agg"]["mac"] == files["w0"]["mac"]
            # two workers of up's job, configured from their job files
            _job_file_workers(rack, workers, tmp_path, "up")

            r = cli(
                "run",
                "allreduce",
                "-i",
                path,
                "--auth",
                "--method",
                "lhc",
                "--elements",
                "30000",
                "--density",
                "0.05",
                "--seed",
                "3",
                "--runs-dir",
                str(runs_dir),
                "--json",
            )
            assert r.returncode == 0, r.stdout + r.stderr
            rep = json.loads(r.stdout)
            assert rep["auth"] is True and rep["exact"] is True, rep
            grads = [localrun.gradient(30000, 0.05, "random", 3, w) for w in range(2)]
            ref = localrun.reference(grads, localrun.DEFAULT_BLOCK).view(np.uint32)
            for w in range(2):
                got = np.load(os.path.join(rep["run_dir"], f"result-{w}.npy")).view(np.uint32)
                assert np.array_equal(got, ref)
            assert rep["counters"]["bad_mac"] == 0
            for h in workers:  # the run's folder, its secret with it, is gone
                assert os.listdir(os.path.join(h.install_dir, "run")) == ["job.json"]
        finally:
            down = cli("down", "-i", path)
    assert down.returncode == 0, down.stdout + down.stderr
    run_secrets = scan.grabbed
    assert len(run_secrets) == 1, "the run's secret file was never seen on w0"
    run_secret = run_secrets.pop()
    assert len(run_secret) == 64 and run_secret != secret.hex()
    for text in (secret.hex(), run_secret):
        assert not scan.holds(text), "a secret in a process's command line or environment"
        for out in (up, r, down):
            assert text not in out.stdout + out.stderr
        # every log and file written here and on the hosts (the rack shares this
        # machine's files), the secret files themselves aside
        assert _files_holding(str(tmp_path), text) == []
    # the provisioned secret stays where provision put it; up's run state is gone
    for h in workers:
        assert auth.load_secret(h.secret_file) == secret
        assert not os.path.exists(os.path.join(h.install_dir, "run"))


@pytest.mark.timeout(600)
def test_up_auth_without_a_provisioned_secret(rack, tmp_path):
    """`homagg up -i --auth` with no auth_secret in the inventory: a new
    secret on every worker host as INSTALL_DIR/run/job.secret (mode 0600,
    the same on each, none on the aggregator), named by that host's job
    file, and gone after `homagg down`; with auth_secret but no copy on the
    hosts, up names `homagg provision` as the fix before registering."""
    from homagg import auth

    path, i = make_testbed(rack, tmp_path)
    workers = [h for h in i.hosts if h.role == "worker"]
    up = cli("up", "-i", path, "--no-udp-csum", "--auth", "--mac", "blake2b")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        seen = set()
        for h in workers:
            f = os.path.join(h.install_dir, "run", "job.secret")
            assert os.stat(f).st_mode & 0o777 == 0o600
            seen.add(auth.load_secret(f))
            fields = json.load(open(os.path.join(h.install_dir, "run", "job.json")))
            assert fields["auth_file"] == f and fields["mac"] == "blake2b"
        assert len(seen) == 1 and seen.pop().hex() not in up.stdout + up.stderr
        assert not os.path.exists(os.path.join(i.host("agg").install_dir, "run", "job.secret"))
    finally:
        down = cli("down", "-i", path)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(os.path.exists(os.path.join(h.install_dir, "run")) for h in workers)

    (tmp_path / "p").mkdir()
    path, i = make_testbed(rack, tmp_path / "p", settings={"auth_secret": "job.secret"})
    auth.create_secret_file(tmp_path / "p" / "job.secret")
    up = cli("up", "-i", path, "--no-udp-csum", "--auth")
    try:
        assert up.returncode == 1, up.stdout + up.stderr
        assert "the job secret of 'auth_secret' is not in place" in up.stderr
        assert "secret/job.secret is missing" in up.stderr and "homagg provision" in up.stderr
        assert "homagg-switch up" not in up.stdout  # refused before anything started
    finally:
        down = cli("down", "-i", path)
    assert down.returncode == 0, down.stdout + down.stderr


@pytest.mark.timeout(900)
def test_rotate_key_on_inventory_hosts(rack, tmp_path):
    """`homagg rotate-key -i` after `homagg up -i --auth`: a new secret on
    every worker host (INSTALL_DIR/run/job-e1.secret, mode 0600, the same on
    each, none on the aggregator), every host's job file on key_epoch 1,
    workers configured from their job files exact against the reference
    (the aggregator took epoch 1 with that secret) and `homagg run allreduce
    -i --auth` exact afterwards; a second rotation inside the grace period
    is refused naming when it may run; the secret never shows in a
    command line, an environment, an output or a file written (a job
    without --auth: tests/test_rotate_key.py)."""
    from homagg import auth

    path, i = make_testbed(rack, tmp_path)
    workers = [h for h in i.hosts if h.role == "worker"]
    runs_dir = tmp_path / "runs"
    grab = os.path.join(str(tmp_path), "w0", "opt", "run", "job-e1.secret")
    with _ProcScan(grab) as scan:
        up = cli("up", "-i", path, "--no-udp-csum", "--auth")
        assert up.returncode == 0, up.stdout + up.stderr
        try:
            rot = cli("rotate-key", "-i", path, "--grace", "60", "--pickup", "0.5")
            assert rot.returncode == 0, rot.stdout + rot.stderr
            assert "key epoch 1 registered on agg" in rot.stdout, rot.stdout
            again = cli("rotate-key", "-i", path)
            assert again.returncode == 1, again.stdout + again.stderr
            assert "with a grace period of 60 s: the next rotation may run from" in again.stderr
            seen = set()
            for h in workers:
                f = os.path.join(h.install_dir, "run", "job-e1.secret")
                assert os.stat(f).st_mode & 0o777 == 0o600 and os.stat(f).st_uid == 0
                seen.add(auth.load_secret(f))
                fields = json.load(open(os.path.join(h.install_dir, "run", "job.json")))
                assert fields["auth_file"] == f and fields["key_epoch"] == 1
            assert len(seen) == 1
            secret = seen.pop()
            old = auth.load_secret(os.path.join(workers[0].install_dir, "run", "job.secret"))
            assert secret != old
            agg_dir = os.path.join(i.host("agg").install_dir, "run")
            agg_fields = json.load(open(os.path.join(agg_dir, "job.json")))
            assert agg_fields["key_epoch"] == 1 and agg_fields["auth_file"] == ""
            assert not os.path.exists(os.path.join(agg_dir, "job-e1.secret"))
            # workers of up's job from their job files: the aggregator has epoch 1's key
            _job_file_workers(rack, workers, tmp_path, "rk")
            run = cli(
                "run", "allreduce", "-i", path, "--auth", "--method", "dense", "--elements", "30000",
                "--density", "0.05", "--seed", "3", "--runs-dir", str(runs_dir), "--json",
            )  # fmt: skip
            assert run.returncode == 0, run.stdout + run.stderr
            rep = json.loads(run.stdout)
            assert rep["exact"] is True and rep["counters"]["bad_mac"] == 0, rep
            grads = [localrun.gradient(30000, 0.05, "random", 3, w) for w in range(2)]
            ref = localrun.reference(grads, localrun.DEFAULT_BLOCK).view(np.uint32)
            for w in range(2):
                got = np.load(os.path.join(rep["run_dir"], f"result-{w}.npy")).view(np.uint32)
                assert np.array_equal(got, ref)
        finally:
            down = cli("down", "-i", path)
    assert down.returncode == 0, down.stdout + down.stderr
    assert scan.grabbed == {secret.hex()}
    assert not scan.holds(secret.hex()), "the secret in a process's command line or environment"
    for out in (up, rot, again, run, down):
        assert secret.hex() not in out.stdout + out.stderr
    assert _files_holding(str(tmp_path), secret.hex()) == []


def _job_file_workers(rack, workers, tmp_path, tag):
    """A Worker on each worker host of the rack from that host's job file
    (helpers.job_file_workers_exact): each sum bit-exact."""
    job_file_workers_exact(
        rack.tb,
        [h.name for h in workers],
        [os.path.join(h.install_dir, "run", "job.json") for h in workers],
        tmp_path,
        tag,
    )


@pytest.mark.timeout(900)
def test_up_a_standing_tree_with_auth_and_rotate_its_keys(rack2, tmp_path):
    """`homagg up -i --leaves 1 --auth`: agg a leaf below agg1, the root.
    Every worker host's job file names the leaf, its place there and the
    leaf's own secret (INSTALL_DIR/run/leaf-0.secret, mode 0600); no
    aggregator host holds a secret file, no job file names one there.
    Workers made from their job files are exact against the reference;
    `homagg rotate-key -i` gives the leaf a new secret (leaf-0-e1.secret)
    and the root a new one, every level on epoch 1, and the workers are
    exact again; `homagg train -i --auth` (a tree by default there)
    trains exactly on that standing tree and leaves it registered; the new secret shows in
    no process listing, output or other file.  An inventory whose
    aggregators do not make the tree is refused before any host is
    touched."""
    from homagg import auth

    path, i = make_testbed(rack2, tmp_path)
    workers = [h for h in i.hosts if h.role == "worker"]
    aggs = [h for h in i.hosts if h.role == "aggregator"]
    bad = cli("up", "-i", path, "--no-udp-csum", "--leaves", "2")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "names 2 aggregator host(s); a standing tree of 2 leaves takes 3" in bad.stderr
    assert "give --leaves 1" in bad.stderr
    assert not os.path.exists(os.path.join(aggs[0].install_dir, "run", "switch.pid"))
    grab = os.path.join(str(tmp_path), "w0", "opt", "run", "leaf-0-e1.secret")
    with _ProcScan(grab) as scan:
        up = cli("up", "-i", path, "--no-udp-csum", "--leaves", "1", "--auth")
        assert up.returncode == 0, up.stdout + up.stderr
        try:
            assert "a tree of 1 leaves agg (2 workers) below the root agg1" in up.stdout
            first = None
            for k, h in enumerate(workers):
                f = json.load(open(os.path.join(h.install_dir, "run", "job.json")))
                secret_file = os.path.join(h.install_dir, "run", "leaf-0.secret")
                assert f["aggregator"] == f"{aggs[0].address}:{localrun.UDP_PORT}", f
                assert f["leaf_ids"] == [k, 2] and f["bind"] == h.address, f
                assert f["auth_file"] == secret_file and f["mac"], f
                assert os.stat(secret_file).st_mode & 0o777 == 0o600
                first = first or auth.load_secret(secret_file)
                assert auth.load_secret(secret_file) == first  # one leaf: one secret
            for h in aggs:
                f = json.load(open(os.path.join(h.install_dir, "run", "job.json")))
                assert f["auth_file"] == "" and f["job"] == first_job(workers), f
                assert not [n for n in os.listdir(os.path.join(h.install_dir, "run"))
                            if n.endswith(".secret")]  # fmt: skip
            _job_file_workers(rack2, workers, tmp_path, "tree0")
            rot = cli("rotate-key", "-i", path, "--grace", "60", "--pickup", "0.5")
            assert rot.returncode == 0, rot.stdout + rot.stderr
            assert "key epoch 1 registered on agg below the root agg1" in rot.stdout, rot.stdout
            seen = set()
            for h in workers:
                new = os.path.join(h.install_dir, "run", "leaf-0-e1.secret")
                assert os.stat(new).st_mode & 0o777 == 0o600
                seen.add(auth.load_secret(new))
                f = json.load(open(os.path.join(h.install_dir, "run", "job.json")))
                assert f["auth_file"] == new and f["key_epoch"] == 1, f
            assert len(seen) == 1
            secret = seen.pop()
            assert secret != first
            for h in aggs:
                f = json.load(open(os.path.join(h.install_dir, "run", "job.json")))
                assert f["key_epoch"] == 1 and f["auth_file"] == "", f
            _job_file_workers(rack2, workers, tmp_path, "tree1")
            # `homagg train -i --auth` is a tree of the standing tree's leaves
            # by default and takes that job at its epoch (each leaf's secret
            # read from its workers' hosts), registered again afterwards
            tr = cli(
                "train", "-i", path, "--model", tiny_model(tmp_path), "--method", "lhc",
                "--steps", "2", "--warmup", "1", "--no-baseline", "--auth",
                "--runs-dir", str(tmp_path / "runs"), "--json",
            )  # fmt: skip
            assert tr.returncode == 0, tr.stdout + tr.stderr
            rep = json.loads(tr.stdout)
            check_train(rep)
            assert rep["leaves"] == 1 and rep["aggregator_hosts"] == ["agg", "agg1"], rep
            assert rep["job"] == first_job(workers) and rep["auth"] is True, rep
            assert rep["job_file"] == os.path.join(workers[0].install_dir, "run", "job.json")
            _job_file_workers(rack2, workers, tmp_path, "tree2")
        finally:
            down = cli("down", "-i", path)
    assert down.returncode == 0, down.stdout + down.stderr
    assert scan.grabbed == {secret.hex()}
    assert not scan.holds(secret.hex()), "the secret in a process's command line or environment"
    for out in (up, rot, tr, down):
        assert secret.hex() not in out.stdout + out.stderr
    assert _files_holding(str(tmp_path), secret.hex()) == []


def first_job(workers):
    """The job id the first worker host's job file names."""
    return json.load(open(os.path.join(workers[0].install_dir, "run", "job.json")))["job"]
