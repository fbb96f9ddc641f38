// fetch_queue: unit and regression tests (completion before the waiter
// registers, a missing key completes as a miss at once, eviction between lookup
// and load, cancel/shutdown/back-pressure, prefetch reuse).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <limits>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "kvtier/fetch_queue.hpp"
#include "kvtier/lookup.hpp"
#include "kvtier/metrics.hpp"
#include "kvtier/store/memory_store.hpp"
#include "kvtier/store/tiered_store.hpp"
#include "store/store_fakes.hpp"
#include "support/deadline_check.hpp"

using namespace kvtier;
using namespace std::chrono_literals;
using kvtier::test::gated_key;
using kvtier::test::gated_store;

namespace {

constexpr std::size_t T = 16;  // tokens per chunk
constexpr std::size_t B = 64;  // bytes per chunk

chunk_key key(std::uint64_t i) { return chunk_key{7, i}; }

std::vector<std::byte> value(std::uint64_t i) {
  std::vector<std::byte> v(B);
  for (std::size_t j = 0; j < B; ++j) v[j] = static_cast<std::byte>((i * 13 + j) & 0xff);
  return v;
}

void fill(memory_store& s, std::initializer_list<std::uint64_t> ids) {
  for (auto i : ids) {
    auto v = value(i);
    chunk_key k = key(i);
    std::span<const std::byte> src[1] = {v};
    chunk_status st[1];
    s.put(std::span<const chunk_key>(&k, 1), src, st, deadline_after(1s));
    REQUIRE(st[0] == chunk_status::stored);
  }
}

struct buffers {
  std::vector<std::vector<std::byte>> data;
  std::vector<std::span<std::byte>> spans;
  explicit buffers(std::size_t n) : data(n, std::vector<std::byte>(B)) {
    spans.assign(data.begin(), data.end());
  }
};

std::vector<chunk_key> keys_of(std::size_t first, std::size_t n) {
  std::vector<chunk_key> k;
  for (std::size_t i = 0; i < n; ++i) k.push_back(key(first + i));
  return k;
}

// A store wrapper that counts the keys each call asks for.
template <class S>
struct counting_store {
  S& inner;
  std::atomic<std::size_t> get_keys{0}, exists_keys{0};
  std::error_code exists(std::span<const chunk_key> k, std::span<chunk_status> s, deadline dl) {
    exists_keys += k.size();
    return inner.exists(k, s, dl);
  }
  std::error_code get(std::span<const chunk_key> k, std::span<const std::span<std::byte>> d,
                      std::span<chunk_status> s, deadline dl) {
    get_keys += k.size();
    return inner.get(k, d, s, dl);
  }
  std::error_code put(std::span<const chunk_key> k, std::span<const std::span<const std::byte>> d,
                      std::span<chunk_status> s, deadline dl) {
    return inner.put(k, d, s, dl);
  }
};

const auto far = 30s;  // deadlines tests never reach; waits are bounded by `limit`
const auto limit = 10s;

}  // namespace

TEST_CASE("fetch_queue: a load returns the bytes and the whole prefix", "[unit]") {
  memory_store s(1 << 20);
  fill(s, {0, 1, 2});
  metrics m;
  fetch_queue q(s, {.metrics = &m});
  buffers out(3);
  auto h = q.submit(1, keys_of(0, 3), out.spans, chunk_layout::contiguous(0, 3, T), deadline_after(far));
  auto r = q.wait(h, deadline_after(limit)).value();
  REQUIRE(r.state == fetch_state::done);
  REQUIRE_FALSE(r.ec);
  REQUIRE(r.answer_tokens == 3 * T);
  REQUIRE(r.answer_chunks == 3);
  for (std::uint64_t i = 0; i < 3; ++i) REQUIRE(out.data[i] == value(i));
  REQUIRE(m.loads.value() == 1);
  REQUIRE(m.bytes_loaded.value() == 3 * B);
  REQUIRE(q.stats().requests_in_flight == 0);
  REQUIRE(q.stats().bytes_in_flight == 0);
}

TEST_CASE("regression: a read of a missing key completes as a miss at once", "[unit]") {
  memory_store s(1 << 20);
  fetch_queue q(s);
  buffers out(1);
  // The deadline is an hour away: the result must not wait for it.
  auto h = q.submit(1, keys_of(5, 1), out.spans, chunk_layout::contiguous(5, 1, T), deadline_after(1h));
  auto r = q.wait(h, deadline_after(limit)).value();
  REQUIRE(r.state == fetch_state::done);
  REQUIRE(r.status == std::vector<chunk_status>{chunk_status::miss});
  REQUIRE(r.answer_tokens == 5 * T);  // nothing loaded: the chunk's own start
  REQUIRE(r.answer_chunks == 0);
}

