#!/usr/bin/env bash
# VGG at 1 Gbit/s with and without trials of whole steps, alternating, each
# run through quiet-run; MODELS and PAIRS override the defaults.
#   measure.sh OUTDIR
set -eu
out=${1:?usage: measure.sh OUTDIR}
models=${MODELS:-vgg}
pairs=${PAIRS:-2}
here=$(cd "$(dirname "$0")/../../.." && pwd)
mkdir -p "$out"
for i in $(seq 1 "$pairs"); do
  for mode in trials no_trials; do
    flag=; [ "$mode" = trials ] && flag=--trials
    d="$out/${mode}_$i"
    /work/shared/tools/quiet-run "$here/.venv/bin/homagg" train --link-mbit 1000 --mtu 1500 \
      --model "$models" --method auto --steps 12 --warmup 2 --rounds 3 $flag --out "$d" \
      > "$d.txt" 2> "$d.err" || { echo "$mode $i failed, see $d.err" >&2; exit 1; }
    grep -h "quiet-run:" "$d.err" | head -1
    grep -h "Mbit/s |" "$d.txt" || true
  done
done
