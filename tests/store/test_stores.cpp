// Unit tests: memory_store (L1), tiered_store, rank_view, metrics.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "kvtier/fetch_types.hpp"
#include "kvtier/lookup.hpp"
#include "kvtier/metrics.hpp"
#include "kvtier/ownership.hpp"
#include "kvtier/store/memory_store.hpp"
#include "kvtier/store/rank_view.hpp"
#include "kvtier/store/tiered_store.hpp"
#include "kvtier/store/value_header.hpp"
#include "store_fakes.hpp"

using namespace kvtier;
using namespace std::chrono_literals;

namespace {

chunk_key key(std::uint64_t i) { return chunk_key{0xabcull, i}; }

std::vector<std::byte> bytes(std::size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((seed * 37 + i) & 0xff);
  return v;
}

// Puts one value; returns its status.
template <class S>
chunk_status put1(S& s, chunk_key k, const std::vector<std::byte>& v) {
  std::span<const std::byte> src[1] = {v};
  chunk_status st[1];
  REQUIRE_FALSE(s.put(std::span<const chunk_key>(&k, 1), src, st, deadline_after(1s)));
  return st[0];
}
template <class S>
chunk_status get1(S& s, chunk_key k, std::vector<std::byte>& out) {
  std::span<std::byte> dst[1] = {out};
  chunk_status st[1];
  s.get(std::span<const chunk_key>(&k, 1), dst, st, deadline_after(1s));
  return st[0];
}

std::atomic<long> live_bytes{0};
struct counting_allocator {
  using value_type = std::byte;
  std::byte* allocate(std::size_t n) {
    live_bytes += static_cast<long>(n);
    return std::allocator<std::byte>().allocate(n);
  }
  void deallocate(std::byte* p, std::size_t n) {
    live_bytes -= static_cast<long>(n);
    std::allocator<std::byte>().deallocate(p, n);
  }
  bool operator==(const counting_allocator&) const = default;
};

}  // namespace

TEST_CASE("memory_store: put then get copies the exact bytes; absent is a miss", "[unit]") {
  memory_store s(1 << 20);
  auto v = bytes(1000, 1);
  REQUIRE(put1(s, key(1), v) == chunk_status::stored);
  std::vector<std::byte> out(1000);
  REQUIRE(get1(s, key(1), out) == chunk_status::hit);
  REQUIRE(out == v);
  REQUIRE(get1(s, key(2), out) == chunk_status::miss);

  std::vector<chunk_key> keys{key(1), key(2)};
  std::vector<chunk_status> st(2);
  REQUIRE_FALSE(s.exists(keys, st, deadline_after(1s)));
  REQUIRE(st == std::vector<chunk_status>{chunk_status::hit, chunk_status::miss});
}

TEST_CASE("memory_store: a destination of another length is corrupt, never a partial hit", "[unit]") {
  memory_store s(1 << 20);
  auto v = bytes(100, 2);
  put1(s, key(1), v);
  std::vector<std::byte> shorter(99, std::byte{0x5a}), longer(101);
  REQUIRE(get1(s, key(1), shorter) == chunk_status::corrupt);
  REQUIRE(get1(s, key(1), longer) == chunk_status::corrupt);
  REQUIRE(shorter == std::vector<std::byte>(99, std::byte{0x5a}));  // not even a partial copy
  REQUIRE(s.stats().corrupt == 2);
}

TEST_CASE("memory_store: size mismatch is invalid_argument; passed deadline is timeout for every key",
          "[unit]") {
  memory_store s(1 << 20);
  std::vector<chunk_key> keys{key(1), key(2)};
  std::vector<chunk_status> st(1);
  REQUIRE(s.exists(keys, st, deadline_after(1s)) == errc::invalid_argument);
  std::vector<chunk_status> st2(2, chunk_status::hit);
  REQUIRE(s.exists(keys, st2, clock::now() - 1ms) == errc::timeout);
  REQUIRE(st2 == std::vector<chunk_status>(2, chunk_status::timeout));
}

TEST_CASE("memory_store: LRU by bytes; get refreshes recency; too-large values are refused", "[unit]") {
  memory_store s(300);
  auto v = bytes(100, 3);
  for (int i = 0; i < 3; ++i) REQUIRE(put1(s, key(i), v) == chunk_status::stored);
  REQUIRE(s.size_bytes() == 300);
  std::vector<std::byte> out(100);
  REQUIRE(get1(s, key(0), out) == chunk_status::hit);  // 0 is now most recent; 1 is the LRU
  REQUIRE(put1(s, key(3), v) == chunk_status::stored);
  REQUIRE_FALSE(s.contains(key(1)));
  REQUIRE(s.contains(key(0)));
  REQUIRE(s.contains(key(2)));
  REQUIRE(s.contains(key(3)));
  REQUIRE(s.stats().evictions == 1);

  auto big = bytes(301, 4);
  REQUIRE(put1(s, key(9), big) == chunk_status::error);
  REQUIRE(s.entry_count() == 3);  // nothing evicted for a value that can never fit

  auto v2 = bytes(100, 5);  // replacing keeps one entry with the new bytes
  REQUIRE(put1(s, key(2), v2) == chunk_status::stored);
  REQUIRE(get1(s, key(2), out) == chunk_status::hit);
  REQUIRE(out == v2);
  REQUIRE(s.size_bytes() == 300);
  REQUIRE(s.erase(key(2)));
  REQUIRE_FALSE(s.erase(key(2)));
  REQUIRE(s.size_bytes() == 200);
}

