// Tests of a batch spread over pooled connections (kvtier/store/batch_spread.hpp): how a batch is
// cut, and remote_store with the cut over both transports: results in the caller's order against
// a real redis-server, one connection failing mid-batch and a deadline that passes with some
// connections done (a scripted server that fails or stalls one chosen key's connection).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/resp/asio_connection.hpp"
#include "kvtier/resp/uring_connection.hpp"
#include "kvtier/store/batch_spread.hpp"
#include "kvtier/store/remote_store.hpp"
#include "resp_io/io_test_util.hpp"
#include "resp_io/store_test_util.hpp"
#include "support/property.hpp"
#include "support/redis_server.hpp"
#include "support/scripted_server.hpp"

using namespace std::chrono_literals;
using kvtier::batch_spread;
using kvtier::chunk_key;
using kvtier::chunk_status;
using kvtier::deadline_after;
using kvtier::errc;
using kvtier::remote_store;
using kvtier::resp::asio_connection;
using kvtier::resp::uring_connection;
using kvtier::test::cspans;
using kvtier::test::keys_n;
using kvtier::test::options_for;
using kvtier::test::pattern;
using kvtier::test::redis_server;
using kvtier::test::scripted_server;
using kvtier::test::spans;
using kvtier::test::test_ns;

TEST_CASE("cut_batch: consecutive pieces, each within the limit or a single value", "[unit][property]") {
  CHECK(kvtier::detail::cut_batch(std::vector<std::size_t>{}, 10).count() == 0);
  CHECK(kvtier::detail::cut_batch(std::vector<std::size_t>{4, 4, 4, 20, 1}, 8).starts ==
        std::vector<std::size_t>{0, 2, 3, 4, 5});
  kvtier::test::prop("pieces cover the batch in order, greedily", [] {
    const auto bytes = *rc::gen::container<std::vector<std::size_t>>(rc::gen::inRange<std::size_t>(0, 100));
    const auto limit = *rc::gen::inRange<std::size_t>(1, 300);
    const kvtier::detail::batch_pieces p = kvtier::detail::cut_batch(bytes, limit);
    RC_ASSERT(p.count() == (bytes.empty() ? 0 : p.starts.size() - 1));
    if (bytes.empty()) return;
    RC_ASSERT(p.starts.front() == 0u);
    RC_ASSERT(p.starts.back() == bytes.size());
    for (std::size_t k = 0; k < p.count(); ++k) {
      const std::size_t a = p.starts[k], b = p.starts[k + 1];
      RC_ASSERT(a < b);
      const std::size_t sum = std::accumulate(bytes.begin() + a, bytes.begin() + b, std::size_t{0});
      RC_ASSERT((sum <= limit || b - a == 1));
      if (b < bytes.size()) RC_ASSERT(sum + bytes[b] > limit);  // the next value did not fit
    }
  });
}