TEST_CASE("regression: a completion signalled before the waiter registers is not lost", "[unit][tsan]") {
  memory_store s(1 << 20);
  fill(s, {0});
  fetch_queue q(s);
  buffers out(1);

  SECTION("callback registered after completion runs at once") {
    auto h = q.submit(1, keys_of(0, 1), out.spans, chunk_layout::contiguous(0, 1, T), deadline_after(far));
    const auto stop = deadline_after(limit);
    while (!q.poll(h) && !expired(stop)) std::this_thread::yield();
    REQUIRE(q.poll(h).value().state == fetch_state::done);
    int calls = 0;
    q.on_complete(h, [&](const fetch_result& r) {
      ++calls;
      REQUIRE(r.state == fetch_state::done);
    });
    REQUIRE(calls == 1);  // ran in this thread, before on_complete returned
    REQUIRE(q.wait(h, deadline_after(1ms)).value().state == fetch_state::done);  // no wait needed
  }

  SECTION("registration racing completion: exactly one call each") {
    constexpr int n = 2000;
    std::vector<std::atomic<int>> calls(n);
    std::vector<fetch_handle> hs;
    for (int i = 0; i < n; ++i) {
      auto h = q.submit(i, keys_of(0, 1), out.spans, chunk_layout::contiguous(0, 1, T), deadline_after(far));
      if (i % 3 == 0) std::this_thread::yield();  // vary who wins
      q.on_complete(h, [&calls, i](const fetch_result&) { calls[i]++; });
      hs.push_back(h);
      q.wait(h, deadline_after(limit));  // one at a time: `out` is shared
    }
    for (auto& h : hs) REQUIRE(q.poll(h).value().state == fetch_state::done);
    // A callback runs before or right after the result is published; wait briefly for stragglers.
    const auto stop = deadline_after(limit);
    auto all_one = [&] {
      for (auto& c : calls)
        if (c.load() != 1) return false;
      return true;
    };
    while (!all_one() && !expired(stop)) std::this_thread::sleep_for(1ms);
    for (auto& c : calls) REQUIRE(c.load() == 1);
  }
}

TEST_CASE("fetch_queue: eviction between lookup and load truncates the prefix at the gap", "[unit]") {
  // L1 holds exactly 4 chunks.
  memory_store s(4 * B);
  fill(s, {0, 1, 2, 3});
  fetch_queue q(s);
  const auto keys = keys_of(0, 4);
  auto lk =
      q.wait(q.lookup(1, keys, chunk_layout::contiguous(0, 4, T), deadline_after(far)), deadline_after(limit))
          .value();
  REQUIRE(lk.state == fetch_state::done);
  REQUIRE(lk.answer_tokens == 4 * T);

  // Touch chunk 0, then store another chunk: chunk 1 (now least recently used) goes.
  buffers one(1);
  q.wait(q.submit(2, keys_of(0, 1), one.spans, chunk_layout::contiguous(0, 1, T), deadline_after(far)),
         deadline_after(limit));
  fill(s, {99});
  REQUIRE_FALSE(s.contains(key(1)));

  buffers out(4);
  auto r = q.wait(q.submit(1, keys, out.spans, chunk_layout::contiguous(0, 4, T), deadline_after(far)),
                  deadline_after(limit))
               .value();
  REQUIRE(r.state == fetch_state::done);
  REQUIRE(r.status == std::vector<chunk_status>{chunk_status::hit, chunk_status::miss, chunk_status::hit,
                                                chunk_status::hit});
  REQUIRE(r.answer_tokens == 1 * T);  // chunks 2 and 3 arrived but lie past the gap
  REQUIRE(r.answer_chunks == 1);
  REQUIRE(out.data[0] == value(0));
}

TEST_CASE("fetch_queue: eviction with a tiered store whose L1 is too small", "[unit]") {
  memory_store l1(2 * B), l2(1 << 20);
  fill(l2, {0, 1, 2, 3});
  tiered_store t(l1, l2);
  fetch_queue q(t);
  const auto keys = keys_of(0, 4);
  auto lk =
      q.wait(q.lookup(1, keys, chunk_layout::contiguous(0, 4, T), deadline_after(far)), deadline_after(limit))
          .value();
  REQUIRE(lk.answer_tokens == 4 * T);
  l2.erase(key(2));  // evicted from L2 after the lookup; L1 cannot hold it either
  buffers out(4);
  auto r = q.wait(q.submit(1, keys, out.spans, chunk_layout::contiguous(0, 4, T), deadline_after(far)),
                  deadline_after(limit))
               .value();
  REQUIRE(r.answer_tokens == 2 * T);
  REQUIRE(out.data[0] == value(0));
  REQUIRE(out.data[1] == value(1));
  REQUIRE(l1.entry_count() <= 2);
}

TEST_CASE("fetch_queue: cancel a queued request, a running one, a finished one", "[unit][tsan]") {
  gated_store g;
  fetch_queue q(g, {.workers = 1});
  buffers a(1), b(1);
  auto ha = q.submit(1, std::vector{gated_key(1, 0, 1)}, a.spans, chunk_layout::contiguous(0, 1, T),
                     deadline_after(far));
  REQUIRE(g.wait_started(1));
  auto hb = q.submit(2, std::vector{gated_key(2, 0, 1)}, b.spans, chunk_layout::contiguous(0, 1, T),
                     deadline_after(far));
  // Queued: fails at once.
  REQUIRE(q.cancel(hb));
  auto rb = q.poll(hb).value();
  REQUIRE(rb.state == fetch_state::failed);
  REQUIRE(rb.ec == errc::cancelled);
  REQUIRE(rb.status == std::vector<chunk_status>{chunk_status::cancelled});
  REQUIRE(rb.answer_tokens == 0);
  // Running: completes as cancelled only once the store call returns.
  REQUIRE(q.cancel(ha));
  REQUIRE(!q.poll(ha));
  g.release(1);
  auto ra = q.wait(ha, deadline_after(limit)).value();
  REQUIRE(ra.state == fetch_state::failed);
  REQUIRE(ra.ec == errc::cancelled);
  REQUIRE_FALSE(q.cancel(ha));
  REQUIRE_FALSE(g.started(2));  // the cancelled queued request never reached the store
  // Finished: cancel says no.
  g.release(3);
  auto hc = q.submit(3, std::vector{gated_key(3, 0, 1)}, a.spans, chunk_layout::contiguous(0, 1, T),
                     deadline_after(far));
  REQUIRE(q.wait(hc, deadline_after(limit)).value().state == fetch_state::done);
  REQUIRE_FALSE(q.cancel(hc));
}

