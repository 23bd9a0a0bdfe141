import json,glob,sys
import os
os.chdir(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
for d in sorted(glob.glob("headline_*")):
    if not d.endswith(("_1k","_1424")): continue
    rows=json.load(open(d+"/allreduce.json"))["results"]
    g={r["workload"]:r["seconds_median"] for r in rows if r["method"]=="gloo"}
    out=[]
    for r in rows:
        if r["method"]=="auto":
            wc=r["worker_cpu_seconds"]
            out.append(f'{r["workload"]} {g[r["workload"]]/r["seconds_median"]:.2f}x ({r["seconds_median"]*1e3:.0f} vs {g[r["workload"]]*1e3:.0f}) exact={r["exact"]} cpu {min(wc)*1e3:.0f}-{max(wc)*1e3:.0f} ms to={r["timeouts_per_allreduce"]}')
    print(d, "; ".join(out))
for f in glob.glob("codec*.json"):
    d=json.load(open(f))
    for p in d["paths"]:
        print(f, p["isa"], "enc %.2f udec %.2f uenc %.2f dec %.2f memcpy %.2f ms dec %.2f ms"%(p["encode_vs_memcpy"],p["union_decode_vs_memcpy"],p["union_encode_vs_memcpy"],p["decode_vs_memcpy"],p["memcpy_seconds"]*1e3,p["decode_seconds"]*1e3))
