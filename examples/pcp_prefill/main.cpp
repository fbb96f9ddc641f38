// pcp_prefill: a PCP prefill engine made of kvtier components, replaying a
// request trace under an explicit timing model. See --help.
//
// This file picks the command and, with --mpi, sets up MPI; the rest is beside it:
//   cli.hpp       the usage text and the replay's options
//   replay.hpp    one replay: stores, priming, the engine run, its report
//   commands.hpp  gen-trace, table, plot, fit-t0, instance-gbps
//   engine.hpp    the engine (and what it includes: the request lifecycle, the modeled clock)
#include <iostream>
#include <stdexcept>
#include <string>
#include <string_view>

#include "cli.hpp"
#include "commands.hpp"
#include "replay.hpp"

#if defined(PCP_HAVE_MPI)
#include "kvtier/comm/mpi.hpp"
#endif

namespace {

using namespace pcp::cli;

#if defined(PCP_HAVE_MPI)
/// --mpi: this process is one rank of the mpiexec job. Option errors (the same on every rank)
/// are printed once and end every rank cleanly; any later failure ends the job (MPI_Abort).
int main_mpi(int argc, char** argv) {
  int provided = 0, rank = 0, size = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);  // kvtier never calls MPI_Init
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int rc = 0;
  try {
    options o;
    try {
      o = parse_replay(argc, argv, static_cast<std::uint32_t>(size));
    } catch (const usage_error& e) {
      if (rank == 0) std::cerr << "pcp_prefill: " << e.what() << "\n";
      MPI_Finalize();
      return 2;
    }
    process_ranks w;
    // One communicator for the agreement and the moves (they run inside step(), on this thread):
    // MPI_THREAD_SERIALIZED suffices. MPI control + data communicators (the mover's threads and
    // the step at once) need MPI_THREAD_MULTIPLE: docs/engine_guide.md, "MPI thread levels".
    if (auto ec = kvtier::comm::mpi_communicator::create(w.comm, MPI_COMM_WORLD,
                                                         kvtier::deadline_after(std::chrono::seconds(60))))
      throw std::runtime_error(w.comm.last_error());
    rc = run_replay(w, o);
  } catch (const std::exception& e) {
    std::cerr << "pcp_prefill: rank " << rank << ": " << e.what() << "\n";
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "gen-trace") return run_gen_trace(argc, argv);
    if (cmd == "table") return run_table(argc, argv);
    if (cmd == "fit-t0") return run_fit_t0(argc, argv);
    if (cmd == "instance-gbps") return run_instance_gbps(argc, argv);
    if (cmd == "plot") return run_plot(argc, argv);
#if defined(PCP_HAVE_MPI)
    bool mpi = false, help = false;  // --help prints and exits before MPI is initialised
    for (int i = 1; i < argc; ++i) {
      const std::string_view a = argv[i];
      mpi = mpi || a == "--mpi";
      help = help || a == "--help" || a == "-h";
    }
    if (mpi && !help) return main_mpi(argc, argv);
#endif
    const options o = parse_replay(argc, argv);  // --mpi without MPI: a usage error
    thread_ranks w;
    return run_replay(w, o);
  } catch (const usage_error& e) {
    std::cerr << "pcp_prefill: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "pcp_prefill: " << e.what() << "\n";
    return 1;
  }
}