TEST_CASE("fetch_queue: shutdown drains queued work with a status; later submits fail", "[unit][tsan]") {
  gated_store g;
  auto q = std::make_unique<fetch_queue<gated_store>>(g, fetch_queue_options{.workers = 1});
  std::vector<buffers> bufs;
  for (int i = 0; i < 5; ++i) bufs.emplace_back(1);
  std::vector<fetch_handle> hs;
  for (std::uint64_t i = 0; i < 5; ++i) {
    hs.push_back(q->submit(i, std::vector{gated_key(i, 0, 1)}, bufs[i].spans,
                           chunk_layout::contiguous(0, 1, T), deadline_after(far)));
    if (i == 0) REQUIRE(g.wait_started(0));
  }
  q->close();
  for (int i = 1; i < 5; ++i) {
    auto r = q->poll(hs[i]).value();
    REQUIRE(r.state == fetch_state::failed);
    REQUIRE(r.ec == errc::shutdown);
  }
  REQUIRE(!q->poll(hs[0]));  // running: finishes normally
  auto late =
      q->lookup(9, std::vector{gated_key(9, 0, 1)}, chunk_layout::contiguous(0, 1, T), deadline_after(far));
  REQUIRE(q->poll(late).value().ec == errc::shutdown);
  g.release(0);
  q->shutdown();
  REQUIRE(q->poll(hs[0]).value().state == fetch_state::done);
  REQUIRE(q->stats().requests_in_flight == 0);
  q.reset();
  REQUIRE(g.calls() == 1);
}

TEST_CASE("fetch_queue: bounded requests and bytes; queue_full is visible and clears", "[unit][tsan]") {
  gated_store g;
  metrics m;
  fetch_queue q(g, {.workers = 1, .max_requests = 2, .max_bytes_in_flight = 3 * B, .metrics = &m});
  buffers a(2), b(1), c(1), big(4);
  auto ha = q.submit(1, std::vector{gated_key(1, 0, 3), gated_key(1, 1, 3)}, a.spans,
                     chunk_layout::contiguous(0, 2, T), deadline_after(far));
  REQUIRE(q.stats().bytes_in_flight == 2 * B);
  auto hbig = q.submit(4, keys_of(0, 4), big.spans, chunk_layout::contiguous(0, 4, T), deadline_after(far));
  REQUIRE(q.poll(hbig).value().ec == errc::too_large);
  auto hb = q.submit(2, std::vector{gated_key(2, 0, 1)}, b.spans, chunk_layout::contiguous(0, 1, T),
                     deadline_after(far));
  REQUIRE(!q.poll(hb));
  auto hc = q.submit(3, std::vector{gated_key(3, 0, 1)}, c.spans, chunk_layout::contiguous(0, 1, T),
                     deadline_after(far));
  auto rc = q.poll(hc).value();
  REQUIRE(rc.state == fetch_state::failed);
  REQUIRE(rc.ec == errc::queue_full);
  REQUIRE(m.rejected.value() == 2);
  g.release(1);
  REQUIRE(q.wait(ha, deadline_after(limit)).value().state == fetch_state::done);
  // The slot is free as soon as the completion is visible.
  auto hc2 = q.submit(3, std::vector{gated_key(3, 0, 1)}, c.spans, chunk_layout::contiguous(0, 1, T),
                      deadline_after(far));
  const auto r2 = q.poll(hc2);  // pending (queued) or done, never refused
  REQUIRE((!r2 || r2->state != fetch_state::failed));
  g.release_all();
  REQUIRE(q.wait(hb, deadline_after(limit)).value().state == fetch_state::done);
  REQUIRE(q.wait(hc2, deadline_after(limit)).value().state == fetch_state::done);
}

TEST_CASE("fetch_queue: a store that never answers is cut off by the deadline", "[unit][tsan]") {
  gated_store g;  // never released
  fetch_queue q(g);
  buffers out(2);
  const auto dl = deadline_after(100ms);
  auto h = q.submit(1, std::vector{gated_key(1, 0, 3), gated_key(1, 1, 3)}, out.spans,
                    chunk_layout::contiguous(0, 2, T), dl);
  const auto done = q.wait(h, dl + kvtier::test::deadline_margin);
  REQUIRE(done);  // completed by its deadline (plus scheduling margin)
  REQUIRE(kvtier::test::returned_by(dl));
  const fetch_result& r = *done;
  REQUIRE(r.state == fetch_state::done);
  REQUIRE(r.ec == errc::timeout);
  REQUIRE(r.status == std::vector<chunk_status>(2, chunk_status::timeout));
  REQUIRE(r.answer_tokens == 0);

  auto h2 = q.submit(2, std::vector{gated_key(2, 0, 1)}, std::span(out.spans).first(1),
                     chunk_layout::contiguous(0, 1, T), clock::now() - 1ms);
  auto r2 = q.wait(h2, deadline_after(limit)).value();
  REQUIRE(r2.ec == errc::timeout);
  g.release_all();
}

