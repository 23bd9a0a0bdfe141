"""What training jobs do, with homagg.torch in real rank processes on a
4-worker DPDK testbed (homagg-switch on a virtual PMD in the aggregator's
namespace, one rank per worker namespace, tests/ddp_scenarios.py):

- bf16 autocast, gradient accumulation with no_sync, two DDP models in one
  process, uneven inputs under torch's Join, torchrun with the job file only;
- the fallback: homagg-switch killed (by its PID) before step 3 of 8 and
  started again before step 5, and one rank whose HomAgg call fails while
  the others' succeed;
- the ``homagg`` torch.distributed backend on 2 and 4 processes.
- the cost model's choice of path: a dense bucket at 10 Gbit/s through the
  process group, a sparse one at 100 Mbit/s through HomAgg, replayed; and
  measured times replacing the predictions (a clock that says HomAgg is
  slower), expiring and measured again; trials of whole steps (a clock
  that says the steps are shorter, or longer, with the group's path).

Checked in every case: every rank's final parameters are bit-identical; the
ranks made the same hook calls and took the same path for each; every
bucket that went through HomAgg equals the numpy fixed-point oracle
(tests/reference.py) of the ranks' recorded inputs / W, bit for bit, and
every bucket is bit-identical across ranks.
"""

import os
from pathlib import Path
import secrets
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import homagg.torch as hgt
from helpers import dpdk_testbed
from homagg.runs import allreduce as runmod
from homagg.switch.daemon import Switch

from reference import allreduce as oracle_allreduce

BLOCK = 4096  # HG_DEFAULT_BLOCK
HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIOS = os.path.join(HERE, "ddp_scenarios.py")

pytestmark = [pytest.mark.timeout(400), pytest.mark.root, pytest.mark.netns, pytest.mark.dpdk]


@pytest.fixture(scope="module")
def testbed(tmp_path_factory):
    with dpdk_testbed(tmp_path_factory, "jobs", workers=4, link_mbit=1000) as tb:
        yield tb


@pytest.fixture(scope="module")
def switch(testbed, tmp_path_factory):
    sw = Switch(testbed, str(tmp_path_factory.mktemp("jobswitch")), frames=4 * 64)
    try:
        yield sw
    finally:
        sw.stop()


def _register(sw, W, jobid=None, token=None):
    jobid = jobid or 1 + secrets.randbelow(1 << 15)
    token = token or secrets.randbits(31)
    with sw.client() as c:
        c.add_job(job=jobid, token=token, workers=W, slots=64, payload=1024)
    return jobid, token


def _job_file(sw, W, path, timeout=10.0):
    """A job on ``sw`` and its job file; ``timeout``: seconds without
    progress before a HomAgg call fails (generous: the host is shared and
    busy, ranks may reach a bucket seconds apart)."""
    jobid, token = _register(sw, W)
    hgt.write_job_file(
        str(path),
        aggregator=(sw.ip, runmod.UDP_PORT),
        job=jobid,
        token=token,
        workers=W,
        timeout=timeout,
    )
    return jobid, token


@pytest.fixture
def jobs(switch):
    """_job_file on the module's daemon; every job removed after the test."""
    made = []

    def make(W, path, timeout=10.0):
        made.append(_job_file(switch, W, path, timeout)[0])
        return made[-1]

    yield make
    with switch.client() as c:
        for j in made:
            c.remove_job(j)


def _env(extra):
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([os.path.join(os.path.dirname(HERE), "orchestrator"), HERE]),
    )
    env.update(extra)
    return env


