#!/bin/bash
# measure.sh SEED...: the W = 256 rows of the table (flat K = 16 and 16
# leaves, 1 and 100 Gbit/s, loss-free and 1 % loss) with the build of
# the current checkout, one report per seed in ./out/seedS/scale.json.
# NIC model, virtual time: the host's load does not enter.
set -euo pipefail
mkdir -p out
for s in "$@"; do
    homagg -q bench scale --workers 256 --elements 1048576 --workload dense \
        --methods dense --aggregators W/16 --leaves W/16 --drop-rate 0,0.01 \
        --link-gbps 1,100 --agg-link-gbps auto --seed "$s" --out "out/seed$s"
done
