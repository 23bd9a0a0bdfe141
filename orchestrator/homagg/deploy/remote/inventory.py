"""The real-testbed inventory: ``testbed.toml`` loaded and validated.

``load("testbed.toml")`` returns an :class:`Inventory` (global
:class:`Settings` plus one :class:`HostSpec` per host) or raises
:class:`InventoryError` listing EVERY problem found, each naming the host,
the field and the fix, e.g.::

    host 'w2': field 'role' = 'wroker': must be 'aggregator' or 'worker'

docs/INVENTORY.md documents every field with a complete example.  The
inventory is read by ``homagg provision``, ``homagg ansible-inventory`` and
the run commands; nothing here touches the network.
"""

from __future__ import annotations

import dataclasses
import errno
import ipaddress
import os
import re
import tomllib
from typing import Any

from homagg.errors import InventoryError  # noqa: F401 - InventoryError importable from here

ROLES = ("aggregator", "worker")
HUGEPAGE_SIZES = {"2M": 2048, "1G": 1048576}  # size -> kB (sysfs directory name)
DPDK_DRIVERS = ("vfio-pci", "uio_pci_generic", "igb_uio")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_PCI_RE = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_IFACE_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
_VDEV_RE = re.compile(r"^net_[a-z_]+[0-9]*(,[A-Za-z0-9_]+=[^,\s]+)*$")

SETTINGS_FIELDS = {
    "project",
    "install_dir",
    "config_file",
    "hugepages_mount",
    "python",
    "connect_timeout",
    "command_timeout",
    "parallel",
    "pip_args",
    "apt_packages",
    "pip_index",
    "wheelhouse",
    "link_mbit",
    "auth_secret",
}
HOST_FIELDS = {
    "name",
    "ssh_host",
    "ssh_port",
    "ssh_user",
    "ssh_key",
    "role",
    "pci",
    "driver",
    "vdev",
    "iface",
    "dataplane_ip",
    "mtu",
    "cores",
    "hugepages",
    "install_dir",
    "config_file",
    "metrics_port",
    "metrics_bind",
}


@dataclasses.dataclass(frozen=True)
class Hugepages:
    count: int
    size: str  # "2M" or "1G"

    @property
    def size_kb(self) -> int:
        return HUGEPAGE_SIZES[self.size]


@dataclasses.dataclass(frozen=True)
class HostSpec:
    """One host of the inventory (see docs/INVENTORY.md for each field)."""

    name: str
    ssh_host: str
    ssh_port: int
    ssh_user: str
    ssh_key: str  # absolute path of the private key
    role: str  # "aggregator" or "worker"
    pci: str | None
    driver: str | None
    vdev: str | None
    iface: str | None
    dataplane_ip: str  # CIDR, e.g. "10.10.0.1/24"
    cores: tuple[int, ...]
    hugepages: Hugepages | None
    install_dir: str  # {name} already substituted
    config_file: str  # {name} already substituted
    mtu: int = 1500  # of the data-plane link (9000: jumbo payloads up to 8192 bytes)
    metrics_port: int = 0  # aggregator: `homagg up` starts homagg exporter on it (0: none)
    metrics_bind: str = "127.0.0.1"  # the address it listens on

    @property
    def dataplane_kind(self) -> str:
        """ "pci", "vdev" or "iface"."""
        return "pci" if self.pci else "vdev" if self.vdev else "iface"

    @property
    def kernel_iface(self) -> str | None:
        """The kernel interface the data plane uses (iface, or a vdev's
        ``iface=`` argument), None for a PCI device."""
        if self.iface:
            return self.iface
        if self.vdev:
            for kv in self.vdev.split(",")[1:]:
                k, _, v = kv.partition("=")
                if k == "iface":
                    return v
        return None

    @property
    def address(self) -> str:
        return self.dataplane_ip.split("/")[0]

    @property
    def venv(self) -> str:
        return os.path.join(self.install_dir, "venv")

    @property
    def secret_file(self) -> str:
        """Where ``homagg provision`` (or the Ansible playbook) puts the job
        secret of the inventory's ``auth_secret`` on a worker host (mode
        0600, root's: the user HomAgg's processes run as)."""
        return os.path.join(self.install_dir, "secret", "job.secret")


