"""Pipelined block groups (docs/PROTOCOL.md Part 3, "Pipelined block groups").

Every method cuts the tensor into G block groups that go through the
method's steps independently, numbered by a fixed wavefront schedule; auto
chooses per group (exponents; counts; index or nothing; dense, blocks or
union values), and every worker must make the same choice for each group.
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
        x[nz] = rng.standard_normal(nz.sum()) * 10.0 ** rng.integers(-5, 3, nz.sum())
        if zero_groups:
            x[: 3 * 1024] = 0
        out.append(x)
    return out


PIPELINED = ("dense", "blocks", "lhc", "nc", "auto", "union")
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
        lanes = sum(
            min(n, (b + 1) * BLOCK) - b * BLOCK
            for b in range(b0, b1)
            if method != "blocks" or nonzero[b]
        )
        total += -(-(b1 - b0) // PAYLOAD) + -(-lanes // (PAYLOAD // 4))
    return G, total


def run(grads, method, option, slots, seed, faults=FAULTS, aggregators=1):
    """One allreduce on a fresh cluster; the Result, with "engines": the
    counters of its K engines summed."""
    with Cluster(
        workers=len(grads),
        seed=seed,
        slots=slots,
        payload=PAYLOAD,
        pipeline_groups=option,
        aggregators=aggregators,
        **faults,
    ) as cl:
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
    (2, 100, 8, 0, 1),  # tiny: one block, one group
    (3, 2 * BLOCK + 7, 4, 3, 1),  # three groups, the last one 7 elements
    (4, 40_000, 4, 0, 1),  # automatic: 16 blocks per group, not a multiple
    (4, 40_000, 16, 7, 1),
    (5, 33_333, 8, 1000, 1),  # one block per group
    (8, 20_480, 2, 0, 1),
    (4, 40_000, 4, 0, 3),  # K = 3: 48 blocks per group, chunks spread over three
]


@pytest.mark.parametrize("method", PIPELINED)
@pytest.mark.parametrize("workers,n,slots,option,aggregators", CASES)
def test_pipelined_equals_unpipelined_and_oracle_under_faults(
    method, workers, n, slots, option, aggregators
):
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
    else:  # lhc, union, auto: the sizes of their index and sketch come from the data
        G = spec_groups(n, option, slots, aggregators, method)[0]
        chunks = piped.stats["workers"][0]["chunks"]
        if method == "lhc":
            assert (
                piped.stats["workers"][0]["stalled_blocks"]
                == plain.stats["workers"][0]["stalled_blocks"]
            )
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
    elif method == "auto":  # only the exponents: no counts (no non-zero block), blocks
        G, chunks = spec_chunks("blocks", zeros, 0, 4)
        assert res.stats["workers"][0]["auto_blocks_groups"] == G
    else:  # only the exponents and the counts travel (no block has a candidate)
        G, gb = spec_groups(n, 0, 4, method=method)
        nb = -(-n // BLOCK)
        sizes = [min(nb, (g + 1) * gb) - g * gb for g in range(G)]
        chunks = sum(-(-k // PAYLOAD) + -(-k // (PAYLOAD // 4)) for k in sizes)
    assert G > 1
    assert res.stats["workers"][0]["groups"] == G
    assert res.stats["workers"][0]["chunks"] == chunks
    if method in ("blocks", "auto"):  # nothing but the exponents travels
        assert res.stats["workers"][0]["bytes_sent"]["values"] == 0


def test_successive_allreduces_mix_pipelined_and_other_methods():
    """The chunk counter runs on across the allreduces of every method,
    pipelined with the job's option."""
    grads = grads_for(3, 25_000, 42, zero_groups=True)
    with Cluster(workers=3, seed=3, slots=8, pipeline_groups=0, **FAULTS) as cl:
        seq = 0
        for method in ("dense", "lhc", "nc", "auto", "blocks", "union", "dense"):
            res = cl.allreduce(grads, method=method, **options(method, 77))
            assert_bits(
                res.sum, oracle(method if method in ("dense", "nc") else "blocks", grads, 77)
            )
            st = res.stats["workers"]
            assert len({w["next_seq"] for w in st}) == 1
            assert st[0]["next_seq"] > seq
            seq = st[0]["next_seq"]
            want_groups = spec_groups(25_000, 0, 8, method=method)[0] if method in PIPELINED else 1
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
    with Cluster(
        workers=6, leaves=2, seed=4, slots=4, pipeline_groups=0, loss=0.01, reorder=0.05
    ) as cl:
        res = cl.allreduce(grads, method="blocks", block_elements=BLOCK)
    assert_bits(res.sum, reference.allreduce(grads, BLOCK))
    assert {w["groups"] for w in res.stats["workers"]} == {spec_groups(30_000, 0, 4)[0]}


