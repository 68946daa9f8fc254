// What the GPU's clock was doing while a step ran: its SM clock and why the driver held it down
// (the "clock event" / throttle reasons). A GPU that hits its power cap or heats up slows every
// kernel without any phase saying why, as a busy CPU does (engine/cpu_load.h). The CUDA backend
// reads it through NVML, loaded at run time (kernels/cuda/nvml_clock.h); other backends, or a
// machine without the driver, have none (Backend::sample_device_clock returns nullopt).
#pragma once

#include <string>
#include <vector>

namespace mt {

struct DeviceClockSample {
    unsigned sm_clock_mhz = 0;                // the SM clock now (NVML_CLOCK_SM)
    unsigned long long throttle_reasons = 0;  // NVML's bitmask (nvmlClocksThrottleReason*)
};

// The two samples of one step combined: the lowest clock, every reason either saw.
DeviceClockSample combine(const DeviceClockSample& a, const DeviceClockSample& b);

// The throttle reasons that say the clock was held down by something else than the work: every
// bit but gpu_idle (no work queued: the clock drops between kernels by design) and
// applications_clocks_setting / display_clock_setting (a configured ceiling, not an event).
inline constexpr unsigned long long kSlowdownReasons = 0x4 | 0x8 | 0x10 | 0x20 | 0x40 | 0x80;

// The names of the bits set in an NVML throttle-reason mask, lowest bit first: gpu_idle,
// applications_clocks_setting, sw_power_cap, hw_slowdown, sync_boost, sw_thermal, hw_thermal,
// hw_power_brake, display_clock_setting (NVML's nvmlClocksThrottleReason* constants, nvml.h);
// an unknown bit is named "bit_<n>".
std::vector<std::string> throttle_reason_names(unsigned long long mask);

}  // namespace mt
