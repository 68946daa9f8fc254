#!/usr/bin/env bash
# ONE script for a machine with an NVIDIA GPU (H100/H200-class image: nvcc, CMake, ninja, Python
# with PyTorch; no Debian -dev packages, no network). Builds microtrain from what travels with
# the tree (.deps/, filled beforehand on a development machine by tools/pack-deps.sh), runs every
# GPU test (each CUDA kernel against the CPU backend, and the cuDNN attention build's) and the
# GPU labs. The speed comparison with PyTorch and llm.c is tools/gpu-bench.sh's, the next call.
#
#   tools/device-check.sh LOGDIR            (about 5-6 minutes on an H200)
#   MT_DC_DRY_RUN=1 tools/device-check.sh LOGDIR
#                                           here, without a GPU: the test stages on the binaries
#                                           of an existing build (MT_DC_BUILD, default
#                                           build/release; their GPU cases skip), no build, no
#                                           labs: what the call relies on, the bundle and the
#                                           summary, checked by ctest device_check_dry_run
#
# LOGDIR receives exactly two files, so the device tool (which brings back at most 8) returns
# both: summary.md (each stage's status and time, each test binary's counts) and
# device-check.tar.gz (every stage's log, the tests' XML, the labs' reports). Both are rewritten
# after every stage: a call stopped by its limit still returns what ran. The working files live
# in MT_DC_WORK (default: a fresh folder under /tmp). Every stage has a time limit, cut to what is
# left of MT_DC_BUDGET_S (default 450 s, under the call's 480 s; a stage that would start with
# under 10 s left is skipped and says so); a failed stage is recorded and the script moves on.
# Exit code: 0 when every stage passed or was skipped by design (dry run), 1 otherwise.
#
# The cuDNN build (build/device-cudnn) also builds `microtrain`, so the benchmark call that
# follows on the same warm machine reuses it instead of building again (bench/README.md, "One
# device session"): MT_GB_BUILD_DIR=build/device-cudnn tools/gpu-bench.sh OUTDIR.
# Environment: MT_DC_ARCH (default 90), MT_DC_JOBS (default: the cores this process may use),
# MT_DC_WORK, MT_DC_DRY_RUN, MT_DC_BUILD (dry run), MT_DC_TESTS (the test binaries, default every
# GPU test), MT_DC_SKIP_BENCH (default 1; 0 adds the older GPT-2 124M B 8 comparison with PyTorch,
# ~6 minutes, which gpu-bench.sh supersedes).
set -euo pipefail

LOGDIR="${1:?usage: tools/device-check.sh LOGDIR}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$LOGDIR"
LOGDIR="$(cd "$LOGDIR" && pwd)"
DEPS="$ROOT/.deps"
DRY="${MT_DC_DRY_RUN:-0}"
BUILD="$ROOT/build/device"
[[ $DRY == 1 ]] && BUILD="${MT_DC_BUILD:-$ROOT/build/release}"
WORK="${MT_DC_WORK:-$(mktemp -d /tmp/device-check.XXXXXX)}"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
GT_BUILD="$ROOT/build/device-gtest"
GT_PREFIX="$ROOT/build/device-gtest-install"
ARCH="${MT_DC_ARCH:-90}"
PY="${PYTHON:-python3}"
T0=$(date +%s)
BUDGET="${MT_DC_BUDGET_S:-450}"
# shellcheck source=tools/device-common.sh
source "$ROOT/tools/device-common.sh"
JOBS="${MT_DC_JOBS:-$(cpu_cores)}"
export ROOT DEPS BUILD GT_BUILD GT_PREFIX ARCH JOBS PY WORK
declare -a NAMES=() STATUS=() SECS=()
N=0