@dataclasses.dataclass(frozen=True)
class Settings:
    project: str  # absolute path of the sdist (.tar.gz) or wheel (.whl), or "" = build one
    install_dir: str  # may hold {name}
    config_file: str  # may hold {name}
    hugepages_mount: str  # may hold {name}
    python: str
    connect_timeout: float
    command_timeout: float
    parallel: int
    pip_args: tuple[str, ...]
    apt_packages: dict  # role -> tuple of Debian packages
    pip_index: bool = False  # hosts reach a package index themselves
    wheelhouse: str = (
        ""  # local directory of wheels ("" = download one)  # role -> tuple of Debian packages
    )
    link_mbit: float = 0.0  # the workers' link rate for the jobs' cost model (0: none)
    # the job secret's file on this machine ("": none), copied to every worker
    # host by `homagg provision` / the playbook; `homagg up -i --auth` uses it
    auth_secret: str = ""


@dataclasses.dataclass(frozen=True)
class Inventory:
    path: str
    settings: Settings
    hosts: tuple[HostSpec, ...]

    def host(self, name: str) -> HostSpec:
        for h in self.hosts:
            if h.name == name:
                return h
        raise InventoryError(
            f"no host {name!r} in {self.path} (hosts: {', '.join(h.name for h in self.hosts)})"
        )

    @property
    def aggregators(self) -> list[HostSpec]:
        return [h for h in self.hosts if h.role == "aggregator"]

    @property
    def workers(self) -> list[HostSpec]:
        return [h for h in self.hosts if h.role == "worker"]

    def select(self, names: list[str] | None) -> list[HostSpec]:
        """The hosts named in ``names`` (all when None); InventoryError
        names every unknown host."""
        if not names:
            return list(self.hosts)
        known = {h.name for h in self.hosts}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise InventoryError(
                f"--hosts names unknown host(s) {', '.join(map(repr, unknown))}; "
                f"the inventory {self.path} has: {', '.join(sorted(known))}"
            )
        return [h for h in self.hosts if h.name in names]


DEFAULT_APT = {
    "common": (
        "python3",
        "python3-venv",
        "python3-dev",
        "build-essential",
        "pkg-config",
        "make",
        "iproute2",
        "tar",
        "libsodium-dev",
    ),
    "aggregator": ("dpdk", "libdpdk-dev", "libjansson-dev"),
    "worker": (),
}

DEFAULTS = {
    "install_dir": "/opt/homagg",
    "config_file": "/etc/homagg/host.toml",
    "hugepages_mount": "/dev/hugepages",
    "python": "python3",
    "connect_timeout": 10.0,
    "command_timeout": 1800.0,
    "parallel": 32,
}


class _Collector:
    def __init__(self):
        self.problems: list[str] = []

    def add(self, where: str, field: str, value: Any, fix: str) -> None:
        shown = "missing" if value is _MISSING else f"= {value!r}"
        self.problems.append(f"{where}: field '{field}' {shown}: {fix}")


