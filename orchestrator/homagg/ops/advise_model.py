"""Will HomAgg help this model?  The advisor on a model's DDP buckets.

:func:`advise_model` builds a model the way ``homagg train --model`` does
(a built-in name of homagg.train.models or ``path/to/file.py:factory``,
loaded by homagg.train.train.load_factory), wraps it in
DistributedDataParallel on a one-process Gloo group and runs one forward
and backward pass per worker: rank r's first batch of ``factory(r, W,
seed)``, every pass from the same parameters (no optimiser step).  A
communication hook records what DDP hands to ``homagg.torch`` in training:
each bucket's flat float32 gradient and its parameters.  The layout is the
one DDP trains with: after the first pass DDP rebuilds its buckets once,
in the order the gradients became ready, each up to ``bucket_cap_mb``
(DDP's default 25 MB when None, the first bucket then capped at
``dist._DEFAULT_FIRST_BUCKET_BYTES``; a cap given, as ``homagg train``
gives one, holds for the first bucket too), and the passes recorded here
(one per worker) run on the rebuilt layout.

Per bucket: its size, its parameters, each worker's density of non-zeros
and the prediction of homagg.ops.advise.predict on the W workers' bucket
gradients (ring all-reduce and every exact method, the best, what binds).
A bucket whose W x numel is larger than ``sample_elements`` x W is
simulated on evenly spaced whole blocks of it (every part of an embedding
table is represented, not only its first rows) and scaled.  Per
iteration: each method on every bucket, summed, against ring on every
bucket; the method a job should set (``homagg.torch``'s ``method``) is the
one with the least summed time, and the speedup of the communication is
ring's sum over that method's.  Communication only: DDP overlaps buckets
with the backward pass, the prediction does not.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

from homagg.errors import HomAggError, InvalidArgument
from homagg.ops import advise as adv

DDP_BUCKET_CAP_MB = 25.0  # torch's DistributedDataParallel default

MODEL_ASSUMPTIONS = (
    "HomAgg bytes: the codec run on the W workers' bucket gradients, on evenly spaced "
    "whole blocks scaled by numel / simulated when a bucket is larger",
    "communication only: DDP overlaps the buckets' allreduces with the backward pass, "
    "the prediction does not",
    "per iteration: one method on every bucket (homagg.torch's method); buckets one "
    "after the other, times summed",
    "worker r's gradient: one forward and backward pass on the factory's first batch "
    "for rank r, from the same parameters",
)


def _call(model, inputs):
    return model(*inputs) if isinstance(inputs, (tuple, list)) else model(inputs)


def _error(spec, what, exc=None):
    text = f"--model {spec!r}: {what}"
    if exc is not None:
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        text += f" ({type(exc).__name__}: {first})" if first else f" ({type(exc).__name__})"
    return InvalidArgument(text)


def load_factory(spec: str):
    """The factory of ``spec`` as homagg train loads it; a bad spec is an
    InvalidArgument naming the model and the fix."""
    from homagg.train.train import load_factory as train_load

    try:
        return train_load(spec)[0]
    except HomAggError as exc:
        raise InvalidArgument(str(exc)) from None
    except Exception as exc:  # the file itself failed to import
        raise _error(spec, "its file failed to import", exc) from None


@contextlib.contextmanager
def _one_process_group():
    """A one-process Gloo group (the default group when this process has
    none; one of world size 1 already there is used as it is)."""
    import torch.distributed as dist

    if dist.is_initialized():
        if dist.get_world_size() != 1:
            raise InvalidArgument(
                "advise --model: this process is in a process group of "
                f"{dist.get_world_size()} ranks; run it outside training"
            )
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="homagg-advise-") as d:
        store = dist.FileStore(os.path.join(d, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            yield None
        finally:
            dist.destroy_process_group()


def bucket_gradients(spec: str, workers: int, seed: int = 1, bucket_cap_mb: float | None = None):
    """(buckets, first_layout, first_bucket_bytes): ``buckets`` a list, in
    DDP's bucket order, of {"index", "numel", "params" (names), "grads" (W
    float32 arrays)}; ``first_layout`` the parameter names of each bucket
    of DDP's first pass (before it rebuilt them); ``first_bucket_bytes``
    DDP's cap of its first bucket (None where this torch does not say)."""
    import numpy as np
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    factory = load_factory(spec)
    made = []
    for r in range(workers):
        try:
            got = factory(r, workers, seed)
        except Exception as exc:
            raise _error(spec, f"the factory raised for rank {r}", exc) from None
        if not (
            isinstance(got, (tuple, list))
            and len(got) == 3
            and isinstance(got[0], torch.nn.Module)
            and callable(got[2])
        ):
            raise _error(
                spec,
                "the factory must return (torch.nn.Module, batches, loss_fn), "
                f"it returned {type(got).__name__}",
            )
        model, batches, loss_fn = got
        try:
            batch = next(iter(batches))
            inputs, targets = batch
        except Exception as exc:
            raise _error(spec, f"its batches gave no (inputs, targets) for rank {r}", exc) from None
        made.append((model, inputs, targets, loss_fn))
    model = made[0][0]
    names = {id(p): n for n, p in model.named_parameters()}
    record = []

    def hook(state, bucket):
        buf = bucket.buffer()
        record.append(
            {
                "index": bucket.index(),
                "params": [names.get(id(p), "?") for p in bucket.parameters()],
                "grad": buf.detach().to(torch.float32).cpu().numpy().copy(),
            }
        )
        fut = torch.futures.Future()
        fut.set_result(buf)
        return fut

    with _one_process_group():
        try:
            ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)  # None: DDP's default
        except Exception as exc:
            raise _error(spec, "DistributedDataParallel refused the model", exc) from None
        ddp.register_comm_hook(None, hook)
        config = getattr(ddp, "_bucket_config", None)
        first_cap = getattr(config, "first_bucket_bytes_cap", None)
        passes = []
        # the first pass runs on DDP's initial buckets (torch 2.13: all in
        # one); DDP rebuilds them by size at the next forward, in the order
        # the gradients became ready, and keeps that layout
        for r in [0] + list(range(workers)):
            _, inputs, targets, lf = made[r]
            record.clear()
            ddp.zero_grad(set_to_none=False)
            try:
                lf(_call(ddp, inputs), targets).backward()
            except Exception as exc:
                raise _error(spec, f"forward/backward failed on rank {r}'s batch", exc) from None
            passes.append(sorted(record, key=lambda b: b["index"]))
    first = [b["params"] for b in passes[0]]
    layout = [b["params"] for b in passes[1]]
    for r, p in enumerate(passes[1:]):
        if [b["params"] for b in p] != layout:
            raise _error(
                spec,
                f"DDP formed other buckets on rank {r}'s pass (a graph that "
                "changes from batch to batch)",
            )
    buckets = [
        {
            "index": b["index"],
            "numel": int(b["grad"].size),
            "params": b["params"],
            "grads": [np.ascontiguousarray(p[i]["grad"]) for p in passes[1:]],
        }
        for i, b in enumerate(passes[1])
    ]
    if not buckets:
        raise _error(spec, "the model has no parameter that gets a gradient")
    return buckets, first, first_cap


