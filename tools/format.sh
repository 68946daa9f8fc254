#!/usr/bin/env bash
# Formats the C++ sources (.cpp .h .cu .cuh) with the pinned clang-format and the repository's
# .clang-format, or checks that they are formatted. The one command to format with:
#   tools/format.sh                    formats every tracked C++ file in place
#   tools/format.sh FILE...            formats these files in place
#   tools/format.sh --check [FILE...]  changes nothing; lists each file clang-format would change
#                                      (with the first lines of its diff) and exits 1 if any
# The version is pinned (kVersion below: Debian 12's clang-format-14, installed by
# tools/setup.sh): another version formats some constructs differently, so a check with it would
# fail on code that is correctly formatted. A different version is refused, naming both.
set -euo pipefail
cd "$(dirname "$0")/.."

readonly kBinary=clang-format-14
readonly kVersion=14.0.6

check=0
if [[ "${1:-}" == "--check" ]]; then
    check=1
    shift
fi
if ! command -v "$kBinary" >/dev/null; then
    echo "format: $kBinary not found; install it with tools/setup.sh (Debian package $kBinary)" >&2
    exit 2
fi
version=$("$kBinary" --version)
if [[ "$version" != *"version $kVersion"* ]]; then
    echo "format: expected clang-format $kVersion, got: $version" >&2
    exit 2
fi

files=("$@")
if ((${#files[@]} == 0)); then
    mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
fi
if ((check == 0)); then
    "$kBinary" -i --style=file "${files[@]}"
    exit 0
fi
diff_file=$(mktemp)
trap 'rm -f "$diff_file"' EXIT
status=0
for f in "${files[@]}"; do
    if ! diff -u "$f" <("$kBinary" --style=file --assume-filename="$f" <"$f") >"$diff_file"; then
        echo "format: $f is not formatted (tools/format.sh $f formats it):" >&2
        head -n 20 "$diff_file" >&2
        status=1
    fi
done
if ((status == 0)); then
    echo "format: ${#files[@]} file(s) formatted as clang-format $kVersion formats them"
fi
exit $status
