"""Run HomAgg on the real hosts of an inventory over SSH (fabric): up, run, down.

    homagg up -i testbed.toml              # homagg-switch on every aggregator, in the background
    homagg run allreduce -i testbed.toml --method lhc --elements 1000000 --density 0.01
    homagg down -i testbed.toml            # stop every process started, remove the run state

The hosts must have been provisioned (``homagg provision -i``): each has its
venv, its config file and, on the aggregator, the built ``homagg-switch``.

Before anything starts, a preflight logs in to every host (the provision
preflight: SSH login, root or passwordless sudo, OS) and checks what the
command needs: the host config file, ``import homagg._hg`` in the host's
venv, on the aggregator the daemon binary and its data-plane device (a PCI
address must exist in /sys/bus/pci/devices and be bound to its driver; a
vdev's interface must exist), on each worker its data-plane address on its
kernel interface.  Any failure stops the command with one error naming every
failing host and the fix.

``up`` then registers one job for every worker host on the daemons and
writes its job file (homagg.switch.job_file) on every host as
INSTALL_DIR/run/job.json: a torchrun user points HOMAGG_JOB_FILE at it on
the worker hosts.  ``down`` removes that job before it stops the daemons.
With ``--auth`` the job authenticates every frame: its secret goes to the
daemons in the control request (on the remote command's stdin) and to the
workers as a file of mode 0600 that the job file names
(homagg.deploy.remote.secret: the inventory's provisioned ``auth_secret``,
else a new INSTALL_DIR/run/job.secret).

``up --leaves L`` registers a two-level tree instead (docs/PROTOCOL.md
"Tree"): the inventory's first L aggregator hosts are leaves below the
last one, the root; each worker host's job file names its leaf.  With
``--auth`` each leaf has a secret of its own, on the hosts of its workers
only (INSTALL_DIR/run/leaf-L.secret), and no file holds the root's.

Run state lives on each host in INSTALL_DIR/run/: ``switch.pid``,
``switch.log``, ``control.sock`` (aggregator), ``job.json`` and one PID file per worker
process while a run is in progress.  A PID file holds "PID STARTTIME" (from
/proc/PID/stat), so a PID reused by another process is never signalled.
``down`` stops the processes its PID files name (SIGTERM to the process
group, SIGKILL after 10 s) and removes INSTALL_DIR/run/.

An inventory with several aggregator hosts spreads every job over all of
them, in inventory order (shard k is the k-th aggregator host,
docs/PROTOCOL.md "Several aggregators"): ``up`` starts a daemon on each,
``run`` registers the job on each and gives every worker the K addresses,
``down`` stops them all.

``run allreduce -i`` is homagg.runs.allreduce.run_allreduce on
homagg.deploy.remote.placement.InventoryPlacement: it registers a job over
the daemons' control sockets (by running ``python -m homagg.switch.control``
on each aggregator), starts one worker process per worker host (``python -m
homagg.runs.job --child SPEC``: each builds its gradient from the seed),
releases them together (after the warmup, once more), waits with a timeout,
copies every result, worker log, worker report and the daemon log into
RUNS_DIR/<timestamp>-<method>/, checks bit-exactness against the reference
and writes report.json there.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
import tomllib

from homagg import auth as hg_auth
from homagg.deploy.remote import inventory as inv
from homagg.deploy.remote import secret as hsecret
from homagg.deploy.remote import ssh
from homagg.errors import ConfigError, HomAggError, RemoteError  # noqa: F401 - RemoteError importable from here
from homagg.ops import logfmt
from homagg.protocol import resolve_slots
from homagg.runs import job as localrun
from homagg.switch import job_file
from homagg.switch.daemon import eal_args

log = logging.getLogger("homagg.deploy.remote.hosts")

SOCKET_PATH_MAX = 107  # sun_path minus the terminating NUL
UP_JOB_GROUP = "239.77.0.3"  # the results' multicast group of the job `up` registers

# Shell functions sent ahead of the process commands (POSIX sh).  Field 22 of
# /proc/PID/stat (the 20th after the ") " closing the command name) is the
# start time: together with the PID it names one process for its lifetime.
_SH = r"""
hg_start() {
  f=$1; log=$2; shift 2
  nohup setsid "$@" >"$log" 2>&1 </dev/null &
  pid=$!
  echo "$pid $(sed 's/.*) //' /proc/$pid/stat 2>/dev/null | cut -d' ' -f20)" >"$f"
  echo "$pid"
}
hg_alive() {
  [ -f "$1" ] || return 1
  read pid st <"$1" || return 1
  s=$(sed 's/.*) //' /proc/"$pid"/stat 2>/dev/null) || return 1
  [ -n "$s" ] && [ "$(echo "$s" | cut -d' ' -f20)" = "$st" ] && [ "$(echo "$s" | cut -d' ' -f1)" != Z ]
}
hg_stop() {
  if hg_alive "$1"; then
    read pid st <"$1"
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
    i=0
    while hg_alive "$1" && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
    if hg_alive "$1"; then kill -KILL -- "-$pid" 2>/dev/null; echo "killed $pid $1"; else echo "stopped $pid $1"; fi
  fi
  rm -f "$1"
}
"""


def rundir(h: inv.HostSpec) -> str:
    return f"{h.install_dir}/run"


def control_socket(h: inv.HostSpec) -> str:
    return f"{rundir(h)}/control.sock"


def switch_pidfile(h: inv.HostSpec) -> str:
    return f"{rundir(h)}/switch.pid"


def switch_log(h: inv.HostSpec) -> str:
    return f"{rundir(h)}/switch.log"


def job_file_path(h: inv.HostSpec) -> str:
    """The job file `up` writes on every host (HOMAGG_JOB_FILE on a worker)."""
    return f"{rundir(h)}/job.json"


def stop_started(started, run_id, warn):
    """Stop every process of a run ((host, pidfile) pairs) and remove the
    run's folder on its host; warn(host, exception) for a host that fails,
    and go on with the others."""
    for r, pidfile in started:
        try:
            r.sh(
                f"hg_stop {shlex.quote(pidfile)} >/dev/null; "
                f"rm -rf {shlex.quote(rundir(r.h) + '/' + run_id)}",
                check=False,
            )
        except Exception as e:  # noqa: BLE001 - report, keep cleaning the others
            warn(r, e)


class Host(ssh.Session):
    """The SSH session to one host (homagg.deploy.remote.ssh.Session: connect, preflight,
    run as root) plus the checks and process handling of up/run/down."""

    def __init__(self, h: inv.HostSpec, inventory: inv.Inventory, switch: str | None = None):
        super().__init__(h, inventory)
        self.switch_override = switch
        self.conf: dict = {}

    @property
    def python(self) -> str:
        return f"{self.h.venv}/bin/python"

    def sh(self, script: str, check: bool = True, timeout: float | None = None):
        """Run ``script`` with the process functions defined."""
        return self.run(_SH + script, check=check, timeout=timeout)

    @property
    def switch_binary(self) -> str:
        if self.switch_override:
            return self.switch_override
        src = self.conf.get("host", {}).get("source_dir", "")
        return f"{src}/build/release/homagg-switch" if src else ""

    def check(self, need_switch: bool = True) -> None:
        """What up/run need on this host, after the preflight (login,
        privilege, OS: homagg.deploy.remote.ssh.preflight_all).  StepFailed names the fix."""
        h = self.h
        fix = f"run `homagg provision -i {self.inv.path}`"
        r = self.run(f"cat {shlex.quote(h.config_file)}", check=False)
        if r.exited != 0:
            raise ssh.StepFailed(
                f"no host config {h.config_file} on {h.name}: the host is not provisioned: {fix}"
            )
        try:
            self.conf = tomllib.loads(r.stdout)
        except tomllib.TOMLDecodeError as e:
            raise ssh.StepFailed(
                f"{h.config_file} on {h.name} is not valid TOML ({e}): {fix}"
            ) from None
        if self.conf.get("host", {}).get("role") != h.role:
            raise ssh.StepFailed(
                f"{h.config_file} on {h.name} says role "
                f"{self.conf.get('host', {}).get('role')!r}, the inventory "
                f"{h.role!r}: {fix} again"
            )
        r = self.run(f"{shlex.quote(self.python)} -c 'import homagg._hg, numpy'", check=False)
        if r.exited != 0:
            raise ssh.StepFailed(
                f"homagg does not import in {h.venv} on {h.name}: {fix}", ssh.tail(r.stderr)
            )
        if h.role == "aggregator":
            if len(control_socket(h)) > SOCKET_PATH_MAX:
                raise ssh.StepFailed(
                    f"control socket path {control_socket(h)} is longer than "
                    f"{SOCKET_PATH_MAX} bytes: use a shorter 'install_dir'"
                )
            binary = self.switch_binary
            if need_switch and (
                not binary or self.run(f"test -x {shlex.quote(binary)}", check=False).exited != 0
            ):
                where = binary or f"no source_dir in {h.config_file}"
                raise ssh.StepFailed(
                    f"homagg-switch not found on {h.name} ({where}): provision from an sdist "
                    "(it builds the daemon), or pass --switch PATH"
                )
            if h.pci:
                dev = f"/sys/bus/pci/devices/{h.pci}"
                if self.run(f"test -e {dev}", check=False).exited != 0:
                    raise ssh.StepFailed(
                        f"no PCI device {h.pci} on {h.name} ({dev} missing): fix "
                        "'pci' in the inventory (`lspci -D` on the host lists them)"
                    )
                cur = self.run(
                    f'basename "$(readlink {dev}/driver)" 2>/dev/null', check=False
                ).stdout.strip()
                if cur != h.driver:
                    raise ssh.StepFailed(
                        f"PCI device {h.pci} on {h.name} is bound to "
                        f"{cur or 'no driver'}, not {h.driver}: {fix} (step nic_bind)"
                    )
        kif = h.kernel_iface
        if kif and self.run(f"test -e /sys/class/net/{shlex.quote(kif)}", check=False).exited != 0:
            raise ssh.StepFailed(
                f"interface {kif} does not exist on {h.name}: fix 'vdev'/'iface' "
                "in the inventory (`ip link` on the host lists them)"
            )
        if h.role == "worker":
            if not h.iface:
                raise ssh.StepFailed(
                    f"worker {h.name} has no kernel interface: the worker process "
                    "uses the kernel UDP stack, give it iface = '...'"
                )
            r = self.run(f"ip -o -4 addr show dev {shlex.quote(h.iface)}", check=False)
            if h.dataplane_ip not in r.stdout.split():
                raise ssh.StepFailed(
                    f"{h.dataplane_ip} is not on {h.iface} on {h.name}: {fix} (step address)"
                )

    def alive(self, pidfile: str) -> bool:
        return self.sh(f"hg_alive {shlex.quote(pidfile)}", check=False).exited == 0

    def start(
        self, pidfile: str, log: str, argv: list[str], cwd: str, env: dict | None = None
    ) -> int:
        """Start ``argv`` in its own session in the background; returns its PID."""
        envs = ["env", *(f"{k}={v}" for k, v in (env or {}).items())] if env else []
        cmd = " ".join(map(shlex.quote, [*envs, *argv]))
        r = self.sh(
            f"mkdir -p {shlex.quote(cwd)} && cd {shlex.quote(cwd)} && "
            f"hg_start {shlex.quote(pidfile)} {shlex.quote(log)} {cmd}"
        )
        return int(r.stdout.split()[-1])

    def stop_all(self) -> list[str]:
        """Stop every process a PID file in the run directory names; remove the directory."""
        d = shlex.quote(rundir(self.h))
        r = self.sh(f'for f in {d}/*.pid; do [ -e "$f" ] && hg_stop "$f"; done; rm -rf {d}; true')
        return [ln for ln in r.stdout.splitlines() if ln.strip()]

    def put_job_file(self, path: str, fields: dict) -> None:
        """Write a job file (homagg.switch.job_file) on this host, readable by
        root only; replaced at once (a new file renamed over it), so a
        worker reading it meanwhile sees the old or the new one, whole."""
        d = shlex.quote(os.path.dirname(path))
        tmp = shlex.quote(path + ".new")
        self.run(
            f"mkdir -p {d} && (umask 077 && printf %s {shlex.quote(json.dumps(fields))} "
            f"> {tmp}) && mv -f {tmp} {shlex.quote(path)}"
        )

    def job_file_fields(self) -> dict | None:
        """The job file `up` left on this host (None when there is none)."""
        r = self.run(f"cat {shlex.quote(job_file_path(self.h))}", check=False)
        return json.loads(r.stdout) if r.exited == 0 and r.stdout.strip() else None

    def control(self, request: dict, wait: float = 0.0, pid: int = 0) -> dict:
        """One request to the daemon's control socket (python -m homagg.switch.control on this host)."""
        cmd = (
            f"{shlex.quote(self.python)} -m homagg.switch.control --wait {wait:g} --pid {pid} "
            f"{shlex.quote(control_socket(self.h))} -"
        )
        # the request on stdin: one with a secret never shows in a process listing or a log
        r = self.run(cmd, check=False, timeout=wait + 30, stdin=json.dumps(request) + "\n")
        if r.exited != 0:
            raise RemoteError(
                f"host '{self.h.name}': control request {request.get('cmd')} failed: "
                f"{(r.stderr or r.stdout).strip()[-600:]}"
            )
        return json.loads(r.stdout.strip().splitlines()[-1])


