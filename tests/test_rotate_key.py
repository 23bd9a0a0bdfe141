"""`homagg rotate-key`: a new secret for a running authenticated job.

- The refusals, on a target double (no root): a job without
  authentication, a tree job, a rotation inside the grace period of the
  last one (each a sentence, the last naming when it may run), a pickup
  time the job's timeout does not allow; the order of the steps (the
  secret and the job files before the aggregators).
- homagg.torch's HookState follows its job file between buckets: a new
  key epoch and secret file are given to its worker; a file read while
  half written, or an epoch it cannot take, leaves the bucket alone.
- On a DPDK testbed (`homagg testbed up --auth`): two rank processes run
  allreduces through HookState in a loop while `homagg rotate-key` runs;
  none fails, every sum is bit-exact against the numpy reference, both
  ranks end on epoch 1, the job file names it, the new secret file has
  mode 0600 and the secret shows in no log, output, command line or
  environment; a second rotation inside the grace period is refused;
  after it, a frame MACed with the old key is counted as bad_mac while
  one MACed with the new key is summed; `homagg testbed job` renews the
  rotated job at its epoch and a worker from the job file is exact.
- A testbed without --auth: the command says the job has no key.
"""

import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from helpers import require, wait_for

from homagg.deploy import rotate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=os.path.join(REPO, "orchestrator"))
N = 20000  # elements per allreduce
GRACE = 20  # s: outlasts the second rotate-key command's start on a loaded host


# --------------------------------------------------------------------------
# The steps and refusals, on a target double


class FakeTarget(rotate.KeyTarget):
    where = "testbed fake"
    retry = "`homagg testbed up --auth`"

    def __init__(self, fields, last=None, epochs=None):
        self.fields, self.last, self.calls = dict(fields), last, []
        self.epochs = epochs

    def job(self):
        self.calls.append("job")
        return dict(self.fields)

    def last_rotation(self):
        return self.last

    def place_secret(self, secret, name):
        self.calls.append(("place", name))
        self.secret = secret
        return {"w0": f"/f/{name}", "w1": f"/f/{name}"}

    def write_job_files(self, epoch, files):
        self.calls.append(("files", epoch))

    def rotate_aggregators(self, job, secret, grace):
        assert secret == self.secret
        self.calls.append(("aggregators", grace))
        return self.epochs or {"agg": (self.fields.get("key_epoch", 0) + 1) % 256}

    def record_rotation(self, record):
        self.calls.append("record")
        self.last = record


AUTH_JOB = {"job": 7, "mac": "blake2b", "auth_file": "/f/job.secret", "timeout": 10.0}


def _rotate(t, **kw):
    sleeps = []
    out = open(os.devnull, "w")
    res = rotate.rotate(t, out=out, sleep=sleeps.append, **kw)
    return res, sleeps


def test_steps_in_order_and_the_record():
    t = FakeTarget(dict(AUTH_JOB, key_epoch=255))
    res, sleeps = _rotate(t, grace=3.0, pickup=1.5, now=lambda: 1000.0)
    assert t.calls == [
        "job",
        ("place", "job-e0.secret"),
        ("files", 0),
        ("aggregators", 3.0),
        "record",
    ]
    assert sleeps == [1.5]  # between the job files and the aggregators
    assert res["epoch"] == 0 and res["until"] == 1003.0 and t.last["grace"] == 3.0
    assert len(t.secret) == 32
    # the default pickup: 2 s, at most half the job's timeout
    _, sleeps = _rotate(FakeTarget(AUTH_JOB))
    assert sleeps == [2.0]
    _, sleeps = _rotate(FakeTarget(dict(AUTH_JOB, timeout=1.0)))
    assert sleeps == [0.5]


class FakeTree(FakeTarget):
    """A target that rotates trees: two leaves, worker w0 at the first."""

    def leaves(self):
        return 2

    def place_leaf_secrets(self, secrets_, epoch):
        self.calls.append(("leaf secrets", epoch))
        self.leaf_secrets = list(secrets_)
        return {"w0": f"/f/leaf-0-e{epoch}.secret", "w1": f"/f/leaf-1-e{epoch}.secret"}

    def rotate_tree(self, job, root, leaf_secrets, grace):
        assert leaf_secrets == self.leaf_secrets and root not in leaf_secrets
        assert len(root) == 32 and len(set(leaf_secrets)) == 2
        self.calls.append(("tree", grace))
        e = (self.fields.get("key_epoch", 0) + 1) % 256
        return {"agg": e, "agg1": e}, ("agg2", 4)


