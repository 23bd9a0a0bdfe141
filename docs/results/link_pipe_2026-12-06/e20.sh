#!/bin/bash
# PYTHONPATH: the orchestrator of a build with link_pipe.patch applied
run() { L=$1
  for v in base T64; do
    case $v in base) E="";; T64) E="HOMAGG_PIPE_TOTAL=64";; esac
    env $E python run.py 256 16 $L 20 1,2,3 | sed "s/\"T\": \"[0-9]*\"/\"v\": \"$v\"/" >> e20_$L.jsonl
  done
}
run 1 & run 100 & wait
