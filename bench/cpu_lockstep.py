#!/usr/bin/env python3
"""microtrain against PyTorch on the CPU, the two processes taking turns step by step.

    MT_BENCH_PYTHON=/work/pyenv/bin/python python3 bench/cpu_lockstep.py      # issue 27's ratios
    python3 bench/cpu_lockstep.py --peer microtrain --preset tiny --steps 6   # the protocol alone

Why: bench/run_cpu_bench.sh runs one process after the other. On a shared VM (this project's
machines) the speed of the whole machine moves by 10-20 % from minute to minute, so a ratio of
two processes measured a minute apart carries the machine's move, not only the code's. Here both
processes live at once and take turns (bench/turns.py: one byte through a FIFO before and after
each step, and a settle pause so the idle side's threads are asleep), so every step of one side
runs between two steps of the other, a fraction of a second apart, and is compared with their
mean (bench/lockstep_stats.py: the sandwich ratio, the median with its 95 % interval, the goal
judged on the interval: met, missed, or undecided at this noise). What pairing cannot remove:
the two programs slow down differently on a host whose memory bus other tenants load (PyTorch
more than microtrain here), so the report also gives the ratio in the less and the more loaded
half of the steps, and the machine's DRAM copy rate and sgemm rate (cpu_step's probes) before
and after each comparison.

Comparisons, each a pair of processes (microtrain first; the ISA variables cleared for both but
for their own): the `avx2` level against PyTorch limited to AVX2 (MKL_ENABLE_INSTRUCTIONS=AVX2
ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2; issue 27's goal <= 0.50) and, where the CPU has
AVX-512, the `avx512` level against PyTorch native (<= 0.40). Each process checks what it ran
(cpu_step's `cpu_isa`, PyTorch's ATen capability); a mislabelled run stops the script.
`--peer microtrain` pairs two cpu_step processes at the same level instead, the best one or each
of --levels (no PyTorch: an A/A check of the method, where a ratio near 1 is what it should show,
and the protocol's own test, ctest cpu_lockstep_protocol).

Output: a table on stdout and, with --out-dir, cpu-lockstep-<UTC>-<cpu>-<N>c.md and .json
(every step of both sides, their spans, the ratios), written atomically after every comparison:
a run that fails or is interrupted (Ctrl-C or SIGTERM stops both processes of the pair) keeps
the comparisons it finished, and the report says how many of how many those are.
"""

import argparse
import datetime
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lockstep_stats as stats  # noqa: E402
from cpu_bench_common import (GOALS, ISA_LIMITS, TORCH_AVX2, cpu_identity, isa_of,  # noqa: E402
                              levels_cpu_step_runs, machine_text, result_slug,
                              write_atomically)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu-step", default=os.environ.get(
        "CPU_STEP", os.path.join(ROOT, "build", "release", "cpu_step")))
    ap.add_argument("--python", default=os.environ.get("MT_BENCH_PYTHON", "/usr/bin/python3"),
                    help="the interpreter with PyTorch")
    ap.add_argument("--peer", choices=("pytorch", "microtrain"), default="pytorch")
    ap.add_argument("--preset", default="gpt2-mini")
    ap.add_argument("-B", "--batch", type=int, default=4)
    ap.add_argument("-T", "--seq-len", type=int, default=0, help="default: the preset's max")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=21, help="measured steps per side")
    ap.add_argument("--settle-ms", type=int, default=100)
    ap.add_argument("--levels", default="", help="microtrain levels to compare (default: avx2, "
                    "and avx512 where the CPU runs it)")
    ap.add_argument("--out-dir", default="", help="write the .md and .json report here")
    a = ap.parse_args()
    if a.steps < 3:
        ap.error("--steps must be >= 3 (a ratio needs a step of the peer on both sides)")
    if a.warmup < 0 or a.threads < 1 or not 0 <= a.settle_ms <= 10000:
        ap.error("--warmup >= 0, --threads >= 1 and --settle-ms in [0, 10000]")
    if not os.access(a.cpu_step, os.X_OK):
        ap.error(f"--cpu-step {a.cpu_step}: not an executable (build it: cmake --build --preset "
                 f"release --target cpu_step, or set CPU_STEP)")
    return a


