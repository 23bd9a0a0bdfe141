"""Train a model with DDP on a testbed, gradients through HomAgg, next to Gloo DDP.

    sudo homagg testbed up --workers 4 --link-mbit 1000 --name demo
    sudo homagg train --model ncf --testbed demo --method auto --steps 10

uses the homagg-switch daemons of the testbed (`homagg testbed up` starts
them; on a --no-daemon testbed it starts its own, as ``homagg run`` does),
registers the job afresh (the testbed's job when it has as many workers
and aggregators, else one of its own), writes its job files
(homagg.torch's HOMAGG_JOB_FILE) and starts one rank per worker namespace
(``python -m homagg.train.train --child SPEC``): torch.distributed with the Gloo
backend for rendezvous, the model in DistributedDataParallel.  Every rank
trains from the same initial parameters and the same data: first plain
Gloo DDP (the baseline, skipped with --no-baseline), then DDP with
``homagg.torch.allreduce_hook`` and --method (``gloo``: the baseline only),
timed, then once more with the hook and a recorder, untimed (below).
Optimiser: SGD, the model's learning rate (--lr).

Per phase it reports, from the timed steps (the first --warmup steps are
not timed; every rank starts each step after a barrier): the iteration time
(median over steps of the slowest rank), the backward pass time (which
contains the communication DDP waits for), the compute time (forward +
backward of two more batches under DDP's no_sync, no communication, the
same CPU contention; not applied), the bytes each rank's interface
sent per step (the kernel's counter), the loss of every step (mean over
ranks) and its wall time, and the speedup: Gloo's iteration time / HomAgg's.
HomAgg's phase also reports every bucket's size, gradient density, the
method that ran (auto's choice), its payload bytes, seconds and the hook
thread's CPU seconds (codec and packet work), and the path that reduced
it (homagg; baseline: the process group's allreduce, chosen by the cost
model as faster, with both predictions; fallback: the process group after
a HomAgg failure; see homagg.torch).  Per
iteration: exposed_comm_seconds (the backward pass minus the same backward
alone, no_sync: what DDP waited for communication; both phases),
exposed_after_last_bucket_seconds (from the hand-over of the last bucket
to the end of backward) and hook_cpu_seconds (the hook thread's CPU of
the iteration's buckets).  torch_threads: each rank runs
homagg.torch.threads_per_rank(ranks sharing the host) intra-op threads,
leaving a core per rank to the hook's thread.

HomAgg's phase is timed without a recorder (a recorder copies every
bucket, on the process group's path before DDP has the result); a second,
untimed HomAgg phase records the replay's inputs, taking every bucket the
way the timed phase took it (homagg.torch's HookState ``paths``), and must
end with the timed phase's parameters bit for bit on every rank
(replay.timed_phase_mismatch names the first rank and parameter that
differ; the run is then not bit-identical).

Every phase and the replay start from the same parameters: the first
phase snapshots the module's state right after DDP's broadcast (what DDP
actually trains from) and the later phases load it, so nothing depends on
the factory seeding its layers (initial_params_same_in_phases).

Lossless, checked on every run with an exact method: after the last step
every rank's parameters are compared bit for bit
(params_identical_across_ranks), and a single-process replay starts from
rank 0's snapshot and applies, at every step, the fixed-point
reference sum (homagg.reference, numpy) of the per-rank bucket gradients
the ranks recorded, divided by the world size, with the same optimiser:
its parameters must equal the ranks' bit for bit (replay_bit_identical);
otherwise replay.first_mismatch names the first step and parameter whose
values differ from rank 0's (hashes recorded after every step).
A bucket the process group reduced (path baseline or fallback) has no
fixed-point reference: the replay applies the group's result as the ranks
recorded it, after checking that every rank recorded the same bits and
that they are within float32 rounding of the average of the recorded
gradients (replay.baseline_buckets, replay.fallback_buckets).
With nc (lossy) both are reported, and the loss curve's largest relative
distance from the Gloo run's (loss_band_vs_gloo).

--model: ncf, lstm, bert, vgg (homagg.train.models, generated data) or your own,
``path/to/file.py:factory`` with factory(rank, world_size, seed) ->
(model, batches, loss_fn): batches an iterable of (inputs, targets).

The run is written once (``run_train``) above homagg.deploy.placement and
returns one TrainReport, the same fields on both placements:
-i testbed.toml runs the ranks on the inventory's worker hosts instead
(one per host, over SSH), against the daemons ``homagg up -i`` started
(homagg.deploy.remote.placement); the ranks' reports, parameters and logs
come back into RUNS_DIR/<timestamp>-train-<method>/.  --aggregators K and
--leaves L (a two-level tree) work on both; an option a placement cannot
do (--switch on inventory hosts) is refused before anything starts, with
the reason.  --auth with --leaves gives every leaf a secret of its own
(its workers' job files name it) and the root the job's.  A user's model
file must exist at the same path on every worker host.

--link-mbit 100,1000,10000 instead of --testbed builds one testbed per
link rate and trains every --model (comma-separated) on each: the speedup
per rate and model and a plot of it (homagg.train.sweep).

--out DIR writes train.json, loss_vs_step.png and loss_vs_time.png.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import pathlib
import secrets
import sys
import time
from dataclasses import dataclass

import numpy as np

from homagg import auth as hg_auth
from homagg.deploy.placement import Placement
from homagg.errors import HomAggError, TrainError
from homagg.protocol import EXACT_METHODS, METHODS as HOMAGG_METHODS, resolve_slots
from homagg.runs.report import ReportView
from homagg.switch import job_file

# the protocol's methods (homagg.protocol, read from C) and the Gloo baseline
METHODS = tuple(HOMAGG_METHODS) + ("gloo",)
BUILTIN_MODELS = ("ncf", "lstm", "bert", "vgg")
GLOO_PORT = 29611
DEFAULT_LR = 0.05  # a user's model without --lr


_log = logging.getLogger("homagg.train")


def progress(msg):
    """A progress line on stderr (-q silences it)."""
    _log.info("[train] %s", msg)


# --------------------------------------------------------------------------
# Models


def load_factory(model: str):
    """(factory, default learning rate) of a built-in model name or of
    ``path/to/file.py:factory``."""
    from homagg.train import models

    if model in models.MODELS:
        return models.MODELS[model]
    path, sep, name = model.rpartition(":")
    if not sep or not path.endswith(".py"):
        raise TrainError(
            f"--model {model!r}: not one of {sorted(models.MODELS)} nor path/to/file.py:factory"
        )
    if not os.path.exists(path):
        raise TrainError(f"--model {model!r}: no file {path}")
    spec = importlib.util.spec_from_file_location("homagg_user_model", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    factory = getattr(mod, name, None)
    if not callable(factory):
        raise TrainError(f"--model {model!r}: {path} has no callable {name!r}")
    return factory, DEFAULT_LR


def _call(model, inputs):
    return model(*inputs) if isinstance(inputs, (tuple, list)) else model(inputs)


# --------------------------------------------------------------------------
# One rank (child process)


def _iface_tx(ifname: str) -> int:
    try:
        with open(f"/sys/class/net/{ifname}/statistics/tx_bytes") as f:
            return int(f.read())
    except OSError:
        return 0


def _digest(tensor) -> str:
    """Hash of a tensor's bytes (its values bit for bit)."""
    a = tensor.detach().contiguous().numpy()
    return hashlib.blake2b(a.view(np.uint8).reshape(-1), digest_size=16).hexdigest()


