#!/usr/bin/env bash
# ONE benchmark-only device call: GPT-2 124M, T 1024, bf16, B 16 — microtrain (our attention,
# cuDNN's, naive) against PyTorch on the same GPU (eager with SDPA, and torch.compile), tokens/s,
# ms/step, MFU as llm.c counts it, peak memory and final loss, in one summary file.
#
#   tools/gpu-bench.sh OUTDIR          on the GPU machine, .deps carried (tools/pack-deps.sh)
#   MT_GB_DRY_RUN=1 tools/gpu-bench.sh OUTDIR      here, without a GPU: the same stages on the
#                                      CPU build in build/release with a tiny model, PyTorch
#                                      skipped, so the script and its summary are exercised
#
# Budget: at most 8 minutes with the build. Stages, each with a time limit, each appending to
# OUTDIR/gpu-bench-summary.md as it ends (a run stopped by its limit still returns what it
# measured): env, build (microtrain only, in the cuDNN configuration when .deps holds the
# cudnn-frontend headers, else without cuDNN: its variant is then skipped and says why),
# microtrain (bench/gpu_gpt2_124m_t1024.yaml: its variants in interleaved rounds), then PyTorch
# eager and compiled, alternating twice (the device image's own torch), then the table
# (tools/gpu_bench_summary.py). OUTDIR/gpu-bench.tar.gz holds the logs and results.json.
# llm.c (issue 26's second peer) is not built here yet.
set -uo pipefail

OUT="${1:?usage: tools/gpu-bench.sh OUTDIR}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
DEPS="$ROOT/.deps"
DRY="${MT_GB_DRY_RUN:-0}"
ARCH="${MT_GB_ARCH:-90}"
PY="${PYTHON:-python3}"
SUMMARY="$OUT/gpu-bench-summary.md"
PEERS="$OUT/peers.jsonl"
# shellcheck source=tools/device-common.sh
source "$ROOT/tools/device-common.sh"
: > "$PEERS"
{
    echo "# gpu-bench $(date -u +%FT%TZ)"
    echo
    echo "commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$([[ $DRY == 1 ]] && echo ', DRY RUN: CPU, tiny model, no PyTorch')"
    echo
} > "$SUMMARY"

# stage NAME LIMIT_S CMD...: runs CMD under a time limit, logs to OUT/NAME.log, appends its status.
stage() {
    local name="$1" limit="$2" t st
    shift 2
    t=$(date +%s)
    : > "$OUT/$name.log"
    st=$(run_limited "$OUT/$name.log" "$limit" "$@") || true
    echo "- $name: $st in $(($(date +%s) - t)) s" >> "$SUMMARY"
    [[ $st == ok ]] || tail -n 15 "$OUT/$name.log" | sed 's/^/      /' >> "$SUMMARY"
    [[ $st == ok ]]
}

env_info() {
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv || true
    nvcc --version | tail -1 || true
    "$PY" -c 'import torch; print("torch", torch.__version__)' || true
}

build() {
    local cudnn=()
    if [[ -d "$DEPS/cudnn-frontend/include" ]]; then
        cudnn=(-DMT_ENABLE_CUDNN=ON -DMT_CUDNN_FRONTEND_INCLUDE_DIR="$DEPS/cudnn-frontend/include")
    else
        echo "no $DEPS/cudnn-frontend: built without cuDNN (the cudnn variant is skipped)"
    fi
    cmake_with_deps -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DMT_ENABLE_CUDA=ON -DMT_BUILD_TESTS=OFF -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
        "${cudnn[@]}" &&
        cmake --build "$BUILD" -j"$(nproc)" --target microtrain
}

# The microtrain side: its variants interleaved by the harness (run.rounds). The dry run: the
# same file on the CPU, tiny and fp32, without the cuDNN variant (bf16 only, which the CPU lacks).
microtrain_run() {
    local file="$ROOT/bench/gpu_gpt2_124m_t1024.yaml" sets=()
    if [[ $DRY == 1 ]]; then
        file="$OUT/dry-run.yaml"
        sed -e '/- name: cudnn/,+1d' "$ROOT/bench/gpu_gpt2_124m_t1024.yaml" > "$file"
        sets=(--set backend=cpu --set model.preset=tiny --set data.batch_size=2
            --set data.seq_len=32 --set run.measure_steps=6 --set run.precision=fp32)
    fi
    "$BUILD/microtrain" run "$file" --out-dir "$OUT/microtrain" "${sets[@]}"
}

torch_run() {  # torch_run eager|compile
    local flag=()
    [[ $1 == compile ]] && flag=(--compile)
    "$PY" "$ROOT/bench/torch_gpu_step.py" --preset gpt2-124M -B 16 -T 1024 --precision bf16 \
        --attention sdpa --warmup 8 --steps 15 "${flag[@]}" --json "$OUT/torch-$1.json" &&
        cat "$OUT/torch-$1.json" >> "$PEERS"
}

export -f env_info build microtrain_run torch_run
export ROOT DEPS DRY ARCH PY OUT PEERS
if [[ $DRY == 1 ]]; then
    BUILD="$ROOT/build/release"
    export BUILD
    echo "- build: skipped (dry run: $BUILD)" >> "$SUMMARY"
else
    BUILD="$ROOT/build/gpu-bench"
    export BUILD
    stage env 30 env_info
    stage build 300 build
fi
stage microtrain 150 microtrain_run
if [[ $DRY != 1 ]]; then
    for round in 1 2; do
        stage "torch-eager-$round" 60 torch_run eager
        stage "torch-compile-$round" 120 torch_run compile
    done
fi
results=$(find "$OUT/microtrain" -name results.json 2> /dev/null | head -1)
{
    echo
    "$PY" "$ROOT/tools/gpu_bench_summary.py" --microtrain "${results:-$OUT/microtrain/none}" --peers "$PEERS" 2>&1
} >> "$SUMMARY"
tar -czf "$OUT/gpu-bench.tar.gz" -C "$OUT" --exclude gpu-bench.tar.gz . 2> /dev/null
cat "$SUMMARY"
