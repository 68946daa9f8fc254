#!/usr/bin/env python3
"""The tables of docs/labs.md, regenerated from real runs: every figure quoted from results.json.

    python3 tools/lab_tables.py run  OUT [--build build/release] [--labs a,b]   # run the CPU labs
    python3 tools/lab_tables.py write OUT [--doc docs/labs.md]                  # rewrite the tables

`run` runs each CPU lab (configs/labs/<lab>.yaml; data_parallel under `mpirun -np 2`) into
OUT/<lab>/ and notes the machine. `write` replaces each block of docs/labs.md between
`<!-- lab-table: <lab> -->` and `<!-- /lab-table -->` with the table of that lab's run, headed by
where and when it was measured and how the figures are taken (medians over the measured steps,
their p10-p90 spread, the time call's 95 % interval over the interleaved rounds). A lab whose run
is missing keeps its block as it is, and `write` says so. Prose in docs/labs.md points at the
tables rather than restating their numbers, so a rerun keeps the page true.
"""
import argparse
import glob
import json
import os
import platform
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_LABS = ["kernel_ladder", "layernorm", "data_bound", "data_cache", "shape_jitter", "optimizer", "finetune",
            "int8_frozen", "host_sync", "noisy_machine", "data_parallel"]
MIB = 1024.0 * 1024.0
# Labs whose model.init_from names a base to train first: the train config and its run directory
# (relative to the repository root, where the lab's init_from points).
BASES = {"finetune": ("finetune_base.yaml", "runs/lab-finetune-base-train")}


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run_labs(out, build, labs):
    binary = os.path.join(build, "microtrain")
    os.makedirs(out, exist_ok=True)
    machine = {"cpu": cpu_name(), "cores": os.cpu_count(),
               "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
               "load_before": open("/proc/loadavg").read().split()[:3]}
    for lab in labs:
        # A lab that starts from trained weights (model.init_from) trains its base first, once.
        if lab in BASES and not os.path.isdir(os.path.join(ROOT, BASES[lab][1])):
            base = [binary, "train", os.path.join(ROOT, "configs", "labs", BASES[lab][0]),
                    "--out-dir", os.path.join(ROOT, BASES[lab][1])]
            with open(os.path.join(out, lab + "_base.log"), "w") as log:
                rc = subprocess.call(base, stdout=log, stderr=subprocess.STDOUT)
            print(f"{lab}: its base ({BASES[lab][0]}): exit {rc}", flush=True)
        cfg = os.path.join(ROOT, "configs", "labs", lab + ".yaml")
        folder = os.path.join(out, lab)
        cmd = [binary, "run", cfg, "--set", "report.out_dir=" + folder]
        if lab == "data_parallel":
            cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"] + cmd
        t0 = time.time()
        with open(os.path.join(out, lab + ".log"), "w") as log:
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
        print(f"{lab}: exit {rc} in {time.time() - t0:.0f} s", flush=True)
    machine["load_after"] = open("/proc/loadavg").read().split()[:3]
    with open(os.path.join(out, "machine.json"), "w") as f:
        json.dump(machine, f, indent=1)


# ---- figures from one variant ------------------------------------------------------------------

def step_ms(v):
    s = v["stats"]["step_ms"]
    return f"{s['median']:.1f} ({s['p10']:.1f}–{s['p90']:.1f})"


def phase_median(v, phase):
    return v["stats"]["phases_ms"][phase]["median"]


def time_call(row):
    if row is None or row.get("is_baseline"):
        return "baseline"
    ci = row.get("speedup_ci95")
    call = row.get("time_call") or "–"
    if not ci:
        return call
    return f"{call} [{ci[0]:.2f}–{ci[1]:.2f}]"


def verdict(row):
    if row is None or row.get("is_baseline"):
        return "baseline"
    return row.get("verdict", "")


def mib(x):
    return f"{x / MIB:.1f}"


def kernel(v, name):
    for k in v.get("kernels", []):
        if k["name"] == name:
            return k
    return None


