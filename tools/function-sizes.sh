#!/usr/bin/env bash
# Lists every function in kernels/, model/, optim/, io/, distributed/, checkpoint/,
# engine/, experiment/, report/ and cli/ longer than the threshold
# (default 100 lines, whitespace and comments included) with clang-tidy's
# readability-function-size check, and exits 1 when there is one. A function whose length is
# the algorithm says so with `// NOLINT(readability-function-size): <why>` on its first line.
#
#   tools/function-sizes.sh BUILD_DIR [THRESHOLD]
#
# BUILD_DIR must hold compile_commands.json (every preset exports it). CUDA sources (.cu) are
# not checked: clang-tidy cannot parse them without the CUDA SDK headers set up for clang.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: tools/function-sizes.sh BUILD_DIR [THRESHOLD]}
threshold=${2:-100}
[[ -f "$build/compile_commands.json" ]] ||
    { echo "function-sizes: $build/compile_commands.json not found; configure a preset first" >&2; exit 2; }
command -v clang-tidy >/dev/null ||
    { echo "function-sizes: clang-tidy not found (apt-get install clang-tidy)" >&2; exit 2; }
config="{CheckOptions: [{key: readability-function-size.LineThreshold, value: $threshold}]}"
mapfile -t files < <(git ls-files 'kernels/*.cpp' 'model/*.cpp' 'optim/*.cpp' 'io/*.cpp' 'distributed/*.cpp' 'checkpoint/*.cpp' \
    'engine/*.cpp' 'experiment/*.cpp' 'report/*.cpp' 'cli/*.cpp')
# clang-tidy exits non-zero when it finds something; the listing below is the verdict.
out=$(printf '%s\n' "${files[@]}" |
      { xargs -P "$(nproc)" -n 4 clang-tidy -p "$build" --quiet -checks='-*,readability-function-size' \
            -config="$config" 2>/dev/null || true; } |
      awk '/warning: function .* exceeds/ { loc = $1; sub(/:$/, "", loc); name = $4 }
           /note: [0-9]+ lines including/ { if (loc != "") { print loc, name, $3, "lines"; loc = "" } }' |
      sed "s#^$PWD/##" | sort -u)
if [[ -n "$out" ]]; then
    echo "functions longer than $threshold lines:"
    echo "$out"
    exit 1
fi
echo "function-sizes: no function in kernels/ model/ optim/ io/ distributed/ checkpoint/ engine/ experiment/ report/ cli/ is longer than $threshold lines"
