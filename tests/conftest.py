"""Shared test configuration.

Markers (pyproject.toml) declare what a test needs: root, netns, dpdk, ssh,
slow.  `make test` runs all of them.  Under CI (CI=true) a test that would be
skipped for a missing capability fails instead: a skip there hides a gap.
"""
import os

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition, reason):
    """Skip locally, fail in CI, when a capability a test needs is missing."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture
def needs_root():
    require(os.geteuid() == 0, "needs root")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("root") or item.get_closest_marker("netns"):
            item.fixturenames.insert(0, "needs_root") if "needs_root" not in item.fixturenames else None
