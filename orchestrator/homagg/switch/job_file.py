"""A training job: registered on its aggregators, described by a job file.

``register(controls, addresses, workers=W, ...)`` adds one job on each of
the K aggregators (aggregator k gets ``shard`` k, docs/PROTOCOL.md "Several
aggregators") and returns its description, the fields of a job file; on a
failure the aggregators that had it drop it again.  ``unregister`` removes
it.  A control is a callable taking one control request (a dict such as
``{"cmd": "stats"}``) and returning the reply: ``homagg.runs.allreduce.Switch.control``
on a local testbed, ``homagg.deploy.remote.hosts.Host.control`` on an inventory's host.
``homagg testbed up``, ``homagg up -i``, ``homagg train`` and ``homagg run``
register their jobs this way.

The job file is what a training process reads (``HOMAGG_JOB_FILE``,
homagg.torch); every field may be overridden by its variable
``HOMAGG_<FIELD>``::

    {"aggregator": "10.77.0.1:48879,10.77.0.2:48879", "job": 1234,
     "token": 567, "workers": 4, "group": "239.77.0.2", "timeout": 10.0,
     "slots": 64, "payload": 1024, "cost": {"link_mbit": 1000, "rtt_ns": 100000, ...}}

A job summed by a two-level tree (docs/PROTOCOL.md "Tree") has one job
file per worker: ``aggregator`` is the worker's leaf, ``group`` the leaf's
group and ``leaf_ids`` [i, n] its index at the leaf and the leaf's worker
count (``register_tree``).  With auth each leaf has a secret of its own,
and a worker's ``auth_file`` is its leaf's.

An authenticated job adds ``"auth_file"`` (the path of the job secret's
file on the worker's host, mode 0600: homagg.auth.load_secret) and
``"mac"`` (its MAC algorithm, "umac", "aes-gmac" or "blake2b") and, after a key
rotation, ``"key_epoch"`` (the epoch of the secret in that file, 0 at
first); the secret itself is never in a job file.

``aggregator`` lists the job's aggregators in shard order, comma separated;
``workers`` (0: not stated) must equal the world size of the ranks;
``slots`` (0: not stated) defaults to ``homagg.protocol.default_slots``
of the world size, what ``register`` gives the aggregators by default.
``cost`` is the job's cost model (homagg.cost; docs/PROTOCOL.md "The cost
model"): the link rate and the coefficients registered with the job, the
same for every rank whatever its own host's calibration; absent or {}: no
link rate, every choice by bytes.
Successive runs may share a job: a new worker process numbers its chunks
from 0 again under a new incarnation, and the first frame of each new life
empties every aggregator slot its old life left (PROTOCOL.md Part 2,
"Incarnations").  ``renew`` registers the job afresh (the same id, token
and file; counters at 0).
"""

import json
import os
import secrets

from homagg.bindings.wire import UDP_PORT
from homagg.errors import ConfigError, HomAggError

# Fields of a job file: name -> (type, default).  None: required.
JOB_FIELDS = {
    "aggregator": (str, None),
    "job": (int, None),
    "token": (int, None),
    "group": (str, ""),
    "bind": (str, "0.0.0.0"),
    "timeout": (float, 10.0),
    "slots": (int, 0),  # 0: homagg.protocol.default_slots(workers)
    "payload": (int, 1024),
    "workers": (int, 0),  # 0: not stated; else it must equal the world size
    # the job's cost model (homagg.cost.Cost fields; {}: no link rate, choices by bytes)
    "cost": (lambda v: _cost_field(v), {}),
    # an authenticated job: the path of the job secret's file (mode 0600, on
    # the worker's host; never the secret itself) and the MAC algorithm
    "auth_file": (str, ""),
    "mac": (str, ""),
    "key_epoch": (int, 0),  # the epoch of the secret in auth_file (key rotation)
    # below a tree leaf: (the worker's index at its leaf, the leaf's worker
    # count); [] / "": not in a tree
    "leaf_ids": (lambda v: _leaf_ids_field(v), ""),
    # the workers may send runs of frames as UDP_SEGMENT messages: the
    # network cuts them before the aggregators (homagg.worker.Worker udp_gso)
    "udp_gso": (lambda v: parse_bool(v), False),
}


