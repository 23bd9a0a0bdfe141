#!/usr/bin/env bash
# ab.sh TESTBED STATE_DIR ROUNDS: `homagg run allreduce` dense, 10^6 float32,
# 4 workers, alternating without and with --auth, one JSON line per run
# (time in ms as the median of 9 timed calls, per-worker CPU ms per call).
set -eu
tb=$1 sd=$2 rounds=${3:-4}
for i in $(seq "$rounds"); do
  for a in "" "--auth"; do
    python -m homagg.cli run allreduce --testbed "$tb" --state-dir "$sd" --method dense \
      --elements 1000000 --density 1.0 --repeat 9 --warmup 1 $a --json 2>/dev/null |
      tail -n 1 | python -c "
import json, statistics, sys
r = json.loads(sys.stdin.read())
print(json.dumps({'round': $i, 'auth': '$a' != '', 'exact': r['exact'],
                  'ms': round(statistics.median(r['seconds_each']) * 1e3, 2),
                  'worker_cpu_ms': [round(c * 1e3, 2) for c in r['worker_cpu_seconds']],
                  'daemon_cpu_ms': round(r['daemon_cpu_seconds'] * 1e3, 2)}))"
  done
done
