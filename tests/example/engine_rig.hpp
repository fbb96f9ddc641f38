// tests/example/engine_rig.hpp: what the engine tests share: the small hit-heavy stream
// they replay (prompts of 2-3k tokens sharing a 512-token system prompt), its key namespace,
// one replay over a rig's stores, and priming.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "engine.hpp"
#include "kvtier/chunker.hpp"
#include "kvtier/ownership.hpp"
#include "model_stores.hpp"
#include "trace.hpp"

namespace pcp::test {

inline std::vector<request> small_hit_heavy_trace(std::size_t requests, double rate_per_s,
                                                  std::uint64_t seed) {
  return generate_trace({.kind = trace_kind::hit_heavy,
                         .requests = requests,
                         .rate_per_s = rate_per_s,
                         .min_tokens = 2000,
                         .median_tokens = 2600,
                         .max_tokens = 3200,
                         .mean_tokens = 2600,
                         .sd_tokens = 300,
                         .system_tokens = 512,
                         .group = 2,
                         .seed = seed});
}

inline kvtier::key_namespace test_namespace(std::uint32_t chunk_tokens, std::uint32_t world) {
  return {.model = "test",
          .kv_format = "synthetic",
          .chunk_tokens = chunk_tokens,
          .ownership = kvtier::modulo_ownership(world).geometry()};
}

/// One replay of `prepared` on a fresh engine over the stores in `l1` and `l2` (owning pointers).
template <class L2, class L1s, class L2s>
run_result replay(const std::vector<prepared_request>& prepared, const timing_model& tm,
                  const engine_options& opt, const L1s& l1, const L2s& l2) {
  std::vector<modeled_l1*> a;
  std::vector<L2*> b;
  for (auto& x : l1) a.push_back(x.get());
  for (auto& x : l2) b.push_back(x.get());
  return engine<L2>(prepared, tm, opt, a, b).run();
}

/// The process form (`run(comm)`: one engine per rank, each holding only its own stores) over
/// an in-process world, each rank thread playing a process: every rank's result.
template <class L2, class L1s, class L2s>
std::vector<run_result> replay_as_processes(const std::vector<prepared_request>& prepared,
                                            const timing_model& tm, const engine_options& opt, const L1s& l1,
                                            const L2s& l2) {
  std::vector<run_result> out(opt.world);
  kvtier::comm::inproc_world world(opt.world);
  kvtier::comm::run_ranks(world, [&](kvtier::comm::inproc_communicator& c) {
    std::vector<modeled_l1*> a(opt.world, nullptr);
    std::vector<L2*> b(opt.world, nullptr);
    a[c.rank()] = l1[c.rank()].get();
    b[c.rank()] = l2[c.rank()].get();
    out[c.rank()] = engine<L2, kvtier::comm::inproc_communicator>(prepared, tm, opt, a, b).run(c);
  });
  return out;
}

/// The reference's method before a measured run: one untimed replay stores every chunk in
/// L2, then every L1 is emptied.
template <class Rig>
void prime(Rig& g) {
  engine_options o;
  o.mode = load_mode::recompute;
  o.timed = false;
  REQUIRE(g.run(o).fatal.empty());
  for (auto& x : g.l1) x->data().clear();
}

}  // namespace pcp::test
