"""A long-lived job on a local testbed: one homagg-switch and W worker
processes that run many allreduces, and survive (or are made to suffer)
daemon and worker restarts.

``homagg run allreduce`` starts a daemon and W processes for one allreduce;
a session keeps them::

    with Session(tb, workdir, drop_rate=0.01) as s:
        r = s.allreduce("lhc", elements=100_000, density=0.05, seed=3)
        assert r["exact"]
        s.restart_switch()           # new daemon, job added again
        s.allreduce("dense", 50_000, 1.0, seed=4)

Each worker process (``python -m homagg.runs.session --worker SPEC`` in its
namespace) holds one ``homagg.worker.Worker`` and answers one JSON line per
command read from stdin: ``allreduce`` (the gradient is built from the seed,
the result saved for the checker), ``reset`` (a new client: chunk counters
from 0, a new incarnation; what docs/PROTOCOL.md asks after a failed
allreduce) and ``exit``.  ``allreduce`` returns every worker's outcome and,
when all succeeded, the bit-exact check against the fixed-point reference
(homagg.runs.job.verify).  After a failed allreduce ``recover`` re-adds the job
on the daemon and resets every worker, so the next one starts clean.

Used by ``homagg bench soak`` and by the chaos tests (docs/SWITCH.md,
"Restarts and failures").  Every process is stopped by the PID it was
started with.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time

import numpy as np

# SessionError: defined in homagg.errors, importable from here too
from homagg.errors import HomAggError, SessionError  # noqa: F401
from homagg.runs import allreduce as run
from homagg.runs import job
from homagg.switch.daemon import Switch


def rss_kb(pid: int) -> int | None:
    """The resident set of process ``pid`` in KiB (VmRSS), or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


# Engine counters that are not the outcome of one received frame (they
# count completions, replies sent, events).  Every other engine counter is
# the one outcome of a frame: summed, duplicate, stale, or a drop reason --
# a counter added later is an outcome unless listed here.
NOT_FRAME_OUTCOMES = frozenset(
    {
        "received",
        "completed",
        "replays",
        "results_sent",
        "status_sent",
        "status_repeats",
        "no_buffer",
        "tx_full",
        "incarnation_resets",
        "up_sent",
        "up_retransmissions",
        "up_resent_timer",
        "up_resent_overtaken",
        "up_resent_lacking",
        "up_resent_worker",
        "up_abandoned",
        "up_root_restarts",
        "up_reports",
    }
)
PORT_OUTCOMES = ("drop_injected", "drop_segmented", "arp_replies", "arp_other", "rx")


def accounting(stats: dict) -> dict:
    """Check a daemon's ``stats`` reply: every frame the ethdev received is
    in exactly one port counter (PORT_OUTCOMES), every frame the port
    handed on reached an engine or was refused by a full engine ring
    (dispatch_full), and every frame an engine received is in exactly one
    outcome counter.  Returns the three sums and "consistent"."""
    port, eng = stats["port"], stats["stats"]
    outcomes = sum(v for k, v in eng.items() if k not in NOT_FRAME_OUTCOMES)
    checks = {
        "ethdev_received": port["ipackets"],
        "port_outcomes": sum(port[k] for k in PORT_OUTCOMES),
        "port_rx": port["rx"],
        "engine_received_plus_dispatch_full": eng["received"] + port.get("dispatch_full", 0),
        "engine_received": eng["received"],
        "engine_outcomes": outcomes,
    }
    checks["consistent"] = (
        checks["ethdev_received"] == checks["port_outcomes"]
        and checks["port_rx"] == checks["engine_received_plus_dispatch_full"]
        and checks["engine_received"] == checks["engine_outcomes"]
    )
    return checks