def comparisons(a):
    """(name, microtrain level, peer side (label, env, expected ISA), goal) to run."""
    levels = levels_cpu_step_runs(a.cpu_step, "cpu_lockstep")
    default = levels[:1] if a.peer == "microtrain" else [
        lv for lv in ("avx2", "avx512") if lv in levels]
    wanted = a.levels.split() or default
    out = []
    for lv in wanted:
        if lv not in levels:
            sys.exit(f"cpu_lockstep: --levels has '{lv}'; this CPU runs {' '.join(levels)}")
        if a.peer == "microtrain":  # A/A: the same level on both sides
            out.append((f"`{lv}` / `{lv}`", lv, (f"microtrain `{lv}`", {"MT_CPU_ISA": lv}, lv),
                        None))
            continue
        if lv == "avx2" and "avx512" in levels:
            peer = ("PyTorch limited to AVX2", dict(TORCH_AVX2), "AVX2")
        elif lv == "avx2":
            peer = ("PyTorch native (AVX2 on this CPU)", {}, "AVX2")
        else:
            peer = ("PyTorch native", {}, None)
        out.append((f"`{lv}` level / {peer[0]}", lv, peer, GOALS.get(lv)))
    return out


def side_command(a, impl, json_path, turn_in, turn_out):
    common = ["--preset", a.preset, "-B", str(a.batch), "--threads", str(a.threads),
              "--warmup", str(a.warmup), "--steps", str(a.steps), "--json", json_path,
              "--turn-in", turn_in, "--turn-out", turn_out, "--turn-settle-ms", str(a.settle_ms)]
    if a.seq_len:
        common += ["-T", str(a.seq_len)]
    if impl == "microtrain":
        return [a.cpu_step] + common
    return [a.python, os.path.join(ROOT, "bench", "torch_cpu_step.py")] + common


def run_pair(a, name, level, peer, tmp):
    """Both processes at once, taking turns; returns (ours, theirs) JSON."""
    fifo_ours, fifo_theirs = os.path.join(tmp, "turn-ours"), os.path.join(tmp, "turn-theirs")
    for f in (fifo_ours, fifo_theirs):
        if os.path.exists(f):
            os.unlink(f)
        os.mkfifo(f)
    base_env = {k: v for k, v in os.environ.items() if k not in ISA_LIMITS}
    peer_impl = "microtrain" if a.peer == "microtrain" else "pytorch"
    sides = [("ours", "microtrain", {"MT_CPU_ISA": level}, fifo_ours, fifo_theirs, level),
             ("theirs", peer_impl, peer[1], fifo_theirs, fifo_ours, peer[2])]
    procs = []
    for tag, impl, env_extra, fin, fout, _ in sides:
        env = dict(base_env, **env_extra)
        log = open(os.path.join(tmp, f"{tag}.log"), "w")
        cmd = side_command(a, impl, os.path.join(tmp, f"{tag}.json"), fin, fout)
        procs.append((tag, subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True),
                      log, cmd))
    # The first turn is ours: one byte into our FIFO (read-write open: never blocks).
    first = os.open(fifo_ours, os.O_RDWR)
    os.write(first, b"t")
    limit = 120 + (a.warmup + a.steps) * 2 * 60  # a minute a step is far beyond any real step
    deadline = time.monotonic() + limit
    failed = None
    try:
        while not failed:
            for tag, p, _, _ in procs:
                if p.poll() not in (None, 0):
                    failed = (tag, f"exit code {p.returncode}")
            if failed or all(p.poll() == 0 for _, p, _, _ in procs):
                break
            if time.monotonic() > deadline:
                failed = ("both", f"still running after {limit} s")
            time.sleep(0.2)
    finally:  # also on Ctrl-C: the sides run in sessions of their own, which it does not reach
        os.close(first)
        for tag, p, log, _ in procs:
            if p.poll() is None:  # its peer died (or we stop): it would wait for a turn forever
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            log.close()
    if failed:
        tails = []
        for tag, p, _, cmd in procs:
            with open(os.path.join(tmp, f"{tag}.log")) as f:
                tail = "".join(f.readlines()[-8:])
            tails.append(f"--- {tag}: {' '.join(cmd)} (exit {p.returncode})\n{tail}")
        sys.exit(f"cpu_lockstep: {name}: {failed[0]} failed ({failed[1]})\n" + "\n".join(tails))
    out = []
    for tag, impl, env_extra, _, _, expect in sides:
        with open(os.path.join(tmp, f"{tag}.json")) as f:
            r = json.load(f)
        if expect and isa_of(r) != expect:
            limits = " ".join(f"{k}={v}" for k, v in env_extra.items()) or "no ISA limit"
            sys.exit(f"cpu_lockstep: {name}: the {tag} side ({limits}) must run {expect}, but "
                     f"reported {isa_of(r)}: its numbers would be mislabelled")
        out.append(r)
    return out