def _phase(spec, dist, torch, method, record_dir, snapshot, *, paths=None, timed_dir=None):
    """Train spec["warmup"] + spec["steps"] steps with ``method`` ("gloo":
    plain DDP); returns the per-rank report; with ``record_dir`` the bucket
    inputs of every step, rank 0's initial parameters, every step's
    parameter hashes and the final parameters are saved there.

    HomAgg's timed phase runs without a recorder (``record_dir`` None,
    its final parameters saved as ``timed_dir``/timed-RANK.npz): a
    recorder copies every bucket and, on the process group's path, before
    DDP has the result, work a user's job does not do.  Its report's
    "paths" (per hand-over, the path that reduced the bucket) are then
    given to the recorded phase as ``paths`` (homagg.torch's HookState
    ``paths``): it takes every bucket the same way, so its parameters must
    equal the timed phase's bit for bit (the replay checks the recorded
    phase against the reference, summarize the two phases against each
    other).

    ``snapshot`` (a dict, shared by the phases of one rank): empty in the
    first phase, which fills it with the module's state right after DDP's
    broadcast (the parameters DDP actually trains from); later phases load
    it, so every phase and the replay start from the same parameters even
    when the factory does not seed its layers."""
    import homagg.torch as hgt
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = spec["rank"], spec["world"]
    factory, _ = load_factory(spec["model"])
    model, batches, loss_fn = factory(rank, world, spec["seed"])
    batches = iter(batches)
    ddp = DDP(model, bucket_cap_mb=spec["bucket_mb"])
    if not snapshot:
        snapshot.update({k: v.detach().clone() for k, v in ddp.module.state_dict().items()})
        if record_dir or timed_dir:
            np.savez(
                os.path.join(record_dir or timed_dir, f"init-{rank}.npz"),
                **{n: p.detach().numpy() for n, p in ddp.module.named_parameters()},
            )
    else:
        with torch.no_grad():
            ddp.module.load_state_dict(snapshot)
    initial = hashlib.blake2b(digest_size=16)
    for n, p in ddp.module.named_parameters():
        initial.update(n.encode() + _digest(p).encode())
    opt = torch.optim.SGD(ddp.parameters(), lr=spec["lr"])
    names = {id(p): n for n, p in ddp.module.named_parameters()}
    state = None
    record = {"step": 0, "buckets": [], "digests": []}
    if method != "gloo":

        def recorder(index, x, y, params, path="homagg"):
            # the process group's result too where it reduced the bucket
            # (baseline or fallback): the replay applies it, there is no
            # fixed-point reference of Gloo's float sum
            record["buckets"].append(
                {
                    "step": record["step"],
                    "bucket": index,
                    "params": [names[id(p)] for p in params],
                    "x": x,
                    "path": path,
                    "y": y.copy() if path != "homagg" else None,
                }
            )

        state = hgt.HookState(
            method=method,
            sparsify=_sparsifier(spec.get("sparsify")),
            recorder=recorder if record_dir else None,
            baseline=not spec.get("homagg_only", False),
            measure=not spec.get("predicted_only", False) and paths is None,
            trial_calls=3 if spec.get("trials") else 0,
            paths=paths,
        )
        ddp.register_comm_hook(state, hgt.allreduce_hook)
    steps, warmup = spec["steps"], spec["warmup"]
    losses, step_s, bwd_s, buckets = [], [], [], []
    exposed_s, hook_cpu_s, timeline = [], [], []
    taken = {}  # hand-over number -> path (every step's, the warmup's too)
    tx0 = tx1 = 0
    try:
        for step in range(warmup + steps):
            inputs, targets = next(batches)
            record["step"] = step
            dist.barrier()
            if step == warmup:
                tx0 = _iface_tx(spec["ifname"])
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = loss_fn(_call(ddp, inputs), targets)
            t1 = time.perf_counter()
            loss.backward()  # DDP waits for every bucket's future here
            t2 = time.perf_counter()
            opt.step()
            t3 = time.perf_counter()
            losses.append(float(loss.detach()))
            if record_dir and method != "gloo":  # the replay names the first step that differs
                record["digests"].append({n: _digest(p) for n, p in ddp.module.named_parameters()})
            if step >= warmup:
                step_s.append(t3 - t0)
                bwd_s.append(t2 - t1)
            if state is not None:
                log = state.take_log()
                taken.update((e["seq"], e["path"]) for e in log)
                if step >= warmup:
                    buckets.extend(log)
                    timeline.extend([step, e["bucket"], e["handed_over"], e["done"]] for e in log)
                    # what DDP waited for after the last bucket was handed over
                    last = state.last_call
                    exposed_s.append(t2 - last if last is not None and last >= t1 else None)
                    hook_cpu_s.append(sum(e.get("cpu_seconds") or 0.0 for e in log))
        tx1 = _iface_tx(spec["ifname"])
        final = {n: p.detach().numpy().copy() for n, p in ddp.module.named_parameters()}
        # the same forward + backward without communication (DDP's no_sync),
        # under the same CPU contention: the iteration's compute part
        compute_s, compute_bwd_s = [], []
        for _ in range(spec.get("compute_steps", 2) if paths is None else 0):
            inputs, targets = next(batches)
            dist.barrier()
            t0 = time.perf_counter()
            with ddp.no_sync():
                opt.zero_grad()
                loss = loss_fn(_call(ddp, inputs), targets)
                t1 = time.perf_counter()
                loss.backward()
            t2 = time.perf_counter()
            compute_s.append(t2 - t0)
            compute_bwd_s.append(t2 - t1)
        opt.zero_grad()
    finally:
        if state is not None:
            state.close()
    out = {
        "rank": rank,
        "method": method,
        "losses": losses,
        "step_seconds": step_s,
        "backward_seconds": bwd_s,
        "compute_seconds": compute_s,
        "compute_backward_seconds": compute_bwd_s,
        "exposed_after_last_bucket_seconds": exposed_s,
        "hook_cpu_seconds": hook_cpu_s,
        "torch_threads": torch.get_num_threads(),
        "tx_bytes_per_step": (tx1 - tx0) / max(1, steps),
        "buckets": _bucket_summary(buckets),
        "initial_digest": initial.hexdigest(),
        "bucket_timeline": timeline,
        "paths": [taken.get(i) for i in range(max(taken, default=-1) + 1)],
        "hook_counters": dict(state.counters) if state is not None else None,
        "last_failure": state.last_failure if state is not None else None,
    }
    if timed_dir:
        np.savez(os.path.join(timed_dir, f"timed-{rank}.npz"), **final)
    if record_dir:
        np.savez(os.path.join(record_dir, f"params-{method}-{rank}.npz"), **final)
        if method != "gloo":
            arrays = {f"s{b['step']}_b{b['bucket']}": b["x"] for b in record["buckets"]}
            arrays.update(
                {
                    f"s{b['step']}_b{b['bucket']}_y": b["y"]
                    for b in record["buckets"]
                    if b["y"] is not None
                }
            )
            np.savez(os.path.join(record_dir, f"grads-{rank}.npz"), **arrays)
            layout = [
                {k: b[k] for k in ("step", "bucket", "params", "path")} for b in record["buckets"]
            ]
            with open(os.path.join(record_dir, f"layout-{rank}.json"), "w") as f:
                json.dump(layout, f)
            with open(os.path.join(record_dir, f"digests-{rank}.json"), "w") as f:
                json.dump(record["digests"], f)
    return out


def _bucket_summary(log):
    """Per bucket index: numel, mean density, methods run, payload bytes."""
    by = {}
    for e in log:
        b = by.setdefault(
            e["bucket"],
            {
                "bucket": e["bucket"],
                "numel": e["numel"],
                "density": [],
                "methods": {},
                "bytes_sent": [],
                "seconds": [],
                "cpu_seconds": [],
                "paths": {},
            },
        )
        if e["nnz"] is not None:  # None: summed in place by the group, not counted
            b["density"].append(e["nnz"] / max(1, e["numel"]))
        b["methods"][e["method"]] = b["methods"].get(e["method"], 0) + 1
        b["bytes_sent"].append(e["bytes_sent"])
        b["seconds"].append(e["seconds"])
        b["cpu_seconds"].append(e.get("cpu_seconds") or 0.0)
        b.setdefault("agree_seconds", []).append(e.get("agree_seconds") or 0.0)
        path = e.get("path", "homagg")
        b["paths"][path] = b["paths"].get(path, 0) + 1
        for k in _TIMES:
            if e.get(k) is not None:
                b.setdefault(k, []).append(e[k])
        if e.get("trial_step_seconds"):  # a trial's verdict (homagg.torch)
            b.setdefault("trial_verdicts", []).append(dict(e["trial_step_seconds"]))
    out = []
    for b in sorted(by.values(), key=lambda b: b["bucket"]):
        out.append(
            {
                "bucket": b["bucket"],
                "numel": b["numel"],
                "density": float(np.mean(b["density"])) if b["density"] else None,
                "methods": b["methods"],
                "bytes_sent": float(np.mean([v or 0 for v in b["bytes_sent"]])),
                "seconds": float(np.median(b["seconds"])),
                "cpu_seconds": float(np.median(b["cpu_seconds"])),
                "paths": b["paths"],
                "agree_seconds": float(np.median(b["agree_seconds"])),
                **{k: float(np.median(b[k])) if b.get(k) else None for k in _TIMES},
                # per verdict: the median step after HomAgg's calls and
                # after the group's, and the path held
                "trial_verdicts": b.get("trial_verdicts", []),
            }
        )
    return out


# the times that chose a bucket's path (homagg.torch log entries): the
# model's predictions and the measured times agreed over the ranks
_TIMES = (
    "predicted_homagg_seconds",
    "predicted_baseline_seconds",
    "measured_homagg_seconds",
    "measured_baseline_seconds",
)


def _arrivals(phases: list[dict]) -> dict:
    """Per bucket index, from the ranks' bucket_timeline (hand-over and
    result times on one host's clock), the medians over the timed steps of
    arrival_spread_seconds (the last rank's hand-over minus the first's:
    time the first rank's allreduce cannot progress, waiting for the
    others) and seconds_after_last_arrival (the slowest rank's result minus
    the last hand-over: the allreduce itself)."""
    tls = [{(s, b): (h, d) for s, b, h, d in ph.get("bucket_timeline", [])} for ph in phases]
    if not tls:
        return {}
    per = {}
    for key in sorted(set.intersection(*[set(t) for t in tls])):
        hs = [t[key][0] for t in tls]
        ds = [t[key][1] for t in tls]
        e = per.setdefault(key[1], ([], []))
        e[0].append(max(hs) - min(hs))
        e[1].append(max(ds) - max(hs))
    return {
        b: {
            "arrival_spread_seconds": float(np.median(sp)),
            "seconds_after_last_arrival": float(np.median(af)),
        }
        for b, (sp, af) in per.items()
    }