def _kill(proc, sig=signal.SIGKILL) -> None:
    """Send ``sig`` to the process group of ``proc`` (a testbed Process) and
    reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    proc.stop()


class Session:
    """One job on testbed ``tb``: a daemon and one worker process per worker
    host, all started by the constructor."""

    def __init__(
        self,
        tb,
        workdir: str,
        *,
        slots: int = 64,
        payload: int = 1024,
        timeout: float = 5.0,
        rto: float = 0.005,
        drop_rate: float = 0.0,
        group: str = "239.77.0.2",
        pmd: str = "auto",
        switch: str | None = None,
    ):
        self.tb = tb
        self.workdir = workdir
        self.W = len(tb.workers)
        self.job, self.token = 1 + secrets.randbelow(1 << 15), secrets.randbits(31)
        self.slots, self.payload, self.group = slots, payload, group
        self.timeout, self.rto = timeout, rto
        self.drop_rate, self.pmd, self.binary = drop_rate, pmd, switch
        self.switch = None
        self.switch_starts = 0
        self.incarnations: list = []  # of the job, one per add_job
        self.procs: list = [None] * self.W
        self._pending: list[bool] = [False] * self.W
        self._lost: set[int] = set()  # killed while a command was pending
        try:
            self.start_switch()
            for i in range(self.W):
                self.start_worker(i)
        except BaseException:
            self.close()
            raise

    # ---- the daemon ----------------------------------------------------

    def start_switch(self) -> None:
        """Start homagg-switch and add the job (a new daemon: a new job
        incarnation)."""
        self.switch = Switch(
            self.tb, self.workdir, pmd=self.pmd, switch=self.binary, drop_rate=self.drop_rate
        )
        self.switch_starts += 1
        self.add_job()

    def add_job(self) -> None:
        """Add the job on the daemon; its incarnation (the daemon's reply)
        is appended to ``incarnations``."""
        with self.switch.client() as c:
            r = c.add_job(
                job=self.job,
                token=self.token,
                workers=self.W,
                slots=self.slots,
                payload=self.payload,
                group=self.group,
            )
        self.incarnations.append(r.get("incarnation"))

    def kill_switch(self, sig=signal.SIGKILL) -> None:
        """Stop the daemon with ``sig`` (SIGKILL: no cleanup at all)."""
        if self.switch is not None:
            _kill(self.switch.proc, sig)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.switch.control_path)
            self.switch.proc = None
            self.switch = None

    def restart_switch(self, sig=signal.SIGTERM) -> None:
        self.kill_switch(sig)
        self.start_switch()

    def switch_pid(self) -> int:
        return self.switch.proc.pid

    def stats(self) -> dict:
        with self.switch.client() as c:
            return c.stats()

    # ---- the workers ---------------------------------------------------

    def _spec(self, i: int) -> dict:
        h = self.tb.workers[i]
        return job.worker_spec(
            job=self.job,
            token=self.token,
            worker=i,
            workers=self.W,
            agg_ip=self.tb.aggregator.ip,
            group=self.group,
            ip=h.ip,
            timeout=self.timeout,
            slots=self.slots,
            payload=self.payload,
            rto=self.rto,
            method="dense",
            block=job.DEFAULT_BLOCK,
            elements=0,
            density=0.0,
            workload="random",
            seed=0,
            out="",
            udp_gso=self.tb.udp_gso,
        )

    def start_worker(self, i: int) -> None:
        """Start worker i's process (a new process: a new incarnation)."""
        h = self.tb.workers[i]
        p = self.tb.run_in(
            h.name,
            [sys.executable, "-m", "homagg.runs.session", "--worker", json.dumps(self._spec(i))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=run.child_env(),
            cwd=self.workdir,
        )
        self.procs[i] = p
        self._pending[i] = False
        line = self._readline(i, 60.0, reply=False)
        if line.get("ready") is not True:
            raise SessionError(f"worker {i} did not start: {line}")

    def kill_worker(self, i: int, sig=signal.SIGKILL) -> None:
        if self.procs[i] is not None:
            _kill(self.procs[i], sig)
            if self._pending[i]:
                self._lost.add(i)
            self.procs[i] = None
            self._pending[i] = False

    def worker_pid(self, i: int) -> int:
        return self.procs[i].pid

    def _send(self, i: int, cmd: dict) -> None:
        p = self.procs[i]
        p.popen.stdin.write(json.dumps(cmd) + "\n")
        p.popen.stdin.flush()
        self._pending[i] = True

    def _readline(self, i: int, timeout: float, reply: bool = True) -> dict:
        """Worker i's next reply line (``reply``: to a command sent before;
        else its ready line); {"ok": False, "error": ...} when it was killed,
        died or said nothing within ``timeout``."""
        p = self.procs[i]
        if p is None or (reply and i in self._lost):
            self._lost.discard(i)
            return {"ok": False, "error": f"worker {i}: process killed", "kind": "killed"}
        line = p.readline(timeout)
        self._pending[i] = False
        if not line:
            rc = p.poll()
            why = f"exited with {rc}" if rc is not None else f"no reply within {timeout:g} s"
            return {"ok": False, "error": f"worker {i}: {why}", "kind": "died"}
        return json.loads(line)

    # ---- allreduce -----------------------------------------------------

    def begin_allreduce(
        self, method: str, elements: int, density: float, workload: str = "random", seed: int = 1
    ) -> dict:
        """Tell every worker to start one allreduce; returns the job of it
        for finish_allreduce."""
        job.check_arguments(method, elements, density)
        a = dict(
            method=method,
            elements=elements,
            density=density,
            workload=workload,
            seed=seed,
            t0=time.perf_counter(),
        )
        for i in range(self.W):
            if self.procs[i] is not None:
                self._send(
                    i,
                    dict(
                        cmd="allreduce",
                        method=method,
                        elements=elements,
                        density=density,
                        workload=workload,
                        seed=seed,
                        out=os.path.join(self.workdir, f"result-{i}.npy"),
                    ),
                )
        return a

    def finish_allreduce(self, a: dict) -> dict:
        """Every worker's reply to begin_allreduce's command: {"ok",
        "workers": [reply...], "errors": [...], "exact", "seconds"}."""
        replies = [self._readline(i, self.timeout + 60.0) for i in range(self.W)]
        out = {k: a[k] for k in ("method", "elements", "density", "workload", "seed")}
        out["workers"] = replies
        out["wall_seconds"] = time.perf_counter() - a["t0"]
        out["errors"] = [r.get("error") for r in replies if not r.get("ok")]
        out["ok"] = not out["errors"]
        out["exact"] = None
        if out["ok"]:
            results = [
                np.load(os.path.join(self.workdir, f"result-{i}.npy")) for i in range(self.W)
            ]
            out.update(
                job.verify(
                    a["method"],
                    a["elements"],
                    a["density"],
                    a["workload"],
                    a["seed"],
                    job.DEFAULT_BLOCK,
                    results,
                )
            )
            out["seconds"] = max(r["seconds"] for r in replies)
        return out

    def allreduce(
        self, method: str, elements: int, density: float, workload: str = "random", seed: int = 1
    ) -> dict:
        return self.finish_allreduce(
            self.begin_allreduce(method, elements, density, workload, seed)
        )

    def recover(self) -> None:
        """After a failed allreduce: the job again on the daemon (its slots
        empty) and a new client in every worker (counters from 0)."""
        with self.switch.client() as c:
            with contextlib.suppress(HomAggError):
                c.remove_job(self.job)
        self.add_job()
        for i in range(self.W):
            if self.procs[i] is None:
                self.start_worker(i)
            else:
                self._send(i, {"cmd": "reset"})
                r = self._readline(i, 30.0)
                if not r.get("ok"):
                    raise SessionError(f"worker {i} did not reset: {r}")

    # ---- teardown ------------------------------------------------------

    def close(self) -> None:
        for i, p in enumerate(self.procs):
            if p is not None:
                if not self._pending[i]:
                    with contextlib.suppress(OSError, ValueError):
                        self._send(i, {"cmd": "exit"})
                        p.wait(5)
                p.stop()
                self.procs[i] = None
        if self.switch is not None:
            self.switch.stop()
            self.switch = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _worker_main(spec: dict) -> int:
    """The worker process: one Worker, one JSON reply per command line."""
    w = job.open_worker(spec)
    print(json.dumps({"ready": True}), flush=True)
    try:
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["cmd"] == "exit":
                break
            if cmd["cmd"] == "reset":
                w.close()
                w = job.open_worker(spec)
                print(json.dumps({"ok": True}), flush=True)
                continue
            x = job.gradient(
                cmd["elements"],
                cmd["density"],
                cmd["workload"],
                cmd["seed"],
                spec["worker"],
                spec["workers"],
            )
            before = w.stats()
            t0 = time.perf_counter()
            try:
                y = w.allreduce(x, method=cmd["method"], block=spec["block"])
            except HomAggError as e:
                reply = {
                    "ok": False,
                    "error": str(e),
                    "kind": type(e).__name__,
                    "code": getattr(e, "code", None),
                }
            else:
                np.save(cmd["out"], y)
                reply = {"ok": True, "seconds": time.perf_counter() - t0}
            after = w.stats()
            reply["retransmissions"] = after["retransmissions"] - before["retransmissions"]
            reply["packets_sent"] = after["packets_sent"] - before["packets_sent"]
            print(json.dumps(reply), flush=True)
    finally:
        w.close()
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        sys.exit(_worker_main(json.loads(sys.argv[2])))
    print(
        "usage: python -m homagg.runs.session --worker SPEC (started by homagg.runs.session.Session)",
        file=sys.stderr,
    )
    sys.exit(2)
