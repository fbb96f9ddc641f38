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

}  // namespace kvtier
