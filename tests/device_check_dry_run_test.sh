#!/usr/bin/env bash
# ctest device_check_dry_run: tools/device-check.sh's dry run (MT_DC_DRY_RUN=1) on this build's
# GPU test binaries (their GPU cases skip here), so what the device call relies on is checked on
# every CI run without a GPU: LOGDIR holds exactly summary.md and device-check.tar.gz (the device
# tool brings back at most 8 files; the first check's logs were lost to that limit), the summary
# has a row per stage and each test binary's counts, the tar holds every log and XML, a failing
# stage is recorded and the script goes on and exits 1, and a stage the budget has no time left
# for is skipped and named.
#
#   bash tests/device_check_dry_run_test.sh BUILD_DIR     (BUILD_DIR holds test_cuda_* binaries)
set -uo pipefail
BUILD="${1:?usage: tests/device_check_dry_run_test.sh BUILD_DIR}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d /tmp/mt-device-check-dry.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "device_check_dry_run: FAIL: $*" >&2; cat "$tmp"/out*/summary.md >&2 2> /dev/null; exit 1; }

# dry_run OUT TESTS: the dry run into OUT with MT_DC_TESTS=TESTS; prints its exit status.
dry_run() {
    MT_DC_DRY_RUN=1 MT_DC_BUILD="$BUILD" MT_DC_WORK="$tmp/work-$1" MT_DC_TESTS="$2" \
        OMP_NUM_THREADS=1 bash "$ROOT/tools/device-check.sh" "$tmp/$1" > "$tmp/$1.console" 2>&1
    echo $?
}

# 1. Two quick GPU test binaries: every stage ok or skipped, exit 0.
rc=$(dry_run out-pass "test_cuda_graph test_cuda_packed128")
[[ $rc == 0 ]] || fail "the dry run exited $rc: $(tail -5 "$tmp/out-pass.console")"
held="$(find "$tmp/out-pass" -mindepth 1 -printf '%f\n' | sort | paste -sd ' ')"
[[ "$held" == "device-check.tar.gz summary.md" ]] ||
    fail "LOGDIR should hold the summary and the tar only, holds: $held"
summary="$tmp/out-pass/summary.md"
grep -q '^| test_cuda_graph | ok |' "$summary" || fail "no ok row for test_cuda_graph"
grep -q '^| build | skipped: dry run' "$summary" || fail "the build should be named as skipped"
grep -qE '^test_cuda_packed128: tests="[1-9][0-9]*" failures="0" .*skipped="[1-9]' "$summary" ||
    fail "no counts for test_cuda_packed128 (its GPU cases skip without a GPU)"
listing="$(tar -tzf "$tmp/out-pass/device-check.tar.gz")"
grep -q 'test_cuda_graph\.log$' <<< "$listing" || fail "no test_cuda_graph log in the tar"
grep -q 'test_cuda_packed128\.xml$' <<< "$listing" || fail "no test_cuda_packed128 XML in the tar"

# 2. A binary that is not there: its stage fails, the next one still runs, exit 1, bundle kept.
rc=$(dry_run out-fail "test_not_built test_cuda_graph")
[[ $rc == 1 ]] || fail "a failed stage should make the exit status 1, got $rc"
summary="$tmp/out-fail/summary.md"
grep -qE '^\| test_not_built \| FAIL' "$summary" || fail "the missing binary's stage is not FAIL"
grep -q '^| test_cuda_graph | ok |' "$summary" || fail "the stage after a failure did not run"
[[ -s "$tmp/out-fail/device-check.tar.gz" ]] || fail "no tar after a failed stage"

# 3. No budget left: the stage is skipped and named so (not run past the call's limit), exit 1.
rc=$(MT_DC_BUDGET_S=5 dry_run out-budget "test_cuda_graph")
[[ $rc == 1 ]] || fail "a stage skipped for the budget should make the exit status 1, got $rc"
grep -qE '^\| test_cuda_graph \| skipped: -?[0-9]+ s of the 5 s budget left \|' "$tmp/out-budget/summary.md" ||
    fail "the stage past the budget is not named as skipped for it"
echo "device_check_dry_run: ok"