def test_a_tree_gets_a_secret_per_leaf_before_any_aggregator_turns():
    """A tree job on a target that rotates trees: one new secret per leaf
    placed for its workers, the job files, then the tree's rotation (the
    root's secret placed nowhere); a leaf on another epoch is an error."""
    t = FakeTree(dict(AUTH_JOB, leaf_ids=[0, 1], key_epoch=3))
    res, sleeps = _rotate(t, grace=4.0, pickup=0.5, now=lambda: 50.0)
    assert t.calls == ["job", ("leaf secrets", 4), ("files", 4), ("tree", 4.0), "record"]
    assert sleeps == [0.5] and res["epoch"] == 4 and res["files"]["w1"].endswith("leaf-1-e4.secret")

    class Behind(FakeTree):
        def rotate_tree(self, job, root, leaf_secrets, grace):
            return {"agg": 1, "agg1": 2}, ("agg2", 1)

    with pytest.raises(rotate.RotateError) as e:
        _rotate(Behind(dict(AUTH_JOB, leaf_ids=[0, 1], key_epoch=1)), pickup=0.0)
    assert "the aggregators report key epochs {'agg': 1}, the job files name 2" in str(e.value)


def test_refusals_are_sentences_and_touch_nothing():
    cases = [
        (dict(AUTH_JOB, mac="", auth_file=""), {}, "does not authenticate, so it has no key"),
        (dict(AUTH_JOB, leaf_ids=[0, 2]), {}, rotate.TREE_REFUSAL),
        (AUTH_JOB, {"pickup": 10.0}, "less than the job's timeout (10 s)"),
        (AUTH_JOB, {"grace": 0.0}, "the grace period must be positive"),
    ]
    for fields, kw, sentence in cases:
        t = FakeTarget(fields)
        with pytest.raises(rotate.RotateError) as e:
            _rotate(t, **kw)
        assert sentence in str(e.value), str(e.value)
        assert not any(isinstance(c, tuple) for c in t.calls), t.calls
    assert rotate.TREE_REFUSAL in open(os.path.join(REPO, "docs", "SECURITY.md")).read()
    # a target of flat jobs only refuses the tree steps too, with the same sentence
    flat = FakeTarget(AUTH_JOB)
    for step in (
        lambda: flat.place_leaf_secrets([b"k" * 32], 1),
        lambda: flat.rotate_tree(7, b"r" * 32, [b"k" * 32], 1.0),
    ):
        with pytest.raises(rotate.RotateError, match="rotates flat jobs only: a tree rotates"):
            step()


def test_a_second_rotation_inside_the_grace_period_is_refused_naming_when():
    t = FakeTarget(AUTH_JOB)
    clock = [100.0]
    _rotate(t, grace=30.0, pickup=0.0, now=lambda: clock[0])
    t.fields["key_epoch"] = 1
    t.calls.clear()
    clock[0] = 110.0
    with pytest.raises(rotate.RotateError) as e:
        _rotate(t, grace=30.0, pickup=0.0, now=lambda: clock[0])
    msg = str(e.value)
    assert "took key epoch 1 at 00:01:40 UTC with a grace period of 30 s" in msg, msg
    assert "the next rotation may run from 00:02:10 UTC (in 20.0 s)" in msg, msg
    assert t.calls == ["job"]
    clock[0] = 130.0  # the grace period has passed
    res, _ = _rotate(t, grace=30.0, pickup=0.0, now=lambda: clock[0])
    assert res["epoch"] == 2
    # a record of another job (the job was registered again) does not refuse
    t.fields.update(job=8, key_epoch=0)
    assert _rotate(t, pickup=0.0, now=lambda: 131.0)[0]["epoch"] == 1


def test_aggregators_on_another_epoch_are_an_error():
    t = FakeTarget(AUTH_JOB, epochs={"agg": 1, "agg1": 3})
    with pytest.raises(rotate.RotateError, match=r"report key epochs \{'agg1': 3\}"):
        _rotate(t, pickup=0.0)
    assert "record" not in t.calls


# --------------------------------------------------------------------------
# HookState follows its job file


