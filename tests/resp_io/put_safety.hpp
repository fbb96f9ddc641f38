// tests/resp_io/put_safety.hpp: what a remote put must never leave readable, checked the same way
// on every transport (test_remote_store_put.cpp: Asio and io_uring; test_tls.cpp: both over TLS).
//
//   require_torn_source_never_a_mixed_hit(store, salt): the put's source is rewritten from one
//     pattern into another, forward, while it is sent; reading back gives corrupt or a hit that
//     is the source as it was at one instant (the new pattern up to some point, the old one after
//     it), never old bytes after new ones: what a put that hashed slice by slice between sends
//     would store, each slice's checksum of the bytes it sent, the whole a mix no instant held.
//     (No put can tell a source torn by a writer that stopped mid-copy from a real one: such a
//     state held at one instant is a hit.)
//   require_cut_put_leaves_no_hit(store, server, salt): a put cut by its deadline mid-value (the
//     server is stopped, so the value cannot all be written) returns timeout by its deadline;
//     once the server runs again the key that had no value is a miss and the key that had one
//     still holds the old bytes (a hit): nothing partial is readable as a hit. Then, the server
//     running, puts cut at deadlines from 1 ms up read back as the old or the new value whole.
//
// Both take how the check's puts are made as a last argument: whole_put (put(), the default) or
// piecewise_put (put_pieces(), each value in consecutive slices of 64 KiB, no digests: the store
// hashes each value's pieces before sending them, as the connector's saver sends from the pages).
//
//   kvtier::test::require_cut_put_leaves_no_hit(store, srv, 0x2a0, kvtier::test::piecewise_put{});
#pragma once

#include <catch2/catch.hpp>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <thread>
#include <vector>

#include "kvtier/chunk_status.hpp"
#include "kvtier/chunker.hpp"
#include "kvtier/deadline.hpp"
#include "kvtier/store/chunk_store.hpp"
#include "resp_io/io_test_util.hpp"
#include "support/redis_server.hpp"

