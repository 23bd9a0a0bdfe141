"""Markdown summaries of the codec and engine benchmarks' --json output.

    homagg bench codec --json > codec.json
    python -m homagg.bench.markdown codec codec.json codec.md "homagg bench codec --json"

``homagg bench codec --json`` and ``homagg bench engine --json`` print their
measurements only; this writes a short Markdown file next to them with the
machine, the date and the command (run it on the same machine, right after
the benchmark), and one table of the figures.
"""

import json
import sys
import time

from homagg.bench import report as rep


def _context(command):
    m = rep.machine()
    v = rep.versions()
    return (
        f"Command: `{command}`\n\n"
        f"Machine: {m.get('cpu', m.get('machine'))}, {m.get('cpus')} CPUs, {m.get('system')}, "
        f"Python {m.get('python')}, numpy {v.get('numpy')}, homagg {v.get('homagg')}; "
        f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n\n"
    )


def codec_md(d, command):
    out = ["# lhc codec throughput and wire bytes (one core)\n\n", _context(command)]
    out.append(
        f"{d['elements']} float32 per worker, W = {d['workers']}, density {d['density']}, "
        f"block {d['block_elements']}, ISA {d['isa']}.\n\n"
    )
    k = d.get("index_blocks")
    if k:
        out.append(
            f"Index: {k['bitmap_blocks']} bitmap, {k['bloom_blocks'] - k['split_blocks']} Bloom, "
            f"{k['split_blocks']} split-block blocks ("
            + (f"cost model at {d['link_mbit']:g} Mbit/s" if d.get("link_mbit") else "bytes rule")
            + "). Per path, ms per worker: "
            + "; ".join(
                f"{r['isa']} union decode {1e3 * r['union_decode_seconds']:.2f}, "
                f"lhc decode {1e3 * r['decode_seconds']:.2f}, memcpy {1e3 * r['memcpy_seconds']:.2f}"
                for r in d["paths"]
            )
            + ".\n\n"
        )
    rows = [
        {
            "figure": "encode (GB/s of float32 input)",
            "value": d["encode_gbps"],
            "baseline": f"memcpy {d['memcpy_gbps']:.3g} GB/s",
            "ratio": d["encode_vs_memcpy"],
        },
        {
            "figure": "decode (GB/s of float32 output)",
            "value": d["decode_gbps"],
            "baseline": f"memcpy {d['memcpy_gbps']:.3g} GB/s",
            "ratio": d["decode_vs_memcpy"],
        },
    ]
    if "numpy_speedup" in d:
        rows.append(
            {
                "figure": "encode + decode seconds",
                "value": d["encode_seconds"] + d["decode_seconds"],
                "baseline": f"numpy {d['numpy_encode_seconds'] + d['numpy_decode_seconds']:.3g} s",
                "ratio": d["numpy_speedup"],
            }
        )
    rows.append(
        {
            "figure": "lhc bytes per worker",
            "value": d["wire_bytes"],
            "baseline": f"bound {d['wire_bound_bytes']:.0f} B (index + 1.23 x 4 x "
            f"{d['global_nonzeros']} global non-zeros)",
            "ratio": d["wire_vs_bound"],
        }
    )
    rows.append(
        {
            "figure": f"auto bytes per worker (chose {d['auto_choice']})",
            "value": d["auto_bytes"],
            "baseline": f"smallest exact method {d['smallest_exact_bytes']} B",
            "ratio": d["auto_vs_smallest"],
        }
    )
    out.append(rep.markdown_table(rows, ("figure", "value", "baseline", "ratio")))
    out.append(
        "\nBytes per worker by method: "
        + ", ".join(f"{m} {b}" for m, b in d["method_bytes"].items())
        + f" (dense float32: {d['dense_fp32_bytes']}).\n\n"
    )
    t = [
        {"target": k, "value": v["value"], "wanted": v["target"], "met": v["met"]}
        for k, v in d.get("targets", {}).items()
    ]
    if t:
        out.append(rep.markdown_table(t, ("target", "value", "wanted", "met")))
    return "".join(out)


def engine_md(rows, command):
    out = ["# Aggregation engine on one core vs the raw SUM32 kernel\n\n", _context(command)]
    if rows:
        r0 = rows[0]
        out.append(
            f"{r0['payload_bytes']}-byte SUM32 payloads, {r0['slots']} slots, "
            f"{'multicast' if r0['multicast'] else 'unicast'} results, UDP checksums "
            f"{'in software' if r0['udp_csum'] else 'offloaded'}, ISA {r0['isa']}; Mpps = "
            "best of ten phases (means in engine.json).\n\n"
        )
    out.append(
        rep.markdown_table(
            rows,
            (
                "workers",
                "mpps",
                "gbit_s",
                "raw_kernel_mpps",
                "ratio",
                "mpps_mean",
                "raw_kernel_mpps_mean",
                "dropped",
            ),
        )
    )
    return "".join(out)


WRITERS = {"codec": codec_md, "engine": engine_md}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (3, 4) or argv[0] not in WRITERS:
        print(
            f"usage: python -m homagg.bench.markdown {{{','.join(WRITERS)}}} IN.json OUT.md "
            "[COMMAND]",
            file=sys.stderr,
        )
        return 2
    kind, src, dst = argv[:3]
    command = argv[3] if len(argv) == 4 else f"homagg bench {kind} --json"
    with open(src) as f:
        data = json.load(f)
    with open(dst, "w") as f:
        f.write(WRITERS[kind](data, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