def test_hook_state_takes_a_new_epoch_from_its_job_file_between_buckets(tmp_path, caplog):
    import homagg.torch as hgt
    from homagg import auth
    from homagg.switch import job_file

    s0 = auth.create_secret_file(tmp_path / "job.secret")
    path = str(tmp_path / "job.json")
    fields = dict(
        aggregator="127.0.0.1:48879",
        job=5,
        token=6,
        workers=2,
        auth_file=str(tmp_path / "job.secret"),
        mac="blake2b",
    )
    job_file.write_job_file(path, **fields)
    with open(path) as f:  # rank and world size without torch.distributed
        j = dict(json.load(f), rank=0, world_size=2)
    with open(path, "w") as f:
        json.dump(j, f)
    st = hgt.HookState(env={"HOMAGG_JOB_FILE": path}, fallback=False, baseline=False)
    try:
        assert st.worker.key_epoch == 0
        st._follow_job_file()  # unchanged epoch: nothing to do
        assert st.worker.key_epoch == 0
        s1 = auth.create_secret_file(tmp_path / "job-e1.secret")
        assert s1 != s0

        def rewrite(text):
            tmp = path + ".new"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, path)

        rewrite('{"aggregator": "127.0.0.1:48879", "job": 5, "tok')  # half written
        st._follow_job_file()
        assert st.worker.key_epoch == 0 and "read again next bucket" in caplog.text
        rewrite(json.dumps(dict(j, key_epoch=1, auth_file=str(tmp_path / "job-e1.secret"))))
        st._follow_job_file()
        assert st.worker.key_epoch == 1
        # an epoch the worker cannot take (it missed one): logged, the bucket goes on
        rewrite(json.dumps(dict(j, key_epoch=3, auth_file=str(tmp_path / "job-e1.secret"))))
        st._follow_job_file()
        assert st.worker.key_epoch == 1 and "key epoch 3 not taken" in caplog.text
    finally:
        st.close()


# --------------------------------------------------------------------------
# On a DPDK testbed


def _testbed_cli(sd, *args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "homagg.cli.testbed", "--state-dir", sd, *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=timeout,
    )


def _rotate_cli(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "homagg.cli", "rotate-key", *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=timeout,
    )


def gradient(i, rank):
    """Round i's gradient of a rank (the rank processes build the same)."""
    rng = np.random.default_rng(1000 * i + rank)
    x = rng.standard_normal(N).astype(np.float32)
    x[rng.random(N) < 0.6] = 0
    return x


RANK = r"""
import json, os, sys
import numpy as np
import torch
import torch.distributed as dist
import homagg.torch as hgt
sys.path.insert(0, sys.argv[6])
from test_rotate_key import gradient
rank, init, out, status, stop = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
st = hgt.HookState(fallback=False, baseline=False)
ys, epochs = [], []
for i in range(5000):
    y = st.reduce(0, torch.from_numpy(gradient(i, rank))).wait()
    ys.append(y.numpy().copy())
    epochs.append(st.worker.key_epoch)
    with open(status + ".new", "w") as f:
        json.dump({"rounds": i + 1, "epochs": epochs}, f)
    os.replace(status + ".new", status)
    flag = torch.tensor([int(os.path.exists(stop))])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item():
        break
np.save(out, np.stack(ys))
st.close()
dist.destroy_process_group()
"""


class _ProcScan:
    """Every process's command line and environment, read from /proc every
    20 ms while a command runs."""

    def __init__(self):
        self.seen, self.stop_ = set(), threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop_.is_set():
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    for part in ("cmdline", "environ"):
                        try:
                            with open(f"/proc/{pid}/{part}", "rb") as f:
                                self.seen.add(f.read())
                        except OSError:
                            pass
            self.stop_.wait(0.02)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop_.set()
        self.t.join(10)

    def holds(self, text):
        needles = (text.lower().encode(), text.upper().encode())
        return any(n in blob for blob in self.seen for n in needles)


def _files_holding(top, text):
    needles = (text.lower().encode(), text.upper().encode())
    out = []
    for d, _, names in os.walk(top):
        for n in names:
            p = os.path.join(d, n)
            try:
                with open(p, "rb") as f:
                    data = f.read()
            except OSError:
                continue
            if any(x in data for x in needles) and not n.endswith(".secret"):
                out.append(p)
    return out


