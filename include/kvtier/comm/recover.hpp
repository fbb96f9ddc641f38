// kvtier/comm/recover.hpp: agreed budgets (deadlines across hosts) and the way back after poisoning.
//
// Budgets, not instants. A kvtier::deadline is a steady_clock instant, and
// steady_clock (CLOCK_MONOTONIC on Linux) counts from each host's boot: an instant
// taken on one host means nothing on another (boots hours or days apart). Ranks
// that agree on an instant (say the min of their deadlines) are right only when all
// run on one host; across hosts, a host that booted later hands its peers an
// instant that is already past (every collective times out at once), or one that is
// days away (no deadline at all). Agree on a *duration* instead, and let each rank
// turn it into a deadline on its own clock when it starts the work:
//
//   auto b = kvtier::comm::agree_budget(ctrl, 2s, setup_dl);     // min over the ranks
//   ...  // per request, on every rank, when the request starts on this rank:
//   const kvtier::deadline dl = b.local_deadline();            // now (this rank's clock) + budget
//
// The skew that remains is the difference of the ranks' start times, which a
// collective waits for anyway.
//
// Recovery (backends that poison: MPI, NCCL; in-process rounds fail together and its
// communicators go on working). After a failure an MPI or NCCL communicator is poisoned (see
// communicator.hpp) and a peer may still be one request ahead (its round succeeded
// while this rank's failed) or behind. recover() recreates the communicator with
// the caller's factory (every rank calls it, as it is collective), then agrees in
// one all-reduce on the request index to go on with (the largest any rank asks for:
// a rank behind skips ahead and recomputes) and on a budget (the smallest):
//
//   auto r = kvtier::comm::recover(ctrl,
//       [&](kvtier::comm::mpi_communicator& fresh, kvtier::deadline d) {
//         return kvtier::comm::mpi_communicator::create(fresh, MPI_COMM_WORLD, d);
//       },
//       next_request, my_budget, kvtier::deadline_after(30s));
//   if (r.ec) end_job(r.message);
//   next_request = r.request;   // the same on every rank
//
// Every rank must call recover(), including one whose communicator was not
// poisoned: when any rank fails, its peers' next collective fails (on MPI at once: the
// failing rank tells them, mpi_options::notify_peers; else by their own deadline), so
// every rank reaches it within one request. recover() returns once the last rank has
// called it: its cost is the time until every peer is back at a collective (the
// engine's work between two steps, and whatever it blocks on there), plus one
// MPI_Comm_idup and one all-reduce. Its deadline must cover the longest deadline a
// peer may still be waiting on before it fails and recovers too. On MPI, create() pairs a retry with a
// duplicate that timed out (see mpi.hpp), so recover() may be called again after a timeout.
//
// A rank whose process died cannot be recovered this way: its peers' duplicate of
// the parent never completes (recover() times out). OpenMPI also ends the whole job
// when a process dies, unless told otherwise (OpenMPI 4: mpiexec --mca
// orte_enable_recovery 1; OpenMPI 5: --enable-recovery / --with-ft ulfm), and
// MPI_ERRORS_RETURN, which kvtier sets on its own communicators, only turns MPI's
// errors into return codes; it does not keep the runtime from ending the job. Plan
// to restart the job when a rank dies.
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <string>
#include <system_error>
#include <utility>

#include "kvtier/comm/communicator.hpp"
#include "kvtier/deadline.hpp"

namespace kvtier::comm {

/// A budget every rank agreed on; local_deadline() is this rank's deadline for work
/// starting now, on this rank's own clock.
struct agreed_budget {
  std::error_code ec;
  std::string message;               ///< why, when ec is set
  kvtier::clock::duration budget{};  ///< the smallest budget any rank passed
  kvtier::deadline local_deadline() const { return kvtier::deadline_after(budget); }
  /// The deadline for work that started on this rank at `local_start` (its own clock).
  kvtier::deadline deadline_from(kvtier::clock::time_point local_start) const {
    if (budget >= kvtier::no_deadline - local_start) return kvtier::no_deadline;  // saturate
    return local_start + budget;
  }
};

namespace detail {
inline std::uint64_t budget_ticks(kvtier::clock::duration d) noexcept {
  return d.count() <= 0 ? 0 : static_cast<std::uint64_t>(d.count());
}
inline kvtier::clock::duration ticks_budget(std::uint64_t t) noexcept {
  const auto most = static_cast<std::uint64_t>(kvtier::clock::duration::max().count());
  return kvtier::clock::duration(static_cast<kvtier::clock::rep>(std::min(t, most)));
}
}  // namespace detail

/// Agrees on the smallest of the ranks' budgets (one all-reduce; negative budgets count as 0).
template <communicator C>
agreed_budget agree_budget(C& comm, kvtier::clock::duration mine, kvtier::deadline dl) {
  agreed_budget out;
  std::uint64_t t = detail::budget_ticks(mine);
  if (auto ec = all_reduce_value(comm, t, reduce_op::min, dl)) {
    out.ec = ec;
    out.message = "agree_budget: " + std::string(comm.last_error());
    return out;
  }
  out.budget = detail::ticks_budget(t);
  return out;
}

/// What recover() agreed on.
struct recovery {
  std::error_code ec;
  std::string message;               ///< why, when ec is set
  std::uint64_t request = 0;         ///< the request index every rank goes on with (the largest asked for)
  kvtier::clock::duration budget{};  ///< the smallest budget asked for
  kvtier::deadline local_deadline() const { return kvtier::deadline_after(budget); }
};

/// Recreates `comm` with make(fresh, dl) and agrees on the request index and the
/// budget (see the file comment). On success `comm` is the new communicator; on
/// failure it is left as it was (poisoned, most likely) and recover() may be retried.
template <communicator C, class Make>
requires std::default_initializable<C> && std::invocable<Make&, C&, kvtier::deadline> &&
    std::same_as<std::invoke_result_t<Make&, C&, kvtier::deadline>, std::error_code>
        recovery recover(C& comm, Make&& make, std::uint64_t next_request, kvtier::clock::duration budget,
                         kvtier::deadline dl) {
  recovery out;
  C fresh;
  if (auto ec = make(fresh, dl)) {
    out.ec = ec;
    out.message = "recover: recreating the communicator failed: " + std::string(fresh.last_error());
    return out;
  }
  // One all-reduce (min): the largest request index is the min of its complement.
  std::uint64_t v[2] = {~next_request, detail::budget_ticks(budget)};
  if (auto ec = all_reduce(fresh, std::span<const std::uint64_t>(v), std::span<std::uint64_t>(v),
                           reduce_op::min, dl)) {
    out.ec = ec;
    out.message = "recover: agreeing on the request index failed: " + std::string(fresh.last_error());
    return out;
  }
  out.request = ~v[0];
  out.budget = detail::ticks_budget(v[1]);
  comm = std::move(fresh);
  return out;
}

}  // namespace kvtier::comm
