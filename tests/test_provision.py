"""Inventory validation, `homagg provision` and the Ansible playbook against
real sshd hosts (one network namespace each, tests/sshrack.py).

The emulated hosts share this machine's filesystem, so every test installs
into its own tmp directory ('{name}' in install_dir gives each host its own).
Hardware steps are honest here: the aggregator uses an af_packet vdev (nothing
to bind), and hugepages are reserved for real (8 x 2 MiB) when
/proc/sys/vm/nr_hugepages is writable, the previous value restored after.
"""

import os
import re
import subprocess
import sys

import pytest

from helpers import require

from homagg.deploy.remote import inventory as inv
from homagg.deploy.remote import provision as prov
from sshrack import host_table, running_rack, to_toml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_BIN = os.path.dirname(sys.executable)
HP_SYSFS = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
HP_COUNT = 8


# --------------------------------------------------------------------------
# Inventory (no root)


def _valid_hosts(key):
    return [
        {
            "name": "agg",
            "ssh_host": "10.0.0.1",
            "ssh_key": key,
            "role": "aggregator",
            "pci": "0000:3b:00.0",
            "driver": "vfio-pci",
            "dataplane_ip": "10.10.0.1/24",
            "cores": "2-3",
            "hugepages": {"count": 1024, "size": "2M"},
        },
        {
            "name": "w1",
            "ssh_host": "10.0.0.11",
            "ssh_key": key,
            "role": "worker",
            "iface": "eth1",
            "dataplane_ip": "10.10.0.11/24",
            "cores": [1],
        },
    ]


def test_inventory_valid(tmp_path):
    key = tmp_path / "k"
    key.write_text("x")
    path = tmp_path / "t.toml"
    path.write_text(to_toml({"install_dir": "/opt/homagg"}, _valid_hosts(str(key))))
    i = inv.load(str(path))
    assert [h.name for h in i.hosts] == ["agg", "w1"]
    agg = i.host("agg")
    assert agg.cores == (2, 3) and agg.hugepages == inv.Hugepages(1024, "2M")
    assert agg.dataplane_kind == "pci" and agg.driver == "vfio-pci" and agg.ssh_port == 22
    assert i.host("w1").kernel_iface == "eth1" and i.host("w1").install_dir == "/opt/homagg"
    assert i.settings.connect_timeout == 10.0


def test_inventory_auth_secret_is_a_path_never_the_secret(tmp_path):
    """``auth_secret`` names the job secret's file here (relative to the
    inventory); the generated Ansible inventory carries that path and each
    worker's host path, never the secret; the file is created mode 0600
    when missing, and a group-readable one or a directory is refused."""
    import io
    import tarfile

    from homagg import auth
    from homagg.deploy.remote import ansible_inventory
    from homagg.errors import SecretFileError

    key = tmp_path / "k"
    key.write_text("x")
    path = tmp_path / "t.toml"
    path.write_text(
        to_toml(
            {"install_dir": "/opt/hg/{name}", "pip_index": True, "auth_secret": "sec/job.secret"},
            _valid_hosts(str(key)),
        )
    )
    i = inv.load(str(path))
    local = str(tmp_path / "sec" / "job.secret")
    assert i.settings.auth_secret == local
    assert i.host("w1").secret_file == "/opt/hg/w1/secret/job.secret"
    sdist = tmp_path / "homagg-0.tar.gz"
    with tarfile.open(sdist, "w:gz") as t:
        info = tarfile.TarInfo("homagg-0/setup.py")
        t.addfile(info, io.BytesIO(b""))
    data = ansible_inventory.generate(i, artifact=str(sdist), outdir=str(tmp_path / "out"))
    assert os.stat(local).st_mode & 0o777 == 0o600
    secret = auth.load_secret(local)
    assert data["all"]["vars"]["homagg_auth_secret"] == local
    hosts = data["all"]["children"]
    assert hosts["worker"]["hosts"]["w1"]["homagg_secret_file"] == "/opt/hg/w1/secret/job.secret"
    assert hosts["aggregator"]["hosts"]["agg"]["homagg_secret_file"] == ""
    assert secret.hex() not in repr(data) and secret.hex() not in path.read_text()
    os.chmod(local, 0o640)
    with pytest.raises(SecretFileError, match=r"chmod 600"):
        ansible_inventory.generate(i, artifact=str(sdist), outdir=str(tmp_path / "out"))
    path.write_text(to_toml({"auth_secret": "sec"}, _valid_hosts(str(key))))
    with pytest.raises(inv.InventoryError, match=r"field 'auth_secret' .* is a directory"):
        inv.load(str(path))