def open_hosts(
    inventory: inv.Inventory,
    out=None,
    switch: str | None = None,
    consequence: str = "nothing was started",
) -> list[Host]:
    """Connect to every host and run the preflight; PreflightError (naming
    every failing host and its fix) before anything starts."""
    out = out or sys.stdout
    hosts = [Host(h, inventory, switch) for h in inventory.hosts]
    try:
        ssh.preflight_all(
            hosts, inventory.settings.parallel, out, consequence, check=lambda r: r.check()
        )
    except BaseException:
        for r in hosts:
            r.close()
        raise
    return hosts


def _aggregators(hosts: list[Host]) -> list[Host]:
    """The aggregator hosts in inventory order: shard k is the k-th."""
    return [r for r in hosts if r.h.role == "aggregator"]


def switch_argv(
    h: inv.HostSpec, binary: str, hugepages_mount: str, no_udp_csum: bool = False, frames: int = 0
) -> list[str]:
    """homagg-switch's command line for aggregator ``h`` (docs/SWITCH.md):
    its PCI NIC (-a, hugepages) or vdev, its cores, its data-plane IP, and a
    receive ring for ``frames`` (W x S of its job) in flight: af_packet's
    framecnt, or --rx-ring (a power of two) above the daemon's 1024."""
    huge = h.hugepages and h.hugepages.count
    eal = eal_args(
        ",".join(map(str, h.cores)),
        file_prefix=f"homagg-{h.name}",
        pci=h.pci or None,
        vdev=None if h.pci else localrun.vdev_for_mtu(h.vdev, h.mtu, frames),
        hugepages_dir=hugepages_mount.replace("{name}", h.name) if huge else None,
    )
    opts = [
        "--port-ip",
        h.address,
        "--udp-port",
        str(localrun.UDP_PORT),
        "--control",
        control_socket(h),
        "--mtu",
        str(h.mtu),
    ]
    if frames > 1024 and not (h.vdev or "").startswith(("net_af_packet", "eth_af_packet")):
        opts += ["--rx-ring", str(min(32768, 1 << (int(frames) - 1).bit_length()))]
    return [
        binary,
        *eal,
        "--",
        *opts,
        *(["--no-udp-csum"] if no_udp_csum else []),
        *logfmt.daemon_args(),
    ]


