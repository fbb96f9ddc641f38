// fetch_queue progress while a load runs: keys land one store call at a time (a gated store
// lets the test release them), progress() and wait_progress() report the loaded prefix so far
// and which keys landed, never more than what landed, and end equal to the completed result;
// a key that comes back corrupt, failed or timed out in the middle of a load never counts as
// landed; then pipelined_broadcast on W in-process ranks is driven by it until every rank holds
// the whole prefix, bytes verified. With stream_groups over a store that reads group-major,
// progress reports each key's layer groups as they land (landed_bytes), a corrupt group keeps
// the groups before it, and without it the queue makes one whole get per call.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "kvtier/chunk_broadcast.hpp"
#include "kvtier/comm/inproc.hpp"
#include "kvtier/fetch_queue.hpp"
#include "kvtier/ownership.hpp"
#include "kvtier/store/memory_store.hpp"
#include "support/deadline_check.hpp"

using namespace kvtier;
using namespace std::chrono_literals;

namespace {

// A memory_store whose get() serves one key per permit: the test decides when each key lands.
class gated_store {
 public:
  explicit gated_store(memory_store& inner) : inner_(inner) {}
  void allow(std::size_t n) {
    {
      std::lock_guard lock(mu_);
      permits_ += n;
    }
    cv_.notify_all();
  }
  std::error_code exists(std::span<const chunk_key> k, std::span<chunk_status> s, deadline dl) {
    return inner_.exists(k, s, dl);
  }
  std::error_code put(std::span<const chunk_key> k, std::span<const std::span<const std::byte>> v,
                      std::span<chunk_status> s, deadline dl) {
    return inner_.put(k, v, s, dl);
  }
  std::error_code get(std::span<const chunk_key> k, std::span<const std::span<std::byte>> d,
                      std::span<chunk_status> s, deadline dl) {
    for (std::size_t i = 0; i < k.size(); ++i) {
      std::unique_lock lock(mu_);
      if (!cv_.wait_until(lock, dl, [&] { return permits_ > 0; })) {
        for (std::size_t j = i; j < k.size(); ++j) s[j] = chunk_status::timeout;
        return make_error_code(errc::timeout);
      }
      --permits_;
      lock.unlock();
      if (auto ec = inner_.get(k.subspan(i, 1), d.subspan(i, 1), s.subspan(i, 1), dl)) return ec;
    }
    return {};
  }

 private:
  memory_store& inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::size_t permits_ = 0;
};
static_assert(chunk_store<gated_store>);

constexpr std::size_t chunk_tokens = 16, chunk_bytes = 64;

std::vector<std::byte> value_of(std::size_t c) {
  std::vector<std::byte> v(chunk_bytes);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::byte>(c * 31 + i);
  return v;
}

// exists() finds every key and put() stores every key (keeping nothing): the fakes below script get().
struct answers_every_key {
  std::error_code exists(std::span<const chunk_key>, std::span<chunk_status> s, deadline) {
    for (auto& x : s) x = chunk_status::hit;
    return {};
  }
  std::error_code put(std::span<const chunk_key>, std::span<const std::span<const std::byte>>,
                      std::span<chunk_status> s, deadline) {
    for (auto& x : s) x = chunk_status::stored;
    return {};
  }
};

// A store with a scripted outcome per key (key.lo is its index): a hit copies the value; corrupt
// writes wrong bytes into the destination (as a failed checksum leaves it) and reports corrupt;
// error and timeout fail the call. One key per permit, and the test can wait until the store is
// blocked on key i: every earlier store call (and what the queue did with it) is over by then.
class scripted_outcome_store : public answers_every_key {
 public:
  explicit scripted_outcome_store(std::vector<chunk_status> outcome) : outcome_(std::move(outcome)) {}
  void allow(std::size_t n) {
    {
      std::lock_guard lock(mu_);
      permits_ += n;
    }
    cv_.notify_all();
  }
  /// Waits (bounded by dl) until the store waits for a permit for key `i`.
  bool wait_blocked_on(std::uint64_t i, deadline dl) {
    std::unique_lock lock(mu_);
    return cv_.wait_until(lock, dl, [&] { return blocked_on_ == i; });
  }
  std::error_code get(std::span<const chunk_key> k, std::span<const std::span<std::byte>> d,
                      std::span<chunk_status> s, deadline dl) {
    std::error_code ec;
    for (std::size_t i = 0; i < k.size(); ++i) {
      std::unique_lock lock(mu_);
      blocked_on_ = k[i].lo;
      cv_.notify_all();
      if (!cv_.wait_until(lock, dl, [&] { return permits_ > 0; })) {
        for (std::size_t j = i; j < k.size(); ++j) s[j] = chunk_status::timeout;
        return make_error_code(errc::timeout);
      }
      --permits_;
      blocked_on_ = UINT64_MAX;
      lock.unlock();
      const std::size_t c = k[i].lo;
      s[i] = outcome_[c];
      if (s[i] == chunk_status::hit) {
        const auto v = value_of(c);
        std::memcpy(d[i].data(), v.data(), v.size());
      } else if (s[i] == chunk_status::corrupt) {
        std::memset(d[i].data(), 0xEE, d[i].size());  // bytes arrived, and failed their check
      } else if (s[i] == chunk_status::timeout && !ec) {
        ec = make_error_code(errc::timeout);
      } else if (s[i] == chunk_status::error && !ec) {
        ec = make_error_code(errc::backend_error);
      }
    }
    return ec;
  }