namespace kvtier::test {

/// A check's puts through put(): each value from one span.
struct whole_put {
  template <class Store>
  std::error_code operator()(Store& store, std::span<const chunk_key> keys,
                             std::span<const std::span<const std::byte>> src, std::span<chunk_status> status,
                             deadline dl) const {
    return store.put(keys, src, status, dl);
  }
};

/// A check's puts through put_pieces(): each value given as consecutive slices of `piece` bytes
/// (the last one shorter), no digests.
struct piecewise_put {
  std::size_t piece = 64u << 10;
  template <class Store>
  std::error_code operator()(Store& store, std::span<const chunk_key> keys,
                             std::span<const std::span<const std::byte>> src, std::span<chunk_status> status,
                             deadline dl) const {
    std::vector<std::vector<std::span<const std::byte>>> slices(src.size());
    std::vector<value_pieces> values;
    for (std::size_t i = 0; i < src.size(); ++i) {
      for (std::size_t at = 0; at < src[i].size(); at += piece)
        slices[i].push_back(src[i].subspan(at, std::min(piece, src[i].size() - at)));
      values.push_back(slices[i]);
    }
    return store.put_pieces(keys, values, {}, status, dl);
  }
};

/// True when `v` is a state a forward rewrite of `a` into `b`, block by block, passes through:
/// blocks [0, k) are b's, block k any mix of the two (the block being written), the rest a's.
inline bool forward_rewrite_state(std::span<const std::byte> v, std::span<const std::byte> a,
                                  std::span<const std::byte> b, std::size_t block) {
  std::size_t k = 0;
  while (k < v.size() && std::equal(v.begin() + k, v.begin() + std::min(v.size(), k + block), b.begin() + k))
    k += block;
  for (std::size_t i = k; i < std::min(v.size(), k + block); ++i)
    if (v[i] != a[i] && v[i] != b[i]) return false;
  k += block;
  return k >= v.size() || std::equal(v.begin() + k, v.end(), a.begin() + k);
}

template <class Store, class Put = whole_put>
void require_torn_source_never_a_mixed_hit(Store& store, std::uint64_t salt, Put put = {}) {
  using namespace std::chrono_literals;
  constexpr std::size_t bytes = 4u << 20, block = 64u << 10;
  const std::vector<std::byte> a = pattern(bytes, 71), b = pattern(bytes, 72);
  std::vector<std::byte> src, dst(bytes);
  int hits = 0, corrupt = 0, mixed_hits = 0, changed = 0;
  for (std::uint64_t round = 0; round < 16; ++round) {
    src = a;
    std::atomic<bool> go{false};
    // Rewrites the source into b, forward, a block at a time, while the put runs (deliberately
    // racing with it; yields between blocks so the rewrite spans the put).
    std::thread writer([&] {
      while (!go.load()) std::this_thread::yield();
      for (std::size_t at = 0; at < bytes; at += block) {
        std::memcpy(src.data() + at, b.data() + at, block);
        if (round % 2 == 1) std::this_thread::yield();
      }
    });
    const std::vector<chunk_key> keys = {{salt, round}};
    const std::span<const std::byte> in(src);
    const std::span<std::byte> out(dst);
    std::vector<chunk_status> st(1);
    go = true;
    const std::error_code put_ec = put(store, keys, std::span(&in, 1), st, deadline_after(30s));
    writer.join();
    INFO("round " << round << ": put " << put_ec.message() << ", " << to_string(st[0]));
    REQUIRE(st[0] == chunk_status::stored);
    REQUIRE_FALSE(store.get(keys, std::span(&out, 1), st, deadline_after(30s)));
    if (st[0] == chunk_status::hit) {
      ++hits;
      if (dst != a && dst != b) ++changed;
      // A hit is the source as it was at one instant, never earlier bytes after later ones.
      if (!forward_rewrite_state(dst, a, b, block)) ++mixed_hits;
    } else {
      ++corrupt;
      REQUIRE(st[0] == chunk_status::corrupt);
    }
  }
  INFO("hits " << hits << " (" << changed << " caught mid-rewrite), corrupt " << corrupt);
  REQUIRE(mixed_hits == 0);
  // A source left alone stores and reads back as itself.
  const std::vector<chunk_key> keys = {{salt, 99}};
  const std::span<const std::byte> in(src);
  const std::span<std::byte> out(dst);
  std::vector<chunk_status> st(1);
  REQUIRE_FALSE(put(store, keys, std::span(&in, 1), st, deadline_after(30s)));
  REQUIRE_FALSE(store.get(keys, std::span(&out, 1), st, deadline_after(30s)));
  REQUIRE(st[0] == chunk_status::hit);
  const bool same = dst == src;  // (not REQUIRE(dst == src): Catch would print megabytes)
  REQUIRE(same);
}

/// SIGSTOP for the scope (SIGCONT on leaving it, even when a REQUIRE fails inside).
class stopped_server {
 public:
  explicit stopped_server(const redis_server& s) : pid_(s.pid()) { REQUIRE(::kill(pid_, SIGSTOP) == 0); }
  ~stopped_server() { resume(); }
  stopped_server(const stopped_server&) = delete;
  stopped_server& operator=(const stopped_server&) = delete;
  void resume() noexcept {
    if (pid_ > 0) ::kill(pid_, SIGCONT);
    pid_ = -1;
  }

