#!/usr/bin/env bash
# Builds llm.c's GPT-2 trainer (train_gpt2cu, bf16, one GPU) from a snapshot of its source, the
# second peer of tools/gpu-bench.sh (issue 26). llm.c is never part of this repository: the
# snapshot lives in the git-ignored .deps/llm.c (tools/pack-deps.sh puts it there), and every
# change it needs to build here is made at build time, on a copy, by the seds below.
#
#   tools/build-llmc.sh SRC OUTDIR [--cudnn]
#
# SRC:    llm.c's source tree (its Makefile, train_gpt2.cu, llmc/).
# OUTDIR: gets src/ (the patched copy, rebuilt from scratch), build.log and the binary
#         OUTDIR/train_gpt2cu, or OUTDIR/train_gpt2cu-cudnn with --cudnn.
# --cudnn: llm.c's cuDNN attention (USE_CUDNN=1): the cudnn-frontend headers from
#         MT_LLMC_CUDNN_FRONTEND (default: .deps/cudnn-frontend/include, else .cudnn-frontend/include)
#         and cuDNN 9 itself from the CUDA toolkit or PyTorch's wheel (nvidia-cudnn-cu13), found
#         the way CMakeLists.txt finds it for microtrain's own cuDNN build.
# Environment: MT_LLMC_ARCH (default 90: sm_90, H100/H200), NVCC (default: nvcc on PATH),
# MT_LLMC_WITHOUT_MAKE=1 (what a machine without GNU make does: the plain binary by the
# Makefile's own nvcc command, written out below; the device image is not known to have make).
#
# Exit 0 with the binary in place, else non-zero with the reason on stderr (and in build.log).
set -uo pipefail

die() { echo "build-llmc: $*" >&2; exit 1; }

SRC="${1:?usage: tools/build-llmc.sh SRC OUTDIR [--cudnn]}"
OUTDIR="${2:?usage: tools/build-llmc.sh SRC OUTDIR [--cudnn]}"
CUDNN=0
[[ "${3:-}" == --cudnn ]] && CUDNN=1
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ARCH="${MT_LLMC_ARCH:-90}"
[[ -f "$SRC/train_gpt2.cu" && -f "$SRC/Makefile" ]] ||
    die "$SRC holds no llm.c source (train_gpt2.cu, Makefile); run tools/pack-deps.sh, which puts a snapshot into .deps/llm.c"
if ! command -v nvcc > /dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    export PATH=/usr/local/cuda/bin:$PATH
fi
NVCC_BIN="${NVCC:-$(command -v nvcc)}" || true
[[ -x "$NVCC_BIN" ]] || die "no nvcc on PATH (nor /usr/local/cuda/bin/nvcc)"

mkdir -p "$OUTDIR"
OUTDIR="$(cd "$OUTDIR" && pwd)"
name=train_gpt2cu
[[ $CUDNN == 1 ]] && name=train_gpt2cu-cudnn
work="$OUTDIR/src-$name"
rm -rf "$work"
cp -r "$SRC" "$work" || die "cannot copy $SRC to $work"
LOG="$OUTDIR/build-$name.log"
: > "$LOG"

# patch FILE PATTERN SED_EXPR WHY: applies one sed to the copy and fails loudly when the line it
# targets is not there (a newer llm.c may have fixed it, or moved it: then this script is stale).
patch_llmc() {
    local file="$work/$1" pattern="$2" expr="$3" why="$4"
    grep -q -- "$pattern" "$file" || { echo "patch not applicable ($why): '$pattern' not in $1" >> "$LOG"; return 0; }
    sed -i -e "$expr" "$file" || die "sed failed on $1"
    echo "patched $1: $why" >> "$LOG"
}

# CUDA 13 changed cudaMemAdvise's location argument from a device int to a cudaMemLocation, so
# llm.c's fallback to managed memory on OOM no longer compiles. The device machine's notes also
# warn that managed memory larger than the free device memory can hang the GPU: an OOM is made a
# plain error instead (cudaCheck_ prints it and exits), which is what a benchmark wants anyway.
patch_llmc llmc/cuda_utils.cuh 'cudaMallocManaged(out, bytes)' \
    '/cudaMallocManaged(out, bytes)/d; s/cudaCheck_(cudaMemAdvise([^;]*;/cudaCheck_(err, file, line); \/\/ microtrain: no managed-memory fallback (CUDA 13; a GPU hang)/' \
    "CUDA 13 cudaMemAdvise signature; OOM is an error, not managed memory"

# NVML (libnvidia-ml) serves only llm.c's optional GPU-status line (-lg, never used here), and
# neither this development machine nor every CUDA image has the library to link against (the
# driver brings libnvidia-ml.so.1 at run time, not the link name): llm.c builds without it.
patch_llmc llmc/mfu.h '#if __has_include(<nvml.h>)' 's/#if __has_include(<nvml.h>)/#if 0 \/\/ microtrain: NVML off (no -lg)/' \
    "NVML off: its status line is unused, its link library often absent"
