// fetch_queue::put (asynchronous write-back): values land in the store with a
// status per key; a blocked store never holds the caller; requests and bytes in
// flight are bounded; cancel and close complete a put exactly once, and a put
// cancelled while queued never reaches the store; concurrent puts, cancels and
// callbacks complete each submission exactly once (TSan).
#include <atomic>
#include <chrono>
#include <cstddef>
#include <deque>
#include <optional>
#include <random>
#include <span>
#include <system_error>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "kvtier/fetch_queue.hpp"
#include "kvtier/metrics.hpp"
#include "kvtier/store/memory_store.hpp"
#include "store/store_fakes.hpp"

using namespace kvtier;
using namespace std::chrono_literals;
using kvtier::test::gated_key;
using kvtier::test::gated_store;

namespace {

constexpr std::size_t B = 64;  // bytes per chunk
const auto far = 30s;          // deadlines tests never reach; waits are bounded by `limit`
const auto limit = 10s;

// n chunks of B bytes, chunk c filled with (seed + c).
struct sources {
  std::vector<std::vector<std::byte>> data;
  std::vector<std::span<const std::byte>> spans;
  sources(std::size_t n, unsigned seed) {
    for (std::size_t c = 0; c < n; ++c) data.emplace_back(B, static_cast<std::byte>(seed + c));
    spans.assign(data.begin(), data.end());
  }
};

std::vector<chunk_key> gated_keys(std::uint64_t tag, std::uint32_t n) {
  std::vector<chunk_key> k;
  for (std::uint32_t c = 0; c < n; ++c) k.push_back(gated_key(tag, c, 0));
  return k;
}

}  // namespace

TEST_CASE("fetch_queue::put stores the values; a later load reads them back", "[unit]") {
  memory_store store(1 << 20);
  metrics m;
  fetch_queue q(store, {.workers = 2, .metrics = &m});
  const std::vector<chunk_key> keys{{9, 0}, {9, 1}, {9, 2}};
  sources src(3, 40);
  auto h = q.put(5, keys, src.spans, deadline_after(far));
  const fetch_result r = q.wait(h, deadline_after(limit)).value();
  REQUIRE(r.state == fetch_state::done);
  REQUIRE(!r.ec);
  REQUIRE(r.status == std::vector<chunk_status>(3, chunk_status::stored));
  REQUIRE(r.answer_chunks == 3);
  REQUIRE(r.answer_tokens == 0);
  REQUIRE(q.progress(h).landed == 3);
  REQUIRE(m.puts.value() == 1);
  REQUIRE(m.chunks_stored.value() == 3);
  REQUIRE(m.bytes_stored.value() == 3 * B);
  REQUIRE(m.loads.value() == 0);
  REQUIRE(m.lookups.value() == 0);

  std::vector<std::vector<std::byte>> out(3, std::vector<std::byte>(B));
  std::vector<std::span<std::byte>> dst(out.begin(), out.end());
  auto l = q.submit(6, keys, dst, chunk_layout::contiguous(0, 3, 16), deadline_after(far));
  REQUIRE(q.wait(l, deadline_after(limit)).value().answer_chunks == 3);
  for (std::size_t c = 0; c < 3; ++c) REQUIRE(out[c] == src.data[c]);
}

TEST_CASE("fetch_queue::put: a store that does not answer never holds the caller", "[unit][tsan]") {
  gated_store g;  // each call blocks until the test releases its tag
  fetch_queue q(g, {.workers = 1});
  sources src(2, 1);
  // Were put() to run the store call on this thread, it would return only once the call did,
  // which needs the release below: the request would be complete (timed out) at the poll.
  auto h = q.put(1, gated_keys(1, 2), src.spans, deadline_after(far));
  REQUIRE(!q.poll(h));
  REQUIRE(g.wait_started(1));
  REQUIRE(!q.poll(h));
  REQUIRE(q.stats().bytes_in_flight == 2 * B);  // the sources are the queue's until completion
  g.release(1);
  const fetch_result r = q.wait(h, deadline_after(limit)).value();
  REQUIRE(r.status == std::vector<chunk_status>(2, chunk_status::stored));
  REQUIRE(q.stats().bytes_in_flight == 0);

  // A store still not answering at the put's deadline: the put completes as a timeout.
  auto late = q.put(2, gated_keys(2, 1), std::span(src.spans).first(1), deadline_after(50ms));
  const fetch_result t = q.wait(late, deadline_after(limit)).value();
  REQUIRE(t.state == fetch_state::done);
  REQUIRE(t.ec == errc::timeout);
  REQUIRE(t.status == std::vector<chunk_status>{chunk_status::timeout});
  REQUIRE(t.answer_chunks == 0);
}

