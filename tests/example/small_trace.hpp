// tests/example/small_trace.hpp: the small hit-heavy stream and key namespace that the
// engine tests replay (prompts of 2-3k tokens sharing a 512-token system prompt).
#pragma once

#include <cstdint>
#include <vector>

#include "kvtier/chunker.hpp"
#include "kvtier/ownership.hpp"
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

}  // namespace pcp::test