 private:
  std::vector<chunk_status> outcome_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::size_t permits_ = 0;
  std::uint64_t blocked_on_ = UINT64_MAX;
};
static_assert(chunk_store<scripted_outcome_store>);

// n keys of salt `salt` with their destinations; every key but `absent` stored in `mem`.
struct load_fixture {
  std::vector<chunk_key> keys;
  std::vector<std::vector<std::byte>> dst;
  std::vector<std::span<std::byte>> spans;
  load_fixture(memory_store& mem, std::size_t n, std::uint64_t salt, std::size_t absent = SIZE_MAX)
      : dst(n, std::vector<std::byte>(chunk_bytes)) {
    std::vector<chunk_status> st(1);
    for (std::size_t c = 0; c < n; ++c) {
      keys.push_back({salt, c});
      spans.push_back(dst[c]);
      if (c == absent) continue;
      const auto v = value_of(c);
      std::span<const std::byte> src[] = {v};
      REQUIRE_FALSE(mem.put(std::span(&keys[c], 1), src, st, deadline_after(1s)));
    }
  }
};

}  // namespace

TEST_CASE("fetch_queue: progress reports keys as they land, and waits for a prefix", "[unit]") {
  memory_store mem(1 << 20);
  gated_store gated(mem);
  const std::size_t n = 6;
  load_fixture f(mem, n, 7, 4);  // key 4 is absent: the prefix stops before it
  auto& keys = f.keys;
  auto& dst = f.dst;
  auto& spans = f.spans;
  fetch_queue q(gated, {.workers = 1, .max_batch_chunks = 1});
  auto h = q.submit(1, keys, spans, chunk_layout::contiguous(0, n, chunk_tokens), deadline_after(20s));

  fetch_progress p = q.progress(h);
  CHECK(p.answer_tokens == 0);
  CHECK(p.landed == 0);
  CHECK_FALSE(p.complete);
  // Nothing released: waiting for 1 chunk ends at its deadline, with nothing landed.
  const auto dl = deadline_after(30ms);
  p = q.wait_progress(h, 1, dl);
  CHECK(clock::now() >= dl);
  CHECK(kvtier::test::returned_by(dl));
  CHECK(p.answer_chunks == 0);

  gated.allow(2);
  p = q.wait_progress(h, 2, deadline_after(10s));
  CHECK(p.answer_chunks >= 2);
  CHECK(p.answer_tokens >= 2 * chunk_tokens);
  CHECK(dst[0] == value_of(0));  // what progress reports as landed is in its destination
  CHECK(dst[1] == value_of(1));
  CHECK_FALSE(q.poll(h).has_value());

  gated.allow(100);
  p = q.wait_progress(h, n, deadline_after(10s));  // key 4 misses: ends by completing
  CHECK(p.complete);
  CHECK(p.answer_chunks == 4);
  CHECK(p.answer_tokens == 4 * chunk_tokens);
  CHECK(p.landed == 5);  // key 5 landed after the gap
  CHECK(p.landed_keys == std::vector<bool>{true, true, true, true, false, true});
  const auto r = q.wait(h, deadline_after(10s));
  REQUIRE(r.has_value());
  CHECK(r->answer_tokens == p.answer_tokens);
}

