#!/usr/bin/env bash
# microtrain's CPU training step side by side with PyTorch eager on the same CPU (issue 4).
#
#   bash bench/run_cpu_bench.sh
#
# Builds bench/cpu_step (Release, CPU backend only, in build/bench), then for each config —
# tiny (B4 T32), gpt2-mini (B4 T256), gpt2-124M (B4 T128), fp32, 2 threads — runs ROUNDS rounds,
# each round one microtrain process (build/bench/cpu_step) and one PyTorch process
# (bench/torch_cpu_step.py), alternating which goes first. Every process does 2 warm-up + 5
# measured steps and its own sgemm / copy probes. Then one profiled microtrain run of gpt2-mini
# (cpu_step --profile) gives the per-op roofline table. Writes
#   bench/results/cpu-<UTC date-time>-<cpu model>-<N>c.md   (the tables, human-readable)
#   bench/results/cpu-<UTC date-time>-<cpu model>-<N>c.json (every run's JSON + the summary)
# and prints the tables. About 6 minutes on 2 cores.
#
# Environment (all optional):
#   MT_BENCH_ROUNDS=3                     rounds per config
#   MT_BENCH_CONFIGS="tiny gpt2-mini gpt2-124M"
#   MT_BENCH_THREADS=2                    threads for both sides (OMP_NUM_THREADS too)
#   MT_BENCH_BUILD_DIR=build/bench        where cpu_step is built
#   MT_BENCH_CMAKE_ARGS="-DMT_USE_BLAS=ON"  extra configure flags (e.g. Eigen -> OpenBLAS)
#   MT_BENCH_KERNEL_ARGS="--attention flash --layernorm fused_residual --fuse-gelu"
#                                         microtrain kernel choices (default: the defaults)
#   CPU_STEP=/path/to/cpu_step            use this binary, skip the build
#   MT_BENCH_OUT=bench/results            output directory
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

THREADS=${MT_BENCH_THREADS:-2}
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
/usr/bin/python3 -c "import torch" 2>/dev/null || {
    echo "run_cpu_bench: /usr/bin/python3 cannot import torch; run: bash tools/setup.sh --torch" >&2
    exit 1
}

export OMP_NUM_THREADS=$THREADS
export CPU_STEP THREADS ROOT
exec /usr/bin/python3 - <<'PY'
import datetime, json, os, re, resource, socket, subprocess, sys, tempfile, time

ROOT = os.environ["ROOT"]
CPU_STEP = os.environ["CPU_STEP"]
THREADS = int(os.environ["THREADS"])
ROUNDS = int(os.environ.get("MT_BENCH_ROUNDS", "3"))
CONFIGS = os.environ.get("MT_BENCH_CONFIGS", "tiny gpt2-mini gpt2-124M").split()
KERNEL_ARGS = os.environ.get("MT_BENCH_KERNEL_ARGS", "").split()
OUT_DIR = os.environ.get("MT_BENCH_OUT", os.path.join(ROOT, "bench", "results"))
SHAPES = {"tiny": (4, 32), "gpt2-mini": (4, 256), "gpt2-124M": (4, 128)}
WARMUP, STEPS = 2, 5
for c in CONFIGS:
    if c not in SHAPES:
        sys.exit(f"run_cpu_bench: MT_BENCH_CONFIGS has '{c}'; expected some of {list(SHAPES)}")
if ROUNDS < 1:
    sys.exit(f"run_cpu_bench: MT_BENCH_ROUNDS must be >= 1, got {ROUNDS}")


