// What one training step measured: the record TrainingSession returns and the StepLoop
// (engine/step_loop.h) hands to run, train, step and the bench.
#pragma once

#include <optional>

#include "engine/timing.h"
#include "kernels/device_clock.h"

namespace mt {

struct StepRecord {
    int step = 0;  // 0-based over warm-up + measured steps
    bool warmup = false;
    PhaseTimes times;
    double loss = 0;       // mean over the step's micro-batches
    double grad_norm = 0;  // global L2 norm before clipping (0 when clipping is off)
    double lr = 0;         // learning rate used by this step
    // Data parallel (world > 1; zero otherwise). The exposed wait is times[Phase::comm].
    double comm_busy_ms = 0;           // time the link was busy with this step's collectives
    double comm_bytes = 0;             // bytes this rank sent for them (ring algorithm)
    int comm_buckets_in_backward = 0;  // of them, buckets issued while backward ran (overlap)
    int stop_signal = 0;               // a stop signal seen by any rank (agreed, so all ranks stop)
    // What the step trained: tokens of the global batch (every rank's micro-batches) and this
    // rank's analytic model FLOPs, at the batches' real lengths (data.seq_len_jitter shortens
    // them; without it every step is world x B x T x grad_accum tokens).
    double tokens = 0;
    double model_flops = 0;
    // Host synchronisation points (run.host_sync): the Backend::synchronize / copy_to_host calls
    // the step made, and the host time spent waiting in them (CPU backend: ~0, ops are
    // synchronous). run.host_sync none: the window's read-back is counted in its last step.
    int host_syncs = 0;
    double host_wait_ms = 0;
    // The CPU time other processes took while the step ran on the host, in ms (engine/cpu_load.h:
    // /proc, tick resolution; 0 where /proc is absent). run.host_sync none: while the host
    // enqueued the step.
    double other_cpu_ms = 0;
    // Of it, the steal time (ms): the hypervisor ran another machine on our CPUs (cpu_load.h).
    double steal_ms = 0;
    // The device's clock over the step (Backend::sample_device_clock at the step's start and
    // end, combined: the lowest SM clock, every throttle reason seen); nullopt without one (CPU,
    // no NVML).
    std::optional<DeviceClockSample> device_clock;
};

}  // namespace mt
