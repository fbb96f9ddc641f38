// End-to-end replays of the pcp_prefill engine on a tiny trace: every loaded
// byte is verified, loads that are cut short recompute from the agreed prefix,
// and a corrupted stored chunk is caught and counted, never used.
#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>

#include "engine.hpp"
#include "engine_rig.hpp"
#include "model_stores.hpp"
#include "report.hpp"
#include "timing_model.hpp"
#include "trace.hpp"

using namespace pcp;

namespace {

struct rig {
  static constexpr std::uint32_t world = 4;
  timing_model tm;
  std::vector<request> reqs;
  std::unique_ptr<kvtier::chunker<>> chunk;
  std::vector<prepared_request> prepared;
  std::vector<std::unique_ptr<modeled_l1>> l1;
  std::vector<std::unique_ptr<l2_server>> servers;
  std::vector<std::unique_ptr<modeled_l2>> l2;

  explicit rig(std::uint32_t instances) {
    tm.l2_instances = instances;
    tm.payload_scale = 1.0 / 65536;
    // 16 prompts of 2-3k tokens at 2 requests/s, sharing a system prompt.
    reqs = test::small_hit_heavy_trace(16, 2, 7);
    const kvtier::key_namespace ns = test::test_namespace(tm.chunk_tokens, world);
    chunk = std::make_unique<kvtier::chunker<>>(ns);
    prepared = prepare(reqs, *chunk);
    for (std::uint32_t r = 0; r < world; ++r) l1.push_back(std::make_unique<modeled_l1>(64 << 20));
    for (std::uint32_t k = 0; k < instances; ++k) servers.push_back(std::make_unique<l2_server>(64 << 20));
    for (std::uint32_t r = 0; r < world; ++r)
      l2.push_back(std::make_unique<modeled_l2>(*servers[r % instances]));
  }

  run_result run(engine_options opt) {
    opt.world = world;
    return test::replay<modeled_l2>(prepared, tm, opt, l1, l2);
  }
  void prime() { test::prime(*this); }
};

template <class Rig>
void check_complete(const Rig& g, const run_result& r) {
  REQUIRE(r.fatal.empty());
  CHECK(r.symmetric_collectives);  // every rank issued the same collectives in the same order
  REQUIRE(r.requests.size() == g.reqs.size());
  for (const auto& q : r.requests) {
    CHECK(q.ttft_s > 0);
    CHECK(q.cached_tokens <= q.prompt_tokens - 1);  // at least one token is always computed
    CHECK(q.l1_tokens + q.l2_tokens == q.cached_tokens);
  }
}

}  // namespace

TEST_CASE("engine: recompute mode reads no cache", "[integration]") {
  rig g(1);
  const auto r = g.run({.mode = load_mode::recompute});
  check_complete(g, r);
  for (const auto& q : r.requests) CHECK(q.cached_tokens == 0);
  CHECK(summarize(r).busy_fraction > 0);
}

TEST_CASE("engine: primed async and sync replays load every full chunk with zero byte mismatches",
          "[integration]") {
  for (load_mode mode : {load_mode::async, load_mode::sync}) {
    for (std::uint32_t instances : {1u, 4u}) {
      INFO(to_string(mode) << " with " << instances << " instance(s)");
      rig g(instances);
      g.prime();
      const auto r = g.run({.mode = mode});
      check_complete(g, r);
      CHECK(r.mismatched_chunks == 0);
      CHECK(r.failed_loads == 0);
      for (std::size_t i = 0; i < r.requests.size(); ++i) {
        CHECK(r.requests[i].status == "hit");
        CHECK(r.requests[i].cached_tokens == g.prepared[i].n_chunks() * g.tm.chunk_tokens);
        CHECK(r.requests[i].l2_tokens == r.requests[i].cached_tokens);
      }
      const summary s = summarize(r);
      CHECK(s.errors == 0);
      CHECK(s.hit_token_fraction > 0.9);
      // Every wait of the step on I/O is timed the same way: sync waits at least T0
      // per load inside the step, async never waits.
      if (mode == load_mode::async)
        CHECK(s.max_io_stall_s == 0);
      else
        CHECK(s.max_io_stall_s >= g.tm.l2_t0_s);
      CHECK(r.costs.loads == r.requests.size());
      CHECK(r.costs.broadcasts == r.requests.size());
      CHECK(r.costs.lookup_s > 0);
      CHECK(r.costs.broadcast_s > 0);
    }
  }
}

