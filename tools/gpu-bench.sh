#!/usr/bin/env bash
# ONE benchmark-only device call (issue 26, items 5 and 6): GPT-2 124M, T 1024, bf16, at B 16 and
# B 32 — microtrain (bench/gpu_gpt2_124m_t1024.yaml's attention variants) against PyTorch on the same
# GPU (eager with SDPA, and torch.compile) and against llm.c (train_gpt2cu from random init, its
# own attention and cuDNN's), on token shards microtrain writes itself. Tokens/s, ms/step, MFU as
# llm.c counts it, peak memory and final loss, in one table.
#
#   tools/gpu-bench.sh OUTDIR                      on the GPU machine, .deps carried
#                                                  (tools/pack-deps.sh fills it, llm.c included)
#   MT_GB_DRY_RUN=1 tools/gpu-bench.sh OUTDIR      here, without a GPU: the same stages on the CPU
#                                                  build in build/release with a tiny model;
#                                                  PyTorch and llm.c are not run, llm.c's row is
#                                                  parsed from the committed sample of its stdout
#                                                  (tests/data/llmc_train_gpt2cu_stdout.txt) and
#                                                  marked DRY
#
# OUTDIR receives exactly two files, so the device tool (which brings back a few files only)
# returns both: gpu-bench-summary.md and gpu-bench.tar.gz (every log, results.json, peers.jsonl).
# Both are rewritten after every stage: a call stopped by its limit still returns what it
# measured. The working files live in MT_GB_WORK (default: a fresh folder under /tmp).
#
# Budget: the whole script stays within MT_GB_BUDGET_S seconds (default 420, under the 8 minutes
# of issue 26; the machine's own start comes on top). Every stage has its own limit and is cut
# to what is left of the budget, and a stage that would start with under 10 s left is skipped and
# says so. Order, most important first, so that the budget cuts the least useful runs:
#   env, build (microtrain alone, with cuDNN when .deps holds the frontend headers), llm.c (the
#   binaries prebuilt into .deps/llm.c-bin when they load here, else built from .deps/llm.c),
#   shards (microtrain write-tokens), then per batch size: microtrain (its variants in
#   interleaved rounds; at B 32 without `naive`, the slowest, whose lesson B 16 shows), PyTorch
#   eager, llm.c, PyTorch compiled (the costliest last); then the peers' second round at each
#   batch size. A peer that failed once is not run again (its first failure is in the summary).
# Environment: MT_GB_BATCHES ("16 32"), MT_GB_BUDGET_S (420), MT_GB_ARCH (90), MT_GB_WORK,
# MT_GB_PEER_ROUNDS (2), PYTHON (python3); the dry run's build folder MT_GB_BUILD (build/release);
# MT_GB_BUILD_DIR, a build already configured on this machine to reuse (device-check.sh's
# build/device-cudnn, when this call follows it on the same warm machine): only `microtrain` is
# brought up to date there, no configure.
set -uo pipefail

OUT="${1:?usage: tools/gpu-bench.sh OUTDIR}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$OUT" || { echo "gpu-bench: cannot create $OUT" >&2; exit 2; }
OUT="$(cd "$OUT" && pwd)"
T0=$(date +%s)
BUDGET="${MT_GB_BUDGET_S:-420}"
DEPS="$ROOT/.deps"
DRY="${MT_GB_DRY_RUN:-0}"
ARCH="${MT_GB_ARCH:-90}"
PY="${PYTHON:-python3}"
BATCHES="${MT_GB_BATCHES:-16 32}"
PEER_ROUNDS="${MT_GB_PEER_ROUNDS:-2}"
T=1024
WORK="${MT_GB_WORK:-$(mktemp -d /tmp/gpu-bench.XXXXXX)}"
mkdir -p "$WORK"
SUMMARY="$OUT/gpu-bench-summary.md"
STAGES="$WORK/stages.md"   # one line per stage, as it ends
PEERS="$WORK/peers.jsonl"  # one JSON line per peer run (PyTorch, llm.c)
LLMC_BIN="$WORK/llmc-bin"  # the llm.c binaries this run uses (prebuilt or built here)
# shellcheck source=tools/device-common.sh
source "$ROOT/tools/device-common.sh"
: > "$PEERS"
: > "$STAGES"
rm -f "$SUMMARY" "$OUT/gpu-bench.tar.gz"

