#!/usr/bin/env bash
# Every GPU check of ablate in one run, for the lent device machine (docs/gpu.md): PyTorch 2.x
# with CUDA, nvcc, CMake and ninja there, but no Debian packages and no network.
#
#   bench/gpu/run_device_checks.sh                  # on the device: the report goes to $OUT
#   bench/gpu/run_device_checks.sh --cpu-dry-run    # here, on the CPU: `make gpu-rehearse`
#
# Steps, each timed and logged with a timestamp; a failing step is recorded and the next runs,
# so one run yields everything it can:
#   env       the machine: GPU, driver, PyTorch, compilers
#   unpack    the Debian packages of `make gpu-bundle` (.gpu-bundle/debs) into a prefix with
#             `dpkg -x` (never into /), absolute symlinks pointed into the prefix
#   libcheck  the carried libraries load here: ldd of each, and a tiny program linked against
#             gRPC, protobuf, SQLite, yaml-cpp and fmt from the prefix, run
#   configure CMake against the device's LibTorch (torch.utils.cmake_prefix_path) and the prefix
#   build     ninja -j$JOBS: ablate, ablate-worker, torch_compat_test, gpu_parity_test, bench_gpu
#   program   a `program:` sweep of experiments/programs/gated_gpt.py (baseline vs G1, budget by
#             count:) on the device's PyTorch through `ablate serve` and one `ablate-worker
#             --device cuda:0`, then the baseline bare: its wall time under ablate against bare.
#             Needs only ablate and ablate-worker: this build's (built even when another target
#             fails), else carried ones (build/) whose libraries all load here
#   compat    tests/gpu/torch_compat_test: the version shims on the device's LibTorch
#   parity    tests/gpu/gpu_parity_test: every variant on CUDA (fp32 and bf16 autocast) vs the CPU
#   sweep     `ablate serve` + two `ablate-worker --device cuda:0`: a three-variant sweep to
#             SUCCEEDED
#   bench     bench_gpu: training tokens/s and MFU at three shapes against a bf16 matmul, each
#             with its peak of device memory and its memory plan
#   peer      bench/peer_nanogpt.py, the nanoGPT-architecture peer on the device's PyTorch, eager,
#             then torch.compile'd if time remains, at two of the shapes (when the tree has it)
#   memory    the bench lines' max_memory_allocated against the memory plan, as ratios
#   bf16      if time remains: train.precision BF16 (Megatron-LM's) at the first shape, against
#             autocast's line: tokens/s and the residual stream's dtype
#   nccl      if time remains: a 2-rank data-parallel run on the one GPU through NCCL, then the
#             same through Gloo (ABLATE_DIST_BACKEND=gloo), then through Gloo with ZeRO-2 and the
#             loss in chunks, its final loss against the plain run's
#   sink      if time remains: the attention-sink contrast, a ~14M model, baseline vs G1
#
# --cpu-dry-run runs every step against the CPU: Debian's LibTorch 1.13 instead of the device's
# (the host has no 2.x), JOBS cores (make gpu-rehearse passes them), tiny shapes; the parity test
# then skips every case, which the step checks. Budget: BUDGET_S seconds (default 400; 3600 for
# --cpu-dry-run, whose first build at -j1 is long): the optional steps (peer-compile, sink) run
# only while enough of it is left, and no step runs past BUDGET_S + 120 seconds from the start.
#
# Report in $OUT (at most 8 files): summary.md (every step, its status and seconds, the key
# numbers), log.txt (everything, timestamped), env.txt, build.log, parity.txt, bench.jsonl,
# sweeps.md.
set -u -o pipefail

usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

MODE=device
BUILD=build-gpu
PREFIX=/tmp/ablate-gpu-prefix
BUNDLE=.gpu-bundle
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-dry-run) MODE=dry ;;
    --build) BUILD=$2; shift ;;
    --prefix) PREFIX=$2; shift ;;
    --bundle) BUNDLE=$2; shift ;;
    --budget) BUDGET_S=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_device_checks.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done

# The device's budget by default; a rehearsal's first build at -j1 takes far longer than any
# device step, so it gets an hour.
if [ -z "${BUDGET_S:-}" ]; then BUDGET_S=$([ "$MODE" = dry ] && echo 3600 || echo 400); fi
BUILD_LIMIT_S=$([ "$MODE" = dry ] && echo "$BUDGET_S" || echo 420)

cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
# The Python with torch: the device's python3; here, when the first python3 on PATH has none
# (a pyenv shim, say), Debian's /usr/bin/python3 with python3-torch (make deps-bench).
export PY=python3
for candidate in python3 /usr/bin/python3; do
  if env -u LD_LIBRARY_PATH "$candidate" -c 'import torch' 2>/dev/null; then PY=$candidate; break; fi