def test_inventory_collects_every_error(tmp_path):
    key = tmp_path / "k"
    key.write_text("x")
    hosts = _valid_hosts(str(key))
    hosts[0]["pci"] = "3b:00.0"
    hosts[0]["hugepages"] = {"count": -1, "size": "4M"}
    hosts[1]["role"] = "wroker"
    hosts[1]["vdev"] = "net_af_packet0,iface=eth1"  # and iface: two kinds
    hosts[1]["ssh_key"] = str(tmp_path / "nokey")
    hosts[1]["dataplane_ip"] = "10.10.0.300/24"
    hosts.append(
        {
            "name": "w2",
            "ssh_host": "10.0.0.12",
            "ssh_key": str(key),
            "role": "worker",
            "iface": "eth1",
            "dataplane_ip": "10.10.0.1/24",
            "cores": "x",
            "colour": "red",
        }
    )
    path = tmp_path / "t.toml"
    path.write_text(to_toml({"install_dir": "relative", "connect_timeout": 0}, hosts))
    with pytest.raises(inv.InventoryError) as ei:
        inv.load(str(path))
    msg = str(ei.value)
    probs = ei.value.problems
    expect = [
        "host 'agg': field 'pci' = '3b:00.0': must be a full PCI address",
        "host 'agg': field 'hugepages.count' = -1",
        "host 'agg': field 'hugepages.size' = '4M': must be '2M' or '1G'",
        "host 'w1': field 'role' = 'wroker': must be 'aggregator' or 'worker'",
        "host 'w1': field 'pci/vdev/iface' = 'vdev, iface': give exactly one",
        "host 'w1': field 'ssh_key'",
        "host 'w1': field 'dataplane_ip' = '10.10.0.300/24'",
        "host 'w2': field 'cores' = 'x'",
        "host 'w2': field 'colour' = 'red': unknown field",
        "[settings]: field 'install_dir' = 'relative': must be an absolute path",
        "[settings]: field 'connect_timeout' = 0",
        "hosts 'agg', 'w2': field 'dataplane_ip' = '10.10.0.1'",
    ]
    for e in expect:
        assert any(p.startswith(e) for p in probs), (e, probs)
    assert "ssh-keygen" in msg and len(probs) == len(expect)


def test_inventory_mtu(tmp_path):
    """mtu per host: 1500 by default, 576..9000, one value for the segment;
    the aggregator's daemon and its af_packet vdev follow it."""
    from homagg.deploy.remote import hosts as remote

    key = tmp_path / "k"
    key.write_text("x")
    path = tmp_path / "t.toml"
    hosts = _valid_hosts(str(key))
    path.write_text(to_toml({}, hosts))
    assert [h.mtu for h in inv.load(str(path)).hosts] == [1500, 1500]
    # a NIC's ring for W x S frames in flight: --rx-ring, a power of two
    argv = remote.switch_argv(inv.load(str(path)).host("agg"), "s", "/mnt/{name}", frames=1500)
    assert argv[argv.index("--rx-ring") + 1] == "2048"
    for h in hosts:
        h["mtu"] = 9000
    hosts[0].pop("pci"), hosts[0].pop("driver")
    hosts[0]["vdev"] = "net_af_packet0,iface=eth1"
    path.write_text(to_toml({}, hosts))
    i = inv.load(str(path))
    assert [h.mtu for h in i.hosts] == [9000, 9000]
    argv = remote.switch_argv(i.host("agg"), "homagg-switch", "/mnt/{name}")
    assert "net_af_packet0,iface=eth1,framesz=9216,blocksz=36864,framecnt=512" in argv
    # a ring for the job's W x S frames in flight (4 per block of 36864)
    argv = remote.switch_argv(i.host("agg"), "homagg-switch", "/mnt/{name}", frames=4 * 257)
    assert "net_af_packet0,iface=eth1,framesz=9216,blocksz=36864,framecnt=1028" in argv
    assert "--rx-ring" not in argv
    assert argv[argv.index("--mtu") + 1] == "9000"
    assert "mtu = 9000" in prov.host_config(i.host("agg"), i, "/src")

    hosts[0]["mtu"] = 9001
    hosts[1]["mtu"] = "jumbo"
    path.write_text(to_toml({}, hosts))
    with pytest.raises(inv.InventoryError) as ei:
        inv.load(str(path))
    probs = ei.value.problems
    assert any(
        p.startswith(
            "host 'agg': field 'mtu' = 9001: must be the MTU of the host's "
            "data-plane link, an integer 576..9000"
        )
        for p in probs
    ), probs
    assert any(p.startswith("host 'w1': field 'mtu' = 'jumbo'") for p in probs), probs
    hosts[0]["mtu"], hosts[1]["mtu"] = 9000, 1500
    path.write_text(to_toml({}, hosts))
    with pytest.raises(inv.InventoryError) as ei:
        inv.load(str(path))
    assert ei.value.problems == [
        "field 'mtu': hosts of one data-plane subnet have different MTUs (1500: 'w1'; "
        "9000: 'agg'): give every host the same mtu (the link's)"
    ]


