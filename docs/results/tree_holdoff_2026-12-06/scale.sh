#!/bin/sh
# `homagg bench scale` at W = 256 over 16 leaves (the flat K = 1 row comes
# with it), dense, 2^18 floats, loss-free and 1 %, seeds 1-8, 1 and 100
# Gbit/s, with the build on PYTHONPATH:
#   PYTHONPATH=orchestrator sh docs/results/tree_holdoff_2026-12-06/scale.sh OUTDIR
# scale_summary.py compares two such folders.
set -e
out=${1:?an output folder}
mkdir -p "$out"
for s in 1 2 3 4 5 6 7 8; do
    for g in 1 100; do
        homagg bench scale --workers 256 --leaves 16 --methods dense --workload dense \
            --drop-rate 0,0.01 --link-gbps "$g" --seed "$s" --json > "$out/s${s}_${g}.json"
    done
done
