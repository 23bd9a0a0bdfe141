#!/bin/sh
# profile.sh METHOD OUT: the VGG bucket's allreduce in a loop on a 4-worker
# 1 Gbit/s testbed, 8 s of system-wide cpu-clock samples in its middle
set -e
m=$1; out=$2
homagg bench allreduce --methods "$m" --workloads shared --workers 4 --elements 420906 \
    --densities 0.66 --link-mbit 1000 --repeat 4000 --warmup 2 > "$out.bench.txt" 2>&1 &
pid=$!
for i in $(seq 1 60); do sleep 2; grep -q "testbed bench:" "$out.bench.txt" && break; done
sleep 8
perf record -a -g -F 2000 -e cpu-clock -o "$out.perf.data" -- sleep 8
wait $pid