TEST_CASE("memory_store: values live in the allocator's memory and are all freed", "[unit]") {
  {
    basic_memory_store<counting_allocator> s(1000);
    auto v = bytes(400, 6);
    put1(s, key(1), v);
    put1(s, key(2), v);
    REQUIRE(live_bytes == 800);
    put1(s, key(3), v);  // evicts key 1
    REQUIRE(live_bytes == 800);
    std::vector<std::byte> out(400);
    REQUIRE(get1(s, key(3), out) == chunk_status::hit);
    REQUIRE(out == v);
  }
  REQUIRE(live_bytes == 0);
}

TEST_CASE("memory_store: put_pieces stores each value as its pieces end to end", "[unit]") {
  memory_store s(1 << 20);
  const auto a = bytes(1000, 7), b = bytes(300, 8);
  // Value 0: four pieces of uneven lengths, an empty one among them; value 1: one piece;
  // value 2: no bytes at all (one empty piece).
  const std::vector<std::span<const std::byte>> p0 = {std::span(a).first(1), std::span(a).subspan(1, 499),
                                                      std::span(a).subspan(500, 0),
                                                      std::span(a).subspan(500)},
                                                p1 = {std::span(b)}, p2 = {std::span(b).first(0)};
  const value_pieces values[3] = {p0, p1, p2};
  const std::vector<chunk_key> keys{key(1), key(2), key(3)};
  std::vector<chunk_status> st(3);
  REQUIRE_FALSE(s.put_pieces(keys, values, {}, st, deadline_after(1s)));
  REQUIRE(st == std::vector<chunk_status>(3, chunk_status::stored));
  std::vector<std::byte> out(1000), out_b(300), none;
  REQUIRE(get1(s, key(1), out) == chunk_status::hit);
  CHECK(out == a);
  REQUIRE(get1(s, key(2), out_b) == chunk_status::hit);
  CHECK(out_b == b);
  REQUIRE(get1(s, key(3), none) == chunk_status::hit);
  CHECK(s.size_bytes() == 1300);
  // Pieces in another order make another value (the order is the value's).
  const std::vector<std::span<const std::byte>> swapped = {std::span(a).subspan(500),
                                                           std::span(a).first(500)};
  const value_pieces one[1] = {swapped};
  REQUIRE_FALSE(s.put_pieces(std::span(keys).first(1), one, {}, std::span(st).first(1), deadline_after(1s)));
  REQUIRE(get1(s, key(1), out) == chunk_status::hit);
  std::vector<std::byte> want(a.begin() + 500, a.end());
  want.insert(want.end(), a.begin(), a.begin() + 500);
  CHECK(out == want);
  CHECK(s.size_bytes() == 1300);
}

TEST_CASE("memory_store: put_pieces refuses digests, mismatched sizes and a passed deadline, storing nothing",
          "[unit]") {
  memory_store s(1 << 20);
  const auto a = bytes(64, 9);
  const std::vector<std::span<const std::byte>> p = {std::span(a).first(10), std::span(a).subspan(10)};
  const value_pieces values[2] = {p, p};
  const std::vector<chunk_key> keys{key(1), key(2)};
  std::vector<chunk_status> st(2, chunk_status::cancelled);
  SECTION("digests: this store keeps no checksums") {
    value_hasher h;
    h.begin(value_format::v1(), a.size());
    h.update(a);
    REQUIRE(h.complete());
    const std::vector<value_digest> digests(2, h.digest());
    CHECK(s.put_pieces(keys, values, digests, st, deadline_after(1s)) == errc::invalid_argument);
  }
  SECTION("fewer values than keys") {
    CHECK(s.put_pieces(keys, std::span(values).first(1), {}, st, deadline_after(1s)) ==
          errc::invalid_argument);
  }
  SECTION("fewer statuses than keys") {
    CHECK(s.put_pieces(keys, values, {}, std::span(st).first(1), deadline_after(1s)) ==
          errc::invalid_argument);
  }
  SECTION("a passed deadline: timeout for every key") {
    CHECK(s.put_pieces(keys, values, {}, st, clock::now() - 1ms) == errc::timeout);
    CHECK(st == std::vector<chunk_status>(2, chunk_status::timeout));
  }
  CHECK(s.entry_count() == 0);
  CHECK(s.size_bytes() == 0);
  CHECK(s.stats().stores == 0);
  if (st[0] != chunk_status::timeout) CHECK(st == std::vector<chunk_status>(2, chunk_status::cancelled));
}

