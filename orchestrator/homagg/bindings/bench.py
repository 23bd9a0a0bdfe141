"""Bindings of homagg/bench.h, the in-process engine benchmark.  The typed
API is ``homagg.bench.engine``."""

from homagg._native import ffi, lib
from homagg.bindings._args import _fill, _struct_dict
from homagg.errors import check


def bench_engine(**config):
    """hg_bench_engine with hg_bench_engine_config_init's defaults and the
    given fields of struct hg_bench_engine_config; the result struct as a
    dict (every field)."""
    c = ffi.new("struct hg_bench_engine_config *")
    lib.hg_bench_engine_config_init(c)
    r = ffi.new("struct hg_bench_engine_result *")
    check(lib.hg_bench_engine(_fill(c, config), r), "hg_bench_engine")
    return _struct_dict(r, "struct hg_bench_engine_result")