TEST_CASE("engine: loads cut short recompute from the agreed prefix", "[integration]") {
  rig g(4);
  g.prime();
  for (auto& s : g.servers) s->set_fault_every(2);  // every 2nd load per server loses its second half
  const auto r = g.run({.mode = load_mode::async});
  check_complete(g, r);
  CHECK(r.mismatched_chunks == 0);
  CHECK(r.failed_loads > 0);
  std::size_t partial = 0;
  for (std::size_t i = 0; i < r.requests.size(); ++i) {
    const auto& q = r.requests[i];
    if (q.status != "partial") continue;
    ++partial;
    CHECK(q.cached_tokens < q.lookup_tokens);
    CHECK(q.cached_tokens % g.tm.chunk_tokens == 0);
  }
  CHECK(partial == r.failed_loads);
}

TEST_CASE("engine: a corrupted stored chunk is caught, counted and recomputed", "[integration]") {
  rig g(1);
  g.prime();
  // Overwrite a chunk that only one request uses with bytes of the right length but wrong content.
  std::size_t victim = g.prepared.size(), bad_chunk = 0;
  for (std::size_t i = 0; i < g.prepared.size() && victim == g.prepared.size(); ++i)
    for (std::size_t c = 0; c < g.prepared[i].n_chunks() && victim == g.prepared.size(); ++c) {
      bool shared = false;
      for (std::size_t j = 0; j < g.prepared.size(); ++j)
        if (j != i && std::find(g.prepared[j].keys.begin(), g.prepared[j].keys.end(),
                                g.prepared[i].keys[c]) != g.prepared[j].keys.end())
          shared = true;
      if (!shared) victim = i, bad_chunk = c;
    }
  REQUIRE(victim < g.prepared.size());
  std::vector<std::byte> junk(g.tm.chunk_bytes(), std::byte{0x5A});
  std::vector<kvtier::chunk_key> key{g.prepared[victim].keys[bad_chunk]};
  std::vector<std::span<const std::byte>> src{junk};
  std::vector<kvtier::chunk_status> st(1);
  REQUIRE(!g.servers[0]->data().put(key, src, st, kvtier::no_deadline));
  const auto r = g.run({.mode = load_mode::sync});
  check_complete(g, r);
  CHECK(r.mismatched_chunks == rig::world);  // every rank received and checked the bad chunk
  CHECK(r.requests[victim].status == "mismatch");
  CHECK(r.requests[victim].cached_tokens == bad_chunk * g.tm.chunk_tokens);
  CHECK(summarize(r).errors == rig::world);
}

TEST_CASE("engine: the cost policy recomputes when loading is predicted slower", "[integration]") {
  rig g(4);
  g.tm.l2_t0_s = 5.0;  // a fixed cost far above any recompute of these prompts
  g.prime();
  const auto r = g.run({.mode = load_mode::async, .policy = load_policy::cost});
  check_complete(g, r);
  CHECK(r.mismatched_chunks == 0);
  std::size_t by_policy = 0;
  for (const auto& q : r.requests) by_policy += q.status == "policy_recompute";
  // The optimistic prior loads at first; the first measured 5 s load (modeled time,
  // so the outcome does not depend on thread scheduling) teaches it to stop, so the
  // requests decided after it ends recompute.
  CHECK(by_policy >= 1);
  CHECK(r.requests.front().status == "hit");
  CHECK(r.requests.back().status == "policy_recompute");
  for (const auto& q : r.requests)
    if (q.arrival_s > r.requests.front().arrival_s + 5.5) CHECK(q.status == "policy_recompute");
}