TEST_CASE("fetch_queue: a throwing store still completes the request once", "[unit]") {
  kvtier::test::throwing_store s;
  fetch_queue q(s);
  int calls = 0;
  auto h = q.lookup(1, keys_of(0, 2), chunk_layout::contiguous(0, 2, T), deadline_after(far));
  auto r = q.wait(h, deadline_after(limit)).value();
  q.on_complete(h, [&](const fetch_result&) { ++calls; });
  // The store's exception is no cancel: every key error, the code and the words say it threw.
  REQUIRE(r.state == fetch_state::done);
  REQUIRE(r.ec == errc::store_threw);
  REQUIRE(r.status == std::vector<chunk_status>(2, chunk_status::error));
  REQUIRE(r.message == "the store threw: throwing_store");
  REQUIRE(r.answer_tokens == 0);
  REQUIRE(calls == 1);
}

TEST_CASE("fetch_queue: a store that throws mid-load keeps what earlier calls landed", "[unit]") {
  memory_store mem(1 << 20);
  fill(mem, {0, 1, 2});
  struct second_get_throws {  // the second get throws std::bad_alloc (a store out of memory)
    memory_store& inner;
    std::atomic<int> gets{0};
    std::error_code exists(std::span<const chunk_key> k, std::span<chunk_status> s, deadline dl) {
      return inner.exists(k, s, dl);
    }
    std::error_code get(std::span<const chunk_key> k, std::span<const std::span<std::byte>> d,
                        std::span<chunk_status> s, deadline dl) {
      if (gets++ == 1) throw std::bad_alloc();
      return inner.get(k, d, s, dl);
    }
    std::error_code put(std::span<const chunk_key> k, std::span<const std::span<const std::byte>> d,
                        std::span<chunk_status> s, deadline dl) {
      return inner.put(k, d, s, dl);
    }
  } s{mem};
  fetch_queue q(s, {.workers = 1, .max_batch_chunks = 1});
  buffers out(3);
  const auto h =
      q.submit(1, keys_of(0, 3), out.spans, chunk_layout::contiguous(0, 3, T), deadline_after(far));
  const auto r = q.wait(h, deadline_after(limit));
  REQUIRE(r.has_value());
  REQUIRE(r->state == fetch_state::done);
  REQUIRE(r->ec == errc::store_threw);
  REQUIRE(r->status ==
          std::vector<chunk_status>{chunk_status::hit, chunk_status::error, chunk_status::error});
  REQUIRE(r->answer_tokens == T);  // the first chunk landed before the throw, and stays landed
  REQUIRE(r->message == "the store threw: std::bad_alloc");
  REQUIRE(q.progress(h).answer_tokens == T);
  REQUIRE(q.stats().requests_in_flight == 0);
}

TEST_CASE("fetch_queue: bad arguments are refused with a status", "[unit]") {
  memory_store s(1 << 20);
  fetch_queue q(s);
  buffers out(1);
  auto h = q.submit(1, keys_of(0, 2), out.spans, chunk_layout::contiguous(0, 2, T), deadline_after(far));
  REQUIRE(q.poll(h).value().ec == errc::invalid_argument);
  auto h2 = q.lookup(1, keys_of(0, 2), chunk_layout::contiguous(0, 3, T), deadline_after(far));
  REQUIRE(q.poll(h2).value().ec == errc::invalid_argument);
  REQUIRE(q.poll(fetch_handle{}).value().ec == errc::invalid_argument);
}

TEST_CASE("fetch_queue: byte counts that would wrap past SIZE_MAX are too_large", "[unit]") {
  memory_store s(1 << 20);  // the keys are absent: nothing is ever written through the spans
  fetch_queue q(s);
  const std::size_t half = std::numeric_limits<std::size_t>::max() / 2 + 1;
  // Prefetch: chunk_bytes * keys wraps to 2; the staging would be 2 bytes under 2^63-byte spans.
  auto p = q.prefetch(1, keys_of(0, 2), half + 1, chunk_layout::contiguous(0, 2, T), deadline_after(far));
  auto rp = q.wait(p, deadline_after(limit)).value();
  REQUIRE(rp.state == fetch_state::failed);
  REQUIRE(rp.ec == errc::too_large);
  // Load: the destination sizes sum to 2^64, which wraps to 0.
  std::vector<std::byte> small(1);
  std::vector<std::span<std::byte>> dst{std::span<std::byte>(small.data(), half),
                                        std::span<std::byte>(small.data(), half)};
  auto l = q.submit(2, keys_of(0, 2), dst, chunk_layout::contiguous(0, 2, T), deadline_after(far));
  auto rl = q.wait(l, deadline_after(limit)).value();
  REQUIRE(rl.state == fetch_state::failed);
  REQUIRE(rl.ec == errc::too_large);
  REQUIRE(q.stats().bytes_in_flight == 0);
  REQUIRE(q.stats().requests_in_flight == 0);
}