 private:
  pid_t pid_;
};

/// Runs `call` until it succeeds, for a bounded time: after puts that timed out, the pool's
/// circuit breaker holds the server down for a backoff (up to 4 s; calls in a row that time out
/// trip it) and refuses calls at once meanwhile; a reconnect cut short by a deadline also leaves a
/// connection in backoff for a moment. 400 tries 50 ms apart outlast either several times.
template <class Call>
std::error_code retry_while_refused(Call&& call) {
  std::error_code ec;
  for (int attempt = 0; attempt < 400; ++attempt) {
    ec = call();
    if (!ec) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return ec;
}

template <class Store, class Put = whole_put>
void require_cut_put_leaves_no_hit(Store& store, const redis_server& server, std::uint64_t salt,
                                   Put put = {}) {
  using namespace std::chrono_literals;
  // More than the loopback socket buffers take (tcp_wmem + tcp_rmem, 36 MB at most here): with the
  // server stopped, the write stops mid-value.
  constexpr std::size_t bytes = 64u << 20;
  const std::vector<chunk_key> keys = {{salt, 1}, {salt, 2}};  // 1 holds an old value, 2 nothing
  const std::vector<std::byte> old_value = pattern(bytes, 81), new_value = pattern(bytes, 82);
  std::vector<chunk_status> st(2);
  {
    const std::span<const std::byte> in(old_value);
    REQUIRE_FALSE(
        put(store, std::span(keys).first(1), std::span(&in, 1), std::span(st).first(1), deadline_after(30s)));
    REQUIRE(st[0] == chunk_status::stored);
  }
  {
    stopped_server paused(server);
    const std::span<const std::byte> in[2] = {new_value, new_value};
    const kvtier::deadline dl = deadline_after(400ms);
    const std::error_code ec = put(store, keys, in, st, dl);
    require_returned_by(dl);
    INFO("put: " << ec.message() << "; " << store.last_error());
    REQUIRE(ec == errc::timeout);
    REQUIRE(st[0] == chunk_status::timeout);
    REQUIRE(st[1] == chunk_status::timeout);
  }
  std::vector<std::byte> dst(bytes);
  const std::span<std::byte> out(dst);
  const std::error_code got_old = retry_while_refused([&] {
    return store.get(std::span(keys).first(1), std::span(&out, 1), std::span(st).first(1),
                     deadline_after(30s));
  });
  INFO("last error: " << store.last_error());
  REQUIRE_FALSE(got_old);
  REQUIRE(st[0] == chunk_status::hit);
  const bool old_kept = dst == old_value;
  REQUIRE(old_kept);
  const std::error_code got_fresh = retry_while_refused([&] {
    return store.get(std::span(keys).subspan(1), std::span(&out, 1), std::span(st).first(1),
                     deadline_after(30s));
  });
  REQUIRE_FALSE(got_fresh);
  REQUIRE(st[0] == chunk_status::miss);

  // The server running, deadlines from 1 ms up: the cut lands anywhere in the value (or after
  // it). A key then reads as its old value or the new one whole (a SET the server had all of
  // runs even when its reply came too late), a fresh key as a miss or the new value: never
  // corrupt (a part of the value stored by a command that ran, the rest cut).
  constexpr std::size_t sweep_bytes = 16u << 20;
  const std::span<const std::byte> old_part = std::span(old_value).first(sweep_bytes),
                                   new_part = std::span(new_value).first(sweep_bytes);
  const std::span<std::byte> out_part = out.first(sweep_bytes);
  for (std::uint64_t round = 0; round < 8; ++round) {
    const std::vector<chunk_key> pair = {{salt, 10}, {salt, 100 + round}};
    const std::span<const std::byte> old_in(old_part), in[2] = {new_part, new_part};
    const std::error_code put_old = retry_while_refused([&] {
      return put(store, std::span(pair).first(1), std::span(&old_in, 1), std::span(st).first(1),
                 deadline_after(30s));
    });
    REQUIRE_FALSE(put_old);
    const std::error_code ec =
        put(store, pair, in, st, deadline_after(std::chrono::milliseconds(1 << round)));
    INFO("round " << round << ": put " << ec.message());
    for (std::size_t k = 0; k < 2; ++k) {
      const chunk_status put_status = st[k];
      const std::error_code get_ec = retry_while_refused([&] {
        return store.get(std::span(pair).subspan(k, 1), std::span(&out_part, 1), std::span(st).first(1),
                         deadline_after(30s));
      });
      INFO("last error: " << store.last_error());
      REQUIRE_FALSE(get_ec);
      INFO("key " << k << ": put " << to_string(put_status) << ", then get " << to_string(st[0]));
      if (put_status == chunk_status::stored || (k == 1 && st[0] == chunk_status::hit)) {
        REQUIRE(st[0] == chunk_status::hit);
        const bool is_new = std::ranges::equal(out_part, new_part);
        REQUIRE(is_new);
      } else if (k == 0) {
        REQUIRE(st[0] == chunk_status::hit);
        const bool whole = std::ranges::equal(out_part, old_part) || std::ranges::equal(out_part, new_part);
        REQUIRE(whole);
      } else {
        REQUIRE(st[0] == chunk_status::miss);
      }
    }
  }
}

}  // namespace kvtier::test
