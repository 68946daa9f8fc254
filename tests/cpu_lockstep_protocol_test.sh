#!/usr/bin/env bash
# ctest cpu_lockstep_protocol: bench/cpu_lockstep.py with two cpu_step processes of this build
# taking turns (--peer microtrain, the tiny preset; no PyTorch needed): they run one step at a
# time, strictly alternating, ours first, and the report has a ratio for every step of ours
# with a peer step on both sides. A side that fails stops the pair with its message instead
# of leaving the other waiting for a turn forever. And a run stopped midway keeps, on disk, the
# comparisons it finished.
#
#   bash tests/cpu_lockstep_protocol_test.sh CPU_STEP
set -uo pipefail
CPU_STEP="${1:?usage: tests/cpu_lockstep_protocol_test.sh CPU_STEP}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d /tmp/mt-cpu-lockstep.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "cpu_lockstep_protocol: FAIL: $*" >&2; cat "$tmp/console" >&2 2> /dev/null; exit 1; }

timeout 120 python3 "$ROOT/bench/cpu_lockstep.py" --cpu-step "$CPU_STEP" --peer microtrain \
    --preset tiny --threads 1 --warmup 1 --steps 5 --settle-ms 5 --out-dir "$tmp/out" \
    > "$tmp/console" 2>&1 || fail "the lockstep run exited non-zero"
json="$(ls "$tmp"/out/cpu-lockstep-*.json 2> /dev/null)"
[[ -n $json && -f ${json%.json}.md ]] || fail "no .md and .json report"
python3 - "$json" << 'PYEOF' || fail "the report does not show the two sides taking turns"
import json, sys
c = json.load(open(sys.argv[1]))["comparisons"][0]
ours, theirs = c["ours"]["step_spans_ms"], c["theirs"]["step_spans_ms"]
assert len(ours) == len(theirs) == 6, (len(ours), len(theirs))  # 1 warm-up + 5 steps each
merged = sorted([(s, e, "ours") for s, e in ours] + [(s, e, "theirs") for s, e in theirs])
whos = [w for _, _, w in merged]
assert whos == ["ours", "theirs"] * 6, whos  # strictly alternating, ours first
for (s0, e0, _), (s1, _, _) in zip(merged, merged[1:]):
    assert e0 <= s1, "two steps overlapped"
assert len(c["ratios"]) == 4, c["ratios"]  # ours' measured steps 2..5 lie between two of theirs
assert c["row"]["pairs"] == 4 and c["row"]["verdict"] == "no goal"
PYEOF

# A side that cannot start: the run stops at once, naming it, and nothing is left waiting.
timeout 60 python3 "$ROOT/bench/cpu_lockstep.py" --cpu-step "$CPU_STEP" --peer microtrain \
    --preset tiny -T 999 --steps 3 > "$tmp/console" 2>&1
rc=$?
[[ $rc == 124 ]] && fail "a failing side left the run hanging"
[[ $rc != 0 ]] || fail "a failing side should make the run fail"
grep -q "exceeds max_seq_len" "$tmp/console" || fail "the failing side's message is not shown"
# Stopped during its second comparison (SIGTERM, as a job's time limit sends): the first one's
# report is on disk and says it is 1 of 2, the script says so, and neither process of the
# interrupted pair is left waiting for a turn (their files live under $tmp/py: TMPDIR).
mkdir -p "$tmp/py"
TMPDIR="$tmp/py" python3 "$ROOT/bench/cpu_lockstep.py" --cpu-step "$CPU_STEP" --peer microtrain \
    --preset tiny --threads 1 --warmup 1 --steps 600 --settle-ms 5 --levels "baseline avx2" \
    --out-dir "$tmp/stopped" > "$tmp/console" 2>&1 &
pid=$!
for _ in $(seq 600); do  # up to 60 s for the first comparison's report
    compgen -G "$tmp/stopped/cpu-lockstep-*.md" > /dev/null && break
    sleep 0.1
done
compgen -G "$tmp/stopped/cpu-lockstep-*.md" > /dev/null || fail "no report after the first comparison"
for _ in $(seq 300); do  # and the second pair has started (after the machine's probes)
    pgrep -f "$tmp/py/.*--turn-in" > /dev/null && break
    sleep 0.1
done
pgrep -f "$tmp/py/.*--turn-in" > /dev/null || fail "the second comparison's pair did not start"
kill -TERM "$pid"
wait "$pid" && fail "an interrupted run should exit non-zero"
grep -q "interrupted during comparison 2 of 2" "$tmp/console" || fail "no word of the interruption"
grep -q "1 of the 2 comparisons asked for" "$tmp"/stopped/cpu-lockstep-*.md ||
    fail "the partial report does not say it is partial"
python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
assert d["comparisons_asked"] == 2 and len(d["comparisons"]) == 1, d["comparisons_asked"]
assert d["comparisons"][0]["row"]["level"] == "baseline"' "$tmp"/stopped/cpu-lockstep-*.json ||
    fail "the partial JSON does not hold the finished comparison"
sleep 0.5
pgrep -f "$tmp/py" > /dev/null && fail "a side of the interrupted pair is still running"
echo "cpu_lockstep_protocol: ok"
