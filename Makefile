# ablate: the two commands that matter are `make demo` and `make test`.
# Every target installs what it needs first (`make deps`, idempotent, Debian 12).

BUILD    ?= build
JOBS     ?= $(shell nproc)
DATA_DIR ?= data
SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# Debian packages ablate builds and runs with (`make deps`: what `make demo` and `make build`
# install). nodejs brings the machine's Node.js; the build runs `npm ci` in dashboard/ (uPlot,
# and playwright-core for the browser test, which drives Debian's chromium, never a downloaded
# one). bible-kjv writes the default corpus (`make data`). libsentencepiece-dev: the tokenizers
# of `ablate data prepare` (linked only into ablate-data, never beside gRPC's protobuf).
PACKAGES := cmake ninja-build g++ pkg-config \
  libtorch-dev libopenblas0-openmp libgloo-dev \
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
  libsqlite3-dev libssl-dev libre2-dev libfmt-dev libboost-dev libyaml-cpp-dev nlohmann-json3-dev \
  libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev libsentencepiece-dev \
  bible-kjv nodejs
# What only the tests need on top (`make deps-test`, run by `make test`):
# - chromium: the dashboard's browser test;
# - slurmctld, slurmd, slurm-client, munge: tests/integration/slurm_test.cc starts its own
#   single-node cluster from them (private ports and dirs; the packages' services are not used);
# - clang and libclang-rt-14-dev (libFuzzer, the sanitizers): the fuzz targets' replay, and clang's
#   thread-safety analysis (`make check-thread-safety`);
# - sqlite3 and openssl: the docs' examples and the TLS tests' certificates;
# - python3-pandas, python3-grpcio, python3-protobuf: docs/python.md's examples
#   (tests/python/docs_python_test.py; the gRPC stubs come from protobuf-compiler-grpc above);
# - python3-scipy: the check of `ablate compare`'s statistics (tests/python/stats_scipy_test.py);
# - python3-torch: the example program run as a program (experiments/programs/gated_gpt.py, its
#   tests and docs/program.md's examples);
# - sentencepiece (spm_train, spm_encode): docs/data.md's examples of models made elsewhere and
#   given to `ablate data prepare --tokenizer FILE`.
TEST_PACKAGES := chromium slurmctld slurmd slurm-client munge clang libclang-rt-14-dev \
  sqlite3 openssl python3-pandas python3-grpcio python3-protobuf python3-scipy python3-torch \
  sentencepiece
# Only for `make bench`: Debian's PyTorch (same kernels as our LibTorch) as the reference, and
# SentencePiece's own spm_encode (sentencepiece), the reference of bench/data_prepare_bench.py.
BENCH_PACKAGES := python3-torch sentencepiece

# `make install`: ablate, ablate-worker and the default corpus under PREFIX.
PREFIX ?= /usr/local

.PHONY: all deps deps-test deps-bench build build-bin data data-bpe data-bb test demo bench clean install fuzz \
        fuzz-build fuzz-replay fuzz-corpus gpu-bundle gpu-rehearse check-thread-safety \
        check-threads

all: build

define install_missing
	@missing=$$(for p in $(1); do \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; \
	done); \
	if [ -n "$$missing" ]; then \
	  echo "deps: installing" $$missing; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	else echo "deps: all present"; fi
endef

deps:
	$(call install_missing,$(PACKAGES))

deps-test: deps
	$(call install_missing,$(TEST_PACKAGES))

deps-bench: deps
	$(call install_missing,$(BENCH_PACKAGES))

$(BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# Only what `make demo` and `make install` run: the two binaries (the dashboard's web app is
# built into `ablate`), not the tests and benchmarks `make build` compiles: about half of the
# build's steps and CPU time.
BIN_TARGETS := ablate ablate-worker ablate-data
build-bin: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS) --target $(BIN_TARGETS)

# The default corpus: the King James Bible, 4.4 MB of text, not committed.
data: $(DATA_DIR)/kjv.txt
$(DATA_DIR)/kjv.txt:
	@mkdir -p $(DATA_DIR)
	bible -f "Gen1:1-Rev22:21" > $@.tmp && mv $@.tmp $@

