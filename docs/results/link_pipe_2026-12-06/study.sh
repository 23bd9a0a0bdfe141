#!/bin/bash
# two streams: 1G and 100G; each: variants x seeds 1-10
# PYTHONPATH: the orchestrator of a build with link_pipe.patch applied
run() { # L
  L=$1
  for v in base T64 T32 V1; do
    case $v in
      base) E="";;
      T64) E="HOMAGG_PIPE_TOTAL=64";;
      T32) E="HOMAGG_PIPE_TOTAL=32";;
      V1) E="HOMAGG_PIPE_LINK=2";;
    esac
    env $E python run.py 256 16 $L 18 1,2,3,4,5,6,7,8,9,10 | sed "s/\"T\": \"[0-9]*\"/\"v\": \"$v\"/" >> study_$L.jsonl
  done
}
run 1 &
run 100 &
wait
