"""A new secret for the running job of a deployment (``homagg rotate-key``;
docs/SECURITY.md "Rotating keys").

The job ``homagg testbed up --auth`` or ``homagg up -i --auth`` registered
takes a new secret as its next key epoch, without a restart and without a
failed allreduce.  ``rotate`` is written once over a ``KeyTarget`` (how to
read the job, put a file on every worker host, talk to every aggregator and
write the job files): ``TestbedKeys`` for a local testbed, ``InventoryKeys``
for the hosts of an inventory over SSH.  The steps, in this order:

1. the checks: the job authenticates, is no tree unless the target
   rotates trees (both do: ``homagg testbed up --leaves`` and ``homagg up
   -i --leaves``), and
   the grace period of the last rotation has passed (the record of it,
   ``rotation.json``);
2. a new secret (``secrets``) into a new file, mode 0600, on every worker
   host (``job-eN.secret`` beside the job file; over SFTP on inventory
   hosts), never on a command line, in an environment, a log or a report;
   in a tree one per leaf (``leaf-L-eN.secret``, for that leaf's workers)
   and the root's, which no file holds;
3. every job file names the new file and ``key_epoch`` N (replaced whole);
   a worker that follows the job file (homagg.torch) takes the secret
   before its next bucket (``Worker.rotate_key``): it then verifies
   replies of both epochs;
4. after ``pickup`` seconds (the longest allreduce of a worker in
   flight when the job files changed), every aggregator registers the
   secret as epoch N (control request ``rotate_key``, the secret on the
   request's stdin on inventory hosts); frames of the old epoch are
   accepted ``grace`` seconds more, then counted as ``bad_mac``.  A tree
   takes its secrets in the order of docs/PROTOCOL.md "Key epochs in a
   tree" (homagg.switch.job_file.rotate_tree): every leaf the root's next
   keys, the root its secret, then every leaf its own;
5. the record of this rotation (when, which epoch, the grace period).

A worker that learned the new secret verifies replies of the new epoch and
sends with it from the first such reply (docs/PROTOCOL.md "Key epochs"),
so none of its allreduces fails.  One that never reads the job file again
(a worker made with a fixed ``auth_file``) stops being answered after the
rotation: give it the secret with ``Worker.rotate_key`` yourself.
"""

from __future__ import annotations

import abc
import datetime
import json
import os
import shlex
import sys
import time

from homagg import auth as hg_auth
from homagg.errors import ConfigError, HomAggError, RotateError

ROTATION_FILE = "rotation.json"  # the last rotation, beside the job file
DEFAULT_GRACE = 10.0  # seconds; the control socket's default
DEFAULT_PICKUP = 2.0  # seconds between the job files and the aggregators

TREE_REFUSAL = "a tree rotates with homagg.switch.job_file.rotate_tree"


def secret_name(epoch: int) -> str:
    """The file of epoch ``epoch``'s secret, beside the job file."""
    return f"job-e{int(epoch)}.secret"


