// The RESP bootstrap against a real redis-server: one rank publishes, W-1 rank
// threads (each with its own connection) fetch, the last reader deletes the key;
// fetchers that start first wait for the publisher; errors are bounded and named.
#include <array>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "kvtier/comm/bootstrap.hpp"
#include "kvtier/resp/asio_connection.hpp"
#include "resp_io/io_test_util.hpp"
#include "support/deadline_check.hpp"
#include "support/redis_server.hpp"

using namespace kvtier;
using namespace std::chrono_literals;
using conn_t = resp::asio_connection;

static_assert(comm::bootstrap<comm::resp_bootstrap<conn_t>>);

TEST_CASE("bootstrap (RESP): W-1 readers fetch the published bytes, the last deletes the key",
          "[integration]") {
  test::redis_server srv;
  const rank_t W = 4;
  std::array<std::byte, 128> id{};  // the size of an ncclUniqueId
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<std::byte>(i * 37 + 1);
  std::vector<std::array<std::byte, 128>> got(W);
  std::vector<std::error_code> ec(W);
  std::vector<std::thread> ranks;
  for (rank_t r = 0; r < W; ++r)
    ranks.emplace_back([&, r] {
      conn_t conn(test::options_for(srv.url()));
      comm::resp_bootstrap<conn_t> boot(conn, "job-7", "run-1", W - 1);
      const auto dl = deadline_after(10s);
      if (r == 0) {
        std::this_thread::sleep_for(100ms);  // the readers start first and wait
        ec[r] = boot.publish("nccl-id", id, dl);
      } else {
        ec[r] = boot.fetch("nccl-id", got[r], dl);
      }
    });
  for (auto& t : ranks) t.join();
  for (rank_t r = 0; r < W; ++r) {
    INFO("rank " << r);
    CHECK(!ec[r]);
    if (r > 0) CHECK(got[r] == id);
  }
  CHECK(srv.call({"EXISTS", "job-7:bootstrap:run-1:nccl-id", "job-7:bootstrap:run-1:nccl-id:reads"}) == "0");
}

TEST_CASE("bootstrap (RESP): never published times out by the deadline; a wrong size is named",
          "[integration]") {
  test::redis_server srv;
  conn_t a(test::options_for(srv.url())), b(test::options_for(srv.url()));
  comm::resp_bootstrap<conn_t> pub(a, "job-8", "r", 1), sub(b, "job-8", "r", 1, {.poll = 2ms});
  std::array<std::byte, 16> out{};
  const auto dl = deadline_after(300ms);
  CHECK(sub.fetch("never", out, dl) == errc::timeout);
  CHECK(kvtier::test::returned_by(dl));
  CHECK(sub.last_error().find("job-8:bootstrap:r:never") != std::string::npos);

  std::array<std::byte, 8> small{};
  REQUIRE(!pub.publish("id", small, deadline_after(5s)));
  CHECK(sub.fetch("id", out, deadline_after(5s)) == errc::wrong_length);
  INFO(sub.last_error());
  CHECK(sub.last_error().find("holds 8 bytes, expected 16") != std::string::npos);
  CHECK(std::stoll(srv.call({"PTTL", "job-8:bootstrap:r:id"})) > 0);  // a leftover key still expires
}

TEST_CASE("bootstrap (RESP): a restarted job never reads the previous run's id; an empty nonce is refused",
          "[integration]") {
  test::redis_server srv;
  conn_t a(test::options_for(srv.url())), b(test::options_for(srv.url()));
  std::array<std::byte, 16> old_id{}, new_id{}, got{};
  old_id.fill(std::byte{0x0D});
  new_id.fill(std::byte{0x4E});
  // Run 1 published and died before its reader came: the key stays until its TTL.
  comm::resp_bootstrap<conn_t> run1(a, "job-9", "run-1", 1);
  REQUIRE(!run1.publish("nccl-id", old_id, deadline_after(5s)));
  // Run 2 under the same name: its reader starts before run 2's rank 0 published.
  comm::resp_bootstrap<conn_t> pub(a, "job-9", "run-2", 1), sub(b, "job-9", "run-2", 1, {.poll = 2ms});
  CHECK(sub.fetch("nccl-id", got, deadline_after(200ms)) == errc::timeout);  // not run 1's bytes
  CHECK(got != old_id);
  REQUIRE(!pub.publish("nccl-id", new_id, deadline_after(5s)));
  CHECK(!sub.fetch("nccl-id", got, deadline_after(5s)));
  CHECK(got == new_id);

  comm::resp_bootstrap<conn_t> none(a, "job-9", "", 1);
  CHECK(none.publish("nccl-id", new_id, deadline_after(5s)) == errc::invalid_argument);
  CHECK(none.fetch("nccl-id", got, deadline_after(5s)) == errc::invalid_argument);
  CHECK(none.last_error().find("run nonce is empty") != std::string::npos);
}

TEST_CASE("bootstrap: launcher_run_nonce reads the launcher's job id", "[integration]") {
  const char* saved = std::getenv("PMIX_NAMESPACE");
  const std::string keep = saved ? saved : "";
  ::setenv("PMIX_NAMESPACE", "prterun-host-123@1", 1);
  CHECK(comm::launcher_run_nonce() == "pmix-prterun-host-123@1");
  if (saved)
    ::setenv("PMIX_NAMESPACE", keep.c_str(), 1);
  else
    ::unsetenv("PMIX_NAMESPACE");
}
