"""The local testbed: one network namespace per host, a bridge as the switch.

``Testbed.up("demo", workers=4, link_mbit=1000)`` builds, with pyroute2::

    hg-demo-agg   eth0 10.77.0.1/24  --veth--  port "agg" -+
    hg-demo-w0    eth0 10.77.0.10/24 --veth--  port "w0"  -+- br0 (in hg-demo-sw)
    hg-demo-w1    eth0 10.77.0.11/24 --veth--  port "w1"  -+
    ...

With ``aggregators=K`` (a job spread over K aggregators) the aggregators
are hosts ``agg`` (.1), ``agg1`` (.2), ... ``agg{K-1}`` (.K), K <= 9.

- the switch is a Linux bridge in its own namespace (``hg-<name>-sw``), so
  the host's own network is never touched; multicast snooping is off, so the
  bridge floods multicast to every worker port (a result sent once by an
  aggregator reaches every worker); aggregator ports are left out of the
  flood (``mcast_flood off``): no aggregator needs another's results;
- every host namespace has ``lo`` up, ``eth0`` with its address and a route
  for 224.0.0.0/4 on ``eth0`` (multicast works without a default route);
- with ``link_mbit`` every worker link is shaped in BOTH directions: a tbf
  qdisc on the worker's ``eth0`` (uplink) and one on its switch port
  (downlink).  ``agg_link_mbit`` shapes the aggregator's link the same way
  (unshaped by default: the aggregator plays the switch);
- a JSON state file (``/run/homagg/testbeds/<name>.json``, or ``state_dir``
  or ``$HOMAGG_TESTBED_DIR``) records every object, written as each object is
  created, and every process started with ``run_in`` (PID and start time).

``Testbed.down(name)`` removes exactly what the state file records (it stops
the recorded processes by PID first, after checking the PID still is the
process it started, and removes their ``files_dir``), works on a half-built testbed, and does nothing when the
testbed is already gone.  If ``up`` fails midway it tears down what it built
and re-raises.  Everything needs root (``sudo``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import ipaddress
import json
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import time
from typing import Any, Iterable, Sequence

# TestbedError, RootRequired, TestbedExists, TestbedNotFound: defined in homagg.errors, importable from here too
from homagg.errors import TestbedError, RootRequired, TestbedExists, TestbedNotFound  # noqa: F401

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = "/run/homagg/testbeds"
DEFAULT_SUBNET = "10.77.0.0/24"
NS_PREFIX = "hg-"
HOST_IFNAME = "eth0"
BRIDGE_IFNAME = "br0"
STATE_VERSION = 1
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_]{0,15}$")
_MAX_WORKERS = 1000
_MAX_AGGREGATORS = 9  # .1 .. .9, workers from .10


@dataclasses.dataclass(frozen=True)
class Host:
    """One host of a testbed: its namespace, interface and address."""

    name: str  # "agg", "w0", "w1", ...
    role: str  # "aggregator" or "worker"
    netns: str  # e.g. "hg-demo-w0"
    ifname: str  # interface inside netns ("eth0")
    ip: str  # e.g. "10.77.0.10"
    prefixlen: int
    mac: str
    switch_port: str  # the bridge port (veth peer) in the switch namespace
    rate_mbit: float | None  # shaping of this host's link, both directions

    @classmethod
    def from_dict(cls, d: dict) -> "Host":
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})


def state_dir_default() -> str:
    return os.environ.get("HOMAGG_TESTBED_DIR") or DEFAULT_STATE_DIR


def require_root(what: str = "this command") -> None:
    """Raise RootRequired unless running as root."""
    if os.geteuid() != 0:
        raise RootRequired(
            f"{what} needs root (it creates network namespaces, veth links, a "
            f"bridge and tc qdiscs): run it as root, e.g. `sudo homagg testbed ...`",
            -errno.EPERM,
        )


def check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise TestbedError(
            f"bad testbed name {name!r}: 1-16 characters from a-z, 0-9, '_', "
            "starting with a letter or digit",
            -errno.EINVAL,
        )


def ns_prefix(name: str) -> str:
    return f"{NS_PREFIX}{name}-"


def _netns_list() -> list[str]:
    from pyroute2 import netns

    return list(netns.listnetns())


def _proc_starttime(pid: int) -> int | None:
    """Start time (clock ticks since boot) of a live, non-zombie ``pid``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    # comm may hold spaces and parentheses: fields start after the last ')'
    rest = data[data.rindex(")") + 2 :].split()
    if rest[0] in ("Z", "X"):
        return None
    return int(rest[19])


