#!/bin/bash
# run.sh X SEED: the loss table of docs/BENCHMARKS.md "Every default, the
# table re-measured", with HG_TAIL_RMIN=X (0: the build as it is), through
# the checkout in $BUILD (tail_variants.patch applied, `make build` run
# there).  HG_TAIL_ONCE=1 (once_s*.json) and HG_TAIL_ANYRES=1 (any_s3.json)
# in the environment select the two variants.  Writes x${X}_s${SEED}.json
# here (rename for a variant); `python3 cmp.py x0 x3 3 1 2` compares.
X=$1
S=$2
HG_TAIL_RMIN=$X PYTHONPATH="$BUILD/orchestrator" python3 -m homagg.cli \
	bench scale --workers 4,16,64,128,256 --elements 1048576 --workload dense --methods dense \
	--aggregators W/16 --leaves W/16 --drop-rate 0,0.001,0.01 --link-gbps 1,100 --agg-link-gbps auto \
	--seed "$S" --json >"x${X}_s${S}.json" 2>"x${X}_s${S}.err"
