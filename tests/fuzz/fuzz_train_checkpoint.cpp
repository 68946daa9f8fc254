// libFuzzer target "train_checkpoint": mt::fuzz::train_checkpoint (tests/fuzz/targets.h) on each
// input, written to an in-memory file. Built with -DMT_FUZZ=ON by clang (CMakePresets.json "fuzz");
// run by tools/fuzz.sh with the seeds in tests/fuzz/corpus/train_checkpoint/.
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    mt::fuzz::train_checkpoint(mt::fuzz::input_file(data, size));
    return 0;
}