# ---- auto, choosing per group ------------------------------------------------


def _nonzero(x):
    return np.asarray(x) != 0


def auto_grads(workers, n, kind, seed, gb=None):
    """Gradients on which auto's per-group choice is clear-cut.
    dense: every element non-zero on every worker (dense);
    shared: the same ~2 % of positions on every worker (union);
    random: 30 % of positions per worker, drawn independently (union);
    zeros: nothing (blocks, no values);
    mixed: group g (gb blocks) is dense, half-zero blocks (blocks) or
    shared-sparse (union) as g % 3 = 0, 1, 2."""
    rng = np.random.default_rng(seed)

    def values(k):
        v = (rng.standard_normal(k) * 10.0 ** rng.integers(-4, 3, k)).astype(np.float32)
        v[v == 0] = 1.0
        return v

    shared = rng.random(n) < 0.02
    out = []
    for _ in range(workers):
        x = np.zeros(n, np.float32)
        if kind == "dense":
            x[:] = values(n)
        elif kind == "shared":
            x[shared] = values(int(shared.sum()))
        elif kind == "random":
            nz = rng.random(n) < 0.3
            x[nz] = values(int(nz.sum()))
        elif kind == "mixed":
            for b in range(-(-n // BLOCK)):
                lo, hi = b * BLOCK, min(n, (b + 1) * BLOCK)
                g = b // gb
                if g % 3 == 0 or (g % 3 == 1 and b % 2 == 0):
                    x[lo:hi] = values(hi - lo)
                elif g % 3 == 2:
                    m = shared[lo:hi]
                    x[lo:hi][m] = values(int(m.sum()))
        else:
            assert kind == "zeros"
        out.append(x)
    return out


def expected_auto(grads, gb):
    """Per group, auto's choice where the byte counts leave no doubt (PROTOCOL.md
    Part 1 "auto's rule", applied to the group): dense = 4 n, blocks = 4 x the
    elements of its blocks non-zero anywhere, union = 4 x its candidates (at
    least the positions non-zero anywhere; a Bloom index may add a few).  Also
    the value bytes every worker must receive: dense and blocks groups' lanes.
    Computed here from the data alone."""
    n = grads[0].size
    nb = -(-n // BLOCK)
    anyw = np.zeros(n, bool)
    for g in grads:
        anyw |= _nonzero(g)
    choices, values = [], 0
    for g0 in range(0, nb, gb):
        lo, hi = g0 * BLOCK, min(n, (g0 + gb) * BLOCK)
        cand = int(anyw[lo:hi].sum())
        nzb = sum(
            hi_b - lo_b
            for lo_b, hi_b in (
                (b * BLOCK, min(n, (b + 1) * BLOCK)) for b in range(g0, min(nb, g0 + gb))
            )
            if anyw[lo_b:hi_b].any()
        )
        dense, blocks = hi - lo, nzb
        if cand == 0:
            choices.append("blocks")
        elif cand == dense:
            choices.append("dense")
            values += 4 * dense
        elif blocks <= cand:  # ties go to blocks
            choices.append("blocks")
            values += 4 * blocks
        elif cand + (dense - cand) // 10 < blocks:  # even if 10 % were false positives
            choices.append("union")
        else:
            raise AssertionError(f"group at block {g0}: choice too close to call")
    return choices, values


def check_auto(res, grads, want_groups, gb, contributors=None):
    """auto's result and per-group choices: the oracle's bits on every worker,
    the same choices on every worker and the ones the data call for, every
    chunk completed once at the engine res.stats["engines"], summed with all
    its contributors (default: the W workers)."""
    workers = contributors or len(grads)
    assert_bits(res.sum, reference.allreduce(grads, BLOCK))
    for out in res.outputs:
        assert_bits(out, res.sum)
    per = res.stats["workers"]
    keys = (
        "groups",
        "chunks",
        "next_seq",
        "method_chosen",
        "auto_dense_groups",
        "auto_blocks_groups",
        "auto_union_groups",
    )
    for w in per:  # every worker numbered the same units with the same choices
        assert {k: w[k] for k in keys} == {k: per[0][k] for k in keys}
        assert w["bytes_received"] == per[0]["bytes_received"]
    w = per[0]
    assert w["groups"] == want_groups
    choices, values = expected_auto(grads, gb)
    assert len(choices) == want_groups
    got = {m: w[f"auto_{m}_groups"] for m in ("dense", "blocks", "union")}
    assert got == {m: choices.count(m) for m in got}
    assert protocol.method_name(w["method_chosen"]) == max(
        ("dense", "blocks", "union"), key=lambda m: (got[m], -("dense", "blocks", "union").index(m))
    )
    assert w["bytes_received"]["values"] == values
    if "union" not in choices:
        assert w["bytes_received"]["union"] == 0
    eng = res.stats["engines"]
    assert eng["completed"] == w["chunks"]
    assert eng["summed"] == workers * w["chunks"]


AUTO_CASES = [  # workers, n, slots, pipeline_groups, aggregators, workload
    (2, 100, 8, 0, 1, "random"),  # one block, one group
    (3, 2 * BLOCK + 7, 4, 3, 1, "dense"),  # three groups, the last one 7 elements
    (4, 40_000, 4, 0, 1, "random"),
    (5, 33_333, 8, 7, 1, "shared"),
    (8, 20_480, 2, 0, 1, "dense"),
    (4, 40_000, 4, 0, 3, "mixed"),  # K = 3
    (6, 61_447, 8, 6, 1, "mixed"),  # odd size
    (7, 50_001, 4, 1000, 1, "mixed"),  # one block per group
    (4, 30_000, 4, 0, 1, "zeros"),
]


@pytest.mark.parametrize("workers,n,slots,option,aggregators,kind", AUTO_CASES)
def test_auto_chooses_per_group_and_equals_unpipelined_and_oracle(
    workers, n, slots, option, aggregators, kind
):
    seed = 7 * workers + n % 991 + option + aggregators
    G, gb = spec_groups(n, option, slots, aggregators)
    grads = auto_grads(workers, n, kind, seed, gb)
    plain = run(grads, "auto", 1, slots, seed, aggregators=aggregators)
    piped = run(grads, "auto", option, slots, seed, aggregators=aggregators)
    nb = -(-n // BLOCK)
    check_auto(plain, grads, 1, nb)
    check_auto(piped, grads, G, gb)
    assert_bits(piped.sum, plain.sum)
    if n > 1000 and kind != "zeros":
        assert piped.stats["fabric"]["dropped_loss"] > 0
    if kind == "mixed":  # the groups really chose differently
        w = piped.stats["workers"][0]
        assert min(w["auto_dense_groups"], w["auto_blocks_groups"], w["auto_union_groups"]) > 0


def test_auto_per_group_through_a_tree_of_aggregators():
    """Two leaves of three workers under a root: each engine completes every
    chunk once with all its contributors, and the choices stay per group."""
    G, gb = spec_groups(40_000, 5, 4)
    grads = auto_grads(6, 40_000, "mixed", 31, gb)
    with Cluster(
        workers=6,
        leaves=2,
        seed=4,
        slots=4,
        payload=PAYLOAD,
        pipeline_groups=5,
        loss=0.01,
        reorder=0.05,
    ) as cl:
        res = cl.allreduce(grads, method="auto", block_elements=BLOCK)
        *leaves, root = [cl.aggregator_counters(k)["engine"] for k in range(cl.aggregators)]
    res.stats["engines"] = root
    check_auto(res, grads, G, gb, contributors=2)
    for leaf in leaves:
        assert leaf["completed"] == root["completed"]
        assert leaf["summed"] == 3 * leaf["completed"]
