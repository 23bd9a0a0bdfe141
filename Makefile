# HomAgg - build, test, benchmark and demo entry points.
#
# Knobs (make VAR=value ...):
#   DEBUG=1                       build C with -O0 -g3 (default -O2 -g)
#   SANITIZE=address,undefined    build the C library and the Python extension
#                                 with these sanitizers (make test also runs a
#                                 sanitizer pass of its own, see test-sanitize)
#   PYTHON=python3                interpreter used to create .venv
#   PYTEST_ARGS=...               extra arguments for pytest (e.g. -k codec)
#   FUZZ_SECONDS=20               time budget of each libFuzzer target (make fuzz)
#   NO_APT=1                      never call apt-get (fail if packages are missing)
#   N=3                           runs of the suite for make test-repeat
#   FORMAT=0                      make lint skips the format check (on by
#                                 default: ruff format --check, clang-format
#                                 --dry-run -Werror)
#
# In the environment (not a make variable): HOMAGG_CODEC_ISA=portable|avx2|avx512
# forces the codec's ISA path of everything make runs (tests, make bench; by
# default the best the CPU has; `homagg bench codec` times every path anyway).
# HOMAGG_MAC_ISA=portable|pclmul|avx2|avx512 likewise forces AES-GMAC's path
# (docs/SECURITY.md "How AES-GMAC is computed"; the same tags on each).
#
# `make help` lists the targets.

PYTHON      ?= python3
DEBUG       ?=
SANITIZE    ?=
PYTEST_ARGS ?=
FUZZ_SECONDS ?= 20
FORMAT      ?= 1

VENV   := .venv
VPY    := $(VENV)/bin/python
VARIANT := $(if $(SANITIZE),san,$(if $(DEBUG),debug,release))
BUILD  := build/$(VARIANT)

CC      ?= gcc
OPT     := $(if $(DEBUG),-O0 -g3,-O2 -g)
SANFLAGS := $(if $(SANITIZE),-fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all,)
CFLAGS_COMMON := -std=gnu11 -Wall -Wextra -Werror=implicit-function-declaration \
	-fPIC $(OPT) $(SANFLAGS) -Idataplane_c/include -Inic/include -Isim/include