TEMPLATE_TEST_CASE("remote_store spread: a batch over several connections keeps the caller's order",
                   "[integration]", asio_connection, uring_connection) {
  redis_server srv;
  // Pieces of at most 300 KB: values of 40 KB .. 260 KB go one to six per piece.
  remote_store<TestType> store(test_ns(), options_for(srv.url()), {.connections = 4},
                               kvtier::value_format::v1(), batch_spread{.max_reply_bytes = 300'000});
  const auto keys = keys_n(16, 3);
  std::vector<std::vector<std::byte>> src;
  for (std::size_t i = 0; i < keys.size(); ++i)
    src.push_back(pattern(40'000 + (i * 37'000) % 220'000, static_cast<unsigned>(i)));
  for (int round = 0; round < 3; ++round) kvtier::test::require_round_trip(store, keys, src);
  // A batch in the reverse order: each key still lands in its own destination.
  std::vector<chunk_key> rev(keys.rbegin(), keys.rend());
  std::vector<std::vector<std::byte>> dst;
  for (auto it = src.rbegin(); it != src.rend(); ++it) dst.emplace_back(it->size());
  std::vector<chunk_status> st(keys.size());
  REQUIRE_FALSE(store.get(rev, spans(dst), st, deadline_after(30s)));
  for (std::size_t i = 0; i < rev.size(); ++i) {
    REQUIRE(st[i] == chunk_status::hit);
    REQUIRE(dst[i] == src[keys.size() - 1 - i]);
  }
  CHECK(store.stats().corrupt == 0);
  CHECK(store.pool().stats().failures == 0);
}

namespace {

// A Redis-protocol server holding `values` (key name -> stored bytes) whose answer to GET of
// `special` is special(): the tests make that one key's connection fail or stall.
struct spread_rig {
  std::map<std::string, std::string> values;
  std::string special;
  std::function<std::string()> special_answer;
  scripted_server server{[this](const std::vector<std::string>& cmd) -> std::string {
    if (cmd[0] == "PING") return "+PONG\r\n";
    if (cmd[0] != "GET" || cmd.size() != 2) return "-ERR unexpected\r\n";
    if (cmd[1] == special) return special_answer();
    const auto it = values.find(cmd[1]);
    if (it == values.end()) return "$-1\r\n";
    return "$" + std::to_string(it->second.size()) + "\r\n" + it->second + "\r\n";
  }};
};

// Stores kvtier values (header + payload) for `keys` in `rig`; returns the payloads.
std::vector<std::vector<std::byte>> fill(spread_rig& rig, const std::vector<chunk_key>& keys,
                                         std::size_t bytes) {
  const kvtier::key_namespace ns = test_ns();
  const std::string prefix = kvtier::remote_key_prefix(ns);
  std::vector<std::vector<std::byte>> src;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    src.push_back(pattern(bytes, static_cast<unsigned>(i + 7)));
    const auto h = kvtier::encode_value_header(ns.fingerprint(), keys[i], src.back());
    std::string v(reinterpret_cast<const char*>(h.data()), h.size());
    v.append(reinterpret_cast<const char*>(src.back().data()), src.back().size());
    rig.values[kvtier::remote_key_text(prefix, keys[i])] = std::move(v);
  }
  return src;
}

}  // namespace

TEMPLATE_TEST_CASE("remote_store spread: one connection failing mid-batch fails only its own keys",
                   "[integration]", asio_connection, uring_connection) {
  spread_rig rig;
  const auto keys = keys_n(9, 5);
  const auto src = fill(rig, keys, 100'000);  // 9 x 100 KB: a large batch, one value per piece
  const std::size_t bad = 4;
  rig.special = kvtier::remote_key_text(kvtier::remote_key_prefix(test_ns()), keys[bad]);
  rig.special_answer = [] { return std::string("?not RESP\r\n"); };  // the connection's stream breaks
  remote_store<TestType> store(
      test_ns(), options_for("resp://127.0.0.1:" + std::to_string(rig.server.port())), {.connections = 4},
      kvtier::value_format::v1(), batch_spread{.max_reply_bytes = 1});
  std::vector<std::vector<std::byte>> dst(keys.size(), std::vector<std::byte>(100'000));
  std::vector<chunk_status> st(keys.size());
  const std::error_code ec = store.get(keys, spans(dst), st, deadline_after(20s));
  CHECK(ec == errc::protocol_error);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    INFO("key " << i);
    if (i == bad) {
      REQUIRE(st[i] == chunk_status::error);
    } else {
      REQUIRE(st[i] == chunk_status::hit);  // served by the other connections
      REQUIRE(dst[i] == src[i]);
    }
  }
  CHECK(store.stats().errors == 1);
  CHECK(store.last_error().find("not RESP") != std::string::npos);
}

TEMPLATE_TEST_CASE("remote_store spread: a deadline that passes with some connections done", "[integration]",
                   asio_connection, uring_connection) {
  spread_rig rig;
  const auto keys = keys_n(9, 6);
  const auto src = fill(rig, keys, 100'000);
  const std::size_t stuck = 2;
  std::atomic<bool> release{false};
  rig.special = kvtier::remote_key_text(kvtier::remote_key_prefix(test_ns()), keys[stuck]);
  rig.special_answer = [&] {  // this connection never answers in time (bounded: released at the end)
    for (int i = 0; i < 1000 && !release; ++i) std::this_thread::sleep_for(10ms);
    return std::string("$-1\r\n");
  };
  remote_store<TestType> store(
      test_ns(), options_for("resp://127.0.0.1:" + std::to_string(rig.server.port())), {.connections = 4},
      kvtier::value_format::v1(), batch_spread{.max_reply_bytes = 1});
  std::vector<std::vector<std::byte>> dst(keys.size(), std::vector<std::byte>(100'000));
  std::vector<chunk_status> st(keys.size());
  const auto dl = deadline_after(3s);
  const std::error_code ec = store.get(keys, spans(dst), st, dl);
  release = true;
  kvtier::test::require_returned_by(dl);
  CHECK(ec == errc::timeout);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    INFO("key " << i);
    if (i == stuck) {
      REQUIRE(st[i] == chunk_status::timeout);
    } else {
      REQUIRE(st[i] == chunk_status::hit);  // the other connections finished before the deadline
      REQUIRE(dst[i] == src[i]);
    }
  }
  CHECK(store.stats().timeouts == 1);
}
