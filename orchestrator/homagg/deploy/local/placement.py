"""A run placed on a local testbed (homagg.deploy.placement): every process in
its host's network namespace, a child of this one; the worker's barriers go
over its stdin ("go") and stdout ("ready"); its files are in a private
work directory removed at ``close`` (with ``runs_dir``, the results, the
workers' reports and the daemons' logs are copied to a new folder
RUNS_DIR/<timestamp>-<label>/ first, as on inventory hosts)."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile

import numpy as np

import homagg
from homagg import auth as hg_auth
from homagg.deploy.local import testbed_job
from homagg.deploy.local.testbed import Testbed
from homagg.deploy.placement import AggregatorHost, Placement, run_folder
from homagg.runs.job import collect_reports
from homagg.switch import job_file


def child_env() -> dict:
    """The environment of a worker process: this one, with this package first
    on PYTHONPATH (the child runs ``python -m homagg...`` in a namespace)."""
    env = dict(os.environ)
    pkg_root = str(pathlib.Path(homagg.__file__).resolve().parents[1])
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _stderr(p, wait: float = 0.0) -> str:
    """The end of what process ``p`` wrote on stderr once it has exited
    (waiting up to ``wait`` seconds: a process whose stdout just ended may
    not have been reaped yet), else ""."""
    try:
        p.wait(wait)
    except subprocess.TimeoutExpired:
        return ""
    return p.popen.stderr.read()[-600:]


class TestbedPlacement(Placement):
    """The hosts of local testbed ``name`` (``homagg testbed up``)."""

    kind = "testbed"
    __test__ = False  # not a pytest class

    def __init__(
        self,
        name: str,
        state_dir: str | None = None,
        runs_dir: str | None = None,
        label: str = "run",
    ):
        self.tb = Testbed.open(name, state_dir)
        st = self.tb.state()
        self.testbed = name
        self.where = f"testbed {name}"
        self.mtu = int(st.get("mtu") or 1500)
        self.udp_gso = self.tb.udp_gso
        self.link_mbit = st.get("link_mbit")
        self.default_leaves = int(st.get("leaves") or 0)
        self.workers = [h.name for h in self.tb.workers]
        self.aggregators = [AggregatorHost(h.name, h.ip, h.mac) for h in self.tb.aggregators]
        self.runs_dir, self.label = runs_dir, label
        self.workdir = None
        self.procs = []
        self.daemons = []

    def open(self) -> None:
        self.workdir = tempfile.mkdtemp(prefix=f"homagg-run-{self.testbed}-")
        if self.runs_dir:
            self.run_dir = run_folder(self.runs_dir, self.label)

    def close(self) -> None:
        self.stop_workers()
        for s in self.daemons:
            s.stop()
        if self.run_dir:  # what the inventory placement keeps too
            for k, s in enumerate(self.daemons):
                if not s.shared and os.path.exists(s.logpath):
                    shutil.copy(
                        s.logpath,
                        os.path.join(
                            self.run_dir, "switch.log" if k == 0 else f"switch-{s.host}.log"
                        ),
                    )
            for f in os.listdir(self.workdir):
                if f.startswith("result-") and f.endswith(".npy"):
                    shutil.copy(os.path.join(self.workdir, f), self.run_dir)
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def refusals(self, options: dict) -> list[str]:
        out = []
        fail = options.get("fail_aggregators") or ()
        unknown = set(fail) - {a.name for a in self.aggregators[: options["aggregators"]]}
        if unknown:
            out.append(
                f"fail_aggregators: no aggregator host {sorted(unknown)} (the run uses "
                f"{[a.name for a in self.aggregators[: options['aggregators']]]})"
            )
        bad = [i for i in options.get("fail_workers") or () if not 0 <= i < options["workers"]]
        if bad:
            out.append(f"fail_workers: no worker {bad} (the run has 0..{options['workers'] - 1})")
        shared = set(self.tb.state().get("daemons", {}))
        if set(fail) & shared:
            out.append(
                f"fail_aggregators: {self.where} runs its own daemons "
                "(`homagg testbed up`); stopping one needs `--no-daemon`"
            )
        return out

    def job_cost(self, cost_model=True):
        """The testbed's link rate (homagg.deploy.local.testbed_job.job_cost)."""
        return testbed_job.job_cost(self.tb, cost_model)

    def cost_hint(self, cost_model=True):
        """When the testbed's links are shaped but it has no calibration
        through its port (for as many workers): the model then charges
        this host's codec coefficients alone, which miss the testbed's
        kernel path and the ring's CPU."""
        if not cost_model or testbed_job.port_calibrated(self.tb) is not False:
            return None
        return (
            f"testbed {self.tb.name} is not calibrated through its port: the choice "
            "between HomAgg and the process group's allreduce predicts with this "
            "host's codec figures alone; `homagg calibrate --testbed "
            f"{self.tb.name}` measures the testbed's own (about half a minute)"
        )

    def open_daemons(self, count, *, frames, pmd, switch, drop_rate, idle_us, idle_polls, lcores):
        from homagg.switch.daemon import IDLE_POLLS, IDLE_US, Switch

        for a in self.aggregators[:count]:
            self.daemons.append(
                Switch(
                    self.tb,
                    self.workdir,
                    pmd=pmd,
                    switch=switch,
                    drop_rate=drop_rate,
                    idle_us=IDLE_US if idle_us is None else idle_us,
                    idle_polls=IDLE_POLLS if idle_polls is None else idle_polls,
                    host=a.name,
                    lcores=lcores,
                    frames=frames,
                )
            )
        return self.daemons

    def private_path(self, name: str) -> str:
        return os.path.join(self.workdir, name)

    def place_secret(self, secret, name="job.secret"):
        """The testbed's hosts share this machine's files: one file in the
        run's private folder (removed when the placement closes)."""
        path = self.private_path(name)
        hg_auth.create_secret_file(path, secret)
        return path

    def ranks_per_host(self) -> int:
        """Every namespace shares this machine's cores."""
        return len(self.workers)

    def worker_ip(self, i):
        return self.tb.host(self.workers[i]).ip

    def worker_iface(self, i):
        return self.tb.host(self.workers[i]).ifname

    def worker_dir(self, i):
        """The work directory: every namespace sees this machine's files."""
        return self.workdir

    def put_job_file(self, i, name, fields):
        return job_file.write_job_file(os.path.join(self.workdir, name), **fields)

    def standing_job(self):
        """`homagg testbed up`'s job and its file (every namespace reads it)."""
        job = testbed_job.job(self.tb)
        if job is None:
            return None
        return (
            {k: v for k, v in job.items() if k != "file"},
            testbed_job.job_files(self.tb),  # a tree's: one per worker
            None,
        )

    def standing_tree(self):
        """From the job files of the testbed's workers (testbed_job.standing_tree)."""
        return testbed_job.standing_tree(self.tb)

    def fetch(self, i, names):
        """Already here (the work directory); copied to ``run_dir`` too."""
        if self.run_dir:
            for n in names:
                shutil.copy(os.path.join(self.workdir, n), self.run_dir)
        return self.workdir

    def start_workers(self, specs, module="homagg.runs.job", env=None):
        base = child_env()
        for i, (name, spec) in enumerate(zip(self.workers, specs)):
            spec = dict(spec, out=os.path.join(self.workdir, f"result-{i}.npy"))
            self.procs.append(
                self.tb.run_in(
                    name,
                    [sys.executable, "-m", module, "--child", json.dumps(spec)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=dict(base, **(env[i] if env else {})),
                    cwd=self.workdir,
                )
            )
        return [p.pid for p in self.procs]

    def wait_ready(self, timeout):
        failures = []
        for name, p in zip(self.workers, self.procs):
            line = p.readline(timeout)
            if line.strip() != "ready":
                # "": no line in time, or its stdout ended (it exited: wait for it)
                failures.append(f"host '{name}': {line!r} {_stderr(p, 5.0 if not line else 0.0)}")
        return failures

    def stop_worker(self, i):
        # SIGKILL, its pipes left open: collect() reads its exit as any other
        p = self.procs[i]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.popen.wait(10)

    def go(self):
        for p in self.procs:
            if p.popen.poll() is not None:
                continue  # stopped (fail_workers): it reports its exit
            p.popen.stdin.write("go\n")
            p.popen.stdin.flush()

    def collect(self, timeout):
        hosts = [self.tb.host(n) for n in self.workers]
        reports, failures = collect_reports(hosts, self.procs, timeout)
        if self.run_dir:
            for r in reports:  # an allreduce worker's or a training rank's
                i = r["worker"] if "worker" in r else r["rank"]
                with open(os.path.join(self.run_dir, f"report-{i}.json"), "w") as f:
                    f.write(json.dumps(r) + "\n")
            for name, p in zip(self.workers, self.procs):  # its warnings, e.g. a fallback's
                text = getattr(p, "stderr_text", None)
                if text:
                    with open(os.path.join(self.run_dir, f"worker-{name}.log"), "w") as f:
                        f.write(text)
        return reports, failures

    def results(self):
        return [
            np.load(os.path.join(self.workdir, f"result-{i}.npy")) for i in range(len(self.workers))
        ]

    def link_stats(self, host):
        return self.tb.link_stats(host)

    def stop_workers(self):
        for p in self.procs:
            p.stop()