# --------------------------------------------------------------------------
# up / down


def _up_one(
    agg: Host,
    inventory: inv.Inventory,
    no_udp_csum: bool,
    ready_timeout: float,
    out,
    slots: int | None = None,
) -> dict:
    """homagg-switch on one aggregator, ready (its control socket answers),
    with a receive ring for ``slots`` frames of every worker in flight."""
    h = agg.h
    if agg.alive(switch_pidfile(h)):
        raise RemoteError(
            f"host '{h.name}': homagg-switch already runs ({switch_pidfile(h)}): "
            f"stop it first with `homagg down -i {inventory.path}`"
        )
    slots = resolve_slots(slots, len(inventory.workers))
    argv = switch_argv(
        h,
        agg.switch_binary,
        inventory.settings.hugepages_mount,
        no_udp_csum,
        frames=len(inventory.workers) * slots,
    )
    rt = f"{rundir(h)}/rt"
    agg.run(f"mkdir -p {shlex.quote(rt)}")
    pid = agg.start(
        switch_pidfile(h),
        switch_log(h),
        argv,
        rundir(h),
        env={"RUNTIME_DIRECTORY": rt, "XDG_RUNTIME_DIR": rt},
    )
    try:
        agg.control({"cmd": "stats"}, wait=ready_timeout, pid=pid)
    except RemoteError as e:
        log = agg.run(f"tail -n 30 {shlex.quote(switch_log(h))}", check=False).stdout
        agg.stop_all()
        raise RemoteError(
            f"host '{h.name}': homagg-switch did not become ready within "
            f"{ready_timeout:g} s ({e}); its log:\n{log}"
        ) from None
    print(
        f"homagg-switch up on {h.name} (pid {pid}, {h.vdev or 'pci ' + h.pci}, ip {h.address}), "
        f"control socket {control_socket(h)}",
        file=out,
    )
    rec = {
        "host": h.name,
        "pid": pid,
        "control": control_socket(h),
        "log": switch_log(h),
        "argv": argv,
    }
    if h.metrics_port:
        rec["exporter"] = _up_exporter(agg, ready_timeout, out)
    return rec