def parse_bool(value):
    """A JSON boolean, or a variable's text (HOMAGG_UDP_GSO): 1/0,
    true/false, yes/no, on/off; anything else is a ConfigError."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"expected a boolean (1/0, true/false), got {value!r}")


def _leaf_ids_field(value):
    """The job file's ``leaf_ids`` ([i, n], or HOMAGG_LEAF_IDS "i,n") as a
    tuple, None when empty."""
    try:
        if isinstance(value, str):
            value = [int(x) for x in value.split(",")] if value.strip() else []
        value = tuple(int(x) for x in value)
    except (TypeError, ValueError):
        value = None
    if value == ():
        return None
    if value is None or len(value) != 2 or not 0 <= value[0] < value[1]:
        raise ConfigError(
            'leaf_ids: expected [i, n] ("i,n" in HOMAGG_LEAF_IDS), the '
            "worker's index at its tree leaf and the leaf's worker count, "
            "0 <= i < n"
        )
    return value


def _cost_field(value):
    """The job file's ``cost`` object (or HOMAGG_COST's JSON text), checked."""
    from homagg.cost import Cost

    if isinstance(value, str):
        value = json.loads(value) if value.strip() else {}
    c = Cost.from_dict(value, "the job's cost")
    return c.to_dict() if c.timed else {}


def job_config(env=None):
    """The job configuration from HOMAGG_JOB_FILE and HOMAGG_* variables
    (a variable wins over the file's field), with "aggregators": the list
    of (ip, port) and "aggregator" the first; ConfigError names what is
    missing or malformed."""
    env = os.environ if env is None else env
    conf = {}
    path = env.get("HOMAGG_JOB_FILE")
    if path:
        try:
            with open(path) as f:
                conf = json.load(f)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"HOMAGG_JOB_FILE={path}: cannot read the job file: {exc}") from exc
        if not isinstance(conf, dict):
            raise ConfigError(f"HOMAGG_JOB_FILE={path}: not a JSON object")
    out = {}
    for name, (kind, default) in JOB_FIELDS.items():
        var = "HOMAGG_" + name.upper()
        value = env.get(var, conf.get(name, default))
        if value is None:
            raise ConfigError(
                f"no {name} configured for the HomAgg job: set {var} (or HOMAGG_JOB_FILE, "
                "a job file written by `homagg testbed up`, `homagg up -i` or `homagg train`)"
            )
        try:
            out[name] = kind(value)
        except HomAggError as exc:
            raise ConfigError(f"{var} (or the job file's {name!r}): {exc}") from exc
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"{var}={value!r}: not a valid {getattr(kind, '__name__', name)}"
            ) from exc
    out["aggregators"] = [_address(a) for a in out["aggregator"].split(",")]
    out["aggregator"] = out["aggregators"][0]
    if out["timeout"] <= 0:
        raise ConfigError("HOMAGG_TIMEOUT must be positive")
    for key in ("rank", "world_size"):
        if key in conf:
            out[key] = int(conf[key])
    return out


def _address(text):
    host, _, port = text.strip().partition(":")
    try:
        return (host, int(port) if port else UDP_PORT)
    except ValueError as exc:
        raise ConfigError(f"HOMAGG_AGGREGATOR={text!r}: expected ip[:port]") from exc


def addresses_text(aggregators):
    """ "ip:port,ip:port" of (ip, port) pairs (or "ip:port" strings)."""
    if isinstance(aggregators, (str, tuple)):
        aggregators = [aggregators]
    return ",".join(a if isinstance(a, str) else f"{a[0]}:{a[1]}" for a in aggregators)


def write_job_file(path, **fields):
    """Write a job file HOMAGG_JOB_FILE can name (the JOB_FIELDS).
    ``aggregator``: "ip:port", one (ip, port) pair or a list of them (the
    job's aggregators in shard order).  Only its owner may read the file:
    it holds the job's token."""
    from homagg.errors import InvalidArgument

    unknown = set(fields) - set(JOB_FIELDS)
    if unknown:
        raise InvalidArgument(f"unknown job file fields {sorted(unknown)}")
    if "aggregator" in fields:
        fields["aggregator"] = addresses_text(fields["aggregator"])
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(fields, f)
    return path


def add_job_arguments(p) -> None:
    """The job options of `homagg testbed up` and `homagg up -i`."""
    p.add_argument(
        "--slots",
        type=int,
        default=None,
        help="the job's aggregator slots (default: the most, up to 64, with "
        "workers x slots <= 4096 frames: homagg.protocol.default_slots)",
    )
    p.add_argument(
        "--payload-bytes",
        type=int,
        default=None,
        metavar="BYTES",
        help="the job's payload per packet, a multiple of 4 (default: the largest the "
        "links' MTU carries, 1424 bytes at MTU 1500: docs/PROTOCOL.md "
        '"The payload of a job")',
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="the job file's timeout: an allreduce gives up after S seconds "
        "without progress (default: %(default)s)",
    )
    p.add_argument(
        "--no-cost-model",
        dest="cost_model",
        action="store_false",
        help="register no cost model with the job: its choices go by bytes even "
        "with a known link rate (default: the link rate and this host's "
        '`homagg calibrate` coefficients, docs/PROTOCOL.md "The cost model")',
    )


# --------------------------------------------------------------------------
# Registration on the aggregators


def register(
    controls,
    addresses,
    *,
    workers,
    slots=None,
    payload=1024,
    group=None,
    timeout=10.0,
    job=None,
    token=None,
    auth=None,
    mac=None,
    auth_file="",
    cost=None,
):
    """Add the job on every aggregator (controls[k] gets shard k; addresses
    are their (ip, port), in the same order) and return its job-file fields.
    ``job``/``token`` default to new random ones; ``auth``: the job secret
    of an authenticated job (it goes to the daemons only, never into the
    returned fields), ``mac`` its algorithm (None: this host's default),
    ``auth_file`` the path of the secret's file the workers read (a
    returned field).  ``slots`` unset: ``homagg.protocol.default_slots``
    of ``workers``.  If an aggregator refuses, the job is removed from
    the ones that had it and the error re-raised.  ``cost``: the job's cost
    model (homagg.cost.Cost or its dict; None: none), kept in the job file
    for its workers (the aggregators never see it)."""
    from homagg.protocol import resolve_slots

    slots = resolve_slots(slots, workers)
    if auth is not None:
        from homagg import auth as hg_auth

        mac = hg_auth.mac_name(hg_auth.mac_code(mac))
    if len(controls) != len(addresses) or not controls:
        raise ValueError("register: one address per control, at least one")
    job = 1 + secrets.randbelow(1 << 15) if job is None else int(job)
    token = secrets.randbits(31) if token is None else int(token)
    added = []
    try:
        for k, control in enumerate(controls):
            req = {
                "cmd": "add_job",
                "job": job,
                "token": token,
                "workers": workers,
                "slots": slots,
                "payload": payload,
                "shard": k,
            }
            if group:
                req["group"] = group
            if auth is not None:
                req["auth"] = bytes(auth).hex()
                req["mac"] = mac
            control(req)
            added.append(control)
    except BaseException:
        unregister(added, job, warn=lambda k, e: None)
        raise
    return {
        "aggregator": addresses_text(list(addresses)),
        "job": job,
        "token": token,
        "workers": workers,
        "group": group or "",
        "timeout": timeout,
        "slots": slots,
        "payload": payload,
        "auth_file": auth_file if auth is not None else "",
        "mac": mac if auth is not None else "",
        "cost": _cost_field(_cost_dict(cost)),
    }


def tree_leaf(worker: int, workers: int, leaves: int) -> tuple[int, int, int]:
    """Worker's place in a tree of ``leaves`` leaves (docs/PROTOCOL.md
    "Tree": leaf l serves workers floor(l W / L) .. floor((l + 1) W / L) - 1):
    (its leaf, its index there, that leaf's worker count)."""
    leaf = next(l for l in range(leaves) if worker < (l + 1) * workers // leaves)
    first = leaf * workers // leaves
    return leaf, worker - first, (leaf + 1) * workers // leaves - first


def leaf_group(group: str, leaf: int) -> str:
    """Leaf l's result group: ``group`` + 256 l (one group per leaf, so a
    leaf's results reach its own workers only)."""
    import ipaddress

    return str(ipaddress.IPv4Address(group) + 256 * leaf)


def leaf_secret_name(leaf: int, epoch: int = 0) -> str:
    """The file name of tree leaf ``leaf``'s secret of key epoch ``epoch``,
    beside its workers' job files (a local testbed's ``files_dir``, an
    inventory host's run directory)."""
    return f"leaf-{int(leaf)}.secret" if not epoch else f"leaf-{int(leaf)}-e{int(epoch)}.secret"


def register_tree(
    controls,
    aggregators,
    *,
    leaves,
    workers,
    slots=None,
    payload=1024,
    group,
    timeout=10.0,
    rto=0.005,
    job=None,
    token=None,
    cost=None,
    auth=None,
    leaf_auth=None,
    auth_files=None,
    mac=None,
):
    """A two-level tree (docs/PROTOCOL.md "Tree"): ``controls`` and
    ``aggregators`` ((ip, port, mac) of each) are the ``leaves`` leaves, then
    the root.  Leaf l gets the job with its workers (``tree_leaf``), the
    result group ``leaf_group(group, l)`` and the root as its parent (its
    retransmission timeout ``rto`` seconds, the workers'); the root gets the
    leaves as its workers.  Returns each worker's job-file fields (its leaf
    the one aggregator, ``leaf_ids``).  On a failure the aggregators that had
    the job drop it again and the error is re-raised.

    Authenticated (``auth``: the root's secret): every level has its own
    secret, so a leaf never holds the root's.  Leaf l gets ``leaf_auth[l]``
    (the secret of its workers' frames) and, for its link to the root, only
    its own key at the root and the root's reply key (derived from ``auth``
    for member l and homagg.auth.AGGREGATOR); the root gets ``auth`` with
    the leaves as its members.  ``auth_files[w]``: the path worker w reads
    its leaf's secret from (its job file's ``auth_file``); ``mac`` the
    algorithm of every level (None: this host's default).  No secret goes
    into the returned fields."""
    from homagg.protocol import resolve_slots

    if len(controls) != leaves + 1 or len(aggregators) != leaves + 1:
        raise ValueError("register_tree: L leaves and the root, one control and address each")
    if auth is not None:
        from homagg import auth as hg_auth

        if leaf_auth is None or len(leaf_auth) != leaves:
            raise ValueError("register_tree: with auth, leaf_auth: one secret per leaf")
        if auth_files is None or len(auth_files) != workers:
            raise ValueError("register_tree: with auth, auth_files: one path per worker")
        mac = hg_auth.mac_name(hg_auth.mac_code(mac))
    slots = resolve_slots(slots, workers)
    job = 1 + secrets.randbelow(1 << 15) if job is None else int(job)
    token = secrets.randbits(31) if token is None else int(token)
    root_ip, _, root_mac = aggregators[leaves]
    added = []
    try:
        for k, control in enumerate(controls):
            req = {"cmd": "add_job", "job": job, "token": token, "slots": slots, "payload": payload}
            if k == leaves:  # the root: the L leaves are its workers
                req["workers"] = leaves
                if auth is not None:
                    req.update(auth=bytes(auth).hex(), mac=mac)
            else:
                parent = {
                    "ip": root_ip,
                    "mac": root_mac,
                    "worker": k,
                    "rto_us": max(1, int(rto * 1e6)),
                    # who is missing in a tree (PROTOCOL.md): its first worker, L
                    "base": k * workers // leaves,
                    "leaves": leaves,
                }
                req.update(
                    workers=tree_leaf(k * workers // leaves, workers, leaves)[2],
                    group=leaf_group(group, k),
                    parent=parent,
                )
                if auth is not None:  # its own secret, two keys of the root's
                    req.update(auth=bytes(leaf_auth[k]).hex(), mac=mac)
                    parent.update(
                        key=hg_auth.derive_key(auth, job, k).hex(),
                        reply_key=hg_auth.derive_key(auth, job, hg_auth.AGGREGATOR).hex(),
                    )
            control(req)
            added.append(control)
    except BaseException:
        unregister(added, job, warn=lambda k, e: None)
        raise
    out = []
    for w in range(workers):
        leaf, index, size = tree_leaf(w, workers, leaves)
        ip, port, _ = aggregators[leaf]
        out.append(
            {
                "aggregator": addresses_text([(ip, port)]),
                "job": job,
                "token": token,
                "workers": workers,
                "group": leaf_group(group, leaf),
                "timeout": timeout,
                "slots": slots,
                "payload": payload,
                "auth_file": auth_files[w] if auth is not None else "",
                "mac": mac if auth is not None else "",
                "cost": _cost_field(_cost_dict(cost)),
                "leaf_ids": [index, size],
            }
        )
    return out


def rotate_tree(controls, *, leaves, job, auth, leaf_auth, give_workers=None, grace=10.0):
    """The next key epoch of every level of the running authenticated tree
    ``job`` (registered by ``register_tree``; ``controls`` the L leaves,
    then the root), in the order of docs/PROTOCOL.md "Key epochs in a tree":

    1. every leaf gets its keys of the root's new secret ``auth`` (its own
       key at the root, the root's reply key), never the secret itself;
    2. the root takes ``auth``; the leaves' frames of the old epoch are
       accepted ``grace`` seconds more;
    3. leaf by leaf: ``give_workers(l, leaf_auth[l])`` gives its workers
       their next secret (``Worker.rotate_key``; None: they have it
       already), then the leaf takes ``leaf_auth[l]`` with ``grace``.

    Returns the root's new epoch.  A failure is raised at once: the steps
    done stay done, and running the rotation again with the same secrets
    gives every level the epoch after (a level two epochs on holds no key
    of the first: re-register the tree)."""
    from homagg import auth as hg_auth

    if len(controls) != leaves + 1 or len(leaf_auth) != leaves:
        raise ValueError("rotate_tree: L leaf controls then the root's, one secret per leaf")
    grace_ms = int(grace * 1000)
    for k in range(leaves):
        controls[k](
            {
                "cmd": "rotate_key",
                "job": int(job),
                "parent": {
                    "key": hg_auth.derive_key(auth, job, k).hex(),
                    "reply_key": hg_auth.derive_key(auth, job, hg_auth.AGGREGATOR).hex(),
                },
            }
        )
    epoch = controls[leaves](
        {"cmd": "rotate_key", "job": int(job), "auth": bytes(auth).hex(), "grace_ms": grace_ms}
    )["epoch"]
    for k in range(leaves):
        if give_workers is not None:
            give_workers(k, leaf_auth[k])
        controls[k](
            {
                "cmd": "rotate_key",
                "job": int(job),
                "auth": bytes(leaf_auth[k]).hex(),
                "grace_ms": grace_ms,
            }
        )
    return int(epoch)


def _cost_dict(cost):
    from homagg.cost import Cost

    if cost is None:
        return {}
    return cost.to_dict() if isinstance(cost, Cost) else dict(cost)


def unregister(controls, job, warn=None):
    """remove_job on every aggregator.  Each failure goes to warn(k, error)
    and the others are still tried; without ``warn`` the first is raised
    after all were tried."""
    first = None
    for k, control in enumerate(controls):
        try:
            control({"cmd": "remove_job", "job": int(job)})
        except Exception as e:  # noqa: BLE001 - one aggregator never hides the others
            if warn is not None:
                warn(k, e)
            elif first is None:
                first = e
    if first is not None:
        raise first


def renew(controls, fields, secret=None):
    """Register the job of job-file ``fields`` afresh (removed, then added
    with the same id, token and settings) for a new run of its workers.
    An authenticated job's secret is ``secret``, else read from the file
    ``auth_file`` names here; a job file with a ``mac`` but no
    ``auth_file`` (an aggregator host's: the secret is on the workers'
    hosts only) needs ``secret`` (ConfigError otherwise: the job is never
    renewed without its authentication).  A rotated job (``key_epoch`` N)
    is brought to epoch N again, with the secret of the file (which is
    that epoch's)."""
    job = fields["job"]
    if secret is None and fields.get("auth_file"):
        from homagg import auth as hg_auth

        secret = hg_auth.load_secret(fields["auth_file"])
    if secret is None and fields.get("mac"):
        raise ConfigError(
            f"job {job} authenticates ({fields['mac']}): renewing it needs its "
            "secret (the file a worker's job file names as auth_file)"
        )
    unregister(controls, job, warn=lambda k, e: None)  # gone already is fine
    out = register(
        controls,
        [_address(a) for a in fields["aggregator"].split(",")],
        workers=fields["workers"],
        slots=fields["slots"],
        payload=fields["payload"],
        group=fields.get("group") or None,
        timeout=fields["timeout"],
        job=job,
        token=fields["token"],
        auth=secret,
        mac=fields.get("mac") or None,
        auth_file=fields.get("auth_file") or "",
        cost=fields.get("cost"),
    )
    epoch = int(fields.get("key_epoch") or 0) if secret is not None else 0
    if epoch:
        # the job files name key epoch N (a rotated job): the job re-added
        # at epoch 0 takes the same secret N times, without a grace period,
        # so that workers started from these files find their epoch there
        # (a key's derivation does not involve its epoch)
        for _ in range(epoch):
            for control in controls:
                control(
                    {"cmd": "rotate_key", "job": job, "auth": bytes(secret).hex(), "grace_ms": 0}
                )
        out["key_epoch"] = epoch
    return out


def tree_leaves_of(per_worker) -> int:
    """The leaves of the tree whose workers' job-file fields are
    ``per_worker`` (the distinct leaves they name; 0: a flat job)."""
    if not per_worker or not per_worker[0].get("leaf_ids"):
        return 0
    return len({f["aggregator"] for f in per_worker})


def tree_leaf_firsts(per_worker) -> list[int]:
    """The first worker of each leaf (tree_leaf's partition), in leaf order,
    of the tree whose workers' job-file fields are ``per_worker``: whose
    file holds that leaf's secret; [] for a flat job."""
    L, W = tree_leaves_of(per_worker), len(per_worker)
    return [k * W // L for k in range(L)]


def renew_tree(controls, aggregators, per_worker, leaf_auth=None):
    """``renew`` of a running tree (``register_tree``'s; ``controls`` and
    ``aggregators`` as there, the L leaves then the root): removed from every
    level, then registered again with the same id, token and settings from
    ``per_worker``, each worker's job-file fields in worker order.  An
    authenticated tree needs ``leaf_auth``, each leaf's secret as its workers'
    files hold it (ConfigError otherwise); each leaf takes it at their key
    epoch N (added at epoch 0, then given the same secret N times without a
    grace period, as ``renew`` does), and the root a new secret at epoch 0:
    only the leaves know its keys, and they get the new ones.  Returns the
    first worker's fields."""
    from homagg import auth as hg_auth

    first, W = per_worker[0], len(per_worker)
    leaves = len(controls) - 1
    if tree_leaves_of(per_worker) != leaves:
        raise ConfigError(
            f"job {first['job']}: its workers' job files name "
            f"{tree_leaves_of(per_worker)} leaves, not the {leaves} given"
        )
    if first.get("mac") and (leaf_auth is None or len(leaf_auth) != leaves):
        raise ConfigError(
            f"job {first['job']} authenticates ({first['mac']}): renewing its tree needs "
            "each leaf's secret (the file its workers' job files name as auth_file)"
        )
    if not first.get("mac"):
        leaf_auth = None
    job = int(first["job"])
    unregister(controls, job, warn=lambda k, e: None)  # gone already is fine
    register_tree(
        controls,
        aggregators,
        leaves=leaves,
        workers=W,
        slots=first["slots"],
        payload=first["payload"],
        group=first["group"],  # leaf 0's group is the tree's
        timeout=first["timeout"],
        job=job,
        token=first["token"],
        cost=first.get("cost"),
        auth=hg_auth.new_secret() if leaf_auth else None,
        leaf_auth=leaf_auth,
        auth_files=[f["auth_file"] for f in per_worker] if leaf_auth else None,
        mac=first.get("mac") or None,
    )
    for _ in range(int(first.get("key_epoch") or 0) if leaf_auth else 0):
        for k in range(leaves):
            controls[k](
                {"cmd": "rotate_key", "job": job, "auth": bytes(leaf_auth[k]).hex(), "grace_ms": 0}
            )
    return first
