#!/bin/bash
# The power of the time call on a quiet machine (issue 23): bench/rounds_power.yaml run N times
# (default 5); each run's time call and 95 % interval for `control` (A/A) and `plus-10pct`
# (about 10 % more time per step), and its wall time. Usage: bench/rounds_power.sh [BUILD_DIR] [N]; KEEP=DIR keeps the run
# folders and logs there (default: a temporary folder, removed).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build/release}
n=${2:-5}
if [[ -n ${KEEP:-} ]]; then
    out=$KEEP
    mkdir -p "$out"
else
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
fi
echo "# $(date -u +%FT%TZ), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), code at $(git -C "$here" rev-parse --short HEAD)"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq 1 "$n"); do
    start=$(date +%s)
    "$build/microtrain" run "$here/rounds_power.yaml" --set report.out_dir="$out/$i" >"$out/$i.log" 2>&1
    end=$(date +%s)
    python3 - "$out/$i" "$i" "$((end - start))" <<'PY'
import glob, json, sys
j = json.load(open(glob.glob(sys.argv[1] + '/rounds_power-*/results.json')[0]))
rows = [r for r in j['comparison']['variants'] if not r.get('is_baseline')]
def fmt(r):
    ci = r.get('speedup_ci95')
    ci = f"[{ci[0]:.3f}-{ci[1]:.3f}]" if ci else "[-]"
    return f"{r['variant']}: {r.get('time_call')} {r['speedup']:.3f}x {ci}"
print(f"run {sys.argv[2]} ({sys.argv[3]} s): " + "; ".join(fmt(r) for r in rows))
PY
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
