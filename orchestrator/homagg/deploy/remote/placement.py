"""A run placed on the hosts of an inventory over SSH (homagg.deploy.placement).

The daemons are the ones ``homagg up -i`` started (one per aggregator host,
holding its NIC); a worker runs in the background on its host
(homagg.deploy.remote.hosts.Host.start: its own session, a PID file); its
barriers are files in the run's folder on its host ("ready", then "go" from
here; ".timed" after a warmup); its report, result and log come back by SFTP
into RUNS_DIR/<timestamp>-<method>/ here, which stays (``run_dir``)."""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys

import numpy as np

from homagg.cost import Cost
from homagg.deploy.placement import AggregatorHost, Daemon, Placement, run_folder
from homagg.deploy.remote import hosts as rh
from homagg.deploy.remote import inventory as inv
from homagg.deploy.remote import secret as hsecret
from homagg.deploy.remote import ssh
from homagg.errors import RemoteError

log = logging.getLogger("homagg.deploy.remote.placement")

# what a daemon of one's own would take: the daemons here are up's
_UP_DAEMON = (
    "the daemons on inventory hosts are the ones `homagg up -i` started (they hold the NICs)"
)


# a run option's value that needs nothing of a daemon of one's own
_DEFAULTS = {
    "drop_rate": 0.0,
    "switch_lcores": 1,
    "pmd": "auto",
    "switch": None,
    "idle_us": None,
    "idle_polls": None,
    "fail_aggregators": (),
    "fail_workers": (),
    "gradient_files": None,
}


class UpDaemon(Daemon):
    """The homagg-switch `homagg up -i` started on one aggregator host."""

    shared = True

    def __init__(self, r: rh.Host):
        self.r = r
        self.host, self.ip = r.h.name, r.h.address
        self.pmd = r.h.vdev or f"pci {r.h.pci} ({r.h.driver})"
        self.running = True

    def control(self, request):
        return self.r.control(request)

    def cpu_seconds(self):
        """utime + stime of the daemon (its PID file names it), from the host's /proc."""
        pf = shlex.quote(rh.switch_pidfile(self.r.h))
        r = self.r.sh(
            f"hg_alive {pf} && read pid st <{pf} && "
            "echo $(sed 's/.*) //' /proc/$pid/stat | cut -d' ' -f12,13) "
            "$(getconf CLK_TCK)",
            check=False,
        )
        try:
            ut, st, hz = map(int, r.stdout.split()[-3:])
        except ValueError:
            return None
        return (ut + st) / hz

    def stop(self):
        """A daemon of `homagg up -i`: `homagg down -i` stops it."""