_MISSING = object()


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _settings(raw: dict, base: str, c: _Collector) -> Settings:
    where = "[settings]"
    if not isinstance(raw, dict):
        c.problems.append(f"{where}: must be a table ([settings]), got {type(raw).__name__}")
        raw = {}
    for k in sorted(set(raw) - SETTINGS_FIELDS):
        c.add(where, k, raw[k], f"unknown field; known: {', '.join(sorted(SETTINGS_FIELDS))}")

    def local_path(key, what):
        """raw[key], a path on this machine relative to the inventory's
        folder: normalised, "" when absent or not a string (a problem)."""
        v = raw.get(key, "")
        if not isinstance(v, str):
            c.add(where, key, v, f"must be {what}")
            return ""
        return os.path.normpath(os.path.join(base, os.path.expanduser(v))) if v else ""

    project = local_path("project", "a path (string) to a .tar.gz sdist or a .whl wheel")
    if project:
        if not (project.endswith(".tar.gz") or project.endswith(".whl")):
            c.add(
                where,
                "project",
                project,
                "must end in .tar.gz (an sdist, `python setup.py sdist`) or .whl "
                "(a wheel, `pip wheel --no-deps .`), or be left out to build an sdist "
                "of this checkout",
            )
        elif not os.path.isfile(project):
            c.add(
                where,
                "project",
                project,
                "file not found: build it first (`python setup.py sdist -d dist`), or leave "
                "'project' out to build an sdist of this checkout automatically",
            )

    def path_field(key):
        v = raw.get(key, DEFAULTS[key])
        if not isinstance(v, str) or not v.startswith("/") or len(v) < 2:
            c.add(
                where,
                key,
                v,
                "must be an absolute path on the hosts, e.g. "
                f"{DEFAULTS[key]!r} ('{{name}}' is replaced by the host name)",
            )
            return DEFAULTS[key]
        return v.rstrip("/") or v

    install_dir = path_field("install_dir")
    config_file = path_field("config_file")
    hp_mount = path_field("hugepages_mount")

    python = raw.get("python", DEFAULTS["python"])
    if not isinstance(python, str) or not python:
        c.add(where, "python", python, "must name the remote interpreter, e.g. 'python3'")
        python = DEFAULTS["python"]

    def timeout(key):
        v = raw.get(key, DEFAULTS[key])
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            c.add(where, key, v, "must be a number of seconds > 0")
            return float(DEFAULTS[key])
        return float(v)

    connect_timeout = timeout("connect_timeout")
    command_timeout = timeout("command_timeout")
    parallel = raw.get("parallel", DEFAULTS["parallel"])
    if not _is_int(parallel) or not 1 <= parallel <= 1024:
        c.add(where, "parallel", parallel, "must be an integer 1..1024 (hosts provisioned at once)")
        parallel = DEFAULTS["parallel"]
    pip_args = raw.get("pip_args", [])
    if not isinstance(pip_args, list) or not all(isinstance(a, str) for a in pip_args):
        c.add(
            where,
            "pip_args",
            pip_args,
            "must be a list of strings, e.g. ['--index-url', 'http://mirror/simple']",
        )
        pip_args = []
    apt = {k: tuple(v) for k, v in DEFAULT_APT.items()}
    apt_raw = raw.get("apt_packages", {})
    if not isinstance(apt_raw, dict):
        c.add(
            where,
            "apt_packages",
            apt_raw,
            "must be a table with lists 'common', 'aggregator', 'worker'",
        )
    else:
        for k, v in apt_raw.items():
            if k not in apt:
                c.add(
                    where,
                    f"apt_packages.{k}",
                    v,
                    "unknown key: use 'common', 'aggregator' or 'worker'",
                )
            elif not isinstance(v, list) or not all(
                isinstance(p, str) and re.match(r"^[a-z0-9][a-z0-9+.-]+$", p) for p in v
            ):
                c.add(where, f"apt_packages.{k}", v, "must be a list of Debian package names")
            else:
                apt[k] = tuple(v)
    pip_index = raw.get("pip_index", False)
    if not isinstance(pip_index, bool):
        c.add(
            where,
            "pip_index",
            pip_index,
            "must be true (hosts use a package index) or false "
            "(default: dependencies are copied as a wheelhouse)",
        )
        pip_index = False
    wheelhouse = local_path("wheelhouse", "a local directory of .whl files")
    if wheelhouse:
        if not os.path.isdir(wheelhouse):
            c.add(
                where,
                "wheelhouse",
                wheelhouse,
                "directory not found: create it with `pip download "
                "-d DIR --only-binary :all: <requirements>` or leave it out (downloaded automatically)",
            )
    link_mbit = raw.get("link_mbit", 0)
    if (
        isinstance(link_mbit, bool)
        or not isinstance(link_mbit, (int, float))
        or not (link_mbit == 0 or 1 <= link_mbit < 2**32)
    ):
        c.add(
            where,
            "link_mbit",
            link_mbit,
            "must be the workers' link rate in Mbit/s (>= 1), "
            "e.g. 10000, or 0 / left out: jobs choose by bytes",
        )
        link_mbit = 0
    auth_secret = local_path(
        "auth_secret",
        "the path of the job secret's file on this machine "
        "(64 hex digits, mode 0600; `homagg provision` creates it if missing)",
    )
    if auth_secret and os.path.isdir(auth_secret):
        c.add(
            where,
            "auth_secret",
            auth_secret,
            "is a directory: name the secret's file, e.g. "
            "'secrets/job.secret' (created by `homagg provision` if missing)",
        )
    return Settings(
        pip_index=pip_index,
        wheelhouse=wheelhouse,
        link_mbit=float(link_mbit),
        auth_secret=auth_secret,
        project=project,
        install_dir=install_dir,
        config_file=config_file,
        hugepages_mount=hp_mount,
        python=python,
        connect_timeout=connect_timeout,
        command_timeout=command_timeout,
        parallel=parallel,
        pip_args=tuple(pip_args),
        apt_packages=apt,
    )


