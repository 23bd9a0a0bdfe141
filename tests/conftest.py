"""Shared test configuration.

Markers (pyproject.toml) declare what a test needs: root, netns, dpdk, ssh,
slow, sanitize.  `make test` runs all of them.  Under CI (CI=true) a test
whose capability is missing fails instead of skipping: a skip there would
hide a gap.  tests/ is on sys.path, so the numpy oracle is `import reference`.
Fixtures live here; functions tests call (require, wait_for, be32, ...) live
in helpers.py: no test imports conftest.
"""

import os
import shutil

import pytest

from helpers import have_dpdk, require


@pytest.fixture(autouse=True)
def _declared_needs(request):
    node = request.node
    if node.get_closest_marker("root") or node.get_closest_marker("netns"):
        require(os.geteuid() == 0, "needs root (run the tests as root or with sudo)")
    if node.get_closest_marker("dpdk"):
        require(have_dpdk(), "needs libdpdk-dev (make deps installs it)")
    if node.get_closest_marker("ssh"):
        require(
            shutil.which("sshd") or os.path.exists("/usr/sbin/sshd"),
            "needs openssh-server (make deps installs it)",
        )


@pytest.fixture
def link():
    """Two namespaces joined by a veth pair (switch_helpers.Link), removed
    after the test; fails when homagg-switch is not built."""
    from switch_helpers import SWITCH, Link

    if not SWITCH.exists():
        pytest.fail(f"{SWITCH} is not built (make switch)")
    lk = Link()
    try:
        yield lk
    finally:
        lk.teardown()


@pytest.fixture
def daemons(link, tmp_path):
    """daemons(*args, pmd=...) starts one more homagg-switch on ``link``;
    every one started is stopped after the test."""
    from switch_helpers import start_daemon

    started = []

    def start(*args, pmd="af_packet"):
        d = start_daemon(link, tmp_path / f"sw{len(started)}", *args, pmd=pmd)
        started.append(d)
        return d

    try:
        yield start
    finally:
        for d in started:
            d.stop()
