#!/bin/bash
# Profile the workers of `homagg run allreduce` on a local testbed with the
# kernel's software clock (no hardware counters needed), then classify the
# workers' samples of the timed calls (classify.py).  Needs root and perf.
#
#   bash profile.sh OUT_DIR [homagg run allreduce options...]
#
# e.g. bash profile.sh /tmp/prof --method auto --elements 16777216 \
#        --density 0.05 --workload shared --payload-bytes 1024
set -euo pipefail
out=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
repeat=40
hz=2000
mkdir -p "$out"
homagg testbed up --workers 4 --link-mbit 1000 --name prof > "$out/testbed.txt"
trap 'homagg testbed down --name prof > /dev/null 2>&1 || true' EXIT
perf record -a -g -e cpu-clock -F $hz -o "$out/perf.data" -- \
    homagg run allreduce --testbed prof --repeat $repeat --warmup 1 --json "$@" \
    > "$out/run.json" 2> "$out/run.err"
perf script -i "$out/perf.data" -F comm,time,ip,sym,dso > "$out/samples.txt" 2> /dev/null
python3 "$here/classify.py" "$out/samples.txt" $repeat 4 $hz | tee "$out/classes.txt"
python3 -c "
import json; d = json.load(open('$out/run.json'))
print('homagg run allreduce: worker CPU per allreduce (ms):',
      [round(x * 1e3, 1) for x in d['worker_cpu_seconds']], 'machine', d['machine_cpu'])
" | tee -a "$out/classes.txt"
