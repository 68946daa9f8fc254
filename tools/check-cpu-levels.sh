#!/usr/bin/env bash
# Checks the CPU ISA levels' objects (CMakeLists.txt, "CPU ISA levels") for the two properties
# that let one binary run on any x86-64 CPU; ctest runs it as cpu_isa_levels.
#
#   tools/check-cpu-levels.sh BUILD_DIR
#
# 1. Each level object BUILD_DIR/mt_cpu_<level>.o defines exactly one global symbol, its
#    mt::cpu::isa_<level>::kernel_table(): everything else (Eigen's templates, our inline helpers)
#    is local, so the final link cannot swap in another level's copy of a shared function.
# 2. No level runs instructions above its ISA: the baseline object has no ymm/zmm register
#    (x86-64 = SSE2), the avx2 object no zmm, no AVX-512 mask register and no ymm16-31 (EVEX
#    encodings only AVX-512 has). This is what "runs on an AVX2 machine" needs of the code, checked
#    on a machine that may have AVX-512. And, so the check itself is shown to see such
#    instructions, the avx512 object must contain zmm registers.
set -euo pipefail
build=${1:?usage: tools/check-cpu-levels.sh BUILD_DIR}
status=0
fail() {
    echo "check-cpu-levels: $*" >&2
    status=1
}
# Instructions of one object, AT&T syntax, without the raw bytes.
disassemble() { objdump -d --no-show-raw-insn "$1"; }

for level in baseline avx2 avx512; do
    obj="$build/mt_cpu_$level.o"
    if [[ ! -f "$obj" ]]; then
        [[ $level == baseline ]] && fail "$obj not found (build the target mt_cpu first)"
        continue  # not an x86-64 build: baseline only
    fi
    ns="isa_$level"
    entry="_ZN2mt3cpu${#ns}${ns}12kernel_tableEv"
    globals=$(nm -g --defined-only "$obj" | awk '{print $3}')
    if [[ "$globals" != "$entry" ]]; then
        fail "$obj: the global symbols must be exactly $entry; found:"
        echo "$globals" | sed 's/^/    /' >&2
    fi
done

avx512_regs='%zmm|%k[0-7]|%[xy]mm(1[6-9]|2[0-9]|3[01])\b'
if [[ -f "$build/mt_cpu_baseline.o" ]] && grep -qE '^(x86_64|amd64)' <<<"$(uname -m)"; then
    if hits=$(disassemble "$build/mt_cpu_baseline.o" | grep -E '%[yz]mm' | head -5) &&
        [[ -n "$hits" ]]; then
        fail "the baseline level uses AVX registers (x86-64 has SSE2 only), e.g.:"$'\n'"$hits"
    fi
fi
if [[ -f "$build/mt_cpu_avx2.o" ]]; then
    if hits=$(disassemble "$build/mt_cpu_avx2.o" | grep -E "$avx512_regs" | head -5) &&
        [[ -n "$hits" ]]; then
        fail "the avx2 level uses AVX-512 registers, e.g.:"$'\n'"$hits"
    fi
fi
if [[ -f "$build/mt_cpu_avx512.o" ]]; then
    # (grep -c, not -q: -q would stop reading early, and objdump's SIGPIPE fail the pipeline)
    [[ $(disassemble "$build/mt_cpu_avx512.o" | grep -cE '%zmm') -gt 0 ]] ||
        fail "the avx512 level has no zmm instruction: it is not compiled for AVX-512, or this" \
            "check cannot see AVX-512 instructions"
fi
[[ $status == 0 ]] && echo "check-cpu-levels: every level object exports only its kernel table" \
    "and stays within its ISA"
exit $status