TEST_CASE("fetch_queue: a key corrupt, failed or timed out mid-load never counts as landed", "[unit]") {
  // Keys come back one store call at a time: hit, hit, corrupt, hit, error, hit, timeout, hit.
  // After each call, progress may count only the hits (a pipelined_broadcast driven by it would
  // send every rank the bytes of a chunk reported landed), and the prefix stops at key 2.
  using cs = chunk_status;
  const std::vector<cs> outcome{cs::hit,   cs::hit, cs::corrupt, cs::hit,
                                cs::error, cs::hit, cs::timeout, cs::hit};
  const std::size_t n = outcome.size();
  scripted_outcome_store store(outcome);
  std::vector<chunk_key> keys;
  std::vector<std::vector<std::byte>> dst(n, std::vector<std::byte>(chunk_bytes));
  std::vector<std::span<std::byte>> spans;
  for (std::size_t c = 0; c < n; ++c) keys.push_back({5, c}), spans.push_back(dst[c]);
  fetch_queue q(store, {.workers = 1, .max_batch_chunks = 1});
  auto h = q.submit(4, keys, spans, chunk_layout::contiguous(0, n, chunk_tokens), deadline_after(20s));
  for (std::size_t i = 0; i + 1 < n; ++i) {
    INFO("after key " << i << " came back");
    store.allow(1);
    REQUIRE(store.wait_blocked_on(i + 1, deadline_after(10s)));  // keys 0..i are done with
    const fetch_progress p = q.progress(h);
    REQUIRE_FALSE(p.complete);
    std::size_t hits = 0, prefix = 0;
    for (std::size_t c = 0; c < n; ++c) {
      const bool landed = c <= i && outcome[c] == cs::hit;
      CHECK(p.landed_keys[c] == landed);
      if (landed) CHECK(dst[c] == value_of(c));  // what is reported landed is in its destination
      hits += landed;
      if (prefix == c && landed) ++prefix;
    }
    CHECK(p.landed == hits);
    CHECK(p.answer_chunks == prefix);
    CHECK(p.answer_tokens == prefix * chunk_tokens);
  }
  store.allow(1);
  const auto r = q.wait(h, deadline_after(10s));
  REQUIRE(r.has_value());
  CHECK(r->answer_chunks == 2);
  CHECK(r->answer_tokens == 2 * chunk_tokens);
  REQUIRE(r->status.size() == n);
  CHECK(r->status[2] == cs::corrupt);
  CHECK(r->status[4] == cs::error);
  CHECK(r->status[6] == cs::timeout);
  const fetch_progress end = q.progress(h);
  CHECK(end.complete);
  CHECK(end.landed == 5);
  CHECK(end.answer_chunks == 2);
}

