"""Hostile and malformed frames sent to the running daemon over a raw socket.

A worker namespace sends, through an AF_PACKET socket on its veth end, one
frame of every malformed kind at homagg-switch (DPDK net_af_packet on the
other end).  Each must be dropped and counted under its reason in the
daemon's `stats`, the daemon must stay alive, and an allreduce after them
must still be bit-exact.
"""

import json
import socket
import subprocess
import threading

import numpy as np
import pytest

from homagg.engine import Addr, build_frame
from homagg.bindings.wire import PROTOCOL_VERSION

from reference import allreduce as oracle_allreduce
from helpers import be32, wait_for
from switch_helpers import BLOCK, GROUP, gradients, join_all, run_workers

pytestmark = [pytest.mark.dpdk, pytest.mark.root, pytest.mark.netns]

JOB, TOKEN, W, SLOTS = 21, 0x5EED, 2, 32


def _mac(ns, dev):
    out = subprocess.run(
        ["ip", "-n", ns, "-j", "link", "show", "dev", dev],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return json.loads(out)[0]["address"]


def _hostile(src, dst):
    """(name, frame, counter): every kind a worker-side attacker can send."""
    ok = dict(op="sum32", job=JOB, token=TOKEN, worker=1, seq=0, slot=0, payload=be32(np.arange(8)))

    def f(**kw):
        args = dict(ok)
        args.update(kw)
        return build_frame(src, dst, **args)

    good = f()
    return [
        ("truncated_header", good[: 42 + 10], "truncated"),
        ("version_1", f(version=1), "bad_version"),
        ("version_2", f(version=PROTOCOL_VERSION - 1), "bad_version"),
        ("incarnation_zero", f(incarnation=0), "bad_flags"),
        ("bad_shard", f(shard=1), "bad_shard"),
        ("auth_on_plain_job", f(flags=32), "bad_mac"),
        ("unknown_job", f(job=JOB + 1000), "unknown_job"),
        ("bad_token", f(token=TOKEN ^ 1), "bad_token"),
        ("bad_worker", f(worker=W), "bad_worker"),
        ("slot_ge_S", f(slot=SLOTS, seq=SLOTS), "bad_slot"),
        ("lanes_vs_len", f(lanes=9), "bad_lanes"),
        ("unknown_op", f(op=9, lanes=32, payload=bytes(32)), "bad_op"),
        ("result_from_worker", f(flags=1), "bad_flags"),
        (
            "all_ones",
            build_frame(
                src,
                dst,
                op=0xFF,
                job=0xFFFFFFFF,
                token=0xFFFFFFFF,
                worker=0xFFFF,
                seq=0xFFFFFFFF,
                slot=0xFFFF,
                lanes=0xFFFF,
                exp=-1,
                flags=0xFFFF,
                version=0xFF,
                nonce=0xFF,
                payload=bytes(16),
            ),
            "bad_version",
        ),
    ]


def _send_raw(link, frames):  # noqa: F811 (the fixture is imported for the tests)
    """Send frames from the workers' namespace through an AF_PACKET socket."""
    from pyroute2.netns import setns

    err = []

    def work():
        try:
            setns(link.ns_workers, flags=0)  # this thread only
            with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
                s.bind((link.dev_workers, 0))
                for fr in frames:
                    s.send(fr)
        except Exception as exc:  # noqa: BLE001 - reported below
            err.append(exc)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive() and not err, err


def test_hostile_frames_are_dropped_counted_and_harmless(link, daemons):  # noqa: F811
    # checksums are verified, so the raw frames carry correct ones
    d = daemons()
    with d.client() as c:
        c.add_job(job=JOB, token=TOKEN, workers=W, slots=SLOTS, group=GROUP)
        before = c.stats()["stats"]
    src = Addr.of(_mac(link.ns_workers, link.dev_workers), link.worker_ip, 40000)
    dst = Addr.of(_mac(link.ns_switch, link.dev_switch), link.switch_ip, 48879)
    cases = _hostile(src, dst)
    _send_raw(link, [fr for _name, fr, _reason in cases])

    want = {}
    for _name, _fr, reason in cases:
        want[reason] = want.get(reason, 0) + 1

    def counted():
        with d.client() as c:
            st = c.stats()["stats"]
        return all(st[r] - before[r] >= k for r, k in want.items()) and st

    st = wait_for(counted, 20, "the daemon to count every hostile frame")
    for reason, k in want.items():
        assert st[reason] - before[reason] == k, (reason, st[reason] - before[reason])
    assert st["summed"] == before["summed"], "a hostile frame was summed"
    assert d.alive()

    grads = gradients(W, 20000, seed=5)
    threads, results, errors, _stats = run_workers(link, JOB, TOKEN, grads, "lhc", slots=SLOTS)
    join_all(threads, 60)
    assert errors == [None] * W, errors
    expected = oracle_allreduce(grads, BLOCK)
    for y in results:
        assert y.tobytes() == expected.tobytes()
    assert d.alive()


def _arp(src_mac, dst_mac, op, sender_ip, target_ip):
    """An Ethernet + IPv4 ARP frame (op 1 request, 2 reply)."""
    mac = lambda m: bytes.fromhex(m.replace(":", ""))  # noqa: E731
    return (
        mac(dst_mac)
        + mac(src_mac)
        + b"\x08\x06"
        + b"\x00\x01\x08\x00\x06\x04"
        + op.to_bytes(2, "big")
        + mac(src_mac)
        + socket.inet_aton(sender_ip)
        + (b"\x00" * 6 if op == 1 else mac(dst_mac))
        + socket.inet_aton(target_ip)
    )


def test_arp_never_reaches_the_engine(link, daemons):  # noqa: F811
    """A request for the daemon's address is answered (arp_replies); every
    other ARP frame (a reply, a request for another address, one too short
    for an ARP body, a non-IPv4 one) is consumed and counted in arp_other;
    none of them reaches the engine (received, not_ip unchanged)."""
    # no IPv6 chatter (router solicitations, MLD) on the link: the engine's
    # counters must move only through what this test sends
    for ns in (link.ns_workers, link.ns_switch):
        subprocess.run(
            ["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"],
            check=True,
            timeout=30,
        )
    d = daemons()
    wmac = _mac(link.ns_workers, link.dev_workers)
    smac = _mac(link.ns_switch, link.dev_switch)
    other_ip = link.switch_ip.rsplit(".", 1)[0] + ".77"
    request = _arp(wmac, "ff:ff:ff:ff:ff:ff", 1, link.worker_ip, link.switch_ip)
    non_ipv4 = bytearray(request)
    non_ipv4[16:18] = b"\x86\xdd"  # protocol type IPv6
    with d.client() as c:
        before = c.stats()
    _send_raw(
        link,
        [
            request,
            _arp(wmac, smac, 2, link.worker_ip, link.switch_ip),  # a reply
            _arp(wmac, "ff:ff:ff:ff:ff:ff", 1, link.worker_ip, other_ip),  # not ours
            request[: 14 + 10],  # short
            bytes(non_ipv4),
        ],
    )

    def counted():
        with d.client() as c:
            st = c.stats()
        return (
            st["port"]["arp_other"] - before["port"]["arp_other"] >= 4
            and st["port"]["arp_replies"] > before["port"]["arp_replies"]
        ) and st

    st = wait_for(counted, 20, "the daemon to count the ARP frames")
    assert st["port"]["arp_other"] - before["port"]["arp_other"] == 4
    assert st["stats"]["received"] == before["stats"]["received"]
    assert st["stats"]["not_ip"] == before["stats"]["not_ip"]
    assert st["port"]["rx"] == before["port"]["rx"]
    assert d.alive()


def test_authenticated_job_drops_forged_flipped_replayed_and_old_frames(link, daemons, tmp_path):  # noqa: F811
    """With authentication: a worker forging another worker's id (its own
    key), a frame with a flipped payload bit, frames of a key epoch the job
    does not have and MACed with another secret's key, frames cut short, a
    replayed frame of the finished allreduce and a frame of an old
    incarnation are dropped under their reason by the running daemon; the
    allreduces stay bit-exact."""
    from homagg import auth

    d = daemons()
    secret_file = tmp_path / "job.secret"
    secret = auth.create_secret_file(secret_file)
    job_a, job_b, inc = JOB + 1, JOB + 2, 5000
    src = Addr.of(_mac(link.ns_workers, link.dev_workers), link.worker_ip, 40000)
    dst = Addr.of(_mac(link.ns_switch, link.dev_switch), link.switch_ip, 48879)
    key = {j: [auth.derive_key(secret, j, w) for w in range(W)] for j in (job_a, job_b)}
    bogus = be32(np.full(256, 0x01010101))
    with d.client() as c:
        for j in (job_a, job_b):
            c.add_job(job=j, token=TOKEN, workers=W, slots=SLOTS, group=GROUP, auth=secret)

    other_key = auth.derive_key(bytes(32), job_b, 1)  # a key of another secret

    def frame(job, worker, key_of, seq, epoch=0, k=None, **kw):
        return build_frame(
            src,
            dst,
            op="sum32",
            job=job,
            token=TOKEN,
            worker=worker,
            seq=seq,
            slot=seq % SLOTS,
            flags=32 | epoch << 8 | (4 if (seq // SLOTS) % 2 else 0),
            payload=bogus,
            key=k or key[job][key_of],
            **kw,
        )

    def stats():
        with d.client() as c:
            return c.stats()["stats"]

    # job B: forged and tampered frames for the chunks the allreduce is about to use
    def attack_b():
        # no UDP checksum: the MAC, not the checksum, must catch the flip
        flipped = [
            bytearray(frame(job_b, 1, 1, s, incarnation=inc, udp_csum=False)) for s in range(4)
        ]
        for f in flipped:
            f[42 + 32 + 9] ^= 0x01
        _send_raw(
            link,
            [frame(job_b, 1, 0, s, incarnation=inc) for s in range(4)]
            + [bytes(f) for f in flipped]
            # a key epoch the job does not have, a key of another secret
            + [frame(job_b, 1, 1, s, epoch=1, incarnation=inc) for s in range(4)]
            + [frame(job_b, 1, 1, s, k=other_key, incarnation=inc) for s in range(4)]
            # cut short in transit (the IPv4 length says more)
            + [frame(job_b, 1, 1, s, incarnation=inc)[:-4] for s in range(4)],
        )

    grads = gradients(W, 30000, seed=7)
    expected = oracle_allreduce(grads, BLOCK)
    before = stats()
    next_seq = {}
    for job, hook in ((job_a, None), (job_b, attack_b)):
        threads, results, errors, st = run_workers(
            link,
            job,
            TOKEN,
            grads,
            "dense",
            slots=SLOTS,
            before_start=hook,
            auth_file=secret_file,
            incarnation=inc,
        )
        join_all(threads, 60)
        assert errors == [None] * W, errors
        for y in results:
            assert y.tobytes() == expected.tobytes()
        assert all(s["bad_mac"] == 0 for s in st)
        next_seq[job] = st[0]["next_seq"]
    mid = wait_for(
        lambda: (
            lambda s: (
                s["bad_mac"] - before["bad_mac"] >= 16
                and s["truncated"] - before["truncated"] >= 4
                and s
            )
        )(stats()),
        20,
        "the daemon to count the forged frames of job B",
    )
    assert mid["bad_mac"] - before["bad_mac"] == 16, {k: v - before[k] for k, v in mid.items()}
    assert mid["truncated"] - before["truncated"] == 4

    # job A is finished: a replay of one of its full chunks, and an old life of worker 0
    done, nxt = next_seq[job_a] - 2, next_seq[job_a]
    _send_raw(
        link,
        [
            frame(job_a, 1, 1, done, incarnation=inc),
            frame(job_a, 0, 0, nxt, incarnation=inc - 1),
            frame(job_a, 0, 1, nxt, incarnation=inc),
        ],
    )
    after = wait_for(
        lambda: (
            lambda s: (
                s["old_incarnation"] > mid["old_incarnation"]
                and s["bad_mac"] > mid["bad_mac"]
                and s
            )
        )(stats()),
        20,
        "the daemon to count the frames sent to the finished job",
    )
    assert after["old_incarnation"] - mid["old_incarnation"] == 1
    assert after["bad_mac"] - mid["bad_mac"] == 1
    assert after["replays"] - mid["replays"] == 1
    assert after["summed"] == mid["summed"], "a hostile frame was summed"
    assert d.alive()
    log = d.output()
    assert secret.hex() not in log


def test_key_rotation_on_a_live_job(link, daemons, tmp_path):  # noqa: F811
    """A new key epoch registered on the running daemon while the job's
    workers run allreduces: the workers are given the new secret first
    (between two of their allreduces), the daemon gets it while they run the
    next ones; no allreduce fails, every result is bit-exact, no frame is
    dropped as bad_mac, and the secret never reaches the daemon's output."""
    from pyroute2.netns import setns

    from homagg import auth
    from homagg.worker import Worker

    d = daemons()
    old_file, new_file = tmp_path / "epoch0.secret", tmp_path / "epoch1.secret"
    old = auth.create_secret_file(old_file)
    new = auth.create_secret_file(new_file)
    job, rounds = JOB + 5, 4
    with d.client() as c:
        c.add_job(job=job, token=TOKEN, workers=W, slots=SLOTS, group=GROUP, auth=old)
    grads = gradients(W, 20000, seed=11)
    expected = oracle_allreduce(grads, BLOCK)
    rotated = threading.Barrier(W + 1, timeout=60)
    results = [[] for _ in range(W)]
    errors = [None] * W

    def work(w):
        setns(link.ns_workers, flags=0)  # this thread only
        try:
            with Worker(
                job=job,
                token=TOKEN,
                worker=w,
                workers=W,
                aggregator=(link.switch_ip, 48879),
                group=GROUP,
                bind=(link.worker_ip, 0),
                timeout=20.0,
                slots=SLOTS,
                auth_file=old_file,
            ) as wk:
                for r in range(rounds):
                    results[w].append(wk.allreduce(grads[w], method="dense", block=BLOCK))
                    if r == 0:
                        wk.rotate_key(new_file, 1)
                        rotated.wait()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors[w] = exc
            rotated.abort()

    with d.client() as c:
        before = c.stats()["stats"]
    threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in range(W)]
    for t in threads:
        t.start()
    rotated.wait()
    with d.client() as c:
        assert c.rotate_key(job, new, grace=30.0)["epoch"] == 1
    join_all(threads, 120)
    assert errors == [None] * W, errors
    for per_worker in results:
        assert len(per_worker) == rounds
        for y in per_worker:
            assert y.tobytes() == expected.tobytes()
    with d.client() as c:
        after = c.stats()["stats"]
    assert after["bad_mac"] == before["bad_mac"]
    log = d.output()
    assert old.hex() not in log and new.hex() not in log
