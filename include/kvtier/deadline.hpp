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

/// A deadline `d` from now.
template <class Rep, class Period>
deadline deadline_after(std::chrono::duration<Rep, Period> d) {
  return clock::now() + std::chrono::duration_cast<clock::duration>(d);
}

/// A deadline that never passes; for callers that really mean "no limit".
inline constexpr deadline no_deadline = deadline::max();

/// True once `d` is in the past.
inline bool expired(deadline d) noexcept { return clock::now() >= d; }

/// Time left until `d`, never negative.
inline clock::duration time_left(deadline d) noexcept {
  auto now = clock::now();
  return d > now ? d - now : clock::duration::zero();
}

}  // namespace kvtier
