#!/bin/bash
# PYTHONPATH: the orchestrator of a build with link_pipe.patch applied
run() { L=$1
  for cfg in "4 1" "16 1" "64 4"; do
    for v in base T64; do
      case $v in base) E="";; T64) E="HOMAGG_PIPE_TOTAL=64";; esac
      env $E python run.py $cfg $L 20 1,2,3 | sed "s/\"T\": \"[0-9]*\"/\"v\": \"$v\"/" >> small_$L.jsonl
    done
  done
}
run 1 & run 100 & wait
