// kvtier/comm/nccl_policy.hpp: the decisions of the NCCL backend that need no GPU.
//
// nccl.hpp calls these; they are pure, so tests check them on any machine:
//   - failure_action(owned): what a failure does to the NCCL communicator. kvtier
//     aborts only a communicator it created. An adopted one (the engine's) is
//     poisoned for kvtier and reported, never aborted: ncclCommAbort frees the
//     handle, so the engine's own ncclCommDestroy would become a use-after-free and
//     every peer would lose its communicator too. Its owner decides.
//   - op_clock: when a host-waiting call's deadline runs. On kvtier's own stream
//     nothing but kvtier's work is queued, so the caller's deadline holds as given.
//     On an adopted stream the engine's earlier work (prefill kernels) runs first:
//     the budget (dl - the time of the call) starts when the stream reaches the
//     operation (an event recorded just before it completes), and the wait for
//     that is bounded by max_queue_wait past the caller's deadline.
//
//   auto clk = kvtier::comm::nccl_policy::op_clock::make(/*owned=*/false, kvtier::clock::now(), dl,
//                                                        std::chrono::seconds(10));
//   // ... poll the "begin" event until clk.queue_limit(); once it fired at t:
//   kvtier::deadline op_dl = clk.op_deadline(t);
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

#include "kvtier/deadline.hpp"

namespace kvtier::comm::nccl_policy {

enum class on_failure : std::uint8_t {
  abort_communicator,  ///< ncclCommAbort: kvtier created it, and aborting releases a stream stuck on a peer
  poison_only,         ///< adopted: kvtier stops using it and reports; the engine aborts or destroys it
};

constexpr on_failure failure_action(bool owned) noexcept {
  return owned ? on_failure::abort_communicator : on_failure::poison_only;
}

constexpr std::string_view to_string(on_failure a) noexcept {
  return a == on_failure::abort_communicator
             ? "communicator aborted"
             : "the engine's communicator was NOT aborted (kvtier does not own "
               "it): kvtier will not use it again; its owner must abort or "
               "destroy it, as its stream may still hold this operation";
}

/// The deadlines of one host-waiting call (see the file comment).
struct op_clock {
  bool from_start = false;  ///< the budget starts when the stream reaches the operation (adopted streams)
  kvtier::clock::duration budget{};
  kvtier::clock::duration max_queue_wait{};
  kvtier::clock::time_point called{};
  kvtier::deadline dl{};

  static op_clock make(bool owned, kvtier::clock::time_point called, kvtier::deadline dl,
                       kvtier::clock::duration max_queue_wait) noexcept {
    op_clock c;
    c.from_start = !owned;
    c.called = called;
    c.dl = dl;
    c.max_queue_wait =
        max_queue_wait < kvtier::clock::duration::zero() ? kvtier::clock::duration::zero() : max_queue_wait;
    c.budget = dl > called ? dl - called : kvtier::clock::duration::zero();
    return c;
  }

  /// How long to wait for the stream to reach the operation.
  kvtier::deadline queue_limit() const noexcept {
    if (!from_start) return dl;
    return add(dl, max_queue_wait);
  }
  /// The operation's deadline once it started at `started`.
  kvtier::deadline op_deadline(kvtier::clock::time_point started) const noexcept {
    if (!from_start) return dl;
    if (started < called) started = called;
    return add(started, budget);
  }

 private:
  static kvtier::deadline add(kvtier::deadline t, kvtier::clock::duration d) noexcept {
    if (t == kvtier::no_deadline || d >= kvtier::no_deadline - t) return kvtier::no_deadline;  // saturate
    return t + d;
  }
};

}  // namespace kvtier::comm::nccl_policy
