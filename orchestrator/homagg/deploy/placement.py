"""Where a run's processes go: the placement interface under homagg.runs.

A run (homagg.runs.allreduce.run_allreduce) is written once: start or reuse
the daemons, register the job, start the workers, release them, collect,
check.  What differs between a local testbed and inventory hosts is only how
a process is started on a host, how its handshake and output are read, how
a file comes back and how it is stopped.  That is a ``Placement``:

- ``homagg.deploy.local.placement.TestbedPlacement``: the network namespaces
  of a local testbed (processes are children of this one).
- ``homagg.deploy.remote.placement.InventoryPlacement``: the hosts of an
  inventory over SSH (the daemons are the ones ``homagg up -i`` started;
  processes run in the background on their host, files come back by SFTP).

A worker process is ``python -m homagg.runs.job --child SPEC`` on both; its
barriers ("ready" / "go", once more after the warmup) go over its stdin and
stdout locally and over files on a remote host (the placement fills in the
spec's paths).  A training rank (homagg.train.train.run_train) is
``python -m homagg.train.train --child SPEC`` started the same way, without
barriers: it reads its job file (``put_job_file``, or the standing job's
``standing_job``), leaves its files in ``worker_dir`` and they come back
with ``fetch``.
"""

from __future__ import annotations

import abc
import os
import time
from dataclasses import dataclass


@dataclass
class AggregatorHost:
    """One aggregator host of a placement: its name, data-plane IP and MAC."""

    name: str
    ip: str
    mac: str | None = None


class Daemon(abc.ABC):
    """One homagg-switch a run uses (started for it, or shared)."""

    host: str
    ip: str
    pmd: str
    shared: bool  # not started by this run: ``stop`` leaves it alone
    running: bool

    @abc.abstractmethod
    def control(self, request: dict) -> dict:
        """One control request ({"cmd": ..., fields}) and its reply."""

    @abc.abstractmethod
    def cpu_seconds(self) -> float | None:
        """The daemon's CPU time so far (utime + stime, every thread), or None."""

    @abc.abstractmethod
    def stop(self) -> None: ...


