import json, sys, statistics as st, collections

rows = collections.defaultdict(list)
for f in sys.argv[1:]:
    for l in open(f):
        d = json.loads(l)
        rows[(d["W"], d["K"], d["L"], d["v"])].append(d)
for k, ds in sorted(rows.items()):
    xs = [d["0.01"]["x"] for d in ds]
    rp = [d["0.01"]["rpd"] for d in ds]
    to = [d["0.01"]["to"] for d in ds]
    cl = {d["0.0"]["t"] for d in ds}
    print(
        f"W={k[0]} K={k[1]} {k[2]:>5} Gbit/s {k[3]:>5}: n={len(xs)} median {st.median(xs):.2f}x mean {st.mean(xs):.2f}x range {min(xs):.2f}-{max(xs):.2f}, rpd {min(rp):.2f}-{max(rp):.2f}, timeouts median {st.median(to):.0f}, clean {sorted(cl)}"
    )
