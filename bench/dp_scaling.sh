#!/usr/bin/env bash
# Data-parallel scaling on this machine (issue 13): gpt2-mini (B4 per rank, T256, fp32, the CPU
# backend, 1 thread per rank), 1 rank vs 2 ranks (mpirun -np 2), ROUNDS rounds alternating which
# goes first. Per run: the median step time, tokens/s of the global batch and the exposed comm
# time (results.json); per config the median over rounds with the min-max. Prints the table
# (parallel efficiency = tokens/s(2) / (2 x tokens/s(1)); comm share = comm / step) and writes
#   bench/results/dp-scaling-<UTC date-time>-<N>c.md
#
#   bash bench/dp_scaling.sh              (about 3 minutes on 2 cores)
# Environment: MT_BENCH_ROUNDS (3), MICROTRAIN (build/release/microtrain), MT_BENCH_OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${MT_BENCH_ROUNDS:-3}
MT=${MICROTRAIN:-build/release/microtrain}
OUT=${MT_BENCH_OUT:-bench/results}
[[ -x $MT ]] || { echo "dp_scaling: $MT not built (cmake --preset release && cmake --build --preset release)"; exit 2; }
command -v mpirun > /dev/null || { echo "dp_scaling: mpirun not found (bash tools/setup.sh installs Open MPI)"; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
CORES=$(nproc)  # before OMP_NUM_THREADS=1, which GNU nproc honours
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
run() {  # run NAME NP
    local dir="$TMP/$1"
    if [[ $2 == 1 ]]; then "$MT" run bench/dp_scaling.yaml --out-dir "$dir" -q > /dev/null
    else mpirun -np "$2" --bind-to none --oversubscribe "$MT" run bench/dp_scaling.yaml --out-dir "$dir" -q > /dev/null; fi
    echo "$dir"/*/results.json
}
files1=(); files2=()
for r in $(seq "$ROUNDS"); do
    if (( r % 2 )); then files1+=("$(run r$r-1 1)"); files2+=("$(run r$r-2 2)");
    else files2+=("$(run r$r-2 2)"); files1+=("$(run r$r-1 1)"); fi
    echo "round $r/$ROUNDS done" >&2
done
mkdir -p "$OUT"
stamp=$(date -u +%Y-%m-%dT%H%M)
report="$OUT/dp-scaling-$stamp-${CORES}c.md"
python3 - "$report" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" "${files1[@]}" -- "${files2[@]}" <<'PY'
import json, statistics, sys
report, commit = sys.argv[1], sys.argv[2]
rest = sys.argv[3:]; cut = rest.index("--")
groups = {1: rest[:cut], 2: rest[cut + 1:]}
def one(path):
    v = json.load(open(path))["variants"][0]
    s = v["stats"]
    return dict(step=s["step_ms"]["median"], tok=s["tokens_per_s"],
                comm=s["phases_ms"].get("comm", {"median": 0})["median"])
rows = {n: [one(p) for p in ps] for n, ps in groups.items()}
def med(n, k): return statistics.median(r[k] for r in rows[n])
def rng(n, k): return min(r[k] for r in rows[n]), max(r[k] for r in rows[n])
lines = [f"# Data-parallel scaling, gpt2-mini B4/rank T256 fp32, CPU backend, 1 thread per rank",
         "", f"commit {commit}, {len(rows[1])} rounds, medians over rounds (min-max); "
         "command: `bash bench/dp_scaling.sh`", "",
         "| ranks | step ms | tokens/s (global batch) | comm (exposed) ms | comm share | parallel efficiency |",
         "|---:|---:|---:|---:|---:|---:|"]
t1 = med(1, "tok")
for n in (1, 2):
    lo, hi = rng(n, "step"); tlo, thi = rng(n, "tok")
    eff = med(n, "tok") / (n * t1)
    lines.append(f"| {n} | {med(n,'step'):.1f} ({lo:.1f}-{hi:.1f}) | {med(n,'tok'):.0f} ({tlo:.0f}-{thi:.0f}) | "
                 f"{med(n,'comm'):.1f} | {100*med(n,'comm')/med(n,'step'):.1f} % | {100*eff:.0f} % |")
text = "\n".join(lines) + "\n"
open(report, "w").write(text)
print(text)
print("written:", report)
PY
