// Concurrency test of remote_store (run by the TSan build too): threads sharing one store are
// serialised on its connection, every call gets per-key statuses, and a call that cannot get
// the connection by its deadline gives up with every key timeout.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <span>
#include <system_error>
#include <thread>
#include <vector>

#include "kvtier/resp/asio_connection.hpp"
#include "kvtier/resp/uring_connection.hpp"
#include "kvtier/store/remote_store.hpp"
#include "resp_io/io_test_util.hpp"
#include "support/redis_server.hpp"

using namespace std::chrono_literals;
using kvtier::chunk_key;
using kvtier::chunk_status;

TEMPLATE_TEST_CASE("remote_store: threads sharing a store", "[integration][tsan]",
                   kvtier::resp::asio_connection, kvtier::resp::uring_connection) {
  kvtier::test::redis_server srv;
  kvtier::remote_store<TestType> store(kvtier::key_namespace{.model = "threads"},
                                       kvtier::test::options_for(srv.url()));
  constexpr int threads = 4, rounds = 20;
  std::atomic<int> bad{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const auto payload = kvtier::test::pattern(64 << 10, static_cast<unsigned>(t));
      std::vector<std::byte> dst(payload.size());
      for (int r = 0; r < rounds; ++r) {
        const chunk_key key{static_cast<std::uint64_t>(t), static_cast<std::uint64_t>(r)};
        std::span<const std::byte> src(payload);
        std::span<std::byte> d(dst);
        chunk_status st = chunk_status::cancelled;
        if (store.put(std::span(&key, 1), std::span(&src, 1), std::span(&st, 1),
                      kvtier::deadline_after(5s)) ||
            st != chunk_status::stored)
          ++bad;
        st = chunk_status::cancelled;
        if (store.get(std::span(&key, 1), std::span(&d, 1), std::span(&st, 1), kvtier::deadline_after(5s)) ||
            st != chunk_status::hit || dst != payload)
          ++bad;
      }
    });
  }
  for (auto& th : pool) th.join();
  REQUIRE(bad.load() == 0);
  const auto s = store.stats();
  REQUIRE(s.hits == threads * rounds);
  REQUIRE(s.bytes_stored == std::uint64_t{threads} * rounds * (64 << 10));
}

/// The broken variant the deadline check must catch: a store whose calls wait for a busy
/// connection without their deadline (a plain mutex around every call), as if remote_store
/// took its connection with lock() instead of waiting at most until the deadline.
template <class Store>
struct busy_wait_ignores_deadline {
  Store& store;
  std::mutex busy;
  std::error_code exists(std::span<const chunk_key> keys, std::span<chunk_status> st, kvtier::deadline dl) {
    std::lock_guard lock(busy);
    return store.exists(keys, st, dl);
  }
};

struct busy_outcome {
  std::error_code ec;
  chunk_status st = chunk_status::hit;
  kvtier::deadline dl;
  kvtier::clock::time_point returned;
};

/// A holder's call occupies `store`'s connection for 1.5 s (the server never answers);
/// meanwhile a second call with a 200 ms deadline asks the same store.
template <class S>
busy_outcome second_call_on_busy_store(S& store) {
  const chunk_key key{1, 2};
  std::atomic<bool> started{false};
  std::thread holder([&] {
    chunk_status st = chunk_status::cancelled;
    started = true;
    (void)store.exists(std::span(&key, 1), std::span(&st, 1), kvtier::deadline_after(3000ms));
  });
  while (!started) std::this_thread::yield();
  std::this_thread::sleep_for(50ms);  // the holder is (almost surely) inside its call now
  busy_outcome out;
  out.dl = kvtier::deadline_after(200ms);
  out.ec = store.exists(std::span(&key, 1), std::span(&out.st, 1), out.dl);
  out.returned = kvtier::clock::now();
  holder.join();
  return out;
}

TEMPLATE_TEST_CASE("remote_store: a call waiting for a busy store gives up at its own deadline",
                   "[integration][tsan]", kvtier::resp::asio_connection, kvtier::resp::uring_connection) {
  kvtier::test::black_hole_server hole;
  kvtier::remote_store<TestType> store(kvtier::key_namespace{.model = "busy"},
                                       kvtier::test::options_for(hole.url()));
  const busy_outcome out = second_call_on_busy_store(store);
  REQUIRE(out.ec == kvtier::errc::timeout);
  REQUIRE(out.st == chunk_status::timeout);
  INFO("returned " << std::chrono::duration_cast<std::chrono::milliseconds>(out.returned - out.dl).count()
                   << " ms past its deadline");
  REQUIRE(kvtier::test::returned_by(out.dl, out.returned));
}

// The test above can fail: a store that waits for the busy connection without its deadline
// returns the same error and statuses (its own call then starts past the deadline), about
// 2.75 s late (the holder's 3 s less the 250 ms before the second call's deadline), well past
// deadline_margin (1 s) even when a loaded machine delays the second call.
TEST_CASE("remote_store: the busy-store deadline check catches a store that ignores its deadline",
          "[integration][tsan]") {
  kvtier::test::black_hole_server hole;
  kvtier::remote_store<kvtier::resp::asio_connection> store(kvtier::key_namespace{.model = "busy"},
                                                            kvtier::test::options_for(hole.url()));
  busy_wait_ignores_deadline<decltype(store)> broken{store, {}};
  const busy_outcome out = second_call_on_busy_store(broken);
  REQUIRE(out.ec == kvtier::errc::timeout);  // the other checks cannot tell,
  REQUIRE(out.st == chunk_status::timeout);
  REQUIRE(out.returned < out.dl + 5s);  // it waited for the holder (~2.75 s), not for ever
  REQUIRE_FALSE(kvtier::test::returned_by(out.dl, out.returned));  // caught
}
