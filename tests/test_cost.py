"""The cost model (docs/PROTOCOL.md "The cost model"): the C choices of
each block's index kind and of auto's method against the page's rules
written again in Python (tests/cost_model.py), decisions that come from the
job's registration and not from a worker's own calibration, the bytes rules
kept exactly for a job without a link rate, results bit-exact against the
numpy reference, and `homagg calibrate`'s file."""

import json
import os
import random

import numpy as np
import pytest

import cost_model as M
from reference import allreduce as oracle
from homagg import codec, cost
from homagg.bench import calibrate
from homagg.switch import job_file
from homagg.errors import InvalidArgument, OutOfRange
from homagg.sim import Cluster

# a host's coefficients, as `homagg calibrate` writes them (ps)
COEFFS = {
    "pkt_ps": 2_000_000,
    "agg_pkt_ps": 150_000,
    "value_ps": 1_000,
    "lane_ps": 7_000,
    "bitmap_ps": 400,
    "probe_ps": 2_100,
}


def _cost(link_mbit, **over):
    return dict(link_mbit=link_mbit, rtt_ns=100_000, payload_bytes=1024, **{**COEFFS, **over})


def _meta(grads, block, workers):
    """Global codes and summed counts of the workers' gradients."""
    p = codec.Params(block_elements=block, workers=workers)
    codes = np.max([codec.encode_exponents(p, g) for g in grads], axis=0).astype(np.int8)
    counts = np.sum([codec.encode_counts(p, g).astype(np.int64) for g in grads], axis=0)
    return codes, counts


def _shared(n, workers, density, seed):
    """Gradients whose non-zeros sit at the same positions on every worker."""
    rng = np.random.default_rng(seed)
    pos = rng.choice(n, size=int(density * n), replace=False)
    grads = []
    for _ in range(workers):
        g = np.zeros(n, np.float32)
        g[pos] = rng.standard_normal(pos.size).astype(np.float32)
        grads.append(g)
    return grads


def _random_cost(rng):
    return dict(
        link_mbit=rng.choice([1, 10, 100, 1000, 10000, 400000]),
        rtt_ns=rng.randrange(0, 10**6),
        payload_bytes=rng.choice([0, 4, 1024, 8192]),
        pkt_ps=rng.randrange(0, 10**7),
        agg_pkt_ps=rng.randrange(0, 10**6),
        value_ps=rng.randrange(0, 5000),
        lane_ps=rng.randrange(0, 10000),
        bitmap_ps=rng.randrange(0, 2000),
        probe_ps=rng.choice([0, rng.randrange(0, 5000)]),
        sbbf_ps=rng.choice([0, rng.randrange(0, 3000)]),
    )


