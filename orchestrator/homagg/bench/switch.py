"""Aggregator data path: packets per second of homagg-switch's engine on one lcore.

Runs build/<variant>/homagg-switch-bench (dataplane_c/dpdk/bench/): one
process, the engine on its own lcore behind the DPDK port backend on a
net_ring ethdev, fed with SUM32 frames of W workers by a generator on the
main lcore.  Each run reports ``mpps`` (frames the engine received per
second of wall time), ``engine_mpps`` (the engine lcore's capacity: frames
over the cycles of its polls that received frames; a poll longer than 50 us
was preempted by another process and counts 50 us), the Gbit/s of frames
and of payload (``payload_gbps``, ``engine_payload_gbps``: the lane bytes
the engine sums), and the drops (must be 0).  In the same run the engine
lcore then only pulls the frames for half the time (receives each one,
reads one byte of each of its cache lines, frees it): ``pull_mpps`` and
``pull_payload_gbps`` are what moving the frames to that lcore allows on
this machine, ``engine_vs_pull`` the engine's capacity as a fraction of
it.  ``--payload 1024 8192``
measures the default payload and a jumbo one (frames up to MTU 9000) in one
run.  ``--lcores 0`` runs generator and engine on one lcore
(frames hot in that core's cache); the default ``0,1`` puts them on two
(frames cross cores, as from a NIC, and the engine lcore's share of its CPU
matters on a shared machine).  ``--auth`` measures every W in the same
run without authentication and then with each MAC algorithm of ``--mac``
(default: UMAC and AES-GMAC where the CPU has AES-NI, and keyed BLAKE2b; the
generator MACs each frame, the engine verifies it and MACs its results),
and reports each one's engine lcore capacity as a ratio of the
unauthenticated one.  ``--mac-isa`` adds an aes-gmac and a umac row per MAC path
(HOMAGG_MAC_ISA forced for that run: ``portable`` is libsodium and OpenSSL,
``pclmul``, ``avx2`` and ``avx512`` the project's own; UMAC's NH is scalar
when the first two are forced, AVX2 on the others; ``all``: every path
this CPU has);
each row's ``mac_isa`` names its path.  ``--rounds R`` repeats the whole
set R times, each round its own unauthenticated run first, and ends with
one summary row per MAC: the median of the rounds' ratios and their range.
On a shared machine one run's rate can swing by a quarter; the median of
alternating rounds is the figure to quote.  Needs root (EAL).
"""

import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

from homagg.switch.daemon import eal_args

ROOT = pathlib.Path(__file__).resolve().parents[3]


