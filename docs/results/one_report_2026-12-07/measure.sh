#!/bin/bash
# measure.sh: the reports of this folder, with the build of the current
# checkout (NIC model, virtual time: the host's load does not enter).
#   bash measure.sh flat256 1 2 3 7   # W = 256 flat, 0, 0.1 and 1 % loss
#   bash measure.sh w256 4 5 6        # W = 256 flat and 16 leaves, 0 and 1 %
#   bash measure.sh small 1 2 3       # W = 4, 16, 64, 128, flat and tree
# Each run writes out/<what>_seedS/scale.json.
set -euo pipefail
what=$1
shift
mkdir -p out
for s in "$@"; do
    case $what in
    flat256) args=(--workers 256 --aggregators W/16 --drop-rate 0,0.001,0.01) ;;
    w256) args=(--workers 256 --aggregators W/16 --leaves W/16 --drop-rate 0,0.01) ;;
    small) args=(--workers 4,16,64,128 --aggregators W/16 --leaves W/16 --drop-rate 0,0.001,0.01) ;;
    *) echo "measure.sh: flat256, w256 or small, then seeds" >&2; exit 2 ;;
    esac
    homagg -q bench scale "${args[@]}" --elements 1048576 --workload dense \
        --methods dense --link-gbps 1,100 --agg-link-gbps auto --seed "$s" \
        --out "out/${what}_seed$s"
done