TEST_CASE("engine: a replay is reproducible (modeled clock, no real time in it)", "[integration]") {
  rig g(1);
  g.prime();
  const auto a = g.run({.mode = load_mode::sync});
  const auto b = g.run({.mode = load_mode::sync});
  REQUIRE(a.requests.size() == b.requests.size());
  for (std::size_t i = 0; i < a.requests.size(); ++i) {
    CHECK(a.requests[i].ttft_s == b.requests[i].ttft_s);
    CHECK(a.requests[i].status == b.requests[i].status);
  }
  CHECK(a.collectives == b.collectives);
  // One instance, sync: hits queue one at a time, each paying T0 + its bytes / B.
  for (const auto& q : a.requests) CHECK(q.ttft_s >= g.tm.l2_t0_s);
}

TEST_CASE("engine: one deadline per request covers every rank's I/O", "[integration]") {
  rig g(4);
  g.prime();
  // The deadline falls inside T0: every rank's load ends past it, so nothing loads and
  // every request recomputes from the agreed prefix (0), without a wrong byte.
  const auto r = g.run({.mode = load_mode::async, .load_timeout_s = g.tm.l2_t0_s / 2});
  check_complete(g, r);
  CHECK(r.mismatched_chunks == 0);
  for (const auto& q : r.requests) {
    CHECK(q.status == "partial");
    CHECK(q.cached_tokens == 0);
    CHECK(q.load_s <= g.tm.l2_t0_s / 2 + 1e-9);  // the engine stopped waiting at the deadline
  }
  CHECK(r.failed_loads == r.requests.size());
}

namespace {
/// An L2 that refuses every call, as a server with a wrong password does.
struct refusing_store {
  static constexpr bool modeled_timing = true;
  std::error_code exists(std::span<const kvtier::chunk_key>, std::span<kvtier::chunk_status> st,
                         kvtier::deadline) {
    for (auto& s : st) s = kvtier::chunk_status::error;
    return kvtier::errc::backend_error;
  }
  std::error_code get(std::span<const kvtier::chunk_key> k, std::span<const std::span<std::byte>>,
                      std::span<kvtier::chunk_status> st, kvtier::deadline dl) {
    return exists(k, st, dl);
  }
  std::error_code put(std::span<const kvtier::chunk_key> k, std::span<const std::span<const std::byte>>,
                      std::span<kvtier::chunk_status> st, kvtier::deadline dl) {
    return exists(k, st, dl);
  }
};
}  // namespace

TEST_CASE("engine: a refusing L2 degrades to recompute, counted and explained per rank", "[integration]") {
  rig g(1);
  std::vector<std::unique_ptr<refusing_store>> bad;
  for (std::uint32_t r = 0; r < rig::world; ++r) bad.push_back(std::make_unique<refusing_store>());
  const auto r = test::replay<refusing_store>(g.prepared, g.tm,
                                              {.world = rig::world, .mode = load_mode::async}, g.l1, bad);
  check_complete(g, r);
  CHECK(r.mismatched_chunks == 0);
  for (const auto& q : r.requests) CHECK(q.l2_tokens == 0);  // hits come from L1 only (write-through kept it)
  CHECK(r.failed_l2_calls > 0);
  CHECK(summarize(r).failed_l2_calls == r.failed_l2_calls);
  REQUIRE(r.l2_errors.size() == rig::world);
  for (const auto& e : r.l2_errors) CHECK(!e.empty());  // each rank's first reason, for its one stderr line
}

TEST_CASE("engine: closed loop keeps a fixed number of requests in flight", "[integration]") {
  rig g(4);
  const auto r = g.run({.mode = load_mode::recompute, .closed_loop_clients = 3});
  check_complete(g, r);
  std::vector<double> done;
  for (const auto& q : r.requests) done.push_back(q.arrival_s + q.ttft_s);
  std::sort(done.begin(), done.end());
  for (std::size_t j = 0; j < r.requests.size(); ++j)  // request j goes out when the (j-3)-th one completes
    CHECK(r.requests[j].arrival_s == Approx(j < 3 ? 0.0 : done[j - 3]));
  CHECK(summarize(r).prompt_tokens_per_s > 0);
}