class Placement(abc.ABC):
    """The hosts of a run and how processes are started on them.

    ``open`` connects (and checks) before anything starts; ``close`` stops
    every process the placement started and releases what it holds.
    ``refusals(options)`` names each run option this placement cannot do
    and why (the run raises one RunError listing them before anything
    starts).  ``auth`` is one a placement does when ``place_secret`` puts
    the job secret on its worker hosts (both placements do)."""

    kind: str = ""  # "testbed" / "inventory"
    where: str = ""  # "testbed NAME" / "inventory PATH": for messages
    testbed: str | None = None
    inventory: str | None = None
    mtu: int = 1500
    # workers may send runs of frames as UDP_SEGMENT messages: the network
    # cuts them before any aggregator (homagg.worker.Worker udp_gso)
    udp_gso: bool = False
    link_mbit: float | None = None  # the workers' link rate (None: not shaped / not given)
    default_leaves: int = 0
    run_dir: str | None = None  # where results and logs stay after the run (None: nowhere)
    workers: list[str]
    aggregators: list[AggregatorHost]

    def select_workers(self, n: int) -> None:
        """Use the first ``n`` worker hosts only (before ``open``)."""
        self.workers = self.workers[:n]

    def ranks_per_host(self) -> int:
        """How many of the run's processes share one host's cores."""
        return 1

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def refusals(self, options: dict) -> list[str]:
        return []

    @abc.abstractmethod
    def job_cost(self, cost_model: bool = True):
        """The cost model a job here registers (homagg.cost.Cost): the
        placement's link rate with this host's calibration; ``cost_model``
        False, or no link rate: none (``Cost()``, choices by bytes)."""

    def cost_hint(self, cost_model: bool = True) -> str | None:
        """A line for the user when the cost model a job here registers is
        known to miss this placement's own costs (and how to measure
        them); None otherwise."""
        return None

    @abc.abstractmethod
    def open_daemons(
        self,
        count: int,
        *,
        frames: int,
        pmd: str,
        switch: str | None,
        drop_rate: float,
        idle_us: int | None,
        idle_polls: int | None,
        lcores: int,
    ) -> list[Daemon]:
        """The daemons of the first ``count`` aggregator hosts, ready."""

    @abc.abstractmethod
    def place_secret(self, secret: bytes, name: str = "job.secret") -> str:
        """Put job secret ``secret`` (32 bytes) in file ``name`` where every
        worker of the placement reads it: mode 0600, owned by the user the
        workers run as, written without the secret ever being on a command
        line, in an environment or in a log line; gone when the placement
        closes.  Returns the path the workers are given (the job file's and
        the worker spec's ``auth_file``; the same on every worker host)."""

    @abc.abstractmethod
    def worker_ip(self, i: int) -> str:
        """Worker i's data-plane address (the worker binds it)."""

    @abc.abstractmethod
    def worker_iface(self, i: int) -> str | None:
        """Worker i's data-plane kernel interface (None: none known)."""

    @abc.abstractmethod
    def worker_dir(self, i: int) -> str:
        """The folder on worker i's host its process runs in and leaves its
        files in (after ``open``)."""

    @abc.abstractmethod
    def put_job_file(self, i: int, name: str, fields: dict) -> str:
        """Write job file ``name`` (homagg.switch.job_file fields, readable by
        its owner only) into ``worker_dir(i)`` on worker i's host; its path
        there."""

    @abc.abstractmethod
    def standing_job(self) -> tuple[dict, list[str], bytes | None] | None:
        """The job the placement's own daemons carry (``homagg testbed up``'s
        or ``homagg up -i``'s): its job-file fields, the path of its job
        file on each worker's host and its secret where it authenticates
        and ``job_file.renew`` cannot read it here (None: none, or read
        from the job file's auth_file); None where there is none (after
        ``open``)."""

    @abc.abstractmethod
    def standing_tree(self) -> tuple[list[dict], list[bytes] | None]:
        """When ``standing_job`` is a tree (its fields have ``leaf_ids``):
        each worker's job-file fields, in worker order, and each leaf's
        secret as its workers' files hold it (None: the tree does not
        authenticate), what job_file.renew_tree takes."""

    @abc.abstractmethod
    def fetch(self, i: int, names: list[str]) -> str:
        """Bring worker i's files ``names`` (in ``worker_dir(i)``) here; the
        local folder that holds them."""

    @abc.abstractmethod
    def start_workers(
        self, specs: list[dict], module: str = "homagg.runs.job", env: list[dict] | None = None
    ) -> list[int]:
        """Start worker i: ``python -m MODULE --child SPECS[i]`` (the
        placement fills in "out", "report" and its barrier fields), with
        ``env[i]`` added to its environment; returns their PIDs."""

    def stop_worker(self, i: int) -> None:
        """Stop worker i's process (run option ``fail_workers``; a placement
        that cannot refuses the option in ``refusals``)."""
        from homagg.errors import InvalidArgument

        raise InvalidArgument(
            f"fail_workers: {type(self).__name__} cannot stop one worker's process; "
            "run it on a local testbed (homagg.deploy.local)"
        )

    @abc.abstractmethod
    def wait_ready(self, timeout: float) -> list[str]:
        """Wait until every worker reached its next barrier: the failures
        ("host 'w0': ..."), empty when all did."""

    @abc.abstractmethod
    def go(self) -> None:
        """Release every worker from the barrier it waits at."""

    @abc.abstractmethod
    def collect(self, timeout: float) -> tuple[list[dict], list[str]]:
        """Every worker's report (its JSON line) and the failures."""

    @abc.abstractmethod
    def results(self) -> list:
        """Every worker's result array, worker order (fetched here)."""

    @abc.abstractmethod
    def link_stats(self, host: str) -> dict | None:
        """The kernel counters of ``host``'s data-plane link (tx/rx bytes and
        packets), None where it has no kernel interface (a PCI NIC)."""

    @abc.abstractmethod
    def stop_workers(self) -> None: ...


def run_folder(runs_dir: str, label: str) -> str:
    """A new folder RUNS_DIR/<timestamp>-<label>[.N] for a run's results and
    logs (made here; its absolute path)."""
    base = os.path.join(runs_dir, f"{time.strftime('%Y%m%d-%H%M%S')}-{label}")
    path, n = base, 1
    while os.path.exists(path):
        n += 1
        path = f"{base}.{n}"
    os.makedirs(path)
    return os.path.abspath(path)
