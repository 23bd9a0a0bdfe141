#!/bin/bash
# CPU and wake-ups of an idle homagg-switch on a 4-worker testbed, 10 s, with the
# growing idle sleep (new, the default --idle-max-us 1000) and with the fixed one (old)
H=/work/main/.venv/bin/homagg
for v in new old new old; do
  if [ $v = old ]; then export HOMAGG_SWITCH=/work/bench/s17/switch_fixed.sh; else unset HOMAGG_SWITCH; fi
  $H testbed up --name idl --workers 4 --link-mbit 1000 >/dev/null 2>&1
  P=$(cat /run/homagg/testbeds/idl.d/*.pid 2>/dev/null | head -1)
  [ -z "$P" ] && P=$(pgrep -f "homagg-switch.*testbeds/idl.d" | head -1)
  sleep 1
  a=$(awk '{print $14+$15}' /proc/$P/stat); c0=$(awk '/^voluntary/{print $2}' /proc/$P/task/$P/status)
  sleep 10
  b=$(awk '{print $14+$15}' /proc/$P/stat); c1=$(awk '/^voluntary/{print $2}' /proc/$P/task/$P/status)
  echo "$v: pid $P, CPU $(( (b-a)*10 )) ms in 10 s ($(awk "BEGIN{print ($b-$a)/10}") % of a core), wake-ups $(( (c1-c0)/10 )) per second"
  $H testbed down --name idl >/dev/null 2>&1
done
