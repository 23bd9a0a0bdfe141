#!/bin/bash
# run.sh SEED: the loss table of docs/BENCHMARKS.md "Every default, the
# table re-measured" with the build of this checkout; writes
# after_s${SEED}.json here.  Compare with the build before (the same
# table in ../tail_rmin_2026-12-07, x0_s*.json):
#   python3 ../tail_rmin_2026-12-07/cmp.py ../tail_rmin_2026-12-07/x0 after 3 1 2
# OUT=name writes name_s${SEED}.json instead (turn_s*.json: the build with
# rule 4 of "The tail of a step" and not yet rule 5).
S=$1
cd "$(dirname "$0")" || exit 1
../../../.venv/bin/python -m homagg.cli \
	bench scale --workers 4,16,64,128,256 --elements 1048576 --workload dense --methods dense \
	--aggregators W/16 --leaves W/16 --drop-rate 0,0.001,0.01 --link-gbps 1,100 --agg-link-gbps auto \
	--seed "$S" --json >"${OUT:-after}_s${S}.json" 2>"${OUT:-after}_s${S}.err"
