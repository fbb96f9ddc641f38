// kvtier::mpi: the MPI host communicator (links MPI's C library). The consumer does not
// initialise MPI, so create() must refuse with a message that says so, before any
// collective MPI call.
#include <kvtier/comm/mpi.hpp>

#include <chrono>
#include <string>

std::string use_mpi() {
  kvtier::comm::mpi_communicator c;
  const std::error_code ec = kvtier::comm::mpi_communicator::create(
      c, MPI_COMM_WORLD, kvtier::deadline_after(std::chrono::seconds(1)));
  if (ec != kvtier::errc::invalid_argument) return "create() did not refuse an uninitialised MPI";
  const std::string why = c.last_error();
  return why.find("not initialised") != std::string::npos ? "ok (" + why + ")" : "unexpected: " + why;
}
