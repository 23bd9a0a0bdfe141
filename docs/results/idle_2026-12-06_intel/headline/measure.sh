#!/usr/bin/env bash
# The headline (1 KB payloads and the job's default of 1424 bytes) on each
# codec path, then the codec at 2^26 (the default), 2^24 and NCF's bucket
# shape.  Run from the repository's top with quiet-run on PATH (or QUIET_RUN
# naming it); OUT defaults to this directory.
set -u
Q=${QUIET_RUN:-quiet-run}
O=${1:-docs/results/idle_2026-12-06_intel/headline}
mkdir -p "$O"
for isa in avx512 avx2; do
  HOMAGG_CODEC_ISA=$isa $Q homagg bench allreduce --methods gloo,auto --workloads shared,zipf,random \
    --workers 4 --elements 16777216 --densities 0.05 --payload-bytes 1024 --repeat 5 \
    --out "$O/headline_${isa}_1k" > "$O/headline_${isa}_1k.stdout" 2> "$O/headline_${isa}_1k.stderr"
done
$Q homagg bench codec --no-numpy --repeat 5 --json > "$O/codec_2p26.json" 2> "$O/codec_2p26.err"
$Q homagg bench codec --elements 3846144 --density 0.0068 --link-mbit 1000 --repeat 5 --json \
  > "$O/codec_ncf.json" 2> "$O/codec_ncf.err"
for isa in avx512 avx2; do
  HOMAGG_CODEC_ISA=$isa $Q homagg bench allreduce --methods gloo,auto --workloads shared,zipf,random \
    --workers 4 --elements 16777216 --densities 0.05 --repeat 5 \
    --out "$O/headline_${isa}_1424" > "$O/headline_${isa}_1424.stdout" 2> "$O/headline_${isa}_1424.stderr"
done
$Q homagg bench codec --elements 16777216 --no-numpy --repeat 5 --json > "$O/codec_2p24.json" 2> "$O/codec_2p24.err"
