#!/usr/bin/env bash
# microtrain's CPU training step, once per CPU ISA level, side by side with PyTorch eager on the
# same CPU (issue 4; the ISA levels: issue 27 item 6).
#
#   MT_BENCH_PYTHON=/work/pyenv/bin/python bash bench/run_cpu_bench.sh
#
# Builds bench/cpu_step (Release, CPU backend only, in build/bench), then for each config —
# tiny (B4 T32), gpt2-mini (B4 T256), gpt2-124M (B4 T128), fp32, 2 threads — runs ROUNDS rounds.
# A round runs one process per row, in an order that rotates from round to round (microtrain and
# PyTorch rows interleaved):
#   microtrain at each ISA level this CPU runs (MT_CPU_ISA=avx512 | avx2 | baseline; the levels
#     from `cpu_step --list-cpu-isa`; the level each process ran is read back from its JSON);
#   PyTorch native, and, where the CPU has AVX-512, PyTorch limited to AVX2
#     (MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2; its JSON must
#     show ATen's CPU capability AVX2). On an AVX2-only CPU native PyTorch already is AVX2.
# Every process does 2 warm-up + 5 measured steps and its own sgemm / copy probes. The ratios the
# goal names (issue 27) are paired per round — AVX2 level / PyTorch-AVX2 (goal <= 0.50), AVX-512
# level / PyTorch native (goal <= 0.40), baseline / PyTorch native (no goal) — and reported as the
# median over rounds with the median's interval, the goal judged on that interval (met, missed or
# undecided; lockstep_stats.ratio_verdict). Then one profiled microtrain run of gpt2-mini at the
# best level (cpu_step --profile) gives the per-op roofline table. Writes
#   bench/results/cpu-<UTC date-time>-<cpu model>-<N>c[-smoke].md   (the tables)
#   bench/results/cpu-<UTC date-time>-<cpu model>-<N>c[-smoke].json (every run's JSON + summary)
# atomically, and prints the tables. Until then every finished process is appended to
# ...[-smoke].partial.jsonl beside them, so a run that fails or is stopped (Ctrl-C, SIGTERM)
# keeps what it measured; the report replaces it. About 20 minutes on 2 idle cores with AVX-512.
#
# Environment (all optional):
#   MT_BENCH_ROUNDS=3                     rounds per config
#   MT_BENCH_CONFIGS="tiny gpt2-mini gpt2-124M"
#   MT_BENCH_LEVELS="avx512 avx2 baseline"  microtrain's levels (default: all this CPU runs)
#   MT_BENCH_PYTHON=/usr/bin/python3      the interpreter with PyTorch (the PyPI wheel:
#                                         /work/pyenv/bin/python)
#   MT_BENCH_THREADS=2                    threads for both sides (OMP_NUM_THREADS too)
#   MT_BENCH_BUILD_DIR=build/bench        where cpu_step is built
#   MT_BENCH_CMAKE_ARGS="-DMT_USE_BLAS=ON"  extra configure flags (e.g. Eigen -> OpenBLAS)
#   MT_BENCH_KERNEL_ARGS="--attention flash --layernorm fused_residual --fuse-gelu"
#                                         microtrain kernel choices (default: the defaults)
#   CPU_STEP=/path/to/cpu_step            use this binary, skip the build
#   MT_BENCH_OUT=bench/results            output directory
#   MT_BENCH_SMOKE=1                      a check that the script works, not a measurement: the
#                                         file names end in -smoke and the report says so
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

# The command that reproduces this run, for the report's first lines: the knobs that were set.
REPRO=""
for var in MT_BENCH_ROUNDS MT_BENCH_CONFIGS MT_BENCH_LEVELS MT_BENCH_PYTHON MT_BENCH_THREADS \
    MT_BENCH_BUILD_DIR MT_BENCH_CMAKE_ARGS MT_BENCH_KERNEL_ARGS CPU_STEP MT_BENCH_OUT MT_BENCH_SMOKE; do
    if [[ -n "${!var:-}" ]]; then REPRO+="$var=$(printf '%q' "${!var}") "; fi
done
REPRO+="bash bench/run_cpu_bench.sh"

