"""Run one allreduce on a placement: a local testbed (DPDK aggregator plus one
worker per namespace) or the hosts of an inventory over SSH.

    sudo homagg testbed up --workers 4 --link-mbit 1000 --name demo
    sudo homagg run allreduce --testbed demo --method lhc --elements 1000000 --density 0.01
    homagg up -i testbed.toml && homagg run allreduce -i testbed.toml --method lhc ...

The run is written once (``run_allreduce``) above homagg.deploy.placement:
the same options and the same report on both.  On inventory hosts the
daemons are the ones `homagg up -i` started (docs/INVENTORY.md), so what
needs a daemon of the run's own (--drop-rate, --switch-lcores, --pmd,
--switch) is refused there with the reason, as on a testbed whose daemons
`homagg testbed up` started; --auth runs on both (the placement puts a new
job secret on the worker hosts: homagg.deploy.placement.Placement.place_secret);
--leaves needs L + 1 aggregator hosts on either, the root with a kernel
interface on inventory hosts (its MAC is read there).  On a testbed:

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

--payload-bytes sets the job's payload per packet (by default the largest
the links' MTU carries: 1424 bytes at MTU 1500; up to
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
import logging
import os
import secrets
import sys
import time
from dataclasses import dataclass

import numpy as np

from homagg import auth as hg_auth
from homagg import log as hg_log
from homagg.deploy.local.placement import child_env  # noqa: F401 - homagg.runs.session uses it
from homagg.deploy.placement import Placement
from homagg.errors import HomAggError
from homagg.protocol import PIPELINE_GROUPS, check_pipeline_groups, resolve_slots
from homagg.runs.job import (
    DEFAULT_BLOCK,
    METHODS,
    UDP_PORT,
    WORKLOADS,
    RunError,
    check_arguments,
    counter_deltas,
    job_payload,
    print_report,
    sum_dicts,
    tree_leaf,
    verify,
    worker_spec,
)
from homagg.runs.report import ReportView
from homagg.switch import job_file
from homagg.switch.daemon import Switch  # noqa: F401 - where the docs point for the daemon

log = logging.getLogger("homagg.runs.allreduce")


# --------------------------------------------------------------------------
# The report


@dataclass
class AllreduceReport(ReportView):
    """What ``run_allreduce`` returns, the same fields wherever it ran (a
    field that does not apply to a placement is None there).

    ``seconds``: the median over the ``repeat`` timed calls of
    ``seconds_each``, where ``seconds_each[k]`` is the slowest worker's time
    of timed call k (each worker times its own call with perf_counter).
    ``wall_seconds``: from releasing the workers to the last report here
    (it includes the placement's overhead: SSH round trips on inventory
    hosts).  Bytes, CPU and counters are per timed call
    (``worker_stats_timed``: each worker's counters over the timed calls;
    ``worker_stats`` its client's totals, warmup included; the daemons'
    ``counters``, ``port_counters`` and ``aggregators`` cover all timed
    calls).  ``placement``: "testbed" or "inventory", with ``testbed`` (its
    name) or ``inventory`` (its path) set; ``run_dir``: the folder the
    results, logs and report.json stay in (None on a testbed, whose
    work directory goes with the run).  ``link_mbit``: the testbed's link
    shaping, or an inventory's ``link_mbit`` (None: unshaped, or not
    given).  ``cost``: the cost model the job registered (homagg.cost.Cost
    fields; None: none, choices by bytes).  ``pmd``: the daemons'
    DPDK driver; ``udp_gso``: the workers sent runs of frames as
    UDP_SEGMENT messages (a testbed whose switch ports cut them).  Each ``aggregators`` entry: host, ip, role, counters,
    engine_summed, port_counters, rx_ring, rx_bytes, tx_bytes (None where
    the host's NIC has no kernel interface), cpu_seconds (None where /proc
    cannot tell).

    It reads like the dict it replaces (``rep["seconds"]``, ``rep.get``);
    ``as_dict`` gives a plain dict (JSON)."""

    method: str
    workers: int
    elements: int
    density: float
    workload: str
    seed: int
    block: int
    payload_bytes: int
    pipeline_groups: int
    mtu: int
    pmd: str
    udp_gso: bool
    auth: bool
    link_mbit: float | None
    cost: dict | None
    seconds: float
    seconds_each: list
    repeat: int
    warmup: int
    wall_seconds: float
    exact: bool | None
    exact_per_worker: list
    workers_agree: bool
    max_abs_error_vs_float64_sum: float
    result_sha256: str | None
    bytes_per_worker: list
    bytes_received_per_worker: list
    dense_float32_bytes: int
    worker_cpu_seconds: list
    machine_cpu: dict | None
    daemon_cpu_seconds: float | None
    generator: str
    worker_stats: list
    worker_stats_timed: list
    counters: dict
    port_counters: dict
    aggregators: list
    leaves: int
    switch_lcores: int
    placement: str
    testbed: str | None
    inventory: str | None
    aggregator: str
    worker_hosts: list
    job: int
    worker_pids: list
    run_dir: str | None


# --------------------------------------------------------------------------
# The run


def _per_call(total, calls: int):
    """A counter moved over ``calls`` calls, per call (an int for one)."""
    if total is None:
        return None
    return total if calls == 1 else total / calls


def _delta(after: dict | None, before: dict | None, key: str):
    return None if after is None or before is None else after[key] - before[key]


def aggregator_count(
    pl: Placement, aggregators: int | None, leaves: int | None, auth: bool
) -> tuple[int, int]:
    """(leaves, the aggregator hosts the job uses) from the options, checked
    against the placement: ``aggregators`` N the first N hosts (default
    all), or ``leaves`` L (None: the placement's, its standing job's; 0: a
    flat job) a tree of L leaves and the next host the root; RunError names
    what does not fit and the fix."""
    hosts, W = pl.aggregators, len(pl.workers)
    if aggregators is not None and not 1 <= aggregators <= len(hosts):
        raise RunError(
            f"aggregators must be 1..{len(hosts)} (the {pl.kind}'s aggregator hosts), "
            f"got {aggregators}"
        )
    given_leaves = leaves
    if leaves is None:
        leaves = pl.default_leaves
    if leaves:
        fix = (
            f"make one with `homagg testbed up --leaves {leaves}`"
            if pl.kind == "testbed"
            else "add aggregator hosts to the inventory"
        )
        if aggregators is not None:
            raise RunError(
                "--aggregators and a tree (--leaves) exclude each other"
                + (
                    f": {pl.where} is a tree of {leaves} leaves unless --leaves 0 is given"
                    if given_leaves is None
                    else ""
                )
            )
        if len(hosts) < 2:
            raise RunError(
                f"--leaves {leaves}: {pl.where} has one aggregator host, a tree needs L + 1 ({fix})"
            )
        if not 1 <= leaves <= min(W, len(hosts) - 1):
            raise RunError(
                f"--leaves must be 1..{min(W, len(hosts) - 1)}: a tree of L leaves "
                f"needs L + 1 aggregator hosts and at least L workers ({pl.where} "
                f"has {len(hosts)} and {W}; {fix})"
            )
    return leaves, (leaves + 1 if leaves else (aggregators or len(hosts)))


def run_allreduce(
    testbed: "str | Placement",
    method: str,
    elements: int,
    density: float,
    workload: str = "random",
    seed: int = 1,
    block: int = DEFAULT_BLOCK,
    slots: int = None,
    payload: int | None = None,
    timeout: float = 10.0,
    rto: float = 0.005,
    pmd: str = "auto",
    switch: str | None = None,
    state_dir: str | None = None,
    group: str = "239.77.0.1",
    drop_rate: float = 0.0,
    idle_us: int | None = None,
    idle_polls: int | None = None,
    fail_aggregators: tuple = (),
    fail_workers: tuple = (),
    aggregators: int | None = None,
    repeat: int = 1,
    warmup: int = 0,
    auth: bool = False,
    leaves: int | None = None,
    switch_lcores: int = 1,
    pipeline_groups: int = PIPELINE_GROUPS,
    gradient_files: list[str] | None = None,
    expect: dict | None = None,
    cost_model: bool = True,
) -> AllreduceReport:
    """One allreduce on a placement: ``testbed`` is a local testbed's name
    (with ``state_dir``) or a homagg.deploy.placement.Placement (e.g.
    homagg.deploy.remote.placement.InventoryPlacement for inventory hosts).
    Returns the AllreduceReport.  Every process it starts is stopped before
    it returns.  An option the placement cannot do is refused (RunError
    naming each and why) before anything starts.

    ``slots`` None: homagg.protocol.resolve_slots of the world size (W x S
    fits a 4096-frame ring).  ``cost_model``: the job registers the
    placement's cost model (Placement.job_cost: a testbed's link rate, an
    inventory's ``link_mbit``, with this host's calibration; homagg.cost);
    False: none, choices by bytes.
    ``drop_rate`` makes the daemon's port drop that fraction of the frames it
    receives (fault injection; retransmissions repair it).
    ``fail_aggregators`` (host names, e.g. ("agg1",)) are stopped once the
    job is registered on them: the workers' error must name them.
    ``fail_workers`` (worker numbers) are stopped once ready, before the
    allreduce starts: the other workers' errors must name them (in a tree
    too, docs/PROTOCOL.md "Who is missing in a tree").
    ``aggregators`` N spreads the job over the placement's first N aggregator
    hosts (default: all of them; N - 1 is the re-run without a dead one).
    ``idle_us`` / ``idle_polls``: the daemon's idle backoff (None: the
    testbed's, homagg.switch.daemon.IDLE_US / IDLE_POLLS).

    With ``warmup`` / ``repeat`` the same workers and daemon run ``warmup``
    untimed allreduces, then ``repeat`` timed ones (the same gradients:
    every call gives the same result, checked once); the report's
    ``seconds`` is defined in AllreduceReport.
    ``auth``: the job authenticates every frame; its new secret goes to the
    daemons over their control sockets and to the workers in a file only its
    owner reads (Placement.place_secret).  In a tree every level has its
    own: each leaf a new secret of its own (its workers' file), the root
    the job's, of which a leaf gets only its key at the root and the root's
    aggregator key (docs/PROTOCOL.md "Tree").
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
    if isinstance(testbed, str):
        from homagg.deploy.local.placement import TestbedPlacement

        pl = TestbedPlacement(testbed, state_dir)
    else:
        pl = testbed
    payload = job_payload(payload, pl.mtu, pl.where)  # None: the largest the MTU carries
    W = len(pl.workers)
    slots = resolve_slots(slots, W)  # unset: W x S fits a 4096-frame ring
    hosts = pl.aggregators
    leaves, count = aggregator_count(pl, aggregators, leaves, auth)
    if gradient_files is not None and len(gradient_files) != W:
        raise RunError(f"gradient_files: {len(gradient_files)} files for {W} workers")
    refused = pl.refusals(
        dict(
            auth=auth,
            leaves=leaves,
            drop_rate=drop_rate,
            switch_lcores=switch_lcores,
            pmd=pmd,
            switch=switch,
            idle_us=idle_us,
            idle_polls=idle_polls,
            fail_aggregators=tuple(fail_aggregators),
            fail_workers=tuple(fail_workers),
            workers=W,
            gradient_files=gradient_files,
            aggregators=count,
        )
    )
    if refused:
        raise RunError(f"not on {pl.where}: " + "; ".join(refused))
    job_cost = pl.job_cost(cost_model)  # homagg.cost.Cost (not timed: none)
    job, token = 1 + secrets.randbelow(1 << 15), secrets.randbits(31)
    pl.open()
    sws, registered = [], []
    try:
        sws = pl.open_daemons(
            count,
            frames=W * slots,
            pmd=pmd,
            switch=switch,
            drop_rate=drop_rate,
            idle_us=idle_us,
            idle_polls=idle_polls,
            lcores=switch_lcores,
        )
        mac = hg_auth.default_mac_name() if auth else None
        # one secret per level: the flat job's (or the root's), and each leaf's
        # own, placed for that leaf's workers (docs/PROTOCOL.md "Tree")
        secret = hg_auth.new_secret() if auth else None
        leaf_secrets = [hg_auth.new_secret() for _ in range(leaves)] if auth else []
        auth_files = (
            []
            if not auth
            else [
                pl.place_secret(x, job_file.leaf_secret_name(k)) for k, x in enumerate(leaf_secrets)
            ]
            if leaves
            else [pl.place_secret(secret)]
        )
        agg_addrs = [(s.ip, UDP_PORT) for s in sws]
        if leaves:  # each worker's fields: its leaf, group, index there, secret
            tree = job_file.register_tree(
                [s.control for s in sws],
                [(h.ip, UDP_PORT, h.mac) for h in hosts[: leaves + 1]],
                leaves=leaves,
                workers=W,
                slots=slots,
                payload=payload,
                group=group,
                timeout=timeout,
                rto=rto,
                job=job,
                token=token,
                cost=job_cost,
                auth=secret,
                leaf_auth=leaf_secrets,
                auth_files=[auth_files[tree_leaf(i, W, leaves)[0]] for i in range(W)]
                if auth
                else None,
                mac=mac,
            )
        else:  # aggregator k of the job: its shard k
            job_file.register(
                [s.control for s in sws],
                agg_addrs,
                workers=W,
                slots=slots,
                payload=payload,
                group=group,
                timeout=timeout,
                job=job,
                token=token,
                auth=secret,
                mac=mac,
                cost=job_cost,
            )
        registered = sws
        del secret, leaf_secrets
        before = [s.control({"cmd": "stats"}) for s in sws]
        specs = []
        for i, name in enumerate(pl.workers):
            place = dict(
                group=group, aggregators=agg_addrs, auth_file=auth_files[0] if auth_files else None
            )
            if leaves:  # its leaf is its one aggregator
                f = tree[i]
                place = dict(
                    group=f["group"],
                    aggregators=[agg_addrs[tree_leaf(i, W, leaves)[0]]],
                    leaf_ids=tuple(f["leaf_ids"]),
                    auth_file=f["auth_file"] or None,
                )
            spec = worker_spec(
                job=job,
                token=token,
                worker=i,
                workers=W,
                agg_ip=sws[0].ip,
                ip=pl.worker_ip(i),
                timeout=timeout,
                slots=slots,
                payload=payload,
                rto=rto,
                method=method,
                block=block,
                elements=elements,
                density=density,
                workload=workload,
                seed=seed,
                out=None,
                mac=mac,
                pipeline_groups=pipeline_groups,
                gradient_file=gradient_files[i] if gradient_files else None,
                cost=job_cost.fields() if job_cost.timed else None,
                udp_gso=pl.udp_gso,
                **place,
            )
            spec.update(repeat=repeat, warmup=warmup)
            specs.append(spec)
        pids = pl.start_workers(specs)
        bad = pl.wait_ready(60.0)
        if bad:
            raise RunError("workers did not start: " + "; ".join(bad))
        if warmup:
            pl.go()
            bad = pl.wait_ready(warmup * timeout + 60.0)
            if bad:
                raise RunError("workers failed in the warmup: " + "; ".join(bad))
        for s in sws:
            if s.host in fail_aggregators:
                s.stop()
        for i in fail_workers:
            pl.stop_worker(i)
        link0 = [pl.link_stats(n) for n in pl.workers]
        agg_link0 = [pl.link_stats(s.host) for s in sws]
        t0 = time.perf_counter()
        d0 = [s.cpu_seconds() for s in sws]
        pl.go()
        reports, failures = pl.collect(repeat * timeout + 60)
        wall = time.perf_counter() - t0
        d1 = [s.cpu_seconds() for s in sws]
        link1 = [pl.link_stats(n) for n in pl.workers]
        agg_link1 = [pl.link_stats(s.host) for s in sws]
        after = [
            s.control({"cmd": "stats"}) if s.running else None  # None: stopped
            for s in sws
        ]
        if not failures and None in after:
            failures.append("every worker finished although an aggregator was stopped")
        if failures:
            raise RunError(
                f"allreduce {method} failed on {len(failures)} of {W} workers: "
                + "; ".join(failures)
            )

        results = pl.results()
        check = verify(method, elements, density, workload, seed, block, results, expect)
        reports.sort(key=lambda r: r["worker"])
        each = [max(r["seconds_each"][i] for r in reports) for i in range(repeat)]
        per_agg = []
        for s, b, a, l0, l1, c0, c1 in zip(sws, before, after, agg_link0, agg_link1, d0, d1):
            counters, port = counter_deltas(b, a)
            role = ("root" if s is sws[leaves] else "leaf") if leaves else "aggregator"
            summed = (
                [x - y for x, y in zip(a.get("engine_summed", []), b.get("engine_summed", []))]
                if a
                else None
            )
            per_agg.append(
                {
                    "host": s.host,
                    "ip": s.ip,
                    "role": role,
                    "counters": counters,
                    "engine_summed": summed,
                    "port_counters": port,
                    "rx_ring": (a or {}).get("rx_ring"),
                    "rx_bytes": _delta(l1, l0, "rx_bytes"),
                    "tx_bytes": _delta(l1, l0, "tx_bytes"),
                    "cpu_seconds": c1 - c0 if c0 is not None and c1 is not None else None,
                }
            )
        counters = sum_dicts([a["counters"] for a in per_agg])
        port = sum_dicts([a["port_counters"] for a in per_agg])
        cpu = [a["cpu_seconds"] for a in per_agg]
        rep = AllreduceReport(
            method=method,
            workers=W,
            elements=elements,
            density=density,
            workload=workload,
            seed=seed,
            block=block,
            payload_bytes=payload,
            pipeline_groups=pipeline_groups,
            mtu=pl.mtu,
            pmd=sws[0].pmd,
            udp_gso=pl.udp_gso,
            auth=bool(auth),
            link_mbit=pl.link_mbit,
            cost=job_cost.fields() if job_cost.timed else None,
            seconds=float(np.median(each)),
            seconds_each=each,
            repeat=repeat,
            warmup=warmup,
            wall_seconds=wall,
            **check,
            bytes_per_worker=[
                _per_call(_delta(b, a, "tx_bytes"), repeat) for a, b in zip(link0, link1)
            ],
            bytes_received_per_worker=[
                _per_call(_delta(b, a, "rx_bytes"), repeat) for a, b in zip(link0, link1)
            ],
            dense_float32_bytes=4 * elements,
            worker_cpu_seconds=[r["cpu_seconds"] for r in reports],
            # the whole machine over the timed calls (worker 0's view; other
            # processes on the host count too)
            machine_cpu=reports[0].get("machine_cpu"),
            daemon_cpu_seconds=None if None in cpu else sum(cpu) / repeat,
            generator="homagg.bench.workloads",
            worker_stats=[r["stats"] for r in reports],
            worker_stats_timed=[r["stats_timed"] for r in reports],
            counters=counters,
            port_counters=port,
            aggregators=per_agg,
            leaves=leaves,
            switch_lcores=switch_lcores,
            placement=pl.kind,
            testbed=pl.testbed,
            inventory=pl.inventory,
            aggregator=sws[0].host,
            worker_hosts=list(pl.workers),
            job=job,
            worker_pids=pids,
            run_dir=pl.run_dir,
        )
        if pl.run_dir:
            with open(os.path.join(pl.run_dir, "report.json"), "w") as f:
                json.dump(rep.as_dict(), f, indent=1)
        return rep
    finally:
        pl.stop_workers()
        live = [s for s in registered if s.running]  # a stopped daemon took its job along
        job_file.unregister(
            [s.control for s in live],
            job,
            warn=lambda k, e: log.warning("host '%s': %s", live[k].host, e),
        )
        pl.close()


# --------------------------------------------------------------------------
# CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="what", metavar="WHAT")
    sub.required = True
    p = sub.add_parser(
        "allreduce",
        help="one allreduce with the DPDK aggregator on a testbed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--testbed", metavar="NAME", help="a testbed made with `homagg testbed up`")
    where.add_argument(
        "-i",
        "--inventory",
        metavar="TOML",
        help="real hosts: testbed.toml (docs/INVENTORY.md), after `homagg up -i`",
    )
    p.add_argument("--method", required=True, choices=METHODS)
    p.add_argument(
        "--elements",
        type=int,
        required=True,
        metavar="N",
        help="gradient length (float32 elements)",
    )
    p.add_argument(
        "--density",
        type=float,
        required=True,
        metavar="D",
        help="fraction of non-zero elements per worker (0..1)",
    )
    p.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="random",
        help="where the non-zeros are (default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=1, help="gradient seed (default: %(default)s)")
    p.add_argument(
        "--block",
        type=int,
        default=DEFAULT_BLOCK,
        help="quantisation block in elements (default: %(default)s)",
    )
    p.add_argument(
        "--slots",
        type=int,
        default=None,
        help="aggregator slots = window (default: the most, up to 64, with "
        "workers x slots <= 4096 frames: homagg.protocol.default_slots)",
    )
    p.add_argument(
        "--payload-bytes",
        type=int,
        default=None,
        metavar="BYTES",
        help="payload bytes per packet, a multiple of 4 up to 8192 (more than an MTU of 1500 "
        "holds needs links with MTU 9000; default: the largest the links' MTU carries, "
        "1424 at MTU 1500)",
    )
    p.add_argument(
        "--pipeline-groups",
        type=int,
        default=PIPELINE_GROUPS,
        metavar="N",
        help="block groups of every method that go through the steps independently "
        "(auto chooses per group): 0 automatic, 1 not pipelined, N groups "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="a worker gives up after this many seconds without progress (default: %(default)s)",
    )
    p.add_argument(
        "--rto",
        type=float,
        default=0.005,
        metavar="S",
        help="initial retransmission timeout of the workers in seconds (default: %(default)s)",
    )
    p.add_argument(
        "--pmd",
        choices=("auto", "af_xdp", "af_packet"),
        default="auto",
        help="DPDK virtual PMD on the aggregator's veth (auto: af_xdp, else af_packet)",
    )
    p.add_argument(
        "--drop-rate",
        type=float,
        default=0.0,
        metavar="P",
        help="the daemon drops this fraction of received frames (fault injection; "
        "needs a daemon of the run's own: refused with -i, whose daemons are "
        "`homagg up`'s; default 0)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="timed allreduces by the same workers and daemon (default: %(default)s)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=0,
        metavar="N",
        help="untimed allreduces before them (default: %(default)s)",
    )
    p.add_argument(
        "--aggregators",
        type=int,
        default=None,
        metavar="K",
        help="spread the job over the testbed's first K aggregators "
        "(default: all of them; see `homagg testbed up --aggregators`)",
    )
    p.add_argument(
        "--leaves",
        type=int,
        default=None,
        metavar="L",
        help="a two-level tree: the first L aggregators are leaves below the next, "
        "the root; 0: a flat job (default: the standing job's, `homagg testbed up "
        "--leaves` or `homagg up -i --leaves`)",
    )
    p.add_argument(
        "--switch-lcores",
        type=int,
        default=1,
        metavar="N",
        help="engine lcores of every homagg-switch (N > 1: a dispatcher lcore too; "
        "default: %(default)s)",
    )
    p.add_argument(
        "--switch",
        default=None,
        metavar="PATH",
        help="homagg-switch binary (default: build/release/homagg-switch or $HOMAGG_SWITCH)",
    )
    p.add_argument("--state-dir", default=None, metavar="DIR", help="testbed state directory")
    p.add_argument(
        "--runs-dir",
        default=None,
        metavar="DIR",
        help="results, reports and logs go to DIR/<timestamp>-<method>/ (default: "
        "runs with -i; none on a testbed)",
    )
    p.add_argument(
        "--auth",
        action="store_true",
        help="authenticate every frame with per-worker keys from a new job secret "
        '(docs/PROTOCOL.md "Authentication"; costs one keyed BLAKE2b per frame)',
    )
    p.add_argument(
        "--no-cost-model",
        dest="cost_model",
        action="store_false",
        help="choose by bytes even on a testbed or an inventory with a link rate (the job registers "
        'no cost model; docs/PROTOCOL.md "The cost model")',
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def placement_for(args: argparse.Namespace) -> Placement:
    """The placement ``homagg run`` names: ``--testbed NAME`` or ``-i TOML``."""
    if args.inventory:
        if args.state_dir:
            raise RunError(
                "--state-dir names a local testbed's state (--testbed); "
                "inventory hosts keep theirs in INSTALL_DIR/run/"
            )
        from homagg.deploy.remote import inventory
        from homagg.deploy.remote.placement import InventoryPlacement

        return InventoryPlacement(
            inventory.load(args.inventory), runs_dir=args.runs_dir or "runs", label=args.method
        )
    from homagg.deploy.local.placement import TestbedPlacement

    return TestbedPlacement(args.testbed, args.state_dir, runs_dir=args.runs_dir, label=args.method)


def main(args: argparse.Namespace) -> int:
    try:
        rep = run_allreduce(
            placement_for(args),
            args.method,
            args.elements,
            args.density,
            workload=args.workload,
            seed=args.seed,
            block=args.block,
            slots=args.slots,
            payload=args.payload_bytes,
            timeout=args.timeout,
            rto=args.rto,
            pmd=args.pmd,
            switch=args.switch,
            drop_rate=args.drop_rate,
            aggregators=args.aggregators,
            repeat=args.repeat,
            warmup=args.warmup,
            auth=args.auth,
            leaves=args.leaves,
            switch_lcores=args.switch_lcores,
            pipeline_groups=args.pipeline_groups,
            cost_model=getattr(args, "cost_model", True),
        )
    except HomAggError as e:  # TestbedError (no such testbed, ...) is one too
        print(f"homagg run allreduce: {e}", file=sys.stderr)
        return 1
    return print_report(rep, args.json)


def _standalone(argv=None) -> int:
    """``python -m homagg.runs.allreduce allreduce ...``: the same as ``homagg run ...``."""
    parser = argparse.ArgumentParser(prog="homagg run", description=__doc__.splitlines()[0])
    hg_log.setup()
    add_arguments(parser)
    return main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(_standalone())