def add_arguments(parser):
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[2, 8, 32],
        help="W values to measure (default 2 8 32)",
    )
    parser.add_argument(
        "--payload",
        "--payload-bytes",
        type=int,
        nargs="+",
        default=[1024],
        dest="payload",
        metavar="BYTES",
        help="payload bytes per frame, a multiple of 4 up to 8192 "
        "(default 1024; several: one run each)",
    )
    parser.add_argument("--slots", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument(
        "--lcores",
        default="0,1",
        help="EAL lcore list: generator first, engine second (default 0,1)",
    )
    parser.add_argument(
        "--binary", default=None, help="path of homagg-switch-bench (default build/release/)"
    )
    parser.add_argument(
        "--auth",
        action="store_true",
        help="also measure with per-worker authentication and report the ratio",
    )
    parser.add_argument(
        "--mac",
        nargs="+",
        choices=("umac", "aes-gmac", "blake2b"),
        default=None,
        help="with --auth: the MAC algorithms to measure (default: umac and "
        "aes-gmac where the CPU has them, and blake2b)",
    )
    parser.add_argument(
        "--mac-isa",
        nargs="+",
        default=None,
        metavar="PATH",
        help="with --auth: one aes-gmac and one umac row per MAC path, HOMAGG_MAC_ISA "
        "forced (portable, pclmul, avx2, avx512, or all: every path this CPU "
        "has; default: the process's own)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="with --auth: run the unauthenticated and authenticated set this many times, "
        "alternating, and end with each MAC's median ratio and range (default 1)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")


def run_one(binary, workers, payload, slots, seconds, lcores, auth=False, mac=None, mac_isa=None):
    with tempfile.TemporaryDirectory(prefix="homagg-bench-") as rundir:
        env = dict(os.environ, RUNTIME_DIRECTORY=rundir, XDG_RUNTIME_DIR=rundir)
        if mac_isa:
            env["HOMAGG_MAC_ISA"] = mac_isa
        cmd = [
            str(binary),
            *eal_args(lcores, memory_mb=512),
            "--",
            "--workers",
            str(workers),
            "--payload",
            str(payload),
            "--slots",
            str(slots),
            "--seconds",
            str(seconds),
            "--json",
        ]
        if auth:
            cmd.append("--auth")
        if mac:
            cmd += ["--mac", mac]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=seconds * 4 + 60
        )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode not in (0, 2) or not lines:
        raise RuntimeError(f"{binary} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return json.loads(lines[-1])


def _mac_isas(names):
    """The AES-GMAC paths of --mac-isa ([None]: the process's own); a
    one-line error for a name that is no path or one this CPU lacks."""
    if not names:
        return [None]
    from homagg.bindings import auth as b

    have = [isa for isa in b.MAC_ISAS if b.mac_isa_available(isa)]
    if names == ["all"]:
        return have
    for isa in names:
        if isa not in b.MAC_ISAS:
            raise SystemExit(f"--mac-isa {isa}: use portable, pclmul, avx2, avx512 or all")
        if isa not in have:
            raise SystemExit(f"--mac-isa {isa}: this CPU lacks that path; it has {', '.join(have)}")
    return names


def _print_run(r, as_json):
    if as_json:
        print(json.dumps(r), flush=True)
        return
    ratio = r.get("engine_mpps_vs_unauthenticated")
    print(
        f"{'round ' + str(r['round']) + ' ' if 'round' in r else ''}"
        f"W={r['workers']:4d} payload={r['payload']} B"
        f"{' auth ' + r.get('mac', '') if r.get('auth') else ''}"
        f"{' ' + r['mac_isa'] if r.get('mac_isa', 'none') != 'none' else ''}: "
        f"{r['mpps']:7.3f} Mpps "
        f"({r['payload_gbps']:6.2f} Gbit/s of payload) end to end, engine lcore "
        f"capacity {r['engine_mpps']:7.3f} Mpps"
        f"{f' = {ratio:.2f}x unauthenticated' if ratio is not None else ''} "
        f"({r['engine_payload_gbps']:6.2f} Gbit/s of payload, busy "
        f"{100 * r['engine_busy']:.0f}%, {r['preempted_polls']} preempted polls) "
        f"= {r['engine_vs_pull']:.2f}x an lcore that only pulls the frames "
        f"({r['pull_payload_gbps']:6.2f} Gbit/s of payload), "
        f"{r['lcores']} lcore(s), {r['isa']}, drops {r['drops']}",
        flush=True,
    )


def _print_summary(workers, payload, mac, isa, ratios, as_json):
    """One MAC's ratios over the rounds: median, range."""
    row = {
        "summary": True,
        "workers": workers,
        "payload": payload,
        "mac": mac,
        "mac_isa": isa,
        "rounds": len(ratios),
        "median_vs_unauthenticated": statistics.median(ratios),
        "min_vs_unauthenticated": min(ratios),
        "max_vs_unauthenticated": max(ratios),
    }
    if as_json:
        print(json.dumps(row), flush=True)
        return
    print(
        f"W={workers:4d} payload={payload} B auth {mac}"
        f"{' ' + isa if isa and isa != 'none' else ''}: median "
        f"{row['median_vs_unauthenticated']:.2f}x unauthenticated over {len(ratios)} "
        f"rounds (range {row['min_vs_unauthenticated']:.2f}-"
        f"{row['max_vs_unauthenticated']:.2f}x)",
        flush=True,
    )


def main(args):
    binary = (
        pathlib.Path(args.binary)
        if args.binary
        else ROOT / "build" / "release" / "homagg-switch-bench"
    )
    if not binary.exists():
        print(f"{binary} is missing: run `make switch`", file=sys.stderr)
        return 1
    macs = args.mac
    if args.auth and macs is None:
        from homagg import auth

        macs = [
            auth.mac_name(c) for c in (auth.MAC_UMAC, auth.MAC_AES_GMAC) if auth.mac_available(c)
        ] + ["blake2b"]
    mac_isas = _mac_isas(args.mac_isa)
    if args.rounds < 1:
        raise SystemExit(f"--rounds {args.rounds}: a positive count")
    rc = 0
    for payload in args.payload:
        for w in args.workers:
            ratios = {}
            for rnd in range(args.rounds):
                runs = [run_one(binary, w, payload, args.slots, args.seconds, args.lcores)]
                base = runs[0]["engine_mpps"]
                for mac in macs if args.auth else []:  # the same round, with per-worker MACs
                    for isa in mac_isas if mac != "blake2b" else [None]:
                        r = run_one(
                            binary,
                            w,
                            payload,
                            args.slots,
                            args.seconds,
                            args.lcores,
                            auth=True,
                            mac=mac,
                            mac_isa=isa,
                        )
                        r["engine_mpps_vs_unauthenticated"] = (
                            r["engine_mpps"] / base if base else None
                        )
                        if r["engine_mpps_vs_unauthenticated"] is not None:
                            ratios.setdefault((mac, r.get("mac_isa")), []).append(
                                r["engine_mpps_vs_unauthenticated"]
                            )
                        runs.append(r)
                for r in runs:
                    if args.rounds > 1:
                        r["round"] = rnd + 1
                    if r["drops"]:
                        rc = 2
                    _print_run(r, args.json)
            if args.rounds > 1:
                for (mac, isa), xs in ratios.items():
                    _print_summary(w, payload, mac, isa, xs, args.json)
    return rc
