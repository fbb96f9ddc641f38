// kvtier/detail/cv_wait.hpp: a condition-variable wait with a kvtier::deadline,
// where kvtier::no_deadline means "no limit".
//
// wait_until(deadline::max()) adds to the time point inside some standard
// libraries and overflows into the past (an immediate timeout), so no_deadline
// waits without a timeout. Every component waits through this helper.
//
//   std::unique_lock lock(mu);
//   if (!kvtier::detail::wait_until(cv, lock, dl, [&] { return done; })) return errc::timeout;
#pragma once

#include <condition_variable>
#include <mutex>
#include <utility>

#include "kvtier/deadline.hpp"

namespace kvtier::detail {

/// Waits until pred() holds or dl passes; returns pred() (false: timed out).
template <class Pred>
bool wait_until(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, deadline dl, Pred pred) {
  if (dl == no_deadline) {
    cv.wait(lock, pred);
    return true;
  }
  return cv.wait_until(lock, dl, std::move(pred));
}

}  // namespace kvtier::detail
