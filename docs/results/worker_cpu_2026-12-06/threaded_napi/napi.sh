#!/bin/bash
# Threaded NAPI on the aggregator's veth off (0) and on (1), alternating,
# three rounds of `homagg run allreduce` on a testbed made with
# `homagg testbed up --workers 4 --link-mbit 1000 --name TB`.
#   bash napi.sh TB OUT_DIR
TB=$1
OUT=$2
mkdir -p "$OUT"
for r in 1 2 3; do
 for t in 0 1; do
  ip netns exec hg-$TB-agg sh -c "echo $t > /sys/class/net/eth0/threaded"
  homagg run allreduce --testbed $TB --method auto --elements 16777216 --density 0.05 --workload shared --payload-bytes 1024 --repeat 10 --warmup 1 --json > $OUT/napi_${t}_${r}.json 2>/dev/null
  python3 -c "
import json,statistics as st;d=json.load(open('$OUT/napi_${t}_${r}.json'))
print('threaded=$t round $r', 'median ms %.1f'%(st.median(d['seconds_each'])*1e3), 'worker cpu ms', [round(x*1e3,1) for x in d['worker_cpu_seconds']], 'daemon', d['daemon_cpu_seconds'], 'machine', d['machine_cpu'])"
 done
done
ip netns exec hg-$TB-agg sh -c "echo 0 > /sys/class/net/eth0/threaded"