def _start(testbed, scenario, W, outdir, job_path):
    port = 29000 + secrets.randbelow(3000)
    procs = []
    for r in range(W):
        h = testbed.workers[r]
        env = _env(
            {
                "RANK": str(r),
                "WORLD_SIZE": str(W),
                "MASTER_ADDR": testbed.workers[0].ip,
                "MASTER_PORT": str(port),
                "HOMAGG_JOB_FILE": str(job_path),
                "HOMAGG_BIND": h.ip,
                "GLOO_SOCKET_IFNAME": h.ifname,
            }
        )
        procs.append(
            testbed.run_in(
                h.name,
                [sys.executable, SCENARIOS, scenario, str(outdir)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=str(outdir),
            )
        )
    return procs


def _finish(procs, timeout=180.0, logdir=None):
    """Wait for every rank; each rank's whole stderr goes to LOGDIR/rank-R.stderr
    (pytest shortens a long assertion message), the failing ranks' tails
    into the assertion."""
    deadline = time.monotonic() + timeout
    try:
        outs = []
        for p in procs:
            try:
                out, err = p.popen.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.stop()
                out, err = p.popen.communicate(timeout=10)
                err = f"(still running after {timeout:.0f} s, stopped)\n{err}"
            outs.append((p.popen.returncode, err))
        if logdir is not None:
            for r, (_, err) in enumerate(outs):
                Path(logdir, f"rank-{r}.stderr").write_text(err or "")
        # every rank's stderr where one failed (a hung rank's stacks among them)
        bad = [(r, rc, err[-3000:]) for r, (rc, err) in enumerate(outs) if rc != 0]
        assert not bad, (f"stderr of every rank in {logdir}", bad)
    finally:
        for p in procs:
            p.stop()


def _bits(t):
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def _check(outdir, W):
    """The checks of the module doc; returns the ranks' results."""
    res = [torch.load(os.path.join(outdir, f"rank-{r}.pt"), weights_only=False) for r in range(W)]
    for r in range(1, W):
        for pa, pb in zip(res[0]["params"], res[r]["params"]):
            for a, b in zip(pa, pb):
                assert torch.equal(_bits(a), _bits(b)), f"rank {r} differs from rank 0"
    calls = [rr["records"] for rr in res]
    assert calls[0] and all(len(c) == len(calls[0]) for c in calls), [len(c) for c in calls]
    for k in range(len(calls[0])):
        paths = {c[k]["path"] for c in calls}
        assert len(paths) == 1, (k, paths)
        for c in calls[1:]:
            assert torch.equal(_bits(c[k]["y"]), _bits(calls[0][k]["y"])), k
        if paths == {"homagg"}:
            want = oracle_allreduce([c[k]["x"].numpy() for c in calls], BLOCK) / np.float32(W)
            assert np.array_equal(calls[0][k]["y"].numpy().view(np.uint32), want.view(np.uint32)), k
        else:  # the process group's float32 sum / W: within its rounding of the exact one
            xs = np.stack([c[k]["x"].numpy() for c in calls]).astype(np.float64)
            bound = (W + 1) * np.finfo(np.float32).eps * np.abs(xs).sum(axis=0) / W
            err = np.abs(calls[0][k]["y"].numpy().astype(np.float64) - xs.sum(axis=0) / W)
            assert np.all(err <= bound), k
    return res


@pytest.mark.parametrize("scenario, W", [("bf16", 2), ("nosync", 2), ("two", 2), ("join", 4)])
def test_training_job_features_exact(testbed, jobs, tmp_path, scenario, W):
    """bf16 autocast, no_sync accumulation, two models sharing one HookState,
    uneven inputs under Join: exact, identical on every rank."""
    jobs(W, tmp_path / "job.json")
    _finish(_start(testbed, scenario, W, tmp_path, tmp_path / "job.json"))
    res = _check(tmp_path, W)
    calls = res[0]["records"]
    assert {c["path"] for c in calls} == {"homagg"}
    # one bucket per model and synchronised step (tiny models)
    steps = {"bf16": 4, "nosync": 3, "two": 3, "join": 3 + W - 1}[scenario]
    n_models = 2 if scenario == "two" else 1
    assert len(calls) == steps * n_models, len(calls)
    if scenario == "join":
        # the ranks that ran out of inputs contributed zero gradients
        last = [rr["records"][-1]["x"] for rr in res]
        assert not last[0].any() and last[W - 1].any()


def test_cost_model_sends_a_dense_bucket_at_10g_through_gloo_and_a_sparse_one_at_100m_through_homagg(
    testbed, jobs, tmp_path
):
    """HookState(cost=...) on 2 ranks: a dense 131072-element bucket with
    10 Gbit/s registered goes through the process group (ring's predicted
    time below HomAgg's bound), an 800000-element embedding bucket at
    0.03 % density with 100 Mbit/s through HomAgg; every rank takes the same
    path for every bucket; the parameters are identical across ranks and
    bit-identical to a replay from the same initial parameters applying, in
    order, the oracle's sum / W (HomAgg buckets) or the group's recorded
    result (checked against the exact sum in _check) with the same SGD."""
    W = 2
    jobs(W, tmp_path / "job.json")
    _finish(_start(testbed, "baseline", W, tmp_path, tmp_path / "job.json"))
    res = _check(tmp_path, W)
    calls = res[0]["records"]
    assert [c["path"] for c in calls] == ["baseline"] * 3 + ["homagg"] * 3
    assert [c["x"].numel() for c in calls] == [512 * 256] * 3 + [100_000 * 8] * 3
    for rr in res:
        assert rr["counters"]["baseline_buckets"] == 3
        for e in rr["log"]:
            assert e["predicted_homagg_seconds"] is not None
            faster = e["predicted_baseline_seconds"] < e["predicted_homagg_seconds"]
            assert faster == (e["path"] == "baseline"), e
    # the replay: one process, the same initial parameters and SGD
    for k in range(2):
        w = res[0]["init"][k].clone()
        for i in range(3 * k, 3 * k + 3):
            if calls[i]["path"] == "homagg":
                y = oracle_allreduce(
                    [rr["records"][i]["x"].numpy() for rr in res], BLOCK
                ) / np.float32(W)
            else:
                y = calls[i]["y"].numpy()
            p = torch.nn.Parameter(w)
            opt = torch.optim.SGD([p], lr=0.1)
            p.grad = torch.from_numpy(y.copy()).reshape(w.shape)
            opt.step()
            w = p.detach().clone()
        assert torch.equal(_bits(w), _bits(res[0]["params"][k][0])), k


def test_measured_times_replace_the_predictions_and_expire(testbed, jobs, tmp_path):
    """HookState(measure=True, remeasure=4) on 2 ranks, the sparse bucket
    at 100 Mbit/s (the model predicts HomAgg faster), with a clock that
    says HomAgg took 1 + r s and the group 0.5 + r / 4 s on rank r (the
    agreed time is the shortest rank's: 1 s and 0.5 s; the slowest
    rank's, 2 s and 0.75 s, would choose the same paths but is not the
    path's own time, see homagg.torch): calls 0 and 1 follow the
    model (HomAgg; the first run of a path is not measured); call 1's
    agreed 1 s exceeds the group's prediction, so calls 2-4 go to the
    group (its first run unmeasured, its second, call 3, agreed at call 4,
    the first call on the hook's thread after it); at call 5 HomAgg's time
    has expired (4 calls old) and the model chooses HomAgg again, measured
    again; calls 6-8 the group, whose time is agreed again at call 8; call
    9 HomAgg.  Every rank takes the same path; sums exact (HomAgg: the
    oracle; the group: its rounding of the exact sum); parameters
    bit-identical to the replay."""
    W = 2
    jobs(W, tmp_path / "job.json")
    _finish(_start(testbed, "measured", W, tmp_path, tmp_path / "job.json"))
    res = _check(tmp_path, W)
    H, B = "homagg", "baseline"
    want = [H, H, B, B, B, H, B, B, B, H]
    calls = res[0]["records"]
    assert [c["path"] for c in calls] == want
    for rr in res:
        log = sorted(rr["log"], key=lambda e: e["handed_over"])
        assert [e["path"] for e in log] == want
        assert rr["counters"]["baseline_buckets"] == want.count(B)
        # the times that decided: None where the prediction did
        h = [e["measured_homagg_seconds"] for e in log]
        b = [e["measured_baseline_seconds"] for e in log]
        assert h == [None, None, 1.0, 1.0, 1.0, None, 1.0, 1.0, 1.0, None], h
        assert b == [None, None, None, None, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5], b
        for e in log:
            assert e["predicted_homagg_seconds"] < 0.5 < 1.0, e
            assert e["predicted_baseline_seconds"] < 1.0, e
    w = res[0]["init"][1].clone()
    for i, c in enumerate(calls):
        if c["path"] == H:
            y = oracle_allreduce([rr["records"][i]["x"].numpy() for rr in res], BLOCK)
            y = y / np.float32(W)
        else:
            y = c["y"].numpy()
        p = torch.nn.Parameter(w)
        opt = torch.optim.SGD([p], lr=0.1)
        p.grad = torch.from_numpy(y.copy()).reshape(w.shape)
        opt.step()
        w = p.detach().clone()
    assert torch.equal(_bits(w), _bits(res[0]["params"][1][0]))
    # HookState(paths=...) takes those paths again (its own clock and the
    # model alone would take HomAgg at every call), without a recorder:
    # the same parameters bit for bit, the group's sums included (how
    # homagg train times a phase without its recorder, then records one)
    for rr in res:
        again = sorted(rr["again"]["log"], key=lambda e: e["seq"])
        assert [e["path"] for e in again] == want
        assert [e["seq"] for e in again] == list(range(len(want)))
        assert torch.equal(_bits(rr["again"]["params"]), _bits(res[0]["params"][1][0]))


def test_trials_of_whole_steps_hold_the_path_whose_steps_are_shorter(testbed, jobs, tmp_path):
    """HookState(trial_calls=2, trial_every=8) on 2 ranks, the sparse
    bucket at 100 Mbit/s, with a clock for the paths' times and one for
    the steps (tests/ddp_scenarios.py, "trial"), three runs:

    1. HomAgg 0.8 and the group 1.2 times the group's prediction: the
       rule keeps HomAgg, within trial_margin 2, so the first trial starts
       at call T + 1 = 3 (calls 1 and 2, HomAgg, are its reference), takes
       calls 3 and 4 to the group and is judged at call 5.  A step after a
       group call lasts 0.9 s against 1 s: the group holds calls 5 to
       3 + 8 - 2 = 8; calls 9 and 10 follow the rule again (the next
       reference), calls 11 and 12 are the next trial, held from 13.
    2. The same with 1.1 s steps after a group call: HomAgg is held.
    3. HomAgg 1.2 and the group 0.8: the rule takes the group from call 2
       (at call 3 the reference, calls 1 and 2, is not the group's alone,
       so no trial); at call 11 a trial of HomAgg, whose steps (0.9 s
       against 1 s) make it the path held from call 13.

    Every rank takes the same path; HomAgg's sums equal the oracle;
    parameters bit-identical across ranks and to a replay of the recorded
    sums."""
    W = 2
    jobs(W, tmp_path / "job.json")
    _finish(_start(testbed, "trial", W, tmp_path, tmp_path / "job.json"))
    res = [torch.load(tmp_path / f"rank-{r}.pt", weights_only=False) for r in range(W)]
    H, B, tr, hd = "homagg", "baseline", "trial", "held"
    want = [
        [H, H, H, B, B, B, B, B, B, H, H, B, B, B, B, B],
        [H, H, H, B, B, H, H, H, H, H, H, B, B, H, H, H],
        [H, H, B, B, B, B, B, B, B, B, B, H, H, H, H, H],
    ]
    marks = [[None] * 3 + [tr] * 2 + [hd] * 4 + [None] * 2 + [tr] * 2 + [hd] * 3] * 2 + [
        [None] * 11 + [tr] * 2 + [hd] * 3
    ]
    # per run: the verdicts' calls and (HomAgg's, the group's median step, the path held)
    verdicts = [
        {5: (1.0, 0.9, B), 13: (1.0, 0.9, B)},
        {5: (1.0, 1.1, H), 13: (1.0, 1.1, H)},
        {13: (0.9, 1.0, H)},
    ]
    for k in range(3):
        runs = [rr["runs"][k] for rr in res]
        for run in runs:
            log = sorted(run["log"], key=lambda e: e["seq"])
            assert [e["path"] for e in log] == want[k], (k, [e["path"] for e in log])
            assert [e["trial"] for e in log] == marks[k], (k, [e["trial"] for e in log])
            got = {e["seq"]: e["trial_step_seconds"] for e in log if e["trial_step_seconds"]}
            assert sorted(got) == sorted(verdicts[k]), (k, got)
            for call, (h, g, held) in verdicts[k].items():
                v = got[call]
                assert v["homagg"] == pytest.approx(h, abs=2e-6), (k, v)
                assert v["baseline"] == pytest.approx(g, abs=2e-6), (k, v)
                assert v["held"] == held, (k, v)
            c = run["counters"]
            held = [v[2] for v in verdicts[k].values()]
            assert c["trials"] == len(verdicts[k]) and c["trial_calls"] == 2 * c["trials"], c
            assert (c["trials_to_group"], c["trials_to_homagg"]) == (held.count(B), held.count(H))
            assert c["held_calls"] == marks[k].count(hd), c
            assert [r["path"] for r in run["records"]] == want[k]
            assert torch.equal(_bits(run["params"]), _bits(runs[0]["params"]))
        w = res[0]["init"].clone()
        for i, path in enumerate(want[k]):
            if path == H:
                y = oracle_allreduce([run["records"][i]["x"].numpy() for run in runs], BLOCK)
                y = y / np.float32(W)
                for run in runs:
                    assert torch.equal(_bits(run["records"][i]["y"]), _bits(torch.from_numpy(y)))
            else:
                y = runs[0]["records"][i]["y"].numpy()
                for run in runs[1:]:
                    assert torch.equal(
                        _bits(run["records"][i]["y"]), _bits(runs[0]["records"][i]["y"])
                    )
            p = torch.nn.Parameter(w)
            opt = torch.optim.SGD([p], lr=0.1)
            p.grad = torch.from_numpy(y.copy()).reshape(w.shape)
            opt.step()
            w = p.detach().clone()
        assert torch.equal(_bits(w), _bits(runs[0]["params"])), k


def test_torchrun_with_the_job_file_only(testbed, jobs, tmp_path):
    """torchrun (torch.distributed.run), 2 ranks in one worker namespace,
    configured by HOMAGG_JOB_FILE alone (no bind address, no rank)."""
    W = 2
    jobs(W, tmp_path / "job.json")
    h = testbed.workers[0]
    env = _env({"HOMAGG_JOB_FILE": str(tmp_path / "job.json"), "GLOO_SOCKET_IFNAME": h.ifname})
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "HOMAGG_BIND"):
        env.pop(k, None)
    p = testbed.run_in(
        h.name,
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(W),
            "--master-addr",
            h.ip,
            "--master-port",
            str(29000 + secrets.randbelow(3000)),
            SCENARIOS,
            "plain",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(tmp_path),
    )
    _finish([p])
    res = _check(tmp_path, W)
    assert {c["path"] for c in res[0]["records"]} == {"homagg"}
    assert len(res[0]["records"]) == 4