def gemm_cell(v, name):
    k = kernel(v, name)
    if not k:
        return "–"
    return f"{k['gflops_per_s']:.1f} ({k['pct_of_roofline']:.0f} %)"


def epoch_data_ms(v, first_epoch_steps):
    """The median data phase of the first epoch's steps (0 .. first_epoch_steps - 1, warm-up
    included) and of the later ones."""
    med = lambda x: sorted(x)[len(x) // 2] if x else float("nan")
    head = [s["phases_ms"]["data"] for s in v["steps"] if s["step"] < first_epoch_steps]
    tail = [s["phases_ms"]["data"] for s in v["steps"] if s["step"] >= first_epoch_steps]
    return med(head), med(tail)


# ---- the columns of each lab -------------------------------------------------------------------
# Every table starts with the variant and its median step (p10–p90) and ends with the time call and
# the verdict; these are the lab's own columns between them: (header, function(variant, row)).

EXTRA = {
    "kernel_ladder": [
        ("matmul_forward GFLOP/s (% of roofline)", lambda v, r: gemm_cell(v, "matmul_forward")),
        ("matmul_backward GFLOP/s (% of roofline)", lambda v, r: gemm_cell(v, "matmul_backward")),
    ],
    "layernorm": [
        ("layernorm_forward ms/step", lambda v, r: f"{kernel(v, 'layernorm_forward')['ms_per_step']:.3f}"
         if kernel(v, "layernorm_forward") else "–"),
        ("layernorm_forward GB/s", lambda v, r: f"{kernel(v, 'layernorm_forward')['gb_per_s']:.1f}"
         if kernel(v, "layernorm_forward") else "–"),
    ],
    "data_bound": [
        ("data ms (median)", lambda v, r: f"{phase_median(v, 'data'):.2f}"),
        ("samples/s", lambda v, r: f"{v['stats']['samples_per_s']:.1f}"),
    ],
    "data_cache": [  # 54 windows, 8 per batch: the first epoch is steps 0-6
        ("data ms, steps 0–6 (first epoch)", lambda v, r: f"{epoch_data_ms(v, 7)[0]:.3f}"),
        ("data ms, steps 7+", lambda v, r: f"{epoch_data_ms(v, 7)[1]:.3f}"),
        ("samples/s", lambda v, r: f"{v['stats']['samples_per_s']:.1f}"),
        ("tracked `data` bytes", lambda v, r: f"{v['memory']['tracked_peak']['data']:,}"),
        ("final loss", lambda v, r: f"{v['loss']['final']:.4f}"),
    ],
    "shape_jitter": [
        ("tokens/s", lambda v, r: f"{v['stats']['tokens_per_s']:.0f}"),
        ("final loss", lambda v, r: f"{v['loss']['final']:.4f}"),
    ],
    "optimizer": [
        ("optimizer ms (median)", lambda v, r: f"{phase_median(v, 'optimizer'):.2f}"),
        ("optimizer share of the median step",
         lambda v, r: f"{100 * phase_median(v, 'optimizer') / v['stats']['step_ms']['median']:.0f} %"),
        ("tracked peak MiB", lambda v, r: mib(v["memory"]["tracked_peak_total"])),
    ],
    "finetune": [
        ("backward ms", lambda v, r: f"{phase_median(v, 'backward'):.1f}"),
        ("optimizer ms", lambda v, r: f"{phase_median(v, 'optimizer'):.2f}"),
        ("GFLOP/step", lambda v, r: f"{v['flops']['per_step'] / 1e9:.2f}"),
        ("params / grads / optimizer MiB", lambda v, r: " / ".join(
            mib(v["memory"]["tracked_peak"][k]) for k in ("params", "grads", "optimizer"))),
        ("first loss", lambda v, r: f"{v['loss']['first']:.4f}"),
        ("mean loss", lambda v, r: f"{v['loss']['mean_measured']:.4f}"),
        ("final loss", lambda v, r: f"{v['loss']['final']:.4f}"),
    ],
    "int8_frozen": [
        ("params MiB", lambda v, r: mib(v["memory"]["tracked_peak"]["params"])),
        ("matmul (fp32 / int8) forward ms/step", lambda v, r: " / ".join(
            f"{kernel(v, n)['ms_per_step']:.1f}" if kernel(v, n) else "–"
            for n in ("matmul_forward", "matmul_int8_forward"))),
        ("tracked MiB", lambda v, r: mib(v["memory"]["tracked_peak_total"])),
        ("final loss", lambda v, r: f"{v['loss']['final']:.4f}"),
    ],
    "host_sync": [
        ("host syncs/step", lambda v, r: f"{v['stats']['host_syncs']:.0f}"
         if not isinstance(v['stats']['host_syncs'], dict) else
         f"{v['stats']['host_syncs'].get('median', 0):.0f}"),
        ("final loss", lambda v, r: f"{v['loss']['final']:.10f}"),
    ],
    "noisy_machine": [],
    "data_parallel": [
        ("comm exposed ms (median)", lambda v, r: f"{phase_median(v, 'comm'):.1f}"),
        ("simulated link Gbit/s", lambda v, r: f"{(v.get('data_parallel') or {}).get('simulated_link_gbps', 0):.3g}"),
        ("samples/s", lambda v, r: f"{v['stats']['samples_per_s']:.1f}"),
        ("tracked MiB", lambda v, r: mib(v["memory"]["tracked_peak_total"])),
    ],
}


def lab_table(lab, results, machine):
    rows = {r["variant"]: r for r in results["comparison"]["variants"]}
    extra = EXTRA.get(lab, [])
    head = ["variant", "step ms, median (p10–p90)"] + [h for h, _ in extra] + \
        ["time call [95 % CI]", "verdict"]
    lines = ["| " + " | ".join(head) + " |",
             "|---|" + "---:|" * (1 + len(extra)) + "---|---|"]
    for v in results["variants"]:
        if v.get("status") != "ok":
            lines.append(f"| `{v['name']}` | {v.get('status')}: {v.get('message', '')} |")
            continue
        r = rows.get(v["name"])
        cells = [f"`{v['name']}`", step_ms(v)] + [fn(v, r) for _, fn in extra] + \
            [time_call(r), verdict(r).replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    env = results["environment"]
    rounds = results["experiment"].get("rounds", 1)
    caption = (f"*Measured {machine.get('date', results.get('started_utc', ''))} on "
               f"{machine.get('cpu', 'a CPU')}, {env.get('hardware_threads')} hardware threads "
               f"(load average before {' '.join(machine.get('load_before', []))}), microtrain "
               f"{env.get('git_commit', '')[:7]}; {rounds} interleaved round"
               f"{'s' if rounds != 1 else ''}. Regenerate: `python3 tools/lab_tables.py run OUT "
               f"--labs {lab} && python3 tools/lab_tables.py write OUT`.*")
    return "\n".join(lines) + "\n\n" + caption


def write_tables(out, doc):
    machine = {}
    mpath = os.path.join(out, "machine.json")
    if os.path.exists(mpath):
        machine = json.load(open(mpath))
    text = open(doc).read()
    pattern = re.compile(r"(<!-- lab-table: (\w+) -->\n)(.*?)(<!-- /lab-table -->)", re.S)

    def replace(m):
        lab = m.group(2)
        found = glob.glob(os.path.join(out, lab, "*", "results.json"))
        if not found:
            print(f"{lab}: no run in {out}: its table is left as it is", file=sys.stderr)
            return m.group(0)
        results = json.load(open(sorted(found)[-1]))
        return m.group(1) + lab_table(lab, results, machine) + "\n" + m.group(4)

    new = pattern.sub(replace, text)
    tmp = doc + ".tmp"
    with open(tmp, "w") as f:
        f.write(new)
    os.replace(tmp, doc)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["run", "write"])
    ap.add_argument("out")
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--labs", default=",".join(CPU_LABS))
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "labs.md"))
    a = ap.parse_args()
    if a.action == "run":
        run_labs(a.out, a.build, [x for x in a.labs.split(",") if x])
    else:
        write_tables(a.out, a.doc)


if __name__ == "__main__":
    main()
