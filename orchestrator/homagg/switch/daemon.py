"""homagg-switch in an aggregator namespace of a local testbed: found,
started on a virtual PMD (net_af_xdp, falling back to net_af_packet), waited
for on its control socket, stopped by PID (or, when ``homagg testbed up``
already runs one there, attached to).

``Switch`` is what ``homagg run allreduce``, ``homagg train --testbed``,
``homagg testbed up`` and the long-lived job (homagg.runs.session) start;
``find_switch`` locates the binary, ``eal_args`` builds its EAL arguments
(for every daemon: the testbed's, inventory hosts', the benchmarks' and tests').
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import secrets
import shutil
import subprocess
import time

import homagg
from homagg.deploy.local.testbed import Testbed
from homagg.errors import HomAggError
from homagg.ops import logfmt
from homagg.runs.job import UDP_PORT, RunError, vdev_for_mtu


def find_switch() -> str:
    """homagg-switch: $HOMAGG_SWITCH, else build/release/ of the source tree
    this package lives in, else PATH."""
    env = os.environ.get("HOMAGG_SWITCH")
    if env:
        return env
    here = (
        pathlib.Path(homagg.__file__).resolve().parents[2] / "build" / "release" / "homagg-switch"
    )
    if here.exists():
        return str(here)
    found = shutil.which("homagg-switch")
    if found:
        return found
    raise RunError("homagg-switch not found: run `make build` (or set HOMAGG_SWITCH)")


# The daemon's idle backoff on the testbed (its --idle-us / --idle-polls):
# the testbed's cores are shared with the worker processes, so the daemon
# sleeps between polls once the port has been idle for IDLE_POLLS polls
# (measured on the 2-core testbed: spinning made lhc ~25 % slower; 20 us
# after 32 empty polls used the least daemon CPU at the same or better times).
# The sleep then grows with the idle time up to the daemon's --idle-max-us
# (default 1 ms; docs/SWITCH.md), so ranks computing between buckets keep
# their cores.
IDLE_US = 20
IDLE_POLLS = 32


def process_cpu_seconds(pid: int) -> float | None:
    """utime + stime of process ``pid`` (all its threads) in seconds, from
    /proc/PID/stat; None when the process is gone or /proc is unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def eal_args(
    lcores: str = "0",
    *,
    file_prefix: str | None = None,
    vdev: str | None = None,
    pci: str | None = None,
    hugepages_dir: str | None = None,
    memory_mb: int = 256,
    telemetry: bool = False,
) -> list[str]:
    """The EAL arguments of homagg-switch (and homagg-switch-bench): what
    goes before their "--", built here only.

    ``lcores``: an EAL lcore list ("0", "0-2", "0,1": ``-l``) or lcores
    mapped to CPUs ("0@0,1@1": ``--lcores``); ``file_prefix``: the runtime
    files' prefix (one per daemon on a machine); ``vdev``: a virtual PMD
    (no PCI scan then), ``pci``: the one PCI NIC allowed (``-a``);
    ``hugepages_dir``: a hugetlbfs mount, else ``memory_mb`` of ordinary
    memory (``--no-huge``, no shared config); ``telemetry``: keep DPDK's
    telemetry socket (off by default)."""
    out = ["--lcores" if "@" in lcores else "-l", lcores]
    if hugepages_dir:
        out += ["--huge-dir", hugepages_dir]
    else:
        out += ["--no-huge", "-m", str(int(memory_mb)), "--no-shconf"]
    out += ["-a", pci] if pci else ["--no-pci"]
    if vdev:
        out += ["--vdev", vdev]
    if file_prefix:
        out += ["--file-prefix", file_prefix]
    if not telemetry:
        out.append("--no-telemetry")
    return out + ["--log-level", "lib.eal:error"]