done
OUT=${OUT:-$ROOT/$BUILD/out}
mkdir -p "$OUT" "$BUILD" || exit 2
JOBS=${JOBS:-$(nproc)}
WORK=$(mktemp -d /tmp/ablate-gpu-checks.XXXXXX)
START=$(date +%s)
HARD_S=$(( BUDGET_S + 120 ))
LOG=$OUT/log.txt
SUMMARY=$OUT/summary.md
for f in summary.md log.txt env.txt build.log parity.txt bench.jsonl sweeps.md; do : > "$OUT/$f"; done
STATUS=()   # "name|PASS/FAIL/SKIP|seconds|note"
PIDS=()     # background processes this script started

elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET_S - $(elapsed) )); }
log() { printf '%s +%4ss %s\n' "$(date -u +%H:%M:%S)" "$(elapsed)" "$*" | tee -a "$LOG"; }
record() { STATUS+=("$1|$2|$3|$4"); log "== $1: $2 (${3}s) $4"; }

# run_step NAME TIMEOUT_S FILE COMMAND...: COMMAND's output goes to FILE and to the log, each line
# timestamped; the step passes when COMMAND exits 0 within TIMEOUT_S.
# A step may be a function of this script: it runs in a child bash (so that timeout can stop it),
# which sees the functions and the exported variables, and changes nothing here. No step runs past
# HARD_S seconds from the start (BUDGET_S + 120, under the device tool's 600 s).
run_step() {
  local name=$1 limit=$2 file=$3; shift 3
  local t0 rc
  t0=$(date +%s)
  local cap=$(( HARD_S - $(elapsed) ))
  [ "$cap" -lt 30 ] && cap=30
  [ "$limit" -gt "$cap" ] && limit=$cap
  log "== $name: start (limit ${limit}s): $*"
  if declare -F "$1" > /dev/null; then
    export -f $(compgen -A function)
    set -- bash -c '"$@"' run_step "$@"
  fi
  timeout --kill-after=10 "$limit" "$@" 2>&1 |
    while IFS= read -r line; do
      printf '%s +%4ss [%s] %s\n' "$(date -u +%H:%M:%S)" "$(elapsed)" "$name" "$line" >> "$LOG"
      [ "$file" = - ] || printf '%s\n' "$line" >> "$file"
    done
  rc=${PIPESTATUS[0]}
  local took=$(( $(date +%s) - t0 ))
  if [ "$rc" = 0 ]; then record "$name" PASS "$took" ""
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then record "$name" FAIL "$took" "timed out after ${limit}s"
  else record "$name" FAIL "$took" "exit $rc"
  fi
  return "$rc"
}
skip() { record "$1" SKIP 0 "$2"; }
passed() { local s; for s in "${STATUS[@]}"; do [[ $s == "$1|PASS|"* ]] && return 0; done; return 1; }

cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  sleep 1
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT

if [ "$MODE" = dry ]; then
  DEVICE=cpu; KIND=cpu; PRECISION=fp32
else
  DEVICE=cuda:0; KIND=cuda; PRECISION=bf16_autocast
  [ -x /usr/local/cuda/bin/nvcc ] && export PATH=$PATH:/usr/local/cuda/bin
fi
STATE=$WORK/state
COORDINATOR=down
export MODE BUILD PREFIX BUNDLE BUDGET_S ROOT OUT JOBS WORK START HARD_S LOG DEVICE KIND PRECISION STATE
log "run_device_checks.sh: mode $MODE, device $DEVICE, build $BUILD, prefix $PREFIX, jobs $JOBS, budget ${BUDGET_S}s, report $OUT"

# ---- env ----------------------------------------------------------------------------------------
step_env() {
  echo "## uname"; uname -a
  echo "## os"; grep PRETTY_NAME /etc/os-release
  echo "## cpus"; nproc
  echo "## nvidia-smi"; nvidia-smi 2>&1 | head -20 || true
  echo "## python3 / torch"
  "$PY" -c 'import sys, torch; print(sys.executable, torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")' 2>&1 || true
  echo "## compilers"; c++ --version | head -1; nvcc --version 2>&1 | tail -2 || true
  cmake --version | head -1; ninja --version
  echo "## glibc"; ldd --version | head -1
}
run_step env 60 "$OUT/env.txt" step_env