THREADS=${MT_BENCH_THREADS:-2}
PYTHON=${MT_BENCH_PYTHON:-/usr/bin/python3}
BUILD_DIR=${MT_BENCH_BUILD_DIR:-build/bench}
if [[ -z "${CPU_STEP:-}" ]]; then
    echo "== building cpu_step in $BUILD_DIR"
    mkdir -p "$BUILD_DIR"  # a clean clone has no build/ yet: the configure log goes beside it
    # shellcheck disable=SC2086
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMT_ENABLE_CUDA=OFF \
        -DMT_BUILD_TESTS=OFF ${MT_BENCH_CMAKE_ARGS:-} >"$BUILD_DIR.configure.log" 2>&1 ||
        { cat "$BUILD_DIR.configure.log"; echo "run_cpu_bench: cmake configure failed" >&2; exit 1; }
    cmake --build "$BUILD_DIR" -j"$(nproc)" --target cpu_step
    CPU_STEP=$BUILD_DIR/cpu_step
fi
[[ -x "$CPU_STEP" ]] || { echo "run_cpu_bench: $CPU_STEP is not an executable" >&2; exit 1; }
"$PYTHON" -c "import torch" 2>/dev/null || {
    echo "run_cpu_bench: $PYTHON (MT_BENCH_PYTHON) cannot import torch; set MT_BENCH_PYTHON to" \
        "an interpreter with PyTorch (the PyPI wheel: /work/pyenv/bin/python) or run:" \
        "bash tools/setup.sh --torch" >&2
    exit 1
}

export OMP_NUM_THREADS=$THREADS
export CPU_STEP THREADS ROOT PYTHON REPRO
exec /usr/bin/python3 - <<'PY'
import datetime, json, os, resource, signal, socket, subprocess, sys, tempfile, time

ROOT = os.environ["ROOT"]
CPU_STEP = os.environ["CPU_STEP"]
PYTHON = os.environ["PYTHON"]
THREADS = int(os.environ["THREADS"])
ROUNDS = int(os.environ.get("MT_BENCH_ROUNDS", "3"))
CONFIGS = os.environ.get("MT_BENCH_CONFIGS", "tiny gpt2-mini gpt2-124M").split()
KERNEL_ARGS = os.environ.get("MT_BENCH_KERNEL_ARGS", "").split()
OUT_DIR = os.environ.get("MT_BENCH_OUT", os.path.join(ROOT, "bench", "results"))
SMOKE = os.environ.get("MT_BENCH_SMOKE", "") not in ("", "0")
SHAPES = {"tiny": (4, 32), "gpt2-mini": (4, 256), "gpt2-124M": (4, 128)}
WARMUP, STEPS = 2, 5
for c in CONFIGS:
    if c not in SHAPES:
        sys.exit(f"run_cpu_bench: MT_BENCH_CONFIGS has '{c}'; expected some of {list(SHAPES)}")
if ROUNDS < 1:
    sys.exit(f"run_cpu_bench: MT_BENCH_ROUNDS must be >= 1, got {ROUNDS}")

sys.path.insert(0, os.path.join(ROOT, "bench"))
from cpu_bench_common import (GOALS, ISA_LIMITS, TORCH_AVX2, cpu_identity, isa_of,  # noqa: E402
                              levels_cpu_step_runs, machine_text, result_slug,
                              write_atomically)
from lockstep_stats import median, ratio_verdict  # noqa: E402


def cpu_isa_levels():
    return levels_cpu_step_runs(CPU_STEP, "run_cpu_bench")


def bench_rows():
    """The rows of every round: microtrain per level, then PyTorch native (+ limited to AVX2).
    Returns (rows, supported levels, the row the AVX2 ratio divides by, a note on it)."""
    supported = cpu_isa_levels()
    wanted = os.environ.get("MT_BENCH_LEVELS", "").split() or supported
    for level in wanted:
        if level not in supported:
            sys.exit(f"run_cpu_bench: MT_BENCH_LEVELS has '{level}'; this CPU runs "
                     f"{' '.join(supported)} (cpu_step --list-cpu-isa): use some of those")
    levels = [lv for lv in supported if lv in wanted]  # best first
    rows = [{"id": f"mt-{lv}", "impl": "microtrain", "label": f"microtrain `{lv}`",
             "env": {"MT_CPU_ISA": lv}, "expect": lv} for lv in levels]
    rows.append({"id": "pt-native", "impl": "pytorch", "label": "PyTorch native", "env": {},
                 "expect": None})
    if "avx512" in supported:
        rows.append({"id": "pt-avx2", "impl": "pytorch", "label": "PyTorch limited to AVX2",
                     "env": dict(TORCH_AVX2), "expect": "AVX2"})
        return rows, supported, "pt-avx2", ""
    if "avx2" not in supported:
        return rows, supported, "pt-native", "this CPU has no AVX2: there is no AVX2 ratio"
    rows[-1]["expect"] = "AVX2"  # the AVX2 ratio divides by it: it must have run AVX2
    return rows, supported, "pt-native", ("this CPU has no AVX-512, so PyTorch native already "
                                          "runs AVX2: the AVX2 ratio divides by the native row")


