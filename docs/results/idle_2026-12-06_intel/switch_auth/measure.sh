#!/usr/bin/env bash
# The engine with and without auth (two lcores, then generator and engine on
# one), then the testbed's allreduce with and without auth, alternating.
# Run from the repository's top with quiet-run on PATH (or QUIET_RUN naming it).
set -u
Q=${QUIET_RUN:-quiet-run}
O=${1:-docs/results/idle_2026-12-06_intel/switch_auth}
mkdir -p "$O"
$Q homagg bench switch --auth --mac umac aes-gmac --mac-isa avx2 avx512 --payload 1024 8192 \
  --rounds 5 --seconds 1 > "$O/two_lcores.txt" 2> "$O/two_lcores.err"
$Q homagg bench switch --auth --mac umac aes-gmac --mac-isa avx2 avx512 --workers 8 --lcores 0 \
  --payload 1024 8192 --rounds 5 --seconds 1 > "$O/one_lcore.txt" 2> "$O/one_lcore.err"
$Q homagg bench allreduce --methods dense,auto --workloads shared,random --workers 4 --elements 1000000 \
  --densities 0.05 --link-mbit 1000 --repeat 5 --warmup 1 --auth --rounds 5 \
  --out "$O/allreduce_auth_rounds" > "$O/allreduce_auth_rounds.txt" 2> "$O/allreduce_auth_rounds.err"
