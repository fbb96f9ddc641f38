// Integration: the sharded L2 on real redis-server processes (one per rank).
//  - Cross-engine reuse: two engines with the same W share the per-rank servers;
//    the second engine hits what the first stored, through its tiered store,
//    sharded view and fetch queue, and rank r's server holds only rank r's chunks.
//  - Eviction between lookup and load: a key deleted on the server after the
//    lookup truncates the loaded prefix at that chunk.
#include <chrono>
#include <cstddef>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "kvtier/chunker.hpp"
#include "kvtier/fetch_queue.hpp"
#include "kvtier/lookup.hpp"
#include "kvtier/metrics.hpp"
#include "kvtier/ownership.hpp"
#include "kvtier/resp/asio_connection.hpp"
#include "kvtier/resp/url.hpp"
#include "kvtier/store/memory_store.hpp"
#include "kvtier/store/rank_view.hpp"
#include "kvtier/store/remote_store.hpp"
#include "kvtier/store/tiered_store.hpp"
#include "support/redis_server.hpp"

using namespace kvtier;
using namespace std::chrono_literals;

namespace {

constexpr rank_t W = 3;
constexpr std::size_t T = 16;    // tokens per chunk
constexpr std::size_t C = 10;    // full chunks per prompt
constexpr std::size_t B = 4096;  // KV bytes per chunk

using l2_store = remote_store<resp::asio_connection>;
using tiers_t = tiered_store<memory_store, l2_store>;

key_namespace test_ns() {
  return key_namespace{.model = "kvtier-test", .kv_format = "bytes", .chunk_tokens = T, .ownership = "mod:3"};
}

// One rank of one engine: its own L1, its own connection to the rank's server.
struct engine_rank {
  memory_store l1{64 << 20};
  l2_store l2;
  metrics m;
  tiers_t tiers;
  rank_view<tiers_t, modulo_ownership> view;
  fetch_queue<tiers_t> queue;
  engine_rank(const std::string& url, rank_t r)
      : l2(test_ns(), resp::connection_options{.server = resp::parse_url(url).value}),
        tiers(l1, l2, {.metrics = &m}),
        view(tiers, modulo_ownership(W), r, T),
        queue(tiers, {.workers = 1, .metrics = &m}) {}
};

struct engine {
  std::vector<std::unique_ptr<engine_rank>> ranks;
  explicit engine(const std::vector<std::string>& urls) {
    for (rank_t r = 0; r < W; ++r) ranks.push_back(std::make_unique<engine_rank>(urls[r], r));
  }
};

std::vector<std::byte> kv_bytes(const chunk_key& k) {
  std::vector<std::byte> v(B);
  std::uint64_t x = k.lo ^ k.hi;
  for (auto& b : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    b = static_cast<std::byte>(x >> 56);
  }
  return v;
}

// The rank's load of its owned chunks below `hit` through its fetch queue.
struct rank_load {
  std::vector<std::vector<std::byte>> bufs;
  fetch_result result;
};
rank_load load_owned(engine_rank& er, const std::vector<chunk_key>& keys, std::uint64_t hit, request_id id) {
  const std::size_t below = hit / T;
  const std::vector<chunk_key> prefix(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(below));
  const auto owned = er.view.owned_keys(prefix);
  rank_load out;
  out.bufs.assign(owned.size(), std::vector<std::byte>(B));
  std::vector<std::span<std::byte>> dst(out.bufs.begin(), out.bufs.end());
  auto h = er.queue.submit(id, owned, dst, chunk_layout::owned(er.view.owned_starts(below), hit),
                           deadline_after(5s));
  out.result = er.queue.wait(h, deadline_after(10s)).value();
  return out;
}

// One redis-server per rank.
struct rank_servers {
  std::vector<std::unique_ptr<test::redis_server>> servers;
  std::vector<std::string> urls;
  rank_servers() {
    for (rank_t r = 0; r < W; ++r) {
      servers.push_back(std::make_unique<test::redis_server>());
      urls.push_back(servers.back()->url());
    }
  }
};

// A prompt of `n_tokens` tokens from `seed`: its chunk keys and each chunk's KV bytes.
struct prompt {
  std::vector<chunk_key> keys;
  std::vector<std::vector<std::byte>> payload;
  std::vector<std::span<const std::byte>> src;
  prompt(std::size_t n_tokens, unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<token_id> tokens(n_tokens);
    for (auto& t : tokens) t = rng() % 150000;
    keys = chunker<>(test_ns()).keys(tokens);
    for (const auto& k : keys) payload.push_back(kv_bytes(k));
    src.assign(payload.begin(), payload.end());
  }
};

}  // namespace

