// tests/support/locked_checks.hpp: Catch2 assertions from several threads.
//
// Catch2 v2's assertion macros are not thread-safe: two rank threads that CHECK at once race on
// the run context (ThreadSanitizer reports it). Tests that assert inside kvtier::comm::run_ranks
// lambdas use these instead: each assertion holds one process-wide lock. A failed
// LOCKED_REQUIRE throws in its thread as REQUIRE does, which ends the test run (a failure).
#pragma once

#include <mutex>

#include <catch2/catch.hpp>

namespace kvtier::test {
inline std::mutex& catch_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace kvtier::test

#define KVTIER_LOCKED(assertion)                                                   \
  do {                                                                             \
    std::lock_guard<std::mutex> kvtier_catch_lock_(::kvtier::test::catch_mutex()); \
    assertion;                                                                     \
  } while (false)
#define LOCKED_CHECK(...) KVTIER_LOCKED(CHECK(__VA_ARGS__))
#define LOCKED_CHECK_FALSE(...) KVTIER_LOCKED(CHECK_FALSE(__VA_ARGS__))
#define LOCKED_REQUIRE(...) KVTIER_LOCKED(REQUIRE(__VA_ARGS__))
#define LOCKED_REQUIRE_FALSE(...) KVTIER_LOCKED(REQUIRE_FALSE(__VA_ARGS__))