TEST_CASE("memory_store: put_pieces counts a value's pieces together against the capacity", "[unit]") {
  memory_store s(100);
  const auto a = bytes(60, 10);
  const std::vector<std::span<const std::byte>> p = {std::span(a), std::span(a)};  // 120 bytes in all
  const value_pieces values[1] = {p};
  const chunk_key k = key(1);
  chunk_status st[1];
  REQUIRE_FALSE(s.put_pieces(std::span(&k, 1), values, {}, st, deadline_after(1s)));
  CHECK(st[0] == chunk_status::error);
  CHECK(s.entry_count() == 0);
  CHECK(s.stats().rejected == 1);
  const std::vector<std::span<const std::byte>> fits = {std::span(a).first(50), std::span(a).first(50)};
  const value_pieces ok[1] = {fits};
  REQUIRE_FALSE(s.put_pieces(std::span(&k, 1), ok, {}, st, deadline_after(1s)));
  CHECK(st[0] == chunk_status::stored);
  CHECK(s.size_bytes() == 100);
}

TEST_CASE("tiered_store: L2 hits are promoted into L1; per-tier counters", "[unit]") {
  memory_store l1(1 << 20), l2(1 << 20);
  metrics m;
  tiered_store t(l1, l2, {.metrics = &m});
  auto v = bytes(64, 7);
  put1(l2, key(1), v);  // only in L2

  std::vector<std::byte> out(64);
  REQUIRE(get1(t, key(1), out) == chunk_status::hit);
  REQUIRE(out == v);
  REQUIRE(l1.contains(key(1)));  // promoted
  REQUIRE(get1(t, key(1), out) == chunk_status::hit);
  REQUIRE(get1(t, key(2), out) == chunk_status::miss);

  const auto st = t.stats();
  REQUIRE(st.l1_hits == 1);
  REQUIRE(st.l2_hits == 1);
  REQUIRE(st.misses == 1);
  REQUIRE(st.promoted == 1);
  REQUIRE(m.l1.hits.value() == 1);
  REQUIRE(m.l1.misses.value() == 2);  // first read of key 1, and key 2
  REQUIRE(m.l2.hits.value() == 1);
  REQUIRE(m.l2.misses.value() == 1);
  REQUIRE(m.l2.bytes_read.value() == 64);
}

TEST_CASE("tiered_store: exists asks L2 only for what L1 lacks; mixed batch keeps positions", "[unit]") {
  memory_store l1(1 << 20), l2(1 << 20);
  tiered_store t(l1, l2);
  auto a = bytes(32, 1), b = bytes(32, 2);
  put1(l1, key(0), a);
  put1(l2, key(2), b);
  std::vector<chunk_key> keys{key(0), key(1), key(2)};
  std::vector<chunk_status> st(3);
  REQUIRE_FALSE(t.exists(keys, st, deadline_after(1s)));
  REQUIRE(st == std::vector<chunk_status>{chunk_status::hit, chunk_status::miss, chunk_status::hit});

  std::vector<std::byte> o0(32), o1(32), o2(32);
  std::vector<std::span<std::byte>> dst{o0, o1, o2};
  REQUIRE_FALSE(t.get(keys, dst, st, deadline_after(1s)));
  REQUIRE(st == std::vector<chunk_status>{chunk_status::hit, chunk_status::miss, chunk_status::hit});
  REQUIRE(o0 == a);
  REQUIRE(o2 == b);
}

TEST_CASE("tiered_store: write-through by default; l1_only and l2_only", "[unit]") {
  memory_store l1(1 << 20), l2(1 << 20);
  auto v = bytes(16, 3);
  {
    tiered_store t(l1, l2);
    REQUIRE(put1(t, key(1), v) == chunk_status::stored);
    REQUIRE(l1.contains(key(1)));
    REQUIRE(l2.contains(key(1)));
  }
  {
    tiered_store t(l1, l2, {.writes = write_policy::l1_only});
    put1(t, key(2), v);
    REQUIRE(l1.contains(key(2)));
    REQUIRE_FALSE(l2.contains(key(2)));
  }
  {
    tiered_store t(l1, l2, {.writes = write_policy::l2_only});
    put1(t, key(3), v);
    REQUIRE_FALSE(l1.contains(key(3)));
    REQUIRE(l2.contains(key(3)));
  }
}

