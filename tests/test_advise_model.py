"""`homagg advise --model`: the advisor on a model's DDP buckets.

The buckets are checked against torch's own bucketing
(``dist._compute_bucket_assignment_by_size`` with DDP's limits, the first
bucket capped at ``dist._DEFAULT_FIRST_BUCKET_BYTES`` under DDP's default
cap) and against the buckets DDP's reducer reports it rebuilt, the densities
against numpy on gradients computed here without DDP, and the prediction
for consistency: each bucket's prediction is homagg.ops.advise.predict's
on the same gradients, the iteration's sums are the buckets', the best
method is the least and its speedup is ring's time over its own.  No
prediction is compared with a measured time."""

import json
import textwrap

import numpy as np
import pytest

from homagg import cli

torch = pytest.importorskip(
    "torch", reason="advise --model needs torch==2.13.0 (make build installs it)"
)

# a host's coefficients, as `homagg calibrate` writes them (ps)
COEFFS = {
    "pkt_ps": 2_000_000,
    "agg_pkt_ps": 150_000,
    "value_ps": 1_000,
    "lane_ps": 7_000,
    "bitmap_ps": 400,
    "probe_ps": 2_100,
    "sbbf_ps": 7_200,
}
METHODS = ("dense", "blocks", "lhc", "union", "auto")

TINY = textwrap.dedent("""
    import numpy as np
    import torch
    from torch import nn


    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(5000, 16)
            self.l1 = nn.Linear(16, 256)
            self.l2 = nn.Linear(256, 256)
            self.out = nn.Linear(256, 1200)

        def forward(self, idx):
            h = torch.relu(self.l1(self.emb(idx).mean(dim=1)))
            return self.out(torch.relu(self.l2(h)))


    def build(rank, world_size, seed):
        torch.manual_seed(seed)
        model = Tiny()
        rng = np.random.default_rng([seed, rank])

        def gen():
            while True:
                x = torch.from_numpy(rng.integers(0, 5000, size=(8, 4)))
                y = torch.from_numpy(rng.integers(0, 1200, size=8))
                yield x, y

        return model, gen(), nn.CrossEntropyLoss()


    def broken(rank, world_size, seed):
        raise RuntimeError("no data here")


    def model_only(rank, world_size, seed):
        return Tiny()
""")


@pytest.fixture(autouse=True)
def calibration(tmp_path, monkeypatch):
    path = tmp_path / "calibration.json"
    path.write_text(
        json.dumps({"version": 1, "isa": "avx2", "cpu": "test", "paths": {"avx2": COEFFS}})
    )
    monkeypatch.setenv("HOMAGG_CALIBRATION", str(path))
    monkeypatch.delenv("HOMAGG_CODEC_ISA", raising=False)
    return path


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.py"
    path.write_text(TINY)
    return path


