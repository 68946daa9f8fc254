// libFuzzer target "results": mt::fuzz::results (tests/fuzz/targets.h) on each input, written to an
// in-memory file. Built with -DMT_FUZZ=ON by clang (CMakePresets.json "fuzz"); run by
// tools/fuzz.sh with the seeds in tests/fuzz/corpus/results/.
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    mt::fuzz::results(mt::fuzz::input_file(data, size));
    return 0;
}