namespace {
// A store whose put fails the whole batch (e.g. L1 out of memory, or a lost connection).
struct failing_put_store {
  memory_store inner{1 << 20};
  std::error_code exists(std::span<const chunk_key> k, std::span<chunk_status> s, deadline dl) {
    return inner.exists(k, s, dl);
  }
  std::error_code get(std::span<const chunk_key> k, std::span<const std::span<std::byte>> d,
                      std::span<chunk_status> s, deadline dl) {
    return inner.get(k, d, s, dl);
  }
  std::error_code put(std::span<const chunk_key>, std::span<const std::span<const std::byte>>,
                      std::span<chunk_status> s, deadline) {
    for (auto& x : s) x = chunk_status::error;
    return make_error_code(errc::connection_lost);
  }
};
}  // namespace

// Regression (issue 13): write-through overwrote L1's error and statuses with L2's,
// so a failed L1 write reported `stored` and no error. Fails on the old put().
TEST_CASE("tiered_store: write-through reports L1's failure, not only L2's", "[unit]") {
  failing_put_store l1;
  memory_store l2(1 << 20);
  metrics m;
  tiered_store t(l1, l2, {.metrics = &m});
  auto v = bytes(16, 4);
  const chunk_key k = key(1);
  std::span<const std::byte> src[1] = {v};
  chunk_status st[1];
  const std::error_code ec = t.put(std::span<const chunk_key>(&k, 1), src, st, deadline_after(1s));
  REQUIRE(ec == errc::connection_lost);
  REQUIRE(st[0] == chunk_status::error);  // not stored in every tier
  REQUIRE(l2.contains(k));                // L2's write still happened
  REQUIRE(m.l1.bytes_written.value() == 0);
  REQUIRE(m.l2.bytes_written.value() == 16);

  // An L1 failure per key (too large for L1) is reported per key, the call itself worked.
  memory_store small(8), l2b(1 << 20);
  tiered_store t2(small, l2b);
  REQUIRE(put1(t2, key(2), v) == chunk_status::error);
  REQUIRE(l2b.contains(key(2)));
}

TEST_CASE("stores: a successful put reports stored, never hit", "[unit]") {
  memory_store l1(1 << 20), l2(1 << 20);
  tiered_store t(l1, l2);
  auto v = bytes(16, 5);
  REQUIRE(put1(l1, key(7), v) == chunk_status::stored);
  REQUIRE(put1(t, key(8), v) == chunk_status::stored);
  std::vector<std::byte> out(16);
  REQUIRE(get1(t, key(8), out) == chunk_status::hit);
  REQUIRE(to_string(chunk_status::stored) == "stored");
}

TEST_CASE("tiered_store: a wrong-length L1 value falls through to L2", "[unit]") {
  memory_store l1(1 << 20), l2(1 << 20);
  tiered_store t(l1, l2);
  put1(l1, key(1), bytes(10, 1));
  auto good = bytes(20, 2);
  put1(l2, key(1), good);
  std::vector<std::byte> out(20);
  REQUIRE(get1(t, key(1), out) == chunk_status::hit);
  REQUIRE(out == good);
}

TEST_CASE("rank_view: rank r touches only the chunks it owns", "[unit]") {
  constexpr std::size_t W = 3, C = 10, T = 16;
  std::deque<memory_store> backends;
  for (std::size_t r = 0; r < W; ++r) backends.emplace_back(1 << 20);
  std::vector<chunk_key> keys;
  std::vector<std::vector<std::byte>> payload;
  for (std::size_t c = 0; c < C; ++c)
    keys.push_back(key(c)), payload.push_back(bytes(8, static_cast<int>(c)));
  std::vector<std::span<const std::byte>> src(payload.begin(), payload.end());

  for (rank_t r = 0; r < W; ++r) {
    rank_view view(backends[r], modulo_ownership(W), r, T);
    auto mine = view.owned_chunks(C);
    std::vector<chunk_status> st(mine.size());
    REQUIRE_FALSE(view.put_owned(keys, src, st, deadline_after(1s)));
    REQUIRE(backends[r].entry_count() == mine.size());
    for (std::size_t c = 0; c < C; ++c) REQUIRE(backends[r].contains(keys[c]) == (c % W == r));
    REQUIRE(view.owned_starts(C) == owned_starts(modulo_ownership(W), r, C, T));
  }

  // Drop chunk 4 (rank 1's) and chunk 8 (rank 2's): the minimum of the rank answers is 4*T.
  backends[1].erase(keys[4]);
  backends[2].erase(keys[8]);
  std::vector<std::uint64_t> answers;
  for (rank_t r = 0; r < W; ++r) {
    rank_view view(backends[r], modulo_ownership(W), r, T);
    answers.push_back(view.lookup(keys, C * T, deadline_after(1s)).answer_tokens);
  }
  REQUIRE(answers == std::vector<std::uint64_t>{C * T, 4 * T, 8 * T});
  REQUIRE(min_over_ranks(answers) == 4 * T);

  // get_owned fills only owned destinations.
  rank_view view(backends[0], modulo_ownership(W), 0, T);
  std::vector<std::vector<std::byte>> out(C, std::vector<std::byte>(8));
  std::vector<std::span<std::byte>> dst(out.begin(), out.end());
  std::vector<chunk_status> st(view.owned_chunks(C).size());
  REQUIRE_FALSE(view.get_owned(keys, dst, st, deadline_after(1s)));
  for (std::size_t c = 0; c < C; ++c) REQUIRE((out[c] == payload[c]) == (c % W == 0));
  REQUIRE_THROWS_AS(rank_view(backends[0], modulo_ownership(W), 3, T), std::invalid_argument);
  REQUIRE_THROWS_AS(rank_view(backends[0], modulo_ownership(W), 0, 0),
                    std::invalid_argument);  // no chunk size
  // From the chunker's namespace: the chunk size is the chunker's.
  const key_namespace ns{.model = "m", .kv_format = "f", .chunk_tokens = 48, .ownership = "mod:3"};
  REQUIRE(rank_view(backends[0], modulo_ownership(W), 0, ns).chunk_tokens() == 48);
}