def test_index_kind_of_every_block_is_the_models():
    """One block at a time (its kind and bytes name the option), over
    random sizes, counts, worker counts, links and coefficients: the C plan
    is the page's, and a Bloom option is chosen only where the model
    predicts it strictly faster than the bitmap."""
    rng = random.Random(19)
    blooms = splits = 0
    for _ in range(1500):
        block = rng.choice([64, 128, 4096, 65536])
        workers = rng.choice([1, 2, 4, 7, 256])
        count = rng.choice(
            [0, 1, 2, rng.randrange(0, block * workers + 1), rng.randrange(0, block // 8 + 2)]
        )
        c = _random_cost(rng)
        info = codec.plan_lhc(
            codec.Params(block_elements=block, workers=workers, cost=c),
            block,
            np.array([3], np.int8),
            np.array([count], ">i4"),
        ).info
        kind, nbytes, ix = M.plan_block(block, count, workers, c)
        got = "split" if info["split_blocks"] else "bloom" if info["bloom_blocks"] else "bitmap"
        assert (got, info["index_bytes"]) == (kind, nbytes), (block, workers, count, c)
        splits += kind == "split"
        if kind in ("bloom", "split"):  # the fastest option, and faster than the bitmap
            blooms += 1
            bitmap, options = M.option_times(block, count, workers, c)
            best = min(t for _, t in options)
            assert best < bitmap
            assert nbytes in [b for b, t in options if t == best]
    assert blooms - splits > 20 and splits > 20  # the draw reaches every kind


def test_bloom_where_the_link_is_slow_bitmap_where_probing_costs_more():
    """One non-zero in a 65536-element block: at 1 Mbit/s the Bloom filter
    (8 bytes for 8 KB) is faster, at 1 Gbit/s probing 65536 elements costs
    more than the bitmap's wire time; under the bytes rule it is Bloom."""
    n, block, W = 2 * 65536, 65536, 2
    grads = [np.zeros(n, np.float32) for _ in range(W)]
    grads[0][5] = 1.5
    grads[1][70000] = -2.25
    codes, counts = _meta(grads, block, W)
    kinds = {}
    for link in (0, 1, 1000):
        c = _cost(link) if link else {}
        info = codec.plan_lhc(
            codec.Params(block_elements=block, workers=W, cost=c), n, codes, counts.astype(">i4")
        ).info
        want = [M.plan_block(block, int(k), W, c)[0] for k in counts]
        assert ["bloom"] * info["bloom_blocks"] + ["bitmap"] * info["bitmap_blocks"] == sorted(
            want, reverse=True
        )
        kinds[link] = want
        with Cluster(workers=W, cost=c, pipeline_groups=1) as cl:
            res = cl.job.allreduce(grads, method="union", block_elements=block)
        np.testing.assert_array_equal(res.sum.view(np.uint32), oracle(grads, block).view(np.uint32))
    assert kinds == {0: ["bloom", "bloom"], 1: ["bloom", "bloom"], 1000: ["bitmap", "bitmap"]}


def test_auto_at_100_mbit_and_10_gbit_decides_as_the_model():
    """A tensor whose candidates cover 80 % of it: union sends fewer bytes
    than dense, so the bytes rule and a 100 Mbit/s link choose union; at
    10 Gbit/s union's CPU per lane outweighs the wire it saves and the
    model chooses dense.  The simulated cluster (one job registration per
    rate) runs what the model predicts, bit-exact."""
    n, block, W = 16 * 4096, 4096, 2
    grads = _shared(n, W, 0.8, 3)
    codes, counts = _meta(grads, block, W)
    chosen = {}
    for link in (0, 100, 10_000):
        c = _cost(link) if link else {}
        want = M.auto_meta(n, block, W, list(codes), [int(k) for k in counts], c)
        if want == "union":
            cands = int(np.count_nonzero(np.any([g != 0 for g in grads], axis=0)))
            want = M.auto_indexed(n, block, W, list(codes), cands, c)
        with Cluster(workers=W, cost=c, pipeline_groups=1) as cl:
            res = cl.job.allreduce(grads, method="auto", block_elements=block)
        assert res.stats["method"] == want, link
        np.testing.assert_array_equal(res.sum.view(np.uint32), oracle(grads, block).view(np.uint32))
        chosen[link] = want
    assert chosen == {0: "union", 100: "union", 10_000: "dense"}


def test_without_a_link_rate_every_choice_is_the_bytes_rule():
    """A cost with coefficients but no link rate, and no cost at all, plan
    the same index and make the same auto choices as the bytes rules of the
    page, on random tensors."""
    rng = np.random.default_rng(4)
    for trial in range(12):
        W = int(rng.integers(1, 6))
        block = int(rng.choice([64, 256, 4096]))
        n = int(rng.integers(1, 20)) * block - int(rng.integers(0, block // 2))
        dens = float(rng.choice([0.0005, 0.01, 0.1, 0.6]))
        grads = [
            np.where(rng.random(n) < dens, rng.standard_normal(n), 0).astype(np.float32)
            for _ in range(W)
        ]
        codes, counts = _meta(grads, block, W)
        gc = counts.astype(">i4")
        outs = []
        for c in (None, dict(COEFFS, link_mbit=0, sbbf_ps=50)):
            p = codec.Params(block_elements=block, workers=W, cost=c)
            plan = codec.plan_lhc(p, n, codes, gc)
            plan.set_index(np.bitwise_or.reduce([plan.encode_index(g) for g in grads]))
            outs.append(
                (plan.info, codec.choose_auto(p, n, codes, gc), codec.choose_auto_indexed(plan))
            )
        assert outs[0] == outs[1]
        info, first, final = outs[0]
        lens = M.block_lens(n, block)
        plans = [
            M.plan_block(ln, int(k), W, {})
            for ln, k, cd in zip(lens, counts, codes)
            if cd != M.EXP_ZERO
        ]
        assert info["index_bytes"] == sum(b for _, b, _ in plans)
        assert info["bloom_blocks"] == sum(k == "bloom" for k, _, _ in plans)
        assert info["split_blocks"] == 0
        assert first == M.auto_meta(n, block, W, list(codes), [int(k) for k in counts], {})
        assert final == M.auto_indexed(n, block, W, list(codes), info["candidates"], {})


def test_split_block_index_where_predicted_faster_and_exact():
    """NCF's bucket shape (0.68 % per worker, W = 4, blocks of 4096) at 1
    Gbit/s: with a split-block coefficient below the Bloom options' k
    probes the model takes split-block filters, each block as the page's
    rule says, and union and lhc allreduces through them are bit-exact;
    the same model without sbbf_ps (a calibration from before version 3)
    plans exactly as before: no split-block block, the same index bytes as
    the page's rule without the options."""
    W, block, n = 4, 4096, 40 * 4096 - 100
    rng = np.random.default_rng(23)
    grads = [
        np.where(rng.random(n) < 0.0068, rng.standard_normal(n), 0).astype(np.float32)
        for _ in range(W)
    ]
    codes, counts = _meta(grads, block, W)
    gc = counts.astype(">i4")
    lens = M.block_lens(n, block)
    infos = {}
    for sbbf in (0, 100):
        c = _cost(1000, probe_ps=72, sbbf_ps=sbbf)
        plan = codec.plan_lhc(codec.Params(block_elements=block, workers=W, cost=c), n, codes, gc)
        want = [M.plan_block(ln, int(k), W, c) for ln, k in zip(lens, counts)]
        infos[sbbf] = plan.info
        assert plan.info["split_blocks"] == sum(k == "split" for k, _, _ in want)
        assert plan.info["index_bytes"] == sum(b for _, b, _ in want)
        with Cluster(workers=W, cost=c) as cl:
            for method in ("union", "lhc"):
                res = cl.job.allreduce(grads, method=method, block_elements=block)
                np.testing.assert_array_equal(
                    res.sum.view(np.uint32), oracle(grads, block).view(np.uint32)
                )
    assert infos[0]["split_blocks"] == 0 and infos[0]["bloom_blocks"] > 0
    assert infos[100]["split_blocks"] == len(lens)


def _calibration(coeffs):
    return {
        "version": cost.CALIBRATION_VERSION,
        "host": "h",
        "cpu": "c",
        "isa": "portable",
        "paths": {"portable": dict(coeffs)},
    }


def test_workers_with_other_calibrations_decide_as_the_job(tmp_path):
    """The job registers host A's calibration at 1 Gbit/s.  Hosts B and C
    calibrated very differently (with their own numbers auto would choose
    differently), yet every rank's job configuration carries A's model,
    whatever HOMAGG_CALIBRATION names, and the run chooses as A's model
    predicts, bit-exact."""
    n, block, W = 16 * 4096, 4096, 2
    grads = _shared(n, W, 0.8, 5)
    codes, counts = _meta(grads, block, W)
    cands = int(np.count_nonzero(np.any([g != 0 for g in grads], axis=0)))
    cal = {
        "A": COEFFS,
        "B": dict(COEFFS, lane_ps=0, pkt_ps=0),
        "C": dict(COEFFS, lane_ps=200_000, value_ps=0),
    }
    files = {}
    for name, co in cal.items():
        files[name] = str(tmp_path / f"{name}.json")
        calibrate.write(_calibration(co), files[name])

    def decide(coeffs):
        c = cost.job_cost(1000, calibration=_calibration(coeffs)).fields()
        first = M.auto_meta(n, block, W, list(codes), [int(k) for k in counts], c)
        return first if first != "union" else M.auto_indexed(n, block, W, list(codes), cands, c)

    assert decide(cal["B"]) != decide(cal["C"])  # local numbers would split the job
    registered = cost.job_cost(1000, calibration=cost.load_calibration(files["A"]))
    jf = job_file.write_job_file(
        str(tmp_path / "job.json"),
        aggregator="10.0.0.1:48879",
        job=1,
        token=2,
        workers=W,
        cost=registered.fields(),
    )
    seen = [
        job_file.job_config({"HOMAGG_JOB_FILE": jf, cost.CALIBRATION_ENV: files[h]})["cost"]
        for h in ("B", "C")
    ]
    assert seen[0] == seen[1] == registered.fields()
    with Cluster(workers=W, cost=seen[0], pipeline_groups=1) as cl:
        res = cl.job.allreduce(grads, method="auto", block_elements=block)
    assert res.stats["method"] == decide(cal["A"])
    np.testing.assert_array_equal(res.sum.view(np.uint32), oracle(grads, block).view(np.uint32))


def test_calibrate_writes_a_calibration_jobs_read(tmp_path, monkeypatch, capsys):
    """`homagg calibrate --json --out PATH` on a small tensor: a well-formed
    file (every coefficient of every ISA path this CPU runs, within its
    bound) that the job creation reads through HOMAGG_CALIBRATION."""
    from homagg import cli, kernels

    out = tmp_path / "cal.json"
    assert (
        cli.main(["calibrate", "--json", "--out", str(out), "--elements", "65536", "--repeat", "1"])
        == 0
    )
    printed = json.loads(capsys.readouterr().out)
    cal = cost.check_calibration(json.loads(out.read_text()))
    assert printed["file"] == str(out)
    assert set(cal["paths"]) == {i for i in calibrate.ISAS if kernels.isa_supported(i)}
    for coeffs in cal["paths"].values():
        assert set(coeffs) == set(cost.COEFFICIENTS)
        assert coeffs["value_ps"] > 0 and coeffs["pkt_ps"] > 0 and coeffs["agg_pkt_ps"] > 0
    monkeypatch.setenv(cost.CALIBRATION_ENV, str(out))
    monkeypatch.delenv("HOMAGG_CODEC_ISA", raising=False)
    assert cost.calibration_path() == str(out)
    job = cost.job_cost(1000)
    assert {k: getattr(job, k) for k in cost.COEFFICIENTS} == cal["paths"][cal["isa"]]
    assert cost.job_cost(None) == cost.Cost()  # no link rate: no model


def test_bad_costs_name_the_field(tmp_path):
    with pytest.raises(InvalidArgument, match="cost.value_ps"):
        cost.Cost(link_mbit=1000, value_ps=2_000_000)
    with pytest.raises(InvalidArgument, match="unknown fields"):
        cost.Cost.from_dict({"link_mbit": 1, "speed": 3})
    with pytest.raises(OutOfRange):  # hg_params_check's own bound
        codec.encode_exponents(
            codec._b.params_new(workers=1, cost={"probe_ps": 2_000_000}), np.zeros(64, np.float32)
        )
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_calibration(dict(COEFFS, lane_ps=-1))))
    with pytest.raises(InvalidArgument, match="paths.portable.lane_ps"):
        cost.load_calibration(str(bad))
    jf = job_file.write_job_file(str(tmp_path / "j.json"), aggregator="10.0.0.1", job=1, token=2)
    with pytest.raises(job_file.ConfigError, match="HOMAGG_COST"):
        job_file.job_config({"HOMAGG_JOB_FILE": jf, "HOMAGG_COST": '{"link_mbit": -1}'})
    assert job_file.job_config({"HOMAGG_JOB_FILE": jf})["cost"] == {}
    os.unlink(jf)


def test_inventory_link_rate_registers_a_model(tmp_path, monkeypatch):
    """An inventory's ``link_mbit`` gives its jobs a cost model (this
    host's calibration); without it none; a bad one is named."""
    import re
    import tomllib

    from homagg.deploy.remote import hosts as remote
    from homagg.deploy.remote import inventory as inv
    from homagg.deploy.remote.placement import InventoryPlacement

    text = open(os.path.join(os.path.dirname(__file__), "..", "docs", "INVENTORY.md")).read()
    data = tomllib.loads(re.search(r"```toml\n(.*?)```", text, re.S).group(1))
    (tmp_path / "id").write_text("x")
    (tmp_path / "p.tar.gz").write_text("x")
    data["settings"]["project"] = str(tmp_path / "p.tar.gz")
    for h in data["hosts"]:
        h["ssh_key"] = str(tmp_path / "id")
    out = tmp_path / "cal.json"
    calibrate.write(_calibration(COEFFS), str(out))
    monkeypatch.setenv(cost.CALIBRATION_ENV, str(out))
    monkeypatch.delenv("HOMAGG_CODEC_ISA", raising=False)
    assert remote.inventory_cost(inv.parse(data, str(tmp_path / "t.toml"))) == cost.Cost()
    data["settings"]["link_mbit"] = 10000
    c = remote.inventory_cost(inv.parse(data, str(tmp_path / "t.toml")))
    assert c == cost.Cost(link_mbit=10000, rtt_ns=cost.DEFAULT_RTT_NS, **COEFFS)
    # a run on the inventory's hosts registers the same model (--no-cost-model: none)
    pl = InventoryPlacement(inv.parse(data, str(tmp_path / "t.toml")))
    assert pl.job_cost() == c and pl.job_cost(False) == cost.Cost() and pl.link_mbit == 10000
    data["settings"]["link_mbit"] = "fast"
    with pytest.raises(inv.InventoryError, match="link_mbit"):
        inv.parse(data, str(tmp_path / "t.toml"))


# ---- the hook's choice of path: HomAgg or the process group's allreduce ----

COEFFS = {
    "pkt_ps": 2_000_000,
    "agg_pkt_ps": 150_000,
    "value_ps": 1_000,
    "lane_ps": 7_000,
    "bitmap_ps": 400,
    "probe_ps": 2_100,
}


def _paper_times(link_mbit, W, n, nnz_max, block=4096, rtt_ns=100_000):
    """docs/TRAINING.md's formulas, written out: (ring, dense, union) in ps."""
    byte_ps = 8_000_000 // link_mbit
    xb = byte_ps + (COEFFS["pkt_ps"] + W * COEFFS["agg_pkt_ps"] + 98 * byte_ps) // 1024
    rt = rtt_ns * 1000
    nb = -(-n // block)
    ring = -(-(2 * (W - 1) * 4 * n) // W) * byte_ps + (W - 1) * rt
    dense = (nb + 4 * n) * xb + n * COEFFS["value_ps"] + 2 * rt
    lanes = min(n, W * nnz_max)
    union = (
        (5 * nb + -(-n // 8)) * xb
        + n * COEFFS["bitmap_ps"]
        + lanes * (4 * xb + COEFFS["lane_ps"])
        + 4 * rt
    )
    return ring, dense, union


@pytest.mark.parametrize(
    "link, W, n, nnz, method, path",
    [
        # the LSTM's dense 1.29 M bucket, 4 ranks: HomAgg's 4n bytes against ring's 6n
        (100, 4, 1_290_000, 1_290_000, "auto", "homagg"),
        (10_000, 4, 1_290_000, 1_290_000, "auto", "baseline"),
        # 2 ranks: ring sends 4n as dense does, without its framing and CPU
        (100, 2, 1_290_000, 1_290_000, "dense", "baseline"),
        # NCF's 3.85 M bucket at 0.68 %: union at every rate
        (100, 4, 3_846_305, 26_155, "auto", "homagg"),
        (10_000, 4, 3_846_305, 26_155, "auto", "homagg"),
        (10_000, 4, 3_846_305, 26_155, "union", "homagg"),
        # dense's bound alone for dense and blocks, whatever the density
        (10_000, 4, 3_846_305, 26_155, "dense", "baseline"),
        (10_000, 4, 3_846_305, 26_155, "blocks", "baseline"),
        # a tiny bucket: ring's one half round trip per step beats two round trips
        (1000, 2, 10, 10, "auto", "baseline"),
    ],
)
def test_choice_of_path_is_the_documented_rule(link, W, n, nnz, method, path):
    c = cost.job_cost(link, coeffs=COEFFS)
    got = cost.choose_path(c, W, n, nnz, method)
    ring, dense, union = _paper_times(link, W, n, nnz)
    want_h = {
        "dense": dense,
        "blocks": dense,
        "union": union,
        "lhc": union,
        "auto": min(dense, union),
    }[method]
    assert got == {"path": path, "homagg_ps": want_h, "baseline_ps": ring}
    assert (ring < want_h) == (path == "baseline")
    # the count is agreed only where it can change the choice
    assert cost.needs_density(c, W, n, method) == (
        method in ("union", "lhc") or (method == "auto" and ring < dense)
    )


def test_choice_of_path_without_a_model_or_exactness_is_homagg():
    none = {"path": "homagg", "homagg_ps": None, "baseline_ps": None}
    assert cost.choose_path(cost.Cost(), 4, 10_000_000, 10_000_000) == none
    assert not cost.needs_density(cost.Cost(), 4, 10_000_000)
    fast = cost.job_cost(100_000, coeffs=COEFFS)
    assert cost.choose_path(fast, 4, 10_000_000, 10_000_000, "nc") == none
    assert cost.choose_path(fast, 1, 10_000_000, 10_000_000) == none
    with pytest.raises(InvalidArgument, match="method 'nc'"):
        cost.homagg_ps(fast, 4, 100, 100, "nc")


def test_the_hook_predicts_with_the_job_s_payload():
    """homagg.torch's choice of path prices a packet over the bytes the
    job's packets carry, as the worker's client does (cost.for_payload):
    with a local testbed's cost at 1 Gbit/s and 4 ranks, a dense
    1.29 M-element bucket (the LSTM's) is predicted faster through the
    group at 1024-byte payloads and through HomAgg at 8192-byte ones
    (jumbo links); the prediction the hook logs is the model's at the
    worker's payload, whatever payload the given cost names."""
    import homagg.torch as hgt
    from homagg.worker import Worker

    n, W = 1_290_000, 4
    given = cost.Cost(
        link_mbit=1000,
        rtt_ns=100_000,
        pkt_ps=5_000_000,
        agg_pkt_ps=375_000,
        value_ps=2_500,
        lane_ps=17_500,
        bitmap_ps=1_000,
        probe_ps=5_250,
        sbbf_ps=7_000,
    )
    want = {}
    for payload in (1024, 8192):
        c = cost.for_payload(given, payload)
        assert c.payload_bytes == payload and c.link_mbit == 1000
        want[payload] = cost.choose_path(c, W, n, None, "dense")
    assert want[1024]["path"] == "baseline" and want[8192]["path"] == "homagg"
    assert want[8192]["homagg_ps"] < want[1024]["homagg_ps"]
    assert cost.for_payload(given, 0) is given
    for payload in (1024, 8192):
        with Worker(
            1,
            2,
            0,
            W,
            aggregator=("127.0.0.1", 9),
            bind=("127.0.0.1", 0),
            mtu=9000,
            payload=payload,
        ) as wk:
            for named in (0, 1424):
                st = hgt.HookState(
                    wk,
                    method="dense",
                    cost=cost.for_payload(given, named),
                    fallback=False,
                    baseline=False,
                    env={},
                )
                try:
                    assert st.cost.payload_bytes == payload
                    assert cost.choose_path(st.cost, W, n, None, "dense") == want[payload]
                finally:
                    st.close()
