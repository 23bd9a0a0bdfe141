"""The libFuzzer targets (dataplane_c/fuzz/fuzz_*.c) build with clang against
every library source and run for a short budget each (FUZZ_SECONDS per
target, so the total grows with the targets: keep it small) without a
finding."""

import pathlib
import shutil
import subprocess

import pytest

from helpers import require

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_fuzz_targets_run_clean():
    require(shutil.which("clang") is not None, "needs clang")
    proc = subprocess.run(
        ["make", "--no-print-directory", "fuzz", "FUZZ_SECONDS=10"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "Done" in proc.stdout and "stat::number_of_executed_units" in proc.stdout
    # every target ran (one final-stats block each)
    targets = list((ROOT / "dataplane_c" / "fuzz").glob("fuzz_*.c"))
    assert proc.stdout.count("stat::number_of_executed_units") == len(targets) >= 2


def test_engine_seed_corpus_reaches_the_slots():
    """Every seed of fuzz_engine.c is valid for its jobs under the current
    wire format (dataplane_c/fuzz/make_corpus.py regenerates them): fed to an
    engine configured like the target's, each one sums contributions."""
    from homagg.engine import Engine, MemPort

    seeds = sorted((ROOT / "dataplane_c" / "fuzz" / "corpus_engine").iterdir())
    assert seeds
    for seed in seeds:
        data = seed.read_bytes()
        port = MemPort(can_replicate=bool(data[-1] & 1))
        eng = Engine(port)
        eng.add_job(job=1, token=77, workers=3, slots=4, group="239.1.2.3", incarnation=7)
        eng.add_job(job=2, token=99, workers=2, slots=1, payload_bytes=64, shard=1)
        eng.add_job(
            job=3,
            token=55,
            workers=2,
            slots=2,
            payload_bytes=256,
            auth=bytes(range(1, 33)),
            mac="blake2b",
        )
        off = 0
        while off + 3 <= len(data):
            n = int.from_bytes(data[off + 1 : off + 3], "big")
            port.inject(data[off + 3 : off + 3 + n])
            off += 3 + n
        eng.poll_all()
        assert off == len(data), seed.name
        assert eng.counters()["summed"] > 0, (seed.name, eng.counters())
        if seed.name.startswith("auth"):  # job 3 only: its frames pass the MAC check
            assert eng.counters()["bad_mac"] == (3 if seed.name == "auth_forged" else 0)