def _utc(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%H:%M:%S UTC")


class KeyTarget(abc.ABC):
    """The hosts of one deployment's standing job, as ``rotate`` needs them."""

    where: str = ""  # "testbed NAME" / "inventory PATH": for messages
    retry: str = ""  # the command that starts an authenticated job there
    renew: str = ""  # the command that registers the job afresh at its job file's epoch

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    @abc.abstractmethod
    def job(self) -> dict:
        """The job-file fields of the standing job (a worker's: with
        ``auth_file``); RotateError when there is none."""

    @abc.abstractmethod
    def last_rotation(self) -> dict | None:
        """The record ``record_rotation`` left (None: never rotated)."""

    @abc.abstractmethod
    def place_secret(self, secret: bytes, name: str) -> dict[str, str]:
        """``secret`` into file ``name`` beside the job file on every worker
        host, mode 0600; {worker host: its path}."""

    @abc.abstractmethod
    def write_job_files(self, epoch: int, files: dict[str, str]) -> None:
        """Every host's job file with ``key_epoch`` ``epoch`` and, on a worker
        host, ``auth_file`` its entry of ``files``; each file replaced whole."""

    @abc.abstractmethod
    def rotate_aggregators(self, job: int, secret: bytes, grace: float) -> dict[str, int]:
        """``rotate_key`` on every aggregator of the job; {host: new epoch}."""

    @abc.abstractmethod
    def record_rotation(self, record: dict) -> None: ...

    def leaves(self) -> int:
        """The leaves of the standing job when it is a tree this target
        rotates (0: it rotates flat jobs only)."""
        return 0

    def place_leaf_secrets(self, secrets_: list[bytes], epoch: int) -> dict[str, str]:
        """Leaf l's secret of epoch ``epoch`` on the hosts of leaf l's
        workers, mode 0600; {worker host: its path}.  A target that rotates
        flat jobs only refuses (RotateError)."""
        raise RotateError(f"{self.where} rotates flat jobs only: {TREE_REFUSAL}")

    def rotate_tree(self, job: int, root: bytes, leaf_secrets: list[bytes], grace: float):
        """Every level of the tree to its next epoch (job_file.rotate_tree);
        returns ({leaf host: its new epoch}, (root host, its new epoch)).  A
        target that rotates flat jobs only refuses (RotateError)."""
        raise RotateError(f"{self.where} rotates flat jobs only: {TREE_REFUSAL}")


def rotate(
    target: KeyTarget,
    grace: float = DEFAULT_GRACE,
    pickup: float | None = None,
    out=None,
    now=time.time,
    sleep=time.sleep,
) -> dict:
    """Give the standing job of ``target`` a new secret as its next key
    epoch (the module doc's steps); returns {"job", "epoch", "files",
    "grace", "until"}.  ``pickup``: seconds between the job files and the
    aggregators (default: DEFAULT_PICKUP, at most half the job's timeout).
    RotateError names what refused it and when a refused rotation may run."""
    out = out or sys.stdout
    if not grace > 0:
        raise RotateError(f"--grace {grace}: the grace period must be positive (seconds)")
    target.open()
    try:
        fields = target.job()
        job = fields["job"]
        leaves = target.leaves() if fields.get("leaf_ids") else 0
        if fields.get("leaf_ids") and not leaves:
            raise RotateError(f"job {job} on {target.where} is a tree job: {TREE_REFUSAL}")
        if not fields.get("mac"):
            raise RotateError(
                f"job {job} on {target.where} does not authenticate, so it has no key "
                f"to rotate: start it with authentication ({target.retry})"
            )
        if not fields.get("auth_file"):
            raise RotateError(
                f"job {job} on {target.where} authenticates but its job file names no "
                f"auth_file: start it again ({target.retry})"
            )
        timeout = float(fields.get("timeout") or 10.0)
        if pickup is None:
            pickup = min(DEFAULT_PICKUP, timeout / 2)
        if not 0 <= pickup < timeout:
            raise RotateError(
                f"--pickup {pickup:g}: must be at least 0 and less than the job's "
                f"timeout ({timeout:g} s), or a worker that switched keys early "
                "gives up before the aggregators switch"
            )
        last = target.last_rotation()
        t = now()
        if last and last.get("job") == job and t < float(last["until"]):
            raise RotateError(
                f"job {job} on {target.where} took key epoch {last['epoch']} at "
                f"{_utc(last['at'])} with a grace period of {last['grace']:g} s: "
                f"the next rotation may run from {_utc(last['until'])} "
                f"(in {float(last['until']) - t:.1f} s); the aggregators hold two "
                "epochs only"
            )
        epoch = (int(fields.get("key_epoch") or 0) + 1) % 256
        secret = hg_auth.new_secret()  # a tree: the root's
        leaf_secrets = [hg_auth.new_secret() for _ in range(leaves)]
        root = None
        try:
            if leaves:
                files = target.place_leaf_secrets(leaf_secrets, epoch)
            else:
                files = target.place_secret(secret, secret_name(epoch))
            where = sorted(set(files.values()))
            print(
                f"job {job}: the secret of key epoch {epoch} is on every worker host "
                f"({where[0] if where else '-'}, mode 0600)"
                if not leaves
                else f"job {job}: the secrets of key epoch {epoch}, one per leaf, are on "
                f"the hosts of that leaf's workers ({', '.join(where)}, mode 0600)",
                file=out,
            )
            target.write_job_files(epoch, files)
            print(f"job {job}: the job files name key epoch {epoch}", file=out)
            if pickup > 0:
                print(
                    f"job {job}: waiting {pickup:g} s for the running workers to read it",
                    file=out,
                )
                sleep(pickup)
            try:
                if leaves:
                    epochs, root = target.rotate_tree(job, secret, leaf_secrets, grace)
                else:
                    epochs = target.rotate_aggregators(job, secret, grace)
            except HomAggError as e:  # a daemon refused, or did not answer
                raise RotateError(
                    f"{e}; the job files name key epoch {epoch} already, and a worker "
                    "that took it is not answered after its next retransmission: "
                    f"register the job afresh at that epoch ({target.renew})"
                ) from None
        finally:
            del secret, leaf_secrets
        wrong = {h: e for h, e in epochs.items() if e != epoch}
        if wrong:
            raise RotateError(
                f"job {job}: the aggregators report key epochs {wrong}, the job files "
                f"name {epoch}: register the job afresh at that epoch ({target.renew})"
            )
        t = now()
        record = {"job": job, "epoch": epoch, "at": t, "grace": float(grace), "until": t + grace}
        target.record_rotation(record)
        below = f" below the root {root[0]} (its own epoch {root[1]})" if root else ""
        print(
            f"job {job}: key epoch {epoch} registered on {', '.join(epochs)}{below}; frames "
            f"of epoch {(epoch - 1) % 256} are accepted until {_utc(record['until'])}, then "
            "counted as bad_mac",
            file=out,
        )
        return {**record, "files": files}
    finally:
        target.close()


# --------------------------------------------------------------------------
# A local testbed


class TestbedKeys(KeyTarget):
    """The job of ``homagg testbed up --auth`` on local testbed ``name``:
    every namespace reads this machine's files, so one secret file and one
    job file (in the testbed's ``files_dir``) serve every worker; the
    record is the testbed state's ``"rotation"``."""

    __test__ = False  # not a pytest class

    def __init__(self, name: str, state_dir: str | None = None):
        from homagg.deploy.local.testbed import Testbed

        self.tb = Testbed.open(name, state_dir)
        self.where = f"testbed {name}"
        self.retry = f"`homagg testbed down --name {name}`, then `homagg testbed up --auth`"
        self.renew = f"`homagg testbed job --name {name}`"

    def job(self):
        from homagg.deploy.local import testbed_job

        j = testbed_job.job(self.tb)
        if j is None:
            raise RotateError(
                f"{self.where} has no job (built with --no-daemon): nothing to rotate; {self.retry}"
            )
        self.path = j.pop("file")
        return j

    def leaves(self):
        from homagg.deploy.local import testbed_job

        return testbed_job.tree_leaves(self.tb)

    def place_leaf_secrets(self, secrets_, epoch):
        from homagg.switch import job_file

        paths = []
        for k, secret in enumerate(secrets_):
            path = os.path.join(self.tb.files_dir, job_file.leaf_secret_name(k, epoch))
            if os.path.exists(path):
                os.unlink(path)  # left by an interrupted rotation: never reused
            hg_auth.create_secret_file(path, secret)
            paths.append(path)
        W, L = len(self.tb.workers), len(secrets_)
        return {
            h.name: paths[job_file.tree_leaf(i, W, L)[0]] for i, h in enumerate(self.tb.workers)
        }

    def rotate_tree(self, job, root, leaf_secrets, grace):
        from homagg.deploy.local import testbed_job
        from homagg.switch import job_file

        ctl = testbed_job.controls(self.tb)
        names = [h.name for h in self.tb.aggregators]
        L = len(leaf_secrets)
        got = []

        def leaf_epochs(k, request):  # the leaf's own epochs, for the check
            reply = ctl[k](request)
            if request.get("auth"):
                got.append((names[k], int(reply["epoch"])))
            return reply

        controls = [lambda r, k=k: leaf_epochs(k, r) for k in range(L)] + [ctl[L]]
        try:
            epoch = job_file.rotate_tree(
                controls, leaves=L, job=job, auth=root, leaf_auth=leaf_secrets, grace=grace
            )
        except HomAggError as e:
            raise RotateError(f"rotate_key on the tree: {e}") from None
        return dict(got), (names[L], int(epoch))

    def last_rotation(self):
        return self.tb.state().get("rotation")

    def place_secret(self, secret, name):
        path = os.path.join(self.tb.files_dir, name)
        if os.path.exists(path):
            os.unlink(path)  # left by an interrupted rotation: never reused
        hg_auth.create_secret_file(path, secret)
        return {h.name: path for h in self.tb.workers}

    def write_job_files(self, epoch, files):
        from homagg.deploy.local import testbed_job
        from homagg.switch import job_file

        paths = testbed_job.job_files(self.tb)
        if len(set(paths)) == 1:  # a flat job: one file for every worker
            paths, hosts = paths[:1], [self.tb.workers[0].name]
        else:  # a tree: each worker's own, naming its leaf's secret
            hosts = [h.name for h in self.tb.workers]
        for path, host in zip(paths, hosts):
            with open(path) as f:
                fields = json.load(f)
            fields.update(key_epoch=epoch, auth_file=files[host])
            tmp = path + ".new"
            job_file.write_job_file(tmp, **fields)
            os.replace(tmp, path)

    def rotate_aggregators(self, job, secret, grace):
        from homagg.switch.daemon import Switch

        out, bad = {}, {}
        for h in self.tb.aggregators:  # each tried: one failing never hides the others
            try:
                sw = Switch(self.tb, self.tb.files_dir, host=h.name)
                with sw.client() as c:
                    out[h.name] = int(c.rotate_key(job, secret, grace=grace)["epoch"])
            except HomAggError as e:
                bad[h.name] = e
        if bad:
            raise RotateError(
                f"rotate_key failed on {len(bad)} host(s): "
                + "; ".join(f"host '{n}': {e}" for n, e in bad.items())
            )
        return out

    def record_rotation(self, record):
        self.tb.note(rotation=record)


# --------------------------------------------------------------------------
# The hosts of an inventory


class InventoryKeys(KeyTarget):
    """The job of ``homagg up -i --auth`` on the hosts of an inventory, over
    SSH: the secret by SFTP into every worker host's run directory
    (homagg.deploy.remote.secret.put), the job file of every host rewritten
    (homagg.deploy.remote.hosts.Host.put_job_file), ``rotate_key`` on every
    aggregator's control socket (Host.control: the request on stdin), the
    record in every aggregator host's run directory.  A tree (``homagg up
    -i --leaves L``): leaf l's new secret on the hosts of leaf l's workers
    only (INSTALL_DIR/run/leaf-l-eN.secret), the root's in no file."""

    def __init__(self, inventory_path: str, out=None):
        from homagg.deploy.remote import inventory as inv

        self.inv = inv.load(inventory_path)
        self.out = out or sys.stdout
        self.where = f"inventory {self.inv.path}"
        self.retry = f"`homagg down -i {self.inv.path}`, then `homagg up -i {self.inv.path} --auth`"
        self.renew = self.retry
        self.hosts = []

    def open(self):
        from homagg.deploy.remote import hosts as rh

        self.hosts = rh.open_hosts(self.inv, self.out, consequence="no key was rotated")
        self.aggs = [r for r in self.hosts if r.h.role == "aggregator"]
        self.workers = [r for r in self.hosts if r.h.role == "worker"]

    def close(self):
        for r in self.hosts:
            r.close()
        self.hosts = []

    def _parallel(self, fn, sessions, what):
        """fn on every session at once; one RotateError naming every host
        that failed (after all ran)."""
        from homagg.deploy.remote import ssh

        def one(r):
            try:
                return fn(r)
            except Exception as e:  # noqa: BLE001 - collected per host below
                return e

        res = ssh.parallel(one, sessions, self.inv.settings.parallel)
        bad = {n: v for n, v in res.items() if isinstance(v, Exception)}
        if bad:
            raise RotateError(
                f"{what} failed on {len(bad)} host(s): "
                + "; ".join(f"host '{n}': {type(e).__name__}: {e}" for n, e in bad.items())
            )
        return res

    def job(self):
        from homagg.deploy.remote import hosts as rh

        if not self.aggs or not self.workers:
            raise RotateError(f"{self.where} names no aggregator or no worker host")
        own = self._parallel(lambda r: r.job_file_fields(), self.hosts, "reading the job files")
        missing = [n for n, f in own.items() if not f]
        if missing:
            raise RotateError(
                f"no job file {rh.job_file_path(self.hosts[0].h)} on {', '.join(missing)}: "
                f"no job runs there to rotate ({self.retry})"
            )
        self.own = own
        jobs = {f["job"] for f in own.values()}
        if len(jobs) != 1:
            raise RotateError(f"the hosts' job files name different jobs {sorted(jobs)}")
        return own[self.workers[0].h.name]

    def leaves(self):
        """The leaves of a tree `up -i --leaves L` made: the distinct leaves
        its worker hosts' job files name, which are the inventory's first L
        aggregator hosts, the last one the root (hosts.check_tree)."""
        from homagg.deploy.remote import hosts as rh

        named = {self.own[r.h.name]["aggregator"] for r in self.workers}
        L = len(self.aggs) - 1
        leaf_addrs = {a.h.address for a in self.aggs[:L]}
        if len(named) != L or {n.rsplit(":", 1)[0] for n in named} != leaf_addrs:
            raise RotateError(
                f"the worker hosts' job files name the leaves {sorted(named)}, but "
                f"{self.where} has {len(self.aggs)} aggregator hosts: a tree of L leaves "
                "is the first L of them below the last one "
                f"({rh.job_file_path(self.workers[0].h)}); {self.retry} --leaves L"
            )
        return L

    def place_leaf_secrets(self, secrets_, epoch):
        from homagg.deploy.remote import hosts as rh
        from homagg.deploy.remote import secret as hsecret
        from homagg.switch import job_file

        W, L = len(self.workers), len(secrets_)
        leaf_of = {r.h.name: job_file.tree_leaf(i, W, L)[0] for i, r in enumerate(self.workers)}

        def one(r):
            path = rh.tree_secret_file(r.h, leaf_of[r.h.name], epoch)
            hsecret.put(r, path, secrets_[leaf_of[r.h.name]])
            return path

        return self._parallel(one, self.workers, "placing the leaves' new secrets")

    def rotate_tree(self, job, root, leaf_secrets, grace):
        from homagg.switch import job_file

        L = len(leaf_secrets)
        got = []

        def leaf(k, request):  # the leaf's own epochs, for the check
            reply = self.aggs[k].control(request)
            if request.get("auth"):
                got.append((self.aggs[k].h.name, int(reply["epoch"])))
            return reply

        controls = [lambda r, k=k: leaf(k, r) for k in range(L)] + [self.aggs[L].control]
        try:
            epoch = job_file.rotate_tree(
                controls, leaves=L, job=job, auth=root, leaf_auth=leaf_secrets, grace=grace
            )
        except HomAggError as e:
            raise RotateError(f"rotate_key on the tree: {e}") from None
        return dict(got), (self.aggs[L].h.name, int(epoch))

    def last_rotation(self):
        r = self.aggs[0].run(f"cat {shlex.quote(self._record_path(self.aggs[0]))}", check=False)
        if r.exited != 0 or not r.stdout.strip():
            return None
        try:
            return json.loads(r.stdout)
        except ValueError:
            return None

    def _record_path(self, r):
        from homagg.deploy.remote import hosts as rh

        return f"{rh.rundir(r.h)}/{ROTATION_FILE}"

    def place_secret(self, secret, name):
        from homagg.deploy.remote import hosts as rh
        from homagg.deploy.remote import secret as hsecret

        def one(r):
            path = f"{rh.rundir(r.h)}/{name}"
            hsecret.put(r, path, secret)
            return path

        return self._parallel(one, self.workers, "placing the new secret")

    def write_job_files(self, epoch, files):
        from homagg.deploy.remote import hosts as rh

        def one(r):
            f = dict(self.own[r.h.name], key_epoch=epoch)
            if r.h.name in files:
                f["auth_file"] = files[r.h.name]
            r.put_job_file(rh.job_file_path(r.h), f)

        self._parallel(one, self.hosts, "writing the job files")

    def rotate_aggregators(self, job, secret, grace):
        req = {
            "cmd": "rotate_key",
            "job": int(job),
            "auth": bytes(secret).hex(),
            "grace_ms": int(grace * 1000),
        }
        res = self._parallel(lambda r: int(r.control(req)["epoch"]), self.aggs, "rotate_key")
        return res

    def record_rotation(self, record):
        text = json.dumps(record)
        self._parallel(
            lambda r: r.run(
                f"(umask 077 && printf %s {shlex.quote(text)} > "
                f"{shlex.quote(self._record_path(r))})"
            ),
            self.aggs,
            "recording the rotation",
        )


def target(testbed: str | None, inventory: str | None, state_dir: str | None = None, out=None):
    """The KeyTarget of ``--testbed NAME`` or ``-i INVENTORY``."""
    if bool(testbed) == bool(inventory):
        raise ConfigError("name the deployment: --testbed NAME or -i INVENTORY (one of them)")
    if inventory:
        if state_dir:
            raise ConfigError(
                "--state-dir names a local testbed's state (--testbed); inventory "
                "hosts keep theirs in INSTALL_DIR/run/"
            )
        return InventoryKeys(inventory, out)
    return TestbedKeys(testbed, state_dir)
