"""The daemons and the job of a local testbed, for torchrun and `homagg train`.

``homagg testbed up`` (unless --no-daemon) calls ``start``: homagg-switch in
every aggregator namespace (homagg.runs.allreduce.Switch, started with the testbed's
``run_in``, so ``homagg testbed down`` stops them by PID), one job for all
the testbed's workers spread over them (homagg.switch.job_file.register) and its
job file in the testbed's ``files_dir``::

    sudo homagg testbed up --workers 2 --name demo
    # job file: /run/homagg/testbeds/demo.d/job.json
    sudo ip netns exec hg-demo-w0 env HOMAGG_JOB_FILE=... HOMAGG_BIND=10.77.0.10 torchrun ...

The state file records them ("daemons": per aggregator host its PID,
control socket, PMD, address and log; "job": the job id and the job
file's path; the token stays in the job file, which only root reads).
``homagg run`` and ``homagg train`` on such a testbed use these daemons;
``homagg train`` with as many ranks as the job has workers uses the job
and its file.  Successive runs of new ranks may share the job
(homagg.switch.job_file); ``renew`` (``homagg testbed job``) registers it afresh,
its counters at 0.
"""

from __future__ import annotations

import contextlib
import json
import os

from homagg.deploy.local.testbed import Testbed
from homagg.errors import HomAggError
from homagg.protocol import resolve_slots
from homagg.switch import job_file

JOB_GROUP = "239.77.0.3"  # the results' multicast group of the testbed's job
SECRET_FILE = "job.secret"  # the secret of an authenticated job, in files_dir


def link_mbit(tb: Testbed) -> int:
    """The link rate of one worker of the testbed for its cost model
    (homagg.cost): its link's shaping, or its share of the aggregator's
    link when that is narrower; 0 when the links are not shaped (no link
    rate: choices by bytes)."""
    st = tb.state()
    rates = []
    if st.get("link_mbit"):
        rates.append(float(st["link_mbit"]))
    if st.get("agg_link_mbit"):
        rates.append(float(st["agg_link_mbit"]) / max(1, len(tb.workers)))
    return max(1, int(min(rates))) if rates else 0


def job_processes(tb: Testbed) -> int:
    """The busy processes of a job on the testbed: its ranks and the
    daemon of every aggregator host, all on this host's cores."""
    return len(tb.workers) + max(1, len(tb.aggregators))


def job_cost(tb: Testbed, cost_model: bool = True):
    """The cost model a job on this testbed registers: its link rate, this
    host's calibration (homagg.cost.job_cost) with the per-frame costs and
    the round trip fitted through this testbed's port when it has been
    calibrated (`homagg calibrate --testbed NAME`, with as many workers),
    every CPU coefficient scaled by the sharing of this host's cores among
    the job's processes (homagg.cost.sharing; docs/PROTOCOL.md "The cost
    model", "Shared cores").  ``cost_model`` False (or unshaped links):
    none, choices by bytes."""
    from homagg import cost

    link = link_mbit(tb) if cost_model else 0
    if not link:
        return cost.Cost()
    cal = cost.load_calibration()
    factor = cost.sharing(job_processes(tb), cost.host_cores())
    port = cost.port_coefficients(cal, tb.name, len(tb.workers))
    if port is None:
        return cost.job_cost(link, coeffs=cost.coefficients(cal), sharing=factor)
    coeffs, rtt_ns = port
    return cost.job_cost(link, rtt_ns, coeffs=coeffs, sharing=factor)


def port_calibrated(tb: Testbed) -> bool | None:
    """Whether this host's calibration file has the testbed's calibration
    through its port, made with as many workers (None: its links are not
    shaped, so a job there has no cost model to calibrate)."""
    from homagg import cost

    if not link_mbit(tb):
        return None
    cal = cost.load_calibration()
    return cost.port_coefficients(cal, tb.name, len(tb.workers)) is not None