# ---- the bundle: summary.md and one tar, rewritten whole after every stage --------------------
# summary_md: the stages so far, each test binary's counts from its XML, the benchmark's table.
summary_md() {
    echo "# device-check $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo
    if [[ $DRY == 1 ]]; then
        echo "DRY RUN: no GPU, the test binaries of $BUILD (their GPU cases skip), no build, no labs"
    else
        echo "GPU: $(timeout 10 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2> /dev/null || echo unknown)"
    fi
    echo "commit: $(git -C "$ROOT" log --oneline -1 2> /dev/null || echo unknown)"
    echo "total so far: $(($(date +%s) - T0)) s; logs in device-check.tar.gz (and $WORK there)"
    echo
    echo "| stage | status | seconds |"
    echo "| --- | --- | --- |"
    local i
    for i in "${!NAMES[@]}"; do echo "| ${NAMES[$i]} | ${STATUS[$i]} | ${SECS[$i]} |"; done
    echo
    local t f
    for t in "${TESTS[@]}" test_cuda_cudnn_attention; do
        f="$WORK/$t.xml"
        [[ -f $f ]] || continue
        echo "$t: $(grep -o '<testsuites[^>]*' "$f" | grep -oE '(tests|failures|disabled|errors)="[0-9]+"' | tr '\n' ' ')skipped=\"$(grep -c '<skipped' "$f" || true)\""
    done
    if compgen -G "$WORK/runs-*" > /dev/null || compgen -G "$WORK/torch-*.json" > /dev/null; then
        echo
        ratio_table 2>&1 || echo "(no benchmark results)"
    fi
}
publish() {
    summary_md > "$LOGDIR/.summary.md.tmp" && mv "$LOGDIR/.summary.md.tmp" "$LOGDIR/summary.md"
    tar -czf "$LOGDIR/.device-check.tar.gz.tmp" -C "$WORK" . 2> /dev/null &&
        mv "$LOGDIR/.device-check.tar.gz.tmp" "$LOGDIR/device-check.tar.gz"
}

# stage NAME TIMEOUT_S CMD...: runs CMD with a time limit (cut to what the budget has left; a
# stage that would start with under 10 s left is skipped), output to WORK/nn-NAME.log, then
# publishes the bundle.
stage() {
    local name="$1" limit="$2" left
    shift 2
    left=$((T0 + BUDGET - $(date +%s)))
    if ((left < 10)); then
        skipped "$name" "${left} s of the ${BUDGET} s budget left"
        publish
        return 1
    fi
    ((limit > left)) && limit=$left
    N=$((N + 1))
    local log
    log="$WORK/$(printf '%02d' "$N")-$name.log"
    local t st
    t=$(date +%s)
    echo "== [$(date -u +%H:%M:%S)] $name (limit ${limit}s) -> $(basename "$log")"
    { echo "\$ $*"; echo; } > "$log"
    st=$(run_limited "$log" "$limit" "$@") || true
    local dt=$(($(date +%s) - t))
    echo "   $st in ${dt}s"
    [[ $st == ok ]] || tail -n 25 "$log" | sed 's/^/   | /'
    NAMES+=("$name")
    STATUS+=("$st")
    SECS+=("$dt")
    publish
    [[ $st == ok ]]
}
# skipped NAME WHY: a stage this run leaves out, named in the summary.
skipped() {
    NAMES+=("$1")
    STATUS+=("skipped: $2")
    SECS+=(0)
}

ratio_table() {
    "$PY" - "$WORK" <<'PYEOF'
import glob, json, os, sys
d = sys.argv[1]
rows = []
for f in sorted(glob.glob(os.path.join(d, "runs-*", "**", "results.json"), recursive=True)):
    j = json.load(open(f))
    for v in j.get("variants", []):
        st = v.get("stats", {})
        rows.append((os.path.basename(os.path.dirname(os.path.dirname(f))) + "/" + v.get("name", "?"),
                     st.get("step_ms", {}).get("median"), st.get("tokens_per_s")))
torch = {}
for f in sorted(glob.glob(os.path.join(d, "torch-*.json"))):
    j = json.load(open(f))
    torch[(j["precision"], j["attention"])] = j
print("| run | step ms (median) | tokens/s | PyTorch ms (same precision, math attn) | ratio ours/torch |")
print("| --- | --- | --- | --- | --- |")
for name, ms, tps in rows:
    prec = "bf16" if "bf16" in name else "fp32"
    t = torch.get((prec, "math"))
    tms = t["ms_per_step_mean"] if t else None
    ratio = f"{ms / tms:.2f}" if (ms and tms) else "n/a"
    print(f"| {name} | {ms if ms is None else round(ms, 2)} | {tps if tps is None else round(tps)} | "
          f"{'n/a' if tms is None else round(tms, 2)} | {ratio} |")
for (p, a), j in sorted(torch.items()):
    print(f"\nPyTorch {p} {a}: {j['ms_per_step_mean']:.2f} ms/step, {j['tokens_per_s']:.0f} tokens/s, "
          f"loss {j['final_loss']:.4f}, torch {j['torch']} on {j['device']}")
PYEOF
}

