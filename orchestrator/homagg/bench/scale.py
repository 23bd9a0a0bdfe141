"""Scaling with W and K aggregators on the simulated cluster, next to ring all-reduce.

The NIC-model cluster (homagg.sim.Cluster: K C engines and W C worker
clients over the software NIC, virtual time, every link at --link-gbps)
runs one allreduce per (W, method, K) on a fresh cluster; --aggregators
lists the K of each W (a number, or W/N for one aggregator per N workers:
``--aggregators 1,2,4,8,W/8``).  The job is spread over the K aggregators
(docs/PROTOCOL.md "Several aggregators"), each on its own link at
--link-gbps.  --leaves adds tree rows: the job over a two-level tree of L
leaf aggregators and one root (docs/PROTOCOL.md "Tree"; a number or W/N,
e.g. ``--leaves W/16``), every link at --link-gbps, the window sized by
the same rule as a flat row's but for the tree's busiest aggregator
(max(W/L, L) senders).  Per row:

- aggregator throughput in virtual time: frames the engine received per
  second and the workers' payload bytes per second (Gbit/s), against the
  aggregator's one link at --link-gbps;
- the allreduce's virtual time, and what it costs to simulate it: wall
  seconds and simulated frames per wall second;
- per-aggregator link load: bytes into and out of each aggregator's link
  (its NIC port's counters), the busiest one's share of the total (1/K when
  evenly spread) and its Gbit/s of virtual time;
- bytes per worker: HomAgg payload sent and received (the client's
  counters) and on the wire (+ Ethernet/IP/UDP/HomAgg headers per frame),
  next to ring all-reduce's 2(W-1)/W x 4n bytes per worker and the ring's
  model time 2(W-1)/W x 4n x 8 / link + 2(W-1) link delays (a model, not a
  measurement: every worker on its own link, no CPU, no protocol overhead;
  HomAgg's W workers share the aggregator's one link);
- loss recovery (--drop-rate: each link drops that fraction of the frames
  it carries): the frames the links dropped (the fabric's dropped_loss),
  retransmissions and retransmissions per dropped frame, STATUS frames the aggregators sent and the
  repeats among them, unicast to the asking and the missing workers
  (docs/PROTOCOL.md Part 3 "Fast retransmission"), STATUS frames the
  workers received; a row whose
  allreduce failed keeps its counters and says why in ``error``;
- recovery (--drop-rate and --straggler-ms take lists, --link-gbps too:
  one row per combination): timeouts (all workers, and the punctual ones
  when the last worker starts --straggler-ms late), start probes (docs/
  PROTOCOL.md Part 3, "Three causes, told apart"), the highest stall
  floor, and ``vs_clean``: the row's time over the loss-free, punctual
  row of the same W, shape, method, link and pipe gain (the first of the
  lists); --pipe-gain 0,2 measures the workers without and with the
  pipe's bound (docs/PROTOCOL.md Part 3, "The pipe") in one run;
- exact: the result is bit-identical, on every worker, to the numpy
  fixed-point reference (homagg.reference); nc is lossy by design, so it
  reports its relative L2 error against the float64 sum instead.

Outputs with --out DIR: scale.json, scale.csv, scale.md, scale_recovery.png
(with loss or stragglers: time / loss-free time, retransmissions per drop
and the punctual workers' timeouts against W), scale.png (bytes
per worker and time vs W at K = 1; time vs W per K with the ring's model;
log2 x-axis).  --json prints the report.
"""

import json
import sys
import time

import numpy as np

from homagg.bench import report as rep
from homagg.bench import workloads
from homagg.protocol import EXACT_METHODS, METHODS

DEFAULT_WORKERS = "8,16,32,64,128,256"


def frame_overhead():
    """Bytes around every HomAgg payload on the wire: Ethernet + IPv4 + UDP
    + the HomAgg header (homagg/wire.h HG_HDR_LEN)."""
    from homagg._native import lib

    return 42 + lib.HG_HDR_LEN