namespace {
/// Long prompts (20-40k tokens) at one instance: the split point falls inside the hit.
struct long_rig {
  static constexpr std::uint32_t world = 4;
  timing_model tm;
  std::vector<request> reqs;
  std::unique_ptr<kvtier::chunker<>> chunk;
  std::vector<prepared_request> prepared;
  std::vector<std::unique_ptr<modeled_l1>> l1;
  std::unique_ptr<l2_server> server;
  std::vector<std::unique_ptr<modeled_l2>> l2;

  long_rig() {
    tm.payload_scale = 1.0 / 65536;
    reqs = generate_trace({.kind = trace_kind::hit_heavy,
                           .requests = 6,
                           .rate_per_s = 0.2,
                           .min_tokens = 20000,
                           .median_tokens = 30000,
                           .max_tokens = 40000,
                           .mean_tokens = 30000,
                           .sd_tokens = 5000,
                           .system_tokens = 1024,
                           .group = 2,
                           .seed = 5});
    chunk = std::make_unique<kvtier::chunker<>>(test::test_namespace(tm.chunk_tokens, world));
    prepared = prepare(reqs, *chunk);
    for (std::uint32_t r = 0; r < world; ++r) l1.push_back(std::make_unique<modeled_l1>(64 << 20));
    server = std::make_unique<l2_server>(64 << 20);
    for (std::uint32_t r = 0; r < world; ++r) l2.push_back(std::make_unique<modeled_l2>(*server));
  }
  run_result run(engine_options opt) {
    opt.world = world;
    opt.estimator_prior = {.fixed_cost_s = tm.l2_t0_s, .bandwidth_gb_per_s = tm.l2_total_gbps(world)};
    return test::replay<modeled_l2>(prepared, tm, opt, l1, l2);
  }
  void prime() { test::prime(*this); }
};
}  // namespace

TEST_CASE("engine: split mode computes the front while the back loads, every byte verified",
          "[integration]") {
  long_rig g;
  g.prime();
  const auto split = g.run({.mode = load_mode::split});
  const auto load = g.run({.mode = load_mode::async});
  const auto recompute = g.run({.mode = load_mode::recompute});
  check_complete(g, split);
  CHECK(split.mismatched_chunks == 0);
  CHECK(split.failed_loads == 0);
  const std::uint64_t round = long_rig::world * g.tm.chunk_tokens;
  for (std::size_t i = 0; i < split.requests.size(); ++i) {
    const auto& q = split.requests[i];
    INFO("request " << i);
    REQUIRE(q.status == "split");
    CHECK(q.split_tokens > 0);
    CHECK(q.split_tokens % round == 0);  // whole rounds of owners: the back keeps its owners
    CHECK(q.split_tokens + q.cached_tokens == q.lookup_tokens);
    // Modeled time (no wall clock): the split beats both halves done alone.
    CHECK(q.ttft_s < load.requests[i].ttft_s);
    CHECK(q.ttft_s < recompute.requests[i].ttft_s);
    CHECK(q.predicted_s > 0);
  }
}

TEST_CASE("engine: a split whose load is cut short recomputes the gap from the agreed prefix",
          "[integration]") {
  long_rig g;
  g.prime();
  g.server->set_fault_every(3);  // every 3rd get loses its second half
  const auto r = g.run({.mode = load_mode::split});
  check_complete(g, r);
  CHECK(r.mismatched_chunks == 0);
  CHECK(r.failed_loads > 0);
  std::size_t partial = 0;
  for (const auto& q : r.requests) {
    CHECK(q.split_tokens + q.cached_tokens <= q.lookup_tokens);
    CHECK(q.ttft_s > 0);
    if (q.status != "partial") continue;
    ++partial;
    CHECK(q.split_tokens + q.cached_tokens < q.lookup_tokens);
  }
  CHECK(partial == r.failed_loads);
}