# ---- 0. environment ----
env_info() {
    date -u
    uname -a
    nvidia-smi || true
    nvcc --version
    cmake --version | head -1
    ninja --version
    g++ --version | head -1
    "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")'
    git -C "$ROOT" log --oneline -1 || true
    cat "$DEPS/MANIFEST"
}
export -f env_info

# ---- 1. GoogleTest from .deps/src/googletest ----
build_gtest() {
    [[ -d "$DEPS/src/googletest" ]] || { echo "no $DEPS: run tools/pack-deps.sh on a dev machine and carry .deps"; return 1; }
    cmake -S "$DEPS/src/googletest" -B "$GT_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON -DCMAKE_INSTALL_PREFIX="$GT_PREFIX" &&
        cmake --build "$GT_BUILD" -j"$JOBS" &&
        cmake --install "$GT_BUILD"
}
export -f build_gtest

# ---- 2. configure (every find_package pointed into .deps) ----
# (A stage runs in a bash of its own, without this script's `set -e`: every stage function returns
# the status of what it is for, not of the report lines after it.)
configure() {
    cmake_with_deps -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMT_ENABLE_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DGTest_DIR="$GT_PREFIX/lib/cmake/GTest" || return
    grep -E "^(Eigen3|CLI11|nlohmann_json|yaml-cpp|GTest)_DIR:" "$BUILD/CMakeCache.txt"
    # NCCL: the toolkit's or PyTorch's wheel (nvidia-nccl-cu13); NOTFOUND = the NCCL tests skip.
    grep -E "^MT_NCCL_(INCLUDE_DIR|LIBRARY):" "$BUILD/CMakeCache.txt" || true
}
export -f configure

# ---- 3. build (Release, sm_$ARCH only) ----
ALL_TESTS="test_peak_flops test_backend_ops test_cuda_backend test_cuda_attention
    test_cuda_attention_tc test_cuda_training test_cuda_determinism test_nccl_collectives
    test_data_jitter_cache test_cuda_host_sync test_cuda_offload test_cuda_kernel_ladder
    test_cuda_graph test_cuda_packed128"
read -r -d '' -a TESTS <<< "${MT_DC_TESTS:-$ALL_TESTS}" || true
export TESTS_STR="${TESTS[*]}"
build() {
    local rc=0
    # shellcheck disable=SC2086
    cmake --build "$BUILD" -j"$JOBS" --target microtrain $TESTS_STR || rc=$?
    # Registers / spills of the hot kernels, for kernels/cuda/README.md: one nvcc per file, all at
    # once (each is single-threaded), printed in file order.
    local f hot=(attention layernorm classifier adamw encoder matmul packed128)
    for f in "${hot[@]}"; do
        # shellcheck disable=SC2046
        nvcc -I"$ROOT" -O3 -std=c++20 --expt-relaxed-constexpr -arch=sm_"$ARCH" -Xptxas -v \
            $([[ $f == adamw ]] && echo --fmad=false) -c "$ROOT/kernels/cuda/$f.cu" \
            -o "/tmp/mt_ptxas_$f.o" > "/tmp/mt_ptxas_$f.txt" 2>&1 &
    done
    wait
    for f in "${hot[@]}"; do
        echo "-- $f.cu"
        grep -E "Compiling entry|registers|spill" "/tmp/mt_ptxas_$f.txt" || true
    done
    return "$rc"
}
export -f build

