// NVML through dlopen (see nvml_clock.h).
#include "kernels/cuda/nvml_clock.h"

#include <dlfcn.h>

namespace mt::cuda {

namespace {

// The few NVML declarations used, as nvml.h declares them (the header is not needed to build).
using nvmlReturn_t = int;  // NVML_SUCCESS = 0
using nvmlDevice_t = struct nvmlDevice_st*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr int kNvmlClockSm = 1;  // nvmlClockType_t: NVML_CLOCK_GRAPHICS 0, SM 1, MEM 2, VIDEO 3
using InitFn = nvmlReturn_t (*)();
using ShutdownFn = nvmlReturn_t (*)();
using HandleByPciFn = nvmlReturn_t (*)(const char*, nvmlDevice_t*);
using ClockInfoFn = nvmlReturn_t (*)(nvmlDevice_t, int, unsigned int*);
using ReasonsFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned long long*);

}  // namespace

struct NvmlClock::Impl {
    void* lib = nullptr;
    ShutdownFn shutdown = nullptr;
    ClockInfoFn clock_info = nullptr;
    ReasonsFn reasons = nullptr;
    nvmlDevice_t device = nullptr;
};

NvmlClock::NvmlClock(const std::string& pci_bus_id) : NvmlClock(pci_bus_id, "libnvidia-ml.so.1") {}

NvmlClock::NvmlClock(const std::string& pci_bus_id, const char* library) {
    void* lib = ::dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;  // no driver: no clock, and nothing to say about it per step
    auto sym = [lib](const char* name) { return ::dlsym(lib, name); };
    auto init = reinterpret_cast<InitFn>(sym("nvmlInit_v2"));
    auto shutdown = reinterpret_cast<ShutdownFn>(sym("nvmlShutdown"));
    auto by_pci = reinterpret_cast<HandleByPciFn>(sym("nvmlDeviceGetHandleByPciBusId_v2"));
    auto clock_info = reinterpret_cast<ClockInfoFn>(sym("nvmlDeviceGetClockInfo"));
    // Renamed "clocks event reasons" in CUDA 12.2's NVML; the old name stays exported.
    auto reasons = reinterpret_cast<ReasonsFn>(sym("nvmlDeviceGetCurrentClocksEventReasons"));
    if (!reasons)
        reasons = reinterpret_cast<ReasonsFn>(sym("nvmlDeviceGetCurrentClocksThrottleReasons"));
    if (!init || !shutdown || !by_pci || !clock_info || !reasons || init() != kNvmlSuccess) {
        ::dlclose(lib);
        return;
    }
    nvmlDevice_t device = nullptr;
    if (by_pci(pci_bus_id.c_str(), &device) != kNvmlSuccess || !device) {
        shutdown();
        ::dlclose(lib);
        return;
    }
    impl_ = std::make_unique<Impl>(Impl{lib, shutdown, clock_info, reasons, device});
}

NvmlClock::~NvmlClock() {
    if (!impl_) return;
    impl_->shutdown();
    ::dlclose(impl_->lib);
}

std::optional<DeviceClockSample> NvmlClock::sample() const {
    if (!impl_) return std::nullopt;
    unsigned int mhz = 0;
    unsigned long long mask = 0;
    if (impl_->clock_info(impl_->device, kNvmlClockSm, &mhz) != kNvmlSuccess) return std::nullopt;
    if (impl_->reasons(impl_->device, &mask) != kNvmlSuccess) return std::nullopt;
    return DeviceClockSample{mhz, mask};
}

}  // namespace mt::cuda
