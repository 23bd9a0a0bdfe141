"""Medians (ranges) of flat.py's lines: python summary.py FILE..."""

import json
import statistics
import sys

for path in sys.argv[1:]:
    rows = [json.loads(line) for line in open(path)]
    r0 = rows[0]
    head = (
        f"W = {r0['W']}, K = {r0['K']}, {r0['gbits']:g} Gbit/s, 2^{r0['e']} floats, "
        f"{100 * r0.get('loss', 0.01):g} % loss"
    )
    for key, name in (("x16", "s16"), ("x", "default")):
        xs = [r[key] for r in rows]
        rpd = max(r[name]["rpd"] for r in rows)
        exact = all(r[n]["exact"] for r in rows for n in ("free", "s16", "default"))
        over = sum(r[name]["ring_overflow"] for r in rows)
        print(
            f"{head}, {name}: median {statistics.median(xs):.2f}x "
            f"({min(xs):.2f}-{max(xs):.2f}), seeds {[r['seed'] for r in rows]}, "
            f"rpd <= {rpd}, ring overflows {over}, all exact {exact}"
        )