def _advise(capsys, *args):
    code = cli.main(["advise", *map(str, args), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def _torch_buckets(model, cap_mb=None):
    """Parameter names per bucket as torch's own bucketing forms them: the
    parameters in reverse order (the order their gradients become ready in
    a chain of layers), the first bucket capped at DDP's first-bucket cap
    when the cap is DDP's default (None), else at cap_mb like the others."""
    import torch.distributed as dist

    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad][::-1]
    limits = (
        [dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * 1024 * 1024]
        if cap_mb is None
        else [int(cap_mb * 1024 * 1024)] * 2
    )
    indices, _ = dist._compute_bucket_assignment_by_size([p for _, p in named], limits)
    return [[named[i][0] for i in b] for b in indices]


def _reducer_buckets(factory, cap_mb, store_path):
    """(bytes, parameter indices) of each bucket as DDP's reducer reports
    them after rebuilding (its logging data), on a one-process Gloo group:
    a DDP of the same model trained three passes."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", store=dist.FileStore(str(store_path), 1), rank=0, world_size=1)
    try:
        model, batches, loss_fn = factory(0, 1, 1)
        ddp = DDP(model, bucket_cap_mb=cap_mb)
        it = iter(batches)
        for _ in range(3):
            x, y = next(it)
            loss_fn(ddp(x), y).backward()
        info = ddp._get_ddp_logging_data()
        assert info["has_rebuilt_buckets"] == 1
        sizes = [int(v) for v in info["rebuilt_bucket_sizes"].split(",")]
        params = [
            [int(i) for i in b.split()] for b in info["rebuilt_per_bucket_param_indices"].split(",")
        ]
        return sizes, params
    finally:
        dist.destroy_process_group()


def _plain_gradients(factory, W, seed):
    """Each rank's gradients by a plain forward/backward (no DDP), by name."""
    out = []
    for r in range(W):
        model, batches, loss_fn = factory(r, W, seed)
        x, y = next(iter(batches))
        model.zero_grad()
        loss_fn(model(x), y).backward()
        out.append(
            {n: p.grad.detach().numpy().reshape(-1).copy() for n, p in model.named_parameters()}
        )
    return out


def test_tiny_model_buckets_densities_and_a_consistent_prediction(capsys, tiny, tmp_path):
    from homagg.ops import advise as adv
    from homagg.ops import advise_model as am
    from homagg.train.train import load_factory

    W, cap, seed = 3, 0.25, 1
    a = _advise(
        capsys,
        "--model",
        f"{tiny}:build",
        "--workers",
        W,
        "--link-mbit",
        100,
        "--bucket-mb",
        cap,
        "--seed",
        seed,
    )
    factory = load_factory(f"{tiny}:build")[0]
    model = factory(0, W, seed)[0]
    sizes = {n: p.numel() for n, p in model.named_parameters()}

    # the buckets are torch's: the same parameters in each, hence the same sizes
    want = _torch_buckets(model, cap)
    assert len(want) == 3  # every bucket capped at 0.25 MB
    assert [sorted(b["params"]) for b in a["buckets"]] == [sorted(b) for b in want]
    assert [b["numel"] for b in a["buckets"]] == [sum(sizes[n] for n in b) for b in want]
    assert [b["index"] for b in a["buckets"]] == list(range(3))
    assert a["elements"] == sum(sizes.values())
    # and the reducer's own account of the buckets it rebuilt
    rb_bytes, rb_params = _reducer_buckets(factory, cap, tmp_path / "store")
    names = [n for n, _ in model.named_parameters()]
    assert [b["bytes"] for b in a["buckets"]] == rb_bytes
    assert [sorted(b["params"]) for b in a["buckets"]] == [
        sorted(names[i] for i in b) for b in rb_params
    ]
    assert a["bucket_cap_mb"] == cap and not a["bucket_cap_default"]
    assert a["first_bucket_bytes"] in (None, int(cap * 1024 * 1024))

    # densities: numpy on each rank's gradients, the bucket's parameters
    plain = _plain_gradients(factory, W, seed)
    for b in a["buckets"]:
        flat = [np.concatenate([g[n] for n in b["params"]]) for g in plain]
        nnz = [int(np.count_nonzero(f)) for f in flat]
        assert b["density_per_worker"] == [k / b["numel"] for k in nnz]
        assert b["density"] == pytest.approx(np.mean(nnz) / b["numel"], rel=1e-12)
        union = np.count_nonzero(np.any(np.stack(flat) != 0, axis=0))
        assert b["union_density"] == union / b["numel"]
        # the prediction is predict's on these gradients (each fits unsampled)
        assert b["scale"] == 1 and b["simulated_elements"] == b["numel"]
        c, _ = adv.job_model(100, coeffs=COEFFS)
        again = adv.predict(flat, b["numel"], c, block=a["block_elements"], seed=seed)
        assert b["ring"]["time_s"] == pytest.approx(again["ring"]["time_s"], rel=1e-12)
        assert b["ring"]["bytes_per_worker"] == again["ring"]["bytes_per_worker"]
        for m in METHODS:
            assert b["methods"][m]["time_s"] == pytest.approx(
                again["methods"][m]["time_s"], rel=1e-12
            ), m
            assert b["methods"][m]["bytes"] == again["methods"][m]["bytes"], m
        assert b["best"] == min(METHODS, key=lambda m: b["methods"][m]["time_s"])
    # the embedding is sparse, the output layer is not
    emb = next(b for b in a["buckets"] if "emb.weight" in b["params"])
    out = next(b for b in a["buckets"] if "out.weight" in b["params"])
    assert emb["density"] < 0.1 < out["density"]

    it = a["iteration"]
    ring = sum(b["ring"]["time_s"] for b in a["buckets"])
    assert it["ring"]["time_s"] == pytest.approx(ring, rel=1e-12)
    for m in METHODS:
        r = it["methods"][m]
        assert r["time_s"] == pytest.approx(
            sum(b["methods"][m]["time_s"] for b in a["buckets"]), rel=1e-12
        )
        assert r["speedup"] == pytest.approx(ring / r["time_s"], rel=1e-12)
        assert r["binds"] == max(r["terms"], key=r["terms"].get)
    assert it["best"] == min(METHODS, key=lambda m: it["methods"][m]["time_s"])
    assert it["speedup"] == pytest.approx(ring / it["methods"][it["best"]]["time_s"], rel=1e-12)
    assert it["best_per_bucket_time_s"] <= it["methods"][it["best"]]["time_s"] * (1 + 1e-12)
    assert sum(it["best_per_bucket"].values()) == len(a["buckets"])
    assert a["coefficients"] == COEFFS
    assert any("communication only" in s for s in a["assumptions"])
    assert not am.MODEL_ASSUMPTIONS[0].startswith("HomAgg bytes: the codec run on the workload")


def test_text_output_names_buckets_and_the_iteration(capsys, tiny):
    code = cli.main(["advise", "--model", f"{tiny}:build", "--workers", "2", "--bucket-mb", "0.25"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "3 DDP buckets" in out and "per iteration" in out and "best:" in out
    for m in ("ring", *METHODS):
        assert m in out


def test_sampled_bucket_keeps_whole_blocks_spread_over_the_bucket():
    from homagg.ops import advise_model as am

    g = np.arange(10 * 64 + 5, dtype=np.float32)
    (s,) = am.sample_blocks([g], 64, 4 * 64)
    blocks = s.reshape(-1, 64)
    assert len(blocks) == 4
    starts = [int(b[0]) for b in blocks]
    assert starts == [0, 3 * 64, 6 * 64, 9 * 64]  # evenly spaced, the partial tail left out
    for b in blocks:
        assert np.array_equal(b, np.arange(b[0], b[0] + 64, dtype=np.float32))
    (same,) = am.sample_blocks([g], 64, g.size)
    assert same is g


def test_ncf_buckets_are_ddps(capsys):
    """The built-in NCF at DDP's default bucket size: its two embedding
    tables dominate, the bucket layout is torch's."""
    from homagg.train import models

    a = _advise(capsys, "--model", "ncf", "--workers", 2, "--sample-elements", 65536)
    model = models.ncf(0, 2, 1)[0]
    want = _torch_buckets(model)  # DDP's default cap: the first bucket at 1 MiB
    assert len(want) == 2
    assert a["bucket_cap_default"] and a["bucket_cap_mb"] == 25
    assert [sorted(b["params"]) for b in a["buckets"]] == [sorted(b) for b in want]
    user = next(b for b in a["buckets"] if "user.weight" in b["params"])
    assert user["scale"] > 1 and user["simulated_elements"] <= 65536
    assert 0 < user["density"] < 0.05  # a batch's users only
    assert a["iteration"]["best"] in METHODS


@pytest.mark.parametrize(
    "model,word",
    [
        ("{dir}/missing.py:build", "no file"),
        ("{dir}/tiny.py:nothere", "no callable 'nothere'"),
        ("{dir}/tiny.py:broken", "the factory raised for rank 0 (RuntimeError: no data here)"),
        ("{dir}/tiny.py:model_only", "must return (torch.nn.Module, batches, loss_fn)"),
        ("resnet", "not one of"),
    ],
)
def test_bad_model_is_one_line_exit_2(capsys, tiny, model, word):
    spec = model.format(dir=tiny.parent)
    code = cli.main(["advise", "--model", spec])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("homagg advise: ") and word in err and "--model" in err


def test_file_that_fails_to_import_is_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import no_such_module_here\n")
    code = cli.main(["advise", "--model", f"{bad}:build"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert "failed to import" in err and "no_such_module_here" in err


@pytest.mark.parametrize(
    "argv,word",
    [
        (["--model", "ncf", "--density", "0.1"], "--density"),
        (["--model", "ncf", "--elements", "100", "--workload", "zipf"], "--elements, --workload"),
        (
            [
                "--workers",
                "2",
                "--elements",
                "10",
                "--density",
                "0.1",
                "--link-mbit",
                "10",
                "--bucket-mb",
                "4",
            ],
            "--bucket-mb",
        ),
        (["--workers", "2", "--link-mbit", "10"], "--elements, --density"),
    ],
)
def test_options_that_do_not_go_with_model_or_without(capsys, argv, word):
    with pytest.raises(SystemExit) as e:
        cli.main(["advise", *argv])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("homagg advise: ")
    assert word in err
