"""`homagg train -i testbed.toml`: the ranks on an inventory's worker hosts.

    homagg up -i testbed.toml                 # homagg-switch on the aggregator
    homagg train -i testbed.toml --model ncf --method auto --steps 10
    homagg down -i testbed.toml

The same run as ``homagg train --testbed`` (homagg.train.train), over SSH
(homagg.deploy.remote.hosts's hosts, preflight and process handling).  With one rank
per worker host it uses the job ``homagg up`` registered and its job files
(registered afresh before and after the run, homagg.switch.job_file); otherwise a
job of its own is registered on the daemons ``homagg up`` started (spread
over every aggregator host), its job file written on
every worker host, one rank started per worker host (``python -m
homagg.train.train --child SPEC`` in the host's venv, in the background with a
PID file; Gloo rendezvous at the first worker's data-plane address), and
when they are done their reports, final parameters and recorded bucket
gradients are copied into RUNS_DIR/<timestamp>-train-<method>/ with the
logs; the cross-rank and replay checks run there.  A user's model file
(``--model path.py:factory``) must exist at the same path on every worker.
"""
from __future__ import annotations

import json
import os
import secrets
import shlex
import sys

from homagg.deploy.remote import hosts as remote
from homagg.deploy.remote import inventory as inv
from homagg.deploy.remote import ssh
from homagg.runs.job import UDP_PORT
from homagg.switch import job_file
from homagg.train import train as trainmod

REPORT = "rank-{rank}.json"


def _files(W: int, phases: list[str]) -> list[str]:
    """What every rank leaves in its run folder (rank r's names)."""
    out = []
    for ph in phases:
        out.append(f"params-{ph}-{{rank}}.npz")
    if any(ph != "gloo" for ph in phases):
        out += ["grads-{rank}.npz", "layout-{rank}.json", "digests-{rank}.json"]
    out.append("init-{rank}.npz")
    return out + [REPORT]