def test_inventory_missing_and_syntax(tmp_path):
    with pytest.raises(inv.InventoryError, match="not found"):
        inv.load(str(tmp_path / "none.toml"))
    p = tmp_path / "bad.toml"
    p.write_text("[settings\n")
    with pytest.raises(inv.InventoryError, match="not valid TOML"):
        inv.load(str(p))
    p.write_text("[settings]\n")
    with pytest.raises(inv.InventoryError, match="no hosts"):
        inv.load(str(p))


def test_docs_example_is_valid(tmp_path):
    """The complete example in docs/INVENTORY.md parses (its key and sdist
    paths are made to exist)."""
    text = open(os.path.join(REPO, "docs", "INVENTORY.md")).read()
    block = re.search(r"```toml\n(.*?)```", text, re.S).group(1)
    data = __import__("tomllib").loads(block)
    key = tmp_path / "id"
    key.write_text("x")
    sdist = tmp_path / "homagg-0.1.0.tar.gz"
    sdist.write_text("x")
    data["settings"]["project"] = str(sdist)
    for h in data["hosts"]:
        h["ssh_key"] = str(key)
    i = inv.parse(data, str(tmp_path / "testbed.toml"))
    assert {h.dataplane_kind for h in i.hosts} == {"pci", "vdev", "iface"}


# --------------------------------------------------------------------------
# Against real sshd hosts


@pytest.fixture(scope="module")
def rack(tmp_path_factory):
    require(os.geteuid() == 0, "needs root")
    with running_rack(tmp_path_factory.mktemp("rack")) as r:
        yield r


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    return prov.build_sdist(str(tmp_path_factory.mktemp("sdist")))


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory):
    """The dependencies as wheels: the emulated hosts have no route to a
    package index (as many racks), so pip installs from this copy."""
    return prov.build_wheelhouse(str(tmp_path_factory.mktemp("wheels")))


@pytest.fixture(scope="module")
def hugepages():
    """HP_COUNT when the reservation can be changed here (the previous value
    is restored afterwards), else 0 (the step then reports 'none requested')."""
    try:
        before = int(open(HP_SYSFS).read())
        with open(HP_SYSFS, "w") as f:
            f.write(str(before))
    except OSError:
        yield 0
        return
    try:
        yield HP_COUNT
    finally:
        with open(HP_SYSFS, "w") as f:
            f.write(str(before))


def make_inventory(rack, tmp, sdist, hugepages, wheelhouse=None, **host_overrides):
    hosts = []
    for h in rack.hosts():
        extra = {"hugepages": {"count": hugepages, "size": "2M"}} if h.role == "aggregator" else {}
        extra.update(host_overrides.get(h.name, {}))
        hosts.append(host_table(h, rack.key, os.path.join(str(tmp), "{name}", "opt"), **extra))
    settings = {
        "project": sdist,
        "config_file": os.path.join(str(tmp), "{name}", "etc", "host.toml"),
        "hugepages_mount": os.path.join(str(tmp), "{name}", "hugepages"),
        "connect_timeout": 15,
        "command_timeout": 900,
    }
    if wheelhouse:
        settings["wheelhouse"] = wheelhouse
    path = os.path.join(str(tmp), "testbed.toml")
    with open(path, "w") as f:
        f.write(to_toml(settings, hosts))
    return path


def cli(*args, timeout=900):
    return subprocess.run(
        [os.path.join(VENV_BIN, "homagg"), *args], capture_output=True, text=True, timeout=timeout
    )


def table(stdout):
    """{(host, step): status} from the report table."""
    out = {}
    for ln in stdout.splitlines():
        m = re.match(r"^(\S+)\s+(\S+)\s+(changed|ok|failed|would change|skipped)\s", ln + " ")
        if m:
            out[(m.group(1), m.group(2))] = m.group(3)
    return out