def cpu_busy_seconds():
    """Busy CPU seconds of the whole machine so far (all cores; steal counts as busy)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]  # idle + iowait
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def keep(preset, B, T, tag, r):
    """Appends a finished process's record to PARTIAL at once: a run that fails or is stopped
    later keeps every process it measured (one JSON object per line)."""
    os.makedirs(OUT_DIR, exist_ok=True)
    rec = {k: v for k, v in r.items() if k != "stdout"}
    with open(PARTIAL, "a") as f:
        f.write(json.dumps({"preset": preset, "B": B, "T": T, "round": tag.strip(),
                            "record": rec}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def shown(path):
    """A path as the report names it: relative to the tree when inside it."""
    rel = os.path.relpath(path, ROOT)
    return os.path.abspath(path) if rel.startswith("..") else rel


def kept_so_far():
    return (f"; the processes measured so far are in {shown(PARTIAL)}"
            if os.path.exists(PARTIAL) else "")


def stopped(signum, frame):
    sys.exit(f"run_cpu_bench: stopped ({signal.Signals(signum).name}){kept_so_far()}")


def run_one(row, preset, B, T, extra=(), tag=""):
    """Runs one benchmark process; returns its JSON plus the noise measured around it."""
    fd, path = tempfile.mkstemp(prefix=f"cpu_bench_{row['id']}_", suffix=".json")
    os.close(fd)
    common = ["--preset", preset, "-B", str(B), "-T", str(T), "--threads", str(THREADS),
              "--warmup", str(WARMUP), "--steps", str(STEPS), "--json", path, "--probe"]
    if row["impl"] == "microtrain":
        cmd = [CPU_STEP] + common + KERNEL_ARGS + list(extra)
    else:
        cmd = [PYTHON, os.path.join(ROOT, "bench", "torch_cpu_step.py")] + common
    env = {k: v for k, v in os.environ.items() if k not in ISA_LIMITS}
    env.update(row["env"])
    load0 = os.getloadavg()[0]
    busy0, child0 = cpu_busy_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - t0
    busy1, child1 = cpu_busy_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        sys.stdout.write(p.stdout)
        os.unlink(path)
        sys.exit(f"run_cpu_bench: {' '.join(f'{k}={v}' for k, v in row['env'].items())} "
                 f"{' '.join(cmd)} failed with exit code {p.returncode}{kept_so_far()}")
    with open(path) as f:
        r = json.load(f)
    os.unlink(path)
    if row["expect"] and isa_of(r) != row["expect"]:
        limits = " ".join(f"{k}={v}" for k, v in row["env"].items()) or "no ISA limit"
        sys.exit(f"run_cpu_bench: row '{row['label']}' ({limits}) must run {row['expect']}, but "
                 f"the process reported {isa_of(r)}: its numbers would be mislabelled"
                 f"{kept_so_far()}")
    own = (child1.ru_utime - child0.ru_utime) + (child1.ru_stime - child0.ru_stime)
    # CPU time other processes used while this one ran, as a share of the machine: the noise.
    ncpu = os.cpu_count() or 1
    r["noise"] = {"foreign_cpu_share": max(0.0, (busy1 - busy0 - own) / (wall * ncpu)),
                  "loadavg_1min_before": load0, "process_wall_s": wall}
    r["row"] = row["id"]
    r["stdout"] = p.stdout
    keep(preset, B, T, tag, r)
    print(f"  {preset:10s} {row['id']:12s}{tag} ({isa_of(r)}) step "
          f"{r['step_ms']['median']:9.1f} ms  {r['gflops']:6.1f} GFLOP/s  "
          f"RSS {r['peak_rss_mib']:6.0f} MiB  (other processes used "
          f"{100 * r['noise']['foreign_cpu_share']:.0f}% of the CPU)", flush=True)
    return r


QUIET = 0.05


def summarize(runs):
    quiet = [r for r in runs if r["noise"]["foreign_cpu_share"] < QUIET]
    g = lambda key: [r[key]["median"] for r in runs]
    step = g("step_ms")
    probe = [r["probe"]["sgemm_1024_gflops"] for r in runs]
    probe_lm = [r["probe"]["sgemm_model_gflops"] for r in runs]
    copy = [r["probe"]["copy_gbps"] for r in runs]
    return {
        "isa": sorted({isa_of(r) for r in runs}),
        "step_ms": median(step), "step_ms_min": min(step), "step_ms_max": max(step),
        "forward_ms": median(g("forward_ms")), "backward_ms": median(g("backward_ms")),
        "optimizer_ms": median(g("optimizer_ms")),
        "tokens_per_s": median([r["tokens_per_s"] for r in runs]),
        "gflops": median([r["gflops"] for r in runs]),
        "sgemm_probe_gflops": median(probe), "sgemm_lm_head_probe_gflops": median(probe_lm),
        "copy_gbps": median(copy),
        "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
        "initial_loss": median([r["losses"][0] for r in runs]),
        "flops_per_step": runs[0]["flops_per_step"],
        "max_foreign_cpu_share": max(r["noise"]["foreign_cpu_share"] for r in runs),
        # Runs during which other processes used < QUIET of the CPU: the undisturbed numbers.
        "quiet_rounds": len(quiet),
        "quiet_step_ms": median([r["step_ms"]["median"] for r in quiet]) if quiet else None,
        "rounds": len(runs),
    }


def paired_ratio(runs, num, den, goal):
    """num's step / den's step, per round (the two ran in the same round), over the rounds: the
    median, its interval and the verdict on it (lockstep_stats.ratio_verdict, as cpu_lockstep.py
    reports its sandwiched steps)."""
    if num not in runs or den not in runs:
        return None
    per_round = [a["step_ms"]["median"] / b["step_ms"]["median"]
                 for a, b in zip(runs[num], runs[den])]
    return {"num": num, "den": den, "goal": goal, "per_round": per_round,
            **ratio_verdict(per_round, goal),
            "rounds_within_goal": None if goal is None else sum(x <= goal for x in per_round)}


def round_order(rows, r):
    """Round r's order: microtrain and PyTorch rows interleaved, rotated by r so that every
    row takes every position (first, after a PyTorch run, ...) as the rounds go by."""
    mt = [x for x in rows if x["impl"] == "microtrain"]
    pt = [x for x in rows if x["impl"] == "pytorch"]
    base = []
    for i in range(max(len(mt), len(pt))):
        base += mt[i:i + 1] + pt[i:i + 1]
    k = r % len(base)
    return base[k:] + base[:k]


cpu_model, cpu_family_model = cpu_identity()
# A VM's model name is often generic ("AMD EPYC"): family and model tell Zen 4 (25/17, AVX-512 on
# 256-bit pipes) from Zen 5 (26, full-width AVX-512), and so what the AVX-512 level can gain.
now = datetime.datetime.now(datetime.timezone.utc)


def git(*args):
    try:
        return subprocess.run(["git", "-C", ROOT] + list(args), capture_output=True, text=True,
                              check=True).stdout.rstrip("\n")  # porcelain lines start with a space
    except (OSError, subprocess.CalledProcessError):
        return ""


commit = git("rev-parse", "--short", "HEAD") or "unknown"
# Uncommitted edits of the code the benchmark measures (the build compiles the working tree).
dirty = git("status", "--porcelain", "--", "kernels", "model", "optim", "engine",
            "bench/cpu_step.cpp", "bench/torch_cpu_step.py")
slug = result_slug(cpu_model)
stem = os.path.join(OUT_DIR, f"cpu-{now:%Y-%m-%dT%H%M}-{slug}" + ("-smoke" if SMOKE else ""))
PARTIAL = stem + ".partial.jsonl"  # every finished process, until the report replaces it
signal.signal(signal.SIGTERM, stopped)
signal.signal(signal.SIGINT, stopped)
ROWS, SUPPORTED, AVX2_DEN, AVX2_NOTE = bench_rows()
# The ratios the goal names (issue 27): (name, numerator row, denominator row, goal or None).
RATIOS = [("AVX2 level / PyTorch limited to AVX2", "mt-avx2", AVX2_DEN, GOALS["avx2"]),
          ("AVX-512 level / PyTorch native", "mt-avx512", "pt-native", GOALS["avx512"]),
          ("baseline level / PyTorch native", "mt-baseline", "pt-native", None)]
ROUNDS_TEXT = f"{ROUNDS} round" + ("s" if ROUNDS != 1 else "")
print(f"== {cpu_model}, {os.cpu_count()} CPUs, {THREADS} threads, {ROUNDS_TEXT} per config, "
      f"rows {' '.join(x['id'] for x in ROWS)}, {WARMUP} warm-up + {STEPS} measured steps per "
      f"process; load average {os.getloadavg()[0]:.2f} at start; each finished process is "
      f"kept in {shown(PARTIAL)} until the report is written")

results = {}
for preset in CONFIGS:
    B, T = SHAPES[preset]
    runs = {x["id"]: [] for x in ROWS}
    orders = []
    for r in range(ROUNDS):
        order = round_order(ROWS, r)
        orders.append([x["id"] for x in order])
        for row in order:
            runs[row["id"]].append(run_one(row, preset, B, T, tag=f" r{r + 1}"))
    s = {rid: summarize(v) for rid, v in runs.items()}
    f0 = s["pt-native"]["flops_per_step"]
    for rid, v in s.items():
        if abs(v["flops_per_step"] - f0) > 1e-9 * f0:
            sys.exit(f"run_cpu_bench: {preset}: model FLOPs differ ({rid} {v['flops_per_step']}, "
                     f"pt-native {f0}): the rows are not the same model{kept_so_far()}")
    ratios = {name: paired_ratio(runs, num, den, goal) for name, num, den, goal in RATIOS}
    results[preset] = {"B": B, "T": T, "order": orders, "summary": s, "runs": runs,
                       "ratios": ratios}

best = ROWS[0]  # the best level measured (rows are best first)
print(f"== profile: gpt2-mini, microtrain {best['expect']}, per-op clocks on")
prof_cmd = f"MT_CPU_ISA={best['expect']} {os.path.relpath(CPU_STEP, ROOT)} --preset gpt2-mini " \
           f"-B 4 -T 256 --threads {THREADS} --warmup {WARMUP} --steps {STEPS} --profile " \
           f"{' '.join(KERNEL_ARGS)}".strip()
profile = run_one(best, "gpt2-mini", 4, 256, extra=["--profile"])
prof_text = profile["stdout"][profile["stdout"].index("  per-op profile"):]
prof_text = prof_text[:prof_text.index("  wrote ")] if "  wrote " in prof_text else prof_text

# ---- the report ---------------------------------------------------------------------------------
first = next(iter(results.values()))["runs"]
mt0 = first[ROWS[0]["id"]][0]
pt0 = first["pt-native"][0]
L = []
L.append(f"# CPU step: microtrain's ISA levels vs PyTorch eager — {now:%Y-%m-%d %H:%M} UTC\n")
L.append(f"Reproduce: `{os.environ['REPRO']}`\n")
if SMOKE:
    L.append("**Smoke run** (MT_BENCH_SMOKE): a check that the script works, on whatever the "
             "machine was doing; its numbers are not a measurement.\n")
L.append(f"- Code: commit `{commit}`" + (
    "; uncommitted changes in the measured code: " + ", ".join(
        f"`{l[3:]}`" for l in dirty.splitlines()) if dirty else ", clean working tree") + ".")
L.append(f"- Machine: {machine_text(cpu_model, cpu_family_model)}"
         f", {os.cpu_count()} CPUs (`{socket.gethostname()}`); microtrain's "
         f"ISA levels on this CPU: {', '.join(SUPPORTED)}; {THREADS} threads on both sides "
         f"(OMP_NUM_THREADS={THREADS}), fp32.")
L.append(f"- microtrain: `{os.path.relpath(CPU_STEP, ROOT)}` "
         f"(kernels: {', '.join(f'{k}={v}' for k, v in mt0['kernels'].items())}), fused AdamW, "
         "one row per level (`MT_CPU_ISA=<level>`); the level and GEMM in the table are the ones "
         "the process reported (cpu_step's JSON `cpu_isa`, `gemm_impl`). Its buffers of 2 MiB or "
         f"more: {mt0.get('huge_pages', 'not reported')} "
         + (f"({mt0['huge_pages_mib']:.0f} MiB" if mt0.get("huge_pages_mib") is not None
            else "(an unknown amount") + " of the process on huge pages after the steps; "
         "`MT_CPU_HUGE_PAGES`, kernels/huge_pages.h); PyTorch's CPU allocator asks for huge pages "
         "only with `THP_MEM_ALLOC_ENABLE=1`, which was "
         + (f"set (`{os.environ['THP_MEM_ALLOC_ENABLE']}`)" if os.environ.get("THP_MEM_ALLOC_ENABLE")
            else "not set") + " here.")
isa0 = pt0["isa"]
L.append(f"- PyTorch {pt0['torch_version']} eager (`{PYTHON}`), BLAS `{pt0['blas']}` "
         f"({'; '.join(isa0.get('build', [])) or 'build details not reported'}), "
         f"torch.optim.AdamW (foreach={pt0['adamw']['foreach']}, fused={pt0['adamw']['fused']}). "
         "The ISA column is ATen's CPU capability as the process reported it "
         "(`torch.backends.cpu.get_cpu_capability()`)."
         + (" The AVX2 row also sets " + ", ".join(f"`{k}={v}`" for k, v in TORCH_AVX2.items())
            + " (MKL's and oneDNN's limits)." if "pt-avx2" in [x["id"] for x in ROWS] else "")
         + (f" Note: {AVX2_NOTE}." if AVX2_NOTE else ""))
L.append("- Same model (nanoGPT GPT-2 with explicit causal-mask attention, GELU tanh, tied LM "
         "head), same AdamW (lr 3e-4, betas 0.9/0.95, eps 1e-8, wd 0.1 on 2-D tensors, clip 1.0), "
         "synthetic uniform tokens.")
L.append(f"- {ROUNDS_TEXT} per config; a round runs every row once, each a separate process "
         f"({WARMUP} warm-up + {STEPS} measured steps), microtrain and PyTorch rows interleaved and "
         "the order rotated by one each round (the JSON's `order`). Step time = median over rounds "
         "of each process's median step; the range is min–max of those per-process medians.")
L.append("- Ratios pair the two rows of one round (the two processes ran minutes apart at most): "
         "the median of the per-round ratios and the median's distribution-free interval with "
         "the confidence it has (with fewer than 6 rounds it is their min–max: 75 % for 3 "
         "rounds). A goal is met or missed only when all of that interval is on one side of it, "
         "else undecided at this noise: more rounds, or bench/cpu_lockstep.py (the two processes "
         "taking turns step by step), decide it.")
L.append("- Model FLOPs per step: (6 N + 6·L·C·T) × tokens, N every parameter (llm.c's "
         "count, GPT::training_flops_per_step; identical on every row, checked). GFLOP/s = that / step time; "
         "% probe = GFLOP/s / the 1024³ sgemm probe measured in the same process.")
noise = max(v["summary"][i]["max_foreign_cpu_share"] for v in results.values() for i in v["summary"])
L.append(f"- **Noise**: while a benchmark process ran, other processes used up to "
         f"{100 * noise:.0f}% of the machine's CPU (column 'other CPU' = the worst run of that "
         "row; /proc/stat busy time minus the benchmark process's own CPU time). Runs with more "
         "than 5% are disturbed — OpenMP barriers stall whenever one of the threads is "
         "descheduled — and 'step ms, quiet rounds' is the median over the undisturbed runs "
         "only.\n")

hdr = ("| config | row | ISA (reported) | step ms (min–max) | step ms, quiet rounds | forward | "
       "backward | optimizer | tokens/s | GFLOP/s | % probe | peak RSS MiB | init loss | other CPU |")
L.append(hdr)
L.append("|" + "|".join(["---"] * (hdr.count("|") - 1)) + "|")
for preset, v in results.items():
    for row in ROWS:
        s = v["summary"][row["id"]]
        r0 = v["runs"][row["id"]][0]
        isa = "/".join(s["isa"]) + (f", {r0['gemm_impl']} GEMM" if row["impl"] == "microtrain"
                                    else f", {r0['blas']}")
        L.append(f"| {preset} B{v['B']} T{v['T']} | {row['label']} | {isa} | {s['step_ms']:.1f} "
                 f"({s['step_ms_min']:.1f}–{s['step_ms_max']:.1f}) | "
                 + (f"{s['quiet_step_ms']:.1f} ({s['quiet_rounds']} of {s['rounds']})"
                    if s["quiet_rounds"] else "none") + f" | {s['forward_ms']:.1f} | "
                 f"{s['backward_ms']:.1f} | {s['optimizer_ms']:.1f} | {s['tokens_per_s']:.0f} | "
                 f"{s['gflops']:.1f} | {100 * s['gflops'] / s['sgemm_probe_gflops']:.0f}% | "
                 f"{s['peak_rss_mib']:.0f} | {s['initial_loss']:.3f} | "
                 f"{100 * s['max_foreign_cpu_share']:.0f}% |")
L.append("")
L.append("| config | ratio of step times | median over rounds (interval, confidence) | goal | "
         "verdict |")
L.append("|---|---|---|---|---|")
for preset, v in results.items():
    for name, num, den, goal in RATIOS:
        q = v["ratios"][name]
        if name.startswith("AVX2") and den == "pt-native":
            name = "AVX2 level / PyTorch native (= AVX2 here)"
        if q is None:
            L.append(f"| {preset} | {name} | not measured (no `{num}` row: MT_BENCH_LEVELS or "
                     "the CPU) | " + (f"≤ {goal:.2f}" if goal else "—") + " | — |")
            continue
        verdict = "shown (no goal)" if goal is None else (
            f"**{q['verdict']}** ({q['rounds_within_goal']} of {q['n']} rounds within)")
        L.append(f"| {preset} | {name} | {q['median']:.2f} ({q['low']:.2f}–{q['high']:.2f}, "
                 f"{100 * q['coverage']:.0f} %) | "
                 + (f"≤ {goal:.2f}" if goal else "—") + f" | {verdict} |")
L.append("")
L.append("Probes (median over the rounds, each measured in the benchmark process itself):\n")
L.append("| config | row | sgemm 1024³ GFLOP/s | sgemm LM-head shape GFLOP/s | copy GB/s (read+write) |")
L.append("|---|---|---|---|---|")
for preset, v in results.items():
    for row in ROWS:
        s = v["summary"][row["id"]]
        r0 = v["runs"][row["id"]][0]
        shp = r0["probe"]["sgemm_model_shape"]
        L.append(f"| {preset} | {row['label']} ({r0['probe']['sgemm_impl']}) | "
                 f"{s['sgemm_probe_gflops']:.1f} | {s['sgemm_lm_head_probe_gflops']:.1f} "
                 f"({shp[0]}×{shp[1]}×{shp[2]}) | {s['copy_gbps']:.1f} |")
L.append("")
L.append(f"## Per-op profile, gpt2-mini (microtrain, level `{best['expect']}`)\n\n`{prof_cmd}` — "
         f"step with per-op clocks on: {profile['step_ms']['median']:.1f} ms (median); other "
         f"processes used {100 * profile['noise']['foreign_cpu_share']:.0f}% of the CPU "
         "meanwhile.\n")
L.append("```\n" + prof_text.rstrip() + "\n```\n")
report = "\n".join(L) + "\n"

os.makedirs(OUT_DIR, exist_ok=True)
for v in results.values():
    for runs in v["runs"].values():
        for r in runs:
            r.pop("stdout", None)
profile.pop("stdout", None)
write_atomically(stem + ".json", json.dumps(
    {"date_utc": now.isoformat(), "commit": commit, "uncommitted": dirty.splitlines(),
     "reproduce": os.environ["REPRO"], "smoke": SMOKE, "cpu_model": cpu_model,
     "threads": THREADS, "rounds": ROUNDS, "supported_levels": SUPPORTED,
     "rows": ROWS, "ratio_definitions": [{"name": n, "num": a, "den": b, "goal": g}
                                         for n, a, b, g in RATIOS],
     "avx2_note": AVX2_NOTE, "configs": results, "profile_gpt2_mini": profile}, indent=1) + "\n")
write_atomically(stem + ".md", report)
os.unlink(PARTIAL)  # all of it is in the report now
print()
print(report)
print(f"wrote {shown(stem)}.md and .json")
PY
