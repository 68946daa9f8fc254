#!/usr/bin/env bash
# Fills .deps/ (git-ignored) with the build dependencies of microtrain, taken from the Debian
# packages installed on THIS development machine, so the tree can be built on a GPU machine
# that has nvcc, CMake, ninja and Python but no Debian -dev packages and no network
# (tools/device-check.sh uses it). Run from anywhere: tools/pack-deps.sh [--check]
#
# What goes in (about 15 MiB):
#   .deps/include/{eigen3,CLI,nlohmann,yaml-cpp}   header-only libraries + yaml-cpp's headers
#   .deps/lib/libyaml-cpp.a                        yaml-cpp as a static library (Debian ships no
#                                                  yaml-cpp source; `apt-get source` needs the
#                                                  network). Static, so there is no .so to find
#                                                  at run time; it needs a libstdc++ at least as
#                                                  new as this machine's GCC 12 (GLIBCXX_3.4.30)
#                                                  and glibc >= 2.32 — any 2023+ distribution.
#                                                  x86-64 only.
#   .deps/src/googletest                           GoogleTest source (/usr/src/googletest);
#                                                  device-check.sh builds it there first.
#   .deps/cmake/<Pkg>/<Pkg>Config.cmake            small hand-written CMake package configs
#                                                  (the Debian ones hard-code /usr paths).
#   .deps/cudnn-frontend/include                   NVIDIA's cudnn-frontend headers, for the
#                                                  optional `cudnn` preset (fetched from PyPI by
#                                                  tools/fetch-cudnn-frontend.sh; skipped with a
#                                                  warning when that fails).
#   .deps/llm.c                                    a snapshot of karpathy/llm.c's source, the
#                                                  second peer of tools/gpu-bench.sh (never in
#                                                  the tracked tree); .deps/llm.c/COMMIT names
#                                                  its commit. From MT_LLMC_SRC: a git
#                                                  directory (bare or not; MT_LLMC_REF, default
#                                                  HEAD) or a plain source tree; default
#                                                  <repo>/.llm.c (git-ignored: `git clone
#                                                  https://github.com/karpathy/llm.c .llm.c`).
#                                                  Skipped with a warning when absent.
#   .deps/llm.c-bin/train_gpt2cu[-cudnn]           llm.c built here for sm_90 by
#                                                  tools/build-llmc.sh, when this machine has
#                                                  nvcc (the -cudnn one also needs cuDNN 9 and
#                                                  the frontend headers; it compiles for minutes).
#                                                  gpu-bench.sh tries them first and builds
#                                                  there when they do not load. MT_LLMC_PREBUILD=0
#                                                  skips them.
# --check: configure the project against .deps only (each <Pkg>_DIR forced into .deps) and
# verify every find_package resolved there.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPS="$ROOT/.deps"
LIBDIR=/usr/lib/x86_64-linux-gnu

need() { [[ -e "$1" ]] || { echo "pack-deps: missing $1 (install $2)" >&2; exit 1; }; }
need /usr/include/eigen3/Eigen/Core libeigen3-dev
need /usr/include/CLI/CLI.hpp libcli11-dev
need /usr/include/nlohmann/json.hpp nlohmann-json3-dev
need /usr/include/yaml-cpp/yaml.h libyaml-cpp-dev
need "$LIBDIR/libyaml-cpp.a" libyaml-cpp-dev
need /usr/src/googletest/CMakeLists.txt googletest

ver() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null | sed -E 's/^[0-9]+://; s/[+~-].*//'; }
EIGEN_VER="$(ver libeigen3-dev)"; EIGEN_VER="${EIGEN_VER:-3.4.0}"
JSON_VER="$(ver nlohmann-json3-dev)"; JSON_VER="${JSON_VER:-3.11.2}"
CLI_VER="$(ver libcli11-dev)"; CLI_VER="${CLI_VER:-2.1.2}"
YAML_VER="$(ver libyaml-cpp-dev)"; YAML_VER="${YAML_VER:-0.7.0}"

