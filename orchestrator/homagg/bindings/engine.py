"""Bindings of homagg/engine.h, the aggregation engine.

The engine is the cffi ``struct hg_engine *`` ``engine_create`` returns
(freed by the garbage collector, or now by ``engine_destroy``); counters
come back as dicts keyed by the names of homagg/counters.h.  The typed API
is ``homagg.engine.Engine``.
"""

from homagg._native import ffi, lib
from homagg.bindings.auth import mac_isa
from homagg.bindings._args import _fill
from homagg.bindings.wire import counters_read, worker_counter_names
from homagg.errors import InvalidArgument, check

F_UDP_CSUM = lib.HG_ENGINE_F_UDP_CSUM
AUTH_SECRET_LEN = lib.HG_AUTH_SECRET_LEN

JOB_FIELDS = (
    "job",
    "token",
    "workers",
    "slots",
    "payload_bytes",
    "group_ipv4",
    "shard",
    "incarnation",
    "auth",
    "up",
    "up_shard",
    "up_worker",
    "up_base",
    "up_leaves",
    "up_ipv4",
    "up_port",
    "up_group",
    "up_rto_ns",
    "up_give_up_ns",
    "mac",
)


def engine_create(port, **config):
    """hg_engine_create on ``port`` (a ``struct hg_port *``) with
    hg_engine_config_init's defaults and the given fields of struct
    hg_engine_config."""
    c = ffi.new("struct hg_engine_config *")
    lib.hg_engine_config_init(c)
    c.port = port
    e = lib.hg_engine_create(_fill(c, config))
    if e == ffi.NULL:
        raise InvalidArgument(
            "hg_engine_create failed (config out of range, unsupported ISA, or no memory)"
        )
    return ffi.gc(e, lib.hg_engine_destroy)


def engine_destroy(e):
    ffi.release(e)  # runs hg_engine_destroy now


def engine_set_staging(e, staged):
    check(lib.hg_engine_set_staging(e, bool(staged)), "hg_engine_set_staging")


def _secret(secret, what="auth"):
    secret = bytes(secret)
    if len(secret) != AUTH_SECRET_LEN:
        raise InvalidArgument(f"{what}: a job secret has {AUTH_SECRET_LEN} bytes")
    return secret


def engine_add_job(e, secret=None, up_keys=None, **job):
    """hg_engine_add_job with the given fields of struct hg_job_config;
    ``secret`` (AUTH_SECRET_LEN bytes) makes it an authenticated job; a
    leaf's ``up_keys`` are (its key at the root, the root's aggregator
    key).  The configuration's copies are wiped after the call."""
    j = _fill(ffi.new("struct hg_job_config *"), job)
    if secret is not None or up_keys is not None:
        mac_isa()  # a bad HOMAGG_MAC_ISA refuses here, by name
    if secret is not None:
        j.auth = 1
        j.secret = list(_secret(secret))
    if up_keys is not None:
        k, r = (bytes(x) for x in up_keys)
        if len(k) != AUTH_SECRET_LEN or len(r) != AUTH_SECRET_LEN:
            raise InvalidArgument(f"up_keys: two keys of {AUTH_SECRET_LEN} bytes")
        j.up_key = list(k)
        j.up_reply_key = list(r)
    try:
        check(lib.hg_engine_add_job(e, j), f"add job {job['job']}")
    finally:
        lib.hg_auth_wipe(j, ffi.sizeof("struct hg_job_config"))


def engine_rotate_key(e, job, secret, grace_ns):
    """hg_engine_rotate_key: register the job's next key epoch; its number."""
    s = ffi.new("uint8_t[]", _secret(secret, "rotate_key"))
    try:
        return check(
            lib.hg_engine_rotate_key(e, int(job), s, int(grace_ns)), f"rotate key of job {job}"
        )
    finally:
        lib.hg_auth_wipe(s, len(s))


def engine_rotate_up_key(e, job, key, reply_key):
    """hg_engine_rotate_up_key: a tree leaf's keys of the root's next key
    epoch; the leaf's next upward epoch."""
    k, r = (bytes(x) for x in (key, reply_key))
    if len(k) != AUTH_SECRET_LEN or len(r) != AUTH_SECRET_LEN:
        raise InvalidArgument(f"rotate_up_key: two keys of {AUTH_SECRET_LEN} bytes")
    kb, rb = ffi.new("uint8_t[]", k), ffi.new("uint8_t[]", r)
    try:
        return check(
            lib.hg_engine_rotate_up_key(e, int(job), kb, rb), f"rotate upward keys of job {job}"
        )
    finally:
        lib.hg_auth_wipe(kb, len(kb))
        lib.hg_auth_wipe(rb, len(rb))


def engine_job_config(e, job):
    """The job's configuration as the engine holds it (JOB_FIELDS)."""
    j = ffi.new("struct hg_job_config *")
    check(lib.hg_engine_job_config(e, job, j), f"job {job}")
    return {k: getattr(j, k) for k in JOB_FIELDS}


def engine_remove_job(e, job):
    check(lib.hg_engine_remove_job(e, job), f"remove job {job}")


def engine_job_count(e):
    return lib.hg_engine_job_count(e)


def engine_poll(e):
    return check(lib.hg_engine_poll(e), "hg_engine_poll")


def engine_process(e, pkts, n):
    return check(lib.hg_engine_process(e, pkts, n), "hg_engine_process")


def engine_timers(e):
    return check(lib.hg_engine_timers(e), "hg_engine_timers")


def engine_next_deadline(e):
    """The next upward timer (port clock, ns), or None."""
    t = lib.hg_engine_next_deadline(e)
    return None if t == 2**64 - 1 else t


def engine_counters(e):
    return counters_read(lambda out, n: lib.hg_engine_counters(e, out, n), "hg_engine_counters")


def engine_job_counters(e, job):
    return counters_read(
        lambda out, n: lib.hg_engine_job_counters(e, job, out, n), f"job {job} counters"
    )


def engine_worker_counters(e, job, worker):
    names = worker_counter_names()
    out = ffi.new("uint64_t[]", len(names))
    got = check(
        lib.hg_engine_worker_counters(e, job, worker, out, len(names)),
        f"job {job} worker {worker} counters",
    )
    return dict(zip(names[:got], list(out)[:got]))


def engine_job_open_sets(e, job):
    return check(lib.hg_engine_job_open_sets(e, job), f"job {job} open sets")
