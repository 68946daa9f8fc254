// libFuzzer target "pretrained": mt::fuzz::pretrained (tests/fuzz/targets.h) on each input (a
// Hugging Face GPT-2 folder: config.json, a separator line, model.safetensors), written to an
// in-memory file. Built with -DMT_FUZZ=ON by clang (CMakePresets.json "fuzz"); run by
// tools/fuzz.sh with the seeds in tests/fuzz/corpus/pretrained/.
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    mt::fuzz::pretrained(mt::fuzz::input_file(data, size));
    return 0;
}
