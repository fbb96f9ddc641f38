// fetch_queue stress: many submitting threads, random store delays, random
// cancels, evictions racing loads, callbacks racing completion, and a shutdown
// with work still queued. Bounded in operations and in time (a few seconds),
// and run under ThreadSanitizer in CI (label tsan).
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "kvtier/fetch_queue.hpp"
#include "kvtier/metrics.hpp"
#include "kvtier/store/memory_store.hpp"
#include "kvtier/store/tiered_store.hpp"
#include "store/store_fakes.hpp"

using namespace kvtier;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t T = 16;
constexpr std::size_t B = 48;
constexpr std::size_t universe = 64;  // distinct chunk keys

chunk_key key(std::size_t i) { return chunk_key{0x5eed, i}; }
std::byte byte_of(std::size_t i, std::size_t j) { return static_cast<std::byte>((i * 7 + j * 3) & 0xff); }

void put_key(memory_store& s, std::size_t i) {
  std::vector<std::byte> v(B);
  for (std::size_t j = 0; j < B; ++j) v[j] = byte_of(i, j);
  chunk_key k = key(i);
  std::span<const std::byte> src[1] = {v};
  chunk_status st[1];
  s.put(std::span<const chunk_key>(&k, 1), src, st, deadline_after(1s));
}

struct submission {
  fetch_handle h;
  std::vector<std::size_t> ids;
  std::vector<std::vector<std::byte>> bufs;
  std::vector<std::span<std::byte>> spans;
  std::shared_ptr<std::atomic<int>> completions = std::make_shared<std::atomic<int>>(0);
  bool is_load = true;
};

// Checks a finished submission: nothing past the prefix is claimed, and every
// chunk inside the prefix holds exactly the right bytes. Returns what is wrong,
// or nullptr (Catch2 assertions are not thread-safe, so threads only count).
const char* check(const std::optional<fetch_result>& completed, const submission& s) {
  if (!completed) return "still pending";
  const fetch_result& r = *completed;
  if (r.status.size() != s.ids.size()) return "status size";
  if (r.state == fetch_state::failed) return r.answer_chunks == 0 ? nullptr : "failed request with a prefix";
  if (r.answer_chunks > s.ids.size()) return "prefix too long";
  for (std::size_t c = 0; c < r.answer_chunks; ++c)
    if (r.status[c] != chunk_status::hit) return "non-hit inside the prefix";
  if (r.answer_chunks < s.ids.size() && r.status[r.answer_chunks] == chunk_status::hit)
    return "prefix stops at a hit";
  const std::uint64_t want =
      r.answer_chunks < s.ids.size() ? s.ids[r.answer_chunks] * T : s.ids.back() * T + T;
  if (r.answer_tokens != want) return "prefix tokens";
  if (s.is_load)
    for (std::size_t c = 0; c < r.answer_chunks; ++c)
      for (std::size_t j = 0; j < B; ++j)
        if (s.bufs[c][j] != byte_of(s.ids[c], j)) return "wrong byte inside the loaded prefix";
  return nullptr;
}