# The KJV as a 2,048-entry BPE vocabulary, a verse per document (experiments/small/bpe_gate.yaml).
data-bpe: $(DATA_DIR)/kjv-bpe2k/manifest.json
$(DATA_DIR)/kjv-bpe2k/manifest.json: $(DATA_DIR)/kjv.txt | build-bin
	$(BUILD)/ablate data prepare $< --docs line --tokenizer bpe --vocab-size 2048 \
	  --out $(DATA_DIR)/kjv-bpe2k --force

# Bigram-backcopy from the KJV's byte bigrams, 256-byte sequences (experiments/small/sink_bb.yaml).
data-bb: $(DATA_DIR)/kjv-bb/manifest.json
$(DATA_DIR)/kjv-bb/manifest.json: $(DATA_DIR)/kjv.txt | build-bin
	$(BUILD)/ablate data synth bigram-backcopy --from $< --tokens 8000000 --seq-len 256 \
	  --out $(DATA_DIR)/kjv-bb --force

test: deps-test build data fuzz-replay check-thread-safety
	cd $(BUILD) && ABLATE_DATA_DIR=$(CURDIR)/$(DATA_DIR) ctest --output-on-failure -j 2

# Fuzzing (docs/fuzzing.md): the libFuzzer targets of tests/fuzz/, built with clang, ASan and
# UBSan in $(FUZZ_BUILD) (only the libraries they need). Their inputs: the seeds, the committed
# corpus (tests/fuzz/corpus/TARGET: inputs that found new coverage in past long runs) and every
# past finding (tests/fuzz/regressions/TARGET).
#
# `make fuzz-replay` (part of `make test`) runs every one of those inputs once under the
# sanitizers, and nothing else: the same commit runs the same executions on every clone. It does
# not mutate: libFuzzer's search is not reproducible here even with a fixed -seed and -runs (the
# coverage of one input varies between processes, docs/fuzzing.md), so a search in CI would pass
# or fail by chance.
#
# `make fuzz` is the search: FUZZ_SECONDS per target, FUZZ_JOBS processes each. New inputs collect
# in $(FUZZ_BUILD)/corpus/TARGET (kept between runs); a finding stops it and leaves its input in
# $(FUZZ_BUILD)/findings/TARGET/. `make fuzz-corpus` merges what it found into tests/fuzz/corpus/
# (only inputs that add coverage), for committing, so the next replay starts where it ended.
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 600
FUZZ_JOBS    ?= 1
FUZZ_FLAGS   ?= -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
FUZZ_INPUTS_spec_fuzz  := experiments tests/orchestrator/sweep/bad_specs tests/fuzz/corpus/spec_fuzz \
                          tests/fuzz/regressions/spec_fuzz
FUZZ_INPUTS_query_fuzz := tests/fuzz/corpus/query_fuzz tests/fuzz/regressions/query_fuzz
FUZZ_INPUTS_report_fuzz := tests/fuzz/corpus/report_fuzz tests/fuzz/regressions/report_fuzz
FUZZ_TARGETS ?= spec_fuzz query_fuzz report_fuzz

$(FUZZ_BUILD)/build.ninja: CMakeLists.txt tests/fuzz/CMakeLists.txt
	cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_COMPILER=clang++ -DABLATE_FUZZ=ON

fuzz-build: deps-test $(FUZZ_BUILD)/build.ninja
	cmake --build $(FUZZ_BUILD) -j $(JOBS)

# $(call fuzz_report,TARGET,LOG,STATUS): after a fuzzer ran, its stats when STATUS is 0, else the
# tail of its log and where the input is.
define fuzz_report
	if [ $(3) = 0 ]; then \
	  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added)' $(2); \
	else \
	  tail -n 60 $(2); \
	  echo "fuzz: $(1) found a problem; its input is in $(FUZZ_BUILD)/findings/$(1)/ (or named"; \
	  echo "      above). Fix it and keep the input in tests/fuzz/regressions/$(1)/ (docs/fuzzing.md)."; \
	  exit 1; \
	fi
endef

