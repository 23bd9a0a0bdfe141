"""Write the seed corpus of fuzz_engine.c (dataplane_c/fuzz/corpus_engine/).

    .venv/bin/python dataplane_c/fuzz/make_corpus.py

Each seed is a sequence of records ``ctl (1 byte) | len (2 bytes, big-endian)
| frame``, the input format of fuzz_engine.c, whose frames are valid for the
target's three jobs (job 1: token 77, W 3, S 4, a multicast group; job 2:
token 99, W 2, S 1, 64-byte payloads, shard 1; job 3: token 55, W 2, S 2,
256-byte payloads, authenticated with the job secret SECRET), so the fuzzer
starts from frames that reach the engine's slots.  Run it again whenever the wire format
changes (docs/PROTOCOL.md Part 2).
"""
import pathlib

import numpy as np

from homagg.auth import MAC_BLAKE2B, derive_key
from homagg.engine import FLAG_AUTH, FLAG_RETRANS, FLAG_SHADOW, Addr, build_frame

OUT = pathlib.Path(__file__).resolve().parent / "corpus_engine"
AGG = Addr.of("02:00:00:00:00:01", "10.0.0.254", 48879)
JOBS = {1: dict(token=77, slots=4, shard=0), 2: dict(token=99, slots=1, shard=1),
        3: dict(token=55, slots=2, shard=0)}
SECRET = bytes(range(1, 33))  # job 3's secret, as in fuzz_engine.c
MAC = MAC_BLAKE2B             # job 3's MAC algorithm, as in fuzz_engine.c (any host)


def rec(frame, ctl=0):
    return bytes([ctl]) + len(frame).to_bytes(2, "big") + frame


def chunk(w, seq=0, job=1, op="sum32", payload=None, flags=0, incarnation=1, exp=0,
          udp_csum=True, **kw):
    j = JOBS[job]
    if payload is None:
        payload = np.arange(16, dtype=">i4").tobytes()
    if (seq // j["slots"]) % 2:
        flags |= FLAG_SHADOW
    if job == 3 and "key" not in kw:
        kw["key"] = derive_key(SECRET, 3, w)
    src = Addr.of(bytes([2, 0, 0, 1, 0, w]), (10 << 24) | (1 << 16) | w, 40000 + w)
    return build_frame(src, AGG, op=op, job=job, token=j["token"], worker=w, seq=seq,
                       slot=seq % j["slots"], flags=flags, payload=payload, exp=exp,
                       shard=kw.pop("shard", j["shard"]), incarnation=incarnation,
                       udp_csum=udp_csum, alg=MAC, **kw)


def seeds():
    max8 = np.arange(40, dtype=np.int8).tobytes()
    return {
        "sum3": [rec(chunk(w)) for w in range(3)],
        "mcast_nocsum": [rec(chunk(w, udp_csum=False), ctl=2) for w in range(3)],
        "dup_replay": [rec(chunk(0)), rec(chunk(0)), rec(chunk(1)), rec(chunk(2)),
                       rec(chunk(1, flags=FLAG_RETRANS))],
        "status": [rec(chunk(0)), rec(chunk(0, flags=FLAG_RETRANS))],
        "or_max": ([rec(chunk(w, op="or", payload=bytes(range(40)))) for w in range(3)]
                   + [rec(chunk(w, seq=1, op="max8", payload=max8)) for w in range(3)]),
        "shadow": [rec(chunk(w, seq=s)) for s in (0, 4, 8) for w in range(3)],
        "nc8_job2": [rec(chunk(w, job=2, op="nc8", exp=20, payload=bytes(range(16))))
                     for w in range(2)],
        "incarnation_reset": [rec(chunk(0)), rec(chunk(1)), rec(chunk(0, seq=1)),
                              rec(chunk(0, incarnation=2)), rec(chunk(0, seq=1)),
                              rec(chunk(1, flags=FLAG_RETRANS)), rec(chunk(2))],
        "shard_and_mac": [rec(chunk(0, job=2, shard=0)), rec(chunk(0, flags=FLAG_AUTH)),
                          rec(chunk(1, job=2)), rec(chunk(0, job=2))],
        "auth_sum": [rec(chunk(w, job=3, seq=s)) for s in (0, 1, 2) for w in range(2)],
        "auth_forged": [rec(chunk(0, job=3, key=derive_key(SECRET, 3, 1))),
                        rec(chunk(0, job=3, key=None, flags=FLAG_AUTH)),
                        rec(chunk(1, job=3, key=None)), rec(chunk(0, job=3)),
                        rec(chunk(0, job=3, flags=FLAG_RETRANS)), rec(chunk(1, job=3))],
    }


def main():
    OUT.mkdir(exist_ok=True)
    for old in OUT.iterdir():
        old.unlink()
    for name, records in seeds().items():
        (OUT / name).write_bytes(b"".join(records))
    print(f"wrote {len(seeds())} seeds to {OUT}")


if __name__ == "__main__":
    main()
