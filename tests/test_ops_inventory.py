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
