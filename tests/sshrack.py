"""Emulated rack for the provisioning tests: testbed hosts with real sshd.

``Rack.up(tmp)`` builds a local testbed (homagg.deploy.local.testbed: one namespace per
host, a bridge switch) in a private random subnet, adds one veth from the
namespace the tests run in to the bridge (address .254), so SSH from here
reaches every host, generates a host key and a client key, and starts
``/usr/sbin/sshd -D`` inside each host namespace (root login by key only).
``down()`` stops each sshd by its PID and removes the testbed (the control
veth goes with the switch namespace).
"""

import contextlib
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import time

from homagg.deploy.local.testbed import Testbed

from helpers import wait_for

SSH_PORT = 2222


def _port_open(ip, port):
    with contextlib.suppress(OSError), socket.create_connection((ip, port), timeout=0.5) as s:
        return s.recv(4).startswith(b"SSH")
    return False


def keygen(path):
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "homagg-test", "-f", path],
        check=True,
        capture_output=True,
    )
    return path


def _free_third_octet():
    """X such that no route here covers 10.79.X.0/24 (another rack, perhaps
    left behind by a killed run, must not capture our SSH traffic).  From
    SystemRandom: pytest plugins reseed the random module per test."""
    routes = subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True).stdout
    used = {int(m) for m in re.findall(r"^10\.79\.(\d+)\.", routes, re.M)}
    free = [x for x in range(256) if x not in used]
    if not free:
        raise RuntimeError("every 10.79.X.0/24 is in use: remove stale test racks")
    return random.SystemRandom().choice(free)


@contextlib.contextmanager
def running_rack(tmp, **spec):
    """A Rack(tmp, **spec) brought up, and taken down on exit (also when
    bringing it up failed half way)."""
    r = Rack(tmp, **spec)
    try:
        r.up()
        yield r
    finally:
        r.down()


class Rack:
    def __init__(self, tmp, workers=2, aggregators=1):
        self.tmp = str(tmp)
        self.name = "p" + secrets.token_hex(4)
        self.subnet_third = _free_third_octet()
        self.subnet = f"10.79.{self.subnet_third}.0/24"
        self.ctl_ip = f"10.79.{self.subnet_third}.254"
        self.unused_ip = f"10.79.{self.subnet_third}.99"  # in the subnet, no host
        self.ctl_if = "hgc" + secrets.token_hex(3)
        self.workers = workers
        self.aggregators = aggregators
        self.tb = None
        self.sshd = {}
        self.key = os.path.join(self.tmp, "id_client")
        self.wrong_key = os.path.join(self.tmp, "id_wrong")

    def up(self):
        from pyroute2 import IPRoute

        os.makedirs("/run/sshd", exist_ok=True)
        self.tb = Testbed.up(
            self.name,
            workers=self.workers,
            subnet=self.subnet,
            state_dir=os.path.join(self.tmp, "testbeds"),
            aggregators=self.aggregators,
        )
        sw = self.tb.state()["switch_netns"]
        with IPRoute() as ipr:
            ipr.link(
                "add", ifname=self.ctl_if, kind="veth", peer={"ifname": "ctl", "net_ns_fd": sw}
            )
            idx = ipr.link_lookup(ifname=self.ctl_if)[0]
            ipr.addr("add", index=idx, address=self.ctl_ip, prefixlen=24)
            ipr.link("set", index=idx, state="up")
        subprocess.run(["ip", "-n", sw, "link", "set", "ctl", "master", "br0", "up"], check=True)
        keygen(self.key)
        keygen(self.wrong_key)
        auth = os.path.join(self.tmp, "authorized_keys")
        with open(self.key + ".pub") as src, open(auth, "w") as dst:
            dst.write(src.read())
        os.chmod(auth, 0o600)
        for h in self.tb.hosts():
            hostkey = keygen(os.path.join(self.tmp, f"hostkey_{h.name}"))
            cfg = os.path.join(self.tmp, f"sshd_{h.name}.conf")
            with open(cfg, "w") as f:
                f.write(f"""ListenAddress {h.ip}
HostKey {hostkey}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthorizedKeysFile {auth}
StrictModes no
UsePAM no
PidFile none
Subsystem sftp /usr/lib/openssh/sftp-server
LogLevel ERROR
MaxStartups 50
""")
            log = open(os.path.join(self.tmp, f"sshd_{h.name}.log"), "w")
            self.sshd[h.name] = self.tb.run_in(
                h.name,
                ["/usr/sbin/sshd", "-D", "-e", "-f", cfg, "-p", str(SSH_PORT)],
                stdout=log,
                stderr=log,
            )
            log.close()
        for h in self.tb.hosts():
            wait_for(
                lambda: _port_open(h.ip, SSH_PORT) or self.sshd[h.name].poll() is not None,
                15,
                f"sshd on {h.name}",
            )
            if self.sshd[h.name].poll() is not None:
                raise RuntimeError(
                    f"sshd on {h.name} exited: "
                    + open(os.path.join(self.tmp, f"sshd_{h.name}.log")).read()
                )
        return self

    def hosts(self):
        return self.tb.hosts()

    def down(self):
        for p in self.sshd.values():
            # each connection's sshd is a child of the listener that left its
            # process group (setsid): stop those by PID first
            for pid in _children(p.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            p.stop()
        if self.tb is not None:
            # what the tests started over SSH and left running (a test cut
            # short by its time limit before `homagg down`): every process
            # inside one of the rack's hosts' namespaces, by PID
            _stop_inside([h.netns for h in self.tb.hosts()])
            Testbed.down(self.name, state_dir=self.tb.state_dir)
        from pyroute2 import IPRoute

        with IPRoute() as ipr, contextlib.suppress(Exception):
            for idx in ipr.link_lookup(ifname=self.ctl_if):
                ipr.link("del", index=idx)


def _stop_inside(netns_names, timeout=5.0):
    """SIGTERM, then SIGKILL after ``timeout``, every process whose network
    namespace is one of these (found by the namespace's inode in /proc)."""
    inodes = set()
    for name in netns_names:
        with contextlib.suppress(OSError):
            inodes.add(os.stat(f"/run/netns/{name}").st_ino)
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{d}/ns/net").st_ino in inodes:
                    pids.append(int(d))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if os.path.exists(f"/proc/{p}") and _state(p) not in ("Z", "X")]
            time.sleep(0.05)
        if not pids:
            return


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


def _children(pid):
    """PIDs whose parent is ``pid`` (from /proc)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(d))
    return out


def host_table(h, key, install_dir, port=SSH_PORT, **extra):
    """One [[hosts]] entry for testbed host ``h`` (aggregator: af_packet vdev
    on eth0; workers: kernel iface eth0)."""
    d = {
        "name": h.name,
        "ssh_host": h.ip,
        "ssh_port": port,
        "ssh_user": "root",
        "ssh_key": key,
        "role": h.role,
        "dataplane_ip": f"{h.ip}/{h.prefixlen}",
        "cores": [0],
        "install_dir": install_dir,
    }
    if h.role == "aggregator":
        d["vdev"] = f"net_af_packet0,iface={h.ifname}"
    else:
        d["iface"] = h.ifname
    d.update(extra)
    return d


def to_toml(settings, hosts):
    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {val(x)}" for k, x in v.items()) + " }"
        raise TypeError(v)

    lines = ["[settings]"] + [f"{k} = {val(v)}" for k, v in settings.items()]
    for h in hosts:
        lines += ["", "[[hosts]]"] + [f"{k} = {val(v)}" for k, v in h.items()]
    return "\n".join(lines) + "\n"