TEST_CASE("fetch_queue: a load reuses a finished prefetch instead of reading again", "[unit]") {
  memory_store s(1 << 20);
  fill(s, {0, 1, 2, 3});
  counting_store<memory_store> cs{s};
  metrics m;
  fetch_queue q(cs, {.metrics = &m});
  const auto keys = keys_of(0, 5);  // chunk 4 is absent
  auto p = q.wait(q.prefetch(42, keys, B, chunk_layout::contiguous(0, 5, T), deadline_after(far)),
                  deadline_after(limit))
               .value();
  REQUIRE(p.state == fetch_state::done);
  REQUIRE(p.answer_tokens == 4 * T);  // the prefetch doubles as the lookup
  REQUIRE(q.stats().prefetches_held == 1);
  REQUIRE(q.stats().bytes_in_flight == 5 * B);
  REQUIRE(cs.get_keys == 5);

  buffers out(5);
  auto r = q.wait(q.submit(42, keys, out.spans, chunk_layout::contiguous(0, 5, T), deadline_after(far)),
                  deadline_after(limit))
               .value();
  REQUIRE(r.state == fetch_state::done);
  REQUIRE(r.answer_tokens == 4 * T);
  for (std::uint64_t i = 0; i < 4; ++i) REQUIRE(out.data[i] == value(i));
  REQUIRE(cs.get_keys == 6);  // only the chunk the prefetch missed was asked again
  REQUIRE(m.prefetch_reused.value() == 4);
  REQUIRE(q.stats().prefetches_held == 0);
  REQUIRE(q.stats().bytes_in_flight == 0);

  // A load with another id reads from the store.
  auto r2 = q.wait(q.submit(43, keys_of(0, 2), std::span(out.spans).first(2),
                            chunk_layout::contiguous(0, 2, T), deadline_after(far)),
                   deadline_after(limit))
                .value();
  REQUIRE(r2.answer_tokens == 2 * T);
  REQUIRE(cs.get_keys == 8);
}

TEST_CASE("fetch_queue: a load submitted while its prefetch runs waits for it, no second read",
          "[unit][tsan]") {
  gated_store g;
  fetch_queue q(g, {.workers = 2});
  std::vector<chunk_key> keys{gated_key(5, 0, 0b011), gated_key(5, 1, 0b011), gated_key(5, 2, 0b011)};
  auto hp = q.prefetch(5, keys, B, chunk_layout::contiguous(0, 3, T), deadline_after(far));
  REQUIRE(g.wait_started(5));
  buffers out(3);
  auto hl = q.submit(5, keys, out.spans, chunk_layout::contiguous(0, 3, T), deadline_after(far));
  REQUIRE(!q.poll(hl));
  g.release(5);
  auto r = q.wait(hl, deadline_after(limit)).value();
  REQUIRE(r.state == fetch_state::done);
  REQUIRE(r.answer_tokens == 2 * T);
  for (std::size_t c = 0; c < 2; ++c)
    for (std::size_t j = 0; j < B; ++j) REQUIRE(out.data[c][j] == kvtier::test::gated_byte(keys[c], j));
  REQUIRE(q.poll(hp).value().state == fetch_state::done);
  REQUIRE(g.calls() == 2);  // the prefetch, and the load asking only for the chunk the prefetch missed
  REQUIRE(q.stats().bytes_in_flight == 0);
}

TEST_CASE("fetch_queue: release_prefetch frees staging; a cancelled prefetch is read again", "[unit]") {
  memory_store s(1 << 20);
  fill(s, {0, 1});
  fetch_queue q(s);
  auto p = q.wait(q.prefetch(1, keys_of(0, 2), B, chunk_layout::contiguous(0, 2, T), deadline_after(far)),
                  deadline_after(limit))
               .value();
  REQUIRE(p.state == fetch_state::done);
  REQUIRE(q.stats().bytes_in_flight == 2 * B);
  q.release_prefetch(1);
  REQUIRE(q.stats().bytes_in_flight == 0);
  REQUIRE(q.stats().prefetches_held == 0);
  // A second prefetch under the same id replaces the first.
  q.wait(q.prefetch(2, keys_of(0, 2), B, chunk_layout::contiguous(0, 2, T), deadline_after(far)),
         deadline_after(limit));
  q.wait(q.prefetch(2, keys_of(0, 1), B, chunk_layout::contiguous(0, 1, T), deadline_after(far)),
         deadline_after(limit));
  REQUIRE(q.stats().prefetches_held == 1);
  REQUIRE(q.stats().bytes_in_flight == 1 * B);
  buffers out(2);
  auto r =
      q.wait(q.submit(2, keys_of(0, 2), out.spans, chunk_layout::contiguous(0, 2, T), deadline_after(far)),
             deadline_after(limit))
          .value();
  REQUIRE(r.answer_tokens == 2 * T);
  REQUIRE(out.data[1] == value(1));
  REQUIRE(q.stats().bytes_in_flight == 0);
}

