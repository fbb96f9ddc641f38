// The NCCL backend's decisions that need no GPU (kvtier/comm/nccl_policy.hpp): kvtier
// aborts only a communicator it created, and on an adopted stream a call's budget
// starts when the stream reaches the operation. Runs everywhere; the GPU side of
// both is checked by bench/gpu/check.sh on a lent GPU.
#include <chrono>

#include <catch2/catch.hpp>

#include "kvtier/comm/nccl_policy.hpp"

using namespace kvtier;
using namespace std::chrono_literals;
namespace np = kvtier::comm::nccl_policy;

TEST_CASE("nccl policy: only a communicator kvtier created is aborted on failure", "[unit]") {
  CHECK(np::failure_action(/*owned=*/true) == np::on_failure::abort_communicator);
  CHECK(np::failure_action(/*owned=*/false) == np::on_failure::poison_only);
  CHECK(np::to_string(np::on_failure::poison_only).find("NOT aborted") != std::string_view::npos);
}

TEST_CASE("nccl policy: on an adopted stream the budget starts when the operation starts", "[unit]") {
  const clock::time_point t0 = clock::now();
  // A 200 ms broadcast queued behind 2 s of the engine's prefill kernels.
  const auto adopted = np::op_clock::make(false, t0, t0 + 200ms, 10s);
  CHECK(adopted.from_start);
  CHECK(adopted.queue_limit() == t0 + 200ms + 10s);  // the wait for the stream is bounded
  CHECK(adopted.op_deadline(t0 + 2s) == t0 + 2s + 200ms);
  CHECK(adopted.op_deadline(t0 - 1s) == t0 + 200ms);  // never earlier than the caller's deadline

  // kvtier's own stream holds only kvtier's work: the deadline holds as given.
  const auto owned = np::op_clock::make(true, t0, t0 + 200ms, 10s);
  CHECK(!owned.from_start);
  CHECK(owned.queue_limit() == t0 + 200ms);
  CHECK(owned.op_deadline(t0 + 2s) == t0 + 200ms);
}

TEST_CASE("nccl policy: deadlines saturate and an expired deadline gives a zero budget", "[unit]") {
  const clock::time_point t0 = clock::now();
  const auto forever = np::op_clock::make(false, t0, no_deadline, 10s);
  CHECK(forever.queue_limit() == no_deadline);
  CHECK(forever.op_deadline(t0 + 1h) == no_deadline);
  const auto late = np::op_clock::make(false, t0, t0 - 5ms, -1s);
  CHECK(late.budget == clock::duration::zero());
  CHECK(late.max_queue_wait == clock::duration::zero());
  CHECK(late.queue_limit() == t0 - 5ms);
  CHECK(late.op_deadline(t0 + 3ms) == t0 + 3ms);
  const auto huge_wait = np::op_clock::make(false, t0, t0 + 1s, clock::duration::max());
  CHECK(huge_wait.queue_limit() == no_deadline);
}