def _sparsifier(text):
    """ "topk:F" or "threshold:V" (the CLI's --sparsify) -> homagg.torch object."""
    if not text:
        return None
    import homagg.torch as hgt

    kind, _, value = text.partition(":")
    try:
        v = float(value)
    except ValueError:
        raise TrainError(f"--sparsify {text!r}: expected topk:FRACTION or threshold:VALUE")
    if kind == "topk":
        return hgt.TopK(v)
    if kind == "threshold":
        return hgt.Threshold(v)
    raise TrainError(f"--sparsify {text!r}: expected topk:FRACTION or threshold:VALUE")


def _child(spec: dict) -> int:
    import torch
    import torch.distributed as dist

    import homagg.torch as hgt

    # the ranks on this host share its cores; one core per rank stays free
    # for the hook's thread (torch's default, every core per rank, competes)
    torch.set_num_threads(hgt.threads_per_rank(spec.get("local_ranks", 1)))
    dist.init_process_group(
        "gloo",
        init_method=spec["init"],
        rank=spec["rank"],
        world_size=spec["world"],
        timeout=datetime.timedelta(seconds=spec["start_timeout"]),
    )
    try:
        reports, snapshot, wd = [], {}, spec["workdir"]
        rounds, last = spec.get("rounds", 1), {}
        for rnd in range(rounds):
            # the phases alternate their order from round to round, so a
            # drift of the host's speed falls on both alike
            for method in spec["phases"][:: 1 if rnd % 2 == 0 else -1]:
                if method == "gloo":
                    rep = _phase(spec, dist, torch, method, wd, snapshot)
                else:  # timed without a recorder
                    rep = _phase(spec, dist, torch, method, None, snapshot, timed_dir=wd)
                    last[method] = rep
                rep["round"] = rnd
                reports.append(rep)
        for method, timed in last.items():
            # recorded once, taking the last timed phase's paths
            recorded = _phase(spec, dist, torch, method, wd, snapshot, paths=timed["paths"])
            recorded["method"] = "recorded"
            recorded["round"] = rounds - 1
            reports.append(recorded)
        line = json.dumps({"rank": spec["rank"], "phases": reports})
        if spec.get("report"):  # remote hosts: a file the caller polls for
            tmp = spec["report"] + ".tmp"
            with open(tmp, "w") as f:
                f.write(line + "\n")
            os.replace(tmp, spec["report"])
        print(line, flush=True)
    finally:
        dist.destroy_process_group()
    return 0


# --------------------------------------------------------------------------
# The checks: ranks agree, and the replay


def params_identical(workdir: str, method: str, world: int) -> bool:
    ps = [np.load(os.path.join(workdir, f"params-{method}-{r}.npz")) for r in range(world)]
    for name in ps[0].files:
        a = ps[0][name].view(np.uint32)
        if not all(np.array_equal(a, p[name].view(np.uint32)) for p in ps[1:]):
            return False
    return True


def replay(workdir: str, model: str, world: int, seed: int, lr: float, block: int) -> dict:
    """One process, no network: the parameters DDP trained from (rank 0's
    snapshot after DDP's broadcast), then at every step the fixed-point
    reference sum of the ranks' recorded bucket gradients / W and the same
    SGD step.  Returns {"bit_identical", "max_abs_diff", "steps", "buckets",
    "first_mismatch"} against rank 0's final parameters; first_mismatch
    ({"step", "parameter"} or None) is the first step, and the first
    parameter in the model's order, whose values differ from rank 0's."""
    import torch

    from homagg import reference as ref

    torch.set_num_threads(1)
    factory, _ = load_factory(model)
    net, _, _ = factory(0, world, seed)
    params = dict(net.named_parameters())
    init = np.load(os.path.join(workdir, "init-0.npz"))
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(torch.from_numpy(init[name]))
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    with open(os.path.join(workdir, "digests-0.json")) as f:
        digests = json.load(f)
    first_mismatch = None
    layouts = []
    for r in range(world):
        with open(os.path.join(workdir, f"layout-{r}.json")) as f:
            layouts.append(json.load(f))
    if any(lay != layouts[0] for lay in layouts[1:]):
        raise TrainError("replay: the ranks recorded different bucket layouts")
    grads = [np.load(os.path.join(workdir, f"grads-{r}.npz")) for r in range(world)]
    W = np.float32(world)
    steps = sorted({e["step"] for e in layouts[0]})
    for step in steps:
        opt.zero_grad()
        for e in (e for e in layouts[0] if e["step"] == step):
            key = f"s{step}_b{e['bucket']}"
            if e.get("path", "homagg") == "homagg":
                y = ref.allreduce([g[key] for g in grads], block)
                y = y / W
            else:
                y = _group_result(grads, key, W)
            off = 0
            for name in e["params"]:
                p = params[name]
                n = p.numel()
                p.grad = torch.from_numpy(y[off : off + n].copy()).reshape(p.shape)
                off += n
            if off != y.size:
                raise TrainError(
                    f"replay: bucket {e['bucket']} holds {y.size} elements, its parameters {off}"
                )
        opt.step()
        if first_mismatch is None and step < len(digests):
            for name, p in params.items():
                if _digest(p) != digests[step].get(name):
                    first_mismatch = {"step": step, "parameter": name}
                    break
    final = np.load(os.path.join(workdir, f"params-{_homagg_phase(workdir)}-0.npz"))
    same, diff = True, 0.0
    for name, p in params.items():
        a = p.detach().numpy()
        b = final[name]
        same &= bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))
        diff = max(diff, float(np.max(np.abs(a.astype(np.float64) - b))))
    paths = [e.get("path", "homagg") for e in layouts[0]]
    if not same and first_mismatch is None:
        first_mismatch = {
            "step": steps[-1] if steps else None,
            "parameter": next(
                n for n, p in params.items() if not np.array_equal(p.detach().numpy(), final[n])
            ),
        }
    return {
        "bit_identical": same,
        "max_abs_diff": diff,
        "steps": len(steps),
        "buckets": len(layouts[0]),
        "first_mismatch": first_mismatch,
        "baseline_buckets": paths.count("baseline"),
        "fallback_buckets": paths.count("fallback"),
    }


def _group_result(grads, key, world):
    """The average the process group computed for bucket ``key`` (path
    baseline or fallback), as the ranks recorded it: the same bits on every
    rank, and within float32 rounding of the exact average of the recorded
    inputs; else TrainError."""
    ys = [g[key + "_y"] for g in grads]
    if any(not np.array_equal(y.view(np.uint32), ys[0].view(np.uint32)) for y in ys[1:]):
        raise TrainError(
            f"replay: the ranks recorded different results of {key} (reduced by the process group)"
        )
    xs = np.stack([g[key] for g in grads]).astype(np.float64)
    exact = xs.sum(axis=0) / world
    # a float32 sum of W terms, then a division: at most (W + 1) roundings
    bound = (world + 1) * np.finfo(np.float32).eps * (np.abs(xs).sum(axis=0) / world) + 1e-45
    if np.any(np.abs(ys[0].astype(np.float64) - exact) > bound):
        raise TrainError(
            f"replay: the process group's result of {key} is not the average "
            "of the recorded gradients"
        )
    return ys[0]


def timed_mismatch(workdir: str, method: str, world: int) -> dict | None:
    """The first rank and parameter whose final values differ between
    HomAgg's timed phase (timed-RANK.npz, no recorder) and its recorded
    phase (params-METHOD-RANK.npz, the same paths), or None: they are
    bit-identical on every rank, so what the replay checked is what was
    timed."""
    for r in range(world):
        a = np.load(os.path.join(workdir, f"timed-{r}.npz"))
        b = np.load(os.path.join(workdir, f"params-{method}-{r}.npz"))
        for name in b.files:
            if name not in a.files or not np.array_equal(
                a[name].view(np.uint32), b[name].view(np.uint32)
            ):
                return {"rank": r, "parameter": name}
    return None


def _max_diff(workdir: str, a: str, b: str) -> float:
    """Largest |difference| between rank 0's final parameters of two phases."""
    pa = np.load(os.path.join(workdir, f"params-{a}-0.npz"))
    pb = np.load(os.path.join(workdir, f"params-{b}-0.npz"))
    return max(float(np.max(np.abs(pa[n].astype(np.float64) - pb[n]))) for n in pa.files)


def _homagg_phase(workdir):
    names = [p.name for p in pathlib.Path(workdir).glob("params-*-0.npz")]
    phases = [n[len("params-") : -len("-0.npz")] for n in names]
    phases = [m for m in phases if m != "gloo"]
    if len(phases) != 1:
        raise TrainError(f"replay: expected one HomAgg phase in {workdir}, found {phases}")
    return phases[0]


# --------------------------------------------------------------------------
# The report