def _up_exporter(agg: Host, ready_timeout: float, out) -> dict:
    """homagg exporter beside the daemon (inventory field metrics_port), its
    PID file in the run directory, so `homagg down` stops it with the daemon."""
    h = agg.h
    url = f"http://{h.metrics_bind}:{h.metrics_port}/metrics"
    if agg.run("systemctl is-active --quiet homagg-exporter", check=False).exited == 0:
        print(f"homagg exporter on {h.name}: the homagg-exporter service serves {url}", file=out)
        return {"service": "homagg-exporter", "url": url}
    pidfile, logf = f"{rundir(h)}/exporter.pid", f"{rundir(h)}/exporter.log"
    argv = [
        agg.python,
        "-m",
        "homagg.cli",
        "exporter",
        "--socket",
        f"{h.name}={control_socket(h)}",
        "--port",
        str(h.metrics_port),
        "--bind",
        h.metrics_bind,
    ]
    pid = agg.start(pidfile, logf, argv, rundir(h))
    if not _wait_remote(
        agg, f"grep -q '^homagg exporter: http' {shlex.quote(logf)}", pidfile, ready_timeout
    ):
        tail = agg.run(f"tail -n 20 {shlex.quote(logf)}", check=False).stdout
        agg.stop_all()
        raise RemoteError(
            f"host '{h.name}': homagg exporter did not serve on "
            f"{h.metrics_bind}:{h.metrics_port} within {ready_timeout:g} s "
            f"(metrics_port / metrics_bind in the inventory); its log:\n{tail}"
        )
    print(f"homagg exporter up on {h.name} (pid {pid}): {url}", file=out)
    return {"pid": pid, "url": url, "log": logf}


def up(
    inventory: inv.Inventory,
    switch: str | None = None,
    no_udp_csum: bool = False,
    ready_timeout: float = 30.0,
    out=None,
    **job_options,
) -> dict:
    """Start homagg-switch on every aggregator (in parallel) and wait until
    each control socket answers, then register one job for every worker
    host spread over them and write its job file on every host
    (job_file_path; ``job_options``: slots, payload, timeout, group, and
    ``auth`` / ``mac``: an authenticated job, _up_secret);
    returns the first daemon's {"host", "pid", "control", "log", "argv"}
    with "aggregators": the list of all of them and "job": the job file's
    fields.  ``leaves`` L: the job is a two-level tree instead
    (_up_tree_job; check_tree says which inventories can hold one).  One
    failing host does not hide the others: RemoteError names each.  When
    it fails, what this call started is stopped again (the
    daemons that did start, the job files and a generated secret), so the
    next `up` does not find a daemon nobody registered a job on."""
    out = out or sys.stdout
    leaves = int(job_options.get("leaves") or 0)
    if leaves:
        check_tree(inventory, leaves)
    hosts = open_hosts(inventory, out, switch)
    started = []
    try:
        aggs = _aggregators(hosts)
        if job_options.get("auth") and inventory.settings.auth_secret and not leaves:
            # the provisioned secret is checked (read only) before anything starts
            job_options["placed"] = _up_secret(
                [r for r in hosts if r.h.role == "worker"], inventory, inventory.settings.parallel
            )

        def one(agg):
            try:
                return _up_one(
                    agg, inventory, no_udp_csum, ready_timeout, out, slots=job_options.get("slots")
                )
            except Exception as e:  # noqa: BLE001 - collected per host below
                return e

        res = ssh.parallel(one, aggs, inventory.settings.parallel)
        started = [a for a in aggs if not isinstance(res[a.h.name], Exception)]
        bad = {n: v for n, v in res.items() if isinstance(v, Exception)}
        if bad:
            raise RemoteError(
                "homagg-switch did not start on every aggregator: "
                + "; ".join(str(e) for e in bad.values())
            )
        infos = [res[a.h.name] for a in aggs]
        # every daemon is this call's: the workers' run directories hold only what it writes
        started += [r for r in hosts if r.h.role == "worker"]
        job = _up_job(hosts, inventory, out, **job_options)
        started = []
        return {**infos[0], "aggregators": infos, "job": job}
    except BaseException:
        if started:
            _undo_up(started, inventory, out)
        raise
    finally:
        for r in hosts:
            r.close()


