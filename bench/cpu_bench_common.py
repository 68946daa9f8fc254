"""What the two CPU benchmarks against PyTorch (bench/run_cpu_bench.sh, bench/cpu_lockstep.py)
share, defined once: the environment variables that limit an ISA, PyTorch's AVX2 limit, issue
27's goals, the levels cpu_step runs here, the ISA a benchmark process says it ran, the CPU's
name for the report and its file names, and the atomic write of a report."""

import os
import re
import subprocess
import sys
import tempfile

# The variables that limit an ISA: cleared for every process, set only where a row asks.
ISA_LIMITS = ("MT_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")
# PyTorch limited to AVX2: MKL's code path, oneDNN's and ATen's own kernels.
TORCH_AVX2 = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
              "ATEN_CPU_CAPABILITY": "avx2"}
# Issue 27: microtrain's step time at a level over PyTorch's (AVX2-limited for avx2, native for
# avx512) at most this.
GOALS = {"avx2": 0.50, "avx512": 0.40}


def levels_cpu_step_runs(cpu_step, who):
    """The levels microtrain runs on this CPU, best first (cpu_step's own detection)."""
    p = subprocess.run([cpu_step, "--list-cpu-isa"], capture_output=True, text=True)
    if p.returncode != 0 or not p.stdout.split():
        sys.exit(f"{who}: {cpu_step} --list-cpu-isa failed (exit {p.returncode}): "
                 f"{p.stderr.strip()}; is it a cpu_step built from this tree?")
    return p.stdout.split()


def isa_of(r):
    """The ISA a process says it ran: microtrain's level, PyTorch's ATen CPU capability."""
    return r["cpu_isa"] if r["impl"] == "microtrain" else r["isa"]["cpu_capability"]


def cpu_identity():
    """The first processor's model name ("unknown" when /proc/cpuinfo has none) and its
    "cpu family" and "model" numbers (a VM's name is often generic: "AMD EPYC")."""
    model, family_model = "unknown", {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and model == "unknown":
                model = value.strip()
            elif key in ("cpu family", "model") and key not in family_model:
                family_model[key] = value.strip()
            if not line.strip():
                break  # the first processor's block is enough
    return model, family_model


def machine_text(cpu_model, family_model):
    """The model name with its family and model, e.g. "AMD EPYC (cpu family 25, model 1)": a
    VM's name is often generic, and family and model tell Zen 3, Zen 4 and Zen 5 apart."""
    ids = ", ".join(f"{k} {v}" for k, v in family_model.items())
    return f"{cpu_model} ({ids})" if ids else cpu_model


def result_slug(cpu_model):
    """<cpu model>-<N>c for a results file name, e.g. amd-epyc-2c."""
    return re.sub(r"[^a-z0-9]+", "-", cpu_model.lower()).strip("-") + f"-{os.cpu_count()}c"


def write_atomically(path, text):
    """A results file readable by everyone (mkstemp's 0600 would hide it), complete or absent."""
    fd, tmp = tempfile.mkstemp(prefix=".cpu_bench.", dir=os.path.dirname(path) or ".")
    os.fchmod(fd, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