def sample_blocks(grads, block: int, max_elements: int):
    """The workers' gradients, or evenly spaced whole blocks of them (at
    most ``max_elements`` elements; the last, partial block only when every
    block is kept)."""
    import numpy as np

    n = int(grads[0].size)
    if n <= max_elements:
        return grads
    full = n // block
    keep = max(1, min(full, max_elements // block))
    idx = np.unique(np.linspace(0, full - 1, keep).round().astype(np.int64))
    sel = (idx[:, None] * block + np.arange(block)[None, :]).reshape(-1)
    return [np.ascontiguousarray(g[sel]) for g in grads]


def advise_model(
    spec: str,
    workers: int = 4,
    link_mbit: float = 1000.0,
    *,
    rtt_ns=None,
    payload_bytes=1024,
    block=None,
    seed=1,
    bucket_cap_mb: float | None = None,
    sample_elements=adv.DEFAULT_SAMPLE,
    calibration=None,
    coeffs=None,
) -> dict:
    """The prediction per bucket and per iteration as a dict (the JSON of
    ``homagg advise --model``)."""
    import numpy as np

    from homagg import codec
    from homagg import cost as _cost

    if not 1 <= workers <= 256:
        raise InvalidArgument(f"workers {workers}: 1..256")
    if bucket_cap_mb is not None and not bucket_cap_mb > 0:
        raise InvalidArgument(f"bucket_cap_mb {bucket_cap_mb}: more than 0")
    c, source = adv.job_model(link_mbit, rtt_ns, payload_bytes, calibration, coeffs)
    block = int(block or codec.DEFAULT_BLOCK)
    buckets, first, first_cap = bucket_gradients(spec, workers, seed, bucket_cap_mb)
    cap = max(block, min(int(sample_elements), adv.MAX_SIMULATED // workers))
    out_buckets = []
    for b in buckets:
        grads = b["grads"]
        nnz = [int(np.count_nonzero(g)) for g in grads]
        union = int(np.count_nonzero(np.any(np.stack(grads) != 0, axis=0)))
        pred = adv.predict(sample_blocks(grads, block, cap), b["numel"], c, block=block, seed=seed)
        out_buckets.append(
            {
                "index": b["index"],
                "numel": b["numel"],
                "bytes": 4 * b["numel"],
                "params": b["params"],
                "density_per_worker": [k / b["numel"] for k in nnz],
                "density": float(np.mean(nnz)) / b["numel"],
                "union_density": union / b["numel"],
                **pred,
            }
        )
    it = iteration(out_buckets)
    return {
        "model": spec,
        "workers": workers,
        "link_mbit": c.link_mbit,
        "rtt_ns": c.rtt_ns,
        "payload_bytes": c.payload_bytes,
        "block_elements": block,
        "seed": seed,
        "bucket_cap_mb": float(DDP_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb),
        "bucket_cap_default": bucket_cap_mb is None,
        "first_bucket_bytes": first_cap,
        "coefficients": {k: getattr(c, k) for k in _cost.COEFFICIENTS},
        "coefficients_from": source,
        "layout_rebuilt": first != [b["params"] for b in buckets],
        "elements": sum(b["numel"] for b in buckets),
        "buckets": out_buckets,
        "iteration": it,
        "assumptions": [a for a in adv.ASSUMPTIONS if not a.startswith("HomAgg bytes")]
        + list(MODEL_ASSUMPTIONS),
    }


def iteration(buckets) -> dict:
    """One iteration: ring and each method summed over the buckets, the
    best method (least sum), its speedup and what binds its sum."""

    def total(rows):
        terms = {}
        for r in rows:
            for k, v in r["terms"].items():
                terms[k] = terms.get(k, 0.0) + v
        t = sum(r["time_s"] for r in rows)
        return {"time_s": t, "terms": terms, "binds": max(terms, key=terms.get) if t else "nothing"}

    ring = total([b["ring"] for b in buckets])
    methods = {}
    for m in adv.METHODS:
        methods[m] = total([b["methods"][m] for b in buckets])
        methods[m]["speedup"] = (
            ring["time_s"] / methods[m]["time_s"] if methods[m]["time_s"] else None
        )
        methods[m]["bytes_per_worker"] = sum(b["methods"][m]["bytes_per_worker"] for b in buckets)
    ring["bytes_per_worker"] = sum(b["ring"]["bytes_per_worker"] for b in buckets)
    best = min(methods, key=lambda k: methods[k]["time_s"])
    per_bucket = sum(b["methods"][b["best"]]["time_s"] for b in buckets)
    return {
        "ring": ring,
        "methods": methods,
        "best": best,
        "speedup": methods[best]["speedup"],
        "binds": methods[best]["binds"],
        "best_per_bucket_time_s": per_bucket,
        "best_per_bucket": {
            m: sum(b["best"] == m for b in buckets)
            for m in adv.METHODS
            if any(b["best"] == m for b in buckets)
        },
    }


def render(a: dict) -> str:
    """The prediction as text lines."""
    fmt_s, fmt_b = adv._fmt_s, adv._fmt_b
    lines = [
        f"model {a['model']}: {len(a['buckets'])} DDP buckets (bucket_cap_mb "
        f"{a['bucket_cap_mb']:g}{', DDP default' if a['bucket_cap_default'] else ''}), "
        f"{a['elements']} elements; W={a['workers']} workers, "
        f"{a['link_mbit']} Mbit/s links, round trip {a['rtt_ns'] / 1000:g} us, payload "
        f"{a['payload_bytes']} B, block {a['block_elements']}",
        f"coefficients: {a['coefficients_from']}",
        f"{'bucket':>6s} {'size':>9s} {'density':>8s} {'ring':>10s} {'best':>6s} "
        f"{'time':>10s} {'speedup':>8s}  binds",
    ]
    for b in a["buckets"]:
        r = b["methods"][b["best"]]
        sim = (
            "" if b["scale"] == 1 else f"  (simulated {b['simulated_elements']}, x{b['scale']:.3g})"
        )
        lines.append(
            f"{b['index']:6d} {fmt_b(b['bytes']):>9s} {b['density']:8.4f} "
            f"{fmt_s(b['ring']['time_s']):>10s} {b['best']:>6s} "
            f"{fmt_s(r['time_s']):>10s} {r['speedup']:8.2f}  "
            f"{r['binds'].replace('_', ' ')}{sim}"
        )
    it = a["iteration"]
    lines.append("per iteration (every bucket, one method):")
    lines.append(f"{'':8s} {'time':>10s} {'speedup':>8s} {'bytes/worker':>13s}  binds")
    lines.append(
        f"{'ring':8s} {fmt_s(it['ring']['time_s']):>10s} {'1':>8s} "
        f"{fmt_b(it['ring']['bytes_per_worker']):>13s}  {it['ring']['binds']}"
    )
    for m, r in it["methods"].items():
        sp = "-" if r["speedup"] is None else f"{r['speedup']:.2f}"
        lines.append(
            f"{m:8s} {fmt_s(r['time_s']):>10s} {sp:>8s} "
            f"{fmt_b(r['bytes_per_worker']):>13s}  {r['binds'].replace('_', ' ')}"
        )
    if it["speedup"] is not None:
        verdict = "faster" if it["speedup"] > 1 else "not faster"
        lines.append(
            f"best: {it['best']}, {it['speedup']:.2f}x ring per iteration's "
            f"communication: HomAgg is predicted {verdict} than ring here"
        )
    lines.append("assumes: " + "; ".join(a["assumptions"]))
    return "\n".join(lines)
