"""Helper functions shared by the test files: ``from helpers import ...``.

Fixtures stay in conftest.py (pytest finds them there); functions a test
calls live here, so no test imports conftest.  The numpy oracle of the
protocol (mix64, the random streams, the codec) is reference.py; the rigs
are switch_helpers.py (homagg-switch on a veth pair), engine_rig.py (one
engine on an in-memory port), udp_rig.py (an engine on loopback UDP) and
sshrack.py (testbed hosts with sshd).  A
line from a testbed process within a timeout: its Process.readline(timeout).
tests/ is on sys.path (pytest puts it there: it is no package), so these
import by name.
"""

import contextlib
import os
import secrets
import shutil
import subprocess
import time

import numpy as np
import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

CODEC_ISAS = ("portable", "avx2", "avx512")

# The CPU features each codec path needs (dataplane_c/src/codec.c
# codec_isa_cpu): a path is runnable here exactly when /proc/cpuinfo lists
# them all.
ISA_CPU_FLAGS = {
    "portable": frozenset(),
    "avx2": frozenset({"avx2", "bmi2"}),
    "avx512": frozenset({"avx2", "bmi2", "avx512f", "avx512dq", "avx512bw"}),
}


def cpu_flags():
    """The CPU's feature flags from /proc/cpuinfo (empty if unreadable)."""
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(
                next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
            )
    except OSError:
        return frozenset()


def cpu_lacks(isa):
    """The features codec path ``isa`` needs that this CPU lacks (sorted)."""
    return sorted(ISA_CPU_FLAGS[isa] - cpu_flags())


# The paths this CPU can run: tests that go over every path go over these,
# and a path the CPU has but the library refuses is a failure.
RUNNABLE_ISAS = tuple(i for i in CODEC_ISAS if not cpu_lacks(i))


# ---- capabilities --------------------------------------------------------