def _undo_up(hosts: list[Host], inventory: inv.Inventory, out) -> None:
    """Stop what a failed `up` started on these hosts (the aggregators whose
    daemon it started; the worker hosts once every daemon was its own) and
    remove their run directories, and say so; a host that fails is named,
    not raised over the error that made `up` fail."""

    def one(r):
        try:
            return r.stop_all()
        except Exception as e:  # noqa: BLE001 - reported below
            return e

    for name, v in ssh.parallel(one, hosts, inventory.settings.parallel).items():
        if isinstance(v, Exception):
            print(
                f"{name}: not cleaned up after the failed up ({type(v).__name__}: {v}): "
                f"run `homagg down -i {inventory.path}`",
                file=out,
            )
        elif v:
            print(f"{name}: stopped after the failed up: " + "; ".join(v), file=out)


def calibration_file(h: inv.HostSpec) -> str:
    """Where `homagg calibrate -i` keeps a worker host's calibration."""
    return f"{h.install_dir}/calibration.json"


def calibrate(inventory: inv.Inventory, out=None, elements: int = 1 << 20, repeat: int = 5) -> dict:
    """`homagg calibrate -i`: `homagg calibrate` on every worker host, one
    host after the other (hosts that share a machine would slow each other
    down), into calibration_file on that host; returns {host: calibration}.
    A host that fails is named in the RemoteError after the others ran.
    When every host was measured and `up`'s job runs with a cost model, its
    job files get the new one (refresh_up_cost)."""
    from homagg import cost

    out = out or sys.stdout
    hosts = open_hosts(inventory, out, consequence="nothing was measured")
    failures, cals = [], {}
    try:
        for r in (r for r in hosts if r.h.role == "worker"):
            path = calibration_file(r.h)
            res = r.run(
                f"{shlex.quote(r.python)} -m homagg.cli calibrate --json --out "
                f"{shlex.quote(path)} --elements {int(elements)} --repeat {int(repeat)}",
                check=False,
                timeout=max(120.0, inventory.settings.command_timeout),
            )
            try:
                if res.exited != 0:
                    raise ValueError(ssh.tail(res.stderr) or f"exit status {res.exited}")
                cal = cost.check_calibration(json.loads(res.stdout), f"host '{r.h.name}'")
            except ValueError as e:
                failures.append((r.h.name, "calibrate", str(e).strip(), ""))
                continue
            cals[r.h.name] = cal
            c = cost.coefficients(cal, cal["isa"])
            print(
                f"{r.h.name}: {cal['cpu']}, jobs use {cal['isa']}: "
                + "  ".join(f"{k} {v}" for k, v in c.items())
                + f" ({path})",
                file=out,
            )
        if not failures:
            job = refresh_up_cost(inventory, hosts)
            if job is not None:
                print(
                    f"job {job} of `homagg up -i`: every host's job file "
                    f"({job_file_path(hosts[0].h)}) has the new cost model; ranks "
                    "started from now on decide with it",
                    file=out,
                )
    finally:
        for r in hosts:
            r.close()
    if failures:
        raise RemoteError(ssh.failure_message("calibrate failed", failures))
    return cals


def refresh_up_cost(inventory: inv.Inventory, hosts: list[Host]):
    """Give the running job of `up` (its job file on every host, flat or a
    tree) the cost model a job registered now takes (inventory_cost: the
    worker hosts' calibrations), each file replaced whole with only its
    ``cost`` changed; the daemons keep no cost, and the ranks read it from
    the job file when they start.  A job registered without a cost model
    keeps none.  Returns the job's id, or None when no job with a model
    runs (no job file on any host)."""
    from homagg import cost

    own = ssh.parallel(lambda r: r.job_file_fields(), hosts, inventory.settings.parallel)
    first = next((f for f in own.values() if f), None)
    if first is None or not cost.as_cost(first.get("cost")).timed:
        return None
    new = inventory_cost(inventory, hosts).to_dict()
    ssh.parallel(
        lambda r: (
            own[r.h.name] and r.put_job_file(job_file_path(r.h), dict(own[r.h.name], cost=new))
        ),
        hosts,
        inventory.settings.parallel,
    )
    return first["job"]


def host_calibrations(hosts: list[Host]) -> dict:
    """{worker host: its calibration} of the worker hosts that have one
    (calibration_file; a malformed one is an error naming the host)."""
    from homagg import cost

    cals = {}
    for r in (r for r in hosts if r.h.role == "worker"):
        res = r.run(f"cat {shlex.quote(calibration_file(r.h))}", check=False)
        if res.exited != 0:
            continue
        try:
            cals[r.h.name] = cost.check_calibration(
                json.loads(res.stdout), f"{calibration_file(r.h)} on host '{r.h.name}'"
            )
        except ValueError as e:
            raise RemoteError(f"{e}: run `homagg calibrate -i {r.inv.path}` again") from None
    return cals


def inventory_cost(inventory, hosts: list[Host] | None = None):
    """The cost model a job on the inventory's hosts registers: the
    inventory's ``link_mbit`` (none without it) with, coefficient by
    coefficient, the slowest of the worker hosts' calibrations when every
    worker host has one (`homagg calibrate -i`; ``hosts``: open sessions to
    read them), else the calibration of the host creating the job
    (homagg.cost.job_cost; docs/PROTOCOL.md "The cost model")."""
    from homagg import cost

    if not inventory.settings.link_mbit:
        return cost.Cost()
    workers = [r for r in hosts or [] if r.h.role == "worker"]
    cals = host_calibrations(workers) if workers else {}
    if workers and len(cals) == len(workers):
        return cost.job_cost(
            inventory.settings.link_mbit,
            coeffs=cost.slowest(*(cost.coefficients(c, c["isa"]) for c in cals.values())),
        )
    return cost.job_cost(inventory.settings.link_mbit)


def up_secret_file(h: inv.HostSpec) -> str:
    """The secret `up -i --auth` makes when the inventory names no
    ``auth_secret``: in the run directory (``down`` removes it)."""
    return f"{rundir(h)}/job.secret"


