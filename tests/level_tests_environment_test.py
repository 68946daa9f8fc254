#!/usr/bin/env python3
"""What ctest really sets for the gtest cases: the environment each one runs with.

The kernel tests run once per CPU ISA level (CMakeLists.txt: isa_<level>:Suite.Test, each with
MT_CPU_ISA=<level>); every gtest case runs with OMP_NUM_THREADS=1 and OMP_WAIT_POLICY=passive.
gtest_discover_tests writes each element of its PROPERTIES as an argument of its own, so a
list-valued ENVIRONMENT silently loses all but its first variable: until 2026-12-06 the
isa_avx2: and isa_baseline: cases ran at the best level the CPU had, and nothing failed. This
reads the discovered tests back from ctest itself (ctest --show-only=json-v1, in the build
directory) and checks each one's ENVIRONMENT.

Then it runs one case of each level through ctest and checks what ctest calls it: a level the CPU
lacks (avx512 on an AVX2-only machine) must read "Skipped" with the reason, a level it has
"Passed" after the case said it ran that level's kernels. A global gtest environment that skips
makes gtest report its cases as passed: until 2026-12-06 ctest listed 87 avx512 cases as passed
on AVX2 machines that had run none of them.

usage: level_tests_environment_test.py BUILD_DIR LEVEL [LEVEL ...]
"""
import json
import re
import subprocess
import sys

COMMON = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "passive"}


def environment(test):
    for prop in test.get("properties", []):
        if prop.get("name") == "ENVIRONMENT":
            return dict(entry.split("=", 1) for entry in prop.get("value", []))
    return {}


def check_one_case_runs_or_skips(build_dir, name, level):
    """Runs `name` through ctest; returns the problems with what ctest called it."""
    run = subprocess.run(["ctest", "-V", "-R", "^" + re.escape(name) + "$"], cwd=build_dir,
                         capture_output=True, text=True, timeout=600)
    out = run.stdout + run.stderr
    verdict = re.search(r"Test +#\d+: \S+ \.*\s*(?:\*\*\*)?(Passed|Skipped|Failed|Not Run)", out)
    if not verdict:
        return [f"{name}: ctest printed no verdict:\n{out[-2000:]}"]
    verdict = verdict.group(1)
    if "this CPU lacks" in out:
        if verdict != "Skipped":
            return [f"{name}: the CPU lacks level {level}, yet ctest says {verdict}, not Skipped"]
        print(f"{name}: Skipped (this CPU lacks {level})")
        return []
    if verdict != "Passed" or f"kernels of the level {level} (MT_CPU_ISA)" not in out:
        return [f"{name}: ctest says {verdict}; expected Passed at level {level}:\n{out[-2000:]}"]
    print(f"{name}: Passed at level {level}")
    return []


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    build_dir, levels = sys.argv[1], sys.argv[2:]
    listing = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build_dir, check=True,
                             capture_output=True, text=True).stdout
    tests = json.loads(listing)["tests"]
    problems, per_level = [], {level: 0 for level in levels}
    first_case = {}
    for test in tests:
        name = test["name"]
        if "." not in name or name.endswith("_NOT_BUILT"):  # not a gtest case
            continue
        env = environment(test)
        want = dict(COMMON)
        prefix = name.split(":", 1)[0] if ":" in name else ""
        if prefix.startswith("isa_"):
            level = prefix[len("isa_"):]
            if level not in per_level:
                problems.append(f"{name}: level {level} is not one this build compiles {levels}")
                continue
            per_level[level] += 1
            first_case.setdefault(level, name)
            want["MT_CPU_ISA"] = level
        elif "MT_CPU_ISA" in env:
            problems.append(f"{name}: sets MT_CPU_ISA={env['MT_CPU_ISA']} without an isa_ prefix")
        for key, value in want.items():
            if env.get(key) != value:
                problems.append(f"{name}: {key}={env.get(key, '(unset)')}, expected {value}"
                                f" (its ENVIRONMENT: {sorted(env.items())})")
    for level, count in per_level.items():
        if count == 0:
            problems.append(f"no isa_{level}: test was discovered: the level's kernels go untested")
    for level, name in first_case.items():
        problems += check_one_case_runs_or_skips(build_dir, name, level)
    for line in problems[:20]:
        print(line)
    if problems:
        print(f"{len(problems)} problem(s) in ctest's environment for the gtest cases")
        return 1
    print(f"{sum(per_level.values())} level cases ({per_level}) and every other gtest case run "
          "with the environment CMakeLists.txt asks for")
    return 0


if __name__ == "__main__":
    sys.exit(main())
