// Layer-by-layer loading in the pcp_prefill engine (--load-granularity layer and
// layer-streamed) against whole-chunk loading, on the same sparse mixed stream (about half
// of each prompt cached, so the suffix to compute is large; one request at a time, so no
// request waits behind another): every request ends with the same status, lookup and cached
// tokens, no request is slower, the engine really waits for each layer through the
// connector, no TTFT beats the closed form of timing_model::predicted_ttft_s (no layer is
// computed before it landed), and the streamed mode gains at least half of what the closed
// form predicts it gains.
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "engine.hpp"
#include "engine_rig.hpp"
#include "model_stores.hpp"
#include "timing_model.hpp"
#include "trace.hpp"

using namespace pcp;

namespace {

struct layer_rig {
  static constexpr std::uint32_t world = 4;
  timing_model tm;
  std::vector<request> reqs, shared;
  std::unique_ptr<kvtier::chunker<>> chunk;
  std::vector<prepared_request> prepared, prime_set;
  std::vector<std::unique_ptr<modeled_l1>> l1;
  std::vector<std::unique_ptr<l2_server>> servers;
  std::vector<std::unique_ptr<modeled_l2>> l2;

  /// A fresh tier primed with every request's shared segments (all but its own question).
  explicit layer_rig(std::uint32_t layers, double gbps = 1.345) {
    tm.l2_instances = world;
    tm.l2_gbps = gbps;
    tm.l2_t0_s = 0.326;
    tm.kv_layers = layers;
    tm.payload_scale = 1.0 / 65536;
    trace_spec spec;
    spec.kind = trace_kind::mixed;
    spec.requests = 12;
    spec.rate_per_s = 0.1;  // 10 s apart: each request is alone in the engine
    spec.seed = 3;
    reqs = generate_trace(spec);
    for (const auto& r : reqs) {
      request p;
      p.id = r.id;
      p.segments.assign(r.segments.begin(), r.segments.end() - 1);
      expand_segments(p.segments, p.tokens);
      p.tokens.push_back(0);  // one more token: the last shared chunk is a full one
      shared.push_back(std::move(p));
    }
    chunk = std::make_unique<kvtier::chunker<>>(test::test_namespace(tm.chunk_tokens, world));
    prepared = prepare(reqs, *chunk);
    prime_set = prepare(shared, *chunk);
    for (std::uint32_t r = 0; r < world; ++r) l1.push_back(std::make_unique<modeled_l1>(64 << 20));
    for (std::uint32_t k = 0; k < world; ++k) servers.push_back(std::make_unique<l2_server>(64 << 20));
    for (std::uint32_t r = 0; r < world; ++r) l2.push_back(std::make_unique<modeled_l2>(*servers[r]));
    engine_options o{.world = world, .mode = load_mode::recompute, .timed = false};
    REQUIRE(test::replay<modeled_l2>(prime_set, tm, o, l1, l2).fatal.empty());
    for (auto& x : l1) x->data().clear();
  }

  run_result run(load_granularity g, std::uint64_t fault_every = 0) {
    for (auto& s : servers) s->set_fault_every(fault_every);
    engine_options o{.world = world, .mode = load_mode::async, .granularity = g};
    return test::replay<modeled_l2>(prepared, tm, o, l1, l2);
  }
};

bool loaded(const request_result& q) { return q.status == "hit" || q.status == "partial"; }

void check_clean(const run_result& r, std::size_t n) {
  REQUIRE(r.fatal.empty());
  CHECK(r.symmetric_collectives);  // the control and the data communicators' calls, every rank
  CHECK(r.mismatched_chunks == 0);
  CHECK(r.failed_l2_calls == 0);
  REQUIRE(r.requests.size() == n);
}

}  // namespace