# ---- 3b. cuDNN attention: the cudnn preset's configuration, headers from .deps/cudnn-frontend;
# microtrain too, for gpu-bench.sh's call on the same machine (MT_GB_BUILD_DIR) ----
CUDNN_BUILD="$ROOT/build/device-cudnn"
export CUDNN_BUILD
build_cudnn() {
    cmake_with_deps -S "$ROOT" -B "$CUDNN_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DMT_ENABLE_CUDA=ON -DMT_ENABLE_CUDNN=ON \
        -DMT_CUDNN_FRONTEND_INCLUDE_DIR="$DEPS/cudnn-frontend/include" \
        -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DGTest_DIR="$GT_PREFIX/lib/cmake/GTest" || return
    # cuDNN: the toolkit's or PyTorch's wheel (nvidia-cudnn-cu13); the frontend from .deps.
    grep -E "^MT_CUDNN_(FRONTEND_INCLUDE_DIR|INCLUDE_DIR|LIBRARY):" "$CUDNN_BUILD/CMakeCache.txt" || true
    cmake --build "$CUDNN_BUILD" -j"$JOBS" --target test_cuda_cudnn_attention microtrain
}
export -f build_cudnn

if [[ $DRY == 1 ]]; then
    skipped env "dry run"
    skipped gtest "dry run"
    skipped configure "dry run"
    skipped build "dry run: the binaries of $BUILD"
else
    stage env 60 env_info || true
    stage gtest 180 build_gtest || true
    stage configure 120 configure || true
    stage build "${MT_DC_BUILD_TIMEOUT:-420}" build || true
fi

# ---- 4. GPU tests (each binary alone, with XML results) ----
for t in "${TESTS[@]}"; do
    stage "$t" 240 "$BUILD/$t" --gtest_output="xml:$WORK/$t.xml" || true
done

if [[ $DRY == 1 ]]; then
    skipped build-cudnn "dry run"
    skipped labs "dry run: they need a GPU"
else
    stage build-cudnn 420 build_cudnn || true
    stage test_cuda_cudnn_attention 240 "$CUDNN_BUILD/test_cuda_cudnn_attention" \
        --gtest_output="xml:$WORK/test_cuda_cudnn_attention.xml" || true

    # ---- 5. lab: offload (run.offload activations, optim.offload), GPT-2 124M, ~10 steps each ----
    # Its own folder (not runs-*): the ratio table compares the benchmark runs with PyTorch.
    stage lab-offload 150 "$BUILD/microtrain" run "$ROOT/configs/labs/offload.yaml" \
        --out-dir "$WORK/lab-offload" || true

    # ---- 6. the older benchmark (opt-in): microtrain, then PyTorch on the same GPU ----
    if [[ "${MT_DC_SKIP_BENCH:-1}" != 1 ]]; then
        stage bench-microtrain-fp32 240 "$BUILD/microtrain" run "$ROOT/bench/gpu_gpt2_124m.yaml" \
            --out-dir "$WORK/runs-fp32" || true
        stage bench-microtrain-bf16 200 "$BUILD/microtrain" run "$ROOT/bench/gpu_gpt2_124m_bf16.yaml" \
            --out-dir "$WORK/runs-bf16" || true
        for cfg in "fp32 math" "bf16 math" "bf16 sdpa"; do
            prec="${cfg% *}" attn="${cfg#* }"
            stage "bench-torch-$prec-$attn" 150 env PYTHONUNBUFFERED=1 "$PY" "$ROOT/bench/torch_gpu_step.py" \
                --preset gpt2-124M -B 8 -T 1024 --precision "$prec" --attention "$attn" --warmup 3 \
                --steps 10 --json "$WORK/torch-$prec-$attn.json" || true
        done
    fi

    # ---- 7. labs that need the GPU to show their effect (seconds each) ----
    # run.host_sync: a host sync only costs something when the device runs asynchronously.
    stage lab-host-sync 180 "$BUILD/microtrain" run "$ROOT/configs/labs/host_sync.yaml" \
        --set backend=cuda --out-dir "$WORK/runs-host-sync" || true

    # kernels.matmul / kernels.layernorm_forward: the CUDA ladders (7 variants x 8 steps; naive is
    # the slow one). Its own folder, not runs-*: the ratio table compares the GPT-2 124M runs only.
    stage lab-kernel-ladder-gpu 240 "$BUILD/microtrain" run "$ROOT/configs/labs/kernel_ladder_gpu.yaml" \
        --out-dir "$WORK/lab-kernel-ladder-gpu" || true
fi

publish
cat "$LOGDIR/summary.md"
for s in "${STATUS[@]}"; do [[ $s == ok || $s == "skipped: dry run"* ]] || exit 1; done
exit 0
