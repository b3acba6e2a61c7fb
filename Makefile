# ablate: the two commands that matter are `make demo` and `make test`.
# Every target installs what it needs first (`make deps`, idempotent, Debian 12).

BUILD    ?= build
JOBS     ?= $(shell nproc)
DATA_DIR ?= data
SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# Debian packages the project builds, tests and runs with.
PACKAGES := cmake ninja-build g++ pkg-config \
  libtorch-dev libopenblas0-openmp \
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
  libsqlite3-dev sqlite3 libfmt-dev libboost-dev libyaml-cpp-dev nlohmann-json3-dev \
  libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev \
  bible-kjv \
  nodejs chromium
# nodejs brings npm here (the machine's Node.js); the build runs `npm ci` in dashboard/ (uPlot,
# playwright-core), and the browser test drives Debian's chromium, never a downloaded one.
# Only for `make bench`: Debian's PyTorch (same kernels as our LibTorch) as the reference.
BENCH_PACKAGES := python3-torch

.PHONY: all deps deps-bench build data test test-all demo bench clean

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

deps-bench: deps
	$(call install_missing,$(BENCH_PACKAGES))

$(BUILD)/build.ninja: CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# The default corpus: the King James Bible, 4.4 MB of text, not committed.
data: $(DATA_DIR)/kjv.txt
$(DATA_DIR)/kjv.txt:
	@mkdir -p $(DATA_DIR)
	bible -f "Gen1:1-Rev22:21" > $@.tmp && mv $@.tmp $@

test: build data
	cd $(BUILD) && ABLATE_DATA_DIR=$(CURDIR)/$(DATA_DIR) ctest --output-on-failure -j 2

demo: build data
	@echo "== ablate demo: model tests (the coordinator and the quick sweep are not built yet) =="
	$(BUILD)/model_test --gtest_brief=1
	$(BUILD)/bench_model_step --rounds 3 --batch 8 --seq 128

bench: deps-bench build data
	$(BUILD)/bench_model_step

clean:
	rm -rf $(BUILD)