def cpu_busy_seconds():
    """Busy CPU seconds of the whole machine so far (all cores; steal counts as busy)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]  # idle + iowait
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def run_one(impl, preset, B, T, extra=(), tag=""):
    """Runs one benchmark process; returns its JSON plus the noise measured around it."""
    fd, path = tempfile.mkstemp(prefix=f"cpu_bench_{impl}_", suffix=".json")
    os.close(fd)
    common = ["--preset", preset, "-B", str(B), "-T", str(T), "--threads", str(THREADS),
              "--warmup", str(WARMUP), "--steps", str(STEPS), "--json", path, "--probe"]
    if impl == "microtrain":
        cmd = [CPU_STEP] + common + KERNEL_ARGS + list(extra)
    else:
        cmd = ["/usr/bin/python3", os.path.join(ROOT, "bench", "torch_cpu_step.py")] + common
    load0 = os.getloadavg()[0]
    busy0, child0 = cpu_busy_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - t0
    busy1, child1 = cpu_busy_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        sys.stdout.write(p.stdout)
        os.unlink(path)
        sys.exit(f"run_cpu_bench: {' '.join(cmd)} failed with exit code {p.returncode}")
    with open(path) as f:
        r = json.load(f)
    os.unlink(path)
    own = (child1.ru_utime - child0.ru_utime) + (child1.ru_stime - child0.ru_stime)
    # CPU time other processes used while this one ran, as a share of the machine: the noise.
    ncpu = os.cpu_count() or 1
    r["noise"] = {"foreign_cpu_share": max(0.0, (busy1 - busy0 - own) / (wall * ncpu)),
                  "loadavg_1min_before": load0, "process_wall_s": wall}
    r["stdout"] = p.stdout
    print(f"  {preset:10s} {impl:10s}{tag} step {r['step_ms']['median']:9.1f} ms  "
          f"{r['gflops']:6.1f} GFLOP/s  RSS {r['peak_rss_mib']:6.0f} MiB  "
          f"(other processes used {100 * r['noise']['foreign_cpu_share']:.0f}% of the CPU)",
          flush=True)
    return r


def median(v):
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


QUIET = 0.05


def summarize(runs):
    quiet = [r for r in runs if r["noise"]["foreign_cpu_share"] < QUIET]
    g = lambda key: [r[key]["median"] for r in runs]
    step = g("step_ms")
    probe = [r["probe"]["sgemm_1024_gflops"] for r in runs]
    probe_lm = [r["probe"]["sgemm_model_gflops"] for r in runs]
    copy = [r["probe"]["copy_gbps"] for r in runs]
    return {
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


cpu_model = "unknown"
with open("/proc/cpuinfo") as f:
    for line in f:
        if line.startswith("model name"):
            cpu_model = line.split(":", 1)[1].strip()
            break
now = datetime.datetime.now(datetime.timezone.utc)


def git(*args):
    try:
        return subprocess.run(["git", "-C", ROOT] + list(args), capture_output=True, text=True,
                              check=True).stdout.rstrip("\n")  # porcelain lines start with a space
    except (OSError, subprocess.CalledProcessError):
        return ""


commit = git("rev-parse", "--short", "HEAD") or "unknown"
# Uncommitted edits of the code the benchmark measures (the build compiles the working tree).
dirty = git("status", "--porcelain", "--", "kernels", "model", "optim", "bench/cpu_step.cpp")
slug = re.sub(r"[^a-z0-9]+", "-", cpu_model.lower()).strip("-") + f"-{os.cpu_count()}c"
stem = os.path.join(OUT_DIR, f"cpu-{now:%Y-%m-%dT%H%M}-{slug}")
print(f"== {cpu_model}, {os.cpu_count()} CPUs, {THREADS} threads, {ROUNDS} rounds per config, "
      f"{WARMUP} warm-up + {STEPS} measured steps per process; load average "
      f"{os.getloadavg()[0]:.2f} at start")

results = {}
for preset in CONFIGS:
    B, T = SHAPES[preset]
    runs = {"microtrain": [], "pytorch": []}
    for r in range(ROUNDS):
        order = ["microtrain", "pytorch"] if r % 2 == 0 else ["pytorch", "microtrain"]
        for impl in order:
            runs[impl].append(run_one(impl, preset, B, T, tag=f" r{r + 1}"))
    s = {impl: summarize(v) for impl, v in runs.items()}
    fm, fp = s["microtrain"]["flops_per_step"], s["pytorch"]["flops_per_step"]
    if abs(fm - fp) > 1e-9 * fp:
        sys.exit(f"run_cpu_bench: {preset}: model FLOPs differ (microtrain {fm}, PyTorch {fp}): "
                 "the two sides are not the same model")
    results[preset] = {"B": B, "T": T, "summary": s, "runs": runs}

print("== profile: gpt2-mini, microtrain, per-op clocks on")
prof_cmd = f"{os.path.relpath(CPU_STEP, ROOT)} --preset gpt2-mini -B 4 -T 256 --threads {THREADS} " \
           f"--warmup {WARMUP} --steps {STEPS} --profile {' '.join(KERNEL_ARGS)}".strip()
profile = run_one("microtrain", "gpt2-mini", 4, 256, extra=["--profile"])
prof_text = profile["stdout"][profile["stdout"].index("  per-op profile"):]
prof_text = prof_text[:prof_text.index("  wrote ")] if "  wrote " in prof_text else prof_text

# ---- the report ---------------------------------------------------------------------------------
L = []
L.append(f"# CPU step: microtrain vs PyTorch eager — {now:%Y-%m-%d %H:%M} UTC\n")
mt0 = next(iter(results.values()))["runs"]["microtrain"][0]
pt0 = next(iter(results.values()))["runs"]["pytorch"][0]
L.append(f"- Code: commit `{commit}`" + (
    "; uncommitted changes in the measured code: " + ", ".join(
        f"`{l[3:]}`" for l in dirty.splitlines()) if dirty else ", clean working tree") + ".")
L.append(f"- Machine: {cpu_model}, {os.cpu_count()} CPUs (`{socket.gethostname()}`); "
         f"{THREADS} threads on both sides (OMP_NUM_THREADS={THREADS}), fp32.")
L.append(f"- microtrain: `{os.path.relpath(CPU_STEP, ROOT)}` "
         f"(kernels: {', '.join(f'{k}={v}' for k, v in mt0['kernels'].items())}), "
         f"fused AdamW, sgemm probe = {mt0['probe']['sgemm_impl']}.")
L.append(f"- PyTorch {pt0['torch_version']} eager, BLAS `{pt0['blas']}`, torch.optim.AdamW "
         f"(foreach={pt0['adamw']['foreach']}, not fused), sgemm probe = torch.mm (OpenBLAS).")
L.append(f"- Same model (nanoGPT GPT-2, GELU tanh, tied LM head), same AdamW (lr 3e-4, betas "
         "0.9/0.95, eps 1e-8, wd 0.1 on 2-D tensors, clip 1.0), synthetic uniform tokens.")
L.append(f"- {ROUNDS} rounds per config, microtrain and PyTorch alternating (each a separate "
         f"process: {WARMUP} warm-up + {STEPS} measured steps). Step time = median over rounds "
         "of each process's median step; the range is min–max of those per-process medians.")
L.append("- Model FLOPs per step: 6 × matmul params × tokens + 12·L·C·T × tokens (nanoGPT's "
         "estimate_mfu count; identical on both sides, checked). GFLOP/s = that / step time; "
         "% probe = GFLOP/s / the 1024³ sgemm probe measured in the same process.")
noise = max(v["summary"][i]["max_foreign_cpu_share"] for v in results.values() for i in v["summary"])
L.append(f"- **Noise**: other engineers compile on the same 2 cores. While a benchmark process "
         f"ran, other processes used up to {100 * noise:.0f}% of the machine's CPU (column "
         "'other CPU' = the worst run of that row; measured from /proc/stat minus the benchmark "
         "process's own CPU time). Runs with more than 5% are disturbed — OpenMP barriers stall "
         "whenever one of the two threads is descheduled — and 'step ms, quiet rounds' is the "
         "median over the undisturbed runs only.\n")

hdr = ("| config | impl | step ms (min–max) | step ms, quiet rounds | forward | backward | optimizer | tokens/s | "
       "GFLOP/s | sgemm probe | % probe | peak RSS MiB | init loss | other CPU |")
L.append(hdr)
L.append("|" + "|".join(["---"] * (hdr.count("|") - 1)) + "|")
ratios = {}
for preset, v in results.items():
    for impl in ("microtrain", "pytorch"):
        s = v["summary"][impl]
        L.append(f"| {preset} B{v['B']} T{v['T']} | {impl} | {s['step_ms']:.1f} "
                 f"({s['step_ms_min']:.1f}–{s['step_ms_max']:.1f}) | "
                 + (f"{s['quiet_step_ms']:.1f} ({s['quiet_rounds']} of {s['rounds']})"
                    if s["quiet_rounds"] else "none") + f" | {s['forward_ms']:.1f} | "
                 f"{s['backward_ms']:.1f} | {s['optimizer_ms']:.1f} | {s['tokens_per_s']:.0f} | "
                 f"{s['gflops']:.1f} | {s['sgemm_probe_gflops']:.1f} | "
                 f"{100 * s['gflops'] / s['sgemm_probe_gflops']:.0f}% | {s['peak_rss_mib']:.0f} | "
                 f"{s['initial_loss']:.3f} | {100 * s['max_foreign_cpu_share']:.0f}% |")
    m, p = v["summary"]["microtrain"], v["summary"]["pytorch"]
    ratios[preset] = m["step_ms"] / p["step_ms"]
L.append("")
L.append("| config | microtrain / PyTorch step time | target ≤ 0.5 | microtrain % of the best sgemm "
         "probe, any side, any shape (target ≥ 75%) | RSS microtrain / PyTorch (target ≤ 1) |")
L.append("|---|---|---|---|---|")
for preset, v in results.items():
    m, p = v["summary"]["microtrain"], v["summary"]["pytorch"]
    # The strictest reference: the fastest of the four GEMM probes (1024³ and the LM-head shape,
    # microtrain's GEMM and torch.mm) measured in this config's runs.
    best = max(m["sgemm_probe_gflops"], p["sgemm_probe_gflops"],
               m["sgemm_lm_head_probe_gflops"], p["sgemm_lm_head_probe_gflops"])
    r = ratios[preset]
    speed = f"{1 / r:.2f}× faster" if r < 1 else f"{r:.2f}× slower"
    qm, qp = m["quiet_step_ms"], p["quiet_step_ms"]
    quiet = f"; quiet rounds only: {qm / qp:.2f}" if qm and qp else ""
    L.append(f"| {preset} | {r:.2f} ({speed}{quiet}) | {'met' if r <= 0.5 else 'missed'} | "
             f"{100 * m['gflops'] / best:.0f}% of {best:.0f} GFLOP/s | "
             f"{m['peak_rss_mib'] / p['peak_rss_mib']:.2f} |")
L.append("")
L.append("Probes (median over the rounds, each measured in the benchmark process itself):\n")
L.append("| config | impl | sgemm 1024³ GFLOP/s | sgemm LM-head shape GFLOP/s | copy GB/s (read+write) |")
L.append("|---|---|---|---|---|")
for preset, v in results.items():
    for impl in ("microtrain", "pytorch"):
        s = v["summary"][impl]
        shp = v["runs"][impl][0]["probe"]["sgemm_model_shape"]
        L.append(f"| {preset} | {impl} | {s['sgemm_probe_gflops']:.1f} | "
                 f"{s['sgemm_lm_head_probe_gflops']:.1f} ({shp[0]}×{shp[1]}×{shp[2]}) | "
                 f"{s['copy_gbps']:.1f} |")
L.append("")
L.append(f"## Per-op profile, gpt2-mini (microtrain)\n\n`{prof_cmd}` — step with per-op clocks "
         f"on: {profile['step_ms']['median']:.1f} ms (median); other processes used "
         f"{100 * profile['noise']['foreign_cpu_share']:.0f}% of the CPU meanwhile.\n")
L.append("```\n" + prof_text.rstrip() + "\n```\n")
report = "\n".join(L) + "\n"

os.makedirs(OUT_DIR, exist_ok=True)
def write_atomically(path, text):
    fd, tmp = tempfile.mkstemp(prefix=".cpu_bench.", dir=os.path.dirname(path))
    with os.fdopen(fd, "w") as f:
        f.write(text); f.flush(); os.fsync(f.fileno())
    os.replace(tmp, path)
for v in results.values():
    for runs in v["runs"].values():
        for r in runs:
            r.pop("stdout", None)
profile.pop("stdout", None)
write_atomically(stem + ".json", json.dumps(
    {"date_utc": now.isoformat(), "commit": commit, "uncommitted": dirty.splitlines(),
     "cpu_model": cpu_model, "threads": THREADS, "rounds": ROUNDS,
     "configs": results, "ratios": ratios, "profile_gpt2_mini": profile}, indent=1) + "\n")
write_atomically(stem + ".md", report)
print()
print(report)
print(f"wrote {os.path.relpath(stem, ROOT)}.md and .json")
PY
