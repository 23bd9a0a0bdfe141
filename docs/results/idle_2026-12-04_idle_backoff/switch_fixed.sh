#!/bin/sh
# homagg-switch with the idle sleep fixed at --idle-us (the behaviour before --idle-max-us)
exec /work/main/build/release/homagg-switch "$@" --idle-max-us 0