# ---- unpack -------------------------------------------------------------------------------------
step_unpack() {
  ls "$BUNDLE"/debs/*.deb > /dev/null || { echo "no $BUNDLE/debs/*.deb: run make gpu-bundle here and carry $BUNDLE"; return 1; }
  rm -rf "$PREFIX" && mkdir -p "$PREFIX" || return 1
  local n
  n=$(ls "$BUNDLE"/debs/*.deb | wc -l)
  printf '%s\0' "$BUNDLE"/debs/*.deb | xargs -0 -P "$JOBS" -I{} dpkg -x {} "$PREFIX" || return 1
  # Debian's -dev packages point some .so links at /lib/...: into the prefix instead.
  local link target
  while IFS= read -r link; do
    target=$(readlink "$link")
    case "$target" in
      /*) if [ -e "$PREFIX$target" ]; then ln -sfn "$PREFIX$target" "$link"; echo "relinked $link -> $PREFIX$target"; fi ;;
    esac
  done < <(find "$PREFIX" -type l)
  # The web app's uPlot, vendored by npm here: the device has no npm (configure sets it to true).
  mkdir -p dashboard/node_modules/uplot/dist && cp "$BUNDLE"/uplot/* dashboard/node_modules/uplot/dist/ || return 1
  echo "unpacked $n packages into $PREFIX ($(du -sh "$PREFIX" | cut -f1))"
}
run_step unpack 120 - step_unpack
LIBDIRS=$PREFIX/usr/lib/x86_64-linux-gnu:$PREFIX/lib/x86_64-linux-gnu
export PATH=$PREFIX/usr/bin:$PATH
export LD_LIBRARY_PATH=$LIBDIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# ---- libcheck -----------------------------------------------------------------------------------
step_libcheck() {
  local lib bad=0
  for lib in "$PREFIX"/usr/lib/x86_64-linux-gnu/lib{grpc++,grpc,protobuf,absl_base,yaml-cpp,fmt,sqlite3,ssl,crypto,cares,re2,benchmark}.so \
             "$PREFIX"/usr/lib/x86_64-linux-gnu/libprotoc.so.32 "$PREFIX"/usr/bin/grpc_cpp_plugin; do
    [ -e "$lib" ] || { echo "missing: $lib"; bad=1; continue; }
    if ldd "$lib" | grep -q "not found"; then echo "$lib:"; ldd "$lib" | grep "not found"; bad=1; fi
  done
  "$PREFIX"/usr/bin/protoc --version || bad=1
  cat > "$WORK/link_test.cc" <<'EOF'
#include <fmt/core.h>
#include <google/protobuf/stubs/common.h>
#include <grpcpp/grpcpp.h>
#include <sqlite3.h>
#include <yaml-cpp/yaml.h>
int main() {
  fmt::print("grpc {} protobuf {} sqlite {} yaml {}\n", grpc::Version(),
             google::protobuf::internal::VersionString(GOOGLE_PROTOBUF_VERSION),
             sqlite3_libversion(), YAML::Load("a: 1")["a"].as<int>());
}
EOF
  c++ -std=c++17 -O0 -I"$PREFIX/usr/include" "$WORK/link_test.cc" -o "$WORK/link_test" \
      -L"$PREFIX/usr/lib/x86_64-linux-gnu" -lgrpc++ -lgrpc -lgpr -lprotobuf -lsqlite3 -lyaml-cpp -lfmt \
      && "$WORK/link_test" || bad=1
  if [ "$bad" != 0 ]; then
    echo "FALLBACK: the Debian 12 libraries carried in $BUNDLE do not all load on this machine"
    echo "  (lines above). The build below will likely fail the same way; what would help: build"
    echo "  the missing ones from source on the device, or carry their Debian runtime packages too"
    echo "  (add them to GPU_BUNDLE_PACKAGES in the Makefile)."
  fi
  return "$bad"
}
run_step libcheck 120 - step_libcheck

# ---- configure ----------------------------------------------------------------------------------
if [ "$MODE" = dry ]; then
  TORCH_CMAKE=/usr/lib/x86_64-linux-gnu/cmake   # Debian's LibTorch 1.13: no 2.x here
  TORCH_INC=/usr/include
else
  TORCH_CMAKE=$(env -u LD_LIBRARY_PATH "$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>>"$LOG")
  TORCH_INC=$(dirname "$(dirname "$TORCH_CMAKE")")/include
fi
export TORCH_CMAKE TORCH_INC
log "LibTorch: cmake prefix $TORCH_CMAKE, headers $TORCH_INC"
CXX_STD=17
if grep -rqs "C++20 or later compatible compiler is required" "$TORCH_INC/c10/macros" "$TORCH_INC/c10/util"; then
  CXX_STD=20   # PyTorch 2.12+ requires C++20 of the code that includes its headers
fi
export CXX_STD
step_configure() {
  [ -e "$TORCH_INC/gloo/algorithm.h" ] || echo "warning: no Gloo headers under $TORCH_INC/gloo (worker/train/collective.cc needs them)"
  local cuda_args=()
  if [ "$MODE" = device ] && command -v nvcc > /dev/null; then
    cuda_args=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)" -DCMAKE_CUDA_ARCHITECTURES=90 -DTORCH_CUDA_ARCH_LIST=9.0)
    # The wheel's NCCL header (its nvidia-nccl package), for ProcessGroupNCCL (docs/gpu.md).
    local nccl
    nccl=$(env -u LD_LIBRARY_PATH "$PY" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null)
    [ -n "$nccl" ] && cuda_args+=(-DNCCL_ROOT="$nccl")
  fi
  local args=(-S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=$CXX_STD
    "-DCMAKE_PREFIX_PATH=$PREFIX/usr;$PREFIX/usr/lib/x86_64-linux-gnu/cmake;$TORCH_CMAKE"
    -DProtobuf_PROTOC_EXECUTABLE="$PREFIX/usr/bin/protoc" -DNPM_EXECUTABLE=/bin/true)
  if ! cmake "${args[@]}" "${cuda_args[@]}"; then
    [ ${#cuda_args[@]} -gt 0 ] || return 1
    echo "configure failed with ${cuda_args[*]}: once more without them, from a fresh cache"
    rm -f "$BUILD/CMakeCache.txt"
    cmake "${args[@]}" || return 1
  fi
  # Every package the bundle carries must resolve into the prefix, never to the system's copy.
  local leaks
  leaks=$(grep -E '^(Protobuf|gRPC|absl|yaml-cpp|fmt|SQLite3|OPENSSL|Boost|boost_headers|GTest|benchmark|nlohmann_json|CLI11|c-ares|ZLIB)[A-Za-z_]*:(PATH|FILEPATH)=/' "$BUILD/CMakeCache.txt" | grep -v "=$PREFIX" | grep -v NOTFOUND)
  if [ -n "$leaks" ]; then echo "resolved outside $PREFIX:"; echo "$leaks"; return 1; fi
  echo "every carried package resolved into $PREFIX (C++$CXX_STD)"
}
run_step configure 180 "$OUT/build.log" step_configure

# ---- build --------------------------------------------------------------------------------------
TARGETS=(ablate ablate-worker torch_compat_test gpu_parity_test bench_gpu)
if passed configure; then
  # -k 0: past a failing compile, build every target that does not need it.
  run_step build "$BUILD_LIMIT_S" "$OUT/build.log" ninja -C "$BUILD" -j "$JOBS" -k 0 "${TARGETS[@]}"
  # Whatever the binaries load from outside the prefix (the device's own libraries), and any
  # that load from nowhere.
  for b in ablate ablate-worker; do
    [ -x "$BUILD/$b" ] && { echo "## ldd $b"; ldd "$BUILD/$b" | grep -v "$PREFIX"; } >> "$OUT/env.txt"
  done
else
  skip build "configure failed"
fi

# ---- program: the example PyTorch program as a sweep, no LibTorch needed ------------------------
step_program() {  # BIN_DIR
  local bin=$1 dir=$WORK/program state=$WORK/program-state steps pdev dtype params
  if [ "$MODE" = dry ]; then
    steps=20; pdev=cpu; dtype=float32
    params="n_layer: 2, n_head: 4, n_embd: 64, ffn_hidden: 256, block_size: 64, batch_size: 8, threads: 1"
  else
    steps=300; pdev=cuda; dtype=bfloat16
    params="n_layer: 4, n_head: 8, n_embd: 256, ffn_hidden: 1024, block_size: 256, batch_size: 32"
  fi
  params="$params, max_iters: $steps, eval_every: $((steps / 2)), ckpt_every: $((steps / 2)), lr: 1.0e-3, device: $pdev, dtype: $dtype"
  mkdir -p "$dir" "$state" || return 1
  # The program runs on the device's own Python, none of the carried libraries on its path.
  {
    echo "sweep: gpu_program"
    echo "program:"
    echo "  dir: $ROOT/experiments/programs"
    echo "  code: [\"gated_gpt.py\"]"
    echo "  command: env -u LD_LIBRARY_PATH $PY gated_gpt.py {args}"
    echo "  args: dashdash"
    echo "  steps: max_iters"
    echo "  seed: seed"
    echo "  count: env -u LD_LIBRARY_PATH $PY gated_gpt.py --count"
    echo "  capabilities: [pause, rollback]"
    echo "base:"
    echo "  params: {$params}"
    echo "budget: {match: params.ffn_hidden, reference: baseline}"
    echo "variants:"
    echo "  - {name: baseline}"
    echo "  - {name: g1, params: {gate: g1}}"
    echo "seeds: [0]"
    echo "resources: {device: $KIND}"
  } > "$dir/program.yaml"
  cat "$dir/program.yaml"
  "$bin/ablate" serve --port 0 --dashboard-port 0 --state-dir "$state" >> "$WORK/program-serve.log" 2>&1 &
  local serve=$! i
  for i in $(seq 100); do [ -s "$state/address" ] && break; sleep 0.2; done
  [ -s "$state/address" ] || { cat "$WORK/program-serve.log"; kill "$serve"; return 1; }
  "$bin/ablate-worker" --coordinator "$(cat "$state/address")" --token-file "$state/worker-token" \
    --device "$DEVICE" --name program-worker >> "$WORK/program-worker.log" 2>&1 &
  local worker=$! t0 rc=0 swept ok under bare args
  t0=$(date +%s)
  "$bin/ablate" submit "$dir/program.yaml" --watch --state-dir "$state" || rc=1
  swept=$(( $(date +%s) - t0 ))
  { echo "## gpu_program: gated_gpt.py as a program on $DEVICE (${swept}s for the sweep)"; echo
    "$bin/ablate" table gpu_program --state-dir "$state"; echo
    "$bin/ablate" query "SELECT run_id, variant, state, steps_done, params_total, wall_s, tokens_per_s FROM run_summary WHERE sweep = 'gpu_program' ORDER BY run_id" --state-dir "$state"
    echo; } | tee -a "$OUT/sweeps.md"
  ok=$("$bin/ablate" query "SELECT state FROM run_summary WHERE sweep = 'gpu_program'" --state-dir "$state" | grep -c SUCCEEDED)
  echo "gpu_program: $ok of 2 runs SUCCEEDED"
  [ "$ok" = 2 ] || rc=1
  # The baseline once more, bare: the same argv the worker gave it (its log's first lines name
  # it), the helper on the path, timed from start to exit as the worker times a run.
  under=$("$bin/ablate" query "SELECT wall_s FROM run_summary WHERE sweep = 'gpu_program' AND variant = 'baseline'" --state-dir "$state" --format csv | tail -1)
  args=$(env -u LD_LIBRARY_PATH "$PY" - "$state" <<'PY'
import json, sqlite3, sys
db = sqlite3.connect(f"file:{sys.argv[1]}/ablate.db?mode=ro", uri=True)
row = db.execute("SELECT c.config_json FROM run_configs c JOIN run_summary r USING (run_id) "
                 "WHERE r.sweep = 'gpu_program' AND r.variant = 'baseline'").fetchone()
for p in json.loads(row[0])["program"]["params"]:
    v = json.loads(p["json"])
    print(f"--{p['name']}={v!r}" if not isinstance(v, str) else f"--{p['name']}={v}")
PY
)
  echo "bare: $PY gated_gpt.py" $args
  t0=$(date +%s%N)
  (cd experiments/programs && env -u LD_LIBRARY_PATH PYTHONPATH="$ROOT/python" \
     ABLATE_CHECKPOINT_DIR="$dir/bare" ABLATE_DEFAULT_CORPUS="$ROOT/data/kjv.txt" \
     "$PY" gated_gpt.py $args > "$WORK/program-bare.log" 2>&1) || { tail -20 "$WORK/program-bare.log"; rc=1; }
  bare=$(( ($(date +%s%N) - t0) / 1000000 ))
  awk -v u="$under" -v b="$bare" 'BEGIN { printf "baseline: %.2fs as a program run, %.2fs bare: ratio %.3f (target <= 1.05)\n", u, b / 1000, u / (b / 1000) }' | tee -a "$OUT/sweeps.md"
  kill "$serve" "$worker" 2>/dev/null
  return $rc
}
# This build's binaries, else carried ones (build/) whose every library loads here: a CPU
# build's ablate-worker links Debian's LibTorch, which a device machine does not have.
loads() { [ -x "$1" ] && ! ldd "$1" 2>&1 | grep -q "not found"; }
PROGRAM_BIN=
for b in "$BUILD" "$ROOT/build"; do
  if loads "$b/ablate" && loads "$b/ablate-worker"; then PROGRAM_BIN=$b; break; fi
done
if [ -n "$PROGRAM_BIN" ]; then
  log "program: ablate and ablate-worker from $PROGRAM_BIN"
  run_step program 150 - step_program "$PROGRAM_BIN"
else
  skip program "no ablate and ablate-worker that load here: neither built nor carried (build/)"
fi

# ---- compat: the version shims on this LibTorch (the autocast API of 2.4+ here) ------------------
if [ -x "$BUILD/torch_compat_test" ]; then run_step compat 60 "$OUT/parity.txt" "$BUILD/torch_compat_test" --gtest_color=no
else skip compat "torch_compat_test was not built"; fi

# ---- parity -------------------------------------------------------------------------------------
step_parity() {
  "$BUILD/gpu_parity_test" --gtest_color=no > "$WORK/parity.txt" 2>&1
  local rc=$?
  cat "$WORK/parity.txt"
  if [ "$MODE" = dry ]; then  # without CUDA every case must skip, saying why, and none pass
    grep -q "no CUDA device" "$WORK/parity.txt" || { echo "dry run: expected every case skipped"; return 1; }
    if grep -q "^\[       OK \]" "$WORK/parity.txt"; then echo "dry run: a case passed without CUDA"; return 1; fi
    echo "dry run: every case skipped without CUDA, as it must"
  fi
  return $rc
}
if [ -x "$BUILD/gpu_parity_test" ]; then run_step parity 240 "$OUT/parity.txt" step_parity
else skip parity "gpu_parity_test was not built"; fi

# ---- peer ---------------------------------------------------------------------------------------
# bench/peer_nanogpt.py (flags --device, --compile, --d-model, --layers, --head-dim, --seq-len,
# --batch; one JSON line last) comes from the speed branch; it is run as it is, with the shape
# flags its --help lists.
step_peer() {
  local compile=$1 help args=() shape d layers head_dim seq batch
  help=$(env -u LD_LIBRARY_PATH "$PY" bench/peer_nanogpt.py --help 2>&1) || { echo "$help"; return 1; }
  # bench_gpu's first two shapes: d_model, layers, head dim, tokens, batch.
  for shape in "768 12 64 1024 16" "1024 12 64 1024 16"; do
    read -r d layers head_dim seq batch <<< "$shape"
    [ "$MODE" = dry ] && { d=64; layers=2; head_dim=16; seq=64; batch=4; }
    args=(--device "$([ "$MODE" = dry ] && echo cpu || echo cuda)")
    [ "$compile" = 1 ] && args+=(--compile)
    grep -q -- "--d-model" <<< "$help" && args+=(--d-model "$d")
    grep -q -- "--layers" <<< "$help" && args+=(--layers "$layers")
    grep -q -- "--head-dim" <<< "$help" && args+=(--head-dim "$head_dim")
    grep -q -- "--seq-len" <<< "$help" && args+=(--seq-len "$seq")
    grep -q -- "--batch" <<< "$help" && args+=(--batch "$batch")
    echo "$PY bench/peer_nanogpt.py ${args[*]}"
    env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 "$PY" bench/peer_nanogpt.py "${args[@]}" || return 1
    [ "$MODE" = dry ] && break
  done
}
# ---- sweep: ablate serve + two ablate-worker --device cuda:0 -------------------------------------
export ABLATE_DATA_DIR=$ROOT/data
write_spec() {  # NAME STEPS D_MODEL LAYERS HEADS SEQ BATCH VARIANTS... -> $WORK/NAME.yaml
  local name=$1 steps=$2 d=$3 layers=$4 heads=$5 seq=$6 batch=$7; shift 7
  {
    echo "sweep: $name"
    echo "base:"
    echo "  model: {d_model: $d, num_layers: $layers, num_heads: $heads, num_kv_heads: $heads,"
    echo "          head_dim: $((d / heads)), ffn_dim: $((4 * d)), max_seq_len: $seq}"
    echo "  train:"
    echo "    steps: $steps"
    echo "    batch_size: $batch"
    echo "    seq_len: $seq"
    echo "    device: $DEVICE"
    echo "    precision: $PRECISION"
    [ "$MODE" = dry ] && echo "    threads: 1"   # a rehearsal on a shared CPU
    echo "    optimizer: {lr: 1e-3, warmup_steps: $((steps / 10))}"
    echo "    eval_every: $((steps / 2))"
    echo "    eval_batches: 4"
    echo "    checkpoint_every: $((steps / 2))"
    echo "    data: {bos_token: 2}"
    echo "variants:"
    local v; for v in "$@"; do echo "  - $v"; done
    echo "budget: {match: ffn, reference: baseline, tolerance: 0.01}"
    echo "seeds: [0]"
    echo "resources: {device: $KIND}"
  } > "$WORK/$name.yaml"
}
step_sweep() {  # NAME RUNS: submit $WORK/NAME.yaml, watch it, table it; pass when RUNS SUCCEEDED
  local name=$1 want=$2
  cat "$WORK/$name.yaml"
  "$BUILD/ablate" submit "$WORK/$name.yaml" --watch --state-dir "$STATE" || return 1
  { echo "## $name ($DEVICE)"; echo; "$BUILD/ablate" table "$name" --state-dir "$STATE"; echo;
    "$BUILD/ablate" query "SELECT run_id, variant, state FROM run_summary WHERE sweep = '$name' ORDER BY run_id" --state-dir "$STATE";
    echo; } | tee -a "$OUT/sweeps.md"
  local ok
  ok=$("$BUILD/ablate" query "SELECT state FROM run_summary WHERE sweep = '$name'" --state-dir "$STATE" | grep -c SUCCEEDED)
  echo "$name: $ok of $want runs SUCCEEDED"
  [ "$ok" = "$want" ]
}
start_coordinator() {
  mkdir -p "$STATE"
  "$BUILD/ablate" serve --port 0 --dashboard-port 0 --state-dir "$STATE" >> "$WORK/serve.log" 2>&1 &
  PIDS+=($!)
  local i
  for i in $(seq 100); do [ -s "$STATE/address" ] && break; sleep 0.2; done
  [ -s "$STATE/address" ] || { cat "$WORK/serve.log"; return 1; }
  local worker
  for worker in 1 2; do  # two workers on the one GPU: the sink contrast trains its runs side by side
    "$BUILD/ablate-worker" --coordinator "$(cat "$STATE/address")" --token-file "$STATE/worker-token" \
      --device "$DEVICE" --name "gpu-$worker" >> "$WORK/worker-$worker.log" 2>&1 &
    PIDS+=($!)
  done
  echo "coordinator $(cat "$STATE/address"), workers gpu-1 and gpu-2 on $DEVICE"
}
if [ -x "$BUILD/ablate" ] && [ -x "$BUILD/ablate-worker" ]; then
  t0=$(date +%s)
  if start_coordinator >> "$LOG" 2>&1; then
    record coordinator PASS $(( $(date +%s) - t0 )) "$(cat "$STATE/address")"
    COORDINATOR=up
    if [ "$MODE" = dry ]; then
      write_spec gpu_sweep 20 64 2 4 64 8 baseline g1_elementwise g1_headwise
    else
      write_spec gpu_sweep 300 256 4 4 256 16 baseline g1_elementwise g1_headwise
    fi
    run_step sweep 180 - step_sweep gpu_sweep 3
  else
    record coordinator FAIL $(( $(date +%s) - t0 )) "ablate serve did not start (log.txt)"
  fi
else
  skip sweep "ablate or ablate-worker was not built"
fi

# ---- bench: throughput, MFU and memory against the plan ---------------------------------------
if [ -x "$BUILD/bench_gpu" ]; then
  if [ "$MODE" = dry ]; then
    run_step bench 240 "$WORK/bench.txt" "$BUILD/bench_gpu" --device cpu --tiny
  else
    run_step bench 240 "$WORK/bench.txt" "$BUILD/bench_gpu" --device "$DEVICE" --peak-tflops 989
  fi
  grep -h '^{' "$WORK/bench.txt" >> "$OUT/bench.jsonl"
  # LibTorch >= 2.4 warns on every call of the pre-2.4 autocast names (worker/model/torch_compat.h).
  log "bench: $(grep -c 'is deprecated' "$WORK/bench.txt") deprecation warnings in its output"
else
  skip bench "bench_gpu was not built"
fi

# ---- peer (after the sweep: what follows is for the time that remains) --------------------------
if [ ! -f bench/peer_nanogpt.py ]; then
  skip peer "bench/peer_nanogpt.py is absent from this tree (it comes from the speed branch)"
else
  run_step peer-eager 150 "$WORK/peer.txt" step_peer 0
  if [ "$MODE" = dry ]; then
    skip peer-compile "dry run: torch.compile is not rehearsed on the CPU"
  elif [ "$(left)" -gt 150 ]; then
    run_step peer-compile 200 "$WORK/peer.txt" step_peer 1
  else
    skip peer-compile "$(left)s of the budget left, too little for torch.compile"
  fi
  # The peer's machine-readable lines (JSON) beside bench_gpu's.
  grep -h '^{' "$WORK/peer.txt" >> "$OUT/bench.jsonl" 2>/dev/null
fi

# ---- memory: each bench line's peak (max_memory_allocated) against the memory plan -------------
step_memory() {
  python3 - "$OUT/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
rows = [r for r in rows if r.get("impl") == "ablate" and r.get("planned_bytes")]
if not rows:
    print("no bench line carries peak_memory_bytes and planned_bytes"); sys.exit(1)
for r in rows:
    print(f"{r['variant']} d_model {r['d_model']} {r.get('precision', '')}: "
          f"peak {r['peak_memory_bytes'] / 1e9:.3f} GB, planned {r['planned_bytes'] / 1e9:.3f} GB, "
          f"ratio {r['peak_memory_bytes'] / r['planned_bytes']:.3f}")
PY
}
if [ -s "$OUT/bench.jsonl" ]; then run_step memory 30 "$WORK/memory.txt" step_memory
else skip memory "no bench lines"; fi

# ---- bf16: Megatron-LM's bf16 (train.precision BF16) against autocast at the first shape ---------
if [ ! -x "$BUILD/bench_gpu" ]; then
  skip bf16 "bench_gpu was not built"
elif [ "$MODE" = dry ]; then
  run_step bf16 120 "$WORK/bf16.txt" "$BUILD/bench_gpu" --device cpu --tiny --precision bf16 --shapes 1
  grep -h '^{' "$WORK/bf16.txt" >> "$OUT/bench.jsonl"
elif [ "$(left)" -gt 60 ]; then
  run_step bf16 90 "$WORK/bf16.txt" "$BUILD/bench_gpu" --device "$DEVICE" --peak-tflops 989 --precision bf16 --shapes 1
  grep -h '^{' "$WORK/bf16.txt" >> "$OUT/bench.jsonl"
else
  skip bf16 "$(left)s of the budget left"
fi

# ---- nccl: a 2-rank data-parallel run on the one device, NCCL, then Gloo -------------------------
# NCCL refuses two ranks on one GPU ("Duplicate GPU detected") in the versions that check it: the
# step records what this one does, then the same run through Gloo (ABLATE_DIST_BACKEND=gloo); each
# run's log says which backend it used.
step_nccl() {
  local steps=60 threads=""
  [ "$MODE" = dry ] && { steps=6; threads=", threads: 1"; }
  {
    echo "model: {d_model: 256, num_layers: 4, num_heads: 4, num_kv_heads: 4, head_dim: 64,"
    echo "        ffn_dim: 1024, max_seq_len: 256}"
    echo "train: {steps: $steps, batch_size: 8, seq_len: 256, device: $DEVICE, eval_every: 1000,"
    echo "        eval_batches: 1, checkpoint_every: 0, log_every: 10$threads}"
  } > "$WORK/dp.yaml"
  local backend rc=0 t0
  for backend in default gloo; do
    t0=$(date +%s)
    rm -rf "$WORK/dp-$backend"
    if [ "$backend" = gloo ]; then
      ABLATE_DIST_BACKEND=gloo "$BUILD/ablate-worker" train --config "$WORK/dp.yaml" \
        --out "$WORK/dp-$backend" --world-size 2 || rc=1
    else
      "$BUILD/ablate-worker" train --config "$WORK/dp.yaml" --out "$WORK/dp-$backend" \
        --world-size 2 || echo "the default backend failed (above)"
    fi
    echo "$backend: $(( $(date +%s) - t0 )) s"
  done
  # ZeRO-2 and the loss in chunks on the device, through Gloo as above: its final loss against
  # the plain Gloo run's (the same steps up to float sums), and its peak of device memory.
  sed 's/log_every: 10/log_every: 10, shard_optimizer: true, shard_gradients: true, activation_checkpointing: true, loss_chunk_tokens: 512/' \
    "$WORK/dp.yaml" > "$WORK/dp-zero2.yaml"
  t0=$(date +%s)
  rm -rf "$WORK/dp-zero2"
  ABLATE_DIST_BACKEND=gloo "$BUILD/ablate-worker" train --config "$WORK/dp-zero2.yaml" \
    --out "$WORK/dp-zero2" --world-size 2 || rc=1
  echo "zero2: $(( $(date +%s) - t0 )) s"
  env -u LD_LIBRARY_PATH "$PY" - "$WORK/dp-gloo/summary.json" "$WORK/dp-zero2/summary.json" <<'PY' || rc=1
import json, sys
plain, zero2 = (json.load(open(p)) for p in sys.argv[1:3])
a, b = plain["final_train_loss"], zero2["final_train_loss"]
print(f"zero2: final train loss {b:.6f} against Gloo's {a:.6f} (relative {abs(b - a) / a:.2e}); "
      f"peak {int(zero2.get('peak_memory_bytes', 0)) / 1e6:.1f} MB against "
      f"{int(plain.get('peak_memory_bytes', 0)) / 1e6:.1f} MB")
PY
  return $rc
}
if [ ! -x "$BUILD/ablate-worker" ]; then
  skip nccl "ablate-worker was not built"
elif [ "$MODE" = dry ] || [ "$(left)" -gt 60 ]; then
  run_step nccl 120 "$WORK/nccl.txt" step_nccl
else
  skip nccl "$(left)s of the budget left"
fi

# ---- sink: the attention-sink contrast, if time remains ------------------------------------------
if [ "$COORDINATOR" != up ]; then
  skip sink "no coordinator"
elif [ "$MODE" = dry ]; then
  write_spec gpu_sink 20 96 2 4 64 8 baseline g1_elementwise
  run_step sink 180 - step_sweep gpu_sink 2
elif [ "$(left)" -gt 60 ]; then
  # ~14M parameters: d_model 384, 6 layers, 6 heads of 64, FFN 1536, 512 tokens, bos token 2;
  # 1,000 steps of 32 sequences, the two runs side by side on the two workers.
  write_spec gpu_sink 1000 384 6 6 512 32 baseline g1_elementwise
  run_step sink $(( $(left) + 60 )) - step_sweep gpu_sink 2
else
  skip sink "$(left)s of the budget left"
fi
for f in "$WORK"/serve.log "$WORK"/worker-*.log; do
  [ -f "$f" ] && { echo "## $(basename "$f")"; tail -n 40 "$f"; } >> "$LOG"
done

# ---- summary ------------------------------------------------------------------------------------
{
  echo "# run_device_checks.sh ($MODE, $DEVICE): $(date -u '+%Y-%m-%d %H:%M:%S') UTC, $(elapsed)s"
  echo
  echo "| step | status | seconds | note |"
  echo "|---|---|---:|---|"
  for s in "${STATUS[@]}"; do IFS='|' read -r n st sec note <<< "$s"; echo "| $n | $st | $sec | $note |"; done
  echo
  echo "## bench.jsonl"
  echo; echo '```'; cat "$OUT/bench.jsonl"; echo '```'
  echo
  if [ -s "$WORK/peer.txt" ]; then
    echo "## peer: the last lines of bench/peer_nanogpt.py"
    echo; echo '```'; tail -n 30 "$WORK/peer.txt"; echo '```'; echo
  fi
  if [ -s "$WORK/memory.txt" ]; then
    echo "## memory: max_memory_allocated against the plan"
    echo; echo '```'; cat "$WORK/memory.txt"; echo '```'; echo
  fi
  if [ -s "$WORK/nccl.txt" ]; then
    echo "## nccl: 2 ranks on one device (the backend lines and the timings)"
    echo; echo '```'; grep -E "data parallel:|Duplicate|NCCL|default:|gloo:|zero2:|done:|error" "$WORK/nccl.txt" | tail -n 30; echo '```'; echo
  fi
  echo "## parity: margins and failures"
  echo; echo '```'
  grep -E "^\[ parity|^\[  FAILED  \]|^\[  PASSED  \]|test suites? ran|^\[  SKIPPED \] [0-9]+ test" "$OUT/parity.txt" 2>/dev/null | tail -n 200
  echo '```'
  echo
  cat "$OUT/sweeps.md"
} > "$SUMMARY"
log "summary: $SUMMARY"
FAILED=$(printf '%s\n' "${STATUS[@]}" | grep -c '|FAIL|')
log "done in $(elapsed)s: $FAILED step(s) failed"
[ "$FAILED" = 0 ]