# The libraries a prebuilt llm.c needs (cuBLASLt, cuDNN 9, NVRTC): the toolkit's first (llm.c was
# linked against CUDA 13.0's), then PyTorch's wheels, where the device image keeps cuDNN.
LLMC_LD_PATH="/usr/local/cuda/lib64:/usr/local/cuda/lib"
for d in /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib /usr/local/lib/python3*/dist-packages/nvidia/*/lib; do
    [[ -d $d ]] && LLMC_LD_PATH+=":$d"
done
LLMC_LD_PATH+="${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ---- the summary: header, stage lines, the table; rewritten whole after every stage ----------
microtrain_results() {  # every results.json, one per batch size
    find "$WORK" -path "$WORK/microtrain-b*" -name results.json 2> /dev/null | sort -V
}
publish() {
    local args=() r tmp="$OUT/.gpu-bench-summary.md.tmp"
    while read -r r; do args+=(--microtrain "$r"); done < <(microtrain_results)
    [[ $DRY == 1 ]] && args+=(--peer-peak-tflops 989.4
        --peer-peak-source "dry run: the fixture's H100 SXM, bf16 dense data-sheet peak of engine/peak_flops.cpp; not this CPU")
    {
        echo "# gpu-bench $(date -u +%FT%TZ)"
        echo
        echo "commit $(git -C "$ROOT" rev-parse --short HEAD 2> /dev/null || echo unknown)$(
            [[ $DRY == 1 ]] && echo ', DRY RUN: CPU, tiny model, no PyTorch, llm.c parsed from a fixture')"
        echo "GPT-2 124M, T $T, bf16, B $BATCHES; $(($(date +%s) - T0)) s of the $BUDGET s budget used"
        echo
        cat "$STAGES"
        echo
        if ((${#args[@]})) || [[ -s $PEERS ]]; then
            "$PY" "$ROOT/tools/gpu_bench_summary.py" "${args[@]}" --peers "$PEERS" 2>&1
        else
            echo "(nothing measured yet)"
        fi
    } > "$tmp"
    mv "$tmp" "$SUMMARY"
    # The logs and results travel in one tar; the token shards stay behind (megabytes, made here).
    tar -czf "$OUT/gpu-bench.tar.gz.tmp" -C "$WORK" --exclude='*.bin' --exclude=llmc-bin . 2> /dev/null &&
        mv "$OUT/gpu-bench.tar.gz.tmp" "$OUT/gpu-bench.tar.gz"
}

# stage NAME LIMIT_S CMD...: runs CMD with a time limit (cut to what the budget has left), its
# output to WORK/NAME.log; appends its status line (and a failure's last lines) to the summary.
stage() {
    local name="$1" limit="$2" t st left
    shift 2
    left=$((T0 + BUDGET - $(date +%s)))
    if ((left < 10)); then
        echo "- $name: skipped, ${left} s of the budget left" >> "$STAGES"
        publish
        return 1
    fi
    ((limit > left)) && limit=$left
    t=$(date +%s)
    { echo "\$ $*"; echo; } > "$WORK/$name.log"
    echo "== [$(date -u +%H:%M:%S)] $name (limit ${limit}s)"
    export MT_GB_STAGE_LIMIT=$limit  # the cut limit, for a stage that sets an inner one (llm.c)
    st=$(run_limited "$WORK/$name.log" "$limit" "$@") || true
    echo "- $name: $st in $(($(date +%s) - t)) s (limit $limit s)" >> "$STAGES"
    [[ $st == ok ]] || tail -n 12 "$WORK/$name.log" | sed 's/^/      /' >> "$STAGES"
    publish
    [[ $st == ok ]]
}

# append_peer ROUND < JSON: one peer line with its round.
append_peer() {
    "$PY" -c 'import json, sys
for line in sys.stdin:
    if line.strip().startswith("{"):
        d = json.loads(line); d["round"] = int(sys.argv[1]); print(json.dumps(d))' "$1" >> "$PEERS"
}

# ---- stages ---------------------------------------------------------------------------------
env_info() {
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit,memory.total --format=csv || true
    nvcc --version | tail -1 || true
    "$PY" -c 'import torch; print("torch", torch.__version__)' || true
    cat "$DEPS/MANIFEST" 2> /dev/null || echo "no $DEPS/MANIFEST: run tools/pack-deps.sh and carry .deps"
}

build() {
    local cudnn=()
    if [[ -d "$DEPS/cudnn-frontend/include" ]]; then
        cudnn=(-DMT_ENABLE_CUDNN=ON -DMT_CUDNN_FRONTEND_INCLUDE_DIR="$DEPS/cudnn-frontend/include")
    else
        echo "no $DEPS/cudnn-frontend: built without cuDNN (the cudnn variant is skipped)"
    fi
    cmake_with_deps -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DMT_ENABLE_CUDA=ON -DMT_BUILD_TESTS=OFF -DMT_BUILD_BENCH=OFF \
        -DCMAKE_CUDA_ARCHITECTURES="$ARCH" "${cudnn[@]}" &&
        cmake --build "$BUILD" -j"$(cpu_cores)" --target microtrain
}

# build_again: the build device-check.sh left on this machine (MT_GB_BUILD_DIR, configured with
# cuDNN there), brought up to date for `microtrain` alone: seconds instead of the build's ~100.
build_again() {
    grep -q '^MT_ENABLE_CUDNN:BOOL=ON' "$BUILD/CMakeCache.txt" ||
        echo "$BUILD was configured without cuDNN: the cudnn variant will fail"
    cmake --build "$BUILD" -j"$(cpu_cores)" --target microtrain
}

# loads BIN: every shared library it needs is found (ldd says "not found" otherwise).
loads() {  # -f, not -x: a carried file may arrive without its execute bit (set when copied)
    [[ -f $1 ]] && ! LD_LIBRARY_PATH="$LLMC_LD_PATH" ldd "$1" 2>&1 | grep -q "not found"
}

# llm.c's binaries into LLMC_BIN: the prebuilt ones from .deps/llm.c-bin where they load here;
# otherwise the plain one is built from .deps/llm.c (tens of seconds). The cuDNN one is only ever
# prebuilt: its cudnn_att.cpp compiles for minutes, more than this call can give it.
llmc_prepare() {
    mkdir -p "$LLMC_BIN"
    [[ -f "$DEPS/llm.c/COMMIT" ]] && echo "llm.c commit: $(cat "$DEPS/llm.c/COMMIT")"
    local name ok=0
    for name in train_gpt2cu train_gpt2cu-cudnn; do
        if loads "$DEPS/llm.c-bin/$name"; then
            cp "$DEPS/llm.c-bin/$name" "$LLMC_BIN/" && chmod +x "$LLMC_BIN/$name" &&
                echo "$name: prebuilt, loads" && ok=1
        elif [[ -e "$DEPS/llm.c-bin/$name" ]]; then
            echo "$name: prebuilt but does not load here:"
            LD_LIBRARY_PATH="$LLMC_LD_PATH" ldd "$DEPS/llm.c-bin/$name" | grep "not found"
        else
            echo "$name: not prebuilt in $DEPS/llm.c-bin"
        fi
    done
    if [[ ! -x "$LLMC_BIN/train_gpt2cu" && $DRY != 1 ]]; then
        [[ -f "$DEPS/llm.c/train_gpt2.cu" ]] || {
            echo "no llm.c source in $DEPS/llm.c: on the development machine run MT_LLMC_SRC=<llm.c clone or git dir> tools/pack-deps.sh and carry .deps"
            return 1
        }
        MT_LLMC_ARCH="$ARCH" bash "$ROOT/tools/build-llmc.sh" "$DEPS/llm.c" "$LLMC_BIN" && ok=1
    fi
    [[ $ok == 1 || $DRY == 1 ]]
}

# llm.c's train and val shards (its -i and -j patterns): uniform synthetic tokens over GPT-2's
# 50257 ids, as microtrain's yaml and the PyTorch peer train on. The loader wraps around, so one
# shard of 2^20 + 1 tokens serves any number of steps; the val shard needs one batch (B*T + 1).
# Should microtrain not have built, a few lines of Python write the same format (other tokens,
# the same distribution), so that the peers are still measured; the summary says so.
shards() {
    mkdir -p "$WORK/shards"
    if [[ -x $BUILD/microtrain ]] &&
        "$BUILD/microtrain" write-tokens "$WORK/shards/train_000000.bin" --count 1048577 --seed 1 &&
        "$BUILD/microtrain" write-tokens "$WORK/shards/val_000000.bin" --count 65537 --seed 2; then
        return 0
    fi
    echo "no $BUILD/microtrain, or its write-tokens failed: the shards are written by gpu-bench.sh's Python fallback"
    touch "$WORK/shards/FALLBACK"
    "$PY" - "$WORK/shards" <<'PYEOF'
import random, struct, sys
for name, n, seed in (("train_000000.bin", 1048577, 1), ("val_000000.bin", 65537, 2)):
    r = random.Random(seed)
    with open(f"{sys.argv[1]}/{name}", "wb") as f:  # llm.c's header: magic, version, count
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *(r.randrange(50257) for _ in range(n))))
PYEOF
}

# yaml_without FILE VARIANT...: the experiment file without those variants (a variant is its
# "  - name: X" line and the deeper-indented lines under it). Says which it dropped.
yaml_without() {
    local file="$1" v
    shift
    local text
    text="$(cat "$file")"
    for v in "$@"; do
        if grep -qE "^  - name: ${v}[[:space:]]*$" <<< "$text"; then
            text="$(awk -v v="$v" '$0 ~ "^  - name: " v "[[:space:]]*$" {skip = 1; next}
                                   skip && /^    / {next}
                                   {skip = 0; print}' <<< "$text")"
            echo "without variant $v" >&2
        fi
    done
    printf '%s\n' "$text"
}

# The microtrain side at one batch size: the variants interleaved by the harness (run.rounds).
# Fewer steps than the file's defaults, to fit the budget with two batch sizes. The dry run: the
# same file on the CPU, tiny and fp32, without the variants only CUDA has.
microtrain_run() {  # microtrain_run B
    local B="$1" file="$WORK/gpt2_124m_t1024_b$1.yaml" drop=() sets=()
    sets=(--set run.rounds=2 --set run.warmup_steps=2
        --set run.measure_steps="$([[ $B -ge 32 ]] && echo 6 || echo 8)")
    [[ $B -ge 32 ]] && drop+=(naive)
    if [[ $DRY == 1 ]]; then
        # B/8 rows of 32 tokens: the table still shows one block per batch size.
        drop+=(cudnn flash_tc)
        sets+=(--set backend=cpu --set model.preset=tiny --set data.batch_size=$((B / 8))
            --set data.seq_len=32 --set run.precision=fp32)
    else
        sets+=(--set data.batch_size="$B")
    fi
    yaml_without "$ROOT/bench/gpu_gpt2_124m_t1024.yaml" "${drop[@]}" > "$file" &&
        "$BUILD/microtrain" run "$file" --out-dir "$WORK/microtrain-b$B" "${sets[@]}"
}

torch_run() {  # torch_run eager|compile B ROUND
    local flag=() json="$WORK/torch-$1-b$2-r$3.json"
    [[ $1 == compile ]] && flag=(--compile)
    # compile: the warm-up steps cover the compilation (not timed).
    local rc=0
    PYTHONUNBUFFERED=1 "$PY" "$ROOT/bench/torch_gpu_step.py" --preset gpt2-124M -B "$2" -T "$T" \
        --precision bf16 --attention sdpa --warmup "$([[ $1 == compile ]] && echo 5 || echo 3)" \
        --steps 10 "${flag[@]}" --json "$json" || rc=$?
    if [[ $rc == 0 && -s $json ]]; then
        append_peer "$3" < "$json"
    else  # a row saying why it has no numbers (the log's tail is in the stage list)
        printf '{"impl": "pytorch", "compile": %s, "attention": "sdpa", "B": %d, "error": "exit status %d: see torch-%s-b%s-r%s.log in the tar"}\n' \
            "$([[ $1 == compile ]] && echo true || echo false)" "$2" "$rc" "$1" "$2" "$3" | append_peer "$3"
    fi
    return "$rc"
}

# llm.c from random init (-e d12) on the shards: B and T as microtrain, one GPU, bf16, no
# recompute (-r 0: microtrain and PyTorch keep their activations), AdamW as ours (lr 6e-4, weight
# decay 0.1, betas 0.9/0.95 and clip 1.0 are llm.c's own), no sampling (-s 0), no checkpoints
# (-n 0, no -o), one validation batch (-m 1: llm.c evaluates at the first and last step, outside
# its timed section). 13 steps: 3 warm-up (cuBLAS/cuDNN set-up) and 10 timed.
llmc_run() {  # llmc_run VARIANT(plain|cudnn) B ROUND
    local bin="$LLMC_BIN/train_gpt2cu" label="its own" log="$WORK/llmc-$1-b$2-r$3.stdout" commit=""
    [[ $1 == cudnn ]] && bin="$LLMC_BIN/train_gpt2cu-cudnn" label="cuDNN"
    [[ -f "$DEPS/llm.c/COMMIT" ]] && commit="$(cat "$DEPS/llm.c/COMMIT")"
    local args=(-i "$WORK/shards/train_*.bin" -j "$WORK/shards/val_*.bin" -e d12 -b "$2" -t "$T"
        -d $(($2 * T)) -x 13 -r 0 -z 0 -l 6e-4 -c 0.1 -u 0 -v 1000 -m 1 -s 0 -n 0)
    local parse=(--label "$label" --commit "$commit" --skip 3)
    if [[ $DRY == 1 ]]; then
        echo "dry run: would run LD_LIBRARY_PATH=... $bin ${args[*]}"
        echo "parsing the committed sample of llm.c's stdout instead: $ROOT/tests/data/llmc_train_gpt2cu_stdout.txt"
        "$PY" "$ROOT/tools/gpu_bench_summary.py" --parse-llmc "$ROOT/tests/data/llmc_train_gpt2cu_stdout.txt" \
            "${parse[@]}" --dry | append_peer "$3"
        return
    fi
    local rc=0
    echo "LD_LIBRARY_PATH=$LLMC_LD_PATH $bin ${args[*]}"
    if [[ -x $bin ]]; then
        # llm.c looks for its tokenizer and HellaSwag files relative to the working directory.
        # Line-buffered (stdbuf): a run cut by its time limit keeps the steps it printed.
        local line_buffered=()
        command -v stdbuf > /dev/null && line_buffered=(stdbuf -oL)
        # Its own limit, 12 s inside the stage's (as the budget cut it) and at most 45 s, so that
        # a hung or cut run still leaves a row with what it printed. --foreground keeps llm.c in
        # the stage's process group: were the stage's limit to strike first, it stops llm.c too.
        local lim=$((${MT_GB_STAGE_LIMIT:-60} - 12))
        ((lim > 45)) && lim=45
        ((lim < 5)) && lim=5
        (cd "$WORK" && LD_LIBRARY_PATH="$LLMC_LD_PATH" timeout --foreground --kill-after=5 "$lim" \
            "${line_buffered[@]}" "$bin" "${args[@]}") > "$log" 2>&1 || rc=$?
    else
        echo "no $bin (see the llm.c stage's log)" > "$log"
        rc=1
    fi
    cat "$log"
    "$PY" "$ROOT/tools/gpu_bench_summary.py" --parse-llmc "$log" "${parse[@]}" |
        "$PY" -c 'import json, sys
d = json.loads(sys.stdin.read()); d.setdefault("B", int(sys.argv[1])); rc = int(sys.argv[2])
if rc and "tokens_per_s" in d: d["exit_status"] = rc  # stopped after its timed steps: keep them
elif rc: d.setdefault("error", f"exit status {rc}")
print(json.dumps(d))' "$2" "$rc" | append_peer "$3"
    return "$rc"
}

export -f env_info build build_again loads llmc_prepare shards yaml_without microtrain_run torch_run llmc_run append_peer
export ROOT DEPS DRY ARCH PY WORK PEERS T LLMC_BIN LLMC_LD_PATH
if [[ $DRY == 1 ]]; then
    BUILD="${MT_GB_BUILD:-$ROOT/build/release}"
    export BUILD
    [[ -x $BUILD/microtrain ]] || {
        echo "gpu-bench: dry run: no $BUILD/microtrain; build it first (cmake --preset cpu or the release build)" >&2
        exit 2
    }
    echo "- build: skipped (dry run: $BUILD)" >> "$STAGES"
else
    BUILD="${MT_GB_BUILD_DIR:-$ROOT/build/gpu-bench}"
    export BUILD
    stage env 30 env_info
    if [[ -n ${MT_GB_BUILD_DIR:-} && -f $BUILD/CMakeCache.txt ]]; then
        stage build 240 build_again
    else
        stage build 240 build
    fi
fi
stage llmc-prepare 120 llmc_prepare
stage shards 30 shards
[[ -f $WORK/shards/FALLBACK ]] &&
    echo "- shards: by the Python fallback (no microtrain binary), not microtrain write-tokens" >> "$STAGES"
llmc_variants=()
for v in plain cudnn; do
    b="$LLMC_BIN/train_gpt2cu"
    [[ $v == cudnn ]] && b="$LLMC_BIN/train_gpt2cu-cudnn"
    [[ -x $b || $DRY == 1 ]] && llmc_variants+=("$v")
done
[[ $DRY == 1 ]] && llmc_variants=(plain)  # one parsed fixture row is enough for the dry run

# A peer that failed once is not run again: the same failure would only spend the budget (a
# torch.compile that breaks can take its whole 150 s each time). Its first failure is in the table.
declare -A gave_up=()
peer_stage() {  # peer_stage KIND NAME LIMIT CMD...
    local kind="$1"
    shift
    if [[ -n ${gave_up[$kind]:-} ]]; then
        echo "- $1: not run, $kind failed in ${gave_up[$kind]}" >> "$STAGES"
        return 1
    fi
    stage "$@" || gave_up[$kind]="$1"
}
# Cheapest first, so that a short budget cuts torch.compile (a cold compile takes a minute or two
# at each batch size) rather than llm.c, half of the comparison.
peers() {  # peers B ROUND
    local v
    if [[ $DRY != 1 ]]; then
        peer_stage torch-eager "torch-eager-b$1-r$2" 60 torch_run eager "$1" "$2"
    fi
    # The dry run parses the one fixture (B 16) once: more copies of it would show nothing more.
    if [[ $DRY != 1 || ($1 == "${BATCHES%% *}" && $2 == 1) ]]; then
        for v in "${llmc_variants[@]}"; do peer_stage "llmc-$v" "llmc-$v-b$1-r$2" 60 llmc_run "$v" "$1" "$2"; done
    fi
    if [[ $DRY != 1 ]]; then
        peer_stage torch-compile "torch-compile-b$1-r$2" 150 torch_run compile "$1" "$2"
    fi
    return 0
}
for B in $BATCHES; do
    ((B >= 32)) && echo "- microtrain-b$B: without \`naive\` (the slowest variant; B 16 shows it)" >> "$STAGES"
    stage "microtrain-b$B" 150 microtrain_run "$B"
    peers "$B" 1
done
for ((round = 2; round <= PEER_ROUNDS; round++)); do
    for B in $BATCHES; do peers "$B" "$round"; done
done
((${#llmc_variants[@]})) || echo "- llm.c: not run (no binary; see llmc-prepare above)" >> "$STAGES"
echo "- done in $(($(date +%s) - T0)) s; working files in $WORK" >> "$STAGES"
publish
cat "$SUMMARY"
