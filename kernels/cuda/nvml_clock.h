// The SM clock and the throttle reasons of one GPU through NVML, loaded at run time:
// dlopen("libnvidia-ml.so.1") (the driver's library), so microtrain never links NVML and starts
// on a machine without a driver (CI). When the library, a symbol, nvmlInit or the device lookup
// fails, the reader is off: sample() returns nullopt, nothing is thrown or printed. Plain C++ (no
// CUDA headers): the CUDA backend hands it the device's PCI bus id.
//
// Cost: one sample is two NVML calls (nvmlDeviceGetClockInfo, the throttle reasons), each a
// driver ioctl of some microseconds; TrainingSession takes two per step.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "kernels/device_clock.h"

namespace mt::cuda {

class NvmlClock {
  public:
    // Loads NVML and finds the device with this PCI bus id ("0000:01:00.0", as
    // cudaDeviceGetPCIBusId writes it). Never throws; available() says whether it worked.
    explicit NvmlClock(const std::string& pci_bus_id);
    // Loads from another library name (tests: a name that does not exist).
    NvmlClock(const std::string& pci_bus_id, const char* library);
    ~NvmlClock();
    NvmlClock(const NvmlClock&) = delete;
    NvmlClock& operator=(const NvmlClock&) = delete;

    bool available() const { return impl_ != nullptr; }
    // The clock and throttle reasons now; nullopt when NVML is unavailable or a call fails.
    std::optional<DeviceClockSample> sample() const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace mt::cuda
