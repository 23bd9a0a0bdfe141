"""Pipelined block groups (docs/PROTOCOL.md Part 3, "Pipelined block groups").

dense, blocks, nc, lhc and union cut the tensor into G block groups that go
through the method's steps independently, numbered by a fixed wavefront
schedule (auto is not pipelined).
Through the NIC-model cluster (the real engine and clients), under seeded
loss, duplication and reordering, a pipelined allreduce must give the bits
of the unpipelined one (pipeline_groups=1) and of the numpy oracle
(tests/reference.py), on every worker; the number of groups and of chunks
must be the spec's, computed here from its formulas; the engine must sum
every contribution exactly once.
"""
import numpy as np
import pytest

import reference
from homagg import protocol
from homagg.errors import InvalidArgument
from homagg.sim import Cluster

pytestmark = pytest.mark.sanitize

BLOCK = 256
PAYLOAD = 1024
FAULTS = {"loss": 0.02, "duplicate": 0.02, "reorder": 0.1}


def grads_for(workers, n, seed, zero_groups=False):
    """Sparse gradients with magnitudes over many binades; with zero_groups
    the first 3 * 1024 elements are zero on every worker (whole groups of
    blocks leave no values, so units without chunks occur)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(workers):
        x = np.zeros(n, np.float32)
        nz = rng.random(n) < 0.3
        x[nz] = (rng.standard_normal(nz.sum()) * 10.0 ** rng.integers(-5, 3, nz.sum()))
        if zero_groups:
            x[:3 * 1024] = 0
        out.append(x)
    return out


PIPELINED = ("dense", "blocks", "lhc", "nc", "union")
VALUE_METHODS = ("dense", "blocks", "nc")  # their chunk counts follow from the data alone


def oracle(method, grads, seed):
    if method == "nc":
        return reference.allreduce_nc(grads, BLOCK, seed)
    if method == "dense":  # stochastic rounding: the streams index the whole tensor
        return reference.allreduce_stochastic(grads, BLOCK, seed)
    return reference.allreduce(grads, BLOCK)


def options(method, seed):
    return {"block_elements": BLOCK, "seed": seed, "stochastic": method == "dense"}


def spec_groups(n, option, slots, aggregators=1, method="dense"):
    """G and blocks per group, from the spec's formulas."""
    nb = -(-n // BLOCK)
    if option == 1 or nb <= 1:
        return 1, max(nb, 1)
    if option == 0:
        gb = max(-(-nb // 8), -(-4 * aggregators * slots * (PAYLOAD // 4) // BLOCK))
    else:
        gb = -(-nb // option)
    gb = min(max(gb, 1), nb)
    return -(-nb // gb), gb


def spec_chunks(method, grads, option, slots, aggregators=1):
    """Chunks of the allreduce: per group, its exponents (1 lane per block,
    PAYLOAD lanes per chunk) and its values or codes (PAYLOAD / 4 lanes per
    chunk; blocks: only blocks non-zero on some worker)."""
    n = grads[0].size
    G, gb = spec_groups(n, option, slots, aggregators)
    nb = -(-n // BLOCK)
    nonzero = np.zeros(nb, bool)
    for g in grads:
        pad = np.zeros(nb * BLOCK, np.float32)
        pad[:n] = g
        nonzero |= (pad.reshape(nb, BLOCK) != 0).any(axis=1)
    total = 0
    for g in range(G):
        b0, b1 = g * gb, min(nb, (g + 1) * gb)
        lanes = sum(min(n, (b + 1) * BLOCK) - b * BLOCK for b in range(b0, b1)
                    if method != "blocks" or nonzero[b])
        total += -(-(b1 - b0) // PAYLOAD) + -(-lanes // (PAYLOAD // 4))
    return G, total


def run(grads, method, option, slots, seed, faults=FAULTS, aggregators=1):
    """One allreduce on a fresh cluster; the Result, with "engines": the
    counters of its K engines summed."""
    with Cluster(workers=len(grads), seed=seed, slots=slots, payload=PAYLOAD,
                 pipeline_groups=option, aggregators=aggregators, **faults) as cl:
        res = cl.allreduce(grads, method=method, **options(method, seed + 1))
        engines = [cl.aggregator_counters(k)["engine"] for k in range(aggregators)]
    res.stats["engines"] = {key: sum(e[key] for e in engines) for key in engines[0]}
    return res


def assert_bits(got, want):
    got = np.asarray(got, np.float32)
    want = np.asarray(want, np.float32)
    assert got.shape == want.shape
    diff = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert diff.size == 0, f"{diff.size} elements differ, first at {diff[:5]}"


def test_pipelined_methods_are_the_block_wise_ones():
    assert protocol.PIPELINED_METHODS == PIPELINED


CASES = [  # workers, n, slots, pipeline_groups, aggregators
    (2, 100, 8, 0, 1),            # tiny: one block, one group
    (3, 2 * BLOCK + 7, 4, 3, 1),  # three groups, the last one 7 elements
    (4, 40_000, 4, 0, 1),         # automatic: 16 blocks per group, not a multiple
    (4, 40_000, 16, 7, 1),
    (5, 33_333, 8, 1000, 1),      # one block per group
    (8, 20_480, 2, 0, 1),
    (4, 40_000, 4, 0, 3),         # K = 3: 48 blocks per group, chunks spread over three
]


@pytest.mark.parametrize("method", PIPELINED)
@pytest.mark.parametrize("workers,n,slots,option,aggregators", CASES)
def test_pipelined_equals_unpipelined_and_oracle_under_faults(method, workers, n, slots, option,
                                                              aggregators):
    seed = 1000 * workers + n % 997 + option + aggregators
    grads = grads_for(workers, n, seed, zero_groups=n > 4 * 1024)
    want = oracle(method, grads, seed + 1)
    plain = run(grads, method, 1, slots, seed, aggregators=aggregators)
    piped = run(grads, method, option, slots, seed, aggregators=aggregators)
    assert plain.stats["workers"][0]["groups"] == 1
    for res in (plain, piped):
        assert_bits(res.sum, want)
        for out in res.outputs:
            assert_bits(out, res.sum)
        assert res.stats["fabric"]["dropped_loss"] > 0 or n < 1000
    if method in VALUE_METHODS:
        G, chunks = spec_chunks(method, grads, option, slots, aggregators)
    else:  # lhc, union: the sizes of their index and sketch come from the data
        G = spec_groups(n, option, slots, aggregators, method)[0]
        chunks = piped.stats["workers"][0]["chunks"]
        if method == "lhc":
            assert piped.stats["workers"][0]["stalled_blocks"] == \
                plain.stats["workers"][0]["stalled_blocks"]
    for w in piped.stats["workers"]:
        assert w["groups"] == G
        assert w["chunks"] == chunks
        assert w["next_seq"] == chunks
    eng = piped.stats["engines"]
    # every chunk completed once, every contribution summed once
    assert eng["completed"] == chunks
    assert eng["summed"] == workers * chunks


@pytest.mark.parametrize("method", PIPELINED)
def test_all_zero_tensors_and_zero_groups(method):
    n = 30_000
    zeros = [np.zeros(n, np.float32)] * 3
    res = run(zeros, method, 0, 4, 5)
    assert_bits(res.sum, np.zeros(n, np.float32))
    if method in VALUE_METHODS:
        G, chunks = spec_chunks(method, zeros, 0, 4)
    else:  # only the exponents and the counts travel (no block has a candidate)
        G, gb = spec_groups(n, 0, 4, method=method)
        nb = -(-n // BLOCK)
        sizes = [min(nb, (g + 1) * gb) - g * gb for g in range(G)]
        chunks = sum(-(-k // PAYLOAD) + -(-k // (PAYLOAD // 4)) for k in sizes)
    assert G > 1
    assert res.stats["workers"][0]["groups"] == G
    assert res.stats["workers"][0]["chunks"] == chunks
    if method == "blocks":  # nothing but the exponents travels
        assert res.stats["workers"][0]["bytes_sent"]["values"] == 0


def test_successive_allreduces_mix_pipelined_and_other_methods():
    """The chunk counter runs on across pipelined and unpipelined
    allreduces; lhc, union and auto are never pipelined."""
    grads = grads_for(3, 25_000, 42, zero_groups=True)
    with Cluster(workers=3, seed=3, slots=8, pipeline_groups=0, **FAULTS) as cl:
        seq = 0
        for method in ("dense", "lhc", "nc", "auto", "blocks", "union", "dense"):
            res = cl.allreduce(grads, method=method, **options(method, 77))
            assert_bits(res.sum, oracle(method if method in ("dense", "nc") else "blocks",
                                        grads, 77))
            st = res.stats["workers"]
            assert len({w["next_seq"] for w in st}) == 1
            assert st[0]["next_seq"] > seq
            seq = st[0]["next_seq"]
            want_groups = (spec_groups(25_000, 0, 8, method=method)[0]
                           if method in PIPELINED else 1)
            assert {w["groups"] for w in st} == {want_groups}


def test_results_repeat_across_seeds_of_the_fabric():
    """Timing changes with the fault seed; the numbering and the bits do not."""
    grads = grads_for(4, 50_000, 9, zero_groups=True)
    sums, seqs, times = [], [], []
    for fseed in (1, 2, 3):
        with Cluster(workers=4, seed=fseed, slots=8, pipeline_groups=0, **FAULTS) as cl:
            res = cl.allreduce(grads, method="blocks", block_elements=BLOCK)
        sums.append(res.sum)
        seqs.append(res.stats["workers"][0]["next_seq"])
        times.append(res.stats["virtual_time"])
    assert len(set(times)) > 1  # the faults did change the timing
    assert seqs == [spec_chunks("blocks", grads, 0, 8)[1]] * 3
    for s in sums:
        assert_bits(s, sums[0])
    assert_bits(sums[0], reference.allreduce(grads, BLOCK))


@pytest.mark.parametrize("bad", [-1, 1.5, "two", True, 2**32])
def test_bad_pipeline_groups_is_refused(bad):
    with pytest.raises(InvalidArgument, match="pipeline_groups"):
        Cluster(workers=2, pipeline_groups=bad)


def test_pipelined_through_a_tree_of_aggregators():
    """Leaves forward one partial sum per slot to the root: the clients'
    pipelined numbering is all they see, and the result stays exact."""
    grads = grads_for(6, 30_000, 21, zero_groups=True)
    with Cluster(workers=6, leaves=2, seed=4, slots=4, pipeline_groups=0,
                 loss=0.01, reorder=0.05) as cl:
        res = cl.allreduce(grads, method="blocks", block_elements=BLOCK)
    assert_bits(res.sum, reference.allreduce(grads, BLOCK))
    assert {w["groups"] for w in res.stats["workers"]} == {spec_groups(30_000, 0, 4)[0]}
