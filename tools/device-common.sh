# Sourced by tools/device-check.sh and tools/gpu-bench.sh: what both need on the device machine,
# written once. Expects ROOT (the repository) and DEPS (its .deps/, filled by tools/pack-deps.sh).
#
#   cmake_with_deps ARGS...        cmake with every find_package pointed into .deps (the device
#                                  machine has no Debian packages of ours and no network)
#   cpu_cores                      the cores this process may use, for make's -j (GNU nproc
#                                  honours OMP_NUM_THREADS and OMP_THREAD_LIMIT: asked without)
#   run_limited LOG LIMIT CMD...   runs CMD under a time limit, its output appended to LOG; prints
#                                  its status (ok, TIMEOUT, FAIL(rc=N)) and returns 0 only for ok.
#                                  CMD may be an exported shell function (it runs under bash -c).

# nvcc where the CUDA image puts it, if it is not on PATH already.
if ! command -v nvcc > /dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    export PATH=/usr/local/cuda/bin:$PATH
fi

cpu_cores() {
    env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc
}

cmake_with_deps() {
    cmake "$@" -DCMAKE_FIND_PACKAGE_PREFER_CONFIG=ON \
        -DEigen3_DIR="$DEPS/cmake/Eigen3" -DCLI11_DIR="$DEPS/cmake/CLI11" \
        -Dnlohmann_json_DIR="$DEPS/cmake/nlohmann_json" -Dyaml-cpp_DIR="$DEPS/cmake/yaml-cpp"
}

run_limited() {
    local log="$1" limit="$2" rc=0
    shift 2
    # bash -c so exported shell functions (the multi-command stages) run under timeout too.
    timeout --kill-after=10 "$limit" bash -c '"$@"' _ "$@" >> "$log" 2>&1 < /dev/null || rc=$?
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
        echo TIMEOUT
    elif [[ $rc -ne 0 ]]; then
        echo "FAIL(rc=$rc)"
    else
        echo ok
    fi
    [[ $rc -eq 0 ]]
}

export -f cpu_cores cmake_with_deps run_limited