TEST_CASE("fetch_queue::put: bounded requests and bytes; too_large, queue_full, then free", "[unit][tsan]") {
  gated_store g;
  metrics m;
  fetch_queue q(g, {.workers = 1, .max_requests = 2, .max_bytes_in_flight = 3 * B, .metrics = &m});
  sources two(2, 0), one(1, 9), four(4, 20);
  auto ha = q.put(1, gated_keys(1, 2), two.spans, deadline_after(far));
  REQUIRE(q.stats().bytes_in_flight == 2 * B);
  REQUIRE(q.poll(q.put(4, gated_keys(4, 4), four.spans, deadline_after(far))).value().ec == errc::too_large);
  // 2 B in flight, 3 B allowed: a second 2-chunk put does not fit now.
  REQUIRE(q.poll(q.put(5, gated_keys(5, 2), two.spans, deadline_after(far))).value().ec == errc::queue_full);
  auto hb = q.put(2, gated_keys(2, 1), one.spans, deadline_after(far));
  REQUIRE(!q.poll(hb));
  const fetch_result full = q.poll(q.put(3, gated_keys(3, 1), one.spans, deadline_after(far))).value();
  REQUIRE(full.state == fetch_state::failed);
  REQUIRE(full.ec == errc::queue_full);  // two requests in flight
  REQUIRE(full.status == std::vector<chunk_status>{chunk_status::error});
  REQUIRE(m.rejected.value() == 3);
  g.release_all();
  REQUIRE(q.wait(ha, deadline_after(limit)).value().state == fetch_state::done);
  REQUIRE(q.wait(hb, deadline_after(limit)).value().state == fetch_state::done);
  auto again = q.put(5, gated_keys(5, 2), two.spans, deadline_after(far));  // the bytes came back
  REQUIRE(q.wait(again, deadline_after(limit)).value().answer_chunks == 2);
  REQUIRE(q.poll(q.put(6, gated_keys(6, 2), one.spans, deadline_after(far))).value().ec ==
          errc::invalid_argument);  // two keys, one source
}

TEST_CASE("fetch_queue::put: cancel while queued never writes; while running completes after the call",
          "[unit][tsan]") {
  gated_store g;
  fetch_queue q(g, {.workers = 1});
  sources src(1, 3);
  auto running = q.put(1, gated_keys(1, 1), src.spans, deadline_after(far));
  REQUIRE(g.wait_started(1));
  auto queued = q.put(2, gated_keys(2, 1), src.spans, deadline_after(far));
  auto closed = q.put(3, gated_keys(3, 1), src.spans, deadline_after(far));
  REQUIRE(q.cancel(queued));
  const fetch_result rq = q.poll(queued).value();
  REQUIRE(rq.ec == errc::cancelled);
  REQUIRE(rq.status == std::vector<chunk_status>{chunk_status::cancelled});
  REQUIRE(q.cancel(running));
  REQUIRE(!q.poll(running));  // the sources are still the queue's: the call has not returned
  q.close();
  REQUIRE(q.poll(closed).value().ec == errc::shutdown);
  REQUIRE(q.poll(q.put(4, gated_keys(4, 1), src.spans, deadline_after(far))).value().ec == errc::shutdown);
  g.release_all();
  const fetch_result rr = q.wait(running, deadline_after(limit)).value();
  REQUIRE(rr.state == fetch_state::failed);
  REQUIRE(rr.ec == errc::cancelled);
  q.shutdown();
  REQUIRE_FALSE(g.started(2));  // neither the cancelled nor the drained put reached the store
  REQUIRE_FALSE(g.started(3));
  REQUIRE(g.calls() == 1);
  REQUIRE(q.stats().requests_in_flight == 0);
  REQUIRE(q.stats().bytes_in_flight == 0);
}

TEST_CASE("fetch_queue::put: concurrent puts, loads and cancels complete exactly once", "[unit][tsan]") {
  memory_store inner(1 << 20);
  kvtier::test::jitter_store<memory_store> store(inner, 200);
  fetch_queue q(store, {.workers = 3, .max_requests = 16, .max_bytes_in_flight = 16 * B});
  constexpr int threads = 3, per_thread = 60;
  std::deque<std::atomic<int>> completions;
  for (int i = 0; i < threads * per_thread; ++i) completions.emplace_back(0);
  std::vector<fetch_handle> handles(threads * per_thread);
  std::vector<sources> data;
  for (int i = 0; i < threads * per_thread; ++i) data.emplace_back(2, static_cast<unsigned>(i));
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      std::minstd_rand rng(static_cast<unsigned>(t) + 1);
      for (int k = 0; k < per_thread; ++k) {
        const int i = t * per_thread + k;
        const std::vector<chunk_key> keys{{static_cast<std::uint64_t>(i), 0},
                                          {static_cast<std::uint64_t>(i), 1}};
        handles[i] = q.put(static_cast<request_id>(i), keys, data[i].spans, deadline_after(far));
        q.on_complete(handles[i], [&completions, i](const fetch_result&) { completions[i]++; });
        if (rng() % 3 == 0) q.cancel(handles[i]);
      }
    });
  for (auto& t : ts) t.join();
  for (int i = 0; i < threads * per_thread; ++i) {
    const fetch_result r = q.wait(handles[i], deadline_after(limit)).value();
    // Done: every key stored. Failed: cancelled or refused (queue_full), never half-reported.
    if (r.state == fetch_state::done)
      REQUIRE(r.answer_chunks == 2);
    else
      REQUIRE((r.ec == errc::cancelled || r.ec == errc::queue_full));
  }
  q.shutdown();
  for (int i = 0; i < threads * per_thread; ++i) REQUIRE(completions[i].load() == 1);
  REQUIRE(q.stats().requests_in_flight == 0);
  REQUIRE(q.stats().bytes_in_flight == 0);
}