def _merge_rounds(reports: list[dict]) -> list[dict]:
    """One report per rank from the reports of its rounds (``round``): the
    timed steps and the runs without communication of every round, in
    order; the losses, buckets, paths and timeline of the last round; the
    bytes per step averaged."""
    by_rank: dict[int, list[dict]] = {}
    for r in reports:
        by_rank.setdefault(r["rank"], []).append(r)
    out = []
    for _, rs in sorted(by_rank.items()):
        rs = sorted(rs, key=lambda r: r.get("round", 0))
        m = dict(rs[-1])
        for k in _PER_STEP:
            m[k] = [v for r in rs for v in r.get(k) or []]
        m["tx_bytes_per_step"] = float(np.mean([r["tx_bytes_per_step"] for r in rs]))
        out.append(m)
    return out


# what a rank's report holds per timed step (or per run without communication)
_PER_STEP = (
    "step_seconds",
    "backward_seconds",
    "compute_seconds",
    "compute_backward_seconds",
    "exposed_after_last_bucket_seconds",
    "hook_cpu_seconds",
)


def _round_speedups(gloo: list[dict], mine: list[dict]) -> list[float]:
    """Per round, Gloo's iteration time over HomAgg's (each the median over
    the round's steps of the slowest rank's step)."""
    out = []
    for k in sorted({r.get("round", 0) for r in mine}):
        g = _phase_summary([r for r in gloo if r.get("round", 0) == k])["iteration_seconds"]
        h = _phase_summary([r for r in mine if r.get("round", 0) == k])["iteration_seconds"]
        if g and h:
            out.append(g / h)
    return out


def _phase_summary(reports: list[dict]) -> dict:
    """Slowest rank per step, median over steps; losses averaged over ranks."""
    step = np.max([r["step_seconds"] for r in reports], axis=0)
    bwd = np.max([r["backward_seconds"] for r in reports], axis=0)
    losses = np.mean([r["losses"] for r in reports], axis=0)
    comp = np.max([r.get("compute_seconds", []) for r in reports], axis=0)
    # exposed communication: the backward pass minus the same backward
    # without communication (no_sync), per step the slowest rank
    exposed = np.max(
        [
            np.array(r["backward_seconds"]) - np.median(r.get("compute_backward_seconds") or [0.0])
            for r in reports
        ],
        axis=0,
    )
    after_last = [
        max((v for v in col if v is not None), default=None)
        for col in zip(*[r.get("exposed_after_last_bucket_seconds", []) for r in reports])
    ]
    after_last = [v for v in after_last if v is not None]
    hook_cpu = [max(col) for col in zip(*[r.get("hook_cpu_seconds", []) for r in reports])]
    return {
        "exposed_comm_seconds": float(np.median(exposed)) if exposed.size else None,
        "exposed_after_last_bucket_seconds": float(np.median(after_last)) if after_last else None,
        "hook_cpu_seconds": float(np.median(hook_cpu)) if hook_cpu else None,
        "torch_threads": reports[0].get("torch_threads"),
        "iteration_seconds": float(np.median(step)) if step.size else None,
        "compute_seconds": float(np.median(comp)) if comp.size else None,
        "backward_comm_seconds": float(np.median(bwd)) if bwd.size else None,
        "step_seconds": step.tolist(),
        "bytes_per_rank": [r["tx_bytes_per_step"] for r in reports],
        "losses": losses.tolist(),
        "losses_per_rank": [r["losses"] for r in reports],
    }


def summarize(method: str, rank_reports: list[dict], workdir: str, args_like: dict) -> dict:
    W = len(rank_reports)
    by_method = {}
    for rr in rank_reports:
        for ph in rr["phases"]:
            by_method.setdefault(ph["method"], []).append(ph)
    rep = {
        "method": method,
        "model": args_like["model"],
        "ranks": W,
        "steps": args_like["steps"],
        "warmup": args_like["warmup"],
        "lr": args_like["lr"],
        "seed": args_like["seed"],
        "bucket_mb": args_like["bucket_mb"],
        "sparsify": args_like.get("sparsify"),
    }
    # every phase of every rank started from the same parameters (hash)
    rep["initial_params_same_in_phases"] = (
        len({ph.get("initial_digest") for rr in rank_reports for ph in rr["phases"]}) == 1
    )
    rep["rounds"] = 1 + max(ph.get("round", 0) for rr in rank_reports for ph in rr["phases"])
    gloo = _phase_summary(_merge_rounds(by_method["gloo"])) if "gloo" in by_method else None
    if gloo:
        rep.update(
            {
                "gloo_iteration_seconds": gloo["iteration_seconds"],
                "gloo_exposed_comm_seconds": gloo["exposed_comm_seconds"],
                "gloo_compute_seconds": gloo["compute_seconds"],
                "gloo_backward_comm_seconds": gloo["backward_comm_seconds"],
                "gloo_bytes_per_rank": gloo["bytes_per_rank"],
                "gloo_losses": gloo["losses"],
                "gloo_step_seconds": gloo["step_seconds"],
            }
        )
    if method == "gloo":
        rep.update(
            {
                "iteration_seconds": gloo["iteration_seconds"],
                "compute_seconds": gloo["compute_seconds"],
                "backward_comm_seconds": gloo["backward_comm_seconds"],
                "exposed_comm_seconds": gloo["exposed_comm_seconds"],
                "torch_threads": gloo["torch_threads"],
                "bytes_per_rank": gloo["bytes_per_rank"],
                "losses": gloo["losses"],
                "step_seconds": gloo["step_seconds"],
                "speedup_vs_gloo": 1.0,
                "speedup_rounds": None,
                "params_identical_across_ranks": params_identical(workdir, "gloo", W),
                "replay_bit_identical": None,
                "buckets": [],
            }
        )
        return rep
    merged = _merge_rounds(by_method[method])
    mine = _phase_summary(merged)
    rep.update(
        {
            k: mine[k]
            for k in (
                "iteration_seconds",
                "compute_seconds",
                "backward_comm_seconds",
                "exposed_comm_seconds",
                "exposed_after_last_bucket_seconds",
                "hook_cpu_seconds",
                "torch_threads",
                "bytes_per_rank",
                "losses",
                "step_seconds",
                "losses_per_rank",
            )
        }
    )
    rep["buckets"] = merged[0]["buckets"]  # the last round's
    if args_like.get("one_host"):
        # the ranks share this host's CLOCK_MONOTONIC: when each handed a bucket over
        arrivals = _arrivals(merged)
        for b in rep["buckets"]:
            b.update(arrivals.get(b["bucket"], {}))
    # per round Gloo's time over HomAgg's, phases of the same round next to
    # each other; the speedup is their median (one round: the ratio)
    per = _round_speedups(by_method["gloo"], by_method[method]) if gloo else []
    rep["speedup_rounds"] = per or None
    rep["speedup_vs_gloo"] = float(np.median(per)) if per else None
    rep["params_identical_across_ranks"] = params_identical(workdir, method, W)
    from homagg._native import lib

    rp = replay(
        workdir, args_like["model"], W, args_like["seed"], args_like["lr"], lib.HG_DEFAULT_BLOCK
    )
    # the timed phase took the recorded phase's paths: the same bits, or
    # the replay's verdict does not cover what was timed
    rp["timed_phase_mismatch"] = timed_mismatch(workdir, method, W)
    identical = rp["bit_identical"] and rp["timed_phase_mismatch"] is None
    rep["replay_bit_identical"] = identical if method in EXACT_METHODS else None
    rep["fallback_buckets"] = rp.get("fallback_buckets", 0)
    rep["baseline_buckets"] = rp.get("baseline_buckets", 0)
    rep["replay"] = rp
    if gloo:
        a, b = np.array(mine["losses"]), np.array(gloo["losses"])
        rep["loss_band_vs_gloo"] = float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12)))
        rep["max_param_diff_vs_gloo"] = _max_diff(workdir, method, "gloo")
    return rep


