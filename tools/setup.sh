#!/usr/bin/env bash
# Installs microtrain's build and test dependencies from Debian's packages.
# Idempotent: when everything is already there it prints nothing and exits 0.
#   tools/setup.sh          build + test dependencies
#   tools/setup.sh --torch  also python3-torch (+ OpenBLAS) for the reference generator and bench/
#   tools/setup.sh --cudnn  also python3-pip, which tools/fetch-cudnn-frontend.sh downloads with
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config libeigen3-dev libyaml-cpp-dev libgtest-dev
      googletest libcli11-dev nlohmann-json3-dev libfmt-dev clang-tidy clang libomp-dev)
# ccache: CMakeLists.txt compiles through it when present (a second build folder, a rebuild).
pkgs+=(ccache)
# The pinned formatter (tools/format.sh checks its version: 14.0.6).
pkgs+=(clang-format-14)
# Data parallel: Open MPI (mpirun -np N microtrain ...; tests/test_data_parallel.cpp).
pkgs+=(openmpi-bin libopenmpi-dev)
# Test extras: headless Chromium renders report.html (tests/test_report_browser.cpp).
pkgs+=(chromium)
for arg in "$@"; do
    case "$arg" in
        --torch) pkgs+=(python3-torch python3-numpy libopenblas0-openmp) ;;
        --cudnn) pkgs+=(python3-pip) ;;
        *) echo "setup: unknown option '$arg' (expected --torch or --cudnn)" >&2; exit 2 ;;
    esac
done
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