def _cores(v, where, c) -> tuple[int, ...]:
    """A list of CPU ids ([2, 3]) or a string of ranges ("2-3,6")."""
    fix = "must be a list of CPU ids like [2, 3] or a string like '2-3,6' (CPUs the daemon or worker is pinned to)"
    out: list[int] = []
    if isinstance(v, list):
        if not v or not all(_is_int(x) and 0 <= x < 4096 for x in v):
            c.add(where, "cores", v, fix)
            return ()
        out = list(v)
    elif isinstance(v, str):
        try:
            for part in v.split(","):
                a, _, b = part.strip().partition("-")
                lo, hi = int(a), int(b or a)
                if not 0 <= lo <= hi < 4096:
                    raise ValueError
                out.extend(range(lo, hi + 1))
        except ValueError:
            c.add(where, "cores", v, fix)
            return ()
    else:
        c.add(where, "cores", v if v is not None else _MISSING, fix)
        return ()
    if len(set(out)) != len(out):
        c.add(where, "cores", v, "lists a CPU twice; list each CPU once")
    return tuple(sorted(set(out)))


def _host(raw: dict, idx: int, s: Settings, base: str, c: _Collector) -> HostSpec | None:
    if not isinstance(raw, dict):
        c.problems.append(f"hosts[{idx}]: must be a table ([[hosts]]), got {type(raw).__name__}")
        return None
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        c.add(
            f"hosts[{idx}]",
            "name",
            name if name is not None else _MISSING,
            "must be 1-63 characters from A-Z a-z 0-9 _ . - (a unique host name)",
        )
        where = f"hosts[{idx}]"
        name = f"hosts[{idx}]"
    else:
        where = f"host '{name}'"
    for k in sorted(set(raw) - HOST_FIELDS):
        c.add(where, k, raw[k], f"unknown field; known: {', '.join(sorted(HOST_FIELDS))}")

    ssh_host = raw.get("ssh_host", _MISSING)
    if not isinstance(ssh_host, str) or not ssh_host or any(ch.isspace() for ch in ssh_host):
        c.add(
            where,
            "ssh_host",
            ssh_host,
            "must be the management address or DNS name sshd listens on",
        )
        ssh_host = ""
    ssh_port = raw.get("ssh_port", 22)
    if not _is_int(ssh_port) or not 1 <= ssh_port <= 65535:
        c.add(where, "ssh_port", ssh_port, "must be a TCP port 1..65535 (default 22)")
        ssh_port = 22
    ssh_user = raw.get("ssh_user", "root")
    if not isinstance(ssh_user, str) or not re.match(r"^[a-z_][a-z0-9_.-]*\$?$", ssh_user):
        c.add(
            where,
            "ssh_user",
            ssh_user,
            "must be a login name (root, or a user with passwordless sudo)",
        )
        ssh_user = "root"
    ssh_key = raw.get("ssh_key", _MISSING)
    if not isinstance(ssh_key, str) or not ssh_key:
        c.add(
            where,
            "ssh_key",
            ssh_key,
            "must be the path of the private key to log in with, e.g. '~/.ssh/id_ed25519'",
        )
        ssh_key = ""
    else:
        ssh_key = os.path.normpath(os.path.join(base, os.path.expanduser(ssh_key)))
        if not os.path.isfile(ssh_key):
            c.add(
                where,
                "ssh_key",
                ssh_key,
                "file not found: create a key (`ssh-keygen -t ed25519`) "
                "and install its .pub in the host's ~/.ssh/authorized_keys",
            )

    role = raw.get("role", _MISSING)
    if role not in ROLES:
        c.add(where, "role", role, "must be 'aggregator' or 'worker'")
        role = "worker"

    kinds = [k for k in ("pci", "vdev", "iface") if k in raw]
    pci = vdev = iface = driver = None
    if len(kinds) != 1:
        c.add(
            where,
            "pci/vdev/iface",
            ", ".join(kinds) if kinds else _MISSING,
            "give exactly one data-plane interface: pci = '0000:3b:00.0' (with driver), "
            "vdev = 'net_af_packet0,iface=eth1', or iface = 'eth1' (workers only)",
        )
    if "pci" in raw:
        pci = raw["pci"]
        if not isinstance(pci, str) or not _PCI_RE.match(pci):
            c.add(
                where,
                "pci",
                pci,
                "must be a full PCI address DDDD:BB:DD.F, e.g. '0000:3b:00.0' "
                "(`lspci -D` or `dpdk-devbind.py --status` shows it)",
            )
        driver = raw.get("driver", "vfio-pci")
        if driver not in DPDK_DRIVERS:
            c.add(
                where,
                "driver",
                driver,
                f"must be one of {', '.join(DPDK_DRIVERS)} (vfio-pci with an IOMMU)",
            )
    elif "driver" in raw:
        c.add(where, "driver", raw["driver"], "only meaningful with 'pci'; remove it")
    if "vdev" in raw:
        vdev = raw["vdev"]
        if not isinstance(vdev, str) or not _VDEV_RE.match(vdev):
            c.add(
                where,
                "vdev",
                vdev,
                "must be a DPDK virtual device argument, e.g. "
                "'net_af_packet0,iface=eth1' or 'net_af_xdp0,iface=eth1'",
            )
            vdev = None
    if "iface" in raw:
        iface = raw["iface"]
        if not isinstance(iface, str) or not _IFACE_RE.match(iface):
            c.add(
                where,
                "iface",
                iface,
                "must be a kernel interface name (1-15 characters), e.g. 'eth1'",
            )
            iface = None
        elif role == "aggregator":
            c.add(
                where,
                "iface",
                iface,
                "the aggregator needs a DPDK port: use pci = '...' with driver, "
                f"or vdev = 'net_af_packet0,iface={iface}'",
            )

    dip = raw.get("dataplane_ip", _MISSING)
    try:
        if not isinstance(dip, str) or "/" not in dip:
            raise ValueError
        iface_addr = ipaddress.IPv4Interface(dip)
        if iface_addr.network.prefixlen >= 31 or iface_addr.ip in (
            iface_addr.network.network_address,
            iface_addr.network.broadcast_address,
        ):
            raise ValueError
        dip = str(iface_addr)
    except ValueError:
        c.add(
            where,
            "dataplane_ip",
            dip,
            "must be the host's data-plane IPv4 address with its prefix "
            "(CIDR), e.g. '10.10.0.1/24'",
        )
        dip = ""

    mtu = raw.get("mtu", 1500)
    if not _is_int(mtu) or not 576 <= mtu <= 9000:
        c.add(
            where,
            "mtu",
            mtu,
            "must be the MTU of the host's data-plane link, an integer "
            "576..9000 (default 1500; 9000 for jumbo payloads of up to 8192 bytes, set on "
            "the interface and the switch ports as well)",
        )
        mtu = 1500

    cores = _cores(raw.get("cores"), where, c)

    hp = raw.get("hugepages")
    hugepages = None
    hp_fix = "must be a table like { count = 1024, size = '2M' } (size '2M' or '1G')"
    if hp is None:
        if role == "aggregator" and pci:
            c.add(
                where,
                "hugepages",
                _MISSING,
                "an aggregator on a PCI NIC needs hugepages: " + hp_fix,
            )
    elif not isinstance(hp, dict) or set(hp) - {"count", "size"}:
        c.add(where, "hugepages", hp, hp_fix)
    else:
        count, size = hp.get("count", _MISSING), hp.get("size", "2M")
        ok = True
        if not _is_int(count) or not 0 <= count <= 1 << 20:
            c.add(where, "hugepages.count", count, "must be an integer >= 0 (pages to reserve)")
            ok = False
        if size not in HUGEPAGE_SIZES:
            c.add(where, "hugepages.size", size, "must be '2M' or '1G'")
            ok = False
        if ok:
            hugepages = Hugepages(count, size)

    def path(key, default):
        v = raw.get(key, default)
        if not isinstance(v, str) or not v.startswith("/"):
            c.add(
                where,
                key,
                v,
                "must be an absolute path on the host ('{name}' is replaced by the host name)",
            )
            v = default
        return v.replace("{name}", name)

    install_dir = path("install_dir", s.install_dir)
    config_file = path("config_file", s.config_file)
    metrics_port = raw.get("metrics_port", 0)
    if not _is_int(metrics_port) or not 0 <= metrics_port <= 65535:
        c.add(
            where,
            "metrics_port",
            metrics_port,
            "must be the TCP port of the host's "
            "Prometheus endpoint (homagg exporter), 1..65535, or 0 for none "
            "(docs/OPERATIONS.md)",
        )
        metrics_port = 0
    elif metrics_port and role != "aggregator":
        c.add(
            where,
            "metrics_port",
            metrics_port,
            "only an aggregator runs homagg exporter; "
            "a worker's metrics are HOMAGG_METRICS_PORT of its training process "
            "(docs/OPERATIONS.md)",
        )
        metrics_port = 0
    metrics_bind = raw.get("metrics_bind", "127.0.0.1")
    try:
        metrics_bind = str(ipaddress.IPv4Address(metrics_bind))
    except ValueError:
        c.add(
            where,
            "metrics_bind",
            metrics_bind,
            "must be the IPv4 address homagg exporter "
            "listens on: '127.0.0.1' (this host only, the default), the management "
            "address, or '0.0.0.0' (every interface)",
        )
        metrics_bind = "127.0.0.1"
    return HostSpec(
        name=name,
        ssh_host=ssh_host,
        ssh_port=ssh_port,
        ssh_user=ssh_user,
        ssh_key=ssh_key,
        role=role,
        pci=pci,
        driver=driver,
        vdev=vdev,
        iface=iface,
        dataplane_ip=dip,
        cores=cores,
        hugepages=hugepages,
        install_dir=install_dir,
        config_file=config_file,
        mtu=mtu,
        metrics_port=metrics_port,
        metrics_bind=metrics_bind,
    )


