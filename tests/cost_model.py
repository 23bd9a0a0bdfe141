"""The cost model of docs/PROTOCOL.md ("The cost model", "lhc: index",
"auto's rule") written again from the page, in Python integers: the
oracle the C choices are checked against.  Independent of the C code and
of homagg.cost (it reads a plain dict of the struct hg_cost fields)."""

import math

# (bits per element, probes, fp scaled by 2^20): the table of "lhc: index"
BLOOM = [(8, 6, 22625), (12, 8, 3295), (16, 8, 602), (20, 8, 146), (24, 8, 44)]
# (bits per element, fp scaled by 2^20): "Split-block Bloom options" (5-9),
# considered only with a link rate and sbbf_ps > 0
SPLIT = [(8, 34825), (12, 5683), (16, 1379), (24, 171), (32, 38)]
EXP_ZERO = -128


def terms(cost, workers):
    """(xb, rt, lane) in picoseconds, or None without a link rate."""
    if not cost or not cost.get("link_mbit"):
        return None
    byte_ps = 8_000_000 // cost["link_mbit"]
    payload = cost.get("payload_bytes") or 1024
    xb = byte_ps + (cost["pkt_ps"] + workers * cost["agg_pkt_ps"] + 98 * byte_ps) // payload
    return xb, 1000 * cost["rtt_ns"], 4 * xb + cost["lane_ps"]


def plan_block(length, count, workers, cost):
    """("bitmap", bytes, ix) or ("bloom", bytes, ix) for one block; ix the
    index time (None under the bytes rule)."""
    c = min(count, length)
    t = terms(cost, workers)
    if t is None:
        best, choice = 8 * ((length + 7) // 8), ("bitmap", (length + 7) // 8, None)
        for bpe, k, fp in BLOOM:
            bits = max(64, -(-bpe * c // 64) * 64)
            v = bits + (fp * (length - c) * 40 >> 20)
            if v < best:
                best, choice = v, ("bloom", bits // 8, None)
        return choice
    xb, _, lane = t
    cw = min(length, -(-count // workers))
    best = (length + 7) // 8 * xb + length * cost["bitmap_ps"]
    choice = ("bitmap", (length + 7) // 8, best)
    for bpe, k, fp in BLOOM:
        bits = max(64, -(-bpe * c // 64) * 64)
        ti = bits // 8 * xb + k * (length + cw) * cost["probe_ps"]
        tt = ti + (fp * (length - c) >> 20) * lane
        if tt < best:
            best, choice = tt, ("bloom", bits // 8, ti)
    for nbytes, ti, tt in _split_times(length, count, workers, cost, xb, lane):
        if tt < best:
            best, choice = tt, ("split", nbytes, ti)
    return choice


def _split_times(length, count, workers, cost, xb, lane):
    """[(bytes, index time, time)] of the split-block options, [] when the
    model has no sbbf_ps."""
    if not cost.get("sbbf_ps"):
        return []
    c, cw = min(count, length), min(length, -(-count // workers))
    out = []
    for bpe, fp in SPLIT:
        nblk = max(1, -(-bpe * c // 256))
        ti = 32 * nblk * xb + (length + cw) * cost["sbbf_ps"]
        out.append((32 * nblk, ti, ti + (fp * (length - c) >> 20) * lane))
    return out


def option_times(length, count, workers, cost):
    """(bitmap time, [(bytes, time) of each Bloom option, split-block ones
    last]) of one block."""
    xb, _, lane = terms(cost, workers)
    c, cw = min(count, length), min(length, -(-count // workers))
    bitmap = (length + 7) // 8 * xb + length * cost["bitmap_ps"]
    blooms = []
    for bpe, k, fp in BLOOM:
        bits = max(64, -(-bpe * c // 64) * 64)
        blooms.append(
            (
                bits // 8,
                bits // 8 * xb
                + k * (length + cw) * cost["probe_ps"]
                + (fp * (length - c) >> 20) * lane,
            )
        )
    blooms += [(b, t) for b, _, t in _split_times(length, count, workers, cost, xb, lane)]
    return bitmap, blooms


def block_lens(n, block):
    return [min(block, n - b * block) for b in range(math.ceil(n / block))]


def auto_meta(n, block, workers, gcodes, gcounts, cost):
    """auto's choice after the meta phase: "dense", "blocks" or "union"."""
    lens = block_lens(n, block)
    dense = 4 * n
    blocks = 4 * sum(ln for ln, c in zip(lens, gcodes) if c != EXP_ZERO)
    t = terms(cost, workers)
    u_bytes = u_time = 0
    for ln, code, cnt in zip(lens, gcodes, gcounts):
        if code == EXP_ZERO:
            continue
        lo = min(ln, -(-cnt // workers))
        kind, nbytes, ix = plan_block(ln, cnt, workers, cost)
        u_bytes += nbytes + 4 * lo
        if t is not None:
            u_time += ix + lo * t[2]
    if t is None:
        if min(dense, blocks) <= u_bytes:
            return "dense" if dense <= blocks else "blocks"
        return "union"
    xb, rt, _ = t
    td = dense * xb + dense // 4 * cost["value_ps"] + rt
    tk = blocks * xb + blocks // 4 * cost["value_ps"] + rt
    if min(td, tk) <= u_time + 2 * rt:
        return "dense" if td <= tk else "blocks"
    return "union"


def auto_indexed(n, block, workers, gcodes, candidates, cost):
    """auto's choice after the index phase, from the exact candidate count."""
    lens = block_lens(n, block)
    dense = 4 * n
    blocks = 4 * sum(ln for ln, c in zip(lens, gcodes) if c != EXP_ZERO)
    t = terms(cost, workers)
    if t is None:
        vd, vk, vu = dense, blocks, 4 * candidates
    else:
        xb, _, lane = t
        vd = dense * xb + dense // 4 * cost["value_ps"]
        vk = blocks * xb + blocks // 4 * cost["value_ps"]
        vu = candidates * lane
    if vd <= vk and vd <= vu:
        return "dense"
    return "blocks" if vk <= vu else "union"