TEST_CASE("fetch_queue: a cancelled prefetch gives back its staging at once", "[unit][tsan]") {
  gated_store g;
  fetch_queue q(g, {.workers = 1});
  std::vector<chunk_key> busy{gated_key(1, 0, 1)};
  auto hb = q.lookup(1, busy, chunk_layout::contiguous(0, 1, T), deadline_after(far));
  REQUIRE(g.wait_started(1));  // the only worker is taken: the prefetch stays queued
  std::vector<chunk_key> keys{gated_key(2, 0, 0b11), gated_key(2, 1, 0b11)};
  auto hp = q.prefetch(9, keys, B, chunk_layout::contiguous(0, 2, T), deadline_after(far));
  REQUIRE(q.stats().bytes_in_flight == 2 * B);
  REQUIRE(q.cancel(hp));
  REQUIRE(q.poll(hp).value().ec == errc::cancelled);
  REQUIRE(q.stats().bytes_in_flight == 0);  // was held (2 * B) until a load or release_prefetch
  REQUIRE(q.stats().prefetches_held == 0);
  // A cancelled running prefetch too, once its store call returns.
  auto hp2 = q.prefetch(10, keys, B, chunk_layout::contiguous(0, 2, T), deadline_after(far));
  g.release(1);
  REQUIRE(g.wait_started(2));
  REQUIRE(q.cancel(hp2));
  g.release(2);
  REQUIRE(q.wait(hp2, deadline_after(limit)).value().ec == errc::cancelled);
  REQUIRE(q.wait(hb, deadline_after(limit)).value().state == fetch_state::done);
  REQUIRE(q.stats().bytes_in_flight == 0);
  REQUIRE(q.stats().prefetches_held == 0);
  // A load under the cancelled prefetch's id reads everything from the store.
  buffers out(2);
  auto r = q.wait(q.submit(10, keys, out.spans, chunk_layout::contiguous(0, 2, T), deadline_after(far)),
                  deadline_after(limit))
               .value();
  REQUIRE(r.answer_tokens == 2 * T);
  for (std::size_t c = 0; c < 2; ++c)
    for (std::size_t j = 0; j < B; ++j) REQUIRE(out.data[c][j] == kvtier::test::gated_byte(keys[c], j));
}

TEST_CASE("fetch_queue: callbacks may call back into the queue", "[unit][tsan]") {
  // Callbacks run in a worker, in the thread calling cancel(), and in the one
  // calling close(); none holds a queue lock there. Catch2 is not thread-safe,
  // so the callbacks only record what they saw.
  gated_store g;
  fetch_queue q(g, {.workers = 1});
  const auto layout = chunk_layout::contiguous(0, 1, T);
  auto keys = [](std::uint64_t tag) { return std::vector<chunk_key>{gated_key(tag, 0, 1)}; };
  struct seen {
    std::atomic<int> calls{0}, nested{0};
    std::atomic<bool> cancel_ok{true};
    fetch_handle follow;  // written before `calls` is incremented (release), read after
  };
  seen s1, s3, s5;
  auto cb = [&q, &keys, layout](seen& s, fetch_handle self, std::uint64_t follow_tag) {
    return [&q, &keys, layout, &s, self, follow_tag](const fetch_result&) {
      s.cancel_ok = q.cancel(self);                                    // already completed: false
      q.on_complete(self, [&s](const fetch_result&) { s.nested++; });  // runs at once, here
      s.follow = q.lookup(follow_tag, keys(follow_tag), layout, deadline_after(far));
      s.calls.fetch_add(1, std::memory_order_release);
    };
  };
  auto h1 = q.lookup(1, keys(1), layout, deadline_after(far));
  REQUIRE(g.wait_started(1));
  q.on_complete(h1, cb(s1, h1, 2));                             // completes in the worker
  auto h3 = q.lookup(3, keys(3), layout, deadline_after(far));  // queued behind h1
  q.on_complete(h3, cb(s3, h3, 4));
  REQUIRE(q.cancel(h3));  // callback runs here, in cancel()
  REQUIRE(s3.calls.load(std::memory_order_acquire) == 1);
  REQUIRE(s3.nested == 1);
  REQUIRE_FALSE(s3.cancel_ok);
  g.release(1);
  const auto stop = deadline_after(limit);
  while (s1.calls.load(std::memory_order_acquire) == 0 && !expired(stop)) std::this_thread::sleep_for(1ms);
  REQUIRE(s1.calls.load(std::memory_order_acquire) == 1);
  REQUIRE(s1.nested == 1);
  REQUIRE_FALSE(s1.cancel_ok);
  g.release(2);
  g.release(4);
  REQUIRE(q.wait(s1.follow, deadline_after(limit)).value().state == fetch_state::done);
  REQUIRE(q.wait(s3.follow, deadline_after(limit)).value().state == fetch_state::done);
  // close(): a queued request's callback runs in close(); its own submit is refused.
  auto h6 = q.lookup(6, keys(6), layout, deadline_after(far));
  REQUIRE(g.wait_started(6));
  auto h5 = q.lookup(5, keys(5), layout, deadline_after(far));
  q.on_complete(h5, cb(s5, h5, 7));
  q.close();
  REQUIRE(s5.calls.load(std::memory_order_acquire) == 1);
  REQUIRE(q.poll(h5).value().ec == errc::shutdown);
  REQUIRE(q.poll(s5.follow).value().ec == errc::shutdown);
  g.release(6);
  REQUIRE(q.wait(h6, deadline_after(limit)).value().state == fetch_state::done);
  q.shutdown();
  REQUIRE(s1.calls == 1);
  REQUIRE(s3.calls == 1);
  REQUIRE(s5.calls == 1);
}