if [[ "${1:-}" != "--check" ]]; then
    tmp="$(mktemp -d "$ROOT/.deps.tmp.XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    mkdir -p "$tmp/include" "$tmp/lib" "$tmp/src" "$tmp/cmake"
    cp -r /usr/include/eigen3 /usr/include/CLI /usr/include/nlohmann /usr/include/yaml-cpp "$tmp/include/"
    cp "$LIBDIR/libyaml-cpp.a" "$tmp/lib/"
    cp -r /usr/src/googletest "$tmp/src/googletest"

    # A config + version file per package; paths relative to the config's own folder, so the
    # tree can move (it travels to another machine).
    write_version() {  # dir name version (compatible: same major, >= requested)
        cat > "$1/$2ConfigVersion.cmake" <<VEOF
set(PACKAGE_VERSION "$3")
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  string(REGEX MATCH "^[0-9]+" _have_major "\${PACKAGE_VERSION}")
  if(PACKAGE_FIND_VERSION_MAJOR AND NOT PACKAGE_FIND_VERSION_MAJOR STREQUAL _have_major)
    set(PACKAGE_VERSION_COMPATIBLE FALSE)
  else()
    set(PACKAGE_VERSION_COMPATIBLE TRUE)
    if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
      set(PACKAGE_VERSION_EXACT TRUE)
    endif()
  endif()
endif()
VEOF
    }
    header_pkg() {  # name target include-subdir version
        local d="$tmp/cmake/$1"
        mkdir -p "$d"
        cat > "$d/$1Config.cmake" <<CEOF
# Written by tools/pack-deps.sh: $1 $4 (header-only) from this tree's .deps/include.
get_filename_component(_mt_deps "\${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
if(NOT TARGET $2)
  add_library($2 INTERFACE IMPORTED)
  set_target_properties($2 PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "\${_mt_deps}/include$3")
endif()
set($1_FOUND TRUE)
CEOF
        write_version "$d" "$1" "$4"
    }
    header_pkg Eigen3 Eigen3::Eigen /eigen3 "$EIGEN_VER"
    header_pkg CLI11 CLI11::CLI11 "" "$CLI_VER"
    header_pkg nlohmann_json nlohmann_json::nlohmann_json "" "$JSON_VER"
    mkdir -p "$tmp/cmake/yaml-cpp"
    cat > "$tmp/cmake/yaml-cpp/yaml-cppConfig.cmake" <<CEOF
# Written by tools/pack-deps.sh: yaml-cpp $YAML_VER, Debian's static library + headers.
get_filename_component(_mt_deps "\${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
if(NOT TARGET yaml-cpp)
  add_library(yaml-cpp STATIC IMPORTED)
  set_target_properties(yaml-cpp PROPERTIES
    IMPORTED_LOCATION "\${_mt_deps}/lib/libyaml-cpp.a"
    INTERFACE_INCLUDE_DIRECTORIES "\${_mt_deps}/include")
endif()
if(NOT TARGET yaml-cpp::yaml-cpp)
  add_library(yaml-cpp::yaml-cpp INTERFACE IMPORTED)
  set_target_properties(yaml-cpp::yaml-cpp PROPERTIES INTERFACE_LINK_LIBRARIES yaml-cpp)
endif()
set(YAML_CPP_LIBRARIES yaml-cpp)
set(YAML_CPP_INCLUDE_DIR "\${_mt_deps}/include")
set(yaml-cpp_FOUND TRUE)
CEOF
    write_version "$tmp/cmake/yaml-cpp" yaml-cpp "$YAML_VER"
    {
        echo "packed $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -srm)"
        echo "eigen3 $EIGEN_VER, CLI11 $CLI_VER, nlohmann_json $JSON_VER, yaml-cpp $YAML_VER (static)"
        echo "googletest $(ver googletest) (source)"
        echo "gcc: $(gcc -dumpfullversion 2>/dev/null || echo ?), glibc: $(ldd --version | head -1)"
    } > "$tmp/MANIFEST"
    if bash "$ROOT/tools/fetch-cudnn-frontend.sh" && cp -r "$ROOT/.cudnn-frontend" "$tmp/cudnn-frontend"; then
        echo "cudnn-frontend $(cat "$tmp/cudnn-frontend/VERSION") (headers)" >> "$tmp/MANIFEST"
    else
        echo "pack-deps: warning: no cudnn-frontend headers in .deps; the cudnn preset will not configure there" >&2
    fi
    # llm.c: the source at one commit, then (where nvcc is here) its binaries, so the device
    # call need not spend its minutes compiling them.
    LLMC_SRC="${MT_LLMC_SRC:-$ROOT/.llm.c}"
    LLMC_REF="${MT_LLMC_REF:-HEAD}"
    llmc_commit=""
    mkdir -p "$tmp/llm.c"
    if git --git-dir="$LLMC_SRC" rev-parse --verify -q "$LLMC_REF^{commit}" > /dev/null 2>&1; then
        llmc_commit="$(git --git-dir="$LLMC_SRC" rev-parse "$LLMC_REF^{commit}")"
        git --git-dir="$LLMC_SRC" archive "$llmc_commit" | tar -x -C "$tmp/llm.c"
    elif [[ -d "$LLMC_SRC/.git" ]] || [[ -f "$LLMC_SRC/.git" ]]; then
        llmc_commit="$(git -C "$LLMC_SRC" rev-parse "$LLMC_REF^{commit}")"
        git -C "$LLMC_SRC" archive "$llmc_commit" | tar -x -C "$tmp/llm.c"
    elif [[ -f "$LLMC_SRC/train_gpt2.cu" ]]; then
        llmc_commit="unknown (a plain source tree, $LLMC_SRC)"
        cp -r "$LLMC_SRC/." "$tmp/llm.c/"
    fi
    if [[ -n "$llmc_commit" && -f "$tmp/llm.c/train_gpt2.cu" ]]; then
        echo "$llmc_commit" > "$tmp/llm.c/COMMIT"
        line="llm.c $llmc_commit (source)"
        if [[ "${MT_LLMC_PREBUILD:-1}" == 1 ]] && { command -v nvcc > /dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; }; then
            for flag in "" --cudnn; do
                # shellcheck disable=SC2086
                if MT_LLMC_CUDNN_FRONTEND="$tmp/cudnn-frontend/include" \
                    bash "$ROOT/tools/build-llmc.sh" "$tmp/llm.c" "$tmp/llm.c-bin" $flag; then
                    line+=", train_gpt2cu${flag:+-cudnn} prebuilt"
                else
                    echo "pack-deps: warning: llm.c ${flag:-without cuDNN} did not build here; gpu-bench.sh builds it there" >&2
                fi
            done
            rm -rf "$tmp/llm.c-bin"/src-*  # the patched copies: only the binaries and logs travel
        fi
        echo "$line" >> "$tmp/MANIFEST"
    else
        rm -rf "$tmp/llm.c"
        echo "pack-deps: warning: no llm.c source at $LLMC_SRC (set MT_LLMC_SRC to a clone or git directory of https://github.com/karpathy/llm.c, or clone it into $ROOT/.llm.c); gpu-bench.sh will report llm.c as missing" >&2
    fi
    rm -rf "$DEPS"
    mv "$tmp" "$DEPS"
    trap - EXIT
    echo "pack-deps: wrote $DEPS ($(du -sh "$DEPS" | cut -f1))"
    cat "$DEPS/MANIFEST"
fi

# Prints the CMake arguments that point every find_package into .deps (device-check uses it).
deps_cmake_args() {
    echo "-DEigen3_DIR=$DEPS/cmake/Eigen3 -DCLI11_DIR=$DEPS/cmake/CLI11" \
         "-Dnlohmann_json_DIR=$DEPS/cmake/nlohmann_json -Dyaml-cpp_DIR=$DEPS/cmake/yaml-cpp"
}

if [[ "${1:-}" == "--check" ]]; then
    [[ -d "$DEPS/cmake" ]] || { echo "pack-deps --check: run tools/pack-deps.sh first" >&2; exit 1; }
    B="$(mktemp -d /tmp/mt-depcheck.XXXXXX)"
    trap 'rm -rf "$B"' EXIT
    # GoogleTest from the packed source, installed into the temp dir (as device-check does).
    cmake -S "$DEPS/src/googletest" -B "$B/gtest-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON -DCMAKE_INSTALL_PREFIX="$B/gtest" > "$B/gtest.log"
    cmake --build "$B/gtest-build" -j2 >> "$B/gtest.log" && cmake --install "$B/gtest-build" >> "$B/gtest.log"
    # shellcheck disable=SC2046
    cmake -S "$ROOT" -B "$B/build" -G Ninja -DMT_ENABLE_CUDA=OFF -DCMAKE_FIND_PACKAGE_PREFER_CONFIG=ON \
        $(deps_cmake_args) -DGTest_DIR="$B/gtest/lib/cmake/GTest" > "$B/configure.log"
    ok=1
    for v in Eigen3_DIR CLI11_DIR nlohmann_json_DIR yaml-cpp_DIR GTest_DIR; do
        val="$(grep -E "^$v:" "$B/build/CMakeCache.txt" | cut -d= -f2-)"
        if [[ "$val" == "$DEPS"* || "$val" == "$B"* ]]; then
            echo "ok   $v = $val"
        else
            echo "FAIL $v = $val (not in .deps)"; ok=0
        fi
    done
    # The include flags of a compile command come from .deps, not from /usr/include.
    for pat in "$DEPS/include/eigen3" "$DEPS/include"; do
        if grep -q -- "$pat" "$B/build/compile_commands.json"; then echo "ok   compile flags use $pat";
        else echo "FAIL compile flags do not mention $pat"; ok=0; fi
    done
    [[ $ok == 1 ]] && echo "pack-deps --check: every dependency resolves into .deps" || exit 1
fi