TEST_CASE("fetch_queue: progress never runs ahead of what landed (monotone, bounded by the result)",
          "[unit]") {
  memory_store mem(1 << 20);
  gated_store gated(mem);
  const std::size_t n = 32;
  load_fixture f(mem, n, 9);
  auto& keys = f.keys;
  auto& dst = f.dst;
  auto& spans = f.spans;
  fetch_queue q(gated, {.workers = 1, .max_batch_chunks = 3});
  auto h = q.submit(2, keys, spans, chunk_layout::contiguous(0, n, chunk_tokens), deadline_after(20s));
  std::thread feeder([&] {
    for (std::size_t i = 0; i < n; ++i) {
      gated.allow(1);
      std::this_thread::sleep_for(1ms);
    }
  });
  std::uint64_t last = 0;
  for (int i = 0; i < 100000; ++i) {  // bounded
    const fetch_progress p = q.progress(h);
    REQUIRE(p.answer_tokens >= last);
    REQUIRE(p.answer_tokens == p.answer_chunks * chunk_tokens);
    if (p.answer_tokens > last)  // what is reported landed is already in its destination
      for (std::size_t c = 0; c < p.answer_chunks; ++c) REQUIRE(dst[c] == value_of(c));
    last = p.answer_tokens;
    if (p.complete) break;
    std::this_thread::yield();
  }
  feeder.join();
  const auto r = q.wait(h, deadline_after(10s));
  REQUIRE(r.has_value());
  CHECK(r->answer_tokens == n * chunk_tokens);
  CHECK(q.progress(h).answer_tokens == r->answer_tokens);
}

TEST_CASE("pipelined_broadcast runs from fetch-queue progress; every rank ends with the prefix", "[unit]") {
  constexpr rank_t W = 4;
  const std::size_t n_chunks = 24;
  const modulo_ownership own(W);
  std::vector<std::unique_ptr<memory_store>> mems;
  std::vector<std::unique_ptr<gated_store>> gates;
  std::vector<chunk_key> keys;
  for (std::size_t c = 0; c < n_chunks; ++c) keys.push_back({11, c});
  for (rank_t r = 0; r < W; ++r) {
    mems.push_back(std::make_unique<memory_store>(1 << 20));
    gates.push_back(std::make_unique<gated_store>(*mems.back()));
    std::vector<chunk_status> st(1);
    for (std::size_t c = r; c < n_chunks; c += W) {  // rank r's server holds r's chunks
      const auto v = value_of(c);
      std::span<const std::byte> src[] = {v};
      REQUIRE_FALSE(mems[r]->put(std::span(&keys[c], 1), src, st, deadline_after(1s)));
    }
  }
  std::vector<std::uint64_t> agreed(W), steps(W), first_stage(W);
  std::vector<std::size_t> wrong(W);
  std::atomic<rank_t> staged{0};
  comm::inproc_world world(W);
  std::thread feeder([&] {  // after every rank's first stage, keys land one by one, rank by rank
    for (int i = 0; i < 20000 && staged.load() < W; ++i) std::this_thread::sleep_for(1ms);
    for (int i = 0; i < 40; ++i) {
      gates[i % W]->allow(1);
      std::this_thread::sleep_for(1ms);
    }
  });
  comm::run_ranks(world, [&](comm::inproc_communicator& c) {
    const rank_t r = c.rank();
    fetch_queue q(*gates[r], {.workers = 1, .max_batch_chunks = 1});
    std::vector<std::vector<std::byte>> buf(n_chunks, std::vector<std::byte>(chunk_bytes));
    std::vector<chunk_key> my_keys;
    std::vector<std::span<std::byte>> my_dst;
    for (std::size_t ch : owned_chunks(own, r, n_chunks))
      my_keys.push_back(keys[ch]), my_dst.push_back(buf[ch]);
    auto h =
        q.submit(3, my_keys, my_dst,
                 chunk_layout::owned(owned_starts(own, r, n_chunks, chunk_tokens), n_chunks * chunk_tokens),
                 deadline_after(20s));
    chunk_span_buffers bufs;
    for (auto& b : buf) bufs.destinations.push_back(b), bufs.sources.push_back(b);
    pipelined_broadcast pb(c, own, bufs,
                           {.n_chunks = n_chunks,
                            .chunk_tokens = chunk_tokens,
                            .chunk_bytes = chunk_bytes,
                            .mode = broadcast_mode::grouped,
                            .request_id = 3});
    for (int s = 0; s < 10000 && !pb.done(); ++s) {  // bounded; each step is one agreement
      const fetch_progress p = q.wait_progress(h, pb.agreed_chunks() / W + 1, deadline_after(5ms));
      pb.step(p.answer_tokens, p.complete, deadline_after(10s));
      if (steps[r]++ == 0) {
        first_stage[r] = pb.agreed_chunks();
        ++staged;
      }
    }
    agreed[r] = pb.result().agreed_tokens;
    for (std::size_t ch = 0; ch < n_chunks; ++ch) wrong[r] += buf[ch] != value_of(ch);
  });
  feeder.join();
  for (rank_t r = 0; r < W; ++r) {
    CHECK(agreed[r] == n_chunks * chunk_tokens);
    CHECK(wrong[r] == 0);
    CHECK(steps[r] == steps[0]);  // every rank issued the same number of stages
  }
  CHECK(first_stage[0] == 0);  // the first stage ran before anything landed: it really ran in stages
  CHECK(steps[0] > 1);
}