class InventoryPlacement(Placement):
    """The hosts of an inventory (``homagg up -i`` ran); results and logs go
    to a new folder under ``runs_dir``."""

    kind = "inventory"

    def __init__(
        self,
        inventory: inv.Inventory,
        runs_dir: str = "runs",
        label: str = "run",
        start_timeout: float = 120.0,
        out=None,
    ):
        self.inv = inventory
        self.inventory = inventory.path
        self.where = f"inventory {inventory.path}"
        self.mtu = min(h.mtu for h in inventory.hosts)
        self.link_mbit = inventory.settings.link_mbit or None
        self.runs_dir, self.label = runs_dir, label
        self.start_timeout = start_timeout
        self.out = out or sys.stderr
        self.workers = [h.name for h in inventory.hosts if h.role == "worker"]
        self.aggregators = [
            AggregatorHost(h.name, h.address) for h in inventory.hosts if h.role == "aggregator"
        ]
        self.hosts: list[rh.Host] = []
        self.paths: list[dict] = []
        self.started: list[tuple[rh.Host, str]] = []
        self.daemons: list[UpDaemon] = []
        self.secrets: list[tuple[rh.Host, str]] = []  # (host, path) of place_secret
        self._stage = 0
        self._default_leaves: int | None = None

    # -- lifecycle -----------------------------------------------------------

    @property
    def default_leaves(self) -> int:
        """The leaves of the standing tree of `homagg up -i --leaves L` (the
        first worker host's job file names a leaf: L is every aggregator
        host but the last, hosts.check_tree), read over SSH once; 0 for a
        flat job, none, or a host that cannot be read now (``open`` names
        what is wrong with it)."""
        if self._default_leaves is None:
            self._default_leaves = 0
            if self.workers and len(self.aggregators) > 1:
                r = rh.Host(self.inv.host(self.workers[0]), self.inv)
                try:
                    r.preflight()
                    fields = r.job_file_fields()
                    if fields and fields.get("leaf_ids"):
                        self._default_leaves = len(self.aggregators) - 1
                except Exception as e:  # noqa: BLE001 - open() reports the host
                    log.debug("host '%s': no standing job read: %s", r.h.name, e)
                finally:
                    r.close()
        return self._default_leaves

    def open(self):
        self.hosts = rh.open_hosts(self.inv, self.out)
        self.W = [r for r in self.hosts if r.h.role == "worker" and r.h.name in self.workers]
        self.run_dir = run_folder(self.runs_dir, self.label)
        self.run_id = os.path.basename(self.run_dir)

    def close(self):
        try:
            self.stop_workers()
            for k, d in enumerate(self.daemons):
                try:
                    d.r.conn.get(
                        rh.switch_log(d.r.h),
                        os.path.join(
                            self.run_dir, "switch.log" if k == 0 else f"switch-{d.host}.log"
                        ),
                    )
                except Exception as e:  # noqa: BLE001 - report, keep cleaning the others
                    log.warning("host '%s': %s", d.host, e)
        finally:
            for r, path in self.secrets:  # normally gone with the run's folder already
                try:
                    r.run(f"rm -f {shlex.quote(path)}", check=False)
                except Exception as e:  # noqa: BLE001 - report, keep cleaning the others
                    log.warning("host '%s': the job secret %s not removed: %s", r.h.name, path, e)
            self.secrets = []
            for r in self.hosts:
                r.close()

    def place_secret(self, secret, name="job.secret"):
        """The secret into RUNDIR/<run id>/``name`` on every worker host, by
        SFTP into a private temporary file installed with mode 0600 as the
        user the workers run as (homagg.deploy.remote.secret.put); removed with the
        run's folder when the run ends (and at ``close`` whatever
        happened).  A worker's spec gets its own host's path of the file
        (``start_workers``); returns worker 0's."""
        paths = {r.h.name: f"{rh.rundir(r.h)}/{self.run_id}/{name}" for r in self.W}

        def put(r):
            try:
                hsecret.put(r, paths[r.h.name], secret)
                self.secrets.append((r, paths[r.h.name]))
            except Exception as e:  # noqa: BLE001 - collected per host below
                return e

        res = ssh.parallel(put, self.W, len(self.W))
        bad = {n: e for n, e in res.items() if e is not None}
        if bad:
            raise RemoteError(
                "the job secret was not placed on "
                + "; ".join(f"host '{n}': {type(e).__name__}: {e}" for n, e in bad.items())
            )
        return paths[self.W[0].h.name]

    def refusals(self, options):
        why = {
            "drop_rate": f"{_UP_DAEMON}; a drop rate needs a daemon of its own "
            "(a local testbed made with `homagg testbed up --no-daemon`)",
            "switch_lcores": f"{_UP_DAEMON}; their engine lcores are the inventory's 'cores'",
            "pmd": f"{_UP_DAEMON}; the PMD is the inventory's 'vdev' or 'pci'",
            "switch": f"{_UP_DAEMON}; give the binary to `homagg up -i --switch`",
            "idle_us": f"{_UP_DAEMON}; the idle backoff is the daemon's",
            "idle_polls": f"{_UP_DAEMON}; the idle backoff is the daemon's",
            "fail_aggregators": f"{_UP_DAEMON}; a run does not stop them",
            "fail_workers": "a run on inventory hosts does not stop its workers",
            "gradient_files": "gradient files are paths on this machine; the worker hosts "
            "build their gradients from the seed",
        }
        out = [f"{k}: {why[k]}" for k, d in _DEFAULTS.items() if (options.get(k) or d) != d]
        leaves = options.get("leaves") or 0
        if leaves and leaves < len(self.aggregators):
            root = self.inv.host(self.aggregators[leaves].name)
            if not root.kernel_iface:  # its MAC is read from the kernel interface
                out.append(
                    f"leaves: the tree's root, host '{root.name}', has a PCI NIC whose "
                    "MAC address the leaves cannot learn here: make a host with a "
                    "vdev (net_af_packet/net_af_xdp on a kernel interface) the root"
                )
        return out

    def job_cost(self, cost_model=True):
        """The inventory's ``link_mbit`` and the worker hosts' calibrations
        (homagg.deploy.remote.hosts.inventory_cost, as the job of `homagg up -i`)."""
        return rh.inventory_cost(self.inv, self.hosts) if cost_model else Cost()

    # -- daemons -------------------------------------------------------------

    def open_daemons(self, count, *, frames, pmd, switch, drop_rate, idle_us, idle_polls, lcores):
        aggs = [r for r in self.hosts if r.h.role == "aggregator"][:count]
        down = [a.h.name for a in aggs if not a.alive(rh.switch_pidfile(a.h))]
        if down:
            raise RemoteError(
                "homagg-switch is not running on "
                + ", ".join(f"host '{n}'" for n in down)
                + f": start it with `homagg up -i {self.inv.path}`"
            )
        self.daemons = [UpDaemon(a) for a in aggs]
        spec_of = {a.name: a for a in self.aggregators}
        for a in aggs:  # a tree's leaves send to the root's MAC
            iface, spec = a.h.kernel_iface, spec_of[a.h.name]
            if iface and spec.mac is None:
                spec.mac = a.run(f"cat /sys/class/net/{shlex.quote(iface)}/address").stdout.strip()
        return self.daemons

    # -- workers -------------------------------------------------------------

    def worker_ip(self, i):
        return self.inv.host(self.workers[i]).address

    def worker_iface(self, i):
        return self.inv.host(self.workers[i]).kernel_iface

    def worker_dir(self, i):
        """INSTALL_DIR/run/<run id> on the worker's host (removed at ``close``)."""
        return f"{rh.rundir(self.W[i].h)}/{self.run_id}"

    def put_job_file(self, i, name, fields):
        path = f"{self.worker_dir(i)}/{name}"
        self.W[i].put_job_file(path, fields)
        return path

    def standing_job(self):
        """`homagg up -i`'s job (its job file on the first aggregator host),
        the job file `up` wrote on every worker host and, with `up -i
        --auth`, its secret (read from the first worker host's copy)."""
        agg = next(r for r in self.hosts if r.h.role == "aggregator")
        fields = agg.job_file_fields()
        if fields is None:
            return None
        # `up -i --auth`: its secret, from a worker host's copy
        return (fields, [rh.job_file_path(r.h) for r in self.W], rh.up_job_secret(self.W, fields))

    def standing_tree(self):
        """Each worker host's job file of `up -i --leaves`'s tree and each
        leaf's secret, read over SSH from the host of its first worker
        (hosts.read_secret: never logged)."""
        from homagg.switch import job_file

        own = ssh.parallel(lambda r: r.job_file_fields(), self.W, len(self.W))
        missing = [n for n, f in own.items() if not f]
        if missing:
            raise RemoteError(
                f"the tree of `homagg up -i` has no job file on {', '.join(missing)}: "
                f"`homagg down -i {self.inv.path}` and `homagg up -i --leaves` again"
            )
        per = [own[r.h.name] for r in self.W]
        if not per[0].get("mac"):
            return per, None
        firsts = job_file.tree_leaf_firsts(per)
        return per, [rh.read_secret(self.W[i], per[i]["auth_file"]) for i in firsts]

    def fetch(self, i, names):
        """By SFTP into ``run_dir``."""
        d = self.worker_dir(i)
        for n in names:
            self.W[i].conn.get(f"{d}/{n}", os.path.join(self.run_dir, n))
        return self.run_dir

    def start_workers(self, specs, module="homagg.runs.job", env=None):
        pids = []
        for i, (r, spec) in enumerate(zip(self.W, specs)):
            d = self.worker_dir(i)
            p = {
                "dir": d,
                "pid": f"{rh.rundir(r.h)}/worker-{self.run_id}-{i}.pid",
                "log": f"{d}/worker-{i}.log",
                "ready": f"{d}/ready-{i}",
                "go": f"{d}/go",
                "out": f"{d}/result-{i}.npy",
                "report": f"{d}/report-{i}.json",
            }
            spec = dict(
                spec,
                out=p["out"],
                mtu=r.h.mtu,
                ready_file=p["ready"],
                go_file=p["go"],
                report=p["report"],
                start_timeout=self.start_timeout,
            )
            if spec.get("auth_file"):  # this host's copy (install dirs may differ)
                spec["auth_file"] = f"{d}/{os.path.basename(spec['auth_file'])}"
            pids.append(
                r.start(
                    p["pid"],
                    p["log"],
                    [r.python, "-m", module, "--child", json.dumps(spec)],
                    d,
                    env=env[i] if env else None,
                )
            )
            self.started.append((r, p["pid"]))
            self.paths.append(p)
        return pids

    def _suffix(self):
        return "" if self._stage == 0 else ".timed"

    def _failures(self, names, what):
        self._fetch_logs()
        return [f"host '{n}': {what}{self._log_tail(n)}" for n in names]

    def wait_ready(self, timeout):
        P = {r.h.name: p for r, p in zip(self.W, self.paths)}
        sfx = self._suffix()

        def ready(r):
            p = P[r.h.name]
            return rh._wait_remote(r, f"test -e {shlex.quote(p['ready'] + sfx)}", p["pid"], timeout)

        oks = ssh.parallel(ready, self.W, len(self.W))
        return self._failures([n for n, ok in oks.items() if not ok], "")

    def go(self):
        sfx = self._suffix()
        P = {r.h.name: p for r, p in zip(self.W, self.paths)}
        ssh.parallel(
            lambda r: r.run(f"touch {shlex.quote(P[r.h.name]['go'] + sfx)}"), self.W, len(self.W)
        )
        self._stage += 1

    def collect(self, timeout):
        P = {r.h.name: p for r, p in zip(self.W, self.paths)}

        def finished(r):
            p = P[r.h.name]
            # the worker gives up by itself after its timeout without progress
            return rh._wait_remote(r, f"test -s {shlex.quote(p['report'])}", p["pid"], timeout)

        done = ssh.parallel(finished, self.W, len(self.W))
        failed = [n for n, ok in done.items() if not ok]
        if failed:
            return [], self._failures(failed, "")
        self._fetch_logs()
        reports = []
        for i, (r, p) in enumerate(zip(self.W, self.paths)):
            local = os.path.join(self.run_dir, f"report-{i}.json")
            r.conn.get(p["report"], local)
            with open(local) as f:
                reports.append(json.loads(f.read()))
        return reports, []

    def results(self):
        out = []
        for i, (r, p) in enumerate(zip(self.W, self.paths)):
            local = os.path.join(self.run_dir, f"result-{i}.npy")
            r.conn.get(p["out"], local)
            out.append(np.load(local))
        return out

    def link_stats(self, host):
        r = next(r for r in self.hosts if r.h.name == host)
        return rh._link_bytes(r) if r.h.kernel_iface else None

    def stop_workers(self):
        rh.stop_started(
            self.started,
            self.run_id,
            lambda r, e: log.warning("host '%s': cleanup failed: %s", r.h.name, e),
        )
        self.started = []

    def _fetch_logs(self):
        rh._fetch_logs(self.W, self.paths, self.run_dir)

    def _log_tail(self, name):
        return rh._log_tail(self.run_dir, name)