LINK_DELAY = 1e-6  # one-way delay of every simulated link (s)


def _int_list(text):
    return [int(v) for v in text.split(",") if v.strip()]


def _float_list(text):
    return [float(v) for v in text.split(",") if v.strip()]


def _gain_list(text):
    """--pipe-gain: comma-separated gains g, each from 0 to 10, or 'auto'
    (None: homagg.sim.Cluster's default for the row's shape)."""
    import argparse
    import math

    try:
        out = [None if v.strip() == "auto" else float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        out = [math.nan]
    bad = [g for g in out if g is not None and not (math.isfinite(g) and 0 <= g <= 10)]
    if bad or not out:
        raise argparse.ArgumentTypeError(
            f"{text!r}: each gain must be a number from 0 to 10 (0: no bound but the "
            "slots) or auto, e.g. --pipe-gain 0,2"
        )
    return out


def _name_list(text):
    return [v.strip() for v in text.split(",") if v.strip()]


def _k_list(text):
    """ "1,2,W/8" -> [1, 2, "W/8"]: numbers, or one aggregator per N workers."""
    out = []
    for v in _name_list(text):
        if v.upper().startswith("W/"):
            if not v[2:].isdigit() or int(v[2:]) < 1:
                raise ValueError(f"bad aggregator count {v!r}: a number or W/N")
            out.append(f"W/{int(v[2:])}")
        else:
            out.append(int(v))
    return out


def aggregators_for(token, workers):
    """K for W workers: the number itself, or max(1, W // N) for "W/N" (at most 64)."""
    if isinstance(token, str):
        return max(1, min(64, workers // int(token[2:])))
    return int(token)


def add_arguments(parser):
    parser.add_argument(
        "--workers",
        type=_int_list,
        default=_int_list(DEFAULT_WORKERS),
        help=f"comma-separated worker counts (default {DEFAULT_WORKERS})",
    )
    parser.add_argument(
        "--elements", type=int, default=2**18, help="float32 elements per worker (default 2^18)"
    )
    parser.add_argument(
        "--density", type=float, default=0.01, help="non-zero fraction per worker (default 0.01)"
    )
    parser.add_argument(
        "--workload",
        default="zipf",
        choices=workloads.WORKLOADS,
        help="gradient pattern, see homagg.bench.workloads (default zipf)",
    )
    parser.add_argument(
        "--methods",
        type=_name_list,
        default=list(METHODS),
        help=f"comma-separated methods (default {','.join(METHODS)})",
    )
    parser.add_argument(
        "--aggregators",
        type=_k_list,
        default=[1],
        help="comma-separated aggregator counts K per W: numbers or W/N "
        "(one per N workers), e.g. 1,2,4,8,W/8 (default 1)",
    )
    parser.add_argument(
        "--leaves",
        type=_k_list,
        default=[],
        help="comma-separated leaf counts L of tree rows per W: numbers or "
        "W/N, e.g. W/16 (default: no tree rows)",
    )
    parser.add_argument(
        "--drop-rate",
        type=_float_list,
        default=[0.0],
        help="comma-separated fractions of frames every link drops, 0..1, one row each (default 0)",
    )
    parser.add_argument(
        "--straggler-ms",
        type=_float_list,
        default=[0.0],
        help="comma-separated start delays (ms of virtual time) of the last "
        "worker, one row each: a straggler still computing (default 0)",
    )
    parser.add_argument(
        "--link-gbps",
        type=_float_list,
        default=[100.0],
        help="comma-separated line rates of every simulated link, one row each (default 100)",
    )
    parser.add_argument(
        "--agg-link-gbps",
        default=None,
        help="line rate of each aggregator's link: a number, or 'auto' for "
        "homagg.sim.Cluster's default min(W x link, max(400, link)) "
        "(default: the workers' --link-gbps)",
    )
    parser.add_argument(
        "--pipe-gain",
        type=_gain_list,
        default=[None],
        metavar="G",
        help="comma-separated gains g of the workers' pipe, one row each "
        '(docs/PROTOCOL.md Part 3, "The pipe": first transmissions wait while '
        "a worker's chunks in the network's queues reach a bound that settles "
        "where the round trip is g times its least; 0: no bound but the slots, "
        "the rule before it; auto: homagg.sim.Cluster's default, 2 flat and 3 "
        "in a tree); each row's vs_clean is over the loss-free row of its own "
        "gain (default auto)",
    )
    parser.add_argument(
        "--block", type=int, default=None, help="block elements (default HG_DEFAULT_BLOCK)"
    )
    parser.add_argument(
        "--slots",
        type=int,
        default=None,
        help="aggregator slots per job = each worker's window (default: "
        "homagg.sim.Cluster's, as a user gets it: W x S within the "
        "aggregator's rx ring of 4096 frames, up to 256 slots with the "
        "pipe's bound, and 32 slots with the pipe capped at 4096 / 2W for a "
        "flat job beyond 128 workers; the row's slots and pipe_max are the "
        "job's; a W x S beyond the ring is refused)",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the gradients")
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    parser.add_argument(
        "--out", metavar="DIR", default=None, help="write scale.json/.csv/.md/.png into DIR"
    )


def auto_slots(workers, pipe=False):
    """The window ``homagg bench scale`` set up to 2026-12-06, which the
    scripts under docs/results of those dates use; it now takes
    homagg.sim.Cluster's default.  A window that does not overflow the
    aggregator: W x S <= 2048 frames,
    half the simulated aggregator port's 4096-frame rx ring (homagg/sim.c).
    A larger window only turns the incast into drops and retransmissions
    (the row's retransmissions column shows them with --slots); one beyond
    the ring is refused at add_job (homagg.sim.Cluster.add_job).  At most
    64 slots; with the workers' pipe (``pipe``) at most 256, since the
    bound keeps the window out of the queue and the slots beyond it hold
    the chunks in repair (homagg.protocol.MAX_PIPE_DEFAULT_SLOTS)."""
    from homagg.protocol import MAX_DEFAULT_SLOTS, MAX_PIPE_DEFAULT_SLOTS
    from homagg.sim import AGG_RX_RING

    most = MAX_PIPE_DEFAULT_SLOTS if pipe else MAX_DEFAULT_SLOTS
    return min(most, max(4, AGG_RX_RING // 2 // workers))


def ring_bytes_per_worker(workers, elements):
    """Bytes each worker sends in a ring all-reduce of float32 (reduce-scatter
    + all-gather): 2 (W-1)/W x 4n."""
    return 2.0 * (workers - 1) / workers * 4 * elements


def ring_model_seconds(workers, elements, link_gbps, delay=LINK_DELAY):
    """Ring all-reduce on the same links, each worker on its own link: the
    bandwidth term 2(W-1)/W x 4n x 8 / rate plus one link delay for each
    of its 2(W-1) steps.  A lower bound: no CPU, no protocol overhead."""
    if link_gbps <= 0:
        return None
    return (
        ring_bytes_per_worker(workers, elements) * 8 / (link_gbps * 1e9) + 2 * (workers - 1) * delay
    )


def _payload(stats_dict):
    return int(sum(stats_dict.values()))


def run_one(
    grads,
    method,
    link_gbps,
    block,
    slots,
    seed,
    want=None,
    f64=None,
    aggregators=1,
    leaves=0,
    drop_rate=0.0,
    straggler_ms=0.0,
    agg_link_gbps=None,
    pipe_gain=None,
):
    """One allreduce of grads on a fresh simulated cluster of ``aggregators``
    aggregators (leaves > 0: a tree of ``leaves`` leaves and a root, the
    root last) whose links drop ``drop_rate`` of their frames, the last
    worker starting ``straggler_ms`` late; returns a row (without the
    W/workload context) and the result (None, and the row's ``error``,
    when the allreduce failed).  slots: None for homagg.sim.Cluster's
    default (the row gives the job's slots and pipe cap).  agg_link_gbps:
    None the workers' rate, "auto" homagg.sim.Cluster's default, else that
    rate."""
    from homagg.errors import HomAggError
    from homagg.sim import Cluster

    W = len(grads)
    n = grads[0].size
    # Each aggregator NIC at the same rate as each worker's: an aggregator's
    # port is shared by all W workers, as with a DPDK aggregator server.
    agg_rate = (
        link_gbps
        if agg_link_gbps is None
        else None
        if agg_link_gbps == "auto"
        else float(agg_link_gbps)
    )
    with Cluster(
        workers=W,
        link_gbps=link_gbps,
        agg_link_gbps=agg_rate,
        slots=slots,
        seed=seed,
        delay=LINK_DELAY,
        aggregators=1 if leaves else aggregators,
        leaves=leaves,
        loss=drop_rate,
        pipe_gain=pipe_gain,
    ) as cl:
        aggregators = cl.aggregators
        job_slots, pipe_max = cl.job.slots, cl.job.pipe_max
        if straggler_ms:
            cl.delay_start(W - 1, straggler_ms / 1e3)
        t0 = time.perf_counter()
        error = None
        try:
            res = cl.allreduce(grads, method=method, block_elements=block)
            stats = res.stats
        except HomAggError as e:
            if getattr(e, "stats", None) is None:
                raise
            res, stats, error = None, e.stats, str(e).split("; ")[0]
        wall = time.perf_counter() - t0
        sim = cl.stats()
        drops = int(cl.fabric_counters()["dropped_loss"])
        aggs = [cl.aggregator_counters(k) for k in range(aggregators)]
    per = stats["workers"]
    sent = [_payload(w["bytes_sent"]) for w in per]
    recv = [_payload(w["bytes_received"]) for w in per]
    pkts = [w["packets_sent"] for w in per]
    vt = stats["virtual_time"]
    eng = {
        k: sum(a["engine"][k] for a in aggs)
        for k in ("received", "results_sent", "status_sent", "status_repeats")
    }
    link_rx = [a["link"]["rx_bytes"] for a in aggs]
    link_tx = [a["link"]["tx_bytes"] for a in aggs]
    ring = ring_bytes_per_worker(W, n)
    retx = int(sum(w["retransmissions"] for w in per))
    punctual = per[:-1] if straggler_ms else per
    row = {
        "method": method,
        "aggregators": aggregators,
        "leaves": leaves,
        "slots": job_slots,
        "pipe_max": pipe_max,
        "drop_rate": drop_rate,
        "straggler_ms": straggler_ms,
        "pipe_gain": cl.pipe_gain,
        "link_gbps": link_gbps,
        "agg_link_gbps": cl.agg_link_gbps,
        "method_chosen": stats["method"],
        "virtual_seconds": vt,
        "wall_seconds": wall,
        "sim_frames_per_wall_s": sim["frames_tx"] / wall if wall > 0 else None,
        "agg_frames_received": eng["received"],
        "agg_results_sent": eng["results_sent"],
        "agg_status_sent": eng["status_sent"],
        "agg_status_repeats": eng["status_repeats"],
        "status_received_per_worker": float(np.mean([w["status_received"] for w in per])),
        "agg_packets_per_s": eng["received"] / vt if vt > 0 else None,
        "agg_payload_gbps": 8.0 * sum(sent) / vt / 1e9 if vt > 0 else None,
        "agg_link_rx_bytes": link_rx,
        "agg_link_tx_bytes": link_tx,
        "agg_link_rx_max_share": max(link_rx) / sum(link_rx) if sum(link_rx) else None,
        "agg_link_rx_max_gbps": 8.0 * max(link_rx) / vt / 1e9 if vt > 0 else None,
        "link_utilisation": (
            8.0 * (sum(sent) + frame_overhead() * sum(pkts)) / vt / 1e9 / link_gbps / aggregators
            if vt > 0 and link_gbps > 0
            else None
        ),
        "bytes_sent_per_worker": float(np.mean(sent)),
        "bytes_received_per_worker": float(np.mean(recv)),
        "bytes_sent_per_worker_max": int(max(sent)),
        "wire_bytes_per_worker": float(np.mean(sent) + frame_overhead() * np.mean(pkts)),
        "packets_per_worker": float(np.mean(pkts)),
        "ring_bytes_per_worker": ring,
        "ratio_vs_ring": float(np.mean(sent)) / ring if ring else None,
        "ring_model_seconds": ring_model_seconds(W, n, link_gbps),
        "drops_injected": drops,
        "retransmissions": retx,
        "retransmissions_per_drop": retx / drops if drops else None,
        "timeouts": int(sum(w["timeouts"] for w in per)),
        "timeouts_punctual": int(sum(w["timeouts"] for w in punctual)),
        "spurious_timeouts": int(sum(w["spurious_timeouts"] for w in per)),
        "start_probes": int(sum(w["start_probes"] for w in per)),
        "rto_floor_max_ms": max(w["rto_floor_ns"] for w in per) / 1e6,
        "vs_clean": None,  # filled by run(): this time / the loss-free, punctual row's
        "stalled_blocks": int(per[0]["stalled_blocks"]),
        "exact": None,
        "rel_l2_error": None,
        "error": error,
    }
    if res is None:
        row["exact"] = False if method in EXACT_METHODS else None
        row["workers_agree"] = False
        return row, None
    agree = all(np.array_equal(o.view(np.uint32), res.sum.view(np.uint32)) for o in res.outputs)
    if method in EXACT_METHODS and want is not None:
        row["exact"] = bool(agree and np.array_equal(res.sum.view(np.uint32), want.view(np.uint32)))
    if f64 is not None:
        norm = float(np.linalg.norm(f64))
        err = float(np.linalg.norm(res.sum.astype(np.float64) - f64))
        row["rel_l2_error"] = err / norm if norm else err
    row["workers_agree"] = bool(agree)
    return row, res


def run(args):
    from homagg import reference
    from homagg._native import lib

    block = args.block or lib.HG_DEFAULT_BLOCK
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown method(s) {unknown}; choose from {','.join(METHODS)}")
    if args.elements <= 0 or not args.workers or min(args.workers) < 1:
        raise SystemExit("--elements and --workers must be positive")
    rows = []
    density = workloads.effective_density(args.workload, args.density)
    for W in args.workers:
        rep.progress(
            "scale",
            f"W={W}: {args.workload} gradients of {args.elements} float32, density {density}",
        )
        grads = workloads.generate_all(args.workload, W, args.elements, density, args.seed)
        want = reference.allreduce(grads, block) if set(args.methods) & set(EXACT_METHODS) else None
        f64 = np.sum([g.astype(np.float64) for g in grads], axis=0)
        union = int(np.count_nonzero(np.any([g != 0 for g in grads], axis=0)))
        ks = list(dict.fromkeys(aggregators_for(t, W) for t in args.aggregators))
        shapes = [{"aggregators": K} for K in ks]
        shapes += [{"leaves": L} for L in tree_leaves(args.leaves, W)]
        for shape in shapes:
            for m in args.methods:
                for gbps in args.link_gbps:
                    for gain in args.pipe_gain:
                        clean = None
                        for drop in args.drop_rate:
                            for lag in args.straggler_ms:
                                row, _res = run_one(
                                    grads,
                                    m,
                                    gbps,
                                    block,
                                    args.slots,
                                    args.seed,
                                    want=want,
                                    f64=f64,
                                    drop_rate=drop,
                                    straggler_ms=lag,
                                    agg_link_gbps=args.agg_link_gbps,
                                    pipe_gain=gain,
                                    **shape,
                                )
                                row = {
                                    "workers": W,
                                    "elements": args.elements,
                                    "workload": args.workload,
                                    "density": density,
                                    "union_density": union / args.elements,
                                    **row,
                                }
                                if drop == 0 and lag == 0:
                                    clean = row
                                if clean is not None and clean["virtual_seconds"] > 0:
                                    row["vs_clean"] = (
                                        row["virtual_seconds"] / clean["virtual_seconds"]
                                    )
                                rows.append(row)
                                _progress(row)
        del grads
    gains = ["auto" if g is None else g for g in args.pipe_gain]
    return rep.header(
        benchmark="scale",
        link_gbps=args.link_gbps[0] if len(args.link_gbps) == 1 else args.link_gbps,
        elements=args.elements,
        density=density,
        workload=args.workload,
        block_elements=block,
        slots=args.slots or "default",
        seed=args.seed,
        drop_rate=args.drop_rate[0] if len(args.drop_rate) == 1 else args.drop_rate,
        straggler_ms=args.straggler_ms,
        pipe_gain=gains[0] if len(gains) == 1 else gains,
        agg_link_gbps=args.agg_link_gbps,
        aggregators=[str(t) for t in args.aggregators],
        leaves=[str(t) for t in args.leaves],
        results=rows,
    )


def tree_leaves(tokens, workers):
    """The distinct L of --leaves for W workers (2 <= L <= min(W, 63))."""
    out = []
    for t in tokens:
        L = min(aggregators_for(t, workers), workers, 63)
        if L >= 2 and L not in out:
            out.append(L)
    return out


def _progress(row):
    m, W = row["method"], row["workers"]
    where = f"tree L={row['leaves']}" if row["leaves"] else f"K={row['aggregators']}"
    where += f" g={row['pipe_gain']:g}"
    rep.progress(
        "scale",
        f"W={W} {where} {m:6s} virtual {row['virtual_seconds'] * 1e3:8.3f} ms "
        f"(ring model {row['ring_model_seconds'] * 1e3:.3f} ms), "
        f"{row['bytes_sent_per_worker'] / 1e6:.3f} MB/worker "
        f"({row['ratio_vs_ring']:.3f} x ring), agg "
        f"{row['agg_payload_gbps']:.1f} Gbit/s, wall {row['wall_seconds']:.2f} s, "
        f"drops {row['drops_injected']}, retx {row['retransmissions']}"
        + (
            f" ({row['retransmissions_per_drop']:.2f} per drop)"
            if row["retransmissions_per_drop"] is not None
            else ""
        )
        + (
            f", timeouts {row['timeouts']}, probes {row['start_probes']}"
            + (f", straggler {row['straggler_ms']:g} ms" if row["straggler_ms"] else "")
            + (f", {row['vs_clean']:.2f} x loss-free" if row["vs_clean"] else "")
        )
        + f", status {row['agg_status_sent']} "
        f"({row['agg_status_repeats']} repeats unicast), exact {row['exact']}"
        + (f", error: {row['error']}" if row["error"] else ""),
    )


MD_COLUMNS = (
    "workers",
    "aggregators",
    "leaves",
    "method",
    "method_chosen",
    "slots",
    "pipe_max",
    "virtual_seconds",
    "ring_model_seconds",
    "agg_link_rx_max_share",
    "agg_link_rx_max_gbps",
    "bytes_sent_per_worker",
    "ring_bytes_per_worker",
    "ratio_vs_ring",
    "agg_packets_per_s",
    "agg_payload_gbps",
    "wall_seconds",
    "drops_injected",
    "retransmissions",
    "retransmissions_per_drop",
    "timeouts",
    "timeouts_punctual",
    "start_probes",
    "rto_floor_max_ms",
    "drop_rate",
    "straggler_ms",
    "pipe_gain",
    "link_gbps",
    "vs_clean",
    "agg_status_sent",
    "agg_status_repeats",
    "exact",
    "rel_l2_error",
)


def _base_rows(results):
    """The rows of the first link rate and drop rate, without a straggler
    (what the scaling panels plot)."""
    if not results:
        return results
    first = results[0]
    return [
        r
        for r in results
        if r.get("link_gbps") == first.get("link_gbps")
        and r.get("drop_rate") == first.get("drop_rate")
        and r.get("pipe_gain") == first.get("pipe_gain")
        and not r.get("straggler_ms")
    ]


def plot_recovery(report, path):
    """Loss and stragglers against W: time / the loss-free punctual time,
    retransmissions per drop and the punctual workers' timeouts, one line
    per (link, drop rate, straggler, pipe gain), flat (solid) and tree
    (dashed), the first method of the run."""
    plt = rep.pyplot()
    rows = [r for r in report["results"] if r.get("drop_rate") or r.get("straggler_ms")]
    if not rows:
        return None
    m0 = rows[0]["method"]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(17, 4.5))
    keys = sorted(
        {
            (r["link_gbps"], r["drop_rate"], r["straggler_ms"], bool(r["leaves"]), r["pipe_gain"])
            for r in rows
            if r["method"] == m0
        }
    )
    gains = {k[4] for k in keys}
    has = {ax1: any(r["vs_clean"] for r in rows), ax2: any(r["drop_rate"] for r in rows), ax3: True}
    for gbps, drop, lag, tree, gain in keys:
        rs = sorted(
            (
                r
                for r in rows
                if r["method"] == m0
                and r["link_gbps"] == gbps
                and r["drop_rate"] == drop
                and r["straggler_ms"] == lag
                and bool(r["leaves"]) == tree
                and r["pipe_gain"] == gain
            ),
            key=lambda r: r["workers"],
        )
        label = (
            f"{gbps:g} Gbit/s, loss {drop:g}"
            + (f", straggler {lag:g} ms" if lag else "")
            + (", tree" if tree else "")
            + (f", pipe gain {gain:g}" if len(gains) > 1 else "")
        )
        style = "--" if tree else "-"
        marker = "x" if gain == 0 and len(gains) > 1 else "o"  # no pipe bound: crosses
        ws = [r["workers"] for r in rs]
        ax1.plot(ws, [r["vs_clean"] or float("nan") for r in rs], style, marker=marker, label=label)
        if drop:
            ax2.plot(
                ws,
                [r["retransmissions_per_drop"] or float("nan") for r in rs],
                style,
                marker=marker,
                label=label,
            )
        ax3.plot(ws, [r["timeouts_punctual"] for r in rs], style, marker=marker, label=label)
    ax1.axhline(1.5, color="k", lw=0.8, ls=":")
    ax2.axhline(2.0, color="k", lw=0.8, ls=":")
    for ax, yl in (
        (ax1, "time / loss-free punctual time"),
        (ax2, "retransmissions per dropped frame"),
        (ax3, "timeouts of the punctual workers"),
    ):
        if not has[ax]:
            ax.set_visible(False)  # nothing to plot (no loss-free row, no loss)
            continue
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers W")
        ax.set_ylabel(yl)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    if ax1.get_visible():
        ax1.set_yscale("log")
    fig.suptitle(
        f"HomAgg recovery on the simulated cluster ({m0}, {report['elements']} "
        "elements, virtual time)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot(report, path):
    plt = rep.pyplot()
    base = _base_rows(report["results"])
    trees = [r for r in base if r.get("leaves")]
    rows = [r for r in base if not r.get("leaves")]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    ws = sorted({r["workers"] for r in rows})
    # the first two panels: the smallest K of the run (normally 1)
    kmin = min((r.get("aggregators", 1) for r in rows), default=1)
    k1 = [r for r in rows if r.get("aggregators", 1) == kmin]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(17, 4.5))
    for m in methods:
        rs = sorted((r for r in k1 if r["method"] == m), key=lambda r: r["workers"])
        ax1.plot(
            [r["workers"] for r in rs],
            [r["bytes_sent_per_worker"] for r in rs],
            marker="o",
            label=m,
        )
        ax2.plot(
            [r["workers"] for r in rs], [r["virtual_seconds"] for r in rs], marker="o", label=m
        )
    ring = {r["workers"]: r for r in rows}
    ax1.plot(ws, [ring[w]["ring_bytes_per_worker"] for w in ws], "k--", label="ring 2(W-1)/W·4n")
    ax2.plot(
        ws,
        [ring[w]["ring_model_seconds"] for w in ws],
        "k--",
        label="ring, model (bandwidth + latency)",
    )
    # Time against W for every K (the first method of the run).
    m0 = methods[0]
    for K in sorted({r.get("aggregators", 1) for r in rows}):
        rs = sorted(
            (r for r in rows if r["method"] == m0 and r.get("aggregators", 1) == K),
            key=lambda r: r["workers"],
        )
        ax3.plot(
            [r["workers"] for r in rs],
            [r["virtual_seconds"] for r in rs],
            marker="o",
            label=f"{m0}, K = {K}",
        )
    for t in report.get("aggregators", []):
        if str(t).startswith("W/"):
            rs = sorted(
                (
                    r
                    for r in rows
                    if r["method"] == m0
                    and r.get("aggregators", 1) == aggregators_for(t, r["workers"])
                ),
                key=lambda r: r["workers"],
            )
            ax3.plot(
                [r["workers"] for r in rs],
                [r["virtual_seconds"] for r in rs],
                "r-",
                lw=2.5,
                alpha=0.5,
                label=f"{m0}, K = {t}",
            )
    for t in report.get("leaves", []):
        rs = sorted(
            (
                r
                for r in trees
                if r["method"] == m0 and r["leaves"] in tree_leaves([_k_list(t)[0]], r["workers"])
            ),
            key=lambda r: r["workers"],
        )
        if rs:
            ax3.plot(
                [r["workers"] for r in rs],
                [r["virtual_seconds"] for r in rs],
                "g-s",
                lw=2,
                label=f"{m0}, tree of L = {t} leaves + root",
            )
    ax3.plot(ws, [ring[w]["ring_model_seconds"] for w in ws], "k--", label="ring, model")
    for ax, yl in (
        (ax1, f"payload bytes sent per worker (K = {kmin})"),
        (ax2, f"allreduce time (s, virtual, K = {kmin})"),
        (ax3, "allreduce time (s, virtual) per K aggregators"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("workers W")
        ax.set_ylabel(yl)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"HomAgg on the simulated cluster: {report['elements']} elements, "
        f"{report['workload']} density {report['density']}, "
        f"{rows[0]['link_gbps'] if rows else report['link_gbps']} Gbit/s links"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(args):
    report = run(args)
    if args.out:
        import os

        paths = rep.write_outputs(
            args.out, "scale", report, MD_COLUMNS, "HomAgg scaling on the simulated cluster"
        )
        paths["png"] = plot(report, os.path.join(args.out, "scale.png"))
        recovery = plot_recovery(report, os.path.join(args.out, "scale_recovery.png"))
        if recovery:
            paths["recovery_png"] = recovery
        rep.progress("scale", "wrote " + ", ".join(paths.values()))
    if args.json:
        json.dump(report, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    bad = [r for r in report["results"] if r["exact"] is False or not r["workers_agree"]]
    if bad:
        rep.progress("scale", f"NOT EXACT: {[(r['workers'], r['method']) for r in bad]}")
        return 1
    return 0