# $(call replay_fuzzer,TARGET): every input once (-runs=0), nothing written; log TARGET-replay.log.
define replay_fuzzer
	@mkdir -p $(FUZZ_BUILD)/findings/$(1)
	@echo "fuzz-replay: $(1): every seed, corpus and regression input under ASan and UBSan"
	@$(FUZZ_BUILD)/tests/fuzz/$(1) -runs=0 $(FUZZ_FLAGS) \
	    -artifact_prefix=$(FUZZ_BUILD)/findings/$(1)/ \
	    $(FUZZ_INPUTS_$(1)) > $(FUZZ_BUILD)/$(1)-replay.log 2>&1; \
	  ok=$$?; $(call fuzz_report,$(1),$(FUZZ_BUILD)/$(1)-replay.log,$$ok)
endef

fuzz-replay: $(addprefix fuzz-replay-,$(FUZZ_TARGETS))
fuzz-replay-%: fuzz-build
	$(call replay_fuzzer,$*)

# $(call run_fuzzer,TARGET): the search; its log is $(FUZZ_BUILD)/TARGET.log (with FUZZ_JOBS > 1,
# libFuzzer writes one fuzz-N.log per job in the working directory as well: ignored by git).
define run_fuzzer
	@mkdir -p $(FUZZ_BUILD)/corpus/$(1) $(FUZZ_BUILD)/findings/$(1)
	@echo "fuzz: $(1) for $(FUZZ_SECONDS) s, $(FUZZ_JOBS) job(s) (log: $(FUZZ_BUILD)/$(1).log)"
	@$(FUZZ_BUILD)/tests/fuzz/$(1) -max_total_time=$(FUZZ_SECONDS) $(FUZZ_FLAGS) \
	    $(if $(filter-out 1,$(FUZZ_JOBS)),-jobs=$(FUZZ_JOBS) -workers=$(FUZZ_JOBS)) \
	    -dict=tests/fuzz/$(1).dict -artifact_prefix=$(FUZZ_BUILD)/findings/$(1)/ \
	    $(FUZZ_BUILD)/corpus/$(1) $(FUZZ_INPUTS_$(1)) > $(FUZZ_BUILD)/$(1).log 2>&1; \
	  ok=$$?; $(call fuzz_report,$(1),$(FUZZ_BUILD)/$(1).log,$$ok)
endef

fuzz: $(addprefix fuzz-search-,$(FUZZ_TARGETS))
fuzz-search-%: fuzz-build
	$(call run_fuzzer,$*)

# Inputs `make fuzz` found that add coverage to the committed corpus, copied into it.
fuzz-corpus: fuzz-build
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_BUILD)/corpus/$$t; \
	  before=$$(ls tests/fuzz/corpus/$$t | wc -l); \
	  $(FUZZ_BUILD)/tests/fuzz/$$t -merge=1 -rss_limit_mb=2048 -timeout=10 \
	    tests/fuzz/corpus/$$t $(FUZZ_BUILD)/corpus/$$t > $(FUZZ_BUILD)/$$t-merge.log 2>&1 || \
	    { tail -n 30 $(FUZZ_BUILD)/$$t-merge.log; exit 1; }; \
	  echo "fuzz-corpus: $$t: $$before -> $$(ls tests/fuzz/corpus/$$t | wc -l) inputs"; \
	done

# ---- Lock contracts (docs/development.md) -----------------------------------------------------
# `make check-thread-safety` (part of `make test`): clang's thread-safety analysis, as errors, over
# every library that carries ABSL_GUARDED_BY and friends and every test source that does or
# includes a test header that does (directly or through up to two more headers). Compiled in
# $(THREADS_BUILD), not linked.
THREADS_BUILD ?= build-threads
THREAD_SAFETY_LIBS := ablate_store ablate_coordinator ablate_alerts ablate_dashboard ablate_agent ablate_program \
                      ablate_data_tools \
                      ablate_model
THREAD_SAFETY_PATTERN := ABSL_(GUARDED_BY|PT_GUARDED_BY|EXCLUSIVE_LOCKS_REQUIRED|LOCKS_EXCLUDED|ACQUIRED_BEFORE|ACQUIRED_AFTER)

