"""The libFuzzer targets (dataplane_c/fuzz/fuzz_*.c) build with clang against
every library source and run for a short budget each (FUZZ_SECONDS per
target, so the total grows with the targets: keep it small) without a
finding."""
import pathlib
import shutil
import subprocess

import pytest

from conftest import require

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_fuzz_targets_run_clean():
    require(shutil.which("clang") is not None, "needs clang")
    proc = subprocess.run(["make", "--no-print-directory", "fuzz", "FUZZ_SECONDS=10"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "Done" in proc.stdout and "stat::number_of_executed_units" in proc.stdout
    # every target ran (one final-stats block each)
    targets = list((ROOT / "dataplane_c" / "fuzz").glob("fuzz_*.c"))
    assert proc.stdout.count("stat::number_of_executed_units") == len(targets) >= 2