def start(
    tb: Testbed,
    *,
    slots: int | None = None,
    payload: int | None = None,
    timeout: float = 10.0,
    switch: str | None = None,
    cost_model: bool = True,
    auth: bool = False,
    mac: str | None = None,
) -> dict:
    """Start the daemons, register the job, write its job file; returns the
    job-file fields plus "file" and "daemons" ({host: record}).  On a
    failure the daemons started are stopped and the error re-raised.  The
    job's cost model is the testbed's link rate with this host's
    calibration (``cost_model`` False: none).  ``auth``: the job
    authenticates every frame with a new secret in ``files_dir``/job.secret
    (mode 0600, the job file's ``auth_file``; every namespace reads this
    machine's files), ``mac`` its algorithm (None: this host's default);
    ``homagg rotate-key --testbed`` gives it a new one while it runs."""
    from homagg import auth as hg_auth

    from homagg.runs import allreduce as runmod
    from homagg.runs.job import job_payload
    from homagg.switch.daemon import Switch

    # None: the largest the testbed's MTU carries
    payload = job_payload(payload, int(tb.state().get("mtu") or 1500), f"testbed {tb.name}")
    slots = resolve_slots(slots, len(tb.workers))
    os.makedirs(tb.files_dir, mode=0o700, exist_ok=True)
    sws = []
    try:
        for h in tb.aggregators:
            sws.append(
                Switch(tb, tb.files_dir, switch=switch, host=h.name, frames=len(tb.workers) * slots)
            )
        leaves = int(tb.state().get("leaves") or 0)
        if leaves:
            return _start_tree(tb, sws, leaves, slots, payload, timeout, cost_model, auth, mac)
        secret, secret_file = None, ""
        if auth:
            secret_file = os.path.join(tb.files_dir, SECRET_FILE)
            secret = hg_auth.create_secret_file(secret_file)
        fields = job_file.register(
            [s.control for s in sws],
            [(s.ip, runmod.UDP_PORT) for s in sws],
            workers=len(tb.workers),
            slots=slots,
            payload=payload,
            group=JOB_GROUP,
            timeout=timeout,
            cost=job_cost(tb, cost_model),
            auth=secret,
            mac=mac,
            auth_file=secret_file,
        )
        del secret
        if tb.udp_gso:  # the switch ports cut UDP_SEGMENT messages (Worker udp_gso)
            fields["udp_gso"] = True
        path = job_file.write_job_file(os.path.join(tb.files_dir, "job.json"), **fields)
        daemons = {s.host: s.record() for s in sws}
        tb.note(daemons=daemons, job={"job": fields["job"], "file": path})
    except BaseException:
        for s in sws:
            s.stop()
        raise
    return {**fields, "file": path, "daemons": daemons}


def _start_tree(tb, sws, leaves, slots, payload, timeout, cost_model, auth, mac) -> dict:
    """``start`` on a testbed of L leaves and a root (``homagg testbed up
    --leaves L``): the tree registered over its daemons (job_file.register_tree),
    one job file per worker (its leaf, the leaf's group, its place there:
    ``job_files``).  ``auth``: each leaf's secret in ``files_dir``/leaf-L.secret
    (mode 0600; the worker's job file names its leaf's), the root's secret
    a new one that stays in this process: the leaves hold only their keys
    at the root, and renewing or rotating the tree gives the root a new
    one (docs/PROTOCOL.md "Key epochs in a tree")."""
    from homagg import auth as hg_auth

    from homagg.runs import allreduce as runmod

    W = len(tb.workers)
    root = hg_auth.new_secret() if auth else None
    leaf_files = [os.path.join(tb.files_dir, job_file.leaf_secret_name(k)) for k in range(leaves)]
    leaf_auth = [hg_auth.create_secret_file(p) for p in leaf_files] if auth else None
    per_worker = job_file.register_tree(
        [s.control for s in sws],
        [(h.ip, runmod.UDP_PORT, h.mac) for h in tb.aggregators],
        leaves=leaves,
        workers=W,
        slots=slots,
        payload=payload,
        group=JOB_GROUP,
        timeout=timeout,
        cost=job_cost(tb, cost_model),
        auth=root,
        leaf_auth=leaf_auth,
        auth_files=[leaf_files[job_file.tree_leaf(i, W, leaves)[0]] for i in range(W)]
        if auth
        else None,
        mac=mac,
    )
    del root, leaf_auth
    files = []
    for h, fields in zip(tb.workers, per_worker):
        if tb.udp_gso:
            fields["udp_gso"] = True
        files.append(
            job_file.write_job_file(os.path.join(tb.files_dir, f"job-{h.name}.json"), **fields)
        )
    daemons = {s.host: s.record() for s in sws}
    tb.note(
        daemons=daemons,
        job={"job": per_worker[0]["job"], "file": files[0], "files": files, "leaves": leaves},
    )
    return {**per_worker[0], "file": files[0], "files": files, "daemons": daemons}


def job_files(tb: Testbed) -> list[str]:
    """The job file of each worker of the testbed's job, in worker order
    (a flat job: the one file every worker reads; a tree: one each)."""
    rec = tb.state().get("job")
    if not rec:
        return []
    return list(rec.get("files") or [rec["file"]] * len(tb.workers))


def tree_leaves(tb: Testbed) -> int:
    """The leaves of the testbed's standing job (0: a flat job, or none)."""
    return int((tb.state().get("job") or {}).get("leaves") or 0)


def job(tb: Testbed) -> dict | None:
    """The testbed's job: its job-file fields plus "file", or None."""
    rec = tb.state().get("job")
    if not rec:
        return None
    with open(rec["file"]) as f:
        return {**json.load(f), "file": rec["file"]}


