"""Bindings of homagg/client.h, the worker client: create it on a port, run
an allreduce, read its stats (per-phase byte counters keyed by the phase
names of homagg.protocol).  The typed API is ``homagg.worker.Worker``."""

import errno

from homagg._native import ffi, lib
from homagg.bindings.auth import mac_isa
from homagg.bindings._args import _f32, _fill, _struct_dict, _wbuf, _buf, _length
from homagg.errors import InvalidArgument, check, error_for
from homagg.protocol import PHASES

MAX_AGGREGATORS = lib.HG_CLIENT_MAX_AGGREGATORS


def client_create(port, aggregators, secret, keep, context, **config):
    """hg_client_create on ``port`` (a ``struct hg_port *``) with the given
    fields of struct hg_client_config; ``aggregators`` a list of (ipv4 int,
    udp port); ``secret`` the job secret (bytes) or None; ``keep`` an
    object the client must not outlive (the port's owner: the client frees
    packets into it).  The configuration's copy of the secret is wiped."""
    if not 1 <= len(aggregators) <= MAX_AGGREGATORS:
        raise InvalidArgument(
            f"aggregators: 1..{MAX_AGGREGATORS} (host, port) pairs, got {len(aggregators)}"
        )
    cfg = _fill(ffi.new("struct hg_client_config *"), config)
    cfg.port = port
    aggs = ffi.new("struct hg_client_agg[]", len(aggregators))
    for a, (ipv4, udp_port) in zip(aggs, aggregators):
        a.ipv4 = ipv4
        a.udp_port = udp_port
    cfg.naggs = len(aggregators)
    cfg.aggs = aggs
    if secret is not None:
        mac_isa()  # a bad HOMAGG_MAC_ISA refuses here, by name
        cfg.auth = 1
        cfg.secret = list(secret)
    ffi.errno = 0
    client = lib.hg_client_create(cfg)
    err = ffi.errno
    cfg.secret = [0] * len(cfg.secret)  # the client keeps only its keys
    if client == ffi.NULL:
        raise error_for(-(err or errno.EINVAL), f"worker client not created ({context})")
    return ffi.gc(client, lambda c, _keep=(keep, cfg, aggs): lib.hg_client_destroy(c))


def client_rotate_key(c, secret, epoch):
    """hg_client_rotate_key: the secret of the job's next key epoch."""
    s = ffi.new("uint8_t[]", bytes(secret))
    try:
        check(lib.hg_client_rotate_key(c, s, int(epoch)), f"rotate key to epoch {epoch}")
    finally:
        lib.hg_auth_wipe(s, len(s))


def client_destroy(c):
    ffi.release(c)  # runs hg_client_destroy now


def client_params(block, workers, worker, flags, seed, nc_levels, divisor=0.0):
    """A ``struct hg_params *`` as hg_client_allreduce takes it (the client
    checks it)."""
    return ffi.new(
        "struct hg_params *",
        {
            "block": block,
            "workers": workers,
            "worker": worker,
            "flags": flags,
            "seed": seed,
            "nc_levels": nc_levels,
            "divisor": divisor,
        },
    )


def client_allreduce(c, p, method, x, y, context):
    """hg_client_allreduce of x (float32) into y; on failure the error
    names ``context`` and the client's reason."""
    _f32(x, "array")
    _f32(y, "out", writable=True)
    _length(y, x.size, "out")
    rc = lib.hg_client_allreduce(c, p, method, _buf("float[]", x), x.size, _wbuf("float[]", y))
    if rc < 0:
        text = ffi.string(lib.hg_client_error_text(c)).decode()
        raise error_for(rc, f"{context}: {text or 'failed'}")
    return rc


def client_get_stats(c):
    """The ``struct hg_client_stats`` of the client (cdata)."""
    st = ffi.new("struct hg_client_stats *")
    check(lib.hg_client_get_stats(c, st))
    return st


def client_get_agg_stats(c, k):
    """Aggregator k's share, as a dict (agg_stats_dict)."""
    ast = ffi.new("struct hg_client_agg_stats *")
    check(lib.hg_client_get_agg_stats(c, k, ast))
    return agg_stats_dict(ast)


def client_stat_fields():
    """(name, per_phase) of every field of ``struct hg_client_stats``, in
    the order of its table (HG_FOREACH_CLIENT_STAT, homagg/client.h)."""
    return [
        (ffi.string(lib.hg_client_stat_name(i)).decode(), bool(lib.hg_client_stat_per_phase(i)))
        for i in range(lib.hg_client_stat_count())
    ]


_STAT_FIELDS = client_stat_fields()


def client_stats_dict(st):
    """A ``struct hg_client_stats`` as a dict: every field of its table,
    the per-phase ones as {phase name: value}."""
    out = {}
    for name, per_phase in _STAT_FIELDS:
        v = getattr(st, name)
        out[name] = {p: v[i] for i, p in enumerate(PHASES)} if per_phase else v
    return out


def agg_stats_dict(st):
    """A ``struct hg_client_agg_stats`` as a dict, every field."""
    return _struct_dict(st, "struct hg_client_agg_stats")
