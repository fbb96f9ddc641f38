// tests/comm/mpi_world.hpp: a fresh kvtier MPI communicator over `parent` for a test
// case; a setup failure stops every process (MPI_Abort), since the peers would
// otherwise wait for a rank that left.
//
//   kvtier::comm::mpi_communicator c = kvtier::test::mpi_world(MPI_COMM_WORLD, {.stage = false});
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdio>

#include "kvtier/comm/mpi.hpp"

namespace kvtier::test {

inline comm::mpi_communicator mpi_world(MPI_Comm parent, comm::mpi_options opt) {
  comm::mpi_communicator c;
  if (auto ec = comm::mpi_communicator::create(c, parent, deadline_after(std::chrono::seconds(30)), opt)) {
    std::fprintf(stderr, "mpi_world: %s\n", c.last_error().c_str());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  return c;
}

}  // namespace kvtier::test
