// The names of NVML's throttle-reason bits (see device_clock.h).
#include "kernels/device_clock.h"

#include <algorithm>
#include <array>
#include <string_view>

namespace mt {

namespace {

// NVML's header (nvml.h, "Clocks Event Reasons" / nvmlClocksThrottleReason*), bit by bit, as
// NVML documents them (stable since NVML 5.x). nvml.h is not needed to build (the CUDA 13 toolkit
// here does not ship it; the driver's library is loaded at run time, kernels/cuda/nvml_clock.h).
constexpr std::array<std::pair<unsigned long long, std::string_view>, 9> kReasonBits{{
    {0x1, "gpu_idle"},                     // nvmlClocksThrottleReasonGpuIdle
    {0x2, "applications_clocks_setting"},  // ...ApplicationsClocksSetting
    {0x4, "sw_power_cap"},                 // ...SwPowerCap
    {0x8, "hw_slowdown"},                  // ...HwSlowdown (thermal or power brake, hardware)
    {0x10, "sync_boost"},                  // ...SyncBoost
    {0x20, "sw_thermal"},                  // ...SwThermalSlowdown
    {0x40, "hw_thermal"},                  // ...HwThermalSlowdown
    {0x80, "hw_power_brake"},              // ...HwPowerBrakeSlowdown
    {0x100, "display_clock_setting"},      // ...DisplayClockSetting
}};

}  // namespace

DeviceClockSample combine(const DeviceClockSample& a, const DeviceClockSample& b) {
    return {std::min(a.sm_clock_mhz, b.sm_clock_mhz), a.throttle_reasons | b.throttle_reasons};
}

std::vector<std::string> throttle_reason_names(unsigned long long mask) {
    std::vector<std::string> out;
    for (int bit = 0; bit < 64; ++bit) {
        const unsigned long long b = 1ull << bit;
        if (!(mask & b)) continue;
        const auto it = std::find_if(kReasonBits.begin(), kReasonBits.end(),
                                     [b](const auto& e) { return e.first == b; });
        out.push_back(it != kReasonBits.end() ? std::string(it->second)
                                              : "bit_" + std::to_string(bit));
    }
    return out;
}

}  // namespace mt
