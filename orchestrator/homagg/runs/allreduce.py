"""Run one allreduce on a local testbed: DPDK aggregator plus one worker per namespace.

    sudo homagg testbed up --workers 4 --link-mbit 1000 --name demo
    sudo homagg run allreduce --testbed demo --method lhc --elements 1000000 --density 0.01

uses the homagg-switch daemons `homagg testbed up` started (a testbed made
with --no-daemon: starts homagg-switch in the aggregator's namespace itself,
DPDK vdev net_af_xdp on its eth0, falling back to net_af_packet; --pmd other
than auto, --drop-rate and --switch-lcores configure a daemon of its own, so
they need such a testbed and are refused on one whose daemons run) -- in
every aggregator's namespace
when the testbed has several (``homagg testbed up --aggregators K``: the job
is spread over them, docs/PROTOCOL.md "Several aggregators"; with
``--leaves L`` or a testbed made with ``homagg testbed up --leaves L`` the
first L are tree leaves below the next one, the root, docs/PROTOCOL.md
"Tree") --, registers
the job over each control socket, starts one worker process in every worker namespace (each generates
its gradient from the seed and its worker id, then calls
homagg.worker.Worker.allreduce), checks every worker's result bit for bit
against the fixed-point reference (numpy), prints the time, the bytes each
worker put on its link and the daemon's counters, and stops every process it
started (by PID).  The exit status is 0 when every exact method's result is
bit-exact on every worker (nc is lossy by design: it must only agree across
workers).

workloads (--density D = fraction of non-zero elements per worker), generated
by homagg.bench.workloads, the generator the benchmarks' Gloo baseline uses:
  shared  every worker has the same non-zero positions (dense-ish layers)
  random  every worker picks its own positions uniformly
  zipf    rows of 64 elements with Zipf-distributed popularity (embedding rows)
  dense   every element non-zero (--density is ignored)

--payload-bytes sets the job's payload per packet (1024 by default; up to
8192 on a testbed made with `homagg testbed up --mtu 9000`: the aggregator
then runs on net_af_packet with frames of the MTU, since af_xdp's 4 KB umem
frames cannot hold a jumbo frame).

--pipeline-groups sets the job's block groups of every method (0
automatic, 1 not pipelined, N groups; docs/PROTOCOL.md "Pipelined block
groups"; auto then chooses per group); the report carries it, and each
worker's stats the groups used (auto: the groups per chosen method).

Each worker also reports the CPU time of its process over its allreduce
(time.process_time), returned as "worker_cpu_seconds"; the daemon's CPU time
(utime + stime of /proc/PID/stat, all its threads) from "go" until every
worker answered is "daemon_cpu_seconds" (None where /proc cannot tell).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import homagg
from homagg import auth as hg_auth
from homagg import log
from homagg.deploy.local.testbed import Testbed, TestbedError
from homagg.deploy.local import testbed_job as testbed_job_mod
from homagg.errors import HomAggError
from homagg.protocol import PIPELINE_GROUPS, check_pipeline_groups, resolve_slots
from homagg.runs.job import (DEFAULT_BLOCK, METHODS, UDP_PORT, WORKLOADS, RunError, check_arguments,
                             check_payload, collect_reports, counter_deltas, print_report, sum_dicts,
                             tree_leaf, verify, worker_spec)
from homagg.switch import job_file
from homagg.switch.daemon import IDLE_POLLS, IDLE_US, Switch


# --------------------------------------------------------------------------
# Workers (child processes)


def child_env() -> dict:
    """The environment of a worker process: this one, with this package first
    on PYTHONPATH (the child runs ``python -m homagg...`` in a namespace)."""
    env = dict(os.environ)
    pkg_root = str(pathlib.Path(homagg.__file__).resolve().parents[1])
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _per_call(total: int, calls: int):
    """A counter moved over ``calls`` calls, per call (an int for one)."""
    return total if calls == 1 else total / calls


def run_allreduce(testbed: str, method: str, elements: int, density: float,
                  workload: str = "random", seed: int = 1, block: int = DEFAULT_BLOCK,
                  slots: int = None, payload: int = 1024, timeout: float = 10.0,
                  rto: float = 0.005, pmd: str = "auto", switch: str | None = None,
                  state_dir: str | None = None, group: str = "239.77.0.1",
                  drop_rate: float = 0.0, idle_us: int = IDLE_US,
                  idle_polls: int = IDLE_POLLS, fail_aggregators: tuple = (),
                  aggregators: int | None = None, repeat: int = 1, warmup: int = 0,
                  auth: bool = False, leaves: int | None = None,
                  switch_lcores: int = 1,
                  pipeline_groups: int = PIPELINE_GROUPS,
                  gradient_files: list[str] | None = None, expect: dict | None = None,
                  cost_model: bool = True) -> dict:
    """One allreduce on testbed ``testbed``; returns the report dict (see
    the module doc).  Every process it starts is stopped before it returns.
    ``drop_rate`` makes the daemon's port drop that fraction of the frames it
    receives (fault injection; retransmissions repair it).
    ``fail_aggregators`` (host names, e.g. ("agg1",)) are stopped once the
    job is registered on them: the workers' error must name them.
    ``aggregators`` N spreads the job over the testbed's first N aggregator
    hosts (default: all of them; N - 1 is the re-run without a dead one).

    With ``warmup`` / ``repeat`` the same workers and daemon run ``warmup``
    untimed allreduces, then ``repeat`` timed ones (the same gradients:
    every call gives the same result, checked once).  Then "seconds_each"
    is the slowest worker's time of each timed call, "seconds" their
    median, and the bytes, CPU and counters are per timed call
    ("worker_stats_timed": each worker's counters over the timed calls;
    the daemons' counters and "aggregators" cover all timed calls).
    ``auth``: the job authenticates every frame; its new secret goes to the
    daemons over their control sockets and to the workers in a file only its
    owner reads.
    ``leaves`` L (default: the testbed's, from ``homagg testbed up
    --leaves``): a two-level tree, the first L aggregator hosts leaves
    (leaf l serves workers floor(l W / L) .. floor((l + 1) W / L) - 1 and
    multicasts to ``group`` + 256 l) and host L + 1 the root, which answers
    the leaves by unicast (aggregator ports get no multicast flood).
    ``switch_lcores`` N: every homagg-switch runs N engine lcores (N > 1: a
    dispatcher spreads each job's slots over them, docs/SWITCH.md "Several
    engines"); each aggregator's report then has "engine_summed" per
    engine.
    ``pipeline_groups``: the job's block groups (0 automatic, 1 not
    pipelined; docs/PROTOCOL.md "Pipelined block groups").

    A benchmark running several methods on the same gradients passes what
    they share: ``gradient_files`` (homagg.runs.job.save_gradients: each worker
    loads its gradient instead of generating it) and ``expect``
    (homagg.runs.job.expected of the same job: the check does not rebuild the
    reference); the daemons it shares are the testbed's own
    (homagg.deploy.local.testbed_job.start)."""
    if repeat < 1 or warmup < 0:
        raise RunError("repeat must be >= 1 and warmup >= 0")
    pipeline_groups = check_pipeline_groups(pipeline_groups)
    check_arguments(method, elements, density)
    if workload not in WORKLOADS:
        raise RunError(f"workload {workload!r} not in {WORKLOADS}")
    tb = Testbed.open(testbed, state_dir)
    mtu = int(tb.state().get("mtu") or 1500)
    check_payload(payload, mtu, f"testbed {testbed}")
    workers = tb.workers
    W = len(workers)
    slots = resolve_slots(slots, W)  # unset: W x S fits a 4096-frame ring
    job, token = 1 + secrets.randbelow(1 << 15), secrets.randbits(31)
    hosts = tb.aggregators
    if aggregators is not None and not 1 <= aggregators <= len(hosts):
        raise RunError(f"aggregators must be 1..{len(hosts)} (the testbed's aggregator hosts), "
                       f"got {aggregators}")
    if leaves is None:
        leaves = int(tb.state().get("leaves") or 0)
    if leaves:
        if aggregators is not None:
            raise RunError("--aggregators and a tree (--leaves) exclude each other")
        if len(hosts) < 2:
            raise RunError(f"--leaves {leaves}: testbed {testbed} has one aggregator host, a tree "
                           f"needs L + 1 (make one with `homagg testbed up --leaves {leaves}`)")
        if not 1 <= leaves <= min(W, len(hosts) - 1):
            raise RunError(f"leaves must be 1..{min(W, len(hosts) - 1)}: a tree of L leaves needs "
                           f"L + 1 aggregator hosts and at least L workers (the testbed has "
                           f"{len(hosts)} and {W}; `homagg testbed up --leaves L`)")
        if auth:
            raise RunError("a tree does not authenticate: drop --auth or --leaves")
        aggregators = leaves + 1
    if gradient_files is not None and len(gradient_files) != W:
        raise RunError(f"gradient_files: {len(gradient_files)} files for {W} workers")
    workdir = tempfile.mkdtemp(prefix=f"homagg-run-{testbed}-")
    procs = []
    sws, registered = [], []
    try:
        for h in hosts[:aggregators]:
            sws.append(Switch(tb, workdir, pmd=pmd, switch=switch, drop_rate=drop_rate,
                              idle_us=idle_us, idle_polls=idle_polls, host=h.name,
                              lcores=switch_lcores, frames=W * slots))
        sw = sws[0]
        unknown = set(fail_aggregators) - {s.host for s in sws}
        if unknown:
            raise RunError(f"fail_aggregators: no aggregator host {sorted(unknown)} "
                           f"(the testbed has {[s.host for s in sws]})")
        if any(s.shared for s in sws if s.host in fail_aggregators):
            raise RunError(f"fail_aggregators: testbed {testbed} runs its own daemons "
                           "(`homagg testbed up`); stopping one needs `--no-daemon`")
        auth_file = os.path.join(workdir, "job.secret") if auth else None
        secret = hg_auth.create_secret_file(auth_file) if auth else None
        agg_addrs = [(s.ip, UDP_PORT) for s in sws]
        job_cost = testbed_job_mod.job_cost(tb, cost_model)
        if not leaves:  # aggregator k of the job: its shard k
            job_file.register([s.control for s in sws], agg_addrs, workers=W, slots=slots,
                              payload=payload, group=group, timeout=timeout, job=job,
                              token=token, auth=secret, cost=job_cost)
        registered = sws
        for k, s in enumerate(sws if leaves else ()):
            with s.client() as c:
                if k == leaves:  # the root: the L leaves are its workers
                    c.add_job(job=job, token=token, workers=leaves, slots=slots,
                              payload=payload)
                else:
                    root = tb.host(sws[leaves].host)
                    c.add_job(job=job, token=token, workers=tree_leaf(k * W // leaves, W, leaves)[2],
                              slots=slots, payload=payload, group=_leaf_group(group, k),
                              parent={"ip": root.ip, "mac": root.mac, "worker": k,
                                      # the workers' timeout: the root is as far
                                      "rto_us": max(1, int(rto * 1e6))})
        del secret
        before = [s.control({"cmd": "stats"}) for s in sws]
        env = child_env()
        for i, h in enumerate(workers):
            place = dict(group=group, aggregators=agg_addrs)
            if leaves:  # its leaf is its one aggregator
                leaf, index, size = tree_leaf(i, W, leaves)
                place = dict(group=_leaf_group(group, leaf), aggregators=[agg_addrs[leaf]],
                             leaf_ids=(index, size))
            spec = worker_spec(job=job, token=token, worker=i, workers=W, agg_ip=tb.aggregator.ip,
                               ip=h.ip, timeout=timeout, slots=slots,
                               payload=payload, rto=rto, method=method, block=block,
                               elements=elements, density=density, workload=workload, seed=seed,
                               out=os.path.join(workdir, f"result-{i}.npy"),
                               auth_file=auth_file, pipeline_groups=pipeline_groups,
                               gradient_file=gradient_files[i] if gradient_files else None,
                               cost=job_cost.fields() if job_cost.timed else None, **place)
            spec.update(repeat=repeat, warmup=warmup)
            p = tb.run_in(h.name, [sys.executable, "-m", "homagg.runs.job", "--child", json.dumps(spec)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=env, cwd=workdir)
            procs.append(p)
        for h, p in zip(workers, procs):
            line = _readline(p, 60.0)
            if line.strip() != "ready":
                raise RunError(f"worker {h.name} did not start: {line!r} {_stderr(p)}")
        if warmup:
            for p in procs:
                p.popen.stdin.write("go\n")
                p.popen.stdin.flush()
            for h, p in zip(workers, procs):
                line = _readline(p, warmup * timeout + 60.0)
                if line.strip() != "ready":
                    raise RunError(f"worker {h.name} failed in the warmup: {line!r} {_stderr(p)}")
        for s in sws:
            if s.host in fail_aggregators:
                s.stop()
        link0 = [tb.link_stats(h.name) for h in workers]
        agg_link0 = [tb.link_stats(s.host) for s in sws]
        t0 = time.perf_counter()
        d0 = [s.cpu_seconds() for s in sws]
        for p in procs:
            p.popen.stdin.write("go\n")
            p.popen.stdin.flush()
        reports, failures = collect_reports(workers, procs, repeat * timeout + 60)
        wall = time.perf_counter() - t0
        d1 = [s.cpu_seconds() for s in sws]
        link1 = [tb.link_stats(h.name) for h in workers]
        agg_link1 = [tb.link_stats(s.host) for s in sws]
        after = [s.control({"cmd": "stats"}) if s.running else None  # None: stopped
                 for s in sws]
        if not failures and None in after:
            failures.append("every worker finished although an aggregator was stopped")
        if failures:
            raise RunError(f"allreduce {method} failed on {len(failures)} of {W} workers: "
                           + "; ".join(failures))

        results = [np.load(os.path.join(workdir, f"result-{i}.npy")) for i in range(W)]
        check = verify(method, elements, density, workload, seed, block, results, expect)
        reports.sort(key=lambda r: r["worker"])
        each = [max(r["seconds_each"][i] for r in reports) for i in range(repeat)]
        per_agg = []
        for s, b, a, l0, l1, c0, c1 in zip(sws, before, after, agg_link0, agg_link1, d0, d1):
            counters, port = counter_deltas(b, a)
            role = ("root" if s is sws[leaves] else "leaf") if leaves else "aggregator"
            summed = [x - y for x, y in zip(a.get("engine_summed", []),
                                            b.get("engine_summed", []))] if a else None
            per_agg.append({"host": s.host, "ip": s.ip, "role": role, "counters": counters,
                            "engine_summed": summed,
                            "port_counters": port,
                            "rx_ring": (a or {}).get("rx_ring"),
                            "rx_bytes": l1["rx_bytes"] - l0["rx_bytes"],
                            "tx_bytes": l1["tx_bytes"] - l0["tx_bytes"],
                            "cpu_seconds": c1 - c0 if c0 is not None and c1 is not None
                            else None})
        counters = sum_dicts([a["counters"] for a in per_agg])
        port = sum_dicts([a["port_counters"] for a in per_agg])
        cpu = [a["cpu_seconds"] for a in per_agg]
        return {
            "method": method,
            "workers": W,
            "elements": elements,
            "density": density,
            "workload": workload,
            "seed": seed,
            "block": block,
            "payload_bytes": payload,
            "pipeline_groups": pipeline_groups,
            "mtu": mtu,
            "pmd": sw.pmd,
            "auth": bool(auth),
            "link_mbit": tb.state().get("link_mbit"),
            "cost": job_cost.fields() if job_cost.timed else None,
            "seconds": float(np.median(each)),
            "seconds_each": each,
            "repeat": repeat,
            "warmup": warmup,
            "wall_seconds": wall,
            **check,
            "bytes_per_worker": [_per_call(b["tx_bytes"] - a["tx_bytes"], repeat)
                                 for a, b in zip(link0, link1)],
            "bytes_received_per_worker": [_per_call(b["rx_bytes"] - a["rx_bytes"], repeat)
                                          for a, b in zip(link0, link1)],
            "dense_float32_bytes": 4 * elements,
            "worker_cpu_seconds": [r["cpu_seconds"] for r in reports],
            # the whole machine over the timed calls (worker 0's view; other
            # processes on the host count too)
            "machine_cpu": reports[0].get("machine_cpu"),
            "daemon_cpu_seconds": None if None in cpu else sum(cpu) / repeat,
            "generator": "homagg.bench.workloads",
            "worker_stats": [r["stats"] for r in reports],
            "worker_stats_timed": [r["stats_timed"] for r in reports],
            "counters": counters,
            "port_counters": port,
            "aggregators": per_agg,
            "leaves": leaves,
            "switch_lcores": switch_lcores,
        }
    finally:
        for p in procs:
            p.stop()
        job_file.unregister([s.control for s in registered if s.running], job,
                            warn=lambda k, e: None)  # gone with a stopped daemon
        for s in sws:
            s.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _leaf_group(group: str, leaf: int) -> str:
    """Leaf l's result group: ``group`` + 256 l (one group per leaf, so a
    leaf's results reach its own workers only)."""
    import ipaddress

    return str(ipaddress.IPv4Address(group) + 256 * leaf)


def _readline(p, timeout: float) -> str:
    import select

    r, _, _ = select.select([p.popen.stdout], [], [], timeout)
    return p.popen.stdout.readline() if r else ""


def _stderr(p) -> str:
    if p.poll() is None:
        return ""
    return p.popen.stderr.read()[-600:]


# --------------------------------------------------------------------------
# CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="what", metavar="WHAT")
    sub.required = True
    p = sub.add_parser("allreduce", help="one allreduce with the DPDK aggregator on a testbed",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--testbed", metavar="NAME", help="a testbed made with `homagg testbed up`")
    where.add_argument("-i", "--inventory", metavar="TOML",
                       help="real hosts: testbed.toml (docs/INVENTORY.md), after `homagg up -i`")
    p.add_argument("--method", required=True, choices=METHODS)
    p.add_argument("--elements", type=int, required=True, metavar="N",
                   help="gradient length (float32 elements)")
    p.add_argument("--density", type=float, required=True, metavar="D",
                   help="fraction of non-zero elements per worker (0..1)")
    p.add_argument("--workload", choices=WORKLOADS, default="random",
                   help="where the non-zeros are (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="gradient seed (default: %(default)s)")
    p.add_argument("--block", type=int, default=DEFAULT_BLOCK,
                   help="quantisation block in elements (default: %(default)s)")
    p.add_argument("--slots", type=int, default=None,
                   help="aggregator slots = window (default: the most, up to 64, with "
                   "workers x slots <= 4096 frames: homagg.protocol.default_slots)")
    p.add_argument("--payload-bytes", type=int, default=1024, metavar="BYTES",
                   help="payload bytes per packet, a multiple of 4 up to 8192 (more than an MTU of 1500 "
                   "holds needs links with MTU 9000; default: %(default)s)")
    p.add_argument("--pipeline-groups", type=int, default=PIPELINE_GROUPS, metavar="N",
                   help="block groups of every method that go through the steps independently "
                   "(auto chooses per group): 0 automatic, 1 not pipelined, N groups "
                   "(default: %(default)s)")
    p.add_argument("--timeout", type=float, default=10.0,
                   help="a worker gives up after this many seconds without progress (default: %(default)s)")
    p.add_argument("--rto", type=float, default=0.005, metavar="S",
                   help="initial retransmission timeout of the workers in seconds (default: %(default)s)")
    p.add_argument("--pmd", choices=("auto", "af_xdp", "af_packet"), default="auto",
                   help="DPDK virtual PMD on the aggregator's veth (auto: af_xdp, else af_packet)")
    p.add_argument("--drop-rate", type=float, default=0.0, metavar="P",
                   help="the daemon drops this fraction of received frames (fault injection, "
                   "local testbed only; default 0)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="timed allreduces by the same workers and daemon (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=0, metavar="N",
                   help="untimed allreduces before them (default: %(default)s)")
    p.add_argument("--aggregators", type=int, default=None, metavar="K",
                   help="spread the job over the testbed's first K aggregators "
                   "(default: all of them; see `homagg testbed up --aggregators`)")
    p.add_argument("--leaves", type=int, default=None, metavar="L",
                   help="a two-level tree: the first L aggregators are leaves below the next, "
                   "the root (default: the testbed's `homagg testbed up --leaves`)")
    p.add_argument("--switch-lcores", type=int, default=1, metavar="N",
                   help="engine lcores of every homagg-switch (N > 1: a dispatcher lcore too; "
                   "default: %(default)s)")
    p.add_argument("--switch", default=None, metavar="PATH",
                   help="homagg-switch binary (default: build/release/homagg-switch or $HOMAGG_SWITCH)")
    p.add_argument("--state-dir", default=None, metavar="DIR", help="testbed state directory")
    p.add_argument("--runs-dir", default="runs", metavar="DIR",
                   help="with -i: results and logs go to DIR/<timestamp>-<method>/ (default: %(default)s)")
    p.add_argument("--auth", action="store_true",
                   help="authenticate every frame with per-worker keys from a new job secret "
                        "(docs/PROTOCOL.md \"Authentication\"; costs one keyed BLAKE2b per frame)")
    p.add_argument("--no-cost-model", dest="cost_model", action="store_false",
                   help="choose by bytes even on a testbed with a link rate (the job registers "
                   "no cost model; docs/PROTOCOL.md \"The cost model\")")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def main(args: argparse.Namespace) -> int:
    if args.inventory:
        from homagg.deploy.remote import hosts as remote

        if args.auth:
            print("homagg run allreduce: --auth runs on a local testbed (--testbed); on "
                  "--inventory hosts the job secret file is not provisioned yet", file=sys.stderr)
            return 2
        if args.leaves:
            print("homagg run allreduce: --leaves runs on a local testbed (--testbed); "
                  "--inventory hosts have no tree yet", file=sys.stderr)
            return 2
        return remote.run_main(args)
    try:
        rep = run_allreduce(args.testbed, args.method, args.elements, args.density,
                            workload=args.workload, seed=args.seed, block=args.block,
                            slots=args.slots, payload=args.payload_bytes, timeout=args.timeout,
                            rto=args.rto, pmd=args.pmd,
                            switch=args.switch, state_dir=args.state_dir,
                            drop_rate=args.drop_rate, aggregators=args.aggregators,
                            repeat=args.repeat, warmup=args.warmup,
                            auth=args.auth, leaves=args.leaves,
                            switch_lcores=args.switch_lcores,
                            pipeline_groups=args.pipeline_groups,
                            cost_model=getattr(args, "cost_model", True))
    except (HomAggError, TestbedError) as e:
        print(f"homagg run allreduce: {e}", file=sys.stderr)
        return 1
    return print_report(rep, args.json)


def _standalone(argv=None) -> int:
    """``python -m homagg.runs.allreduce allreduce ...``: the same as ``homagg run ...``."""
    parser = argparse.ArgumentParser(prog="homagg run", description=__doc__.splitlines()[0])
    log.setup()
    add_arguments(parser)
    return main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(_standalone())