def engine_lcores(engines: int) -> str:
    """The EAL lcores of homagg-switch with ``engines`` engine lcores: lcore
    0, or with N > 1 a dispatcher and N engines (lcore i on CPU i mod the
    CPUs this process may use, so N + 1 lcores fit any machine)."""
    if engines <= 1:
        return "0"
    cpus = sorted(os.sched_getaffinity(0))
    return ",".join(f"{i}@{cpus[i % len(cpus)]}" for i in range(engines + 1))


def eal_lcores(engines: int) -> list[str]:
    """EAL arguments for homagg-switch with ``engines`` engine lcores
    (engine_lcores; the rest as eal_args)."""
    return eal_args(engine_lcores(engines))


class Switch:
    """homagg-switch in one aggregator namespace of the testbed (``host``:
    "agg", "agg1", ...).  When the testbed already runs one there (started
    by ``homagg testbed up``, recorded in its state file under "daemons"),
    that one is used: ``stop`` leaves it running (``homagg testbed down``
    stops it) and the options that need a daemon of one's own are refused."""

    def __init__(
        self,
        tb: Testbed,
        workdir: str,
        pmd: str = "auto",
        switch: str | None = None,
        ready_timeout: float = 30.0,
        drop_rate: float = 0.0,
        idle_us: int = IDLE_US,
        idle_polls: int = IDLE_POLLS,
        host: str = "agg",
        lcores: int = 1,
        frames: int = 0,
    ):
        """``frames``: W x S of the largest job the daemon is to take (its
        workers' frames in flight): an af_packet ring is made that large."""
        self.pid = None
        self.shared = False
        running = tb.state().get("daemons", {}).get(host)
        if running:
            self._attach(tb, host, running, pmd, drop_rate, lcores)
            return
        mtu = int(tb.state().get("mtu") or 1500)
        kinds = ("af_xdp", "af_packet") if pmd == "auto" else (pmd,)
        if mtu > 1500:
            # af_xdp (DPDK 22.11) receives into 4 KB umem frames: no jumbo frame fits
            if pmd == "af_xdp":
                raise RunError(
                    f"--pmd af_xdp cannot receive frames of the testbed's MTU {mtu} "
                    "(4 KB umem frames): use --pmd af_packet or auto"
                )
            kinds = ("af_packet",)
        if lcores > 1:
            # measured: with a dispatcher and 2 engine lcores on af_xdp the
            # port stops receiving after ~6800 frames (4 workers, dense
            # 2^20; ethdev ipackets stays put, no alloc_fail, no
            # dispatch_full); af_packet runs the same job exactly
            if pmd == "af_xdp":
                raise RunError(
                    "--pmd af_xdp stops receiving with several engine lcores "
                    "(--switch-lcores > 1): use --pmd af_packet or auto"
                )
            kinds = ("af_packet",)
        self.tb = tb
        self.workdir = workdir
        self.host = host
        tag = "" if host == "agg" else f"-{host}"
        self.control_path = os.path.join(workdir, f"control{tag}.sock")
        self.proc = None
        self.pmd = None
        self.log = ""
        binary = switch or find_switch()
        agg = tb.host(host)
        self.ip = agg.ip
        tried = []
        for kind in kinds:
            vdev = vdev_for_mtu(f"net_{kind}0,iface={agg.ifname}", mtu, frames)
            logpath = os.path.join(workdir, f"switch{tag}-{kind}.log")
            prefix = "hg" + secrets.token_hex(5)
            runtime = os.path.join(workdir, f"rt{tag}-{kind}")
            os.makedirs(runtime, exist_ok=True)
            argv = [
                binary,
                *eal_args(engine_lcores(lcores), file_prefix=prefix, vdev=vdev),
                "--",
                "--port-ip",
                agg.ip,
                "--udp-port",
                str(UDP_PORT),
                "--control",
                self.control_path,
                "--mtu",
                str(mtu),
                # veth leaves UDP checksums to an offload that never runs
                "--no-udp-csum",
                # the testbed's cores are shared with the workers: sleep when idle
                "--idle-us",
                str(int(idle_us)),
                "--idle-polls",
                str(int(idle_polls)),
                *logfmt.daemon_args(),
            ]
            if lcores > 1:
                argv += ["--lcores", str(lcores)]
            if drop_rate:
                # the kernel has no netem: the daemon's port drops this
                # fraction of what it receives (seeded)
                argv += ["--drop-rate", repr(float(drop_rate))]
            env = dict(os.environ, RUNTIME_DIRECTORY=runtime, XDG_RUNTIME_DIR=runtime)
            with open(logpath, "wb") as logf:
                proc = tb.run_in(
                    host, argv, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=workdir
                )
            if self._wait_ready(proc, ready_timeout):
                self.proc, self.pmd, self.pid = proc, kind, proc.pid
                self.logpath = logpath
                return
            proc.stop()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.control_path)
            tried.append(f"{vdev}: " + pathlib.Path(logpath).read_text(errors="replace")[-800:])
        raise RunError(f"homagg-switch did not start on {host}:\n" + "\n".join(tried))

    def _attach(
        self, tb: Testbed, host: str, rec: dict, pmd: str, drop_rate: float, lcores: int
    ) -> None:
        """Use the daemon ``homagg testbed up`` started on ``host`` (``rec``:
        its record in the state file)."""
        where = (
            f"testbed {tb.name} runs homagg-switch on {host} (pid {rec['pid']}, "
            "started by `homagg testbed up`)"
        )
        if drop_rate or lcores > 1:
            raise RunError(
                f"{where}: a drop rate or several engine lcores need a daemon of "
                "its own; build the testbed with `homagg testbed up --no-daemon`"
            )
        if pmd not in ("auto", rec["pmd"]):
            raise RunError(
                f"{where} on {rec['pmd']}, not {pmd}: use --pmd auto or build the "
                "testbed with `homagg testbed up --no-daemon`"
            )
        if process_cpu_seconds(rec["pid"]) is None:
            raise RunError(
                f"{where}, but it has exited (its log: {rec['log']}): "
                f"`homagg testbed down --name {tb.name}` and up again"
            )
        self.tb, self.host, self.workdir = tb, host, os.path.dirname(rec["control"])
        self.control_path, self.pmd, self.pid = rec["control"], rec["pmd"], rec["pid"]
        self.ip, self.logpath, self.log = rec["ip"], rec["log"], ""
        self.proc, self.shared = None, True

    def record(self) -> dict:
        """What ``homagg testbed up`` keeps of a daemon it leaves running."""
        return {
            "pid": self.pid,
            "control": self.control_path,
            "pmd": self.pmd,
            "ip": self.ip,
            "log": self.logpath,
        }

    @property
    def running(self) -> bool:
        """False once ``stop`` stopped a daemon of one's own."""
        return self.proc is not None or self.shared

    def _wait_ready(self, proc, timeout) -> bool:
        from homagg.switch.control import ControlClient

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            if os.path.exists(self.control_path):
                try:
                    with ControlClient(self.control_path, timeout=1.0) as c:
                        c.stats()
                    return True
                except HomAggError:
                    pass
            time.sleep(0.05)
        return False

    def cpu_seconds(self) -> float | None:
        """The daemon's CPU time so far (utime + stime, every thread), or None."""
        return process_cpu_seconds(self.pid) if self.running else None

    def client(self):
        from homagg.switch.control import ControlClient

        return ControlClient(self.control_path, timeout=5.0)

    def control(self, request: dict) -> dict:
        """One control request ({"cmd": ..., fields}) and its reply, raising
        on an error reply (as homagg.deploy.remote.hosts.Host.control)."""
        fields = dict(request)
        cmd = fields.pop("cmd")
        with self.client() as c:
            return c.request(cmd, **fields)

    def stop(self) -> None:
        """Stop the daemon this object started (not a shared one)."""
        if self.proc is None:
            return
        with contextlib.suppress(HomAggError, OSError):
            with self.client() as c:
                c.shutdown()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        self.proc.stop()
        self.proc = None
