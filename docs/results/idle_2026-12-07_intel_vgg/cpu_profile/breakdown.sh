#!/bin/sh
# breakdown.sh PERF_DATA: share of all samples (both CPUs) by process and path
perf script -i "$1" 2>/dev/null | awk 'BEGIN{RS=""} {split($0,L,"\n"); split(L[1],H," "); comm=H[1]; k=(L[2] ~ /kallsyms/)?"kernel":"user"; cat="";
 if (k=="kernel") { if ($0 ~ /veth_xdp_rcv|xsk_rcv|__xsk_map_redirect/) cat="xdp ingress (veth napi, af_xdp copy)"; else if ($0 ~ /recvmmsg|recvmsg|recvfrom|__skb_recv_udp|tcp_recvmsg/) cat="receive syscalls"; else if ($0 ~ /sendmmsg|sendmsg|sendto|udp_send|tcp_sendmsg/) cat="send syscalls (incl. bridge forwarding)"; else if ($0 ~ /ppoll|do_sys_poll|schedule|futex|epoll/) cat="poll, futex, scheduling"; else if ($0 ~ /page_fault/) cat="page faults"; else cat="other"}
 else { if ($0 ~ /hg_scan|hg_scatter|hg_union|hg_lhc|codec|hg_gather|quant|bloom/) cat="codec"; else if ($0 ~ /_hg\.abi3|homagg-switch|librte/) cat="protocol"; else cat="other (libc, python, torch, gloo)"}
 if (comm=="swapper") {comm="idle"; k=""; cat=""}
 c[comm" "k" "cat]++; t++} END{for(x in c) printf "%6.1f%%  %s\n", 100*c[x]/t, x}' | sort -rn
