#!/usr/bin/env python3
"""Per-op thread scaling of the CPU step, from one run of bench/thread_scaling.yaml.

    python3 bench/thread_scaling.py run MICROTRAIN OUT   # runs the experiment into OUT, prints the table
    python3 bench/thread_scaling.py table RESULTS_JSON   # the table of an earlier run

For each op of the per-op profile: ms per step at 1 and at 2 threads (the medians the report's
Kernels table holds, over the measured steps), the speedup 1t/2t, and its share of the 2-thread
step. An op near 2.0x scales; near 1.0x it runs serially (or is bound by one resource both threads
share: memory bandwidth); the "lost" column is what it costs the 2-thread step against perfect
scaling (ms at 2 threads - ms at 1 thread / 2). The step's own speedup is the ratio of the two
variants' median steps.
"""
import glob
import json
import os
import subprocess
import sys


def table(results_path):
    with open(results_path) as f:
        res = json.load(f)
    by_name = {v["name"]: v for v in res["variants"]}
    one, two = by_name["threads-1"], by_name["threads-2"]
    ops1 = {k["name"]: k for k in one["kernels"]}
    ops2 = {k["name"]: k for k in two["kernels"]}
    step1 = one["stats"]["step_ms"]["median"]
    step2 = two["stats"]["step_ms"]["median"]
    rows = []
    for name, k1 in ops1.items():
        k2 = ops2.get(name)
        if not k2:
            continue
        a, b = k1["ms_per_step"], k2["ms_per_step"]
        rows.append((b - a / 2, name, a, b))
    rows.sort(reverse=True)
    out = [f"step: {step1:.1f} ms at 1 thread, {step2:.1f} ms at 2 threads: {step1 / step2:.2f}x "
           f"(medians; {results_path})", "",
           "| op | ms/step 1t | ms/step 2t | speedup | lost vs 2x (ms) | % of 2t step |",
           "|---|---:|---:|---:|---:|---:|"]
    for lost, name, a, b in rows:
        out.append(f"| {name} | {a:.2f} | {b:.2f} | {a / b if b > 0 else 0:.2f} | {lost:.2f} | "
                   f"{100 * b / step2:.1f} |")
    covered1 = sum(r[2] for r in rows)
    covered2 = sum(r[3] for r in rows)
    out.append(f"| (not in an op: framework, the loop) | {step1 - covered1:.2f} | "
               f"{step2 - covered2:.2f} | | {(step2 - covered2) - (step1 - covered1) / 2:.2f} | |")
    return "\n".join(out)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "run":
        binary, out = sys.argv[2], sys.argv[3]
        cfg = os.path.join(os.path.dirname(os.path.abspath(__file__)), "thread_scaling.yaml")
        subprocess.check_call([binary, "run", cfg, "--out-dir", out, "-q"])
        path = sorted(glob.glob(os.path.join(out, "*", "results.json")))[-1]
    elif len(sys.argv) == 3 and sys.argv[1] == "table":
        path = sys.argv[2]
    else:
        sys.exit(__doc__)
    print(table(path))


if __name__ == "__main__":
    main()
