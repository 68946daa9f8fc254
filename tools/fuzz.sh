#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/fuzz_*.cpp, clang, ASan + UBSan) and fuzzes each for
# SECONDS from its seed corpus, after replaying every committed crash input. Fails if any target
# crashes, leaks, times out, runs out of memory or trips a sanitizer; prints executions per target.
#   tools/fuzz.sh [SECONDS]        default 60
# Needs clang and libomp-dev (tools/setup.sh). Build dir: build/fuzz. New corpus entries go to
# build/fuzz/corpus/<target>/ (the committed seeds in tests/fuzz/corpus/ are not modified);
# a crashing input is saved as build/fuzz/artifacts/<target>/crash-*: reproduce it with
#   build/fuzz/fuzz_<target> FILE
# and, once fixed, commit it to tests/fuzz/regressions/<target>/ (test_fuzz_regressions replays
# that folder in the ordinary suite).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "usage: tools/fuzz.sh [SECONDS]" >&2; exit 2; }
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake --preset fuzz "${launcher[@]}" >/dev/null
cmake --build --preset fuzz -j "${MT_FUZZ_JOBS:-2}"

targets=(safetensors batch tokens experiment train_checkpoint results pretrained)
# Fail on the first UBSan report too; leaks are findings (libFuzzer's -detect_leaks=1).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
export OMP_NUM_THREADS=1
status=0
summary=()
for t in "${targets[@]}"; do
    bin=build/fuzz/fuzz_$t
    work=build/fuzz/corpus/$t
    art=build/fuzz/artifacts/$t
    mkdir -p "$work" "$art"
    log=build/fuzz/fuzz_$t.log
    regressions=(tests/fuzz/regressions/$t/*)
    if [[ -e "${regressions[0]}" ]]; then
        if ! "$bin" -runs=1 "${regressions[@]}" >"$log.regressions" 2>&1; then
            echo "fuzz: $t: a committed regression input fails again:" >&2
            tail -n 40 "$log.regressions" >&2
            status=1
            summary+=("$t: REGRESSION")
            continue
        fi
    fi
    # -timeout: an input taking 10 s is a hang; -rss_limit_mb / -malloc_limit_mb: a parser
    # allocating more than 2 GiB for a small input is a finding.
    if "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$art/" "$work" "tests/fuzz/corpus/$t" \
        >"$log" 2>&1; then
        execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
        summary+=("$t: ok, $execs executions in ${seconds}s")
    else
        echo "fuzz: $t FAILED; the end of $log:" >&2
        tail -n 60 "$log" >&2
        ls "$art" >&2 || true
        status=1
        summary+=("$t: FAILED (see $log, inputs in $art)")
    fi
done
printf 'fuzz: %s\n' "${summary[@]}"
exit $status
