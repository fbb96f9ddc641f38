// Concurrency test of remote_store (run by the TSan build too): threads sharing one store are
// serialised on its connection, every call gets per-key statuses, and a call that cannot get
// the connection by its deadline gives up with every key timeout.
#include <catch2/catch.hpp>

#include <atomic>
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

TEMPLATE_TEST_CASE("remote_store: a call waiting for a busy store gives up at its own deadline",
                   "[integration][tsan]", kvtier::resp::asio_connection, kvtier::resp::uring_connection) {
  kvtier::test::black_hole_server hole;
  kvtier::remote_store<TestType> store(kvtier::key_namespace{.model = "busy"},
                                       kvtier::test::options_for(hole.url()));
  const chunk_key key{1, 2};
  std::atomic<bool> started{false};
  std::thread holder([&] {
    chunk_status st = chunk_status::cancelled;
    started = true;
    (void)store.exists(std::span(&key, 1), std::span(&st, 1), kvtier::deadline_after(1500ms));
  });
  while (!started) std::this_thread::yield();
  std::this_thread::sleep_for(50ms);  // the holder is (almost surely) inside its call now
  chunk_status st = chunk_status::hit;
  const auto dl = kvtier::deadline_after(200ms);
  const std::error_code ec = store.exists(std::span(&key, 1), std::span(&st, 1), dl);
  REQUIRE(ec == kvtier::errc::timeout);
  REQUIRE(st == chunk_status::timeout);
  kvtier::test::require_returned_by(dl);
  holder.join();
}