// ---- stream_groups: progress per (key, layer group) --------------------------------------------

namespace {

constexpr std::size_t group_bytes = 16;  // 64-byte values: 4 groups

// A store that reads group-major (group_streaming_store): one round (group g of every key) per
// permit, then on_round; key `bad` fails its group `bad_group` (corrupt: wrong bytes landed).
// The test waits until round r has been reported: what the queue did with it is over by then.
class group_gated_store : public answers_every_key {
 public:
  std::size_t bad = SIZE_MAX, bad_group = SIZE_MAX;
  std::size_t whole_gets = 0;  // get() calls: the whole-value path

  void allow(std::size_t n) {
    {
      std::lock_guard lock(mu_);
      permits_ += n;
    }
    cv_.notify_all();
  }
  bool wait_rounds(std::size_t n, deadline dl) {
    std::unique_lock lock(mu_);
    return cv_.wait_until(lock, dl, [&] { return rounds_ >= n; });
  }
  value_format format() const { return value_format::v2(group_bytes); }
  std::error_code get(std::span<const chunk_key> k, std::span<const std::span<std::byte>> d,
                      std::span<chunk_status> s, deadline) {
    for (std::size_t i = 0; i < k.size(); ++i) {
      const auto v = value_of(k[i].lo);
      std::memcpy(d[i].data(), v.data(), v.size());
      s[i] = chunk_status::hit;
    }
    std::lock_guard lock(mu_);
    ++whole_gets;
    return {};
  }
  std::error_code get_by_group(std::span<const chunk_key> k, std::span<const std::span<std::byte>> d,
                               std::span<chunk_status> s, deadline dl,
                               const std::function<void(std::span<const std::size_t>)>& on_round) {
    const value_format f = format();
    std::vector<std::size_t> landed(k.size(), 0);
    for (std::size_t g = 0; g < f.groups(chunk_bytes); ++g) {
      {
        std::unique_lock lock(mu_);
        if (!cv_.wait_until(lock, dl, [&] { return permits_ > 0; })) {
          for (std::size_t i = 0; i < k.size(); ++i)
            if (landed[i] == g) s[i] = chunk_status::timeout;
          return make_error_code(errc::timeout);
        }
        --permits_;
      }
      for (std::size_t i = 0; i < k.size(); ++i) {
        if (landed[i] != g) continue;  // failed in an earlier round: not read further
        const auto v = value_of(k[i].lo);
        const auto part = f.group(d[i], g);
        std::memcpy(part.data(), v.data() + g * group_bytes, part.size());
        if (k[i].lo == bad && g == bad_group) {
          std::memset(part.data(), 0xEE, part.size());
          s[i] = chunk_status::corrupt;
          continue;
        }
        landed[i] = g + 1;
        s[i] = landed[i] == f.groups(chunk_bytes) ? chunk_status::hit : chunk_status::error;
      }
      on_round(landed);
      {
        std::lock_guard lock(mu_);
        ++rounds_;
      }
      cv_.notify_all();
    }
    return {};
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::size_t permits_ = 0, rounds_ = 0;
};
static_assert(group_streaming_store<group_gated_store>);

}  // namespace

TEST_CASE("fetch_queue stream_groups: progress reports each key's layer groups as they land", "[unit]") {
  for (bool corrupt : {false, true}) {
    INFO("key 1's group 2 corrupt: " << corrupt);
    group_gated_store store;
    if (corrupt) store.bad = 1, store.bad_group = 2;
    fetch_queue q(store, {.workers = 1, .stream_groups = true});
    std::vector<chunk_key> keys;
    std::vector<std::vector<std::byte>> out(3, std::vector<std::byte>(chunk_bytes));
    std::vector<std::span<std::byte>> dst;
    for (std::size_t c = 0; c < 3; ++c) keys.push_back({7, c}), dst.emplace_back(out[c]);
    auto h = q.submit(1, keys, dst, chunk_layout::contiguous(0, 3, chunk_tokens), deadline_after(30s));
    for (std::size_t g = 1; g <= 4; ++g) {
      store.allow(1);
      REQUIRE(store.wait_rounds(g, deadline_after(10s)));
      if (g == 4) break;  // the request may complete now: checked below
      const fetch_progress p = q.progress(h);
      const std::size_t key1 = corrupt && g > 2 ? 2 * group_bytes : g * group_bytes;
      CHECK(p.landed_bytes == std::vector<std::size_t>{g * group_bytes, key1, g * group_bytes});
      CHECK(p.landed == 0);  // no key has every group yet
      CHECK(p.answer_chunks == 0);
      CHECK_FALSE(p.complete);
      for (std::size_t c = 0; c < 3; ++c)  // the groups reported are in place, later ones untouched
        CHECK(std::memcmp(out[c].data(), value_of(c).data(), p.landed_bytes[c]) == 0);
      CHECK(std::all_of(out[0].begin() + g * group_bytes, out[0].end(),
                        [](std::byte b) { return b == std::byte{0}; }));
    }
    const auto r = q.wait(h, deadline_after(10s));
    REQUIRE(r);
    const fetch_progress p = q.progress(h);
    CHECK(p.complete);
    if (!corrupt) {
      CHECK(r->answer_chunks == 3);
      CHECK(p.landed_bytes == std::vector<std::size_t>(3, chunk_bytes));
      for (std::size_t c = 0; c < 3; ++c) CHECK(out[c] == value_of(c));
    } else {
      CHECK(r->status ==
            std::vector<chunk_status>{chunk_status::hit, chunk_status::corrupt, chunk_status::hit});
      CHECK(r->answer_chunks == 1);
      CHECK(p.landed_bytes == std::vector<std::size_t>{chunk_bytes, 2 * group_bytes, chunk_bytes});
      CHECK_FALSE(p.landed_keys[1]);
    }
    CHECK(store.whole_gets == 0);
  }
}

TEST_CASE("fetch_queue without stream_groups: one whole get per call, keys land whole", "[unit]") {
  group_gated_store store;
  fetch_queue q(store, {.workers = 1});
  std::vector<chunk_key> keys{{7, 0}, {7, 1}};
  std::vector<std::vector<std::byte>> out(2, std::vector<std::byte>(chunk_bytes));
  std::vector<std::span<std::byte>> dst{out[0], out[1]};
  auto h = q.submit(1, keys, dst, chunk_layout::contiguous(0, 2, chunk_tokens), deadline_after(30s));
  const auto r = q.wait(h, deadline_after(10s));
  REQUIRE(r);
  CHECK(r->answer_chunks == 2);
  CHECK(q.progress(h).landed_bytes == std::vector<std::size_t>(2, chunk_bytes));
  CHECK(store.whole_gets == 1);
}
