#!/bin/bash
# The runs of docs/BENCHMARKS.md "Several pipes on one link" (NIC model,
# virtual time), with PYTHONPATH at the orchestrator of the build to
# measure; OUT: where the JSON lines go.
#   OUT=dir bash measure.sh
set -e
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
# the issue's table at W = 64 over K = 4 (the other rows have one aggregator)
GAINS=-1 python "$here/pipe_2026-12-05/issue_table.py" 64:4:1,64:4:100 1,2,3,4,5 > "$OUT/issue_table_w64.jsonl" &
# W = 256 over K = 16 at the issue's size, seeds 1-3
python "$here/link_pipe_2026-12-06/run.py" 256 16 1 20 1,2,3 > "$OUT/w256_e20_1g.jsonl"
python "$here/link_pipe_2026-12-06/run.py" 256 16 100 20 1,2,3 > "$OUT/w256_e20_100g.jsonl"
wait
# homagg bench scale's links and slots, 2^18 floats, seeds 1-5
for cfg in "64 4 1" "64 4 100" "256 16 1" "256 16 100"; do
  python "$here/tail_reports_2026-12-06/many.py" $cfg 0 18 1,2,3,4,5 >> "$OUT/scale.jsonl"
done
