#!/bin/sh
# Trees under 1 % loss, seeds 9-28, with the build on PYTHONPATH:
#   PYTHONPATH=orchestrator sh docs/results/tree_holdoff_2026-12-06/measure.sh OUTDIR
# writes OUTDIR/W_GBITS.jsonl (tree.py's lines); summary.py compares two.
set -e
out=${1:?an output folder}
here=$(dirname "$0")
mkdir -p "$out"
seeds=$(seq -s, 9 28)
for cfg in "16 4" "64 4" "256 16"; do
    for g in 1 100; do
        set -- $cfg
        python "$here/tree.py" "$1" "$2" "$g" 18 "$seeds" > "$out/${1}_${g}.jsonl"
    done
done
