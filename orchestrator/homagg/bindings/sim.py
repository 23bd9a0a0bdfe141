"""Bindings of homagg/sim.h (the client stats structs: homagg.bindings.client).

One function per C function, each checking its arguments before the call
and turning the return code into an exception of ``homagg.errors`` after it.
Gradients and outputs are 1-D C-contiguous ``float32`` arrays passed without
copies; the caller keeps them alive until the allreduce ends (``Sim`` holds
references).  The typed API is ``homagg.sim``.
"""

from homagg._native import ffi, lib
from homagg.bindings._args import _f32, _fill
from homagg.bindings.client import agg_stats_dict, client_stats_dict
from homagg.bindings.nic import port_counters
from homagg.bindings.wire import counters_read
from homagg.errors import InvalidArgument, ResourceError, check

# the incarnation of every simulated worker
INCARNATION = lib.HG_SIM_INCARNATION
# frames an aggregator's receive ring holds: the bound of its jobs' W x S
AGG_RX_RING = lib.HG_SIM_AGG_RX_RING


def params(**fields):
    """A ``struct hg_params *`` with these fields, unchecked here
    (hg_sim_create checks them)."""
    return _fill(ffi.new("struct hg_params *"), fields)


def sim_create(
    loss=0.0,
    duplicate=0.0,
    reorder=0.0,
    reorder_ns=0,
    delay_ns=0,
    link_gbps=0.0,
    seed=0,
    payload_bytes=0,
    unicast_results=False,
    agg_link_gbps=0.0,
    aggregators=1,
    pool_frames=0,
    mtu=0,
    leaves=0,
    up_rto_ns=0,
    up_give_up_ns=0,
    worker_tx_ring=0,
):
    for name, v in (("loss", loss), ("duplicate", duplicate), ("reorder", reorder)):
        if not 0.0 <= v < 1.0:
            raise InvalidArgument(f"{name} must be in [0, 1), got {v}")
    if link_gbps < 0 or agg_link_gbps < 0 or delay_ns < 0 or reorder_ns < 0:
        raise InvalidArgument("link rates, delay and reorder delay must be >= 0")
    if not 1 <= aggregators <= lib.HG_SIM_MAX_AGGREGATORS:
        raise InvalidArgument(
            f"aggregators must be in 1..{lib.HG_SIM_MAX_AGGREGATORS}, got {aggregators}"
        )
    if leaves and not 1 <= leaves < lib.HG_SIM_MAX_AGGREGATORS:
        raise InvalidArgument(
            f"leaves must be in 1..{lib.HG_SIM_MAX_AGGREGATORS - 1}, got {leaves}"
        )
    if leaves and aggregators > 1:
        raise InvalidArgument(
            f"a tree has one root: leaves={leaves} needs aggregators=1, got {aggregators}"
        )
    cfg = _fill(
        ffi.new("struct hg_sim_config *"),
        dict(
            loss=loss,
            duplicate=duplicate,
            reorder=reorder,
            reorder_ns=int(reorder_ns),
            delay_ns=int(delay_ns),
            link_gbps=link_gbps,
            seed=int(seed) & (2**64 - 1),
            payload_bytes=int(payload_bytes),
            unicast_results=bool(unicast_results),
            agg_link_gbps=float(agg_link_gbps),
            aggregators=int(aggregators),
            pool_frames=int(pool_frames),
            mtu=int(mtu),
            leaves=int(leaves),
            up_rto_ns=int(up_rto_ns),
            up_give_up_ns=int(up_give_up_ns),
            worker_tx_ring=int(worker_tx_ring),
        ),
    )
    s = lib.hg_sim_create(cfg)
    if s == ffi.NULL:
        raise ResourceError(
            "cannot create the simulated cluster (bad configuration or out of memory)"
        )
    return ffi.gc(s, lib.hg_sim_destroy)


def sim_destroy(s):
    ffi.release(s)


def sim_add_job(
    s,
    workers,
    slots=0,
    rto_ns=0,
    rto_max_ns=0,
    give_up_ns=0,
    rto_min_ns=0,
    start_wait_ns=0,
    rto_granularity_ns=0,
    secret=None,
    pipeline_groups=0,
    mac=0,
    pipe_gain_pct=0,
    pipe_max=0,
):
    jc = _fill(
        ffi.new("struct hg_sim_job_config *"),
        dict(
            workers=int(workers),
            slots=int(slots),
            rto_ns=int(rto_ns),
            rto_max_ns=int(rto_max_ns),
            give_up_ns=int(give_up_ns),
            rto_min_ns=int(rto_min_ns),
            rto_granularity_ns=int(rto_granularity_ns),
            start_wait_ns=int(start_wait_ns),
            pipeline_groups=int(pipeline_groups),
            pipe_gain_pct=int(pipe_gain_pct),
            pipe_max=int(pipe_max),
        ),
    )
    if secret is not None:
        _fill(jc, {"auth": 1, "secret": bytes(secret), "mac": int(mac)})
    return check(lib.hg_sim_add_job(s, jc), "add job")


def sim_agg_frames(s, k, workers, slots=0):
    """(frames, held): what a job of workers x slots would keep in flight
    towards aggregator k, and what the jobs already added hold there."""
    frames = ffi.new("uint64_t *")
    held = ffi.new("uint32_t *")
    check(
        lib.hg_sim_agg_frames(s, int(k), int(workers), int(slots), frames, held),
        "aggregator frames",
    )
    return frames[0], held[0]


def sim_job_wire(s, job):
    jid = ffi.new("uint32_t *")
    tok = ffi.new("uint32_t *")
    check(lib.hg_sim_job_wire(s, job, jid, tok), "job wire ids")
    return jid[0], tok[0]


