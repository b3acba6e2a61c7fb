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

# The demo: a coordinator, 2 local workers and the dashboard (`ablate up`), the quick sweep
# submitted and watched to the end, its comparison table. The coordinator stays up afterwards so
# the dashboard can be browsed; the last lines say how to stop it.
DEMO_DIR ?= $(BUILD)/demo
DEMO_DASHBOARD_PORT ?= 8080
demo: build data
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
	$(BUILD)/ablate submit experiments/quick.yaml --watch --state-dir $(DEMO_DIR)
	$(BUILD)/ablate table quick --state-dir $(DEMO_DIR)
	@echo; grep -h "dashboard" $(DEMO_DIR)/up.log || true
	@echo "the coordinator and dashboard keep running; stop them with: kill $$(cat $(DEMO_DIR)/up.pid)"

bench: deps-bench build data
	$(BUILD)/bench_model_step
	/usr/bin/python3 bench/train_throughput.py --build $(BUILD)
	$(BUILD)/bench_store

clean:
	rm -rf $(BUILD)
