#!/usr/bin/env bash
# Fetches NVIDIA's cudnn-frontend C++ headers (header-only; the graph API that the optional cuDNN
# attention variant, kernels/cuda/attention_cudnn.cu, is written against) into a git-ignored
# folder. Nothing is vendored: the headers come from the PyPI wheel nvidia-cudnn-frontend, whose
# include/ folder holds cudnn_frontend.h and its tree at the wheel's top level. Only that folder
# is unpacked; the wheel's Python module is not installed.
#
#   tools/fetch-cudnn-frontend.sh [DEST]      DEST defaults to <repo>/.cudnn-frontend
#
# Result: DEST/include/cudnn_frontend.h (+ its headers) and DEST/VERSION. Idempotent: when DEST
# already holds the pinned version nothing is downloaded. Needs python3 with pip and network
# access (PyPI). The default build and the tests need none of this; only the `cudnn` preset
# (MT_ENABLE_CUDNN=ON) does. tools/pack-deps.sh copies DEST into .deps/ for a machine without
# network.
#
# Pinned version: 1.32.0, checked against cuDNN 9.19 and CUDA 13.0's nvcc. The frontend loads
# cuDNN's backend at run time and supports any cuDNN 9 (SDPA bf16 forward/backward needs 9.x on
# an sm_80+ GPU); to change the pin, edit MT_CUDNN_FRONTEND_VERSION and rebuild the preset.
set -euo pipefail

VERSION="${MT_CUDNN_FRONTEND_VERSION:-1.32.0}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$ROOT/.cudnn-frontend}"

if [[ -f "$DEST/VERSION" && "$(cat "$DEST/VERSION")" == "$VERSION" &&
      -f "$DEST/include/cudnn_frontend.h" ]]; then
    echo "fetch-cudnn-frontend: $DEST already holds nvidia-cudnn-frontend $VERSION"
    exit 0
fi

command -v python3 > /dev/null ||
    { echo "fetch-cudnn-frontend: python3 not found (needed for pip)" >&2; exit 1; }
python3 -m pip --version > /dev/null 2>&1 ||
    { echo "fetch-cudnn-frontend: pip not found: install python3-pip" >&2; exit 1; }
command -v unzip > /dev/null || python3 -c 'import zipfile' ||
    { echo "fetch-cudnn-frontend: neither unzip nor python3's zipfile is available" >&2; exit 1; }

tmp="$(mktemp -d "${TMPDIR:-/tmp}/mt-cudnn-frontend.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# The wheel is per CPython version, but its headers are the same in all of them: pin one
# (cp311, manylinux x86-64) so the download does not depend on this machine's interpreter.
if ! python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
        --platform manylinux_2_28_x86_64 --dest "$tmp/wheel" \
        "nvidia-cudnn-frontend==$VERSION" > "$tmp/pip.log" 2>&1; then
    cat "$tmp/pip.log" >&2
    echo "fetch-cudnn-frontend: pip could not download nvidia-cudnn-frontend==$VERSION" \
         "(network access to PyPI needed; or copy a DEST folder fetched elsewhere)" >&2
    exit 1
fi
wheel="$(ls "$tmp"/wheel/nvidia_cudnn_frontend-*.whl)"

# Only include/ (a wheel is a zip file).
python3 - "$wheel" "$tmp/unpacked" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n.startswith("include/")]
    if "include/cudnn_frontend.h" not in names:
        sys.exit("fetch-cudnn-frontend: the wheel has no include/cudnn_frontend.h")
    z.extractall(sys.argv[2], names)
PY
echo "$VERSION" > "$tmp/unpacked/VERSION"

rm -rf "$DEST"
mkdir -p "$(dirname "$DEST")"
mv "$tmp/unpacked" "$DEST"
echo "fetch-cudnn-frontend: nvidia-cudnn-frontend $VERSION headers in $DEST/include" \
     "($(find "$DEST/include" -type f | wc -l) files)"