def require(condition, reason):
    """Skip locally, fail in CI, when a capability a test needs is missing."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required in CI but missing: {reason}")
    pytest.skip(reason)


def have_dpdk():
    if shutil.which("pkg-config") is None:
        return False
    return subprocess.run(["pkg-config", "--exists", "libdpdk"]).returncode == 0


def require_gmac(available):
    """AES-GMAC runs wherever the CPU has AES-NI and PCLMULQDQ (every CPU
    this project's machines have): there its absence is a failure, not a
    skip; only a CPU without them skips, naming why."""
    flags = cpu_flags()
    if {"aes", "pclmulqdq"} <= flags:
        assert available, "the CPU has AES-NI and PCLMULQDQ but aes-gmac is not available"
    elif not available:
        pytest.skip("this CPU has no AES-NI/PCLMULQDQ: aes-gmac cannot run here")


@contextlib.contextmanager
def codec_isa_env(value):
    """HOMAGG_CODEC_ISA=value inside the block (any string: the library is
    not asked to read it); after it the old value is back and the library
    has read it again."""
    from homagg.bindings import codec as b

    old = os.environ.get("HOMAGG_CODEC_ISA")
    os.environ["HOMAGG_CODEC_ISA"] = value
    try:
        yield value
    finally:
        if old is None:
            os.environ.pop("HOMAGG_CODEC_ISA", None)
        else:
            os.environ["HOMAGG_CODEC_ISA"] = old
        b.codec_isa_reload()


@contextlib.contextmanager
def codec_isa(isa):
    """Run the C codec on ISA path ``isa`` inside the block: sets
    HOMAGG_CODEC_ISA and has the library read it again (it reads it once
    per process otherwise), restoring both after.  A CPU without the
    path's features skips, naming them (in CI too: no machine can run a
    path its CPU lacks, as require_gmac); a CPU that has them and a
    library that refuses the path fail."""
    from homagg.bindings import codec as b
    from homagg.errors import InvalidArgument

    with codec_isa_env(isa):
        try:
            assert b.codec_isa_reload() == isa
        except InvalidArgument as e:
            missing = cpu_lacks(isa)
            if not missing:
                pytest.fail(f"this CPU has the features of codec path {isa}, but: {e}")
            pytest.skip(f"this CPU lacks {', '.join(missing)}: codec path {isa} cannot run here")
        yield isa


# ---- processes and waiting -----------------------------------------------


def wait_for(pred, timeout, what, interval=0.02):
    """Poll pred() until it returns something true and return that; fail
    naming ``what`` after ``timeout`` seconds (never a bare sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def gone(pid):
    """Process ``pid`` exited (a zombie waiting for its reaper counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@contextlib.contextmanager
def dpdk_testbed(tmp_path_factory, folder, **spec):
    """A Testbed (homagg.deploy.local.testbed) for homagg-switch runs, named after its
    folder's first letter plus a random suffix, in its own state dir under
    tmp_path_factory; taken down on exit.  Needs root and a built
    homagg-switch (require)."""
    from homagg.deploy.local.testbed import Testbed
    from homagg.runs import allreduce as runmod
    from homagg.switch.daemon import find_switch

    require(os.geteuid() == 0, "needs root")
    try:
        find_switch()
    except runmod.RunError as e:
        require(False, str(e))
    sd = str(tmp_path_factory.mktemp(folder) / "testbeds")
    tb = Testbed.up(folder[0] + secrets.token_hex(5), state_dir=sd, **spec)
    try:
        yield tb
    finally:
        Testbed.down(tb.name, state_dir=sd)


# ---- 32-bit big-endian lanes (the sum32 payload) -------------------------


def be32(a):
    """Integers as big-endian 32-bit lanes, wrapped modulo 2^32: bytes."""
    return np.asarray(a, dtype=np.int64).astype(np.uint32).astype(">u4").tobytes()


def be32_buffer(a):
    """be32(a) as a writable uint8 array (an accumulator a kernel adds into)."""
    return np.frombuffer(be32(a), dtype=np.uint8).copy()


def from_be32(b):
    """Big-endian 32-bit lanes (bytes or a uint8 array) as signed int64."""
    return np.frombuffer(b, dtype=">u4").astype(np.uint32).view(np.int32).astype(np.int64)


def wrap32(a):
    """Integers wrapped into the signed 32-bit range, as int64."""
    return ((np.asarray(a, dtype=np.int64) + 2**31) % 2**32) - 2**31


# ---- the codec: gradients and bit-exact comparison -------------------------


def _magnitudes(rng, size, kind):
    """Positive magnitudes of one kind (float64, converted by the caller)."""
    if kind == "normal":
        return np.abs(rng.standard_normal(size)) * 1e-3
    if kind == "tiny":
        return np.abs(rng.standard_normal(size)) * 1e-30
    if kind == "huge":
        return np.abs(rng.standard_normal(size)) * 1e30
    if kind == "max":  # near float32 max: sums may overflow to inf, as the contract says
        return rng.uniform(0.5, 1.0, size) * float(np.finfo(np.float32).max)
    if kind == "subnormal":
        return rng.uniform(0, 2**-126, size)
    if kind == "mixed":  # log-uniform over the whole float32 range
        return 2.0 ** rng.uniform(-149, 127, size)
    if kind == "zeros":
        return np.zeros(size)
    raise ValueError(kind)


def make_grads(rng, workers, n, density=0.05, positions="independent", magnitude="normal"):
    """W float32 gradients with the given density and layout of non-zeros."""

    def mask():
        if positions == "clustered":  # non-zeros in runs of ~100 elements
            m = np.zeros(n, dtype=bool)
            runs = int(np.ceil(n * density / 100)) if density > 0 else 0
            for _ in range(runs):
                start = rng.integers(0, max(n, 1))
                m[start : start + 100] = True
            return m
        return rng.random(n) < density

    shared = mask()
    grads = []
    for _ in range(workers):
        m = shared if positions in ("shared", "clustered") else mask()
        v = _magnitudes(rng, n, magnitude) * rng.choice([-1.0, 1.0], n)
        with np.errstate(over="ignore"):
            g = np.where(m, v, 0.0).astype(np.float32)
        # +-0 mixes: signed zeros where nothing is set.
        g[~m & (rng.random(n) < 0.5)] = np.float32(-0.0)
        grads.append(g)
    return grads


def assert_bits_equal(got, want, what=""):
    """float32 arrays equal bit for bit (signed zeros, NaN payloads, inf);
    else the first element that differs and how many do."""
    assert got.dtype == np.float32 and got.shape == want.shape, what
    gb, wb = got.view(np.uint32), want.view(np.uint32)
    if not np.array_equal(gb, wb):
        i = int(np.flatnonzero(gb != wb)[0])
        raise AssertionError(
            f"{what}: element {i}: got {got[i]!r} ({gb[i]:#010x}), oracle {want[i]!r} "
            f"({wb[i]:#010x}); {int(np.count_nonzero(gb != wb))} elements differ"
        )


def run(grads, method, block, **kw):
    """homagg.codec.simulate_allreduce of ``grads`` (overflow to inf allowed)."""
    from homagg import codec

    with np.errstate(over="ignore"):
        return codec.simulate_allreduce(grads, method=method, block_elements=block, **kw)


def run_testbed_bench(tmp_path, capsys, name, *argv):
    """`homagg bench NAME ARGV --json --out DIR`: exit 0, the printed report
    is the one written to DIR (NAME.json, .csv, .md); returns it."""
    import json

    from homagg import cli

    out = tmp_path / name
    rc = cli.main(["bench", name, *argv, "--json", "--out", str(out)])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert json.loads((out / f"{name}.json").read_text())["results"] == report["results"]
    assert (out / f"{name}.md").exists() and (out / f"{name}.csv").exists()
    return report


# ---- workers made from job files ------------------------------------------

# One Worker configured from its job file (HOMAGG_JOB_FILE, homagg.switch.
# job_file.job_config) sums one lhc allreduce of worker argv[1]'s gradient of
# argv[2] elements and saves the result to argv[3].
JOB_FILE_WORKER = r"""
import sys
import numpy as np
from homagg.runs import job as localrun
from homagg.switch import job_file
from homagg.worker import Worker
c = job_file.job_config()
rank, n = int(sys.argv[1]), int(sys.argv[2])
with Worker(job=c["job"], token=c["token"], worker=rank, workers=c["workers"],
            aggregators=c["aggregators"], group=c["group"], bind=(c["bind"], 0),
            timeout=c["timeout"], slots=c["slots"], payload=c["payload"],
            auth_file=c["auth_file"], mac=c["mac"], key_epoch=c["key_epoch"],
            leaf_ids=c["leaf_ids"]) as w:
    y = w.allreduce(localrun.gradient(n, 0.05, "random", 7, rank), method="lhc")
np.save(sys.argv[3], y)
"""


def job_file_workers_exact(tb, names, files, out_dir, tag, binds=None, n=20000):
    """Worker k in testbed namespace ``names[k]``, made from job file
    ``files[k]`` (``binds[k]``: its HOMAGG_BIND, where the file names no
    bind address), sums one lhc allreduce at once with the others (a
    process each, JOB_FILE_WORKER); each result bit-exact against the
    numpy reference of the same gradients."""
    import sys

    from homagg.runs import job as localrun

    procs = []
    for k, (name, path) in enumerate(zip(names, files)):
        env = dict(os.environ, HOMAGG_JOB_FILE=path)
        if binds:
            env["HOMAGG_BIND"] = binds[k]
        out = os.path.join(str(out_dir), f"{tag}-{k}.npy")
        procs.append(
            tb.run_in(
                name,
                [sys.executable, "-c", JOB_FILE_WORKER, str(k), str(n), out],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
            )
        )
    for p in procs:
        assert p.wait(120) == 0, p.popen.stderr.read()
    grads = [localrun.gradient(n, 0.05, "random", 7, w) for w in range(len(names))]
    ref = localrun.reference(grads, localrun.DEFAULT_BLOCK).view(np.uint32)
    for k in range(len(names)):
        got = np.load(os.path.join(str(out_dir), f"{tag}-{k}.npy")).view(np.uint32)
        assert np.array_equal(got, ref), f"worker {k}"