def _up_secret(workers: list[Host], inventory: inv.Inventory, parallel: int):
    """The secret of `up --auth` and each worker host's path of its file: the
    inventory's ``auth_secret`` as provisioned (checked on every host), else
    a new one put into every worker's run directory."""
    if inventory.settings.auth_secret:
        secret = hsecret.local_secret(inventory, create=False)
        states = ssh.parallel(
            lambda r: hsecret.host_state(r, r.h.secret_file, secret), workers, parallel
        )
        bad = {n: s for n, s in states.items() if s != "ok"}
        if bad:
            raise RemoteError(
                "the job secret of 'auth_secret' is not in place: "
                + "; ".join(f"host '{n}': {s}" for n, s in bad.items())
                + f": run `homagg provision -i {inventory.path}` (step secret)"
            )
        return secret, {r.h.name: r.h.secret_file for r in workers}
    secret = hg_auth.new_secret()
    ssh.parallel(lambda r: hsecret.put(r, up_secret_file(r.h), secret), workers, parallel)
    return secret, {r.h.name: up_secret_file(r.h) for r in workers}


def check_tree(inventory: inv.Inventory, leaves: int) -> None:
    """What `up --leaves L` needs of the inventory, checked before any host
    is touched: L + 1 aggregator hosts exactly (the first L the leaves, in
    inventory order, the last one the root), at most one leaf per worker
    host, and a root on a kernel interface (net_af_packet or net_af_xdp),
    whose MAC address the leaves send to.  ConfigError names the fix."""
    aggs = [h for h in inventory.hosts if h.role == "aggregator"]
    W = sum(1 for h in inventory.hosts if h.role == "worker")
    where = f"inventory {inventory.path}"
    if len(aggs) != leaves + 1:
        raise ConfigError(
            f"--leaves {leaves}: {where} names {len(aggs)} aggregator host(s); a standing "
            f"tree of {leaves} leaves takes {leaves + 1} (the first {leaves} the leaves, "
            "the last the root): give --leaves "
            + (f"{len(aggs) - 1}" if len(aggs) > 1 else "0 (one aggregator holds no tree)")
            + " or change the inventory's aggregator hosts"
        )
    if not 1 <= leaves <= W:
        raise ConfigError(
            f"--leaves {leaves}: {where} names {W} worker host(s), and every leaf "
            f"needs one: give --leaves 1..{W}"
        )
    if not aggs[-1].kernel_iface:
        raise ConfigError(
            f"--leaves {leaves}: the tree's root, host '{aggs[-1].name}', has a PCI NIC "
            "whose MAC address the leaves cannot learn here: make an aggregator with a "
            "vdev (net_af_packet/net_af_xdp on a kernel interface) the last one of the "
            "inventory"
        )


def tree_secret_file(h: inv.HostSpec, leaf: int, epoch: int = 0) -> str:
    """Leaf ``leaf``'s secret of key epoch ``epoch`` on one of its worker
    hosts (the run directory: `down` removes it)."""
    return f"{rundir(h)}/{job_file.leaf_secret_name(leaf, epoch)}"


def _up_job(
    hosts: list[Host],
    inventory: inv.Inventory,
    out,
    slots: int | None = None,
    payload: int | None = None,
    timeout: float = 10.0,
    group: str = UP_JOB_GROUP,
    auth: bool = False,
    mac: str | None = None,
    placed=None,
    leaves: int = 0,
) -> dict:
    """The job of `up`: every worker host, spread over every aggregator, and
    its job file on every host (a worker's names its own bind address and,
    with ``auth``, its own copy of the job secret: _up_secret, or
    ``placed``, what it returned already).  ``leaves``: a tree
    (_up_tree_job)."""
    aggs = _aggregators(hosts)
    workers = [r for r in hosts if r.h.role == "worker"]
    payload = localrun.job_payload(  # None: the largest the inventory's MTU carries
        payload, min(h.mtu for h in inventory.hosts), f"inventory {inventory.path}"
    )
    if leaves:
        return _up_tree_job(
            hosts, inventory, out, leaves, slots, payload, timeout, group, auth, mac
        )
    secret, files = (
        (None, {})
        if not auth
        else placed or _up_secret(workers, inventory, inventory.settings.parallel)
    )
    placed = None
    fields = job_file.register(
        [a.control for a in aggs],
        [(a.h.address, localrun.UDP_PORT) for a in aggs],
        workers=len(workers),
        slots=slots,
        payload=payload,
        group=group,
        timeout=timeout,
        cost=inventory_cost(inventory, hosts),
        auth=secret,
        mac=mac,
    )
    del secret

    def own(r):
        f = dict(fields)
        if r.h.role == "worker":
            f["bind"] = r.h.address
        if auth:  # an aggregator's job file names no secret file: it has none
            f["auth_file"] = files.get(r.h.name, "")
        return f

    ssh.parallel(
        lambda r: r.put_job_file(job_file_path(r.h), own(r)), hosts, inventory.settings.parallel
    )
    print(
        f"job {fields['job']} for {len(workers)} workers on {fields['aggregator']}"
        + (
            f", authenticated ({fields['mac']}; the secret on every worker host: "
            f"{files[workers[0].h.name] if workers else '-'}, mode 0600)"
            if auth
            else ""
        )
        + "; job file "
        f"on every host: {job_file_path(workers[0].h) if workers else '-'} "
        "(HOMAGG_JOB_FILE for torchrun)",
        file=out,
    )
    return fields