void stress(std::size_t workers, std::size_t max_batch, bool use_tiers) {
  memory_store l1(universe * B / 3);  // too small for everything: evictions race the loads
  memory_store l2(universe * B);
  for (std::size_t i = 0; i < universe; ++i) put_key(use_tiers ? l2 : l1, i);
  tiered_store tiers(l1, l2);
  metrics m;

  auto run_with = [&](auto& store) {
    kvtier::test::jitter_store jit(store, 200);
    auto q =
        std::make_unique<fetch_queue<decltype(jit)>>(jit, fetch_queue_options{.workers = workers,
                                                                              .max_requests = 24,
                                                                              .max_bytes_in_flight = 40 * B,
                                                                              .max_batch_chunks = max_batch,
                                                                              .metrics = &m});
    constexpr int threads = 4;
    constexpr int ops_per_thread = 1500;
    const auto stop_at = clock::now() + 3s;  // time bound as well as an operation bound
    std::atomic<std::size_t> submitted{0};
    std::atomic<const char*> problem{nullptr};
    auto note = [&](const char* what) {
      const char* none = nullptr;
      if (what) problem.compare_exchange_strong(none, what);
    };
    std::vector<std::vector<std::unique_ptr<submission>>> all(threads);

    std::atomic<bool> evicting{true};
    std::thread evictor([&] {
      std::minstd_rand rng(99);
      while (evicting.load()) {
        const std::size_t i = rng() % universe;
        if (rng() % 2)
          (use_tiers ? l2 : l1).erase(key(i));
        else
          put_key(use_tiers ? l2 : l1, i);
        std::this_thread::sleep_for(50us);
      }
    });

    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        std::minstd_rand rng(1234 + t);
        for (int op = 0; op < ops_per_thread && clock::now() < stop_at; ++op) {
          auto s = std::make_unique<submission>();
          const std::size_t first = rng() % (universe - 8);
          const std::size_t n = 1 + rng() % 6;
          std::vector<chunk_key> keys;
          for (std::size_t c = 0; c < n; ++c) s->ids.push_back(first + c), keys.push_back(key(first + c));
          const auto layout = chunk_layout::contiguous(first, n, T);
          const auto dl = deadline_after(std::chrono::milliseconds(rng() % 3 == 0 ? 1 : 2000));
          const request_id id = static_cast<request_id>(t) << 32 | static_cast<request_id>(op / 2);
          switch (rng() % 4) {
            case 0:
              s->is_load = false;
              s->h = q->lookup(id, keys, layout, dl);
              break;
            case 1:
              s->is_load = false;
              s->h = q->prefetch(id, keys, B, layout, dl);
              break;
            default:
              s->bufs.assign(n, std::vector<std::byte>(B));
              s->spans.assign(s->bufs.begin(), s->bufs.end());
              s->h = q->submit(id, keys, s->spans, layout, dl);
          }
          auto counter = s->completions;
          if (rng() % 2)
            q->on_complete(s->h, [counter](const fetch_result&) { (*counter)++; });
          else
            *counter = -1;  // no callback registered
          if (rng() % 5 == 0) q->cancel(s->h);
          if (rng() % 8 == 0) {
            note(check(q->wait(s->h, deadline_after(10s)), *s));
          } else {
            if (auto r = q->poll(s->h)) note(check(r, *s));
          }
          const auto now = q->poll(s->h);
          const bool full = now && now->ec == errc::queue_full;
          if (rng() % 7 == 0) q->release_prefetch(id);
          if (op >= 2) q->release_prefetch(id - 1);  // the scheduler drops stale prefetches
          ++submitted;
          all[t].push_back(std::move(s));
          // Back-pressure as an engine would answer it: keep a window of 5 of this
          // thread's requests open, and on queue_full wait for the oldest one.
          auto& mine = all[t];
          const std::size_t open_from = mine.size() > 5 ? mine.size() - 6 : 0;
          if (full || mine.size() > 5)
            note(check(q->wait(mine[open_from]->h, deadline_after(10s)), *mine[open_from]));
        }
      });
    for (auto& th : ts) th.join();
    q->shutdown();  // whatever is still queued drains with a status
    evicting = false;
    evictor.join();

    std::size_t done = 0, hits = 0, cancelled = 0, full = 0, shut = 0, other = 0;
    for (auto& per : all)
      for (auto& s : per) {
        const auto r = q->poll(s->h).value();
        if (r.state == fetch_state::done)
          ++done, hits += r.answer_chunks;
        else if (r.ec == errc::cancelled)
          ++cancelled;
        else if (r.ec == errc::queue_full)
          ++full;
        else if (r.ec == errc::shutdown)
          ++shut;
        else
          ++other;
        const char* what = check(r, *s);
        INFO(what);
        REQUIRE(what == nullptr);
        if (*s->completions != -1) REQUIRE(*s->completions == 1);
      }
    std::printf(
        "stress(workers=%zu, batch=%zu, tiers=%d): %zu submitted: %zu done (%zu prefix chunks), "
        "%zu cancelled, %zu queue_full, %zu shutdown, %zu other\n",
        workers, max_batch, use_tiers ? 1 : 0, submitted.load(), done, hits, cancelled, full, shut, other);
    const char* what = problem.load();
    INFO((what ? what : ""));
    REQUIRE(what == nullptr);
    const auto st = q->stats();
    REQUIRE(st.requests_in_flight == 0);
    REQUIRE(st.bytes_in_flight == 0);
    REQUIRE(st.queued == 0);
    REQUIRE(submitted.load() > 0);
  };
  if (use_tiers)
    run_with(tiers);
  else
    run_with(l1);
  REQUIRE(m.requests_in_flight.value() == 0);
  REQUIRE(m.bytes_in_flight.value() == 0);
  REQUIRE(m.queue_depth.value() == 0);
}

}  // namespace

TEST_CASE("fetch_queue stress: threads, delays, cancels, evictions, shutdown", "[unit][tsan]") {
  SECTION("one worker, whole-request calls, L1 only") { stress(1, 0, false); }
  SECTION("four workers, batches of 2, tiered") { stress(4, 2, true); }
}