TEST_CASE("engine: every load is checked in the paged layout; a byte flipped in the pages is caught",
          "[integration]") {
  for (auto kind : {kv_layout_kind::mla, kv_layout_kind::fa_nhd}) {
    rig g(1);
    g.tm.kv = kind;
    g.prime();
    const auto clean = g.run({.mode = load_mode::sync});
    check_complete(g, clean);
    CHECK(clean.mismatched_chunks == 0);
    std::size_t victim = clean.requests.size();
    for (std::size_t i = 0; i < clean.requests.size() && victim == clean.requests.size(); ++i)
      if (clean.requests[i].status == "hit" && clean.requests[i].cached_tokens > 0) victim = i;
    REQUIRE(victim < clean.requests.size());
    engine_options o{.mode = load_mode::sync};
    o.corrupt_paged_request = victim;  // rank 0 flips one byte of the first loaded chunk in its pages
    const auto r = g.run(o);
    check_complete(g, r);
    CHECK(r.mismatched_chunks == 1);  // only rank 0's pages were touched
    CHECK(r.requests[victim].status == "mismatch");
    CHECK(r.requests[victim].cached_tokens == 0);  // the flipped chunk was the first: all recomputed
    for (std::size_t i = 0; i < r.requests.size(); ++i)
      if (i != victim) CHECK(r.requests[i].status != "mismatch");
  }
}

TEST_CASE("engine: the process form (one engine per rank) reports what the thread form does",
          "[integration]") {
  rig g(1);
  g.prime();
  // A byte flipped on rank 3, not the reporting rank 0: only the combined counters show it.
  engine_options o{.world = rig::world, .mode = load_mode::sync};
  o.corrupt_paged_request = 0;
  o.corrupt_paged_rank = 3;
  const auto t = g.run(o);
  check_complete(g, t);
  REQUIRE(t.mismatched_chunks == 1);
  for (auto& x : g.l1) x->data().clear();  // the same start for the second replay
  const auto ps = test::replay_as_processes<modeled_l2>(g.prepared, g.tm, o, g.l1, g.l2);
  for (kvtier::rank_t r = 0; r < rig::world; ++r) {
    INFO("rank " << r);
    if (r == 0) check_complete(g, ps[r]);  // the per-request results are rank 0's
    REQUIRE(ps[r].fatal.empty());
    CHECK(ps[r].symmetric_collectives);
    CHECK(ps[r].mismatched_chunks == 1);
    CHECK(ps[r].failed_l2_calls == 0);
  }
  for (std::size_t i = 0; i < t.requests.size(); ++i) {  // rank 0 holds the per-request results
    CHECK(ps[0].requests[i].status == t.requests[i].status);
    CHECK(ps[0].requests[i].cached_tokens == t.requests[i].cached_tokens);
    CHECK(ps[0].requests[i].ttft_s == t.requests[i].ttft_s);
  }
  CHECK(t.requests[0].status == "mismatch");

  // Every rank's first store error reaches every rank; failed calls are summed.
  std::vector<std::unique_ptr<refusing_store>> bad;
  for (std::uint32_t r = 0; r < rig::world; ++r) bad.push_back(std::make_unique<refusing_store>());
  const engine_options a{.world = rig::world, .mode = load_mode::async};
  for (auto& x : g.l1) x->data().clear();
  const auto tr = test::replay<refusing_store>(g.prepared, g.tm, a, g.l1, bad);
  for (auto& x : g.l1) x->data().clear();
  const auto pr = test::replay_as_processes<refusing_store>(g.prepared, g.tm, a, g.l1, bad);
  REQUIRE(tr.failed_l2_calls > 0);
  for (kvtier::rank_t r = 0; r < rig::world; ++r) {
    INFO("rank " << r);
    CHECK(pr[r].failed_l2_calls == tr.failed_l2_calls);
    CHECK(pr[r].l2_errors == tr.l2_errors);
  }
}

TEST_CASE("engine: a paged cache too small for a request stops the run with a clear error", "[integration]") {
  rig g(1);
  g.prime();
  engine_options o{.mode = load_mode::sync};
  o.kv_cache_tokens = 2 * g.tm.chunk_tokens;  // smaller than any prompt here (2000+ tokens)
  const auto r = g.run(o);
  CHECK(r.fatal.find("paged KV cache full") != std::string::npos);
  CHECK(r.fatal.find("--kv-cache-tokens") != std::string::npos);
}