patch_llmc Makefile 'NVCC_LDFLAGS += -lnvidia-ml' 's/^\( *\)NVCC_LDFLAGS += -lnvidia-ml/\1# microtrain: no -lnvidia-ml/' \
    "no -lnvidia-ml link"

make_args=(train_gpt2cu "GPU_COMPUTE_CAPABILITY=$ARCH" NO_MULTI_GPU=1 NO_USE_MPI=1 PRECISION=BF16)
if [[ $CUDNN == 1 ]]; then
    fe="${MT_LLMC_CUDNN_FRONTEND:-}"
    for c in "$ROOT/.deps/cudnn-frontend/include" "$ROOT/.cudnn-frontend/include"; do
        [[ -z $fe && -f $c/cudnn_frontend.h ]] && fe=$c
    done
    [[ -n $fe && -f $fe/cudnn_frontend.h ]] ||
        die "--cudnn: no cudnn-frontend headers (set MT_LLMC_CUDNN_FRONTEND, or run tools/fetch-cudnn-frontend.sh / tools/pack-deps.sh)"
    # cuDNN 9: the toolkit's, else PyTorch's wheel (its lib holds only libcudnn.so.9, so the
    # link names the file itself: -l:libcudnn.so.9).
    inc="" lib=""
    for d in /usr/local/cuda/include /usr/local/cuda/targets/x86_64-linux/include \
        /opt/*/.venv/lib/python3*/site-packages/nvidia/cudnn/include \
        /usr/local/lib/python3*/dist-packages/nvidia/cudnn/include; do
        [[ -z $inc && -f $d/cudnn.h ]] && inc=$d
    done
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
        /opt/*/.venv/lib/python3*/site-packages/nvidia/cudnn/lib \
        /usr/local/lib/python3*/dist-packages/nvidia/cudnn/lib; do
        [[ -z $lib && -e $d/libcudnn.so.9 ]] && lib=$d
    done
    [[ -n $inc && -n $lib ]] || die "--cudnn: cuDNN 9 not found (cudnn.h: '${inc}', libcudnn.so.9: '${lib}'); install nvidia-cudnn-cu13 or build without --cudnn"
    echo "cuDNN: $inc, $lib; frontend $fe" >> "$LOG"
    # The Makefile looks for the frontend only in ~/cudnn-frontend and ./cudnn-frontend.
    ln -sfn "$(dirname "$fe")" "$work/cudnn-frontend"
    # The Makefile adds -lcudnn, which needs libcudnn.so: a link folder of our own provides it.
    mkdir -p "$work/cudnn-link"
    ln -sf "$lib/libcudnn.so.9" "$work/cudnn-link/libcudnn.so"
    # Command-line NVCC replaces the Makefile's; extra include/link folders ride along on it.
    # NVRTC: the frontend's headers compile some engines at run time (as for microtrain's own
    # cuDNN build, CMakeLists.txt); NVCC_LDLIBS is the Makefile's slot at the end of the link.
    make_args+=(USE_CUDNN=1 "CUDNN_FRONTEND_PATH=$fe" NVCC_LDLIBS=-lnvrtc
        "NVCC=$NVCC_BIN -I$inc -L$work/cudnn-link -Xlinker -rpath=$lib")
else
    make_args+=(USE_CUDNN=0 "NVCC=$NVCC_BIN")
fi

build_cmd=(make "${make_args[@]}")
if [[ ${MT_LLMC_WITHOUT_MAKE:-0} == 1 ]] || ! command -v make > /dev/null; then
    [[ $CUDNN == 0 ]] || die "--cudnn needs GNU make (cudnn_att.cpp's own rule); none here"
    # The Makefile's recipe for train_gpt2cu with these variables (llm.c f1e2ace): NVCC_FLAGS,
    # PFLAGS (bf16), the source, NVCC_LDFLAGS (the NVML link patched out above), -o.
    build_cmd=("$NVCC_BIN" --threads=0 --use_fast_math -std=c++17 -O3
        --generate-code "arch=compute_$ARCH,code=[compute_$ARCH,sm_$ARCH]" -DENABLE_BF16
        train_gpt2.cu -lcublas -lcublasLt -o train_gpt2cu)
fi
echo "\$ ${build_cmd[*]}" >> "$LOG"
t=$(date +%s)
if ! (cd "$work" && "${build_cmd[@]}") >> "$LOG" 2>&1; then
    tail -n 20 "$LOG" >&2
    die "${build_cmd[0]##*/} failed after $(($(date +%s) - t)) s (log: $LOG)"
fi
cp "$work/train_gpt2cu" "$OUTDIR/$name" || die "the build succeeded but left no $work/train_gpt2cu"
echo "build-llmc: $OUTDIR/$name built in $(($(date +%s) - t)) s ($("$NVCC_BIN" --version | tail -1))" | tee -a "$LOG"
