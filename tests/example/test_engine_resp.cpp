// The pcp_prefill engine over real redis-server processes, one per rank (W = 2):
// the same lookup / load / broadcast path as the embedded store, over sockets.
#include <catch2/catch.hpp>
#include <memory>

#include "engine.hpp"
#include "engine_rig.hpp"
#include "report.hpp"
#include "resp_l2.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_server.hpp"
#include "support/test_pki.hpp"

using namespace pcp;

namespace {

// The engine's inputs and one L2 store per rank; the derived rigs give each rank's --l2 URL.
struct rig_base {
  static constexpr std::uint32_t world = 2;
  timing_model tm;
  std::vector<request> reqs;
  std::unique_ptr<kvtier::chunker<>> chunk;
  std::vector<prepared_request> prepared;
  std::vector<std::unique_ptr<modeled_l1>> l1;
  std::vector<std::unique_ptr<resp_l2>> pools;

  template <class UrlOf>
  void attach(UrlOf url_of, const kvtier::resp::tls_options& tls = {},
              kvtier::value_format format = kvtier::value_format::v1()) {
    tm.payload_scale = 1.0 / 4096;
    reqs = test::small_hit_heavy_trace(10, 5, 11);
    const kvtier::key_namespace ns = test::test_namespace(tm.chunk_tokens, world);
    chunk = std::make_unique<kvtier::chunker<>>(ns);
    prepared = prepare(reqs, *chunk);
    for (std::uint32_t r = 0; r < world; ++r) l1.push_back(std::make_unique<modeled_l1>(64 << 20));
    for (std::uint32_t r = 0; r < world; ++r)
      pools.push_back(std::make_unique<resp_l2>(url_of(r), static_cast<int>(r), ns, 5, tls, format));
  }
  run_result run(engine_options opt) {
    opt.world = world;
    opt.fetch_workers = 2;
    opt.load_timeout_s = 1;  // real servers are timed by the wall clock
    return test::replay<resp_l2>(prepared, tm, opt, l1, pools);
  }
  void prime() { test::prime(*this); }
  /// Every request loaded its whole prefix, every byte verified, and the loads came from the servers.
  void check_full_hits(const run_result& r) const {
    REQUIRE(r.fatal.empty());
    for (const auto& e : r.l2_errors) CHECK(e.empty());
    CHECK(r.failed_l2_calls == 0);
    CHECK(r.mismatched_chunks == 0);
    for (std::size_t i = 0; i < r.requests.size(); ++i) {
      CHECK(r.requests[i].status == "hit");
      CHECK(r.requests[i].cached_tokens == prepared[i].n_chunks() * tm.chunk_tokens);
    }
    std::uint64_t hits = 0;
    for (const auto& p : pools) hits += p->stats().hits;
    CHECK(hits > 0);
  }
};

// One redis-server per rank.
struct real_rig : rig_base {
  kvtier::test::redis_server srv0, srv1;
  explicit real_rig(kvtier::value_format format = kvtier::value_format::v1()) {
    attach([&](std::uint32_t r) { return (r == 0 ? srv0 : srv1).url(); }, {}, format);
  }
};

// Each rank's partition over two servers of its own (rendezvous hash of the key).
struct two_per_rank_rig : rig_base {
  kvtier::test::redis_server a0, b0, a1, b1;
  two_per_rank_rig() {
    attach([&](std::uint32_t r) { return r == 0 ? a0.url() + "," + b0.url() : a1.url() + "," + b1.url(); });
  }
};

#if defined(PCP_HAVE_TLS)
// One TLS redis-server per rank that requires a client certificate; `ca` is the CA the client
// trusts ("ca.pem" signed the servers' certificates, "other-ca.pem" did not).
struct tls_rig : rig_base {
  kvtier::test::redis_server srv0, srv1;
  tls_rig(const kvtier::test::test_pki& pki, const std::string& ca)
      : srv0({.tls_args = pki.server_args()}), srv1({.tls_args = pki.server_args()}) {
    attach(
        [&](std::uint32_t r) {
          return "resp+tls://127.0.0.1:" + std::to_string((r == 0 ? srv0 : srv1).tls_port());
        },
        {.ca_file = pki.path(ca), .cert_file = pki.path("client.pem"), .key_file = pki.path("client.key")});
  }
};
#endif

// Both ranks on one loopback cluster (3 masters + 3 replicas), `query` choosing the placement.
struct cluster_rig : rig_base {
  cluster_rig(const kvtier::test::redis_cluster& cluster, const std::string& query) {
    attach([&](std::uint32_t) { return cluster.url() + query; });
  }
};

}  // namespace