@pytest.mark.root
@pytest.mark.netns
@pytest.mark.ssh
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_provision_twice_then_partial_failure(rack, sdist, wheelhouse, hugepages, tmp_path):
    path = make_inventory(rack, tmp_path, sdist, hugepages, wheelhouse)
    names = [h.name for h in rack.hosts()]

    dry = cli("provision", "-i", path, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    t = table(dry.stdout)
    for n in names:
        assert t[(n, "venv")] == "would change" and t[(n, "config")] == "would change"
        assert not os.path.exists(os.path.join(tmp_path, n)), "a dry run changed a host"

    first = cli("provision", "-i", path)
    assert first.returncode == 0, first.stdout + first.stderr
    t = table(first.stdout)
    for n in names:
        for step in ("venv", "upload", "wheels", "build", "install", "config"):
            assert t[(n, step)] == "changed", (n, step, first.stdout)
        assert t[(n, "os")] == "ok" and t[(n, "nic_bind")] == "ok"
    assert "vdev, nothing to bind" in first.stdout
    if hugepages:
        assert t[("agg", "hugepages")] in ("changed", "ok")
        assert int(open(HP_SYSFS).read()) >= hugepages
        assert t[("agg", "hugetlbfs")] == "changed"
    # what the hosts got is real: the package imports and its C extension works
    for n in names:
        py = os.path.join(tmp_path, n, "opt", "venv", "bin", "python")
        r = subprocess.run(
            [py, "-c", "import homagg, homagg._hg as m; print(homagg.__file__)"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0 and str(tmp_path) in r.stdout, r.stderr
        conf = inv.tomllib.loads(open(os.path.join(tmp_path, n, "etc", "host.toml")).read())
        assert conf["host"]["name"] == n and len(conf["peers"]) == len(names)
    switch_srcs = os.path.isdir(os.path.join(REPO, "dataplane_c", "dpdk"))
    src = [d for d in os.listdir(os.path.join(tmp_path, "agg", "opt", "src"))][0]
    assert (
        os.path.exists(
            os.path.join(tmp_path, "agg", "opt", "src", src, "build", "release", "homagg-switch")
        )
        == switch_srcs
    )

    second = cli("provision", "-i", path)
    assert second.returncode == 0, second.stdout + second.stderr
    t = table(second.stdout)
    assert set(t.values()) == {"ok"}, second.stdout
    for n in names:
        assert f"{n}: changed=0 ok={len(prov.STEPS)} failed=0" in second.stdout

    # a step failing on one host: the others still run and are reported
    bad = make_inventory(rack, tmp_path, sdist, hugepages, wheelhouse, w1={"iface": "eth9"})
    third = cli("provision", "-i", bad)
    assert third.returncode == 1
    t = table(third.stdout)
    assert t[("w1", "nic_bind")] == "failed" and t[("w1", "config")] == "skipped"
    assert all(t[(n, s)] == "ok" for n in names if n != "w1" for s in prov.STEPS)
    assert "host 'w1': step 'nic_bind': interface eth9 does not exist" in third.stderr

    # --hosts selects
    sel = cli("provision", "-i", path, "--hosts", "w0")
    assert sel.returncode == 0 and {h for h, _ in table(sel.stdout)} == {"w0"}

    # the inventory's mtu goes onto every data-plane kernel interface (the
    # agg's vdev iface= too), and back (a smaller one: these links carry SSH)
    def link_mtu(h):
        p = rack.tb.run_in(
            h.name, ["cat", f"/sys/class/net/{h.ifname}/mtu"], stdout=subprocess.PIPE, text=True
        )
        return int(p.communicate(timeout=10)[0])

    for mtu in (1400, 1500):
        inventory = make_inventory(
            rack, tmp_path, sdist, hugepages, wheelhouse, **{n: {"mtu": mtu} for n in names}
        )
        r = cli("provision", "-i", inventory)
        assert r.returncode == 0, r.stdout + r.stderr
        t = table(r.stdout)
        for h in rack.hosts():
            assert t[(h.name, "mtu")] == "changed", r.stdout
            assert link_mtu(h) == mtu


@pytest.mark.root
@pytest.mark.netns
@pytest.mark.ssh
@pytest.mark.timeout(300)
def test_preflight_names_every_bad_host(rack, sdist, tmp_path):
    hosts = rack.hosts()
    path = make_inventory(
        rack, tmp_path, sdist, 0, w0={"ssh_key": rack.wrong_key}, w1={"ssh_host": rack.unused_ip}
    )
    with pytest.raises(prov.PreflightError) as ei:
        prov.provision(inv.load(path), out=open(os.devnull, "w"))
    e = ei.value
    failed = {h: (step, detail) for h, step, detail, _ in e.failures}
    assert set(failed) == {"w0", "w1"}
    assert "was refused" in failed["w0"][1] and "authorized_keys" in failed["w0"][1]
    assert rack.unused_ip in failed["w1"][1] and "check 'ssh_host'" in failed["w1"][1]
    # the healthy host is reported too, and nothing was changed anywhere
    assert e.reports["agg"][0].status == "ok" and "Debian" in e.reports["agg"][0].detail
    assert not any(os.path.exists(os.path.join(tmp_path, h.name)) for h in hosts)
    r = cli("provision", "-i", path)
    assert r.returncode == 1
    assert "host 'w0': step 'preflight'" in r.stderr and "host 'w1': step 'preflight'" in r.stderr
    assert re.search(r"^agg\s+preflight\s+ok", r.stdout, re.M)


def test_cli_reports_inventory_errors(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text(
        to_toml(
            {},
            [
                {
                    "name": "w2",
                    "ssh_host": "h",
                    "ssh_key": "/nonexistent",
                    "role": "wroker",
                    "iface": "eth1",
                    "dataplane_ip": "10.0.0.2/24",
                    "cores": [0],
                }
            ],
        )
    )
    r = cli("provision", "-i", str(path), "--dry-run", timeout=60)
    assert r.returncode == 1
    assert "host 'w2': field 'role' = 'wroker': must be 'aggregator' or 'worker'" in r.stderr
    assert "host 'w2': field 'ssh_key'" in r.stderr


def changed_tasks(stdout):
    """[(task, host)] of every task Ansible reported as changed."""
    out, task = [], None
    for ln in stdout.splitlines():
        m = re.match(r"^TASK \[(.*)\]", ln)
        if m:
            task = m.group(1)
        m = re.match(r"^changed: \[([^\]]+)\]", ln)
        if m:
            out.append((task, m.group(1)))
    return out


def recap(stdout):
    """{host: {"ok": n, "changed": n, "failed": n, "unreachable": n}} from PLAY RECAP."""
    out = {}
    for m in re.finditer(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$", stdout, re.M):
        out[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return out


@pytest.mark.root
@pytest.mark.netns
@pytest.mark.ssh
@pytest.mark.slow
@pytest.mark.timeout(1500)  # two playbook runs build on every host: ~15 min on 2 busy cores
def test_ansible_playbook_twice(rack, sdist, wheelhouse, hugepages, tmp_path):
    path = make_inventory(rack, tmp_path, sdist, hugepages, wheelhouse)
    gen = cli("ansible-inventory", "-i", path, "--outdir", str(tmp_path / "out"), timeout=300)
    assert gen.returncode == 0, gen.stderr
    hosts_yml = tmp_path / "hosts.yml"
    hosts_yml.write_text(gen.stdout)
    import yaml

    data = yaml.safe_load(gen.stdout)
    assert set(data["all"]["children"]["aggregator"]["hosts"]) == {"agg"}
    assert set(data["all"]["children"]["worker"]["hosts"]) == {"w0", "w1"}
    env = dict(
        os.environ,
        ANSIBLE_HOST_KEY_CHECKING="False",
        ANSIBLE_HOME=str(tmp_path / "ah"),
        # no persistent master connections: nothing may outlive the test
        ANSIBLE_SSH_ARGS="-o UserKnownHostsFile=/dev/null -o ControlMaster=no",
        ANSIBLE_CONFIG=os.path.join(REPO, "ansible", "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
    )
    play = [
        os.path.join(VENV_BIN, "ansible-playbook"),
        "-i",
        str(hosts_yml),
        os.path.join(REPO, "ansible", "site.yml"),
    ]
    names = [h.name for h in rack.hosts()]
    first = subprocess.run(play, capture_output=True, text=True, env=env, timeout=800)
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-3000:]
    r1 = recap(first.stdout)
    assert set(r1) == set(names)
    for n in names:
        assert r1[n]["failed"] == 0 and r1[n]["unreachable"] == 0 and r1[n]["changed"] >= 5, r1
        py = os.path.join(tmp_path, n, "opt", "venv", "bin", "python")
        r = subprocess.run(
            [py, "-c", "import homagg._hg"], capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0, r.stderr
        conf = inv.tomllib.loads(open(os.path.join(tmp_path, n, "etc", "host.toml")).read())
        assert conf["host"]["role"] == ("aggregator" if n == "agg" else "worker")
    assert os.path.exists(
        os.path.join(
            tmp_path, "agg", "opt", "src", "homagg-0.1.0", "build", "release", "homagg-switch"
        )
    )
    assert "vdev, nothing to bind" in first.stdout
    second = subprocess.run(play, capture_output=True, text=True, env=env, timeout=800)
    assert second.returncode == 0, second.stdout[-6000:] + second.stderr[-3000:]
    r2 = recap(second.stdout)
    assert set(r2) == set(names)
    for n in names:
        assert r2[n]["changed"] == 0 and r2[n]["failed"] == 0 and r2[n]["ok"] > 5, (
            n,
            r2,
            changed_tasks(second.stdout),
        )
    # provision over the Ansible-built hosts agrees on the config it would write
    t = table(cli("provision", "-i", path, "--dry-run").stdout)
    assert all(t[(n, "config")] == "ok" for n in names)


@pytest.mark.timeout(600)
def test_ansible_places_the_job_secret(rack, tmp_path):
    """The playbook's job secret tasks (ansible/roles/homagg/tasks/secret.yml)
    on the sshd rack: the inventory's auth_secret copied to every worker host
    with mode 0600 in a folder of mode 0700, none on the aggregator, the
    secret in neither the generated inventory nor Ansible's output; a second
    run changes nothing."""
    import io
    import tarfile

    import yaml

    from homagg import auth

    hosts = [
        host_table(h, rack.key, os.path.join(str(tmp_path), "{name}", "opt")) for h in rack.hosts()
    ]
    path = tmp_path / "testbed.toml"
    path.write_text(
        to_toml({"auth_secret": "job.secret", "pip_index": True, "connect_timeout": 15}, hosts)
    )
    sdist = tmp_path / "homagg-0.tar.gz"
    with tarfile.open(sdist, "w:gz") as t:
        t.addfile(tarfile.TarInfo("homagg-0/setup.py"), io.BytesIO(b""))
    gen = cli("ansible-inventory", "-i", str(path), "--artifact", str(sdist), timeout=120)
    assert gen.returncode == 0, gen.stderr
    secret = auth.load_secret(tmp_path / "job.secret")  # created by ansible-inventory
    assert secret.hex() not in gen.stdout
    (tmp_path / "hosts.yml").write_text(gen.stdout)
    play = tmp_path / "secret.yml"
    play.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "all",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "ansible.builtin.import_tasks": os.path.join(
                                REPO, "ansible", "roles", "homagg", "tasks", "secret.yml"
                            )
                        }
                    ],
                }
            ]
        )
    )
    env = dict(
        os.environ,
        ANSIBLE_HOST_KEY_CHECKING="False",
        ANSIBLE_HOME=str(tmp_path / "ah"),
        ANSIBLE_SSH_ARGS="-o UserKnownHostsFile=/dev/null -o ControlMaster=no",
        ANSIBLE_CONFIG=os.path.join(REPO, "ansible", "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_LOG_PATH=str(tmp_path / "a.log"),
    )
    argv = [
        os.path.join(VENV_BIN, "ansible-playbook"),
        "-v",
        "-i",
        str(tmp_path / "hosts.yml"),
        str(play),
    ]
    names = [h.name for h in rack.hosts()]
    runs = [
        subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300) for _ in range(2)
    ]
    for k, r in enumerate(runs):
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
        rc = recap(r.stdout)
        assert set(rc) == set(names) and all(v["failed"] == 0 for v in rc.values()), rc
        if k == 1:
            assert all(v["changed"] == 0 for v in rc.values()), changed_tasks(r.stdout)
        assert secret.hex() not in r.stdout + r.stderr
    assert secret.hex() not in (tmp_path / "a.log").read_text()
    for h in rack.hosts():
        f = os.path.join(str(tmp_path), h.name, "opt", "secret", "job.secret")
        if h.role == "aggregator":
            assert not os.path.exists(f)
            continue
        st = os.stat(f)
        assert st.st_mode & 0o777 == 0o600 and st.st_uid == 0, oct(st.st_mode)
        assert os.stat(os.path.dirname(f)).st_mode & 0o777 == 0o700
        assert auth.load_secret(f) == secret
