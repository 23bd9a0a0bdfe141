"""Inventory fields of the metrics endpoint (metrics_port, metrics_bind):
checked with a fix per field, carried to the Ansible inventory."""

import pytest

from homagg.deploy.remote import ansible_inventory
from homagg.deploy.remote import inventory as inv

from sshrack import to_toml


def _hosts(key, **agg):
    return [
        {
            "name": "agg",
            "ssh_host": "10.0.0.1",
            "ssh_key": key,
            "role": "aggregator",
            "vdev": "net_af_packet0,iface=eth1",
            "dataplane_ip": "10.10.0.1/24",
            "cores": [1],
            **agg,
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


def _load(tmp_path, hosts):
    path = tmp_path / "t.toml"
    path.write_text(to_toml({"install_dir": "/opt/homagg"}, hosts))
    return inv.load(str(path))


def test_metrics_fields_default_set_and_to_ansible(tmp_path):
    key = tmp_path / "k"
    key.write_text("x")
    i = _load(tmp_path, _hosts(str(key)))
    assert (i.host("agg").metrics_port, i.host("agg").metrics_bind) == (0, "127.0.0.1")
    i = _load(tmp_path, _hosts(str(key), metrics_port=9477, metrics_bind="0.0.0.0"))
    assert (i.host("agg").metrics_port, i.host("agg").metrics_bind) == (9477, "0.0.0.0")
    whl = tmp_path / "homagg-0-py3-none-any.whl"
    whl.write_bytes(b"")
    hv = ansible_inventory.generate(i, artifact=str(whl), wheelhouse=str(tmp_path))
    agg = hv["all"]["children"]["aggregator"]["hosts"]["agg"]
    assert (agg["homagg_metrics_port"], agg["homagg_metrics_bind"]) == (9477, "0.0.0.0")


@pytest.mark.parametrize(
    "field, value, where, fix",
    [
        ("metrics_port", 70000, "agg", "must be the TCP port"),
        ("metrics_port", "x", "agg", "must be the TCP port"),
        ("metrics_bind", "localhost", "agg", "must be the IPv4 address"),
        ("metrics_port", 9477, "w1", "only an aggregator runs homagg exporter"),
    ],
)
def test_metrics_fields_refused_with_the_fix(tmp_path, field, value, where, fix):
    key = tmp_path / "k"
    key.write_text("x")
    hosts = _hosts(str(key))
    hosts[0 if where == "agg" else 1][field] = value
    with pytest.raises(inv.InventoryError) as e:
        _load(tmp_path, hosts)
    assert e.value.problems == [
        f"host '{where}': field '{field}' = {value!r}: " + e.value.problems[0].split(": ", 2)[2]
    ]
    assert fix in e.value.problems[0]


def _free_port():
    """A free TCP port of 127.0.0.1 below the kernel's ephemeral range
    (net.ipv4.ip_local_port_range starts at 32768): no connection made
    meanwhile is given it before the exporter binds it."""
    import os
    import random
    import socket

    for port in random.Random(os.getpid()).sample(range(20000, 32000), 500):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free TCP port in 20000-31999 on 127.0.0.1")


def test_exporter_unit_as_the_playbook_renders_it_verifies_and_serves(tmp_path):
    """The exporter role's systemd unit, rendered from the Ansible inventory
    `homagg ansible-inventory` makes (the template and the host's variables
    as the playbook passes them), passes `systemd-analyze verify` (its
    ExecStart exists, every directive parses), and its ExecStart line, run
    as systemd would run it, serves Prometheus metrics: `homagg_up 0` for
    the host while no daemon answers on the control socket."""
    import os
    import shlex
    import shutil
    import subprocess
    import sys
    import time
    import urllib.request

    import jinja2

    systemd_analyze = shutil.which("systemd-analyze")
    assert systemd_analyze, "systemd-analyze is missing (package systemd)"
    key = tmp_path / "k"
    key.write_text("x")
    install = tmp_path / "opt"
    (install / "venv" / "bin").mkdir(parents=True)
    # the install's virtual environment: this one's interpreter, its
    # pyvenv.cfg and its site-packages (which import homagg)
    import sysconfig

    os.symlink(sys.executable, install / "venv" / "bin" / "python")
    shutil.copy(os.path.join(sys.prefix, "pyvenv.cfg"), install / "venv" / "pyvenv.cfg")
    site = sysconfig.get_paths()["purelib"]
    rel = os.path.relpath(site, sys.prefix)
    (install / "venv" / rel).parent.mkdir(parents=True)
    os.symlink(site, install / "venv" / rel)
    port = _free_port()
    path = tmp_path / "t.toml"
    path.write_text(to_toml({"install_dir": str(install)}, _hosts(str(key), metrics_port=port)))
    i = inv.load(str(path))
    whl = tmp_path / "homagg-0-py3-none-any.whl"
    whl.write_bytes(b"")
    hv = ansible_inventory.generate(i, artifact=str(whl), wheelhouse=str(tmp_path))
    agg = dict(hv["all"].get("vars", {}), **hv["all"]["children"]["aggregator"]["hosts"]["agg"])
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tpl = os.path.join(repo, "ansible", "roles", "exporter", "templates")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(tpl), undefined=jinja2.StrictUndefined)
    text = env.get_template("homagg-exporter.service.j2").render(inventory_hostname="agg", **agg)
    unit = tmp_path / "homagg-exporter.service"
    unit.write_text(text)

    def verify(u):
        r = subprocess.run(
            [systemd_analyze, "verify", str(u)], capture_output=True, text=True, timeout=60
        )
        return [ln for ln in (r.stdout + r.stderr).splitlines() if u.name in ln]

    assert verify(unit) == []
    # the check can fail: a directive that does not parse is reported
    bad = tmp_path / "bad" / "homagg-exporter.service"
    bad.parent.mkdir()
    bad.write_text(text.replace("ProtectSystem=strict", "ProtectSystem=sometimes"))
    assert verify(bad), "systemd-analyze verify reported nothing for a bad directive"

    exec_start = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
    argv = shlex.split(exec_start[len("ExecStart=") :])
    assert argv[0] == str(install / "venv" / "bin" / "python")
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/")
    try:
        deadline, body, last = time.monotonic() + 60, "", None
        while time.monotonic() < deadline:
            assert p.poll() is None, p.communicate(timeout=10)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    body = r.read().decode()
                break
            except OSError as e:
                last = e
                time.sleep(0.2)
        assert body, f"no metrics on port {port} within 60 s: {last}"
        up = [ln for ln in body.splitlines() if ln.startswith("homagg_up")]
        assert up and all(ln.endswith(" 0.0") or ln.endswith(" 0") for ln in up), up
        assert any('"agg"' in ln for ln in up), up
    finally:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)