def run_train(inventory_path: str, model: str = "ncf", method: str = "auto", steps: int = 5,
              warmup: int = 1, ranks: int | None = None, lr: float | None = None,
              seed: int = 1, bucket_mb: float = 4.0, baseline: bool = True,
              sparsify: str | None = None, timeout: float = 10.0, runs_dir: str = "runs",
              out_dir: str | None = None, slots: int | None = None, payload: int = 1024,
              group: str = "239.77.0.2", start_timeout: float = 120.0, out=None) -> dict:
    """Train on the inventory's worker hosts; returns homagg.train.train's report
    plus "run_dir".  Every rank process is stopped before it returns."""
    out = out or sys.stderr
    trainmod.check_arguments(method, model, steps, warmup)
    lr = trainmod.load_factory(model)[1] if lr is None else lr
    inventory = inv.load(inventory_path)
    hosts = remote.open_hosts(inventory, out)
    workers = [r for r in hosts if r.h.role == "worker"]
    if ranks is not None:
        if not 1 <= ranks <= len(workers):
            raise trainmod.TrainError(f"--ranks {ranks}: the inventory has {len(workers)} workers")
        workers = workers[:ranks]
    aggs = remote._aggregators(hosts)  # the job is spread over every aggregator
    W = len(workers)
    phases = trainmod._phases(method, baseline)
    folder = remote._run_folder(runs_dir, f"train-{method}")
    run_id = os.path.basename(folder)
    started, job, up_job, up_secret = [], None, None, None
    try:
        env = {"OMP_NUM_THREADS": "1"}
        if method != "gloo":
            down = [a.h.name for a in aggs if not a.alive(remote.switch_pidfile(a.h))]
            if down:
                raise remote.RemoteError(
                    "homagg-switch is not running on " + ", ".join(f"host '{n}'" for n in down)
                    + f": start it with `homagg up -i {inventory.path}`")
            controls = [a.control for a in aggs]
            up_job = aggs[0].job_file_fields()  # `homagg up`'s job, if any
            if up_job and up_job["workers"] == W:
                # with a rank per worker host: that job afresh, and its job files
                # `up -i --auth`: its secret, from a worker host's copy
                up_secret = remote.up_job_secret(workers, up_job)
                job = job_file.renew(controls, up_job, secret=up_secret)
            else:
                up_job = None
                job = job_file.register(controls, [(a.h.address, UDP_PORT) for a in aggs],
                                        workers=W, slots=slots, payload=payload, group=group,
                                        timeout=timeout, cost=remote.inventory_cost(inventory))
        init = f"tcp://{workers[0].h.address}:{trainmod.GLOO_PORT + secrets.randbelow(2000)}"
        dirs, pids = [], []
        for r, host in enumerate(workers):
            d = f"{remote.rundir(host.h)}/{run_id}"
            host.run(f"mkdir -p {shlex.quote(d)}")
            renv = dict(env, HOMAGG_BIND=host.h.address, GLOO_SOCKET_IFNAME=host.h.iface)
            if up_job is not None:
                renv["HOMAGG_JOB_FILE"] = remote.job_file_path(host.h)
            elif job is not None:
                path = f"{d}/job.json"
                host.put_job_file(path, job)
                renv["HOMAGG_JOB_FILE"] = path
            spec = trainmod.rank_spec(rank=r, world=W, init=init, model=model, seed=seed, lr=lr,
                                      steps=steps, warmup=warmup, bucket_mb=bucket_mb,
                                      phases=phases, workdir=d, ifname=host.h.iface,
                                      sparsify=sparsify, start_timeout=start_timeout)
            spec["report"] = f"{d}/{REPORT.format(rank=r)}"
            pidfile = f"{remote.rundir(host.h)}/rank-{run_id}-{r}.pid"
            pids.append(host.start(pidfile, f"{d}/worker-{r}.log",
                                   [host.python, "-m", "homagg.train.train", "--child", json.dumps(spec)],
                                   d, env=renv))
            started.append((host, pidfile))
            dirs.append(d)
        budget = start_timeout + (steps + warmup) * (timeout + 30.0)

        rank_of = {host.h.name: r for r, host in enumerate(workers)}

        def finished(host):
            r = rank_of[host.h.name]
            report = f"{dirs[r]}/{REPORT.format(rank=r)}"
            return remote._wait_remote(host, f"test -s {shlex.quote(report)}", started[r][1],
                                       budget)

        done = ssh.parallel(finished, workers, W)
        logs = [{"log": f"{d}/worker-{r}.log"} for r, d in enumerate(dirs)]
        remote._fetch_logs(workers, logs, folder)
        failed = [n for n, ok in done.items() if not ok]
        if failed:
            raise trainmod.TrainError(f"training {model} with {method} failed on {len(failed)} "
                                      f"of {W} ranks: " + "; ".join(
                                          f"host '{n}': {remote._log_tail(folder, n)}"
                                          for n in failed))
        reports = []
        for r, (host, d) in enumerate(zip(workers, dirs)):
            for name in _files(W, phases):
                name = name.format(rank=r)
                host.conn.get(f"{d}/{name}", os.path.join(folder, name))
            with open(os.path.join(folder, REPORT.format(rank=r))) as f:
                reports.append(json.load(f))
        rep = trainmod.summarize(method, reports, folder, dict(
            model=model, steps=steps, warmup=warmup, lr=lr, seed=seed, bucket_mb=bucket_mb,
            sparsify=sparsify))
        rep.update({"inventory": inventory.path, "aggregator": aggs[0].h.name,
                    "aggregators": [a.h.name for a in aggs],
                    "job": job["job"] if job else None,
                    "job_file": (remote.job_file_path(workers[0].h) if up_job else
                                 f"{dirs[0]}/job.json" if job else None),
                    "worker_hosts": [w.h.name for w in workers], "rank_pids": pids,
                    "run_dir": folder, "link_mbit": None})
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
            rep["plots"] = trainmod.plot(rep, out_dir)
        with open(os.path.join(folder, "train.json"), "w") as f:
            json.dump(rep, f, indent=1)
        return rep
    finally:
        remote.stop_started(started, run_id, lambda host, e: print(
            f"host '{host.h.name}': cleanup failed: {e}", file=out))
        if up_job is not None:
            try:  # fresh for the next run of ranks
                job_file.renew([a.control for a in aggs], up_job, secret=up_secret)
            except Exception as e:  # noqa: BLE001 - reported, the run's result stands
                print(f"`homagg up`'s job {up_job['job']} not renewed: {e}", file=out)
        elif job is not None:
            job_file.unregister([a.control for a in aggs], job["job"], warn=lambda k, e: print(
                f"host '{aggs[k].h.name}': {e}", file=out))
        for host in hosts:
            host.close()
