#!/bin/bash
# What the OpenMP wait policy costs and saves (kernels/openmp_wait.h): the quickstart's model
# (fp32, 2 threads, B8 T128, 2 warm-up + 10 measured steps, one variant) under OMP_WAIT_POLICY
# passive, active (spin), libgomp's default (spin, then sleep) and spin counts (spin:N =
# GOMP_SPINCOUNT=N), in alternating rounds; each run's median step. POLICIES picks them (default
# "passive active default"); BUSY=1 runs a neighbour that burns one core for the whole
# measurement. Usage: [POLICIES=...] [BUSY=1] bench/openmp_wait.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build/release}
rounds=${2:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"; [[ -n ${burner:-} ]] && kill "$burner" 2> /dev/null || true' EXIT
cat > "$out/e.yaml" <<'YAML'
name: openmp-wait
backend: cpu
model: { n_layer: 4, n_embd: 256, n_head: 4, max_seq_len: 128, vocab_size: 8192 }
data: { source: synthetic, batch_size: 8, seq_len: 128 }
optim: { lr: 6.0e-4, impl: fused }
run: { seed: 1337, warmup_steps: 2, measure_steps: 10, rounds: 1, threads: 2 }
YAML
echo "# $(date -u +%FT%TZ), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), busy=${BUSY:-0}, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
if [[ ${BUSY:-0} == 1 ]]; then
    sh -c 'while :; do :; done' &
    burner=$!
fi
read -r -a policies <<< "${POLICIES:-passive active default}"
declare -A all
for r in $(seq 1 "$rounds"); do
    for policy in "${policies[@]}"; do
        envs=(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT MT_OPENMP_WAIT_CHOSEN=1)  # no re-exec
        case $policy in
            default) ;;
            spin:*) envs+=(GOMP_SPINCOUNT=${policy#spin:}) ;;
            *) envs+=(OMP_WAIT_POLICY=$policy) ;;
        esac
        "${envs[@]}" "$build/microtrain" run -q "$out/e.yaml" --out-dir "$out/$policy-$r" > /dev/null
        ms=$(python3 -c "import json,glob,sys; print('%.1f' % json.load(open(glob.glob(sys.argv[1] + '/*/results.json')[0]))['variants'][0]['stats']['step_ms']['median'])" "$out/$policy-$r")
        all[$policy]+="$ms "
        echo "round $r: $policy $ms ms"
    done
done
for policy in "${policies[@]}"; do echo "$policy: ${all[$policy]}"; done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