def machine_witness(a, tmp):
    """The machine's state now, from cpu_step's probes on the tiny model (about 2 s): DRAM copy
    GB/s (read + write) and the 1024^3 sgemm GFLOP/s. A host whose memory other tenants load
    shows it in the copy rate first; both programs slow down then, not always alike."""
    path = os.path.join(tmp, "witness.json")
    p = subprocess.run([a.cpu_step, "--preset", "tiny", "--warmup", "0", "--steps", "1",
                        "--threads", str(a.threads), "--probe", "--json", path],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return None
    with open(path) as f:
        probe = json.load(f).get("probe", {})
    return {"copy_gbps": probe.get("copy_gbps"), "sgemm_gflops": probe.get("sgemm_1024_gflops")}


def measured(r):
    """(spans, step ms) of the measured steps: the spans after the warm-up ones."""
    spans = r["step_spans_ms"][r["warmup"]:]
    ms = r["step_ms"]["all"]
    if len(spans) != len(ms):
        sys.exit(f"cpu_lockstep: {r['impl']} recorded {len(spans)} measured spans for "
                 f"{len(ms)} measured steps")
    return spans, ms


def witness_text(before, after):
    def one(w):
        if not w or w.get("copy_gbps") is None:
            return "unknown"
        return f"DRAM copy {w['copy_gbps']:.1f} GB/s, sgemm {w['sgemm_gflops']:.0f} GFLOP/s"
    return f"{one(before)} before, {one(after)} after"


def report_text(a, machine, stamp, commit, cmd, rows, records, total):
    """The markdown report of the comparisons done so far (`total` were asked for)."""
    md = [f"# CPU lockstep comparison {stamp}Z", "",
          f"`{cmd}` at commit `{commit}`; {machine}, {os.cpu_count()} CPUs; {a.preset} B{a.batch} "
          f"T{records[0]['ours']['T']}, fp32, {a.threads} threads; {a.warmup} warm-up + {a.steps} measured "
          f"steps per side, the two processes taking turns (settle {a.settle_ms} ms).", ""]
    if len(rows) < total:
        md += [f"**{len(rows)} of the {total} comparisons asked for.** The run stopped (it failed "
               "or was interrupted) during the next one, or is still running it; the rows below "
               "were measured in full.", ""]
    md += ["| comparison | microtrain ms | peer ms | ratio (median of sandwiched steps) | 95 % "
           "interval | min–max | steps | goal | verdict | ratio, less / more loaded half |",
           "|---|---:|---:|---:|---|---|---:|---|---|---|"]
    for r in rows:
        goal = "—" if r["goal"] is None else f"≤ {r['goal']:.2f}"
        md.append(f"| {r['comparison']} | {r['ours_ms']:.1f} | {r['theirs_ms']:.1f} | "
                  f"{r['ratio']:.3f} | {r['ci'][0]:.3f}–{r['ci'][1]:.3f} "
                  f"({100 * r['ci_coverage']:.1f} %) | {r['ratio_min']:.3f}–{r['ratio_max']:.3f} | "
                  f"{r['pairs']} | {goal} | {r['verdict']} | " +
                  ("—" if not r["load_halves"] else
                   f"{r['load_halves']['less_loaded']:.3f} / {r['load_halves']['more_loaded']:.3f}")
                  + " |")
    md += [""] + [f"The machine around {r['comparison']}: "
                  f"{witness_text(r['witness']['before'], r['witness']['after'])} (cpu_step's "
                  f"probes on the tiny model)." for r in rows]
    md += ["", "Each step of microtrain ran between two of the peer's and is divided by their mean "
           "(the drift of the machine over seconds cancels); the interval is the median's "
           "distribution-free 95 % interval; a goal is met or missed only when all of the "
           "interval is on one side. The last column splits the steps by the load around them "
           "(the mean time of microtrain's two neighbouring steps): where the halves differ, "
           "the ratio depends on how loaded the machine was, and a busy machine's ratio is not "
           "a quiet one's (bench/lockstep_stats.py). A whole run on a loaded host moves both "
           "sides at once, which the halves cannot see: the probes before and after say what "
           "state the machine was in."]
    return "\n".join(md) + "\n"


def stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt  # a killed run (a job's time limit) ends as Ctrl-C does


def main():
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    a = parse_args()
    model, family_model = cpu_identity()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H%M")
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    cmd = shlex.join(sys.argv)  # quoted: a --levels list reproduces as one argument
    base = os.path.join(a.out_dir, f"cpu-lockstep-{stamp}-{result_slug(model)}") if a.out_dir \
        else None
    machine = machine_text(model, family_model)  # the slug keeps the bare model name
    todo = comparisons(a)
    rows, records = [], []
    tmp = tempfile.mkdtemp(prefix="cpu_lockstep_")
    try:
        for name, level, peer, goal in todo:
            print(f"cpu_lockstep: {name}, {a.preset} B{a.batch} T{a.seq_len or 'max'}, {a.threads} threads, "
                  f"{a.warmup} warm-up + {a.steps} steps each, taking turns", flush=True)
            before = machine_witness(a, tmp)
            ours, theirs = run_pair(a, name, level, peer, tmp)
            after = machine_witness(a, tmp)
            (o_spans, o_ms), (t_spans, t_ms) = measured(ours), measured(theirs)
            try:
                indexed = stats.sandwiches(o_spans, o_ms, t_spans, t_ms)
            except ValueError as e:
                sys.exit(f"cpu_lockstep: {name}: {e}")
            ratios = [r for _, r in indexed]
            halves = stats.load_halves(o_ms, indexed)
            if not ratios:
                sys.exit(f"cpu_lockstep: {name}: no step of ours lies between two of the peer's")
            q = stats.ratio_verdict(ratios, goal)
            low, high, cover = q["low"], q["high"], q["coverage"]
            row = {"comparison": name, "level": level, "peer": peer[0], "goal": goal,
                   "ours_ms": stats.median(o_ms), "theirs_ms": stats.median(t_ms),
                   "ratio": q["median"], "ci": [low, high], "ci_coverage": cover,
                   "ratio_min": q["min"], "ratio_max": q["max"], "pairs": q["n"],
                   "verdict": q["verdict"],
                   "load_halves": None if halves is None else
                   {"less_loaded": halves[0], "more_loaded": halves[1], "steps_each": halves[2]},
                   "witness": {"before": before, "after": after}}
            rows.append(row)
            records.append({"row": row, "ratios": ratios, "ours": ours, "theirs": theirs})
            print(f"  ours {row['ours_ms']:.1f} ms, theirs {row['theirs_ms']:.1f} ms (medians); "
                  f"ratio {row['ratio']:.3f}, {100 * cover:.0f} % interval "
                  f"[{low:.3f}, {high:.3f}], min-max {row['ratio_min']:.3f}-{row['ratio_max']:.3f} "
                  f"over {len(ratios)} sandwiched steps; goal "
                  f"{'none' if goal is None else f'<= {goal:.2f}'}: {row['verdict']}", flush=True)
            if halves:
                print(f"  the ratio in the less loaded half of the steps {halves[0]:.3f}, in the "
                      f"more loaded half {halves[1]:.3f} ({halves[2]} steps each)", flush=True)
            print(f"  the machine: {witness_text(before, after)}", flush=True)
            if base:  # after every comparison: what was measured survives a later failure
                os.makedirs(a.out_dir, exist_ok=True)
                write_atomically(base + ".md", report_text(a, machine, stamp, commit, cmd, rows,
                                                           records, len(todo)))
                write_atomically(base + ".json", json.dumps(
                    {"date_utc": stamp, "commit": commit, "command": cmd, "cpu_model": model,
                     "cpu_family_model": family_model, "args": vars(a),
                     "comparisons_asked": len(todo), "comparisons": records},
                    indent=1) + "\n")
    except KeyboardInterrupt:
        kept = f"; {base}.md and .json hold the {len(rows)} finished" if rows and base else ""
        where = (f"during comparison {len(rows) + 1} of {len(todo)}" if len(rows) < len(todo)
                 else "after the last comparison")
        sys.exit(f"cpu_lockstep: interrupted {where}{kept}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print("\n" + report_text(a, machine, stamp, commit, cmd, rows, records, len(todo)))
    if base:
        print(f"cpu_lockstep: wrote {base}.md and .json")

if __name__ == "__main__":
    main()
