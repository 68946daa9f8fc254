#!/bin/bash
# What 2 MiB pages buy the CPU step (kernels/huge_pages.h): bench/cpu_step on gpt2-mini B4 T256,
# 2 threads, 2 warm-up + 8 measured steps, per ISA level, with MT_CPU_HUGE_PAGES=0 and =1 in
# alternating order (off first in odd rounds, on first in even ones); each run's median step,
# peak RSS and memory on huge pages, then per level the ratio on/off of each round's pair.
# Usage: [LEVELS="avx2 avx512"] bench/huge_pages.sh [CPU_STEP] [ROUNDS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cpu_step=${1:-$here/../build/release/cpu_step}
rounds=${2:-4}
read -r -a levels <<< "${LEVELS:-avx2 avx512}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "# $(date -u +%FT%TZ), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" \
     "(family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs)," \
     "model $(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo | cut -d: -f2 | xargs))," \
     "THP $(cat /sys/kernel/mm/transparent_hugepage/enabled 2> /dev/null || echo unknown)," \
     "code at $(git -C "$here" rev-parse --short HEAD), load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$rounds"); do
    for level in "${levels[@]}"; do
        order="0 1"
        (( r % 2 == 0 )) && order="1 0"
        for hp in $order; do
            MT_CPU_ISA=$level MT_CPU_HUGE_PAGES=$hp "$cpu_step" --preset gpt2-mini -B 4 -T 256 \
                --threads 2 --warmup 2 --steps 8 --json "$out/$level-$hp-$r.json" > /dev/null
            python3 - "$out/$level-$hp-$r.json" "$r" "$level" "$hp" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print(f"round {sys.argv[2]}: {sys.argv[3]} huge_pages={sys.argv[4]}  median step "
      f"{j['step_ms']['median']:.1f} ms  peak RSS {j['peak_rss_mib']:.0f} MiB  "
      "on huge pages " + (f"{j['huge_pages_mib']:.0f} MiB" if j["huge_pages_mib"] is not None
                          else "unknown"))
PY
        done
    done
done
python3 - "$out" "$rounds" "${levels[@]}" <<'PY'
import json, statistics, sys
out, rounds, levels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
for level in levels:
    ms = {hp: [json.load(open(f"{out}/{level}-{hp}-{r}.json"))["step_ms"]["median"]
               for r in range(1, rounds + 1)] for hp in ("0", "1")}
    ratios = [on / off for on, off in zip(ms["1"], ms["0"])]
    print(f"{level}: off median {statistics.median(ms['0']):.1f} ms "
          f"({min(ms['0']):.1f}-{max(ms['0']):.1f}), on {statistics.median(ms['1']):.1f} ms "
          f"({min(ms['1']):.1f}-{max(ms['1']):.1f}); on/off per round: median "
          f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
PY
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
