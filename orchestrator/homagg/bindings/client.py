"""Bindings of homagg/client.h: the worker client's stats structs as dicts
(per-phase byte counters keyed by the phase names of homagg.protocol)."""
from homagg.protocol import PHASES


def client_stats_dict(st):
    return {
        "packets_sent": st.packets_sent,
        "retransmissions": st.retransmissions,
        "timeouts": st.timeouts,
        "results_received": st.results_received,
        "duplicates_received": st.duplicates_received,
        "status_received": st.status_received,
        "packets_ignored": st.packets_ignored,
        "tx_refused": st.tx_refused,
        "bytes_sent": {PHASES[i]: st.bytes_sent[i] for i in range(len(PHASES))},
        "bytes_received": {PHASES[i]: st.bytes_received[i] for i in range(len(PHASES))},
        "chunks": st.chunks,
        "stalled_blocks": st.stalled_blocks,
        "fallback_lanes": st.fallback_lanes,
        "method_chosen": st.method_chosen,
        "next_seq": st.next_seq,
        "srtt_ns": st.srtt_ns,
        "rttvar_ns": st.rttvar_ns,
        "rto_ns": st.rto_ns,
        "rtt_samples": st.rtt_samples,
        "aggregators": st.aggregators,
        "bad_mac": st.bad_mac,
    }


AGG_STATS = ("packets_sent", "retransmissions", "timeouts", "results_received",
             "status_received", "bytes_sent", "bytes_received", "chunks", "next_seq",
             "srtt_ns", "rttvar_ns", "rto_ns", "rtt_samples")


def agg_stats_dict(st):
    return {k: getattr(st, k) for k in AGG_STATS}