def parse(data: dict, path: str = "<inventory>") -> Inventory:
    """Validate parsed TOML ``data``; paths in it are relative to ``path``'s
    directory.  InventoryError lists every problem."""
    c = _Collector()
    base = os.path.dirname(os.path.abspath(path))
    for k in sorted(set(data) - {"settings", "hosts"}):
        c.problems.append(f"top level: unknown key '{k}': use [settings] and [[hosts]] tables")
    s = _settings(data.get("settings", {}), base, c)
    raw_hosts = data.get("hosts")
    hosts: list[HostSpec] = []
    if not isinstance(raw_hosts, list) or not raw_hosts:
        c.problems.append(
            "no hosts: add one [[hosts]] table per machine (one role = 'aggregator', "
            "at least one role = 'worker')"
        )
    else:
        for i, rh in enumerate(raw_hosts):
            h = _host(rh, i, s, base, c)
            if h is not None:
                hosts.append(h)
        seen: dict[str, list] = {}
        for key, label in (
            (lambda h: h.name, "name"),
            (lambda h: (h.ssh_host, h.ssh_port), "ssh_host/ssh_port"),
            (lambda h: h.address, "dataplane_ip"),
        ):
            seen = {}
            for h in hosts:
                if key(h) in ("", ("", 22)):
                    continue
                seen.setdefault(key(h), []).append(h.name)
            for k, names in seen.items():
                if len(names) > 1:
                    c.problems.append(
                        f"hosts {', '.join(map(repr, names))}: field '{label}' "
                        f"= {k!r} is used more than once: give each host its own"
                    )
        nets = {ipaddress.IPv4Interface(h.dataplane_ip).network for h in hosts if h.dataplane_ip}
        if len(nets) > 1:
            c.problems.append(
                "field 'dataplane_ip': hosts are in different subnets "
                f"({', '.join(sorted(map(str, nets)))}): put every data-plane address in one subnet"
            )
        mtus = {}
        for h in hosts:
            mtus.setdefault(h.mtu, []).append(h.name)
        if len(mtus) > 1:
            c.problems.append(
                "field 'mtu': hosts of one data-plane subnet have different MTUs ("
                + "; ".join(f"{m}: {', '.join(map(repr, n))}" for m, n in sorted(mtus.items()))
                + "): give every host the same mtu (the link's)"
            )
        if hosts and not any(h.role == "aggregator" for h in hosts):
            c.problems.append(
                "no host has role = 'aggregator': mark the machine running homagg-switch"
            )
        if hosts and not any(h.role == "worker" for h in hosts):
            c.problems.append("no host has role = 'worker': add the training machines")
    if c.problems:
        raise InventoryError(
            f"{path}: {len(c.problems)} problem(s):\n  " + "\n  ".join(c.problems), c.problems
        )
    return Inventory(path=os.path.abspath(path), settings=s, hosts=tuple(hosts))


def load(path: str) -> Inventory:
    """Read and validate the inventory at ``path``."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise InventoryError(
            f"inventory {path} not found (docs/INVENTORY.md has an example)", code=-errno.ENOENT
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise InventoryError(f"{path}: not valid TOML: {e}", [f"TOML syntax: {e}"]) from None
    return parse(data, path)