// Demonstration (issue 13): with tail_policy::hash_partial a 300-token prompt with
// 256-token chunks has 2 keys; the old lookup took the end as 2 * 256 = 512, so
// prompt_tokens - cached wrapped around. Fails on the old code (answer 512).
TEST_CASE("rank_view: a hashed partial tail never yields an answer past the prompt", "[unit]") {
  constexpr std::size_t T = 256;
  constexpr std::uint64_t prompt = 300;
  memory_store backend(1 << 20);
  const std::vector<chunk_key> keys{key(0), key(1)};  // chunk 0 full, chunk 1 the 44-token tail
  std::vector<std::vector<std::byte>> payload{bytes(8, 0), bytes(8, 1)};
  std::vector<std::span<const std::byte>> src(payload.begin(), payload.end());
  rank_view view(backend, modulo_ownership(1), 0, T);
  std::vector<chunk_status> st(2);
  REQUIRE_FALSE(view.put_owned(keys, src, st, deadline_after(1s)));

  const rank_lookup a = view.lookup(keys, prompt, deadline_after(1s));
  REQUIRE_FALSE(a.ec);
  REQUIRE(a.answer_tokens == prompt);  // not 512
  REQUIRE(prompt - a.answer_tokens == 0);
  REQUIRE(chunk_layout::contiguous(0, 2, T, prompt).end_tokens == prompt);

  // Two ranks: each answers within the prompt; the minimum is the whole prompt.
  std::deque<memory_store> b2;
  b2.emplace_back(1 << 20), b2.emplace_back(1 << 20);
  std::vector<std::uint64_t> answers;
  for (rank_t r = 0; r < 2; ++r) {
    rank_view v2(b2[r], modulo_ownership(2), r, T);
    std::vector<chunk_status> s1(1);
    REQUIRE_FALSE(v2.put_owned(keys, src, s1, deadline_after(1s)));
    const rank_lookup ar = v2.lookup(keys, prompt, deadline_after(1s));
    REQUIRE_FALSE(ar.ec);
    REQUIRE(ar.answer_tokens <= prompt);
    answers.push_back(ar.answer_tokens);
  }
  REQUIRE(min_over_ranks(answers) == prompt);

  // The drop policy (no tail key) still works: 300 tokens, 1 key, answer 256.
  REQUIRE(view.lookup(std::span<const chunk_key>(keys).first(1), prompt, deadline_after(1s)).answer_tokens ==
          256);
  // A token count that does not match the keys is refused by name, with no store call.
  const rank_lookup bad = view.lookup(keys, 768, deadline_after(1s));  // 3 keys long
  REQUIRE(bad.ec == errc::invalid_argument);
  REQUIRE(bad.answer_tokens == 0);
  REQUIRE(view.lookup(keys, 256, deadline_after(1s)).ec == errc::invalid_argument);
}

TEST_CASE("rank_view: select deduces the element type from a vector", "[unit]") {
  memory_store backend(1 << 20);
  rank_view view(backend, modulo_ownership(3), 1, 16);
  const std::vector<int> items{10, 11, 12, 13, 14};
  REQUIRE(view.select(items) == std::vector<int>{11, 14});
  REQUIRE(view.select(std::span<const int>(items)) == std::vector<int>{11, 14});
}

TEST_CASE("rank_view: a failed lookup reports the rank's first owned start, not 0", "[unit]") {
  constexpr std::size_t T = 16;
  memory_store backend(1 << 20);
  rank_view view(backend, modulo_ownership(2), 1, T);
  std::vector<chunk_key> keys{key(0), key(1), key(2), key(3)};
  const rank_lookup a = view.lookup(keys, 4 * T, clock::now() - 1ms);  // deadline already passed
  REQUIRE(a.ec == errc::timeout);
  REQUIRE(a.answer_tokens == 1 * T);  // rank 1's first owned chunk is chunk 1
}