def _up_tree_job(hosts, inventory, out, leaves, slots, payload, timeout, group, auth, mac):
    """`up --leaves L`'s job: a two-level tree over the aggregator hosts
    (job_file.register_tree: the first L the leaves, the last the root),
    one job file per worker host naming its leaf, the leaf's group, its
    place there and its bind address.  ``auth``: each leaf a new secret of
    its own, put on the hosts of that leaf's workers only
    (tree_secret_file, mode 0600); the root's secret a new one that no
    file holds: the leaves get only their keys at the root, and `homagg
    rotate-key -i` gives the root a new one (docs/PROTOCOL.md "Key epochs
    in a tree").  The inventory's ``auth_secret`` is one secret for every
    worker host, so a tree does not use it.  An aggregator host's job file
    holds worker 0's fields without a secret file (`down` and
    `rotate-key` read the job id there)."""
    aggs = _aggregators(hosts)
    workers = [r for r in hosts if r.h.role == "worker"]
    W, par = len(workers), inventory.settings.parallel
    root_host = aggs[leaves]
    iface = shlex.quote(root_host.h.kernel_iface)
    root_mac = root_host.run(f"cat /sys/class/net/{iface}/address").stdout.strip()
    leaf_of = [job_file.tree_leaf(i, W, leaves)[0] for i in range(W)]
    files = [tree_secret_file(r.h, leaf_of[i]) for i, r in enumerate(workers)]
    leaf_auth = root = None
    if auth:
        leaf_auth = [hg_auth.new_secret() for _ in range(leaves)]
        root = hg_auth.new_secret()
        own = {r.h.name: (files[i], leaf_auth[leaf_of[i]]) for i, r in enumerate(workers)}
        ssh.parallel(lambda r: hsecret.put(r, *own[r.h.name]), workers, par)
        del own
    per_worker = job_file.register_tree(
        [a.control for a in aggs],
        [(a.h.address, localrun.UDP_PORT, root_mac if k == leaves else None)
         for k, a in enumerate(aggs)],
        leaves=leaves,
        workers=W,
        slots=slots,
        payload=payload,
        group=group,
        timeout=timeout,
        cost=inventory_cost(inventory, hosts),
        auth=root,
        leaf_auth=leaf_auth,
        auth_files=files if auth else None,
        mac=mac,
    )  # fmt: skip
    del root, leaf_auth
    fields_of = {r.h.name: dict(per_worker[i], bind=r.h.address) for i, r in enumerate(workers)}
    for a in aggs:
        fields_of[a.h.name] = dict(per_worker[0], auth_file="")
    ssh.parallel(lambda r: r.put_job_file(job_file_path(r.h), fields_of[r.h.name]), hosts, par)
    first = per_worker[0]
    print(
        f"job {first['job']}: a tree of {leaves} leaves "
        + ", ".join(
            f"{aggs[k].h.name} ({sum(1 for l in leaf_of if l == k)} workers)" for k in range(leaves)
        )
        + f" below the root {root_host.h.name}"
        + (
            f", authenticated ({first['mac']}; each leaf's own secret on its workers' "
            f"hosts: {', '.join(sorted(set(files)))}, mode 0600; the root's in no file"
            + (
                "; the inventory's auth_secret, one for every host, is not used"
                if inventory.settings.auth_secret
                else ""
            )
            + ")"
            if auth
            else ""
        )
        + f"; each host's job file: {job_file_path(workers[0].h)} (HOMAGG_JOB_FILE for torchrun)",
        file=out,
    )
    return first


def up_job_secret(workers: list[Host], fields: dict | None) -> bytes | None:
    """The secret of `up`'s job (job-file ``fields``, an aggregator's: they
    name no secret file) from the first worker host's copy, read over SSH
    (its content is never logged); None when the job does not authenticate."""
    if not fields or not fields.get("mac") or not workers:
        return None
    w = workers[0]
    own = w.job_file_fields() or {}
    path = own.get("auth_file")
    if not path:
        raise RemoteError(
            f"host '{w.h.name}': the job file {job_file_path(w.h)} of "
            f"authenticated job {fields['job']} names no auth_file: "
            f"`homagg down -i {w.inv.path}` and `homagg up -i --auth` again"
        )
    return read_secret(w, path)


def read_secret(w: Host, path: str) -> bytes:
    """The secret in file ``path`` on host ``w``, read over SSH (its content
    is never logged); RemoteError naming the host and the fix when it is
    missing or malformed."""
    r = w.run(f"cat {shlex.quote(path)}", check=False)
    try:
        secret = bytes.fromhex(r.stdout.strip()) if r.exited == 0 else b""
    except ValueError:
        secret = b""
    if len(secret) != hg_auth.SECRET_LEN:
        raise RemoteError(
            f"host '{w.h.name}': the job secret file {path} is missing or "
            f"malformed: `homagg down -i {w.inv.path}` and `homagg up -i --auth` "
            "again"
        )
    return secret


def down(inventory: inv.Inventory, out=None) -> dict[str, list[str]]:
    """Stop every process the hosts' PID files name and remove their run
    directories.  Unreachable hosts are reported after the others were
    stopped (RemoteError naming them)."""
    out = out or sys.stdout
    hosts = [Host(h, inventory) for h in inventory.hosts]
    failures, stopped = [], {}

    def one(r):
        try:
            r.preflight()
            done = []
            job = r.job_file_fields() if r.h.role == "aggregator" else None
            if job and r.alive(switch_pidfile(r.h)):
                try:  # the job `up` registered, then the daemon
                    r.control({"cmd": "remove_job", "job": job["job"]})
                    done.append(f"removed job {job['job']}")
                except Exception as e:  # noqa: BLE001 - the daemon's stop below ends it anyway
                    done.append(f"job {job['job']} not removed: {type(e).__name__}: {e}")
            return done + r.stop_all()
        except ssh.StepFailed as e:
            return e
        except Exception as e:  # SSH dropped
            return ssh.StepFailed(f"{type(e).__name__}: {e}")

    try:
        res = ssh.parallel(one, hosts, inventory.settings.parallel)
    finally:
        for r in hosts:
            r.close()
    for name, v in res.items():
        if isinstance(v, ssh.StepFailed):
            failures.append((name, "down", v.detail, v.stderr))
        else:
            stopped[name] = v
            print(f"{name}: " + ("; ".join(v) if v else "nothing running"), file=out)
    if failures:
        raise RemoteError(ssh.failure_message("down failed", failures))
    return stopped