def controls(tb: Testbed, workdir: str | None = None) -> list:
    """The control callables of the testbed's daemons, in shard order."""
    from homagg.switch.daemon import Switch

    return [Switch(tb, workdir or tb.files_dir, host=h.name).control for h in tb.aggregators]


def refresh_cost(tb: Testbed) -> str | None:
    """Give the testbed's standing job (`homagg testbed up`'s) the cost
    model a job created now registers (job_cost: after `homagg calibrate
    --testbed`, the port's calibration), in its job file, which the ranks
    read when they start; the daemons keep no cost.  A job registered
    without a cost model keeps none.  Returns the job file's path, or None
    when there is no job or it has no model."""
    from homagg import cost

    current = job(tb)
    if current is None or not cost.as_cost(current.get("cost")).timed:
        return None
    new = job_cost(tb).to_dict()
    for path in dict.fromkeys(job_files(tb)):  # a tree: every worker's file alike
        with open(path) as f:
            fields = json.load(f)
        fields["cost"] = new
        tmp = f"{path}.tmp{os.getpid()}"
        job_file.write_job_file(tmp, **fields)
        os.replace(tmp, path)  # a rank starting now reads the old file or the new one
    return current["file"]


def renew(tb: Testbed) -> dict:
    """Register the testbed's job afresh (same id, token and job file) for
    the next run of its ranks; returns it as ``job`` does."""
    current = job(tb)
    if current is None:
        raise HomAggError(
            f"testbed {tb.name} has no job: it was built with --no-daemon "
            "(`homagg testbed down` and `up` again without it)"
        )
    fields = {k: v for k, v in current.items() if k != "file"}
    leaves = tree_leaves(tb)
    if leaves:
        return {**_renew_tree(tb, fields, leaves), "file": current["file"]}
    return {**job_file.renew(controls(tb), fields), "file": current["file"]}


def _renew_tree(tb: Testbed, fields: dict, leaves: int) -> dict:
    """``renew`` of a tree job (job_file.renew_tree): each leaf takes its
    workers' secret (the file their job files name) at their key epoch, the
    root a new secret at epoch 0."""
    from homagg.runs import allreduce as runmod

    per, leaf_auth = standing_tree(tb)
    job_file.renew_tree(
        controls(tb), [(h.ip, runmod.UDP_PORT, h.mac) for h in tb.aggregators], per, leaf_auth
    )
    del leaf_auth
    return fields


def standing_tree(tb: Testbed) -> tuple[list[dict], list[bytes] | None]:
    """The standing tree's job-file fields of each worker, in worker order,
    and each leaf's secret (read from the file its first worker's job file
    names; None when the tree does not authenticate)."""
    from homagg import auth as hg_auth

    per = []
    for path in job_files(tb):
        with open(path) as f:
            per.append(json.load(f))
    if not per[0].get("mac"):
        return per, None
    return per, [hg_auth.load_secret(per[w]["auth_file"]) for w in job_file.tree_leaf_firsts(per)]


def describe(tb: Testbed) -> list[str]:
    """Lines for ``homagg testbed up`` / ``show``: the daemons and the job."""
    st = tb.state()
    out = []
    for host, d in st.get("daemons", {}).items():
        out.append(
            f"homagg-switch on {host}: pid {d['pid']}, {d['pmd']}, {d['ip']}, log {d['log']}"
        )
    rec = st.get("job")
    if rec:
        with contextlib.suppress(OSError, ValueError):
            j = job(tb)
            tree = bool(rec.get("files"))
            where = (
                f"leaves {', '.join(h.ip for h in tb.aggregators[:-1])}, "
                f"root {tb.aggregators[-1].ip}"
                if tree
                else f"aggregators {j['aggregator']}"
            )
            secret = (
                "each leaf's secret in its workers' auth_file"
                if tree
                else f"secret file {j['auth_file']}"
            )
            out.append(
                f"job {j['job']}: {j['workers']} workers, {where}, "
                f"{j['slots']} slots, {j['payload']}-byte payloads"
                + (
                    f", authenticated ({j['mac']}, key epoch {j.get('key_epoch', 0)}; "
                    f"{secret}, mode 0600)"
                    if j.get("mac")
                    else ""
                )
            )
        again = (
            f"`homagg testbed job --name {tb.name}` registers the job afresh, "
            "counters at 0; not needed between runs"
        )
        if rec.get("files"):
            out.append(
                f"a tree of {rec['leaves']} leaves below the root {tb.aggregators[-1].name}: "
                f"one job file per worker, its leaf and the leaf's group (HOMAGG_JOB_FILE "
                f"of that worker's rank for torchrun; {again}):"
            )
            out.extend(f"  {h.name}: {path}" for h, path in zip(tb.workers, rec["files"]))
        else:
            out.append(f"job file: {rec['file']}  (HOMAGG_JOB_FILE for torchrun; {again})")
    return out