TEST_CASE("engine over two real servers: primed async and sync replays verify every byte", "[integration]") {
  real_rig g;
  g.prime();
  for (load_mode mode : {load_mode::async, load_mode::sync}) {
    INFO(to_string(mode));
    const auto r = g.run({.mode = mode});
    g.check_full_hits(r);
    CHECK(r.symmetric_collectives);
  }
}

// Layer by layer on real servers: `layer` fetches whole chunks before the step (only the moves
// overlap compute); `layer-streamed` reads format-2 values group-major (GETRANGE per layer) and
// the step's wait_for_layer(l) agrees each group as it lands, the fetch going on under compute.
TEST_CASE("engine over two real servers: layer and layer-streamed loads verify every byte", "[integration]") {
  for (load_granularity gran : {load_granularity::layer, load_granularity::layer_streamed}) {
    INFO(to_string(gran));
    const bool streamed = gran == load_granularity::layer_streamed;
    timing_model tm;
    tm.payload_scale = 1.0 / 4096;  // as attach() sets it: one checksum group per layer of a chunk
    real_rig g(streamed ? kvtier::value_format::v2(kvtier::layer_group_bytes(tm.kv_layout_for(1), tm.chunk_tokens, 1))
                        : kvtier::value_format::v1());
    g.prime();
    const auto r = g.run({.mode = load_mode::async, .granularity = gran});
    g.check_full_hits(r);
    CHECK(r.symmetric_collectives);
    CHECK(r.layer_waits > 0);
    std::uint64_t grouped = 0;
    for (const auto& p : g.pools) grouped += p->grouped_gets();
    CHECK((grouped > 0) == streamed);  // the loads streamed by layer group exactly when asked
  }
}

TEST_CASE("engine over two real servers: one rank's server loses its data or dies", "[integration]") {
  real_rig g;
  g.prime();
  g.srv1.restart();  // rank 1's partition is empty: only chunk 0 (rank 0's) is still a hit
  auto r = g.run({.mode = load_mode::async});
  REQUIRE(r.fatal.empty());
  CHECK(r.mismatched_chunks == 0);
  // The first request finds only chunk 0: rank 1 answers the start of its first
  // chunk (256), and the min over ranks is 256. Later ones also find what earlier
  // ones computed and stored again.
  CHECK(r.requests[0].lookup_tokens == g.tm.chunk_tokens);
  CHECK(r.requests[0].cached_tokens == g.tm.chunk_tokens);
  for (const auto& q : r.requests) {
    CHECK(q.cached_tokens >= g.tm.chunk_tokens);
    CHECK(q.cached_tokens <= q.lookup_tokens);
  }
  for (auto& x : g.l1) x->data().clear();
  g.srv1.kill();  // now rank 1's lookups and stores fail: every request still completes
  r = g.run({.mode = load_mode::async});
  REQUIRE(r.fatal.empty());
  CHECK(r.mismatched_chunks == 0);
  CHECK(r.requests[0].cached_tokens <= g.tm.chunk_tokens);  // later ones may hit rank 1's L1 again
  for (const auto& q : r.requests) CHECK(q.ttft_s > 0);
}