TEST_CASE("fetch_queue: close() completes every queued request even if a callback throws", "[unit][tsan]") {
  gated_store g;
  fetch_queue q(g, {.workers = 1});
  const auto layout = chunk_layout::contiguous(0, 1, T);
  auto keys = [](std::uint64_t tag) { return std::vector<chunk_key>{gated_key(tag, 0, 1)}; };
  auto busy = q.lookup(1, keys(1), layout, deadline_after(far));
  REQUIRE(g.wait_started(1));  // the only worker is taken: the next two stay queued
  auto h2 = q.lookup(2, keys(2), layout, deadline_after(far));
  auto h3 = q.lookup(3, keys(3), layout, deadline_after(far));
  q.on_complete(h2, [](const fetch_result&) { throw std::runtime_error("callback"); });
  int calls3 = 0;
  q.on_complete(h3, [&](const fetch_result&) { ++calls3; });
  REQUIRE_THROWS_AS(q.close(), std::runtime_error);  // reaches the thread that ran it
  REQUIRE(q.poll(h2).value().ec == errc::shutdown);
  REQUIRE(q.poll(h3).value().ec == errc::shutdown);  // was left pending forever
  REQUIRE(calls3 == 1);
  g.release(1);
  REQUIRE(q.wait(busy, deadline_after(limit)).value().state == fetch_state::done);
  q.shutdown();
  REQUIRE(q.stats().requests_in_flight == 0);
}

TEST_CASE("fetch_queue: batched calls notice a cancel between batches", "[unit][tsan]") {
  gated_store g;
  fetch_queue q(g, {.workers = 1, .max_batch_chunks = 1});
  std::vector<chunk_key> keys{gated_key(8, 0, 3), gated_key(8, 1, 3)};
  auto h = q.lookup(8, keys, chunk_layout::contiguous(0, 2, T), deadline_after(far));
  REQUIRE(g.wait_started(8));
  REQUIRE(q.cancel(h));
  g.release(8);
  auto r = q.wait(h, deadline_after(limit)).value();
  REQUIRE(r.state == fetch_state::failed);
  REQUIRE(r.ec == errc::cancelled);
  REQUIRE(g.calls() == 1);  // the second batch was never issued
}

// ---- issue 13: pending is not a result; buffers after cancel; no_deadline; faults ----

namespace {

// get() waits (bounded) for release(), then writes every destination and only
// then returns: the late writer a cancelled request must wait for.
struct late_writer_store {
  std::mutex mu;
  std::condition_variable cv;
  bool started = false, released = false;
  std::atomic<bool> finished_writing{false};

  void release() {
    {
      std::lock_guard lock(mu);
      released = true;
    }
    cv.notify_all();
  }
  bool wait_started() {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, limit, [&] { return started; });
  }
  std::error_code exists(std::span<const chunk_key>, std::span<chunk_status> s, deadline) {
    for (auto& x : s) x = chunk_status::miss;
    return {};
  }
  std::error_code get(std::span<const chunk_key>, std::span<const std::span<std::byte>> dst,
                      std::span<chunk_status> s, deadline) {
    {
      std::unique_lock lock(mu);
      started = true;
      cv.notify_all();
      cv.wait_for(lock, limit, [&] { return released; });
    }
    for (auto d : dst) std::fill(d.begin(), d.end(), std::byte{0x5a});
    for (auto& x : s) x = chunk_status::hit;
    finished_writing = true;
    return {};
  }
  std::error_code put(std::span<const chunk_key>, std::span<const std::span<const std::byte>>,
                      std::span<chunk_status> s, deadline) {
    for (auto& x : s) x = chunk_status::error;
    return {};
  }
};

}  // namespace

TEST_CASE("fetch_queue: a pending request has no result (poll/wait return empty)", "[unit]") {
  static_assert(std::is_same_v<decltype(std::declval<fetch_queue<gated_store>&>().poll(fetch_handle{})),
                               std::optional<fetch_result>>);
  gated_store g;
  fetch_queue q(g, {.workers = 1});
  buffers out(1);
  auto h = q.submit(1, std::vector{gated_key(1, 0, 1)}, out.spans, chunk_layout::contiguous(0, 1, T),
                    deadline_after(far));
  REQUIRE(g.wait_started(1));
  REQUIRE_FALSE(q.poll(h).has_value());  // running: nothing to read, not "0 tokens"
  REQUIRE_FALSE(q.wait(h, deadline_after(1ms)).has_value());
  g.release(1);
  const auto r = q.wait(h, deadline_after(limit));
  REQUIRE(r.has_value());
  REQUIRE(r->state == fetch_state::done);
  REQUIRE(r->answer_tokens == T);
}

// The buffer rule after cancel(): the caller owns the destinations again only once
// the request has completed. A broken cancel that completed at once would let the
// store's late write land in buffers the caller is already recomputing into.
TEST_CASE("fetch_queue: after cancel the buffers are the caller's only once completed; no late write",
          "[unit]") {
  late_writer_store s;
  fetch_queue q(s, {.workers = 1});
  buffers out(2);
  auto h = q.submit(1, keys_of(0, 2), out.spans, chunk_layout::contiguous(0, 2, T), deadline_after(far));
  REQUIRE(s.wait_started());
  REQUIRE(q.cancel(h));                  // it will complete as cancelled ...
  REQUIRE_FALSE(q.poll(h).has_value());  // ... but not before the store call returned
  s.release();
  const auto r = q.wait(h, deadline_after(limit));
  REQUIRE(r.has_value());
  REQUIRE(r->state == fetch_state::failed);
  REQUIRE(r->ec == errc::cancelled);
  REQUIRE(r->answer_tokens == 0);      // the first start: nothing loaded
  REQUIRE(s.finished_writing.load());  // every store write happened before the completion was visible
  for (auto& b : out.data) std::fill(b.begin(), b.end(), std::byte{0x11});  // the caller recomputes
  q.shutdown();  // workers joined: nothing can write any more
  for (auto& b : out.data)
    for (std::byte x : b) REQUIRE(x == std::byte{0x11});
}