TEST_CASE("integration: two engines share one sharded L2; the second hits what the first stored",
          "[integration]") {
  rank_servers cluster;
  const auto& urls = cluster.urls;
  const auto& servers = cluster.servers;
  const prompt p(C * T + 5, 7);  // a partial tail that is never stored
  const auto& keys = p.keys;
  const auto& payload = p.payload;
  const auto& src = p.src;
  REQUIRE(keys.size() == C);

  // Engine A computes the prompt and writes back: each rank only its own chunks.
  {
    engine a(urls);
    for (rank_t r = 0; r < W; ++r) {
      auto& er = *a.ranks[r];
      std::vector<chunk_status> st(er.view.owned_chunks(C).size(), chunk_status::error);
      REQUIRE_FALSE(er.view.put_owned(keys, src, st, deadline_after(5s)));
      for (auto s : st) REQUIRE(s == chunk_status::stored);
    }
  }
  for (rank_t r = 0; r < W; ++r)  // rank r's server holds exactly rank r's chunks
    REQUIRE(servers[r]->call({"DBSIZE"}) == std::to_string(owned_chunks(modulo_ownership(W), r, C).size()));

  // Engine B, with empty L1s, finds the whole prompt.
  engine b(urls);
  std::vector<std::uint64_t> answers;
  for (rank_t r = 0; r < W; ++r) {
    auto& er = *b.ranks[r];
    const std::uint64_t sync = er.view.lookup(keys, keys.size() * T, deadline_after(5s)).answer_tokens;
    auto h = er.queue.lookup(1, er.view.owned_keys(keys), chunk_layout::owned(er.view.owned_starts(C), C * T),
                             deadline_after(5s));
    const auto async = er.queue.wait(h, deadline_after(10s)).value();
    REQUIRE(async.state == fetch_state::done);
    REQUIRE(async.answer_tokens == sync);
    answers.push_back(sync);
  }
  const std::uint64_t hit = min_over_ranks(answers);
  REQUIRE(hit == C * T);

  for (rank_t r = 0; r < W; ++r) {
    auto& er = *b.ranks[r];
    auto ld = load_owned(er, keys, hit, 2);
    REQUIRE(ld.result.state == fetch_state::done);
    REQUIRE(ld.result.answer_tokens == hit);
    const auto mine = er.view.owned_chunks(C);
    for (std::size_t k = 0; k < mine.size(); ++k) REQUIRE(ld.bufs[k] == payload[mine[k]]);
    REQUIRE(er.m.l2.hits.value() >= mine.size());  // came from the shared L2 ...
    REQUIRE(er.l1.entry_count() == mine.size());   // ... and was promoted into this engine's L1
    const auto l1_before = er.m.l1.hits.value();
    auto again = load_owned(er, keys, hit, 3);
    REQUIRE(again.result.answer_tokens == hit);
    REQUIRE(er.m.l1.hits.value() == l1_before + mine.size());  // second load: all from L1
  }

  // Engine C (empty L1s again): the scheduler's lookup is a prefetch, and the load
  // that follows takes the chunks from it instead of reading L2 a second time.
  engine c(urls);
  for (rank_t r = 0; r < W; ++r) {
    auto& er = *c.ranks[r];
    const auto mine = er.view.owned_chunks(C);
    auto h = er.queue.prefetch(7, er.view.owned_keys(keys), B,
                               chunk_layout::owned(er.view.owned_starts(C), C * T), deadline_after(5s));
    const auto pre = er.queue.wait(h, deadline_after(10s)).value();
    REQUIRE(pre.state == fetch_state::done);
    REQUIRE(pre.answer_tokens == er.view.lookup(keys, keys.size() * T, deadline_after(5s)).answer_tokens);
    const auto l2_gets = er.l2.stats().hits;
    auto ld = load_owned(er, keys, hit, 7);
    REQUIRE(ld.result.answer_tokens == hit);
    for (std::size_t k = 0; k < mine.size(); ++k) REQUIRE(ld.bufs[k] == payload[mine[k]]);
    REQUIRE(er.l2.stats().hits == l2_gets);  // no second read from the server
    REQUIRE(er.m.prefetch_reused.value() == mine.size());
  }
}

TEST_CASE("integration: keys deleted on the server between lookup and load truncate the prefix",
          "[integration]") {
  rank_servers cluster;
  const auto& servers = cluster.servers;
  const prompt p(C * T, 11);
  const auto& keys = p.keys;
  const auto& payload = p.payload;
  const auto& src = p.src;

  engine e(cluster.urls);
  // Store through L2 only, so L1 cannot hide the deletion.
  for (rank_t r = 0; r < W; ++r) {
    auto& er = *e.ranks[r];
    std::vector<chunk_status> st(er.view.owned_chunks(C).size());
    rank_view l2_view(er.l2, modulo_ownership(W), r, T);
    REQUIRE_FALSE(l2_view.put_owned(keys, src, st, deadline_after(5s)));
  }
  std::vector<std::uint64_t> answers;
  for (rank_t r = 0; r < W; ++r)
    answers.push_back(e.ranks[r]->view.lookup(keys, keys.size() * T, deadline_after(5s)).answer_tokens);
  const std::uint64_t hit = min_over_ranks(answers);
  REQUIRE(hit == C * T);

  // Evicted between lookup and load: chunk 5, owned by rank 5 mod 3 = 2.
  constexpr std::size_t gone = 5;
  REQUIRE(servers[gone % W]->call({"DEL", remote_key_text(test_ns(), keys[gone])}) == "1");

  std::vector<std::uint64_t> loaded;
  for (rank_t r = 0; r < W; ++r) {
    auto ld = load_owned(*e.ranks[r], keys, hit, 9);
    REQUIRE(ld.result.state == fetch_state::done);
    loaded.push_back(ld.result.answer_tokens);
    const auto mine = e.ranks[r]->view.owned_chunks(C);
    for (std::size_t k = 0; k < ld.result.answer_chunks; ++k) REQUIRE(ld.bufs[k] == payload[mine[k]]);
    if (r == gone % W)  // the owner of the gap: nothing at or past it counts as loaded
      for (std::size_t k = 0; k < mine.size(); ++k)
        if (mine[k] >= gone) REQUIRE(k >= ld.result.answer_chunks);
  }
  REQUIRE(loaded[gone % W] == gone * T);
  REQUIRE(min_over_ranks(loaded) == gone * T);  // the agreed prefix: recompute from chunk 5
}
