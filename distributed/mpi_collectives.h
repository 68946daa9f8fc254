// MPI collectives on host memory (kernels/collectives.h), the CPU backend's transport.
// Only distributed/*.cpp include this header, and only when the build has MPI.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "kernels/collectives.h"

namespace mt {

// Over a duplicate of `comm` (its operations never match another caller's), with every wait
// bounded by timeout_s. `transport` is describe()'s text.
std::unique_ptr<Collectives> create_mpi_collectives(MPI_Comm comm, const std::string& transport,
                                                    double timeout_s);

}  // namespace mt