# Every C file of the library: the engine, the codec, the kernels
# (dataplane_c/), the NIC model (nic/) and the simulated cluster that
# assembles them (sim/; dataplane_c/ never includes nic/ or sim/ headers).
# Backends are chosen by file (dataplane_c/dpdk/ builds separately).
# Port backends (homagg/port.h) live in dataplane_c/ports/: memory and kernel
# UDP in the library, DPDK (ports/dpdk/) in the daemon only; the NIC model's
# port is nic/src/nic_port.c.
LIB_SRCS := $(wildcard dataplane_c/src/*.c) $(wildcard dataplane_c/ports/*.c) \
	$(wildcard nic/src/*.c) $(wildcard sim/src/*.c)
LIB_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(LIB_SRCS))
LIB      := $(BUILD)/libhomagg.a
HEADERS  := $(wildcard dataplane_c/include/homagg/*.h) $(wildcard nic/include/homagg/*.h) \
	$(wildcard sim/include/homagg/*.h) $(wildcard dataplane_c/src/*.h) $(wildcard nic/src/*.h)

APT_PACKAGES := build-essential pkg-config libdpdk-dev dpdk libjansson-dev libsodium-dev libssl-dev clang \
	libclang-rt-14-dev clang-format ethtool iproute2 iputils-ping openssh-server python3-venv systemd

.PHONY: help build deps venv lib ext switch tools fuzz lint format test test-sanitize test-fast test-repeat bench demo clean distclean

help: ## list the targets
	@echo "HomAgg make targets:"
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sed -e 's/:.*## /\t/' | expand -t 18 | sed 's/^/  /'
	@echo "Knobs: see the top of the Makefile (DEBUG, SANITIZE, PYTHON, PYTEST_ARGS, FUZZ_SECONDS, NO_APT, N, FORMAT)."

build: deps venv lib ext switch tools ## install system packages, create .venv, build the C library, the Python extension, the daemon and the tools

deps: build/.deps-stamp ## install missing system packages (apt-get, non-interactive)

build/.deps-stamp: Makefile
	@mkdir -p build
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		if [ -n "$(NO_APT)" ]; then echo "missing system packages: $$missing (NO_APT is set)"; exit 1; fi; \
		echo "installing system packages: $$missing"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi
	@touch $@

venv: $(VENV)/.stamp ## create .venv and install the package editable with the extras the tests need

$(VENV)/.stamp: pyproject.toml setup.py
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip setuptools wheel cffi
	$(MAKE) --no-print-directory lib
	HOMAGG_LIBDIR=$(CURDIR)/$(BUILD) $(VPY) -m pip install -q --no-build-isolation -e '.[test,testbed,provision,plot,metrics]'
	$(VPY) -m pip install -q torch==2.13.0
	@touch $@

lib: $(LIB) ## build the C library (build/<variant>/libhomagg.a)

$(BUILD)/%.o: %.c $(HEADERS) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) -c $< -o $@

$(LIB): $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

# The DPDK aggregator daemon: dataplane_c/dpdk/*.c against the library and
# the distribution's libdpdk (pkg-config, evaluated when the rule runs).
SWITCH_SRCS := $(wildcard dataplane_c/dpdk/*.c) dataplane_c/ports/dpdk/port_dpdk.c
SWITCH      := $(BUILD)/homagg-switch

SWITCH_BENCH := $(BUILD)/homagg-switch-bench

switch: $(if $(SWITCH_SRCS),$(SWITCH) $(SWITCH_BENCH),) ## build the DPDK aggregator daemon homagg-switch (and its benchmark)

# The control socket parses and writes JSON with jansson.
$(SWITCH): $(SWITCH_SRCS) $(wildcard dataplane_c/dpdk/*.h) dataplane_c/ports/dpdk/port_dpdk.h $(LIB)
	$(CC) $(CFLAGS_COMMON) -Idataplane_c/ports/dpdk -Wno-unused-parameter $$(pkg-config --cflags libdpdk jansson) $(SWITCH_SRCS) \
		$(LIB) $$(pkg-config --libs libdpdk jansson) -lsodium -lcrypto -lm -lpthread -o $@

# Its benchmark: the engine on a net_ring ethdev fed by a generator lcore.
$(SWITCH_BENCH): dataplane_c/dpdk/bench/switch_bench.c dataplane_c/ports/dpdk/port_dpdk.c dataplane_c/ports/dpdk/port_dpdk.h $(LIB)
	$(CC) $(CFLAGS_COMMON) -Idataplane_c/ports/dpdk -Wno-unused-parameter $$(pkg-config --cflags libdpdk) $(filter %.c,$^) \
		$(LIB) $$(pkg-config --libs libdpdk) -lrte_net_ring -lsodium -lcrypto -lm -lpthread -o $@

# Measurement tools of docs/PROTOCOL.md ("Sketch sizing measurements"):
# dataplane_c/tools/*.c, each one program against the library.
TOOLS_SRCS := $(wildcard dataplane_c/tools/*.c)
TOOLS      := $(patsubst dataplane_c/tools/%.c,$(BUILD)/tools/%,$(TOOLS_SRCS))

tools: $(TOOLS) ## build the measurement tools (build/<variant>/tools/)

$(BUILD)/tools/%: dataplane_c/tools/%.c $(HEADERS) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) -Idataplane_c/src $< $(LIB) -lsodium -lcrypto -lm -o $@

# libFuzzer targets: dataplane_c/fuzz/fuzz_*.c, each built with clang
# against the library sources (plus FUZZ_EXTRA_<name>) and run for
# FUZZ_SECONDS from its seed corpus dataplane_c/fuzz/corpus_<name without fuzz_>.
FUZZ_SRCS := $(wildcard dataplane_c/fuzz/fuzz_*.c)
FUZZ_EXTRA_fuzz_control := dataplane_c/dpdk/control.c $$(pkg-config --cflags --libs jansson)
define FUZZ_ONE
t=build/fuzz/$(basename $(notdir $(1))); \
clang -g -O1 -fsanitize=fuzzer,address,undefined -Idataplane_c/include -Inic/include -Isim/include \
	$(LIB_SRCS) $(1) $(FUZZ_EXTRA_$(basename $(notdir $(1)))) -lsodium -lcrypto -lm -o $$t || exit 1; \
mkdir -p $$t.corpus; \
seeds=$(dir $(1))corpus_$(patsubst fuzz_%,%,$(basename $(notdir $(1)))); [ -d $$seeds ] || seeds=; \
$$t -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 $$t.corpus $$seeds > $$t.log 2>&1; rc=$$?; \
tail -n 12 $$t.log; [ $$rc = 0 ] || exit 1;
endef
fuzz: deps ## build and run every libFuzzer target for FUZZ_SECONDS each
	@mkdir -p build/fuzz
	@$(foreach f,$(FUZZ_SRCS),$(call FUZZ_ONE,$(f)))

ext: lib venv ## build the cffi extension in place, against the current variant
	HOMAGG_LIBDIR=$(CURDIR)/$(BUILD) HOMAGG_SANITIZE=$(SANITIZE) $(VPY) setup.py -q build_ext --inplace --force

# What the formatters cover: the Python package and the tests (ruff format,
# [tool.ruff.format] in pyproject.toml) and every C file of the tree
# (clang-format, .clang-format at the top).
PY_FORMAT_DIRS := orchestrator tests
C_FORMAT_SRCS = $(shell find dataplane_c nic sim -name '*.[ch]' | sort)

lint: venv deps ## ruff over the Python package and the tests, and the format of the Python and the C (seconds; FORMAT=0 skips the format)
	$(VENV)/bin/ruff check $(PY_FORMAT_DIRS)
ifeq ($(FORMAT),1)
	$(VENV)/bin/ruff format --check $(PY_FORMAT_DIRS)
	clang-format --dry-run -Werror $(C_FORMAT_SRCS)
endif

format: venv deps ## format the Python (ruff format) and the C (clang-format) in place
	$(VENV)/bin/ruff format $(PY_FORMAT_DIRS)
	clang-format -i $(C_FORMAT_SRCS)

test: build lint ## lint, all tests (root, netns, DPDK included), then the sanitizer pass and the fuzz run
	$(VPY) -m pytest $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-sanitize
	$(MAKE) --no-print-directory ext

test-fast: build ## only the tests that need no root and no network namespaces
	$(VPY) -m pytest -m "not root and not slow" $(PYTEST_ARGS)

# N runs of the whole pytest suite in a row; every test that failed in any
# run is listed with the runs it failed in (a test that fails once is a
# defect: CI runs the suite once).  Exit status 1 if any test failed.
N ?= 3
test-repeat: build ## run the pytest suite N times (default 3) and list every test that failed even once
	@mkdir -p build/repeat; rm -f build/repeat/run-*.log; fail=0; \
	for i in $$(seq 1 $(N)); do \
		echo "test-repeat: run $$i of $(N)"; \
		$(VPY) -m pytest -q -p no:cacheprovider -rf $(PYTEST_ARGS) > build/repeat/run-$$i.log 2>&1 || fail=1; \
		tail -n 1 build/repeat/run-$$i.log; \
	done; \
	grep -h '^FAILED\|^ERROR' build/repeat/run-*.log | sed 's/ - .*//' | sort | uniq -c | \
		awk '{ printf "test-repeat: failed %d of $(N) runs: %s\n", $$1, $$3 } END { if (NR == 0) print "test-repeat: no test failed in $(N) runs" }'; \
	exit $$fail

# The sanitizer pass rebuilds the extension with ASan+UBSan and runs the
# codec and engine tests under it; `make test` rebuilds the release extension
# afterwards.
test-sanitize: ## codec and engine tests against SANITIZE=address,undefined
	$(MAKE) --no-print-directory SANITIZE=address,undefined lib ext
	LD_PRELOAD=$$($(CC) -print-file-name=libasan.so):$$($(CC) -print-file-name=libubsan.so) \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	HOMAGG_SANITIZED=1 $(VPY) -m pytest -m "sanitize" -p no:cacheprovider $(PYTEST_ARGS)

# The testbed at the paper's size: 2^24 float32 per worker, W = 4, density
# 0.05, every method (the default) and Gloo, 1 Gbit/s links; then the
# link-rate sweep (Gloo, lhc and auto on shared).  Both: median of 3 timed
# allreduces after 1 warmup by the same processes.
BENCH_ALLREDUCE := --workers 4 --densities 0.05 --workloads shared,random,zipf,dense \
	--link-mbit 1000 --elements 16777216 --repeat 3 --warmup 1 --out docs/results/allreduce
BENCH_SWEEP := --workers 4 --densities 0.05 --workloads shared --methods gloo,lhc,auto \
	--link-mbit 100,1000,2500,10000 --elements 16777216 --repeat 3 --warmup 1 \
	--testbed-name benchsweep --out docs/results/allreduce_sweep
# Training at three link rates: every built-in model, Gloo DDP then the hook
# (auto, the cost model's choice of path), 4 ranks, one testbed per rate
# (homagg.train.sweep; about 15 minutes).
BENCH_TRAIN_SWEEP := --link-mbit 100,1000,10000 --workers 4 --model ncf,lstm,bert,vgg \
	--method auto --steps 5 --warmup 1 --testbed-name trainsweep --out docs/results/train_sweep
# The same size with 1 KB payloads on MTU 1500 links next to 8 KB payloads on
# jumbo (MTU 9000) links, Gloo on each (about 4 minutes).
BENCH_JUMBO := --workers 4 --densities 0.05 --workloads shared,random,zipf,dense \
	--methods gloo,dense,auto,union --payload-bytes 1024,8192 --link-mbit 1000 \
	--elements 16777216 --repeat 3 --warmup 1 --testbed-name benchjumbo \
	--out docs/results/allreduce_jumbo
# What authentication costs (targets: the engine with auth at least 0.5x its
# rate without, the testbed's allreduce at most 1.10x its time without): the
# engine at 1 and 8 KB on every MAC path the CPU has, three rounds, then
# 10^6 float32 on the testbed, each pair alternating over five rounds
# (about 10 minutes).
BENCH_AUTH_SWITCH := --auth --mac umac aes-gmac --mac-isa all --payload 1024 8192 \
	--rounds 3 --seconds 1 --json
BENCH_AUTH_ALLREDUCE := --methods dense,auto --workloads shared,random --workers 4 \
	--elements 1000000 --densities 0.05 --link-mbit 1000 --repeat 5 --warmup 1 --auth --rounds 5 \
	--testbed-name benchauth --out docs/results/allreduce_auth
# The advisor against measurement: 24 configurations (1000 and 10000 Mbit/s,
# shared, densities 1, 0.05 and 0.0068, Gloo, dense, union, auto; W = 4,
# 2^20 float32), with a calibration of this host and of each testbed's port
# made in the same run.
BENCH_ADVISE_DIR := docs/results/advise

bench: build ## the standard benchmark suite into docs/results/ (the testbed part needs root)
	mkdir -p docs/results
	$(VENV)/bin/homagg bench codec --json > docs/results/codec.json
	$(VENV)/bin/python -m homagg.bench.markdown codec docs/results/codec.json docs/results/codec.md
	$(VENV)/bin/homagg calibrate --out docs/results/calibration.json
	HOMAGG_CALIBRATION=docs/results/calibration.json $(VENV)/bin/homagg bench codec --workers 4 \
	  --no-numpy --elements 3846144 --density 0.0068 --link-mbit 1000 --json > docs/results/codec_ncf_1g.json
	$(VENV)/bin/python -m homagg.bench.markdown codec docs/results/codec_ncf_1g.json docs/results/codec_ncf_1g.md \
	  "homagg bench codec --workers 4 --no-numpy --elements 3846144 --density 0.0068 --link-mbit 1000 --json"
	$(VENV)/bin/homagg bench engine --json > docs/results/engine.json
	$(VENV)/bin/python -m homagg.bench.markdown engine docs/results/engine.json docs/results/engine.md
	$(VENV)/bin/homagg bench scale --out docs/results/scale
	$(VENV)/bin/homagg bench scale --methods dense,lhc --aggregators 1,2,4,8,W/8 --out docs/results/scale_k
	$(VENV)/bin/homagg bench scale --workers 32,64,128,256 --methods dense,lhc --aggregators 16 \
	  --leaves W/16 --out docs/results/scale_tree
	$(VENV)/bin/homagg bench scale --workers 16,64,256 --elements 262144 --workload dense --methods dense \
	  --aggregators W/16 --leaves W/16 --drop-rate 0,0.001,0.01 --link-gbps 1,100 --agg-link-gbps auto \
	  --pipe-gain 0,auto --seed 3 --out docs/results/scale_pipe
	@if [ "$$(id -u)" = 0 ]; then set -x; $(VENV)/bin/homagg bench allreduce $(BENCH_ALLREDUCE) && \
	  $(VENV)/bin/homagg bench allreduce $(BENCH_SWEEP) && \
	  $(VENV)/bin/homagg bench allreduce $(BENCH_JUMBO); \
	  $(VENV)/bin/homagg bench switch $(BENCH_AUTH_SWITCH) > docs/results/switch_auth.jsonl; \
	  $(VENV)/bin/homagg bench allreduce $(BENCH_AUTH_ALLREDUCE); \
	  $(VENV)/bin/homagg train $(BENCH_TRAIN_SWEEP); \
	  $(VENV)/bin/homagg bench soak --minutes 5 --json > docs/results/soak.json; \
	  $(VENV)/bin/homagg bench shards --out docs/results/shards; \
	  $(VENV)/bin/homagg bench lcores --out docs/results/lcores; \
	  $(VENV)/bin/homagg calibrate --out $(BENCH_ADVISE_DIR)/calibration.json && \
	  HOMAGG_CALIBRATION=$(BENCH_ADVISE_DIR)/calibration.json \
	  $(VENV)/bin/homagg bench advise --out $(BENCH_ADVISE_DIR); \
	else echo "make bench: skipping homagg bench allreduce, soak and advise: they build network namespaces," \
	  "tc-shaped veth links and a DPDK daemon, which needs root (run make bench as root)"; fi

demo: build ## the main job: exact allreduce on a 4-worker testbed (in-process cluster without root)
	$(VENV)/bin/homagg demo

clean: ## remove build outputs (keeps .venv)
	rm -rf build orchestrator/homagg/_hg*.so orchestrator/homagg/_hg.c orchestrator/homagg/_hg.o

distclean: clean ## also remove .venv
	rm -rf $(VENV)