TEST_CASE("metrics: histogram buckets and Prometheus text", "[unit]") {
  metrics m;
  m.lookups.add(3);
  m.l1.hits.add(5);
  m.l2.misses.add(2);
  m.queue_depth.add(4);
  m.queue_depth.sub(1);
  m.load_latency.observe(5us);   // bucket 0 (<= 10 us)
  m.load_latency.observe(15us);  // bucket 1 (<= 20 us)
  m.load_latency.observe(1h);    // overflow
  REQUIRE(m.load_latency.bucket(0) == 1);
  REQUIRE(m.load_latency.bucket(1) == 1);
  REQUIRE(m.load_latency.bucket(histogram::bucket_count) == 1);
  const std::string text = to_prometheus(m, "kvtier", "rank=\"2\"");
  REQUIRE(text.find("# TYPE kvtier_lookups_total counter\n") != std::string::npos);
  REQUIRE(text.find("kvtier_lookups_total{rank=\"2\"} 3\n") != std::string::npos);
  REQUIRE(text.find("kvtier_tier_hits_total{rank=\"2\",tier=\"l1\"} 5\n") != std::string::npos);
  REQUIRE(text.find("kvtier_tier_misses_total{rank=\"2\",tier=\"l2\"} 2\n") != std::string::npos);
  REQUIRE(text.find("kvtier_queue_depth{rank=\"2\"} 3\n") != std::string::npos);
  REQUIRE(text.find("kvtier_load_latency_seconds_bucket{rank=\"2\",le=\"1e-05\"} 1\n") != std::string::npos);
  REQUIRE(text.find("kvtier_load_latency_seconds_bucket{rank=\"2\",le=\"2e-05\"} 2\n") != std::string::npos);
  REQUIRE(text.find("kvtier_load_latency_seconds_bucket{rank=\"2\",le=\"+Inf\"} 3\n") != std::string::npos);
  REQUIRE(text.find("kvtier_load_latency_seconds_count{rank=\"2\"} 3\n") != std::string::npos);
  const std::string plain = to_prometheus(m);
  REQUIRE(plain.find("kvtier_lookups_total 3\n") != std::string::npos);
}

TEST_CASE("memory_store: concurrent gets, puts and evictions never deliver wrong bytes", "[unit][tsan]") {
  constexpr std::size_t n_keys = 32, size = 4096;
  memory_store s(8 * size);  // a quarter of the keys fit: constant eviction
  std::atomic<int> wrong{0}, hits{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      std::vector<std::byte> out(size);
      for (int i = 0; i < 2000; ++i) {
        const std::uint64_t k = static_cast<std::uint64_t>((i * 7 + t * 13) % n_keys);
        if ((i + t) % 3 == 0) {
          auto v = bytes(size, static_cast<int>(k));
          chunk_key kk = key(k);
          std::span<const std::byte> src[1] = {v};
          chunk_status st[1];
          s.put(std::span<const chunk_key>(&kk, 1), src, st, deadline_after(1s));
        } else {
          chunk_key kk = key(k);
          std::span<std::byte> dst[1] = {out};
          chunk_status st[1];
          s.get(std::span<const chunk_key>(&kk, 1), dst, st, deadline_after(1s));
          if (st[0] == chunk_status::hit) {
            ++hits;
            if (out != bytes(size, static_cast<int>(k))) ++wrong;
          }
        }
      }
    });
  for (auto& th : ts) th.join();
  REQUIRE(wrong == 0);
  REQUIRE(hits > 0);
  REQUIRE(s.size_bytes() <= 8 * size);
}

namespace {
// The chunk_store contract's argument rules, for any store over memory backends:
// a size mismatch is invalid_argument with no status written and nothing stored;
// a passed deadline marks every key timeout and stores nothing.
template <class S>
void check_argument_contract(S& s, const std::function<std::size_t()>& stored) {
  const std::vector<chunk_key> keys{key(1), key(2)};
  auto v = bytes(8, 1);
  std::vector<std::byte> o1(8), o2(8);
  const std::vector<std::span<const std::byte>> src2{v, v}, src1{v};
  const std::vector<std::span<std::byte>> dst2{o1, o2}, dst1{o1};
  const auto sentinel = chunk_status::cancelled;  // no store call writes it
  for (std::size_t n : {std::size_t{1}, std::size_t{3}}) {
    std::vector<chunk_status> st(n, sentinel);
    REQUIRE(s.exists(keys, st, deadline_after(1s)) == errc::invalid_argument);
    REQUIRE(s.get(keys, dst2, st, deadline_after(1s)) == errc::invalid_argument);
    REQUIRE(s.put(keys, src2, st, deadline_after(1s)) == errc::invalid_argument);
    REQUIRE(st == std::vector<chunk_status>(n, sentinel));
  }
  std::vector<chunk_status> st(2, sentinel);
  REQUIRE(s.get(keys, dst1, st, deadline_after(1s)) == errc::invalid_argument);
  REQUIRE(s.put(keys, src1, st, deadline_after(1s)) == errc::invalid_argument);
  REQUIRE(st == std::vector<chunk_status>(2, sentinel));
  REQUIRE(stored() == 0);
  const auto past = clock::now() - 1ms;
  const std::vector<chunk_status> timeouts(2, chunk_status::timeout);
  REQUIRE(s.put(keys, src2, st, past) == errc::timeout);
  REQUIRE(st == timeouts);
  REQUIRE(stored() == 0);
  std::fill(st.begin(), st.end(), sentinel);
  REQUIRE(s.exists(keys, st, past) == errc::timeout);
  REQUIRE(st == timeouts);
  std::fill(st.begin(), st.end(), sentinel);
  REQUIRE(s.get(keys, dst2, st, past) == errc::timeout);
  REQUIRE(st == timeouts);
}
}  // namespace

