#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/fuzz_*.cpp, clang, ASan + UBSan) and fuzzes each for
# SECONDS from its seed corpus, after replaying every committed crash input. Fails if any target
# crashes, leaks, times out, runs out of memory or trips a sanitizer; prints executions per target.
#   tools/fuzz.sh [SECONDS]        default 60
# Targets run side by side, one per core (MT_FUZZ_PARALLEL, default nproc); MT_FUZZ_JOBS sets the
# build's parallelism (default 2).
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
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "${MT_FUZZ_JOBS:-2}"

targets=(safetensors batch tokens experiment train_checkpoint results pretrained)
# Fail on the first UBSan report too; leaks are findings (libFuzzer's -detect_leaks=1).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
export OMP_NUM_THREADS=1

# One target: replay its committed regressions, then fuzz it. Writes one summary line to
# build/fuzz/fuzz_<target>.result ("ok ..." or the failure) and, on failure, what to read to
# build/fuzz/fuzz_<target>.failure; prints nothing, so targets run side by side stay legible.
fuzz_target() {
    local t=$1 out=build/fuzz/fuzz_$t work=build/fuzz/corpus/$t art=build/fuzz/artifacts/$t
    rm -f "$out.result" "$out.failure"
    mkdir -p "$work" "$art"
    local regressions=(tests/fuzz/regressions/$t/*)
    if [[ -e "${regressions[0]}" ]] && ! "$out" -runs=1 "${regressions[@]}" >"$out.log.regressions" 2>&1; then
        { echo "fuzz: $t: a committed regression input fails again:"; tail -n 40 "$out.log.regressions"; } >"$out.failure"
        echo "$t: REGRESSION" >"$out.result"
        return
    fi
    # -timeout: an input taking 10 s is a hang; -rss_limit_mb / -malloc_limit_mb: a parser
    # allocating more than 2 GiB for a small input is a finding.
    if "$out" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$art/" "$work" "tests/fuzz/corpus/$t" \
        >"$out.log" 2>&1; then
        local execs
        execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$out.log" | grep -o '[0-9]*$' || echo "?")
        echo "$t: ok, $execs executions in ${seconds}s" >"$out.result"
    else
        { echo "fuzz: $t FAILED; the end of $out.log:"; tail -n 60 "$out.log"; ls "$art"; } >"$out.failure" 2>&1
        echo "$t: FAILED (see $out.log, inputs in $art)" >"$out.result"
    fi
}

# Each libFuzzer process is single-threaded: run as many targets at once as there are cores
# (MT_FUZZ_PARALLEL to change), so the stage takes ceil(targets / cores) × SECONDS, each target
# still fuzzed for SECONDS on a core of its own.
# (GNU nproc counts OMP_NUM_THREADS, set to 1 above for the targets: ask it without.)
parallel=${MT_FUZZ_PARALLEL:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}
[[ "$parallel" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz: MT_FUZZ_PARALLEL must be a positive integer, got '$parallel'" >&2; exit 2; }
running=0
for t in "${targets[@]}"; do
    fuzz_target "$t" &
    if ((++running >= parallel)); then
        wait -n || true # a target's failure is in its .result, read below
        running=$((running - 1))
    fi
done
wait

status=0
for t in "${targets[@]}"; do
    out=build/fuzz/fuzz_$t
    [[ -s "$out.result" ]] || echo "$t: FAILED (its run ended without a result)" >"$out.result"
    [[ -e "$out.failure" ]] && cat "$out.failure" >&2
    grep -q "^$t: ok" "$out.result" || status=1
    echo "fuzz: $(cat "$out.result")"
done
exit $status
