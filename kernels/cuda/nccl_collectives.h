// Entry point of the NCCL collectives (kernels/cuda/nccl_collectives.cu). This header includes no
// CUDA or NCCL header: the backend factory, and through it the harness, include it.
#pragma once

#include <memory>

#include "kernels/backend.h"
#include "kernels/collectives.h"

namespace mt {

// NCCL over the ranks of one job on the CUDA backend's device: rank 0 creates the unique id,
// `broadcast` carries it to every rank, then all ranks join the communicator. Every wait, the
// start included, gives up after `timeout_s` seconds. Throws BackendError when `backend` is not
// the CUDA backend, CommError when NCCL fails to start.
std::unique_ptr<Collectives> create_nccl_collectives(Backend& backend, int rank, int size,
                                                     const BroadcastFromRank0& broadcast,
                                                     double timeout_s);

}  // namespace mt