TEST_CASE("store contract: size mismatch touches no key; a passed deadline times out every key", "[unit]") {
  memory_store l1(1 << 20), l2(1 << 20);
  SECTION("memory_store") {
    check_argument_contract(l1, [&] { return l1.entry_count(); });
  }
  SECTION("tiered_store") {
    tiered_store t(l1, l2);
    check_argument_contract(t, [&] { return l1.entry_count() + l2.entry_count(); });
  }
  SECTION("rank_view") {
    constexpr std::size_t W = 2, C = 4;
    rank_view view(l1, modulo_ownership(W), 1, 16);  // owns chunks 1 and 3
    std::vector<chunk_key> keys;
    for (std::size_t c = 0; c < C; ++c) keys.push_back(key(c));
    auto v = bytes(8, 2);
    std::vector<std::byte> out(8);
    const std::vector<std::span<const std::byte>> src(C, v), src_short(C - 1, v);
    const std::vector<std::span<std::byte>> dst(C, out), dst_short(C - 1, out);
    for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{4}}) {  // owned count is 2
      std::vector<chunk_status> st(n, chunk_status::cancelled);
      REQUIRE(view.exists_owned(keys, st, deadline_after(1s)) == errc::invalid_argument);
      REQUIRE(view.get_owned(keys, dst, st, deadline_after(1s)) == errc::invalid_argument);
      REQUIRE(view.put_owned(keys, src, st, deadline_after(1s)) == errc::invalid_argument);
      REQUIRE(st == std::vector<chunk_status>(n, chunk_status::cancelled));
    }
    std::vector<chunk_status> st(2, chunk_status::cancelled);
    REQUIRE(view.get_owned(keys, dst_short, st, deadline_after(1s)) == errc::invalid_argument);
    REQUIRE(view.put_owned(keys, src_short, st, deadline_after(1s)) == errc::invalid_argument);
    REQUIRE(st == std::vector<chunk_status>(2, chunk_status::cancelled));
    REQUIRE(l1.entry_count() == 0);
    REQUIRE(view.put_owned(keys, src, st, clock::now() - 1ms) == errc::timeout);
    REQUIRE(st == std::vector<chunk_status>(2, chunk_status::timeout));
    REQUIRE(l1.entry_count() == 0);
  }
}

// Issue 28: the connector's saver hashes in its gather and calls put_prehashed on a store that
// has it; over tiers, L2 must get those digests (no pass of its own) and L1 only digests that
// fit its format.
TEST_CASE("tiered_store: put_prehashed gives L2 the digests, L1 only those that fit its format", "[unit]") {
  using test::digest_store;
  const value_format v2 = value_format::v2(4), v1 = value_format::v1();
  auto v = bytes(16, 5);
  std::span<const std::byte> src[2] = {v, v};
  const chunk_key keys[2] = {key(40), key(41)};
  const std::vector<value_digest> d = {test::tagged_digest(v2, 16, 7), test::tagged_digest(v2, 16, 8)};
  chunk_status st[2];

  SECTION("L1 without put_prehashed: its plain put; L2 gets the digests") {
    memory_store l1(1 << 20);
    digest_store l2(v2);
    tiered_store t(l1, l2);
    static_assert(prehashed_put_store<decltype(t)>);
    REQUIRE(t.format().group_bytes == 4);
    REQUIRE_FALSE(t.put_prehashed(keys, src, d, st, deadline_after(1s)));
    CHECK(st[0] == chunk_status::stored);
    CHECK(st[1] == chunk_status::stored);
    CHECK(l1.contains(keys[0]));
    CHECK(l2.plain_puts() == 0);
    CHECK(l2.given(keys[0]).hashes == d[0].hashes);
    CHECK(l2.given(keys[1]).hashes == d[1].hashes);
  }
  SECTION("L1 of another format: hashes for itself; L1 of the same format: gets them") {
    digest_store other(v1), same(v2), l2(v2);
    tiered_store t_other(other, l2), t_same(same, l2);
    REQUIRE_FALSE(t_other.put_prehashed(keys, src, d, st, deadline_after(1s)));
    CHECK(st[0] == chunk_status::stored);
    CHECK(other.plain_puts() == 1);
    CHECK(other.given(keys[0]).hashes.empty());
    REQUIRE_FALSE(t_same.put_prehashed(keys, src, d, st, deadline_after(1s)));
    CHECK(same.plain_puts() == 0);
    CHECK(same.given(keys[1]).hashes == d[1].hashes);
  }
  SECTION("l2_only: only L2, with the digests; digests L2 refuses are its error") {
    memory_store l1(1 << 20);
    digest_store l2(v2);
    tiered_store t(l1, l2, {.writes = write_policy::l2_only});
    REQUIRE_FALSE(t.put_prehashed(keys, src, d, st, deadline_after(1s)));
    CHECK_FALSE(l1.contains(keys[0]));
    CHECK(l2.given(keys[0]).hashes == d[0].hashes);
    const std::vector<value_digest> wrong = {test::tagged_digest(v1, 16, 1), test::tagged_digest(v1, 16, 1)};
    CHECK(t.put_prehashed(keys, src, wrong, st, deadline_after(1s)) == errc::invalid_argument);
  }
}