def _send_from(tb, host, payload, dst):
    """One UDP datagram from ``host``'s namespace (a thread in it)."""
    from pyroute2.netns import setns

    err = []

    def go():
        try:
            setns(tb.host(host).netns, flags=0)  # this thread only
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.sendto(payload, dst)
        except Exception as e:  # noqa: BLE001 - raised below
            err.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(30)
    assert not err and not t.is_alive(), err


def _ranks_through_rotation(tb, sd, paths, tmp_path):
    """Two rank processes (each with HOMAGG_JOB_FILE ``paths[r]``) run
    allreduces through HookState in a loop while `homagg rotate-key` runs;
    a second rotation inside the grace period is refused.  Every round is
    checked bit for bit against the numpy reference, and each rank's key
    epochs go 0 then 1.  Returns (the rotation, the refused one, the ranks'
    output, the /proc scan made meanwhile)."""
    from reference import allreduce as oracle_allreduce

    stop = str(tmp_path / "stop")
    init = f"tcp://{tb.workers[0].ip}:{29500 + secrets.randbelow(2000)}"
    procs, outs, status = [], [], []
    with _ProcScan() as scan:
        for r, h in enumerate(tb.workers):
            outs.append(str(tmp_path / f"rank-{r}.npy"))
            status.append(str(tmp_path / f"status-{r}.json"))
            env = dict(
                ENV,
                HOMAGG_JOB_FILE=paths[r],
                HOMAGG_BIND=h.ip,
                GLOO_SOCKET_IFNAME=h.ifname,
                OMP_NUM_THREADS="1",
            )
            procs.append(
                tb.run_in(
                    h.name,
                    [
                        sys.executable,
                        "-c",
                        RANK,
                        r,
                        init,
                        outs[-1],
                        status[-1],
                        stop,
                        REPO + "/tests",
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=env,
                    text=True,
                )
            )
        logs = []
        try:

            def rounds():
                out = []
                for p, s in zip(procs, status):
                    assert p.popen.poll() is None, p.popen.stderr.read()[-3000:]
                    try:
                        with open(s) as f:
                            out.append(json.load(f)["epochs"])
                    except (OSError, ValueError):
                        out.append([])
                return out

            wait_for(lambda: all(len(e) >= 3 for e in rounds()), 120, "3 rounds on each rank")
            rot = _rotate_cli(
                "--testbed", tb.name, "--state-dir", sd, "--grace", str(GRACE), "--pickup", "1"
            )
            assert rot.returncode == 0, rot.stdout + rot.stderr
            # a second one inside the grace period: refused, saying when it may run
            again = _rotate_cli("--testbed", tb.name, "--state-dir", sd)
            assert again.returncode == 1, again.stdout + again.stderr
            assert (
                f"with a grace period of {GRACE} s: the next rotation may run from" in again.stderr
            )
            # both ranks go on, on epoch 1
            wait_for(
                lambda: all(e.count(1) >= 3 for e in rounds()),
                120,
                "3 rounds on epoch 1 on each rank",
            )
            open(stop, "w").close()
            for p in procs:
                out, err = p.popen.communicate(timeout=120)
                logs.append(out + err)
                assert p.popen.returncode == 0, err[-3000:]
        finally:
            open(stop, "w").close()
            for p in procs:
                p.stop()

    # every round exact, on both ranks; epochs 0 then 1
    ys = [np.load(o) for o in outs]
    assert ys[0].shape == ys[1].shape and ys[0].shape[0] >= 6
    for i in range(ys[0].shape[0]):
        want = oracle_allreduce([gradient(i, r) for r in range(2)], 4096) / np.float32(2)
        for r in range(2):
            assert ys[r][i].view(np.uint32).tobytes() == want.view(np.uint32).tobytes(), (i, r)
    for s in status:
        epochs = json.load(open(s))["epochs"]
        assert epochs[0] == 0 and epochs[-1] == 1 and epochs == sorted(epochs), epochs
    return rot, again, logs, scan


def _need_switch():
    """Root and a built homagg-switch, or the test is skipped saying why."""
    from homagg.switch.daemon import find_switch

    require(os.geteuid() == 0, "needs root")
    try:
        find_switch()
    except Exception as e:  # noqa: BLE001 - not built: skipped with the reason
        require(False, str(e))


@pytest.fixture
def auth_testbed(tmp_path):
    from homagg.deploy.local.testbed import Testbed

    _need_switch()
    sd, name = str(tmp_path / "testbeds"), "r" + secrets.token_hex(5)
    up = _testbed_cli(sd, "up", "--workers", "2", "--name", name, "--auth", "--timeout", "10")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield Testbed.open(name, sd), sd, up
    finally:
        down = _testbed_cli(sd, "down", "--name", name)
        assert down.returncode == 0, down.stdout + down.stderr


@pytest.mark.root
@pytest.mark.netns
@pytest.mark.dpdk
@pytest.mark.timeout(400)
def test_rotate_key_on_a_testbed_while_ranks_run_allreduces(auth_testbed, tmp_path):
    from homagg import auth
    from homagg.deploy.local import testbed_job
    from homagg.engine import Addr, build_frame
    from homagg.switch.daemon import Switch

    from auth_rig import ref_key

    tb, sd, up = auth_testbed
    job = testbed_job.job(tb)
    path = job["file"]
    assert "authenticated" in up.stdout and job["auth_file"].endswith("job.secret")
    old = auth.load_secret(job["auth_file"])
    assert os.stat(job["auth_file"]).st_mode & 0o777 == 0o600
    jobid, mac = job["job"], job["mac"]

    def stats():
        sw = Switch(tb, tb.files_dir, host="agg")
        with sw.client() as c:
            return c.stats()["stats"]

    rot, again, logs, scan = _ranks_through_rotation(tb, sd, [path] * 2, tmp_path)
    assert f"job {jobid}: key epoch 1 registered on agg;" in rot.stdout, rot.stdout

    # the job file names the new epoch and its file; the file is 0600
    with open(path) as f:
        fields = json.load(f)
    assert fields["key_epoch"] == 1
    assert fields["auth_file"] == os.path.join(tb.files_dir, "job-e1.secret")
    assert os.stat(fields["auth_file"]).st_mode & 0o777 == 0o600
    new = auth.load_secret(fields["auth_file"])
    assert new != old and auth.load_secret(job["auth_file"]) == old
    text = new.hex()
    assert not scan.holds(text), "the secret in a process's command line or environment"
    for out in (up, rot, again):
        assert text not in out.stdout + out.stderr
    assert all(text not in log for log in logs)
    assert _files_holding(tb.files_dir, text) == [] and _files_holding(str(tmp_path), text) == []

    # after the grace period: the old key is bad_mac, the new one summed
    until = tb.state()["rotation"]["until"]
    wait_for(lambda: time.time() > until + 0.2, GRACE + 30, "the end of the grace period")
    agg, w0 = tb.aggregator, tb.workers[0]
    alg = auth.mac_code(mac)
    incarnation = (int(time.time() * 1000) + 600_000) & 0xFFFFFFFF  # a later life of worker 0

    def frame(secret, epoch, counter):
        f = build_frame(
            Addr.of(w0.mac, w0.ip, 40000),
            Addr.of(agg.mac, agg.ip, 48879),
            op="sum32",
            job=jobid,
            token=job["token"],
            worker=0,
            seq=0,
            slot=0,
            flags=epoch << 8,
            payload=np.arange(8, dtype=">u4").tobytes(),
            incarnation=incarnation,
            key=ref_key(secret, 0, job=jobid),
            alg=alg,
            counter=counter,
        )
        return f[42:]  # the UDP payload

    def until_moved(payload, field, base):
        """Send ``payload`` each second until ``field`` passes ``base``: one
        UDP frame can be lost on a loaded host. Returns (stats, copies)."""
        copies, deadline = 0, time.monotonic() + 20
        while time.monotonic() < deadline:
            _send_from(tb, "w0", payload, (agg.ip, 48879))
            copies += 1
            second = time.monotonic() + 1
            while time.monotonic() < second:
                s = stats()
                if s[field] > base[field]:
                    return s, copies
                time.sleep(0.02)
        raise AssertionError(f"timed out after 20 s waiting for {field} to move")

    before = stats()
    # the new key's frame is summed once, however many copies it took
    mid, _ = until_moved(frame(new, 1, 1), "summed", before)
    assert mid["summed"] == before["summed"] + 1 and mid["bad_mac"] == before["bad_mac"]
    # the old key's, after the grace period: each copy is one more bad_mac
    after, copies = until_moved(frame(old, 0, 2), "bad_mac", mid)
    assert 1 <= after["bad_mac"] - mid["bad_mac"] <= copies and after["summed"] == mid["summed"]

    # the job registered afresh keeps its epoch: a worker from the job file is exact
    renew = _testbed_cli(sd, "job", "--name", tb.name)
    assert renew.returncode == 0, renew.stdout + renew.stderr
    _job_file_workers_exact(tb, [path] * 2, tmp_path)


@pytest.mark.root
@pytest.mark.netns
@pytest.mark.dpdk
@pytest.mark.timeout(400)
def test_rotate_key_on_a_tree_testbed_while_ranks_run_allreduces(tmp_path):
    """`homagg testbed up --leaves 2 --auth`: a standing tree job (worker
    w0 under leaf agg, w1 under agg1, the root agg2), one job file per
    worker naming its leaf, the leaf's group and its own leaf's secret
    (mode 0600); the root's secret in no file.  Two ranks run allreduces
    through HookState while `homagg rotate-key` turns every level; none
    fails, every sum bit-exact, both end on epoch 1 with their leaf's new
    secret, which shows in no output, log, file or process listing.
    `homagg testbed job` then registers the tree afresh at that epoch and
    a worker from each job file is exact."""
    from homagg import auth
    from homagg.deploy.local import testbed_job
    from homagg.deploy.local.testbed import Testbed

    _need_switch()
    sd, name = str(tmp_path / "testbeds"), "rt" + secrets.token_hex(5)
    up = _testbed_cli(
        sd, "up", "--workers", "2", "--leaves", "2", "--name", name, "--auth", "--timeout", "10"
    )
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        tb = Testbed.open(name, sd)
        assert "a tree of 2 leaves below the root agg2" in up.stdout, up.stdout
        paths = testbed_job.job_files(tb)
        assert len(set(paths)) == 2 and all(p in up.stdout for p in paths)
        fields = [json.load(open(p)) for p in paths]
        leaves = [h.ip for h in tb.aggregators[:2]]
        olds = []
        for r, f in enumerate(fields):
            assert f["aggregator"] == f"{leaves[r]}:48879" and f["leaf_ids"] == [0, 1]
            assert f["auth_file"] == os.path.join(tb.files_dir, f"leaf-{r}.secret")
            assert os.stat(f["auth_file"]).st_mode & 0o777 == 0o600
            olds.append(auth.load_secret(f["auth_file"]))
        assert fields[0]["group"] != fields[1]["group"] and olds[0] != olds[1]
        assert sorted(n for n in os.listdir(tb.files_dir) if n.endswith(".secret")) == [
            "leaf-0.secret",
            "leaf-1.secret",
        ]

        rot, again, logs, scan = _ranks_through_rotation(tb, sd, paths, tmp_path)
        assert (
            f"job {fields[0]['job']}: key epoch 1 registered on agg, agg1 below the root agg2"
            in rot.stdout
        ), rot.stdout
        assert "the secrets of key epoch 1, one per leaf, are on the hosts" in rot.stdout
        news = []
        for r, p in enumerate(paths):
            f = json.load(open(p))
            assert f["key_epoch"] == 1
            assert f["auth_file"] == os.path.join(tb.files_dir, f"leaf-{r}-e1.secret")
            assert os.stat(f["auth_file"]).st_mode & 0o777 == 0o600
            news.append(auth.load_secret(f["auth_file"]))
            assert news[-1] != olds[r]
        for text in (x.hex() for x in news):
            assert not scan.holds(text), "a secret in a process's command line or environment"
            assert all(text not in o.stdout + o.stderr for o in (up, rot, again))
            assert all(text not in log for log in logs)
            assert _files_holding(tb.files_dir, text) == []
            assert _files_holding(str(tmp_path), text) == []

        # the tree registered afresh at epoch 1: a worker from each job file is exact
        renew = _testbed_cli(sd, "job", "--name", name)
        assert renew.returncode == 0, renew.stdout + renew.stderr
        _job_file_workers_exact(tb, paths, tmp_path)
    finally:
        down = _testbed_cli(sd, "down", "--name", name)
        assert down.returncode == 0, down.stdout + down.stderr


_FROM_JOB_FILE = r"""
import sys
import numpy as np
from homagg.switch import job_file
from homagg.worker import Worker
sys.path.insert(0, sys.argv[3])
from test_rotate_key import gradient
c = job_file.job_config()
rank = int(sys.argv[1])
with Worker(job=c["job"], token=c["token"], worker=rank, workers=c["workers"],
            aggregators=c["aggregators"], group=c["group"], bind=(c["bind"], 0),
            timeout=c["timeout"], slots=c["slots"], payload=c["payload"],
            auth_file=c["auth_file"], mac=c["mac"], key_epoch=c["key_epoch"],
            leaf_ids=c["leaf_ids"]) as w:
    np.save(sys.argv[2], w.allreduce(gradient(99, rank), method="lhc"))
"""


def _job_file_workers_exact(tb, paths, tmp_path):
    """A Worker per worker host made from its job file (``paths[r]``) sums
    one lhc allreduce, bit-exact against the numpy reference."""
    from reference import allreduce as oracle_allreduce

    procs = []
    for r, h in enumerate(tb.workers):
        env = dict(ENV, HOMAGG_JOB_FILE=paths[r], HOMAGG_BIND=h.ip)
        procs.append(
            tb.run_in(
                h.name,
                [
                    sys.executable,
                    "-c",
                    _FROM_JOB_FILE,
                    r,
                    tmp_path / f"jf-{r}.npy",
                    REPO + "/tests",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                text=True,
            )
        )
    for p in procs:
        _, err = p.popen.communicate(timeout=120)
        assert p.popen.returncode == 0, err[-3000:]
    want = oracle_allreduce([gradient(99, r) for r in range(2)], 4096).view(np.uint32)
    for r in range(2):
        assert np.array_equal(np.load(tmp_path / f"jf-{r}.npy").view(np.uint32), want)


@pytest.mark.root
@pytest.mark.netns
@pytest.mark.dpdk
@pytest.mark.timeout(300)
def test_rotate_key_on_a_testbed_without_auth_says_so(tmp_path):
    _need_switch()
    sd, name = str(tmp_path / "testbeds"), "r" + secrets.token_hex(5)
    up = _testbed_cli(sd, "up", "--workers", "2", "--name", name)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        with open(os.path.join(sd, f"{name}.d", "job.json")) as f:
            before = f.read()
        r = _rotate_cli("--testbed", name, "--state-dir", sd)
        assert r.returncode == 1
        assert "does not authenticate, so it has no key to rotate: start it with " in r.stderr
        assert "homagg testbed up --auth" in r.stderr
        with open(os.path.join(sd, f"{name}.d", "job.json")) as f:
            assert f.read() == before
    finally:
        _testbed_cli(sd, "down", "--name", name)
    r = _rotate_cli("--testbed", name, "--state-dir", sd)
    assert r.returncode == 1 and r.stderr.startswith("homagg rotate-key: "), r.stderr


def test_an_aggregator_refusing_names_the_way_back():
    class Refusing(FakeTarget):
        renew = "`homagg testbed job --name fake`"

        def rotate_aggregators(self, job, secret, grace):
            raise rotate.RotateError("rotate_key failed on 1 host(s): host 'agg1': no job 7")

    t = Refusing(AUTH_JOB)
    with pytest.raises(rotate.RotateError) as e:
        _rotate(t, pickup=0.0)
    msg = str(e.value)
    assert "host 'agg1': no job 7" in msg and "the job files name key epoch 1 already" in msg
    assert msg.endswith("register the job afresh at that epoch (`homagg testbed job --name fake`)")
    assert "record" not in t.calls


def test_testbed_up_auth_options_that_cannot_apply_are_refused(tmp_path, capsys):
    from homagg.cli import testbed as cli_testbed

    base = ["--state-dir", str(tmp_path), "up", "--workers", "2", "--name", "x"]
    for extra, sentence in (
        (["--mac", "blake2b"], "--mac: the MAC algorithm of an authenticated job: add --auth"),
        (["--auth", "--no-daemon"], "--auth: the testbed registers no job of its own"),
    ):
        assert cli_testbed._standalone(base + extra) == 1
        err = capsys.readouterr().err
        assert err.startswith("homagg testbed up: ") and sentence in err, err
    assert os.listdir(tmp_path) == []  # nothing was built