def _wait_file(path, procs, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        dead = [p.popen.returncode for p in procs if p.popen.poll() is not None]
        assert not dead, f"a rank exited before {path}: {dead}"
        assert time.monotonic() < deadline, f"{path} not written within {timeout} s"
        time.sleep(0.02)


@pytest.fixture
def own_testbed(tmp_path_factory):
    """A 2-worker testbed of the test's own: its aggregator namespace runs
    only the daemon the test kills and starts again."""
    with dpdk_testbed(tmp_path_factory, "kill", workers=2, link_mbit=1000) as tb:
        yield tb


def test_fallback_survives_a_killed_aggregator_and_uses_it_again(own_testbed, tmp_path):
    """8 steps, 2 ranks: homagg-switch killed (SIGKILL, its PID) before step
    3, the steps 3 and 4 go through the process group (Gloo), the daemon
    is started again with the job registered afresh before step 5, and the
    steps 5..7 go through HomAgg again; training finishes, every rank's
    parameters identical, every HomAgg bucket exact."""
    testbed, W = own_testbed, 2
    sw = Switch(testbed, str(tmp_path / "sw1"), frames=W * 64)
    sw2 = None
    try:
        # the dead aggregator's calls fail after 4 s: two of them
        jobid, token = _job_file(sw, W, tmp_path / "job.json", timeout=4.0)
        procs = _start(testbed, "fallback", W, tmp_path, tmp_path / "job.json")
        try:
            _wait_file(tmp_path / "at-3", procs)
            os.kill(sw.pid, signal.SIGKILL)
            sw.proc.popen.wait(10)
            sw.proc = None
            (tmp_path / "go-3").touch()
            _wait_file(tmp_path / "at-5", procs)
            os.makedirs(tmp_path / "sw2")
            sw2 = Switch(testbed, str(tmp_path / "sw2"), frames=W * 64)
            assert sw2.ip == sw.ip
            _register(sw2, W, jobid, token)
            (tmp_path / "go-5").touch()
        finally:
            _finish(procs)
    finally:
        for s in (sw, sw2):
            if s is not None and s.proc is not None:
                s.stop()
    res = _check(tmp_path, W)
    calls = res[0]["records"]
    assert len(calls) == 8  # one bucket per step
    paths = [c["path"] for c in calls]
    assert paths[3:5] == ["fallback"] * 2, paths  # the daemon was dead
    # restarted: HomAgg again (a stall of the busy host longer than the
    # timeout may send one more bucket through Gloo: not all three asserted)
    assert "homagg" in paths[5:], paths
    for rr in res:
        assert rr["fallback"] is True
        assert rr["counters"]["homagg_failures"] >= 1
        assert rr["counters"]["fallback_buckets"] >= 2
        assert rr["counters"]["retries"] >= 1


def test_fallback_when_one_rank_fails_and_the_others_succeed(testbed, jobs, tmp_path):
    """Rank 1's second HomAgg call raises after its sum arrived; ranks 0 and 2
    succeed: the agreement sends that bucket through the process group on
    every rank, and the parameters stay identical."""
    W = 3
    jobs(W, tmp_path / "job.json")
    _finish(_start(testbed, "inject", W, tmp_path, tmp_path / "job.json"))
    res = _check(tmp_path, W)
    paths = [c["path"] for c in res[0]["records"]]
    assert len(paths) == 4 and paths[1] == "fallback", paths  # the injected failure
    assert "homagg" in paths[2:], paths  # tried again after the back-off
    for rr in res:
        assert rr["counters"]["homagg_failures"] >= 1 and rr["counters"]["fallback_buckets"] >= 1


def test_backend_delegates_every_collective_without_the_gil():
    """Every collective torch's ProcessGroup trampoline routes (it holds the
    GIL when a Python subclass does not override one) is a method of the
    backend's class itself, so none reaches Gloo with the GIL held; the
    delegated ones are Gloo's own."""
    import torch.distributed as dist

    from homagg import torch_backend as tb

    routed = (
        "allgather",
        "allgather_into_tensor_coalesced",
        "allreduce",
        "allreduce_coalesced",
        "alltoall_base",
        "barrier",
        "broadcast",
        "reduce_scatter",
        "reduce_scatter_tensor_coalesced",
        "send",
        "recv",
    )
    own = vars(tb.HomAggProcessGroup)
    assert [n for n in routed if n not in own] == []
    for name in tb.DELEGATED:
        assert name in own and hasattr(dist.ProcessGroupGloo, name), name


@pytest.mark.parametrize("W", [2, 4])
def test_backend_all_reduce_exact_and_delegates(testbed, jobs, tmp_path, W):
    """init_process_group("cpu:homagg"): dist.all_reduce SUM and AVG of
    float32 / float16 / bfloat16 equal the fixed-point oracle (/ W for AVG)
    cast to the dtype, bit for bit, on every rank; int64 and MAX allreduce,
    broadcast, all_gather, all_gather_object, reduce, gather, scatter,
    all_to_all, all_gather_into_tensor, reduce_scatter, send / recv and
    barrier are Gloo's, with the values Gloo gives; 300 broadcasts in a row
    do not hang."""
    jobs(W, tmp_path / "job.json")
    _finish(_start(testbed, "backend", W, tmp_path, tmp_path / "job.json"), logdir=tmp_path)
    res = [torch.load(os.path.join(tmp_path, f"rank-{r}.pt"), weights_only=False) for r in range(W)]
    for k, case in enumerate(res[0]["reduced"]):
        xs = [rr["reduced"][k]["x"].to(torch.float32).numpy() for rr in res]
        want = oracle_allreduce(xs, BLOCK)
        if case["avg"]:
            want = want / np.float32(W)
        want = torch.from_numpy(want).to(case["x"].dtype)
        for rr in res:
            got = rr["reduced"][k]["y"]
            assert got.dtype == want.dtype and torch.equal(_bits(got), _bits(want)), (k, case)
    for r, rr in enumerate(res):
        d = rr["delegated"]
        s = W * (W + 1) // 2
        assert d["int64_sum"].tolist() == [s, 10 * s]
        assert d["max"].tolist() == [W - 1.0, 0.0]
        assert d["broadcast"].tolist() == [W - 1.0] * 4
        assert [g.tolist() for g in d["all_gather"]] == [[q, 2.0 * q] for q in range(W)]
        assert d["all_gather_object"] == [{"rank": q} for q in range(W)]
        if r == 0:
            assert d["reduce"].tolist() == [float(s)]
            assert [g.tolist() for g in d["gather"]] == [[float(q)] for q in range(W)]
        assert d["scatter"].tolist() == [3.0 * r]
        assert d["all_to_all_single"].tolist() == [10.0 * q + r for q in range(W)]
        assert d["all_gather_into_tensor"].tolist() == [v for q in range(W) for v in (q, 2.0 * q)]
        assert d["reduce_scatter_tensor"].tolist() == [float(W * r + W * (W - 1) // 2)]
        assert d["send_recv"].tolist() == [100.0 + (r - 1) % W]
        assert d["many"] == 300
        assert rr["counters"] == {"homagg_allreduce": 6, "delegated_allreduce": 2}
