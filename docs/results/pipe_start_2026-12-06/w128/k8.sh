#!/bin/bash
# W = 128 over K = 8 (each pipe starts at 32 / 8 = 4), 2^18 floats, seeds
# 1-3, sim.Cluster's defaults: BASE and FINAL are the orchestrators of the
# builds before and after (../README.md).
for L in 1 100; do
  PYTHONPATH=$BASE python ../../link_pipe_2026-12-06/run.py 128 8 $L 18 1,2,3 > k8_base_$L.jsonl &
  PYTHONPATH=$FINAL python ../../link_pipe_2026-12-06/run.py 128 8 $L 18 1,2,3 > k8_final_$L.jsonl
  wait
done
