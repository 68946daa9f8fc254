#!/usr/bin/env bash
# ctest gpu_bench_dry_run: tools/gpu-bench.sh's dry run (MT_GB_DRY_RUN=1) on this build, so the
# script's stages, the shards, the llm.c parser and the summary are exercised on every CI run
# without a GPU. Checks what the device call relies on: OUTDIR holds exactly the summary and the
# tar; the summary has microtrain's rows at both batch sizes and llm.c's fixture row marked DRY;
# the tar holds peers.jsonl and both results.json.
#
#   bash tests/gpu_bench_dry_run_test.sh BUILD_DIR     (BUILD_DIR holds the microtrain binary)
# shellcheck disable=SC2016  # the backticks below are Markdown in the summary, not commands
set -uo pipefail
BUILD="${1:?usage: tests/gpu_bench_dry_run_test.sh BUILD_DIR}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d /tmp/mt-gpu-bench-dry.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "gpu_bench_dry_run: FAIL: $*" >&2; cat "$tmp/out/gpu-bench-summary.md" >&2 2> /dev/null; exit 1; }

MT_GB_DRY_RUN=1 MT_GB_BUILD="$BUILD" MT_GB_WORK="$tmp/work" OMP_NUM_THREADS=1 \
    bash "$ROOT/tools/gpu-bench.sh" "$tmp/out" > "$tmp/console.log" 2>&1 ||
    fail "the dry run exited non-zero: $(tail -5 "$tmp/console.log")"
summary="$tmp/out/gpu-bench-summary.md"
held="$(find "$tmp/out" -mindepth 1 -printf '%f\n' | sort | paste -sd ' ')"
[[ "$held" == "gpu-bench-summary.md gpu-bench.tar.gz" ]] ||
    fail "OUTDIR should hold the summary and the tar only, holds: $held"
grep -q '^| microtrain `flash` | 2 |' "$summary" || fail "no microtrain row at the first batch size"
grep -q '^| microtrain `flash` | 4 |' "$summary" || fail "no microtrain row at the second batch size"
grep -q '^| microtrain `naive` | 4 |' "$summary" && fail "naive should be dropped at B 32"
# The row names llm.c's commit when .deps/llm.c holds a snapshot (tools/pack-deps.sh), else none.
grep -E '^\| llm\.c( [0-9a-f]+)?, its own attention, round 1 \(DRY: fixture, not a run\) \|' "$summary" |
    grep -qF '| 16 | 70.20 (69.88–70.60) | 233,243 | 18.9 % | 19.0 % |' ||
    fail "no llm.c fixture row with the fixture's numbers"
grep -q '^- shards: ok' "$summary" || fail "the shards stage did not pass"
listing="$(tar -tzf "$tmp/out/gpu-bench.tar.gz")"
grep -q 'peers.jsonl$' <<< "$listing" || fail "no peers.jsonl in the tar"
[[ "$(grep -c 'results.json$' <<< "$listing")" == 2 ]] || fail "the tar should hold two results.json"
grep -q '\.bin$' <<< "$listing" && fail "the shards should stay out of the tar"
echo "gpu_bench_dry_run: ok"