TEST_CASE(
    "engine layers: layer by layer is never slower than whole chunks, the same outcomes, "
    "and never faster than the closed form",
    "[integration]") {
  // Compute-bound (the suffix takes longer than the fetch) and fetch-bound (a slow tier).
  const auto [layers, gbps] = GENERATE(std::pair{3u, 1.345}, std::pair{8u, 1.345}, std::pair{8u, 0.2});
  CAPTURE(layers, gbps);
  const std::vector<load_granularity> modes{load_granularity::chunk, load_granularity::layer,
                                            load_granularity::layer_streamed};
  std::vector<run_result> runs;
  timing_model tm;
  for (load_granularity g : modes) {
    layer_rig rig(layers, gbps);  // fresh, identically primed stores for each mode
    tm = rig.tm;
    runs.push_back(rig.run(g));
    check_clean(runs.back(), rig.reqs.size());
  }
  CHECK(runs[0].layer_waits == 0);
  for (std::size_t m = 1; m < runs.size(); ++m) {  // the engine waited for every layer, for real
    CHECK(runs[m].layer_waits > 0);
    CHECK(runs[m].layer_waits % layers == 0);
  }
  double gained = 0, predicted_gain = 0;
  std::size_t hits = 0;
  for (std::size_t k = 0; k < runs[0].requests.size(); ++k) {
    const request_result& chunk = runs[0].requests[k];
    CAPTURE(chunk.id, chunk.status, chunk.prompt_tokens, chunk.cached_tokens);
    for (std::size_t m = 1; m < runs.size(); ++m) {
      const request_result& q = runs[m].requests[k];
      CHECK(q.status == chunk.status);
      CHECK(q.lookup_tokens == chunk.lookup_tokens);
      CHECK(q.cached_tokens == chunk.cached_tokens);
      CHECK(q.ttft_s <= runs[m - 1].requests[k].ttft_s + 1e-9);  // streamed <= layer <= chunk
    }
    if (!loaded(chunk)) continue;
    ++hits;
    CHECK(chunk.l1_tokens == 0);  // the closed form counts L2 loads only
    const auto predicted = [&](load_granularity g) {
      return tm.predicted_ttft_s(g, static_cast<double>(chunk.lookup_tokens),
                                 static_cast<double>(chunk.prompt_tokens), layer_rig::world);
    };
    for (std::size_t m = 0; m < runs.size(); ++m)
      CHECK(runs[m].requests[k].ttft_s >= predicted(modes[m]) - 1e-9);
    gained += chunk.ttft_s - runs[2].requests[k].ttft_s;
    predicted_gain += predicted(load_granularity::chunk) - predicted(load_granularity::layer_streamed);
  }
  REQUIRE(hits >= 6);  // most of the stream loads its shared half
  CHECK(predicted_gain > 0);
  CHECK(gained >= 0.5 * predicted_gain);
}

TEST_CASE("engine layers: a load cut short recomputes from the agreed prefix in every mode, alike",
          "[integration]") {
  std::vector<run_result> runs;
  std::size_t n = 0;
  for (load_granularity g :
       {load_granularity::chunk, load_granularity::layer, load_granularity::layer_streamed}) {
    layer_rig rig(3);
    n = rig.reqs.size();
    runs.push_back(rig.run(g, /*fault_every*/ 3));
    CAPTURE(to_string(g), runs.back().fatal);
    REQUIRE(runs.back().fatal.empty());
    CHECK(runs.back().symmetric_collectives);
    CHECK(runs.back().mismatched_chunks == 0);
  }
  std::size_t partial = 0;
  for (std::size_t k = 0; k < n; ++k) {
    const request_result& chunk = runs[0].requests[k];
    partial += chunk.status == "partial";
    for (std::size_t m = 1; m < runs.size(); ++m) {
      const request_result& q = runs[m].requests[k];
      CAPTURE(q.id, m);
      CHECK(q.status == chunk.status);
      CHECK(q.cached_tokens == chunk.cached_tokens);
      CHECK(q.ttft_s > 0);
    }
  }
  CHECK(partial > 0);  // the faults did cut loads short
  CHECK(runs[0].failed_loads == runs[1].failed_loads);
  CHECK(runs[0].failed_loads == runs[2].failed_loads);
}