TEST_CASE("fetch_queue: no_deadline means no limit in wait and in the request", "[unit]") {
  gated_store g;
  fetch_queue q(g, {.workers = 1});
  buffers out(1);
  auto h =
      q.submit(1, std::vector{gated_key(1, 0, 1)}, out.spans, chunk_layout::contiguous(0, 1, T), no_deadline);
  REQUIRE(g.wait_started(1));
  std::thread releaser([&] {
    std::this_thread::sleep_for(20ms);
    g.release(1);
  });
  const auto r = q.wait(h, no_deadline);
  releaser.join();
  REQUIRE(r.has_value());
  REQUIRE(r->state == fetch_state::done);
  REQUIRE(r->status[0] == chunk_status::hit);
}

TEST_CASE("deadline_after saturates instead of overflowing into the past", "[unit]") {
  REQUIRE(deadline_after(std::chrono::hours::max()) == no_deadline);
  REQUIRE_FALSE(expired(deadline_after(std::chrono::hours::max())));
  REQUIRE(deadline_after(std::chrono::nanoseconds::max()) == no_deadline);
  REQUIRE(expired(deadline_after(std::chrono::hours::min())));
  REQUIRE(deadline_after(std::chrono::hours::min()) == deadline::min());
  const auto before = clock::now();
  const auto d = deadline_after(1h);
  REQUIRE(d >= before + 1h);
  REQUIRE(d <= clock::now() + 1h);
}

TEST_CASE("fetch_queue: bad_alloc in enqueue leaks no slot; the request completes refused", "[unit]") {
  memory_store s(1 << 20);
  fill(s, {0});
  std::atomic<bool> fail_next{true};
  fetch_queue q(s, {.workers = 1, .max_requests = 1, .fault_injector = [&](fetch_queue_fault at) {
                      if (at == fetch_queue_fault::enqueue && fail_next.exchange(false))
                        throw std::bad_alloc();
                    }});
  buffers out(1);
  auto h = q.submit(1, keys_of(0, 1), out.spans, chunk_layout::contiguous(0, 1, T), deadline_after(far));
  const auto r = q.poll(h);
  REQUIRE(r.has_value());
  REQUIRE(r->state == fetch_state::failed);
  REQUIRE(r->ec == errc::queue_full);
  const auto st = q.stats();
  REQUIRE(st.requests_in_flight == 0);  // the slot was not leaked ...
  REQUIRE(st.bytes_in_flight == 0);
  REQUIRE(st.queued == 0);
  // ... so with max_requests = 1 the next submission still gets in.
  const auto r2 =
      q.wait(q.submit(2, keys_of(0, 1), out.spans, chunk_layout::contiguous(0, 1, T), deadline_after(far)),
             deadline_after(limit));
  REQUIRE(r2.has_value());
  REQUIRE(r2->state == fetch_state::done);
}

TEST_CASE("fetch_queue: bad_alloc in a worker fails the request, not the process", "[unit]") {
  memory_store s(1 << 20);
  fill(s, {0});
  std::atomic<bool> fail_next{true};
  fetch_queue q(s, {.workers = 1, .fault_injector = [&](fetch_queue_fault at) {
                      if (at == fetch_queue_fault::worker_alloc && fail_next.exchange(false))
                        throw std::bad_alloc();
                    }});
  buffers out(1);
  const auto r =
      q.wait(q.submit(1, keys_of(0, 1), out.spans, chunk_layout::contiguous(0, 1, T), deadline_after(far)),
             deadline_after(limit));
  REQUIRE(r.has_value());
  REQUIRE(r->state == fetch_state::failed);
  REQUIRE(r->ec == errc::backend_error);
  REQUIRE(r->status == std::vector<chunk_status>{chunk_status::error});  // a failure, not a cancel
  REQUIRE(q.stats().requests_in_flight == 0);
  const auto r2 =
      q.wait(q.submit(2, keys_of(0, 1), out.spans, chunk_layout::contiguous(0, 1, T), deadline_after(far)),
             deadline_after(limit));
  REQUIRE(r2.has_value());
  REQUIRE(r2->state == fetch_state::done);  // the worker survived
}

TEST_CASE("fetch_queue: a failed thread start throws from the constructor, never terminates", "[unit]") {
  memory_store s(1 << 20);
  int starts = 0;
  fetch_queue_options opt{
      .workers = 3, .fault_injector = [&](fetch_queue_fault at) {
        if (at == fetch_queue_fault::start_thread && ++starts == 3)
          throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
      }};
  // Two workers are running when the third fails: they must be joined, not destroyed joinable.
  REQUIRE_THROWS_AS(fetch_queue<memory_store>(s, opt), std::system_error);
  REQUIRE(starts == 3);
}