TEST_CASE("engine over a real server with a wrong password: recompute, counted, the reason kept per rank",
          "[integration]") {
  kvtier::test::redis_server srv({.extra_args = {"--requirepass", "right"}, .harness_password = "right"});
  timing_model tm;
  tm.payload_scale = 1.0 / 4096;
  const auto reqs = test::small_hit_heavy_trace(6, 5, 3);
  const kvtier::key_namespace ns = test::test_namespace(tm.chunk_tokens, 2);
  kvtier::chunker<> chunk(ns);
  const auto prepared = prepare(reqs, chunk);
  std::vector<std::unique_ptr<modeled_l1>> l1;
  std::vector<std::unique_ptr<resp_l2>> pools;
  const std::string url = "resp://:wrongpw@127.0.0.1:" + std::to_string(srv.port());
  for (int r = 0; r < 2; ++r) {
    l1.push_back(std::make_unique<modeled_l1>(64 << 20));
    pools.push_back(std::make_unique<resp_l2>(url, r, ns, 3));
  }
  // Async: the lookups fail first. Recompute: nothing is looked up, so the first failure is the
  // connector's save, with its reason (the chunk, the store's error and the server's words).
  for (const load_mode mode : {load_mode::async, load_mode::recompute}) {
    INFO("mode " << to_string(mode));
    for (auto& x : l1) x->data().clear();
    const auto r = test::replay<resp_l2>(
        prepared, tm, {.world = 2, .mode = mode, .load_timeout_s = 1, .fetch_workers = 2}, l1, pools);
    REQUIRE(r.fatal.empty());
    CHECK(r.mismatched_chunks == 0);
    for (const auto& q : r.requests) {
      CHECK(q.ttft_s > 0);
      CHECK(q.l2_tokens == 0);
    }
    CHECK(r.failed_l2_calls > 0);
    for (std::size_t k = 0; k < r.l2_errors.size(); ++k) {
      const std::string& e = r.l2_errors[k];
      INFO(e);
      const std::string stage = mode == load_mode::recompute ? "save" : "lookup";
      CHECK(e.rfind("rank " + std::to_string(k) + ": " + stage + " of chunk ", 0) == 0);
      CHECK(e.find("authentication failed") != std::string::npos);
      CHECK(e.find("WRONGPASS") != std::string::npos);  // the server's own words, from last_error()
    }
  }
}

TEST_CASE("engine over a real cluster: spread and pinned placements replay with zero mismatches",
          "[integration]") {
  kvtier::test::redis_cluster cluster;
  for (const std::string query : {"", "?placement=pinned"}) {
    INFO("placement query '" << query << "'");
    cluster_rig g(cluster, query);
    g.prime();
    g.check_full_hits(g.run({.mode = load_mode::async}));
  }
}

TEST_CASE("engine with each rank's partition over two servers replays with zero mismatches",
          "[integration]") {
  two_per_rank_rig g;
  g.prime();
  const auto r = g.run({.mode = load_mode::async});
  REQUIRE(r.fatal.empty());
  CHECK(r.mismatched_chunks == 0);
  for (std::size_t i = 0; i < r.requests.size(); ++i) CHECK(r.requests[i].status == "hit");
  // Both servers of each rank hold some of its chunks.
  for (auto* s : {&g.a0, &g.b0, &g.a1, &g.b1}) CHECK(s->call({"DBSIZE"}) != "0");
}

#if defined(PCP_HAVE_TLS)
TEST_CASE("engine over TLS servers: every byte verified; an untrusted server degrades to recompute, with why",
          "[integration]") {
  const kvtier::test::test_pki pki;
  {
    tls_rig g(pki, "ca.pem");
    g.prime();
    g.check_full_hits(g.run({.mode = load_mode::async}));  // over TLS, client certificate and all
  }
  {
    tls_rig g(pki, "other-ca.pem");  // the client does not trust the servers' CA
    const auto r = g.run({.mode = load_mode::async});
    REQUIRE(r.fatal.empty());
    CHECK(r.mismatched_chunks == 0);
    CHECK(r.failed_l2_calls > 0);
    for (const auto& q : r.requests) CHECK(q.l2_tokens == 0);
    for (const auto& e : r.l2_errors) {
      INFO(e);
      CHECK(e.find("certificate verify failed") != std::string::npos);
    }
    CHECK(g.srv0.call({"DBSIZE"}) == "0");  // nothing was stored either
  }
}
#endif

TEST_CASE("resp_l2 refuses a list that mixes TLS and plain servers, and says so", "[unit]") {
  const kvtier::key_namespace ns = test::test_namespace(256, 2);
  try {
    resp_l2 l2("resp://127.0.0.1:1,resp+tls://127.0.0.1:2", 0, ns, 1);
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK((what.find("mixes TLS and plain servers") != std::string::npos ||
           (!resp_l2::has_tls && what.find("TLS needs a build with kvtier::tls") != std::string::npos)));
  }
}