TEST_CASE("tiered_store: put_pieces gives each tier the pieces, L2 the digests, L1 only those that fit",
          "[unit]") {
  using test::digest_store;
  const value_format v2 = value_format::v2(4), v1 = value_format::v1();
  const auto a = bytes(16, 5), b = bytes(10, 9);
  // Value 0 in three pieces (one empty), value 1 in one: what each tier stores is their concatenation.
  const std::span<const std::byte> p0[3] = {std::span(a).first(7), std::span(a).subspan(7, 0),
                                            std::span(a).subspan(7)};
  const std::span<const std::byte> p1[1] = {b};
  const value_pieces values[2] = {p0, p1};
  const chunk_key keys[2] = {key(50), key(51)};
  const std::vector<value_digest> d = {test::tagged_digest(v2, 16, 7), test::tagged_digest(v2, 10, 8)};
  chunk_status st[2];
  auto holds = [&](auto& store) {
    std::vector<std::byte> x(16), y(10);
    const std::span<std::byte> dst[2] = {x, y};
    chunk_status gs[2];
    REQUIRE_FALSE(store.get(keys, dst, gs, deadline_after(1s)));
    return gs[0] == chunk_status::hit && gs[1] == chunk_status::hit && x == a && y == b;
  };

  SECTION("write-through: L1 (memory_store) copies the pieces; L2 gets them with the digests") {
    memory_store l1(1 << 20);
    digest_store l2(v2);
    tiered_store t(l1, l2);
    static_assert(piecewise_put_store<decltype(t)>);
    REQUIRE_FALSE(t.put_pieces(keys, values, d, st, deadline_after(1s)));
    CHECK(st[0] == chunk_status::stored);
    CHECK(st[1] == chunk_status::stored);
    CHECK(holds(l1));
    CHECK(holds(l2));
    CHECK(l2.piece_puts() == 1);
    CHECK(l2.plain_puts() == 0);
    CHECK(l2.given(keys[0]).hashes == d[0].hashes);
    CHECK(l2.given(keys[1]).hashes == d[1].hashes);
  }
  SECTION("L1 of another format gets none of the digests; L1 of the same format gets them") {
    digest_store other(v1), same(v2), l2(v2);
    tiered_store t_other(other, l2), t_same(same, l2);
    REQUIRE_FALSE(t_other.put_pieces(keys, values, d, st, deadline_after(1s)));
    CHECK(other.piece_puts() == 1);
    CHECK(other.given(keys[0]).hashes.empty());
    CHECK(holds(other));
    REQUIRE_FALSE(t_same.put_pieces(keys, values, d, st, deadline_after(1s)));
    CHECK(same.given(keys[1]).hashes == d[1].hashes);
  }
  SECTION("l1_only and l2_only write one tier; digests L2 refuses are its error") {
    memory_store l1(1 << 20);
    digest_store l2(v2);
    tiered_store one(l1, l2, {.writes = write_policy::l1_only}),
        two(l1, l2, {.writes = write_policy::l2_only});
    REQUIRE_FALSE(one.put_pieces(keys, values, d, st, deadline_after(1s)));
    CHECK(holds(l1));
    CHECK(l2.piece_puts() == 0);
    l1.clear();
    REQUIRE_FALSE(two.put_pieces(keys, values, d, st, deadline_after(1s)));
    CHECK_FALSE(l1.contains(keys[0]));
    CHECK(holds(l2));
    const std::vector<value_digest> wrong = {test::tagged_digest(v2, 15, 1), test::tagged_digest(v2, 10, 1)};
    CHECK(two.put_pieces(keys, values, wrong, st, deadline_after(1s)) == errc::invalid_argument);
  }
}
