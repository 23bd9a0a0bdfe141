"""Shared test configuration.

Markers (pyproject.toml) declare what a test needs: root, netns, dpdk, ssh,
slow, sanitize.  `make test` runs all of them.  Under CI (CI=true) a test
whose capability is missing fails instead of skipping: a skip there would
hide a gap.  tests/ is on sys.path, so the numpy oracle is `import reference`.
"""
import contextlib
import os
import secrets
import shutil
import subprocess

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition, reason):
    """Skip locally, fail in CI, when a capability a test needs is missing."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required in CI but missing: {reason}")
    pytest.skip(reason)


CODEC_ISAS = ("portable", "avx2", "avx512")


@contextlib.contextmanager
def codec_isa(isa):
    """Run the C codec on ISA path ``isa`` inside the block: sets
    HOMAGG_CODEC_ISA and has the library read it again (it reads it once
    per process otherwise), restoring both after.  Skips locally, fails in
    CI, when this CPU lacks the path."""
    from homagg.bindings import codec as b
    from homagg.errors import InvalidArgument

    old = os.environ.get("HOMAGG_CODEC_ISA")
    os.environ["HOMAGG_CODEC_ISA"] = isa
    try:
        try:
            assert b.codec_isa_reload() == isa
        except InvalidArgument as e:
            require(False, f"codec path {isa}: {e}")
        yield isa
    finally:
        if old is None:
            os.environ.pop("HOMAGG_CODEC_ISA", None)
        else:
            os.environ["HOMAGG_CODEC_ISA"] = old
        b.codec_isa_reload()


def gone(pid):
    """Process ``pid`` exited (a zombie waiting for its reaper counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _have_dpdk():
    if shutil.which("pkg-config") is None:
        return False
    return subprocess.run(["pkg-config", "--exists", "libdpdk"]).returncode == 0


@pytest.fixture(autouse=True)
def _declared_needs(request):
    node = request.node
    if node.get_closest_marker("root") or node.get_closest_marker("netns"):
        require(os.geteuid() == 0, "needs root (run the tests as root or with sudo)")
    if node.get_closest_marker("dpdk"):
        require(_have_dpdk(), "needs libdpdk-dev (make deps installs it)")
    if node.get_closest_marker("ssh"):
        require(shutil.which("sshd") or os.path.exists("/usr/sbin/sshd"),
                "needs openssh-server (make deps installs it)")


@contextlib.contextmanager
def dpdk_testbed(tmp_path_factory, folder, **spec):
    """A Testbed (homagg.deploy.local.testbed) for homagg-switch runs, named after its
    folder's first letter plus a random suffix, in its own state dir under
    tmp_path_factory; taken down on exit.  Needs root and a built
    homagg-switch (require)."""
    from homagg.runs import allreduce as runmod
    from homagg.switch.daemon import find_switch
    from homagg.deploy.local.testbed import Testbed

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