$(THREADS_BUILD)/build.ninja: CMakeLists.txt
	@mkdir -p $(THREADS_BUILD)
	cmake -S . -B $(THREADS_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug \
	  -DCMAKE_CXX_COMPILER=clang++ -DABLATE_THREAD_SAFETY=ON > $(THREADS_BUILD)/cmake.log 2>&1 || \
	  { cat $(THREADS_BUILD)/cmake.log; exit 1; }

check-thread-safety: deps-test $(THREADS_BUILD)/build.ninja
	@echo "check-thread-safety: clang -Wthread-safety over $(THREAD_SAFETY_LIBS) and the tests that lock"
	@cmake --build $(THREADS_BUILD) -j $(JOBS) --target $(THREAD_SAFETY_LIBS) -- -k 0 \
	  > $(THREADS_BUILD)/libs.log 2>&1 || { grep -A4 "error:" $(THREADS_BUILD)/libs.log | head -200; exit 1; }
	@pattern='$(THREAD_SAFETY_PATTERN)'; \
	  for round in 1 2 3; do \
	    headers=$$(grep -rlE "$$pattern" tests --include='*.h' | xargs -r -n1 basename | \
	      sort -u | sed 's/[.]/[.]/g' | paste -sd'|'); \
	    [ -z "$$headers" ] || pattern='$(THREAD_SAFETY_PATTERN)'"|$$headers"; \
	  done; \
	  sources=$$(grep -rlE "$$pattern" tests --include='*.cc'); \
	  objects=$$(for f in $$sources; do ninja -C $(THREADS_BUILD) -t targets all | \
	    grep -oE "^tests/CMakeFiles/[^/]+\.dir/$${f#tests/}\.o" ; done | sort -u); \
	  [ -n "$$objects" ] || { echo "check-thread-safety: no test objects found"; exit 1; }; \
	  ninja -C $(THREADS_BUILD) -j $(JOBS) -k 0 $$objects > $(THREADS_BUILD)/tests.log 2>&1 || \
	    { grep -A4 "error:" $(THREADS_BUILD)/tests.log | head -200; exit 1; }; \
	  echo "check-thread-safety: no lock contract broken ($$(echo $$objects | wc -w) test objects)"

# `make check-threads`: ThreadSanitizer over the store's, scheduler's and coordinator's tests
# ($(TSAN_BUILD), g++ -fsanitize=thread). What it suppresses in uninstrumented system libraries
# is in tests/tsan.supp, each with its reason. Not part of `make test` (docs/development.md says
# how long it takes).
TSAN_BUILD ?= build-tsan
# agent_test is left out: too noisy under TSan (887 reports, 2.5 minutes, 2 of 23 cases failing).
# The ablate-worker processes it starts are a TSan build without tests/tsan/absl_mutex_tsan.cc
# (absl::Mutex invisible: false races on what job_process.cc guards), and the rest is in
# uninstrumented LibTorch/OpenMP, protobuf and gRPC. To try it: TSAN_TESTS="... agent_test".
TSAN_TESTS ?= store_test annotations_test scheduler_test coordinator_test
# Cases too slow under TSan (5-15x) for their own time budgets, a ctest -E regex: 64 workers x
# 10,000 jobs over gRPC (DEADLINE_EXCEEDED on its Submit), and two of the store's query limits
# (10 s, 300 ms) that pass alone under TSan but not beside the coordinator's tests (-j 2).
TSAN_EXCLUDE ?= CoordinatorTest\.SixtyFourWorkersDrainTenThousandJobsExactlyOnce$$|StoreTest\.(AStatementHoldingGigabytesOfValuesIsStoppedAtItsMemoryBudget|NoStringFunctionOutrunsTheTimeLimit)$$
TSAN_OPTIONS_ALL ?= suppressions=$(CURDIR)/tests/tsan.supp halt_on_error=1 second_deadlock_stack=1
$(TSAN_BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(TSAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DABLATE_TSAN=ON

# absl::Mutex is made visible to TSan by tests/tsan/absl_mutex_tsan.cc (linked into the test
# binaries of this build only): without it every ABSL_GUARDED_BY access is a false race.
check-threads: deps-test data $(TSAN_BUILD)/build.ninja
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target $(TSAN_TESTS) \
	  $(if $(filter agent_test,$(TSAN_TESTS)),ablate-worker)
	cd $(TSAN_BUILD) && ABLATE_DATA_DIR=$(CURDIR)/$(DATA_DIR) TSAN_OPTIONS="$(TSAN_OPTIONS_ALL)" \
	  ctest --output-on-failure -j 2 -L '^($(shell echo $(TSAN_TESTS) | tr ' ' '|'))$$' \
	  $(if $(TSAN_EXCLUDE),-E '$(TSAN_EXCLUDE)')

# The demo: a coordinator, 2 local workers and the dashboard (`ablate up`), the quick sweep
# submitted and watched to the end, its comparison table. The coordinator stays up afterwards so
# the dashboard can be browsed; the last lines say how to stop it.
DEMO_DIR ?= $(BUILD)/demo
DEMO_DASHBOARD_PORT ?= 8080
demo: build-bin data
	@if [ -f $(DEMO_DIR)/up.pid ]; then kill $$(cat $(DEMO_DIR)/up.pid) 2>/dev/null; sleep 2; fi
	@rm -rf $(DEMO_DIR) && mkdir -p $(DEMO_DIR)
	@echo "== the quick sweep: every run, its parameters and how its budget was matched =="
	$(BUILD)/ablate expand experiments/quick.yaml
	@echo "== ablate up --workers 2 (log: $(DEMO_DIR)/up.log) =="
	@ABLATE_DATA_DIR=$(CURDIR)/$(DATA_DIR) nohup $(BUILD)/ablate up --workers 2 --port 0 \
	  --dashboard-port $(DEMO_DASHBOARD_PORT) --state-dir $(DEMO_DIR) > $(DEMO_DIR)/up.log 2>&1 & \
	  echo $$! > $(DEMO_DIR)/up.pid
	@for i in $$(seq 150); do [ -s $(DEMO_DIR)/address ] && break; sleep 0.2; done; \
	  [ -s $(DEMO_DIR)/address ] || { cat $(DEMO_DIR)/up.log; exit 1; }
	@# exit 3: some run DIVERGED, a result the table shows; 4 (a run FAILED) stops the demo
	$(BUILD)/ablate submit experiments/quick.yaml --watch --state-dir $(DEMO_DIR) || [ $$? -eq 3 ]
	$(BUILD)/ablate table quick --state-dir $(DEMO_DIR)
	@echo; grep -h "dashboard" $(DEMO_DIR)/up.log || true
	@echo "the coordinator and dashboard keep running; stop them with: kill $$(cat $(DEMO_DIR)/up.pid)"

# The training grid's full default (3 rounds) takes hours on 2 cores: `make bench` runs one
# round (BENCH_TRAIN_ARGS= for all of it).
BENCH_TRAIN_ARGS ?= --quick
bench: deps-bench build data
	$(BUILD)/bench_model_step
	$(BUILD)/bench_gate_pass
	$(BUILD)/bench_eval_cost
	/usr/bin/python3 bench/train_throughput.py --build $(BUILD) $(BENCH_TRAIN_ARGS)
	$(BUILD)/bench_store
	$(BUILD)/bench_scheduler
	$(BUILD)/bench_query_isolation
	$(BUILD)/bench_program $(if $(NANOGPT_DIR),--nanogpt $(NANOGPT_DIR))
	/usr/bin/python3 bench/data_prepare_bench.py --build $(BUILD) --corpus $(DATA_DIR)/kjv.txt

# The binaries and the default corpus, where `ablate up` and the workers find them from any
# directory: PREFIX/bin/ablate, PREFIX/bin/ablate-worker, PREFIX/share/ablate/kjv.txt.
install: build-bin data
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/ablate
	install -m 0755 $(BUILD)/ablate $(BUILD)/ablate-worker $(BUILD)/ablate-data $(DESTDIR)$(PREFIX)/bin/
	install -m 0644 $(DATA_DIR)/kjv.txt $(DESTDIR)$(PREFIX)/share/ablate/kjv.txt
	install -d $(DESTDIR)$(PREFIX)/lib/ablate/python
	install -m 0644 python/ablate_report.py $(DESTDIR)$(PREFIX)/lib/ablate/python/
	@echo "install: ablate, ablate-worker and ablate-data in $(DESTDIR)$(PREFIX)/bin, the default corpus in \
	$(DESTDIR)$(PREFIX)/share/ablate, the program helper (ablate_report.py) in \
	$(DESTDIR)$(PREFIX)/lib/ablate/python (ablate-worker puts it on its programs' PYTHONPATH)"

clean:
	rm -rf $(BUILD)

# ---- The GPU device machine (docs/gpu.md) ------------------------------------------------------
# That machine has PyTorch 2.x with CUDA (its LibTorch), nvcc, CMake and ninja, but no Debian
# packages and no network. `make gpu-bundle` downloads the Debian packages the build needs beside
# LibTorch (the libraries of PACKAGES, their headers, protoc and the gRPC plugin, and the runtime
# libraries they load that a CUDA image may lack) into $(GPU_BUNDLE), with the web app's uPlot
# files (the device has no npm), for bench/gpu/run_device_checks.sh to unpack there (dpkg -x into
# a prefix, never into /). Left out: the C/C++ toolchain and its runtime (libc6, libstdc++6), which
# the device's compiler brings, and Debian's LibTorch and Gloo (the device's PyTorch has its own).
GPU_BUNDLE ?= .gpu-bundle
GPU_BUNDLE_PACKAGES := libgrpc++-dev libgrpc-dev libgrpc++1.51 libgrpc29 protobuf-compiler-grpc \
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 libprotoc32 protobuf-compiler \
  libabsl-dev libabsl20220623 libc-ares-dev libc-ares2 libre2-dev libre2-9 zlib1g-dev zlib1g \
  libssl-dev libssl3 libsqlite3-dev libsqlite3-0 libyaml-cpp-dev libyaml-cpp0.7 libfmt-dev libfmt9 \
  libboost1.74-dev libboost-dev nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev \
  libbenchmark-dev libbenchmark1debian pkgconf pkgconf-bin libpkgconf3
gpu-bundle:
	@test -f dashboard/node_modules/uplot/dist/uPlot.min.css || (cd dashboard && npm ci --no-audit --no-fund --loglevel=error)
	rm -rf $(GPU_BUNDLE) && mkdir -p $(GPU_BUNDLE)/debs $(GPU_BUNDLE)/uplot
	$(SUDO) apt-get update -qq
	cd $(GPU_BUNDLE)/debs && apt-get download -qq $(GPU_BUNDLE_PACKAGES) 2>&1 | grep -v "unsandboxed" || true
	@test $$(ls $(GPU_BUNDLE)/debs/*.deb | wc -l) -eq $(words $(GPU_BUNDLE_PACKAGES)) || \
	  { echo "gpu-bundle: expected $(words $(GPU_BUNDLE_PACKAGES)) packages"; exit 1; }
	cp dashboard/node_modules/uplot/dist/uPlot.iife.min.js dashboard/node_modules/uplot/dist/uPlot.min.css \
	  $(GPU_BUNDLE)/uplot/
	@echo "gpu-bundle: $$(ls $(GPU_BUNDLE)/debs | wc -l) packages, $$(du -sh $(GPU_BUNDLE) | cut -f1) in $(GPU_BUNDLE)/"

# The device script's rehearsal on this machine (CPU): the bundle unpacked into a prefix, the
# project configured and built against that prefix instead of the system's packages (LibTorch
# from Debian here), then every step of the script on the CPU with tiny shapes. Builds with
# JOBS (default: all cores); the report goes to $(GPU_REHEARSE_OUT).
GPU_REHEARSE_OUT ?= $(BUILD)-gpu-rehearse/out
gpu-rehearse: data
	@test -d $(GPU_BUNDLE)/debs || { echo "gpu-rehearse: run make gpu-bundle first"; exit 1; }
	mkdir -p $(GPU_REHEARSE_OUT)
	OUT=$(GPU_REHEARSE_OUT) JOBS=$(JOBS) bench/gpu/run_device_checks.sh --cpu-dry-run \
	  --build $(BUILD)-gpu-rehearse --prefix /tmp/ablate-gpu-prefix
