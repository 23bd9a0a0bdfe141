"""homagg-switch in tests: starting and stopping a daemon (a unique runtime
directory per daemon, bounded waits, stop by the PID that was started), and
the veth rig of test_switch.py, test_switch_hostile.py and test_ops.py (two
namespaces the test creates, the daemon in one, worker threads in the
other; the fixtures `link` and `daemons` in conftest.py build it)."""

import os
import pathlib
import signal
import subprocess
import threading
import time
import uuid

import numpy as np

from homagg.switch.control import ControlClient
from homagg.switch.daemon import eal_args as switch_eal_args
from homagg.errors import HomAggError
from homagg.worker import Worker

from helpers import wait_for

ROOT = pathlib.Path(__file__).resolve().parents[1]
# $HOMAGG_SWITCH runs the tests against another build (e.g. build/san/)
SWITCH = pathlib.Path(os.environ.get("HOMAGG_SWITCH", ROOT / "build" / "release" / "homagg-switch"))


class Daemon:
    """One homagg-switch process, started in `workdir`."""

    def __init__(
        self, workdir, eal_args, app_args=(), netns=None, telemetry=False, lcores="0", umask=-1
    ):
        self.workdir = pathlib.Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.control = self.workdir / "control.sock"
        self.log = self.workdir / "switch.log"
        self.runtime = self.workdir / "run"
        self.runtime.mkdir(exist_ok=True)
        self.prefix = "hg" + uuid.uuid4().hex[:10]
        # "0" or "0-2": EAL lcore ids; "0@0,1@1,2@1": lcores mapped to CPUs
        cmd = [
            str(SWITCH),
            *switch_eal_args(lcores, file_prefix=self.prefix, telemetry=telemetry),
            *eal_args,
            "--",
            "--control",
            str(self.control),
            *app_args,
        ]
        if netns:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        self.cmd = cmd
        env = dict(
            os.environ, RUNTIME_DIRECTORY=str(self.runtime), XDG_RUNTIME_DIR=str(self.runtime)
        )
        self._logf = open(self.log, "wb")
        self.proc = subprocess.Popen(
            cmd, stdout=self._logf, stderr=subprocess.STDOUT, env=env, cwd=self.workdir, umask=umask
        )

    def output(self):
        return self.log.read_text(errors="replace")

    def alive(self):
        return self.proc.poll() is None

    def wait_ready(self, timeout=30.0):
        def ready():
            if not self.alive():
                raise AssertionError(
                    f"homagg-switch exited with {self.proc.returncode}:\n{self.output()}"
                )
            if not self.control.exists():
                return False
            try:
                with ControlClient(self.control, timeout=1.0) as c:
                    c.stats()
                return True
            except HomAggError:
                return False

        wait_for(ready, timeout, "homagg-switch to answer on its control socket")
        return self

    def client(self, timeout=5.0):
        return ControlClient(self.control, timeout=timeout).connect()

    def signal(self, sig):
        if self.alive():
            self.proc.send_signal(sig)

    def wait_exit(self, timeout=20.0):
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self._logf.close()

    def stop(self):
        """Best-effort teardown: SIGTERM, then SIGKILL, of our own PID."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._logf.close()


# ---- the veth rig ---------------------------------------------------------

BLOCK = 4096
GROUP = "239.7.7.7"


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


class Link:
    """nsA (daemon side) <-veth-> nsB (workers), unique names."""

    def __init__(self):
        uid = uuid.uuid4().hex[:6]
        self.ns_switch = f"hgswA{uid}"
        self.ns_workers = f"hgswB{uid}"
        self.dev_switch = f"hsa{uid}"
        self.dev_workers = f"hsb{uid}"
        octet = int(uid[:2], 16) % 200 + 20
        self.switch_ip = f"10.251.{octet}.1"
        self.worker_ip = f"10.251.{octet}.2"
        _ip("netns", "add", self.ns_switch)
        _ip("netns", "add", self.ns_workers)
        _ip(
            "link",
            "add",
            self.dev_switch,
            "netns",
            self.ns_switch,
            "type",
            "veth",
            "peer",
            "name",
            self.dev_workers,
            "netns",
            self.ns_workers,
        )
        for ns, dev in ((self.ns_switch, self.dev_switch), (self.ns_workers, self.dev_workers)):
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", dev, "up")
        _ip("-n", self.ns_workers, "addr", "add", f"{self.worker_ip}/24", "dev", self.dev_workers)
        # the worker kernel leaves UDP checksums to the (veth) offload: send
        # them complete, as a NIC would put them on the wire (without
        # ethtool the daemon is told not to verify them instead)
        try:
            r = subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    self.ns_workers,
                    "ethtool",
                    "-K",
                    self.dev_workers,
                    "tx",
                    "off",
                ],
                capture_output=True,
                timeout=30,
            )
            self.csum_complete = r.returncode == 0
        except FileNotFoundError:
            self.csum_complete = False

    def teardown(self):
        _ip("netns", "del", self.ns_switch, check=False)
        _ip("netns", "del", self.ns_workers, check=False)


def start_daemon(link, workdir, *args, pmd="af_packet"):
    if not link.csum_complete:
        args = ("--no-udp-csum", *args)
    d = Daemon(
        workdir,
        ["--vdev", f"net_{pmd}0,iface={link.dev_switch}"],
        ["--port-ip", link.switch_ip, *args],
        netns=link.ns_switch,
    )
    return d.wait_ready()


def run_workers(
    link,
    job,
    token,
    grads,
    method="dense",
    timeout=10.0,
    slots=32,
    before_start=None,
    group=GROUP,
    **worker_kw,
):
    """Every worker in its own thread inside the workers' namespace; returns
    (results, errors, stats) per worker.  worker_kw go to every Worker
    (auth_file, incarnation)."""
    from pyroute2.netns import setns

    W = len(grads)
    results, errors, stats = [None] * W, [None] * W, [None] * W
    made = threading.Barrier(W + 1, timeout=30)

    def work(w):
        setns(link.ns_workers, flags=0)  # this thread only
        try:
            wk = Worker(
                job=job,
                token=token,
                worker=w,
                workers=W,
                aggregator=(link.switch_ip, 48879),
                group=group,
                bind=(link.worker_ip, 0),
                timeout=timeout,
                slots=slots,
                **worker_kw,
            )
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            errors[w] = exc
            made.wait()
            return
        made.wait()
        with wk:
            try:
                results[w] = wk.allreduce(grads[w], method=method, block=BLOCK)
            except Exception as exc:  # noqa: BLE001
                errors[w] = exc
            stats[w] = wk.stats()

    threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in range(W)]
    for t in threads:
        t.start()
    made.wait()
    if before_start:
        before_start()
    return threads, results, errors, stats


def join_all(threads, limit):
    deadline = time.monotonic() + limit
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a worker did not finish in time"


def gradients(W, n, seed, density=0.3):
    rng = np.random.default_rng(seed)
    g = []
    for _ in range(W):
        x = rng.standard_normal(n).astype(np.float32) * np.float32(1e-2)
        x[rng.random(n) > density] = 0
        g.append(x)
    return g
