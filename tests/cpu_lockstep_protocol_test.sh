#!/usr/bin/env bash
# ctest cpu_lockstep_protocol: bench/cpu_lockstep.py with two cpu_step processes of this build
# taking turns (--peer microtrain, the tiny preset; no PyTorch needed): they run one step at a
# time, strictly alternating, ours first, and the report has a ratio for every step of ours
# with a peer step on both sides. And a side that fails stops the pair with its message instead
# of leaving the other waiting for a turn forever.
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
echo "cpu_lockstep_protocol: ok"
