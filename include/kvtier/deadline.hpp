// kvtier/deadline.hpp: absolute deadlines on the monotonic clock.
//
// Every blocking kvtier call takes a `deadline` (an absolute time point), never a
// relative timeout, so a deadline can be handed down through layers unchanged:
//
//   auto dl = kvtier::deadline_after(std::chrono::milliseconds(50));
//   store.exists(keys, status, dl);   // returns by dl at the latest
#pragma once

#include <chrono>

namespace kvtier {

using clock = std::chrono::steady_clock;
using deadline = clock::time_point;

/// A deadline that never passes; for callers that really mean "no limit".
inline constexpr deadline no_deadline = deadline::max();

/// A deadline `d` from now. Saturates: a `d` too long to represent (e.g.
/// std::chrono::hours::max()) gives no_deadline, never an overflow into the past;
/// one too far negative gives deadline::min() (already expired).
template <class Rep, class Period>
deadline deadline_after(std::chrono::duration<Rep, Period> d) {
  // Compared in long double: converting d to clock ticks could itself overflow.
  using wide = std::chrono::duration<long double, clock::period>;
  const deadline now = clock::now();
  const wide w = std::chrono::duration_cast<wide>(d);
  const wide at = wide(now.time_since_epoch()) + w;  // exact in long double for every int64 tick count
  if (at >= wide(deadline::max().time_since_epoch())) return no_deadline;
  if (at <= wide(deadline::min().time_since_epoch())) return deadline::min();
  return now + std::chrono::duration_cast<clock::duration>(d);
}

/// True once `d` is in the past.
inline bool expired(deadline d) noexcept { return clock::now() >= d; }

/// Time left until `d`, never negative.
inline clock::duration time_left(deadline d) noexcept {
  auto now = clock::now();
  return d > now ? d - now : clock::duration::zero();
}

/// `request` moved `margin` earlier: the deadline of a request's rank-local I/O
/// (lookup, load) when its collectives (all-reduce, broadcast) end at `request`.
/// Saturates: no_deadline stays no_deadline, a margin <= 0 changes nothing, and a
/// result below deadline::min() is deadline::min() (already expired).
inline deadline local_io_deadline(deadline request, clock::duration margin) noexcept {
  if (request == no_deadline || margin <= clock::duration::zero()) return request;
  if (request.time_since_epoch().count() < deadline::min().time_since_epoch().count() + margin.count())
    return deadline::min();
  return request - margin;
}

/// The two deadlines of one request. Rank-local I/O must end a margin before the
/// collectives' deadline: with one deadline for everything, a stuck server made its
/// rank reach the all-reduce after its peers had given up, and every rank lost the
/// whole prefix. With the split, the slow rank arrives by `local_io`, its failed
/// I/O only shrinks its answer, and the collectives still agree by `collective`.
/// Size the margin for the collectives themselves (the all-reduce and the
/// broadcast of the loaded chunks), and take the request deadline once, on every
/// rank, when the request arrives:
///
///   const auto dl = kvtier::phase_deadlines::split(kvtier::deadline_after(2s), 500ms);
///   std::uint64_t hit = view.lookup(keys, prompt_tokens, dl.local_io).answer_tokens;
///   kvtier::comm::all_reduce_value(comm, hit, kvtier::comm::reduce_op::min, dl.collective);
///   auto h = queue.submit(id, mine, dst, layout, dl.local_io);   // the load: local I/O
///   kvtier::chunk_broadcast(comm, own, loaded, bufs, params, dl.collective);
struct phase_deadlines {
  deadline local_io = no_deadline;    ///< lookups and loads (this rank's own I/O)
  deadline collective = no_deadline;  ///< all-reduce, broadcast: the request's deadline

  static phase_deadlines split(deadline request, clock::duration margin) noexcept {
    return {local_io_deadline(request, margin), request};
  }
};

}  // namespace kvtier
