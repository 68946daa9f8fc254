// The NVML clock reader (kernels/cuda/nvml_clock.h) loads the driver's library at run time: on
// a machine without it (CI, this build machine) it is off, samples nothing and throws nothing;
// with a GPU and its driver it reads a plausible SM clock. Needs no GPU to run.
#include <gtest/gtest.h>

#include "kernels/cuda/nvml_clock.h"

namespace mt::cuda {
namespace {

TEST(NvmlClock, AMissingLibraryMeansNoSampleAndNoError) {
    NvmlClock clock("0000:00:00.0", "libnvidia-ml-does-not-exist.so.1");
    EXPECT_FALSE(clock.available());
    EXPECT_FALSE(clock.sample().has_value());
}

TEST(NvmlClock, AnUnknownDeviceMeansNoSampleAndNoError) {
    // The driver's library where there is one, but no device at this bus id.
    NvmlClock clock("ffff:ff:1f.7");
    EXPECT_FALSE(clock.available());
    EXPECT_FALSE(clock.sample().has_value());
}

}  // namespace
}  // namespace mt::cuda