def _in_netns(name: str):
    """An IPRoute (pyroute2 >= 0.9.1) in the existing network namespace
    ``name`` (the replacement of the deprecated NetNS(name, flags=0))."""
    from pyroute2 import IPRoute

    return IPRoute(netns=name, flags=0)


def _mac(index: int) -> str:
    """A deterministic locally administered MAC: 02:48:47:00:hi:lo."""
    return "02:48:47:00:%02x:%02x" % (index >> 8 & 0xFF, index & 0xFF)


def _tbf_params(mbit: float, mtu: int) -> dict:
    """tbf parameters for ``mbit``: the bucket holds ~4 ms of traffic (at
    least 4 full frames so GSO/TSO bursts pass), the queue ~50 ms."""
    rate_bps = int(mbit * 1_000_000)
    burst = max(4 * (mtu + 14), rate_bps // 8 // 250)
    return {"rate": f"{rate_bps}bit", "burst": burst, "latency": "50ms"}


# --------------------------------------------------------------------------
# The state file: JSON, rewritten atomically under a directory lock.


class _State:
    def __init__(self, path: str):
        self.path = path

    @contextlib.contextmanager
    def locked(self):
        """flock on the state directory: serialises read-modify-write."""
        fd = os.open(os.path.dirname(self.path), os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def create(self, data: dict) -> None:
        """Create the file; TestbedExists if it already exists."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise TestbedExists(
                f"testbed state file {self.path} already exists "
                f"(`homagg testbed down --name {os.path.basename(self.path)[:-5]}` removes it)",
                -errno.EEXIST,
            ) from None
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)

    def read(self) -> dict:
        try:
            with open(self.path) as f:
                return json.load(f)
        except FileNotFoundError:
            raise TestbedNotFound(f"no testbed state file {self.path}", -errno.ENOENT) from None

    def write(self, data: dict) -> None:
        tmp = f"{self.path}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def update(self, fn) -> dict:
        with self.locked():
            data = self.read()
            fn(data)
            self.write(data)
            return data

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


# --------------------------------------------------------------------------
# Processes started inside a host namespace.


class Process:
    """A process started by ``Testbed.run_in``: ``.pid``, ``.wait()``,
    ``.stop()``.  It runs in its own session (process group = PID), so
    ``stop`` also reaches the children it forked."""

    def __init__(
        self, testbed: "Testbed", host: str, popen: subprocess.Popen, starttime: int | None
    ):
        self.testbed = testbed
        self.host = host
        self.popen = popen
        self.pid = popen.pid
        self.starttime = starttime

    @property
    def returncode(self):
        return self.popen.returncode

    @property
    def stdout(self):
        return self.popen.stdout

    @property
    def stderr(self):
        return self.popen.stderr

    def readline(self, timeout: float) -> str:
        """The next line of its stdout (started with stdout=PIPE, text=True),
        or "" when none came within ``timeout`` seconds or at its end."""
        r, _, _ = select.select([self.popen.stdout], [], [], timeout)
        return self.popen.stdout.readline() if r else ""

    def poll(self):
        rc = self.popen.poll()
        if rc is not None:
            self._forget()
        return rc

    def wait(self, timeout: float | None = None) -> int:
        rc = self.popen.wait(timeout)
        self._forget()
        return rc

    def communicate(self, input=None, timeout: float | None = None):
        out = self.popen.communicate(input, timeout)
        self._forget()
        return out

    def stop(self, timeout: float = 5.0) -> int:
        """SIGTERM the process group, SIGKILL after ``timeout``; returns the
        exit status.  Safe to call more than once."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.popen.wait(timeout)
        # children left in the group after the leader exited
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        for f in (self.popen.stdout, self.popen.stderr, self.popen.stdin):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        self._forget()
        return self.popen.returncode

    def _forget(self) -> None:
        self.testbed._forget_process(self.pid)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def __repr__(self):
        return f"<Process pid={self.pid} host={self.host} rc={self.popen.returncode}>"


# --------------------------------------------------------------------------


class Testbed:
    """A local testbed.  Build with ``Testbed.up``, reopen with
    ``Testbed.open``, remove with ``Testbed.down(name)``; usable as a context
    manager (``with Testbed.up(...) as tb:`` tears it down on exit)."""

    __test__ = False

    def __init__(self, name: str, state_dir: str | None = None):
        check_name(name)
        self.name = name
        self.state_dir = state_dir or state_dir_default()
        self._state = _State(os.path.join(self.state_dir, f"{name}.json"))

    # -- queries -----------------------------------------------------------

    @property
    def state_path(self) -> str:
        return self._state.path

    @property
    def files_dir(self) -> str:
        """A directory for the files of processes that outlive the command
        that started them (sockets, logs, the job file); ``down`` removes it."""
        return self._state.path[: -len(".json")] + ".d"

    def note(self, **fields) -> None:
        """Record ``fields`` in the state file (e.g. the daemons and the job
        ``homagg testbed up`` left running, for the commands that follow)."""
        self._state.update(lambda d: d.update(fields))

    def state(self) -> dict:
        """The state file's content."""
        return self._state.read()

    def hosts(self) -> list[Host]:
        """Every host (aggregator first, then the workers in order)."""
        return [Host.from_dict(h) for h in self.state()["hosts"]]

    def host(self, name: str) -> Host:
        for h in self.hosts():
            if h.name == name or h.netns == name:
                return h
        raise TestbedError(f"testbed {self.name} has no host {name!r}", -errno.ENOENT)

    @property
    def aggregator(self) -> Host:
        return self.hosts()[0]

    @property
    def aggregators(self) -> list[Host]:
        """Every aggregator host in shard order (agg, agg1, agg2, ...)."""
        return [h for h in self.hosts() if h.role == "aggregator"]

    @property
    def workers(self) -> list[Host]:
        return [h for h in self.hosts() if h.role == "worker"]

    @classmethod
    def open(cls, name: str, state_dir: str | None = None) -> "Testbed":
        """The testbed ``name`` from its state file (TestbedNotFound if none)."""
        tb = cls(name, state_dir)
        tb.state()
        return tb

    @classmethod
    def list(cls, state_dir: str | None = None) -> list[str]:
        """Names of the testbeds that have a state file."""
        d = state_dir or state_dir_default()
        try:
            files = os.listdir(d)
        except FileNotFoundError:
            return []
        return sorted(f[:-5] for f in files if f.endswith(".json") and _NAME_RE.match(f[:-5]))

    # -- building ------------------------------------------------------------

    @classmethod
    def up(
        cls,
        name: str,
        workers: int,
        link_mbit: float | None = None,
        *,
        agg_link_mbit: float | None = None,
        subnet: str = DEFAULT_SUBNET,
        mtu: int = 1500,
        state_dir: str | None = None,
        aggregators: int = 1,
        leaves: int = 0,
    ) -> "Testbed":
        """Build testbed ``name`` with ``workers`` worker hosts and
        ``aggregators`` aggregator hosts (1..9); ``leaves`` L > 0 instead
        builds L + 1 for a two-level tree (recorded as the testbed's
        "leaves": the first L leaves, the last the root).  Raises RootRequired, TestbedExists (nothing touched),
        TestbedError for bad arguments; on any failure midway it removes what
        it built and re-raises the original exception."""
        check_name(name)
        require_root("homagg testbed up")
        if not isinstance(workers, int) or not 1 <= workers <= _MAX_WORKERS:
            raise TestbedError(f"workers must be 1..{_MAX_WORKERS}, got {workers!r}", -errno.ERANGE)
        if leaves:
            if aggregators != 1:
                raise TestbedError(
                    "leaves and aggregators exclude each other (a tree has L + 1 aggregator hosts)",
                    -errno.EINVAL,
                )
            if not isinstance(leaves, int) or not 1 <= leaves < _MAX_AGGREGATORS:
                raise TestbedError(
                    f"leaves must be 1..{_MAX_AGGREGATORS - 1} (L + 1 aggregator "
                    f"hosts, at most {_MAX_AGGREGATORS}), got {leaves!r}",
                    -errno.ERANGE,
                )
            if leaves > workers:
                raise TestbedError(
                    f"leaves ({leaves}) must not exceed workers ({workers})", -errno.ERANGE
                )
            aggregators = leaves + 1
        if not isinstance(aggregators, int) or not 1 <= aggregators <= _MAX_AGGREGATORS:
            raise TestbedError(
                f"aggregators must be 1..{_MAX_AGGREGATORS} (addresses .1 .. .9), "
                f"got {aggregators!r}",
                -errno.ERANGE,
            )
        for label, r in (("link_mbit", link_mbit), ("agg_link_mbit", agg_link_mbit)):
            if r is not None and not (r > 0):
                raise TestbedError(f"{label} must be > 0 Mbit/s, got {r!r}", -errno.EINVAL)
        if not 576 <= mtu <= 9000:
            raise TestbedError(f"mtu must be 576..9000, got {mtu}", -errno.ERANGE)
        try:
            net = ipaddress.IPv4Network(subnet, strict=True)
        except ValueError as e:
            raise TestbedError(f"bad subnet {subnet!r}: {e}", -errno.EINVAL) from None
        if net.num_addresses < 12 + workers:
            raise TestbedError(
                f"subnet {subnet} is too small for {workers} workers "
                f"(aggregator .1, workers from .10)",
                -errno.ERANGE,
            )

        tb = cls(name, state_dir)
        if os.path.exists(tb.state_path):
            raise TestbedExists(
                f"testbed {name} already exists (state file {tb.state_path}; "
                f"`homagg testbed down --name {name}` removes it)",
                -errno.EEXIST,
            )
        taken = [n for n in _netns_list() if n.startswith(ns_prefix(name))]
        if taken:
            raise TestbedExists(
                f"testbed {name}: network namespaces {', '.join(sorted(taken))} already exist",
                -errno.EEXIST,
            )
        os.makedirs(tb.state_dir, exist_ok=True)
        tb._state.create(
            {
                "version": STATE_VERSION,
                "name": name,
                "created": time.time(),
                "complete": False,
                "workers": workers,
                "aggregators": aggregators,
                "leaves": leaves,
                "link_mbit": link_mbit,
                "agg_link_mbit": agg_link_mbit,
                "subnet": str(net),
                "mtu": mtu,
                "switch_netns": f"{ns_prefix(name)}sw",
                "bridge": BRIDGE_IFNAME,
                "objects": [],
                "processes": [],
                "hosts": [],
            }
        )
        try:
            tb._build(workers, link_mbit, agg_link_mbit, net, mtu, aggregators)
        except BaseException:
            with contextlib.suppress(Exception):
                cls.down(name, state_dir=tb.state_dir)
            raise
        return tb

    def _record(self, obj: dict) -> None:
        self._state.update(lambda d: d["objects"].append(obj))

    def _unrecord(self, obj: dict) -> None:
        self._state.update(lambda d: d["objects"].remove(obj))

    def _create_netns(self, ns: str) -> None:
        """Record, then create; a namespace that was not created by us (the
        create failed) leaves no record."""
        from pyroute2 import netns

        obj = {"kind": "netns", "name": ns}
        self._record(obj)
        try:
            netns.create(ns)
        except BaseException:
            self._unrecord(obj)
            raise

    def _build(self, workers, link_mbit, agg_link_mbit, net, mtu, aggregators=1) -> None:
        p = ns_prefix(self.name)
        sw_ns = f"{p}sw"
        base = net.network_address
        plan = [
            (
                "agg" if k == 0 else f"agg{k}",
                "aggregator",
                f"{p}agg" if k == 0 else f"{p}agg{k}",
                str(base + 1 + k),
                1 + k,
                agg_link_mbit,
            )
            for k in range(aggregators)
        ]
        plan += [
            (f"w{i}", "worker", f"{p}w{i}", str(base + 10 + i), 0x100 + i, link_mbit)
            for i in range(workers)
        ]

        self._create_netns(sw_ns)
        with _in_netns(sw_ns) as sw:
            self._step_bridge(sw, sw_ns, mtu)
            bridge = sw.link_lookup(ifname=BRIDGE_IFNAME)[0]
            for hname, role, ns, ip, macidx, rate in plan:
                self._create_netns(ns)
                with _in_netns(ns) as h:
                    self._step_host(
                        h,
                        sw,
                        sw_ns,
                        bridge,
                        hname,
                        role,
                        ns,
                        ip,
                        net.prefixlen,
                        _mac(macidx),
                        mtu,
                        rate,
                    )
            self._switch_ports_segment(sw_ns, [hname for hname, *_ in plan])
        self._state.update(lambda d: d.update(complete=True))

    def _step_bridge(self, sw, sw_ns: str, mtu: int) -> None:
        sw.link("set", index=sw.link_lookup(ifname="lo")[0], state="up")
        # stp off (ports forward at once), multicast snooping off (the bridge
        # floods multicast to every port, no IGMP querier needed)
        sw.link(
            "add",
            ifname=BRIDGE_IFNAME,
            kind="bridge",
            br_stp_state=0,
            br_mcast_snooping=0,
            br_forward_delay=0,
        )
        self._record(
            {
                "kind": "link",
                "netns": sw_ns,
                "ifname": BRIDGE_IFNAME,
                "type": "bridge",
                "mcast_snooping": 0,
            }
        )
        idx = sw.link_lookup(ifname=BRIDGE_IFNAME)[0]
        sw.link("set", index=idx, mtu=mtu, state="up")
        self._bridge_netfilter_off(sw_ns)

    # br_netfilter's per-namespace switches: with them on (the default of a
    # new namespace once the module is loaded, e.g. by Docker) every frame
    # the bridge forwards goes through the iptables, ip6tables and arptables
    # hooks (br_nf_* in a profile of the testbed).  Off, a worker's CPU per
    # packet fell from 4.32 to 3.74 us (`homagg run allreduce --method dense
    # --workload dense --density 1 --elements 4194304 --repeat 3`, 2 workers,
    # unshaped; worker CPU time / packets sent, 3 alternating rounds of each
    # setting on one testbed; 2-vCPU Xeon VM at 100 % load, 2026-12-01)
    BRIDGE_NF_SYSCTLS = (
        "net.bridge.bridge-nf-call-iptables",
        "net.bridge.bridge-nf-call-ip6tables",
        "net.bridge.bridge-nf-call-arptables",
    )

    def _bridge_netfilter_off(self, sw_ns: str) -> None:
        """The switch namespace's bridge forwards frames without netfilter
        (the switch of a testbed filters nothing).  Without br_netfilter
        there is nothing to turn off."""
        if not os.path.isdir("/proc/sys/net/bridge"):
            self._state.update(lambda d: d.update(bridge_netfilter="absent"))
            return
        cp = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                sw_ns,
                "sysctl",
                "-q",
                "-w",
                *(f"{k}=0" for k in self.BRIDGE_NF_SYSCTLS),
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if cp.returncode != 0:
            raise TestbedError(
                f"cannot turn netfilter off on the bridge of namespace {sw_ns}: "
                f"{cp.stderr.strip() or cp.returncode}"
            )
        self._state.update(lambda d: d.update(bridge_netfilter="off"))

    # A UDP segmentation offload frame (one skb of up to 64 datagrams, what
    # a worker's UDP_SEGMENT message makes) crosses a veth and the bridge
    # whole; the switch ports cut it into its datagrams before they send it
    # to a host, as a NIC does before the wire, so that no host sees it
    # whole (a packet socket on the aggregator's veth would take it as one
    # frame).  Then the workers may send with UDP GSO (Testbed.udp_gso).
    def _switch_ports_segment(self, sw_ns: str, ports: list[str]) -> None:
        how = "switch"
        for port in ports:
            try:
                cp = subprocess.run(
                    ["ip", "netns", "exec", sw_ns, "ethtool", "-K", port]
                    + ["tx-udp-segmentation", "off"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
            except FileNotFoundError:  # no ethtool: the workers send frame by frame
                how = "absent"
                break
            if cp.returncode != 0:
                how = "off"
                log.warning(
                    "testbed %s: switch port %s keeps UDP segmentation offload (%s); "
                    "workers send frame by frame",
                    self.name,
                    port,
                    cp.stderr.strip() or cp.returncode,
                )
                break
        self._state.update(lambda d: d.update(udp_gso=how))

    @property
    def udp_gso(self) -> bool:
        """Whether workers may send runs of frames as UDP_SEGMENT messages:
        every switch port cuts them into datagrams (homagg.worker.Worker
        ``udp_gso``), and HOMAGG_UDP_GSO, read as the job file reads it
        (homagg.switch.job_file.parse_bool), does not turn it off for this
        program (0 measures without it; a value that is not a boolean is a
        ConfigError naming the variable)."""
        from homagg.errors import ConfigError
        from homagg.switch.job_file import parse_bool

        text = os.environ.get("HOMAGG_UDP_GSO", "").strip()
        try:
            allowed = parse_bool(text) if text else True
        except ConfigError as exc:
            raise ConfigError(
                f"HOMAGG_UDP_GSO: {exc}; unset it, or set it to 0 to send frame by frame"
            ) from None
        return self.state().get("udp_gso") == "switch" and allowed

    def _step_host(
        self, h, sw, sw_ns, bridge, hname, role, ns, ip, prefixlen, mac, mtu, rate
    ) -> None:
        # the veth pair is created inside the host namespace with its peer
        # directly in the switch namespace: no interface ever appears in the
        # namespace this program runs in
        h.link(
            "add",
            ifname=HOST_IFNAME,
            kind="veth",
            address=mac,
            mtu=mtu,
            peer={"ifname": hname, "net_ns_fd": sw_ns, "mtu": mtu},
        )
        self._record(
            {
                "kind": "link",
                "netns": ns,
                "ifname": HOST_IFNAME,
                "type": "veth",
                "peer_netns": sw_ns,
                "peer_ifname": hname,
            }
        )
        port = sw.link_lookup(ifname=hname)[0]
        sw.link("set", index=port, master=bridge, state="up")
        if role == "aggregator":
            # results are multicast by the aggregators, for the workers: with
            # several aggregators the flood would also load every other
            # aggregator's link (a quarter more bytes into each at K = 2)
            sw.brport("set", index=port, mcast_flood=0)
        self._step_address(h, ns, ip, prefixlen)
        if rate is not None:
            self._step_rate_limit(h, ns, HOST_IFNAME, rate, mtu)
            self._step_rate_limit(sw, sw_ns, hname, rate, mtu)
        host = Host(
            name=hname,
            role=role,
            netns=ns,
            ifname=HOST_IFNAME,
            ip=ip,
            prefixlen=prefixlen,
            mac=mac,
            switch_port=hname,
            rate_mbit=rate,
        )
        self._state.update(lambda d: d["hosts"].append(dataclasses.asdict(host)))

    def _step_address(self, h, ns, ip, prefixlen) -> None:
        h.link("set", index=h.link_lookup(ifname="lo")[0], state="up")
        idx = h.link_lookup(ifname=HOST_IFNAME)[0]
        h.addr("add", index=idx, address=ip, prefixlen=prefixlen)
        self._record(
            {"kind": "addr", "netns": ns, "ifname": HOST_IFNAME, "address": f"{ip}/{prefixlen}"}
        )
        h.link("set", index=idx, state="up")
        # multicast leaves through eth0 even without a default route
        h.route("add", dst="224.0.0.0/4", oif=idx)
        self._record({"kind": "route", "netns": ns, "dst": "224.0.0.0/4", "dev": HOST_IFNAME})

    def _step_rate_limit(self, nsobj, ns, ifname, mbit, mtu) -> None:
        params = _tbf_params(mbit, mtu)
        idx = nsobj.link_lookup(ifname=ifname)[0]
        nsobj.tc("add", "tbf", index=idx, handle="1:", **params)
        self._record(
            {
                "kind": "qdisc",
                "netns": ns,
                "ifname": ifname,
                "type": "tbf",
                "handle": "1:",
                "mbit": mbit,
                **params,
            }
        )

    # -- processes -----------------------------------------------------------

    def run_in(
        self,
        host: str,
        argv: Sequence[str],
        *,
        stdin=subprocess.DEVNULL,
        stdout=None,
        stderr=None,
        env: dict | None = None,
        cwd: str | None = None,
        text: bool = False,
    ) -> Process:
        """Start ``argv`` inside the namespace of ``host`` (a host name such
        as "agg" / "w0", or its namespace) with ``ip netns exec``; the PID is
        recorded in the state file, so ``down`` stops it if nobody else does.
        stdin/stdout/stderr as for subprocess.Popen.  ``host`` None: in the
        namespace of the caller (a process serving the machine's own
        interfaces, e.g. ``homagg exporter``), recorded the same way."""
        require_root("Testbed.run_in")
        h = self.host(host) if host is not None else None
        if not argv:
            raise TestbedError("run_in: empty argv", -errno.EINVAL)
        popen = subprocess.Popen(
            [*(["ip", "netns", "exec", h.netns] if h else []), *map(str, argv)],
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            env=env,
            cwd=cwd,
            text=text,
            start_new_session=True,
        )
        start = _proc_starttime(popen.pid)
        hname = h.name if h else "-"
        rec = {"pid": popen.pid, "starttime": start, "host": hname, "argv": list(map(str, argv))}
        try:
            self._state.update(lambda d: d["processes"].append(rec))
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(10)
            raise
        return Process(self, hname, popen, start)

    def exec(
        self,
        host: str,
        argv: Sequence[str],
        timeout: float = 30.0,
        check: bool = False,
        input: str | None = None,
    ) -> subprocess.CompletedProcess:
        """Run ``argv`` in ``host`` to completion (text output captured); the
        process is stopped if it outlives ``timeout`` (then TimeoutExpired)."""
        p = self.run_in(
            host,
            argv,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            out, err = p.communicate(input, timeout=timeout)
        finally:
            p.stop()
        cp = subprocess.CompletedProcess(p.popen.args, p.returncode, out, err)
        if check:
            cp.check_returncode()
        return cp

    def _forget_process(self, pid: int) -> None:
        with contextlib.suppress(TestbedNotFound):
            self._state.update(
                lambda d: d.__setitem__("processes", [r for r in d["processes"] if r["pid"] != pid])
            )

    # -- teardown --------------------------------------------------------------

    @classmethod
    def down(cls, name: str, state_dir: str | None = None, timeout: float = 5.0) -> bool:
        """Remove testbed ``name``: stop its recorded processes (by PID), then
        delete its recorded links and namespaces, then its state file.
        Returns False when there was nothing to remove.  Errors on single
        objects do not stop the others; they are raised together at the end
        (the state file then keeps what is left, so ``down`` can be rerun)."""
        check_name(name)
        require_root("homagg testbed down")
        tb = cls(name, state_dir)
        try:
            data = tb._state.read()
        except TestbedNotFound:
            return False
        errors: list[str] = []
        tb._stop_processes(data.get("processes", []), timeout, errors)
        left = tb._remove_objects(data.get("objects", []), errors)
        if errors:

            def keep(d):
                d["objects"] = left
                d["processes"] = []
                d["complete"] = False

            with contextlib.suppress(TestbedError):
                tb._state.update(keep)
            raise TestbedError(f"testbed {name}: teardown incomplete: " + "; ".join(errors))
        tb._state.remove()
        shutil.rmtree(tb.files_dir, ignore_errors=True)
        return True

    @staticmethod
    def _stop_processes(procs: Iterable[dict], timeout: float, errors: list[str]) -> None:
        """SIGTERM, then SIGKILL after ``timeout``, each recorded process
        group whose leader still is the process that was started (same PID
        and same start time: a reused PID is left alone)."""

        def alive(pid, start):
            return start is not None and _proc_starttime(pid) == start

        live = [(r["pid"], r.get("starttime")) for r in procs]
        live = [(p, s) for p, s in live if alive(p, s)]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid, _ in live:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, sig)
            deadline = time.monotonic() + timeout
            while live and time.monotonic() < deadline:
                live = [(p, s) for p, s in live if alive(p, s)]
                if live:
                    time.sleep(0.05)
        for pid, _ in live:
            errors.append(f"process {pid} did not exit after SIGKILL")

    @staticmethod
    def _remove_objects(objects: list[dict], errors: list[str]) -> list[dict]:
        """Delete links (their qdiscs, addresses and routes go with them),
        then namespaces, newest first.  Returns the objects that remain."""
        from pyroute2 import netns
        from pyroute2.netlink.exceptions import NetlinkError

        existing = set(_netns_list())
        left = []
        for obj in reversed(objects):
            if obj["kind"] != "link":
                continue
            if obj["netns"] not in existing:
                continue  # the namespace is gone, and with it the link
            try:
                with _in_netns(obj["netns"]) as ns:
                    idx = ns.link_lookup(ifname=obj["ifname"])
                    if idx:
                        ns.link("del", index=idx[0])
            except FileNotFoundError:
                pass
            except NetlinkError as e:
                if e.code != errno.ENODEV:
                    errors.append(f"link {obj['ifname']} in {obj['netns']}: {e}")
                    left.append(obj)
            except OSError as e:
                errors.append(f"link {obj['ifname']} in {obj['netns']}: {e}")
                left.append(obj)
        for obj in reversed(objects):
            if obj["kind"] != "netns":
                continue
            try:
                netns.remove(obj["name"])
            except FileNotFoundError:
                pass
            except OSError as e:
                errors.append(f"namespace {obj['name']}: {e}")
                left.append(obj)
        left.reverse()
        return left

    # -- context manager ---------------------------------------------------------

    def __enter__(self) -> "Testbed":
        return self

    def __exit__(self, *exc) -> None:
        type(self).down(self.name, state_dir=self.state_dir)

    # -- inspection ----------------------------------------------------------------

    def link_stats(self, host: str) -> dict[str, int]:
        """tx/rx bytes and packets of ``host``'s link, from the kernel."""
        h = self.host(host)
        with _in_netns(h.netns) as ns:
            link = ns.get_links(ns.link_lookup(ifname=h.ifname)[0])[0]
            st = link.get_attr("IFLA_STATS64")
            return {k: st[k] for k in ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets")}

    def qdisc_stats(self, host: str, side: str = "host") -> dict[str, Any] | None:
        """Statistics of the tbf qdisc shaping ``host``'s link: ``side`` "host"
        is the host's egress (uplink), "switch" the switch port's egress
        (downlink).  None when the link is not shaped."""
        h = self.host(host)
        ns, ifname = (
            (h.netns, h.ifname) if side == "host" else (self.state()["switch_netns"], h.switch_port)
        )
        with _in_netns(ns) as n:
            idx = n.link_lookup(ifname=ifname)[0]
            for q in n.get_qdiscs(index=idx):
                if q.get_attr("TCA_KIND") != "tbf" or q["parent"] != 0xFFFFFFFF:
                    continue
                st2 = q.get_attr("TCA_STATS2")
                basic = st2.get_attr("TCA_STATS_BASIC") if st2 is not None else None
                queue = st2.get_attr("TCA_STATS_QUEUE") if st2 is not None else None
                if basic is None or queue is None:  # old kernels: TCA_STATS only
                    basic = queue = q.get_attr("TCA_STATS")
                opts = q.get_attr("TCA_OPTIONS")
                parms = opts.get_attr("TCA_TBF_PARMS") if opts is not None else None
                return {
                    "kind": "tbf",
                    "bytes": basic["bytes"],
                    "packets": basic["packets"],
                    "drops": queue["drops"],
                    "overlimits": queue["overlimits"],
                    "rate_bytes_per_s": parms["rate"] if parms is not None else None,
                }
        return None

    def describe(self) -> dict:
        """The state plus a per-host summary, for ``homagg testbed show``."""
        d = self.state()
        present = set(_netns_list())
        d["namespaces_present"] = sorted(n for n in present if n.startswith(ns_prefix(self.name)))
        return d