def sim_start(s, job, method, params, xs, ys):
    """Start an allreduce; params is a ``struct hg_params *`` (cdata)."""
    if len(xs) != len(ys) or not xs:
        raise InvalidArgument("one input and one output per worker")
    n = None
    for i, (x, y) in enumerate(zip(xs, ys)):
        _f32(x, f"grads[{i}]")
        _f32(y, f"out[{i}]", writable=True)
        if n is None:
            n = x.size
        if x.size != n or y.size != n:
            raise InvalidArgument("every worker's gradient and output must have the same length")
    xp = ffi.new("float *[]", [ffi.from_buffer("float[]", x) for x in xs])
    yp = ffi.new("float *[]", [ffi.from_buffer("float[]", y, require_writable=True) for y in ys])
    check(lib.hg_sim_start(s, job, method, params, xp, n, yp), "start allreduce")
    return xp, yp  # keep alive until the allreduce ends


def sim_run(s, max_ns):
    """0 when every started allreduce ended; -ETIMEDOUT (returned, not raised)."""
    rc = lib.hg_sim_run(s, int(max_ns))
    if rc < 0 and rc != -lib_errno_timedout():
        check(rc, "run")
    return rc


def lib_errno_timedout():
    import errno

    return errno.ETIMEDOUT


def sim_worker_status(s, job, worker):
    return lib.hg_sim_worker_status(s, job, worker)


def sim_worker_error(s, job, worker):
    return ffi.string(lib.hg_sim_worker_error(s, job, worker)).decode(errors="replace")


def sim_worker_stats(s, job, worker):
    st = ffi.new("struct hg_client_stats *")
    check(lib.hg_sim_worker_stats(s, job, worker, st), "worker stats")
    return client_stats_dict(st)


def sim_worker_agg_stats(s, job, worker, k):
    st = ffi.new("struct hg_client_agg_stats *")
    check(lib.hg_sim_worker_agg_stats(s, job, worker, k, st), "worker aggregator stats")
    return agg_stats_dict(st)


def sim_rotate_key(s, job, secret, grace_ns):
    """hg_sim_rotate_key: the job's next key epoch, to its workers then its
    aggregators; returns the epoch."""
    sec = ffi.new("uint8_t[]", bytes(secret))
    try:
        return check(
            lib.hg_sim_rotate_key(s, int(job), sec, int(grace_ns)), f"rotate key of job {job}"
        )
    finally:
        lib.hg_auth_wipe(sec, len(sec))


def sim_kill_aggregator(s, k, after_ns):
    check(lib.hg_sim_kill_aggregator(s, k, int(after_ns)), f"kill aggregator {k}")


def sim_aggregators(s):
    return lib.hg_sim_aggregators(s)


def sim_aggregator_counters(s, k):
    """Aggregator k's engine counters and its NIC port's (its link), as two dicts."""
    e = lib.hg_sim_aggregator_engine(s, k)
    if e == ffi.NULL:
        raise InvalidArgument(f"no aggregator {k}")
    engine = counters_read(lambda out, n: lib.hg_engine_counters(e, out, n), "engine counters")
    return engine, port_counters(lib.hg_sim_aggregator_port(s, k))


def sim_kill_worker(s, job, worker, after_packets):
    check(lib.hg_sim_kill_worker(s, job, worker, int(after_packets)), "kill worker")


def sim_delay_start(s, job, worker, delay_ns):
    check(lib.hg_sim_delay_start(s, job, worker, int(delay_ns)), "delay start")


def sim_restart_aggregator(s, k, after_frames, incarnation):
    check(
        lib.hg_sim_restart_aggregator(s, k, int(after_frames), int(incarnation)),
        f"restart aggregator {k}",
    )


def sim_inject(s, frame):
    frame = bytes(frame)
    check(lib.hg_sim_inject(s, frame, len(frame)), "inject")


def sim_build_frame(s, fields, payload=b"", key=None, alg=None, counter=1, direction=0):
    from homagg.bindings.auth import wire_mac

    h = _fill(ffi.new("struct hg_hdr *"), fields)
    payload = bytes(payload)
    cap = lib.HG_ETH_IP_UDP_LEN + lib.HG_HDR_LEN + len(payload) + lib.HG_MAC_LEN
    out = ffi.new("uint8_t[]", cap)
    n = check(
        lib.hg_sim_build_frame(
            s,
            h,
            payload,
            len(payload),
            out,
            cap,
            wire_mac(key, alg, direction, counter) if key is not None else ffi.NULL,
        ),
        "build frame",
    )
    return bytes(ffi.buffer(out, n))


def sim_engine_counters(s):
    """The engine's counter table as a dict (homagg/counters.h names)."""
    e = lib.hg_sim_engine(s)
    return counters_read(lambda out, n: lib.hg_engine_counters(e, out, n), "engine counters")


def sim_stats(s):
    st = ffi.new("struct hg_sim_stats *")
    check(lib.hg_sim_get_stats(s, st), "sim stats")
    return {
        "now_ns": st.now_ns,
        "loop_rounds": st.loop_rounds,
        "time_advances": st.time_advances,
        "frames_tx": st.frames_tx,
        "frames_rx": st.frames_rx,
        "engine_polls": st.engine_polls,
    }


def sim_fabric_counters(s):
    """The NIC fabric's counters as a dict (homagg/nic.h names)."""
    f = lib.hg_sim_fabric(s)
    n = lib.hg_nic_fabric_counter_count()
    out = ffi.new("uint64_t[]", n)
    got = lib.hg_nic_fabric_counters(f, out, n)
    return {ffi.string(lib.hg_nic_fabric_counter_name(i)).decode(): out[i] for i in range(got)}