def plot(rep: dict, out_dir: str) -> list[str]:
    from homagg.bench.report import pyplot

    plt = pyplot()
    made = []
    series = [(rep["method"], rep["losses"], rep.get("step_seconds"))]
    if rep["method"] != "gloo" and rep.get("gloo_losses"):
        series.append(("gloo", rep["gloo_losses"], rep.get("gloo_step_seconds")))
    warm = rep["warmup"]
    for kind in ("step", "time"):
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, losses, secs in series:
            if kind == "step":
                ax.plot(range(len(losses)), losses, marker=".", label=name)
            else:  # timed steps only: cumulative wall time of the slowest rank
                # (the losses are the last round's, so are its steps)
                t = np.cumsum(secs[-rep["steps"] :])
                ax.plot(t, losses[warm : warm + len(t)], marker=".", label=name)
        ax.set_xlabel("step" if kind == "step" else "wall time of the timed steps (s)")
        ax.set_ylabel("training loss (mean over ranks)")
        ax.set_title(f"{rep['model']}, {rep['ranks']} ranks")
        ax.legend()
        path = os.path.join(out_dir, f"loss_vs_{kind}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        made.append(path)
    return made


# --------------------------------------------------------------------------
# Local testbed


def rank_spec(
    *,
    rank,
    world,
    init,
    model,
    seed,
    lr,
    steps,
    warmup,
    bucket_mb,
    phases,
    workdir,
    ifname,
    sparsify,
    start_timeout,
    local_ranks=1,
    homagg_only=False,
    predicted_only=False,
    trials=False,
    rounds=1,
) -> dict:
    """One rank's job; ``local_ranks``: the ranks sharing its host's cores;
    ``homagg_only``: no bucket through the process group by the cost
    model's choice (homagg.torch's ``baseline=False``); ``predicted_only``:
    the model's predictions alone choose (homagg.torch's ``measure=False``);
    ``rounds``: the phases run that many times, alternating (_child)."""
    return dict(
        rank=rank,
        world=world,
        init=init,
        model=model,
        seed=seed,
        lr=lr,
        steps=steps,
        warmup=warmup,
        bucket_mb=bucket_mb,
        phases=phases,
        workdir=workdir,
        ifname=ifname,
        sparsify=sparsify,
        start_timeout=start_timeout,
        local_ranks=local_ranks,
        homagg_only=homagg_only,
        predicted_only=predicted_only,
        trials=trials,
        rounds=rounds,
    )


def _phases(method: str, baseline: bool) -> list[str]:
    if method == "gloo":
        return ["gloo"]
    return (["gloo"] if baseline else []) + [method]


def check_arguments(method, model, steps, warmup, ranks=None):
    if method not in METHODS:
        raise TrainError(f"--method {method!r} not in {METHODS}")
    if steps < 1 or warmup < 0:
        raise TrainError("--steps must be >= 1 and --warmup >= 0")
    if model not in BUILTIN_MODELS:  # a built-in name needs no torch to check
        load_factory(model)


@dataclass
class TrainReport(ReportView):
    """What ``run_train`` returns, the same fields on every placement (a
    field that does not apply is None).

    Per phase, from the timed steps (module doc): ``iteration_seconds`` the
    median over steps of the slowest rank's step (``step_seconds`` per
    step), ``backward_comm_seconds`` the same of the backward pass,
    ``compute_seconds`` forward + backward without communication,
    ``exposed_comm_seconds`` what DDP waited for communication,
    ``bytes_per_rank`` each rank's interface bytes per step, ``losses``
    per step (mean over ranks); the ``gloo_*`` fields are the Gloo
    baseline's (None with ``baseline`` off), ``speedup_vs_gloo`` Gloo's
    iteration time / HomAgg's; with ``rounds`` R > 1 the phases ran R
    times, alternating, the step fields pool every round's steps and
    ``speedup_vs_gloo`` is the median of ``speedup_rounds``, each round's
    ratio.  ``buckets``: per bucket of the HomAgg
    phase its size, density, methods, bytes and seconds.  The checks:
    ``params_identical_across_ranks``, ``replay_bit_identical`` (None: the
    method is lossy, the baseline alone, or buckets went through the
    fallback, ``fallback_buckets``) and ``replay``.

    Where it ran: ``placement`` "testbed" or "inventory" with ``testbed``
    (its name) or ``inventory`` (its path); ``link_mbit`` the testbed's
    shaping or the inventory's ``link_mbit``; ``aggregators`` the job's
    aggregators' data-plane IPs in shard order (a tree: the leaves, then
    the root), ``aggregator_hosts`` their host names, ``leaves`` the tree's
    leaves (0: none); ``job`` / ``job_file`` the job and the first rank's
    job file (None with method gloo); ``worker_hosts`` the ranks' hosts,
    ``rank_pids`` their processes; ``run_dir`` the folder the ranks'
    reports, parameters, logs and train.json stay in (None on a testbed
    without ``runs_dir``); ``cost`` the job's cost model and ``cost_hint``,
    when the placement knows the model misses its own costs, what to run
    to measure them (a testbed not calibrated through its port), else
    None."""

    method: str
    model: str
    ranks: int
    steps: int
    warmup: int
    lr: float
    seed: int
    bucket_mb: float
    sparsify: str | None
    initial_params_same_in_phases: bool
    iteration_seconds: float | None
    compute_seconds: float | None
    backward_comm_seconds: float | None
    exposed_comm_seconds: float | None
    torch_threads: int | None
    bytes_per_rank: list
    losses: list
    step_seconds: list
    speedup_vs_gloo: float | None
    params_identical_across_ranks: bool
    replay_bit_identical: bool | None
    buckets: list
    placement: str
    testbed: str | None
    inventory: str | None
    link_mbit: float | None
    pmd: str | None
    aggregators: list
    aggregator_hosts: list
    leaves: int
    job: int | None
    job_file: str | None
    auth: bool
    mac: str | None
    slots: int
    payload_bytes: int
    cost: dict | None
    worker_hosts: list
    rank_pids: list
    run_dir: str | None
    exposed_after_last_bucket_seconds: float | None = None
    hook_cpu_seconds: float | None = None
    losses_per_rank: list | None = None
    fallback_buckets: int = 0
    baseline_buckets: int = 0
    homagg_only: bool = False
    predicted_only: bool = False
    trials: bool = False
    replay: dict | None = None
    gloo_iteration_seconds: float | None = None
    gloo_exposed_comm_seconds: float | None = None
    gloo_compute_seconds: float | None = None
    gloo_backward_comm_seconds: float | None = None
    gloo_bytes_per_rank: list | None = None
    gloo_losses: list | None = None
    gloo_step_seconds: list | None = None
    loss_band_vs_gloo: float | None = None
    max_param_diff_vs_gloo: float | None = None
    plots: list | None = None
    rounds: int = 1
    speedup_rounds: list | None = None
    cost_hint: str | None = None


def _files(phases: list[str]) -> list[str]:
    """What rank r leaves in its folder besides its report (rank r's names)."""
    out = [f"params-{ph}-{{rank}}.npz" for ph in phases]
    if any(ph != "gloo" for ph in phases):
        out += ["grads-{rank}.npz", "layout-{rank}.json", "digests-{rank}.json"]
        out += ["timed-{rank}.npz"]
    return out + ["init-{rank}.npz"]


def _fits(
    fields: dict,
    W: int,
    count: int,
    leaves: int,
    auth: bool,
    slots: int | None,
    payload: int | None,
    timeout: float,
    standing_leaves: int = 0,
) -> bool:
    """Whether the standing job of job-file ``fields`` (a worker's) is the
    run's: as many workers, the same aggregators (a flat job over ``count``,
    or a tree of as many leaves: ``standing_leaves``, those its workers' job
    files name, `homagg testbed up --leaves`'s or `homagg up -i --leaves`'s),
    authenticated if asked, and the slots and payload (when given) and
    timeout asked for."""
    return (
        fields["workers"] == W
        and leaves == standing_leaves
        and bool(fields.get("leaf_ids")) == bool(standing_leaves)
        and len(fields["aggregator"].split(",")) == (1 if leaves else count)
        # authenticated: a worker's file names its secret, an aggregator
        # host's (`up -i`'s, read for the job) only the MAC
        and (not auth or bool(fields.get("auth_file") or fields.get("mac")))
        and (slots is None or fields["slots"] == slots)
        and (payload is None or fields["payload"] == payload)
        and float(fields["timeout"]) == float(timeout)
    )


def placement(
    testbed: str | None = None,
    inventory: str | None = None,
    state_dir: str | None = None,
    runs_dir: str | None = None,
    label: str = "train",
):
    """The placement of ``homagg train``: local testbed ``testbed`` or the
    hosts of inventory file ``inventory`` (results and logs under
    ``runs_dir``, "runs" by default there)."""
    if inventory:
        if state_dir:
            raise TrainError(
                "--state-dir names a local testbed's state (--testbed); "
                "inventory hosts keep theirs in INSTALL_DIR/run/"
            )
        from homagg.deploy.remote import inventory as inv
        from homagg.deploy.remote.placement import InventoryPlacement

        return InventoryPlacement(inv.load(inventory), runs_dir=runs_dir or "runs", label=label)
    from homagg.deploy.local.placement import TestbedPlacement

    return TestbedPlacement(testbed, state_dir, runs_dir=runs_dir, label=label)


def run_train(
    testbed: "str | Placement",
    model: str = "ncf",
    method: str = "auto",
    steps: int = 5,
    warmup: int = 1,
    ranks: int | None = None,
    lr: float | None = None,
    seed: int = 1,
    bucket_mb: float = 4.0,
    baseline: bool = True,
    sparsify: str | None = None,
    timeout: float = 10.0,
    state_dir: str | None = None,
    switch: str | None = None,
    slots: int | None = None,
    payload: int | None = None,
    group: str = "239.77.0.2",
    out_dir: str | None = None,
    auth: bool = False,
    cost_model: bool = True,
    aggregators: int | None = None,
    leaves: int | None = None,
    start_timeout: float = 120.0,
    homagg_only: bool = False,
    predicted_only: bool = False,
    trials: bool = False,
    rounds: int = 1,
    warn_uncalibrated: bool = True,
) -> TrainReport:
    """Train on a placement: ``testbed`` is a local testbed's name (with
    ``state_dir``) or a homagg.deploy.placement.Placement (e.g.
    homagg.deploy.remote.placement.InventoryPlacement for inventory hosts).
    Returns the TrainReport (module doc).  Every process started is
    stopped before it returns.  An option the placement cannot do is
    refused (TrainError naming each and why) before anything starts.

    The job: the placement's standing one (`homagg testbed up`'s or
    `homagg up -i`'s) registered afresh when it fits (as many workers, the
    same aggregators, no tree, authenticated if ``auth``, the ``slots``
    when given, ``payload`` and ``timeout``), else one of the run's own,
    its job file written into every rank's folder.
    ``aggregators`` N spreads the job over the first N aggregator hosts
    (default: all); ``leaves`` L (default: the placement's) makes a
    two-level tree of the first L hosts below the next, the root
    (docs/PROTOCOL.md "Tree"; every rank's job file names its leaf).
    ``cost_model``: a job registered here carries the placement's link rate
    and this host's calibration (homagg.cost; False: none, choices by
    bytes); a standing job keeps what it was registered with.  ``auth``:
    the job authenticates every frame (a new secret in a file only its
    owner reads, Placement.place_secret).  ``homagg_only``: every bucket
    through HomAgg (no choice of the process group's allreduce by the cost
    model, homagg.torch); ``predicted_only``: the model's predictions alone
    choose each bucket's path (no measured times, homagg.torch's
    ``measure=False``); ``trials``: trials of whole steps
    (homagg.torch's ``trial_calls=3``).  ``rounds`` R: the Gloo and HomAgg phases run R
    times, in alternating order, each from the same parameters; the
    speedup is the median of the rounds' ratios (``speedup_rounds``)."""
    from homagg.runs.allreduce import aggregator_count
    from homagg.runs.job import UDP_PORT, job_payload

    check_arguments(method, model, steps, warmup)
    if rounds < 1:
        raise TrainError(f"--rounds {rounds}: at least 1")
    lr = load_factory(model)[1] if lr is None else lr
    if ".py:" in model:  # a file: the ranks run in another folder
        path, _, name = model.rpartition(":")
        model = f"{os.path.abspath(path)}:{name}"
    if isinstance(testbed, str):
        pl = placement(testbed=testbed, state_dir=state_dir)
    else:
        pl = testbed
    # None: the standing job's payload, or the largest the MTU carries
    payload_given, payload = payload, job_payload(payload, pl.mtu, pl.where)
    if ranks is not None:
        if not 1 <= ranks <= len(pl.workers):
            raise TrainError(f"--ranks {ranks}: {pl.where} has {len(pl.workers)} workers")
        pl.select_workers(ranks)
    W = len(pl.workers)
    slots_given, slots = slots, resolve_slots(slots, W)
    if method == "gloo":
        given = [
            n
            for n, v in (("--auth", auth), ("--leaves", leaves), ("--aggregators", aggregators))
            if v
        ]
        if given:
            raise TrainError(f"--method gloo trains without an aggregator: drop {', '.join(given)}")
        leaves, count = 0, 0
    else:
        leaves, count = aggregator_count(pl, aggregators, leaves, auth)
    refused = pl.refusals(dict(auth=auth, leaves=leaves, switch=switch, aggregators=count))
    if refused:
        raise TrainError(f"not on {pl.where}: " + "; ".join(refused))
    progress("loading torch")
    import homagg.torch  # noqa: F401  (torch must import here: fail early)

    job_cost = pl.job_cost(cost_model)
    hint = pl.cost_hint(cost_model) if method != "gloo" and not homagg_only else None
    if hint and warn_uncalibrated:  # a warning: shown under -q too
        _log.warning("[train] %s", hint)
    phases = _phases(method, baseline)
    pl.open()
    sws, job, standing, files, pids = [], None, None, [], []
    try:
        if method != "gloo":
            sws = pl.open_daemons(
                count,
                frames=W * slots,
                pmd="auto",
                switch=switch,
                drop_rate=0.0,
                idle_us=None,
                idle_polls=None,
                lcores=1,
            )
            controls = [s.control for s in sws]
            standing = pl.standing_job()
            # a standing tree: every worker's fields and each leaf's secret
            tree = pl.standing_tree() if standing and standing[0].get("leaf_ids") else None
            if standing and not _fits(
                standing[0],
                W,
                count,
                leaves,
                auth,
                slots_given,
                payload_given,
                timeout,
                standing_leaves=job_file.tree_leaves_of(tree[0]) if tree else 0,
            ):
                standing = tree = None

            def renew_standing():
                if tree:  # each leaf its workers' secret, the root a new one
                    tree_addrs = [(a.ip, UDP_PORT, a.mac) for a in pl.aggregators[:count]]
                    return job_file.renew_tree(controls, tree_addrs, tree[0], tree[1])
                return job_file.renew(controls, standing[0], secret=standing[2])

            if standing:  # the standing job afresh, and its job files
                job = renew_standing()
                files = standing[1]
            else:
                if leaves:
                    # the root's secret stays here; each leaf's goes to every
                    # worker's folder, and a rank's job file names its leaf's
                    root = hg_auth.new_secret() if auth else None
                    leaf_secrets = [hg_auth.new_secret() for _ in range(leaves)] if auth else None
                    for k, x in enumerate(leaf_secrets or ()):
                        pl.place_secret(x, job_file.leaf_secret_name(k))
                    per_rank = job_file.register_tree(
                        controls,
                        [(a.ip, UDP_PORT, a.mac) for a in pl.aggregators[:count]],
                        leaves=leaves,
                        workers=W,
                        slots=slots,
                        payload=payload,
                        group=group,
                        timeout=timeout,
                        cost=job_cost,
                        auth=root,
                        leaf_auth=leaf_secrets,
                        auth_files=[
                            f"{pl.worker_dir(r)}/"
                            + job_file.leaf_secret_name(job_file.tree_leaf(r, W, leaves)[0])
                            for r in range(W)
                        ]
                        if auth
                        else None,
                    )
                    del root, leaf_secrets
                else:
                    # a new secret in every worker's folder (Placement.place_secret)
                    secret = hg_auth.new_secret() if auth else None
                    if auth:
                        pl.place_secret(secret)
                    job0 = job_file.register(
                        controls,
                        [(s.ip, UDP_PORT) for s in sws],
                        workers=W,
                        slots=slots,
                        payload=payload,
                        group=group,
                        timeout=timeout,
                        auth=secret,
                        auth_file="job.secret" if auth else "",
                        cost=job_cost,
                    )
                    del secret
                    per_rank = [
                        dict(job0, auth_file=f"{pl.worker_dir(r)}/job.secret" if auth else "")
                        for r in range(W)
                    ]
                if pl.udp_gso:  # the network cuts UDP_SEGMENT messages (Worker udp_gso)
                    per_rank = [dict(f, udp_gso=True) for f in per_rank]
                job = per_rank[0]
                files = [pl.put_job_file(r, f"job-{r}.json", per_rank[r]) for r in range(W)]
            progress(
                f"job {job['job']} on {', '.join(s.host for s in sws)} "
                f"({'the standing' if standing else 'own'} job"
                f"{f', a tree of {leaves} leaves' if leaves else ''}, pmd {sws[0].pmd})"
            )
        progress(
            f"starting {W} ranks of {model} ({' then '.join(phases)}"
            f"{f', {rounds} rounds alternating' if rounds > 1 else ''}: {warmup} warmup + "
            f"{steps} timed steps each); the ranks load torch and build the model first"
        )
        init = f"tcp://{pl.worker_ip(0)}:{GLOO_PORT + secrets.randbelow(2000)}"
        specs, envs = [], []
        for r in range(W):
            iface = pl.worker_iface(r)
            specs.append(
                rank_spec(
                    rank=r,
                    world=W,
                    init=init,
                    model=model,
                    seed=seed,
                    lr=lr,
                    steps=steps,
                    warmup=warmup,
                    bucket_mb=bucket_mb,
                    phases=phases,
                    workdir=pl.worker_dir(r),
                    ifname=iface,
                    sparsify=sparsify,
                    start_timeout=start_timeout,
                    local_ranks=pl.ranks_per_host(),
                    homagg_only=homagg_only,
                    predicted_only=predicted_only,
                    trials=trials,
                    rounds=rounds,
                )
            )
            env = {"OMP_NUM_THREADS": "1", "HOMAGG_BIND": pl.worker_ip(r)}
            if iface:
                env["GLOO_SOCKET_IFNAME"] = iface
            if files:
                env["HOMAGG_JOB_FILE"] = files[r]
            envs.append(env)
        pids = pl.start_workers(specs, module="homagg.train.train", env=envs)
        budget = 60.0 + start_timeout + (rounds + 1) * (steps + warmup) * (timeout + 30.0)
        reports, failures = pl.collect(budget)
        if failures:
            raise TrainError(
                f"training {model} with {method} failed on {len(failures)} of "
                f"{W} ranks: " + "; ".join(failures)
            )
        reports.sort(key=lambda r: r["rank"])
        folder = None
        for r in range(W):
            folder = pl.fetch(r, [n.format(rank=r) for n in _files(phases)])
        progress(
            f"{W} ranks done; checking the parameters"
            + (" and replaying the reference" if method in EXACT_METHODS else "")
        )
        summary = summarize(
            method,
            reports,
            folder,
            dict(
                model=model,
                steps=steps,
                warmup=warmup,
                lr=lr,
                seed=seed,
                bucket_mb=bucket_mb,
                sparsify=sparsify,
                # the ranks of a local testbed share this host's clock: arrival times
                one_host=pl.kind == "testbed",
            ),
        )
        rep = TrainReport(
            **summary,
            placement=pl.kind,
            testbed=pl.testbed,
            inventory=pl.inventory,
            link_mbit=pl.link_mbit,
            pmd=sws[0].pmd if sws else None,
            aggregators=[s.ip for s in sws],
            aggregator_hosts=[s.host for s in sws],
            leaves=leaves,
            job=job["job"] if job else None,
            job_file=files[0] if files else None,
            auth=bool(job and (job.get("auth_file") or job.get("mac"))),
            mac=(job.get("mac") or None) if job else None,
            slots=job["slots"] if job else slots,
            payload_bytes=job["payload"] if job else payload,
            cost=(job.get("cost") or None) if job else None,
            worker_hosts=list(pl.workers),
            rank_pids=pids,
            run_dir=pl.run_dir,
            homagg_only=homagg_only,
            predicted_only=predicted_only,
            trials=trials,
            cost_hint=hint,
        )
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
            rep.plots = plot(rep, out_dir)
        for d in (out_dir, pl.run_dir):
            if d:
                with open(os.path.join(d, "train.json"), "w") as f:
                    json.dump(rep.as_dict(), f, indent=1)
        return rep
    finally:
        pl.stop_workers()
        if job is not None:
            controls = [s.control for s in sws]
            if standing:
                try:  # fresh for the next run of ranks
                    renew_standing()
                except (HomAggError, OSError) as e:
                    _log.warning("the standing job %s not renewed: %s", job["job"], e)
            else:
                job_file.unregister(
                    controls,
                    job["job"],
                    warn=lambda k, e: _log.warning("host '%s': %s", sws[k].host, e),
                )
        pl.close()


# --------------------------------------------------------------------------
# CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--testbed", metavar="NAME", help="a testbed made with `homagg testbed up`")
    where.add_argument(
        "-i",
        "--inventory",
        metavar="TOML",
        help="real hosts: testbed.toml (docs/INVENTORY.md), after `homagg up -i`",
    )
    where.add_argument(
        "--link-mbit",
        metavar="RATES",
        default=None,
        help="a link-rate sweep, e.g. 100,1000,10000: one local testbed per rate "
        "(--workers, --testbed-name; root), every --model on each, the speedup "
        "per rate and model and, with --out, train_linkrate.png "
        "(homagg.train.sweep)",
    )
    p.add_argument(
        "--model",
        default="ncf",
        metavar="NAME|FILE.py:FACTORY",
        help=f"{', '.join(BUILTIN_MODELS)} or path/to/file.py:factory (default ncf); "
        "with --link-mbit a comma-separated list",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=4,
        help="with --link-mbit: worker namespaces (ranks) of each testbed (default 4)",
    )
    p.add_argument(
        "--mtu",
        type=int,
        default=1500,
        help="with --link-mbit: the MTU of every link of the testbeds it builds, "
        "576..9000 (9000: jumbo frames, payloads up to 8192 bytes; default 1500)",
    )
    p.add_argument(
        "--testbed-name",
        default="trainsweep",
        help="with --link-mbit: the name of the testbeds it builds and removes "
        "(default trainsweep)",
    )
    p.add_argument(
        "--method",
        default="auto",
        choices=METHODS,
        help="HomAgg method of the hook, or gloo: plain Gloo DDP only (default auto)",
    )
    p.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the Gloo and HomAgg phases R times, in alternating order, and "
        "report the median of the rounds' speedups with each round's (default 1; "
        "on a shared host one phase's compute can differ from the next by 15 %%)",
    )
    p.add_argument(
        "--ranks",
        type=int,
        default=None,
        help="use the first N worker hosts (default: every worker)",
    )
    p.add_argument(
        "--lr",
        type=float,
        default=None,
        help=f"SGD learning rate (default: the model's; {DEFAULT_LR} for a file)",
    )
    p.add_argument("--seed", type=int, default=1, help="model and data seed (default 1)")
    p.add_argument(
        "--bucket-mb",
        type=float,
        default=4.0,
        help="DDP bucket_cap_mb: gradient bucket size (default 4)",
    )
    p.add_argument(
        "--sparsify",
        default=None,
        metavar="topk:F|threshold:V",
        help="sparsify every bucket with error feedback (default off)",
    )
    p.add_argument(
        "--no-baseline", action="store_true", help="skip the Gloo DDP phase (no speedup reported)"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="an allreduce gives up after this many seconds without progress",
    )
    p.add_argument(
        "--slots",
        type=int,
        default=None,
        help="aggregator slots of the job = packets in flight per rank (default: "
        "the most, up to 64, with ranks x slots <= 4096: "
        "homagg.protocol.default_slots)",
    )
    p.add_argument(
        "--payload-bytes",
        type=int,
        default=None,
        metavar="BYTES",
        help="payload per packet, up to 8192 on links with MTU 9000 (default: the standing "
        "job's, else the largest the links' MTU carries, 1424 at MTU 1500)",
    )
    p.add_argument("--switch", default=None, metavar="PATH", help="homagg-switch binary")
    p.add_argument("--state-dir", default=None, metavar="DIR", help="testbed state directory")
    p.add_argument(
        "--runs-dir",
        default=None,
        metavar="DIR",
        help="the ranks' reports, parameters and logs stay in "
        "DIR/<timestamp>-train-<method>/ (default: runs with -i; none on a testbed)",
    )
    p.add_argument(
        "--out", default=None, metavar="DIR", help="write train.json and the loss plots into DIR"
    )
    p.add_argument(
        "--no-cost-model",
        dest="cost_model",
        action="store_false",
        help="a job registered for this run chooses by bytes even with a known link "
        'rate (docs/PROTOCOL.md "The cost model"; a testbed\'s own job keeps its '
        "`homagg testbed up` setting)",
    )
    p.add_argument(
        "--no-calibrate",
        dest="calibrate",
        action="store_false",
        help="with --link-mbit: skip calibrating each testbed through its port before "
        "its models (about half a minute per rate; by default the choice between "
        "HomAgg and the process group then predicts with that testbed's measured "
        "per-frame costs and ring, not this host's calibration file or the "
        "built-in figures)",
    )
    p.add_argument(
        "--homagg-only",
        action="store_true",
        help="every bucket through HomAgg: the cost model never sends one through "
        "the process group's allreduce (docs/TRAINING.md \"Never slower than the "
        'baseline")',
    )
    p.add_argument(
        "--trials",
        action="store_true",
        help="trials of whole steps: a bucket whose HomAgg and group times are "
        "within 2x of each other takes the other path than the rule's for 3 steps "
        "every 128, and the path whose steps were shorter is held until the next "
        "trial (docs/TRAINING.md, \"Whole steps, where a bucket's time is not its "
        "cost\"; off by default: measured, it did not beat the host's noise)",
    )
    p.add_argument(
        "--predicted-only",
        action="store_true",
        help="choose each bucket's path (HomAgg or the process group's allreduce) "
        "by the cost model's predictions alone; by default a path's measured "
        "time, agreed over the ranks, replaces its prediction (docs/TRAINING.md)",
    )
    p.add_argument(
        "--auth",
        action="store_true",
        help="authenticate every frame (a new job secret, given to the ranks in "
        "a 0600 file named by the job file; refused where the placement cannot "
        "place the secret, with the reason)",
    )
    p.add_argument(
        "--aggregators",
        type=int,
        default=None,
        metavar="K",
        help="spread the job over the first K aggregator hosts (default: all)",
    )
    p.add_argument(
        "--leaves",
        type=int,
        default=None,
        metavar="L",
        help="a two-level tree: the first L aggregator hosts are leaves below the "
        "next, the root; 0: a flat job (default: the standing job's, `homagg testbed "
        "up --leaves` or `homagg up -i --leaves`)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def main(args: argparse.Namespace) -> int:
    from homagg.deploy.local.testbed import TestbedError

    try:
        if args.link_mbit is not None:
            from homagg.train import sweep

            if args.ranks is not None or args.inventory or args.auth or args.testbed:
                raise TrainError(
                    "--link-mbit builds its own testbeds: --workers sets their "
                    "ranks; --testbed, -i, --ranks and --auth are for one run"
                )
            kw = dict(
                method=args.method,
                steps=args.steps,
                warmup=args.warmup,
                lr=args.lr,
                seed=args.seed,
                bucket_mb=args.bucket_mb,
                baseline=not args.no_baseline,
                sparsify=args.sparsify,
                timeout=args.timeout,
                slots=args.slots,
                payload=args.payload_bytes,
                rounds=args.rounds,
            )
            rep = sweep.run_sweep(
                sweep.parse_models(args.model),
                sweep.parse_rates(args.link_mbit),
                workers=args.workers,
                testbed_name=args.testbed_name,
                mtu=args.mtu,
                state_dir=args.state_dir,
                out_dir=args.out,
                switch=args.switch,
                cost_model=args.cost_model,
                calibrate=args.calibrate,
                homagg_only=args.homagg_only,
                predicted_only=args.predicted_only,
                trials=args.trials,
                **kw,
            )
            if args.json:
                print(json.dumps(rep))
            else:
                print(sweep.render(rep))
                for path in rep.get("plots", []):
                    print(f"plot: {path}")
            ok = all(
                r["params_identical_across_ranks"] and r["replay_bit_identical"] is not False
                for r in rep["results"]
            )
            return 0 if ok else 3
        if not args.calibrate:
            raise TrainError(
                "--no-calibrate is for --link-mbit, whose testbeds the sweep calibrates; "
                "a testbed of your own is calibrated by `homagg calibrate --testbed NAME`"
            )
        pl = placement(
            testbed=args.testbed,
            inventory=args.inventory,
            state_dir=args.state_dir,
            runs_dir=args.runs_dir,
            label=f"train-{args.method}",
        )
        rep = run_train(
            pl,
            model=args.model,
            method=args.method,
            steps=args.steps,
            warmup=args.warmup,
            ranks=args.ranks,
            lr=args.lr,
            seed=args.seed,
            bucket_mb=args.bucket_mb,
            baseline=not args.no_baseline,
            sparsify=args.sparsify,
            timeout=args.timeout,
            switch=args.switch,
            slots=args.slots,
            payload=args.payload_bytes,
            out_dir=args.out,
            auth=args.auth,
            cost_model=args.cost_model,
            aggregators=args.aggregators,
            leaves=args.leaves,
            homagg_only=args.homagg_only,
            predicted_only=args.predicted_only,
            trials=args.trials,
            rounds=args.rounds,
        )
    except (HomAggError, TestbedError) as e:
        print(f"homagg train: {e}", file=sys.stderr)
        return 1
    if rep.run_dir:
        print(f"results and logs: {rep.run_dir}", file=sys.stderr)
    return print_report(rep, args.json)


def print_report(rep: dict, as_json: bool = False) -> int:
    ok = rep["params_identical_across_ranks"] and rep["replay_bit_identical"] is not False
    if as_json:
        print(json.dumps(rep.as_dict() if hasattr(rep, "as_dict") else rep))
        return 0 if ok else 3
    print(
        f"train {rep['model']}: {rep['ranks']} ranks, method {rep['method']}, "
        f"{rep['steps']} timed steps after {rep['warmup']} warmup, lr {rep['lr']:g}"
    )

    def ms(v):
        return "-" if v is None else f"{v * 1e3:.1f} ms"

    print(
        f"  iteration: {ms(rep['iteration_seconds'])} (backward + communication "
        f"{ms(rep['backward_comm_seconds'])}, forward + backward alone "
        f"{ms(rep.get('compute_seconds'))}), bytes sent per rank and step "
        f"{np.mean(rep['bytes_per_rank']):.0f} B"
    )
    if rep.get("gloo_iteration_seconds") is not None and rep["method"] != "gloo":
        print(
            f"  gloo DDP:  {ms(rep['gloo_iteration_seconds'])} (backward + communication "
            f"{ms(rep['gloo_backward_comm_seconds'])}, forward + backward alone "
            f"{ms(rep.get('gloo_compute_seconds'))}), bytes sent per rank and step "
            f"{np.mean(rep['gloo_bytes_per_rank']):.0f} B"
        )
        rounds = rep.get("speedup_rounds") or []
        print(
            f"  speedup vs gloo: {rep['speedup_vs_gloo']:.2f}x"
            + (
                f", the median of {len(rounds)} rounds ("
                + ", ".join(f"{v:.2f}x" for v in rounds)
                + ")"
                if len(rounds) > 1
                else ""
            )
        )
    print(
        f"  exposed communication (backward minus backward alone): "
        f"{ms(rep.get('exposed_comm_seconds'))}"
        + (
            f" (gloo {ms(rep.get('gloo_exposed_comm_seconds'))})"
            if rep.get("gloo_exposed_comm_seconds") is not None and rep["method"] != "gloo"
            else ""
        )
        + (
            f", after the last bucket {ms(rep.get('exposed_after_last_bucket_seconds'))}"
            if rep.get("exposed_after_last_bucket_seconds") is not None
            else ""
        )
        + (
            f"; hook CPU per iteration {ms(rep.get('hook_cpu_seconds'))}"
            if rep.get("hook_cpu_seconds") is not None
            else ""
        )
        + f"; torch threads per rank {rep.get('torch_threads')}"
    )
    for b in rep.get("buckets", []):
        methods = ", ".join(f"{m} x{n}" for m, n in b["methods"].items())
        paths = ", ".join(f"{p} x{n}" for p, n in b.get("paths", {}).items())
        pred = ""
        if b.get("predicted_homagg_seconds") is not None:
            pred = (
                f"; predicted homagg {ms(b['predicted_homagg_seconds'])}, "
                f"baseline {ms(b['predicted_baseline_seconds'])}"
            )
        measured = [
            f"{p} {ms(b[f'measured_{p}_seconds'])}"
            for p in ("homagg", "baseline")
            if b.get(f"measured_{p}_seconds") is not None
        ]
        if measured:
            pred += "; measured " + ", ".join(measured)
        if b.get("arrival_spread_seconds") is not None:
            pred += (
                f"; ranks handed it over {ms(b['arrival_spread_seconds'])} apart, "
                f"{ms(b['seconds_after_last_arrival'])} after the last"
            )
        for v in b.get("trial_verdicts", []):
            pred += (
                f"; a trial of whole steps: {ms(v['homagg'])} a step with HomAgg, "
                f"{ms(v['baseline'])} with the group -> "
                + ("the group" if v["held"] == "baseline" else "HomAgg")
            )
        if b.get("agree_seconds"):
            pred += f"; agreeing over the process group {ms(b['agree_seconds'])}"
        density = "n/a" if b["density"] is None else f"{b['density']:.4f}"
        print(
            f"  bucket {b['bucket']}: {b['numel']} elements, density {density}, "
            f"path {paths}, method {methods}, {b['bytes_sent']:.0f} payload bytes, "
            f"{ms(b['seconds'])} (hook CPU {ms(b.get('cpu_seconds'))}){pred}"
        )
    print("  loss: " + " ".join(f"{v:.4f}" for v in rep["losses"]))
    print(f"  parameters bit-identical across ranks: {rep['params_identical_across_ranks']}")
    replay = rep["replay_bit_identical"]
    print(
        "  bit-identical to the single-process reference replay: "
        + (
            str(replay)
            if replay is not None
            else "n/a (the gloo baseline alone)"
            if rep["method"] == "gloo"
            else f"n/a ({rep['method']} is lossy)"
        )
        + (
            f" ({rep['baseline_buckets']} buckets through the process group by the cost "
            "model's choice, the group's result replayed)"
            if rep.get("baseline_buckets")
            else ""
        )
        + (
            f" ({rep['fallback_buckets']} buckets through the process group by "
            "homagg.torch's fallback, the group's result replayed)"
            if rep.get("fallback_buckets")
            else ""
        )
    )
    miss = (rep.get("replay") or {}).get("first_mismatch")
    if rep["replay_bit_identical"] is False and miss:
        print(f"  the replay first differs at step {miss['step']}, parameter {miss['parameter']}")
    tm = (rep.get("replay") or {}).get("timed_phase_mismatch")
    if tm:
        print(
            f"  the timed phase (no recorder) and the recorded one differ: rank {tm['rank']}, "
            f"parameter {tm['parameter']}"
        )
    if not rep.get("initial_params_same_in_phases", True):
        print("  warning: the phases started from different parameters")
    if rep.get("loss_band_vs_gloo") is not None:
        print(
            f"  largest relative loss distance from the gloo run: {rep['loss_band_vs_gloo']:.2e}"
            f" (largest parameter difference {rep['max_param_diff_vs_gloo']:.2e})"
        )
    for path in rep.get("plots") or []:
        print(f"  plot: {path}")
    return 0 if ok else 3


def _standalone(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="homagg train", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return main(parser.parse_args(argv))


def _child_main(arg: str) -> None:
    """One rank, as a process of its own: _child, then out without the
    interpreter's finalization.  The rank has printed its report and
    destroyed its process group; torch's Gloo threads may still hold work
    with Python references (DDP's, the hook's futures), and releasing them
    while the interpreter is torn down can abort the process
    ("terminate called without an active exception", exit -6) after a run
    that succeeded."""
    import traceback

    code = 1
    try:
        code = _child(json.loads(arg))
    except SystemExit as e:
        code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":  # one rank
        _child_main(sys.argv[2])
    sys.exit(_standalone())
