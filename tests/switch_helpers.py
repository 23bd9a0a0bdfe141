"""Starting and stopping homagg-switch in tests (shared by test_control.py
and test_switch.py): a unique runtime directory per daemon, bounded waits,
stop by the PID that was started."""
import os
import pathlib
import signal
import subprocess
import time
import uuid

from homagg.switch.control import ControlClient
from homagg.switch.daemon import eal_args as switch_eal_args
from homagg.errors import HomAggError

ROOT = pathlib.Path(__file__).resolve().parents[1]
# $HOMAGG_SWITCH runs the tests against another build (e.g. build/san/)
SWITCH = pathlib.Path(os.environ.get("HOMAGG_SWITCH", ROOT / "build" / "release" / "homagg-switch"))


def wait_for(pred, timeout, what, interval=0.02):
    """Poll pred() until it is true; fail with `what` after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class Daemon:
    """One homagg-switch process, started in `workdir`."""

    def __init__(self, workdir, eal_args, app_args=(), netns=None,
                 telemetry=False, lcores="0", umask=-1):
        self.workdir = pathlib.Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.control = self.workdir / "control.sock"
        self.log = self.workdir / "switch.log"
        self.runtime = self.workdir / "run"
        self.runtime.mkdir(exist_ok=True)
        self.prefix = "hg" + uuid.uuid4().hex[:10]
        # "0" or "0-2": EAL lcore ids; "0@0,1@1,2@1": lcores mapped to CPUs
        cmd = [str(SWITCH), *switch_eal_args(lcores, file_prefix=self.prefix, telemetry=telemetry),
               *eal_args, "--", "--control", str(self.control), *app_args]
        if netns:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        self.cmd = cmd
        env = dict(os.environ, RUNTIME_DIRECTORY=str(self.runtime),
                   XDG_RUNTIME_DIR=str(self.runtime))
        self._logf = open(self.log, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._logf,
                                     stderr=subprocess.STDOUT, env=env,
                                     cwd=self.workdir, umask=umask)

    def output(self):
        return self.log.read_text(errors="replace")

    def alive(self):
        return self.proc.poll() is None

    def wait_ready(self, timeout=30.0):
        def ready():
            if not self.alive():
                raise AssertionError(
                    f"homagg-switch exited with {self.proc.returncode}:\n{self.output()}")
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
