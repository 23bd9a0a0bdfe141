#!/bin/bash
# alternate the idle backoff (new) and the fixed idle sleep (old) on the 1 Gbit/s training sweep
H=/work/main/.venv/bin/homagg
for i in 1 2; do
  for v in new old; do
    if [ $v = old ]; then export HOMAGG_SWITCH=/work/bench/s17/switch_fixed.sh; else unset HOMAGG_SWITCH; fi
    timeout 1500 /work/shared/tools/quiet-run $H train --link-mbit 1000 --model ncf,lstm,bert,vgg --method auto --steps 12 --warmup 2 --rounds 3 --out /work/bench/s17/ab/train_${v}_$i > train_${v}_$i.json 2> train_${v}_$i.err
  done
done
echo done > train_done