# --------------------------------------------------------------------------
# run allreduce


def _link_bytes(r: Host) -> dict:
    ifname = r.h.kernel_iface
    st = f"/sys/class/net/{ifname}/statistics"
    out = r.run(f"cat {st}/tx_bytes {st}/rx_bytes {st}/tx_packets {st}/rx_packets").stdout.split()
    return dict(zip(("tx_bytes", "rx_bytes", "tx_packets", "rx_packets"), map(int, out)))


def _wait_remote(r: Host, cond: str, pidfile: str, seconds: float) -> bool:
    """Poll on the host until the shell condition ``cond`` holds (True) or
    the process of ``pidfile`` exited / ``seconds`` passed (False)."""
    n = max(1, int(seconds / 0.02))
    script = (
        f"i=0; while ! {cond} && hg_alive {shlex.quote(pidfile)} && [ $i -lt {n} ]; "
        f"do sleep 0.02; i=$((i+1)); done; {cond}"
    )
    return r.sh(script, check=False, timeout=seconds + 30).exited == 0


def run_allreduce(
    inventory: inv.Inventory,
    method: str,
    elements: int,
    density: float,
    runs_dir: str = "runs",
    start_timeout: float = 120.0,
    out=None,
    **options,
):
    """One allreduce on the inventory's hosts with the daemons `up` started:
    homagg.runs.allreduce.run_allreduce on an InventoryPlacement (the same
    options and report; the report's "run_dir" holds the results, logs and
    report.json)."""
    from homagg.deploy.remote.placement import InventoryPlacement
    from homagg.runs.allreduce import run_allreduce as run

    return run(
        InventoryPlacement(
            inventory, runs_dir=runs_dir, label=method, start_timeout=start_timeout, out=out
        ),
        method,
        elements,
        density,
        **options,
    )


def _fetch_logs(workers: list[Host], paths: list[dict], folder: str) -> None:
    for i, (r, p) in enumerate(zip(workers, paths)):
        try:
            r.conn.get(p["log"], os.path.join(folder, f"worker-{r.h.name}.log"))
        except (OSError, IOError):
            pass


def _log_tail(folder: str, name: str) -> str:
    path = os.path.join(folder, f"worker-{name}.log")
    if not os.path.exists(path):
        return "no log"
    return ssh.tail(open(path, errors="replace").read(), 8).replace("\n", " | ") or "empty log"


# --------------------------------------------------------------------------
# CLI (homagg up / homagg down; homagg run allreduce -i is homagg.runs.allreduce's)


def add_up_arguments(p) -> None:
    p.add_argument("-i", "--inventory", required=True, help="testbed.toml (docs/INVENTORY.md)")
    p.add_argument(
        "--switch",
        metavar="PATH",
        help="homagg-switch on the aggregator (default: "
        "SOURCE_DIR/build/release/homagg-switch from the host config)",
    )
    p.add_argument(
        "--no-udp-csum",
        action="store_true",
        help="the daemon neither checks nor fills UDP checksums (workers on veth)",
    )
    p.add_argument(
        "--ready-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds to wait for the control socket (default: %(default)s)",
    )
    p.add_argument(
        "--auth",
        action="store_true",
        help="the job authenticates every frame: its secret is the inventory's "
        "auth_secret as `homagg provision` placed it, else a new one put on every "
        "worker host (mode 0600) and named in the job file (docs/SECURITY.md)",
    )
    p.add_argument(
        "--mac",
        choices=("auto", "umac", "aes-gmac", "blake2b"),
        default="auto",
        help="with --auth: the MAC algorithm (default: this host's, umac "
        "where the CPU has AES-NI, else blake2b); every host must compute it",
    )
    p.add_argument(
        "--leaves",
        type=int,
        default=0,
        metavar="L",
        help="the job is a two-level tree: the first L aggregator hosts of the "
        "inventory are leaves, each summing its share of the workers, below the "
        "last one, the root (the inventory names L + 1 aggregators, the root on a "
        "kernel interface); every worker host's job file names its leaf; with "
        "--auth each leaf gets a secret of its own (default: 0, a flat job over "
        "every aggregator)",
    )
    job_file.add_job_arguments(p)


def _exit_status(command: str, action) -> int:
    """Run action(): 0, or 1 with "homagg <command>: <error>" on stderr when
    it raises a HomAggError."""
    try:
        action()
    except HomAggError as e:
        print(f"homagg {command}: {e}", file=sys.stderr)
        return 1
    return 0


def up_main(args) -> int:
    return _exit_status(
        "up",
        lambda: up(
            inv.load(args.inventory),
            switch=args.switch,
            no_udp_csum=args.no_udp_csum,
            ready_timeout=args.ready_timeout,
            slots=args.slots,
            payload=args.payload_bytes,
            timeout=args.timeout,
            auth=args.auth,
            mac=None if args.mac == "auto" else args.mac,
            leaves=args.leaves,
        ),
    )


def down_main(args) -> int:
    return _exit_status("down", lambda: down(inv.load(args.inventory)))
